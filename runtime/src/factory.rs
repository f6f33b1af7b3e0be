//! [`InformerFactory`]: one informer per etcd prefix per agent, by construction. Every controller that
//! reads a prefix asks the factory for its store; the first ask starts the informer, later asks get the
//! same store (as client-go's shared informer factory does). The informers read etcd, or on a worker the
//! voters' node API ([`InformerFactory::through`]), where a node may read single keys it cannot list.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterClient;
use crate::etcd::Etcd;
use crate::informer::{DecodeError, Informer, Object};
use crate::metrics::Metrics;
use crate::nodeapi::{NodeApiClient, Relist};
use crate::store::Store;

/// One started informer: its name, and its store as `Store<String, Object<T>>`.
type Started = (String, Box<dyn Any + Send + Sync>);

/// What one informer reads.
enum Scope {
    Prefix(String),
    Key(String),
}

impl Scope {
    fn text(&self) -> &str {
        match self {
            Scope::Prefix(p) | Scope::Key(p) => p,
        }
    }
}

/// A task the factory started, by name, for an owner to wait for at its stop.
pub type FeederTask = (String, tokio::task::JoinHandle<()>);

/// Hands out the agent's shared stores, one per prefix.
pub struct InformerFactory {
    client: ClusterClient,
    metrics: Metrics,
    /// What the controllers reading these stores stop with ([`InformerFactory::shutdown`]).
    shutdown: CancellationToken,
    /// What the informers themselves stop with: later than the controllers where the owner says so, so
    /// that a reconcile under way reads live stores to its end.
    feeders: CancellationToken,
    /// By prefix.
    started: Mutex<BTreeMap<String, Started>>,
    /// The informers' tasks (and other feeders'), until [`InformerFactory::take_tasks`].
    tasks: Mutex<Vec<FeederTask>>,
}

impl InformerFactory {
    /// Informers it starts report into `metrics` and stop with `shutdown`.
    pub fn new(etcd: Etcd, metrics: Metrics, shutdown: CancellationToken) -> Self {
        InformerFactory::with_client(etcd.into(), metrics, shutdown)
    }

    /// A factory whose informers list and watch through the voters' node API.
    pub fn through(client: NodeApiClient, metrics: Metrics, shutdown: CancellationToken) -> Self {
        InformerFactory::with_client(client.into(), metrics, shutdown)
    }

    fn with_client(client: ClusterClient, metrics: Metrics, shutdown: CancellationToken) -> Self {
        InformerFactory {
            client,
            metrics,
            feeders: shutdown.clone(),
            shutdown,
            started: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The controllers on this factory's stores stop with `stop`; the informers keep the token the
    /// factory was made with.
    pub fn with_controller_stop(mut self, stop: CancellationToken) -> Self {
        self.shutdown = stop;
        self
    }

    /// What the informers (and the caches' other feeders) stop with.
    pub fn feeders(&self) -> &CancellationToken {
        &self.feeders
    }

    /// Starts a task that feeds the stores (an informer, a cache's follower), kept for
    /// [`InformerFactory::take_tasks`].
    pub fn spawn_feeder<F>(&self, name: impl Into<String>, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(task);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.into(), handle));
    }

    /// The feeder tasks started since the last call, for their owner to wait for.
    pub fn take_tasks(&self) -> Vec<FeederTask> {
        std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The shared store of the keys under `prefix`, decoded by `decode`: started (as informer `name`) on
    /// the first ask, the same store on every later one. Must be called inside a tokio runtime.
    ///
    /// # Panics
    /// When `prefix` was asked for before with another value type: two decoders of one prefix are a bug in
    /// the caller, never something input can cause.
    pub fn store<T, D, E>(
        &self,
        name: &str,
        prefix: impl Into<String>,
        decode: D,
    ) -> Store<String, Object<T>>
    where
        T: Send + Sync + 'static,
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        self.started_store(name, Scope::Prefix(prefix.into()), decode)
            .0
    }

    /// The shared store of one key (a request, a policy): on etcd, the keys under it as a prefix, as
    /// [`InformerFactory::store`] reads them; through the node API, that key alone, which a node may read
    /// where it may list nothing around it.
    pub fn key_store<T, D, E>(
        &self,
        name: &str,
        key: impl Into<String>,
        decode: D,
    ) -> Store<String, Object<T>>
    where
        T: Send + Sync + 'static,
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        self.started_store(name, Scope::Key(key.into()), decode).0
    }

    /// [`InformerFactory::store`], and a handle that makes it list again: through the node API, what a
    /// node may read under a prefix can change without a key there changing. On etcd the handle does
    /// nothing. A later ask for the prefix gets the store and a handle that does nothing.
    pub fn relisting_store<T, D, E>(
        &self,
        name: &str,
        prefix: impl Into<String>,
        decode: D,
    ) -> (Store<String, Object<T>>, Relist)
    where
        T: Send + Sync + 'static,
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        self.started_store(name, Scope::Prefix(prefix.into()), decode)
    }

    fn started_store<T, D, E>(
        &self,
        name: &str,
        scope: Scope,
        decode: D,
    ) -> (Store<String, Object<T>>, Relist)
    where
        T: Send + Sync + 'static,
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        let prefix = scope.text().to_string();
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((first, store)) = started.get(&prefix) {
            return match store.downcast_ref::<Store<String, Object<T>>>() {
                Some(s) => (s.clone(), Relist::none()),
                None => panic!(
                    "informer {name:?} asks for prefix {prefix:?} with another value type than informer {first:?}"
                ),
            };
        }
        let (store, relist) = match &self.client {
            ClusterClient::Etcd(etcd) => {
                let informer = Informer::new(name, etcd.clone(), prefix.clone(), decode)
                    .with_metrics(&self.metrics);
                let store = informer.store();
                self.spawn_feeder(
                    format!("informer {name}"),
                    informer.run(self.feeders.clone()),
                );
                (store, Relist::none())
            }
            ClusterClient::NodeApi(api) => {
                let informer =
                    Informer::over(name, prefix.clone(), decode).with_metrics(&self.metrics);
                let store = informer.store();
                let (lw, relist) = match scope {
                    Scope::Prefix(p) => api.list_watch(p),
                    Scope::Key(k) => api.key_watch(k),
                }
                .relisting();
                let shutdown = self.feeders.clone();
                self.spawn_feeder(format!("informer {name}"), async move {
                    informer.run_with(&lw, shutdown).await
                });
                (store, relist)
            }
        };
        started.insert(prefix, (name.to_string(), Box::new(store.clone())));
        (store, relist)
    }

    /// Every informer started, as (name, prefix), by prefix.
    pub fn started(&self) -> Vec<(String, String)> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(prefix, (name, _))| (name.clone(), prefix.clone()))
            .collect()
    }

    /// etcd, when the informers read it (not through the node API).
    pub fn etcd(&self) -> Option<&Etcd> {
        self.client.etcd()
    }

    /// What the agent's writers write through: etcd, or the node API its informers read.
    pub fn client(&self) -> &ClusterClient {
        &self.client
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::EtcdConfig;

    fn decode_text(_key: &str, value: &[u8]) -> Result<String, std::convert::Infallible> {
        Ok(String::from_utf8_lossy(value).into_owned())
    }

    #[tokio::test]
    async fn asking_twice_for_a_prefix_gives_the_same_store_and_starts_one_informer() {
        // Nothing answers here: the informers retry in the background, which is all this test needs.
        let etcd = Etcd::connect(EtcdConfig::new(["http://127.0.0.1:1"]))
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let f = InformerFactory::new(etcd, Metrics::new(), shutdown.clone());
        let a = f.store("pods", "/p/", decode_text);
        let b = f.store("pods-again", "/p/", decode_text);
        let _other = f.store("leases", "/l/", decode_text);
        assert!(a.same_as(&b), "two stores for one prefix");
        assert_eq!(
            f.started(),
            vec![
                ("leases".to_string(), "/l/".to_string()),
                ("pods".to_string(), "/p/".to_string())
            ]
        );
        shutdown.cancel();
    }

    #[tokio::test]
    #[should_panic(expected = "another value type")]
    async fn another_value_type_for_a_prefix_is_a_bug() {
        let etcd = Etcd::connect(EtcdConfig::new(["http://127.0.0.1:1"]))
            .await
            .unwrap();
        let f = InformerFactory::new(etcd, Metrics::new(), CancellationToken::new());
        let _a = f.store("text", "/p/", decode_text);
        let _b = f.store("bytes", "/p/", |_k: &str, v: &[u8]| {
            Ok::<_, std::convert::Infallible>(v.to_vec())
        });
    }
}
