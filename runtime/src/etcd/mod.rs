//! The one place that builds etcd clients.
//!
//! [`Etcd`] talks to one endpoint at a time over a plain channel, so a dead endpoint fails fast instead of
//! being retried forever inside a balancer. A request that fails with a transport error or `Unavailable`
//! moves the client to the next endpoint and is retried there ([`Etcd::with_retry`]). Learners are kept out
//! of the endpoint list ([`Etcd::set_endpoints`], [`Etcd::sync_endpoints`]): they refuse most requests.
//!
//! This file holds the handle, its endpoints and the retry; the requests live by concern beside it:
//! `kv` (keys and transactions), `lease`, `watch`, `cluster` (members, statuses, leadership) and
//! `maintenance` (compaction, alarms, defragmentation); `config` builds the clients, `error` says what
//! went wrong.

mod cluster;
mod config;
mod error;
mod kv;
mod lease;
mod maintenance;
mod watch;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::Client;

pub use config::{EtcdConfig, TlsFiles};
pub use error::EtcdError;
pub use kv::{key_after, prefix_end, ListPage, LIST_PAGE_SIZE};

use config::{normalise_endpoint, normalise_endpoints, tls_config, Settings};
use error::{classify, is_retryable, timed_out};

/// Largest response this client decodes (lists and watch batches of big prefixes exceed gRPC's 4 MiB default).
const MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;
/// Pause between two full rounds over the endpoints.
const ROUND_PAUSE: Duration = Duration::from_millis(200);
/// Full rounds over the endpoints before a request gives up.
const ROUNDS: usize = 2;

/// The client in use and the endpoint it talks to.
struct Active {
    endpoints: Vec<String>,
    index: usize,
    client: Client,
    /// Bumped on every switch, so concurrent failures of one client rotate only once.
    generation: u64,
}

struct Inner {
    settings: Settings,
    active: Mutex<Active>,
    /// One client per endpoint for per-member calls (status, move-leader), built on first use.
    per_endpoint: Mutex<HashMap<String, Client>>,
    /// Counts requests that no endpoint could serve, for those that keep the endpoint list fresh.
    unreachable: tokio::sync::watch::Sender<u64>,
}

/// A cheap-to-clone handle on the etcd cluster.
///
/// ```no_run
/// # async fn demo() -> Result<(), hostlet_runtime::EtcdError> {
/// use hostlet_runtime::{Etcd, EtcdConfig};
/// let etcd = Etcd::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// etcd.put("/hostlet/nodes/n1", "{}").await?;
/// let kv = etcd.get("/hostlet/nodes/n1").await?;
/// assert!(kv.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.active();
        f.debug_struct("Etcd")
            .field("endpoints", &a.endpoints)
            .field("current", &a.endpoints.get(a.index))
            .finish()
    }
}

impl Etcd {
    /// Builds the client. Connections are made lazily: this fails only on a bad config, not on an etcd
    /// that is not up yet (the agent starts before its member serves).
    pub async fn connect(cfg: EtcdConfig) -> Result<Etcd, EtcdError> {
        let tls = cfg.tls.as_ref().map(tls_config).transpose()?;
        let settings = Settings {
            tls: std::sync::RwLock::new(tls),
            tls_files: cfg.tls.clone(),
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
        };
        let endpoints = normalise_endpoints(&cfg.endpoints, settings.uses_tls())?;
        let client = settings.build_client(&endpoints[0]).await?;
        Ok(Etcd {
            inner: Arc::new(Inner {
                settings,
                active: Mutex::new(Active {
                    endpoints,
                    index: 0,
                    client,
                    generation: 0,
                }),
                per_endpoint: Mutex::new(HashMap::new()),
                unreachable: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    fn active(&self) -> MutexGuard<'_, Active> {
        self.inner.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Presents the client certificate in its files again (it was renewed): every connection made from
    /// now on does; requests and watches under way finish on the connections they have.
    pub async fn reload_tls(&self) -> Result<(), EtcdError> {
        let Some(files) = &self.inner.settings.tls_files else {
            return Ok(());
        };
        let config = tls_config(files)?;
        *self
            .inner
            .settings
            .tls
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(config);
        self.inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let endpoint = self.current_endpoint();
        let client = self.inner.settings.build_client(&endpoint).await?;
        let mut a = self.active();
        a.client = client;
        a.generation += 1;
        Ok(())
    }

    /// The raw client for the endpoint in use, for calls this wrapper does not cover. It does not follow
    /// later endpoint switches; take a fresh one per operation.
    pub fn client(&self) -> Client {
        self.active().client.clone()
    }

    /// The endpoints requests may go to (voters only, once [`Etcd::sync_endpoints`] ran).
    pub fn endpoints(&self) -> Vec<String> {
        self.active().endpoints.clone()
    }

    /// Changes each time a request has failed on every endpoint (the endpoints known may all be gone).
    pub fn watch_unreachable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.unreachable.subscribe()
    }

    /// The endpoint requests go to now.
    pub fn current_endpoint(&self) -> String {
        let a = self.active();
        a.endpoints[a.index].clone()
    }

    /// The configured request deadline.
    pub fn request_timeout(&self) -> Duration {
        self.inner.settings.request_timeout
    }

    /// Replaces the endpoint list (give voting members only). The current endpoint is kept if it is still
    /// listed, so a healthy connection is not dropped.
    pub async fn set_endpoints<I, S>(&self, endpoints: I) -> Result<(), EtcdError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let wanted: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        let wanted = normalise_endpoints(&wanted, self.inner.settings.uses_tls())?;
        let switch_to = {
            let mut a = self.active();
            let current = a.endpoints[a.index].clone();
            if let Some(i) = wanted.iter().position(|e| *e == current) {
                a.endpoints = wanted;
                a.index = i;
                return Ok(());
            }
            wanted[0].clone()
        };
        let client = self.inner.settings.build_client(&switch_to).await?;
        let mut a = self.active();
        a.endpoints = wanted;
        a.index = 0;
        a.client = client;
        a.generation += 1;
        Ok(())
    }

    /// Points the client at the cluster's voting members, as `member_list` reports them.
    pub async fn sync_endpoints(&self) -> Result<Vec<String>, EtcdError> {
        let members = self.member_list().await?;
        let voters: Vec<String> = members
            .iter()
            .filter(|m| !m.is_learner())
            .filter_map(|m| m.client_urls().first().cloned())
            .collect();
        if !voters.is_empty() {
            self.set_endpoints(voters.clone()).await?;
        }
        Ok(voters)
    }

    /// Moves to the next endpoint, unless someone already moved away from the failed client.
    async fn rotate(&self, failed_generation: u64) {
        let next = {
            let a = self.active();
            if a.generation != failed_generation || a.endpoints.len() < 2 {
                return;
            }
            let index = (a.index + 1) % a.endpoints.len();
            (index, a.endpoints[index].clone())
        };
        let client = match self.inner.settings.build_client(&next.1).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(endpoint = %next.1, error = %e, "cannot build etcd client");
                return;
            }
        };
        let mut a = self.active();
        if a.generation == failed_generation && a.endpoints.get(next.0) == Some(&next.1) {
            tracing::debug!(endpoint = %next.1, "etcd: switching endpoint");
            a.index = next.0;
            a.client = client;
            a.generation += 1;
        }
    }

    /// Runs `op` with a client, moving to the next endpoint and retrying when the endpoint cannot serve
    /// (transport error, `Unavailable`, timeout). Other errors return at once. Use it for idempotent
    /// requests only: a retried request may have been applied by the endpoint that failed.
    ///
    /// ```no_run
    /// # async fn demo(etcd: hostlet_runtime::Etcd) -> Result<(), hostlet_runtime::EtcdError> {
    /// let resp = etcd.with_retry(|mut c| async move { c.status().await }).await?;
    /// println!("raft index {}", resp.raft_index());
    /// # Ok(()) }
    /// ```
    pub async fn with_retry<T, F, Fut>(&self, mut op: F) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.settings.request_timeout;
        let mut last = None;
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(ROUND_PAUSE).await;
            }
            let n = self.active().endpoints.len();
            for _ in 0..n {
                let (client, generation) = {
                    let a = self.active();
                    (a.client.clone(), a.generation)
                };
                let result = match tokio::time::timeout(timeout, op(client)).await {
                    Ok(r) => r,
                    Err(_) => Err(etcd_client::Error::GRpcStatus(
                        tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}")),
                    )),
                };
                match result {
                    Ok(v) => return Ok(v),
                    Err(e) if is_retryable(&e) => {
                        tracing::debug!(error = %e, "etcd request failed; trying the next endpoint");
                        last = Some(e);
                        self.rotate(generation).await;
                    }
                    Err(e) => return Err(classify(e, 0)),
                }
            }
        }
        self.inner.unreachable.send_modify(|n| *n += 1);
        Err(EtcdError::unavailable(
            self.endpoints().join(","),
            last.unwrap_or_else(|| {
                etcd_client::Error::InvalidArgs("no endpoint was tried".to_string())
            }),
        ))
    }

    /// A client for exactly this endpoint, never rotated (for per-member calls).
    async fn endpoint_client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        let endpoint = normalise_endpoint(endpoint, self.inner.settings.uses_tls())?;
        if let Some(c) = self
            .inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&endpoint)
        {
            return Ok(c.clone());
        }
        let client = self.inner.settings.build_client(&endpoint).await?;
        self.inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint, client.clone());
        Ok(client)
    }

    /// One attempt at one endpoint, within the request deadline.
    async fn attempt_at<T>(
        &self,
        endpoint: &str,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        let timeout = self.inner.settings.request_timeout;
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if is_retryable(&e) => Err(EtcdError::unavailable(endpoint, e)),
            Ok(Err(e)) => Err(EtcdError::request(e)),
            Err(_) => Err(EtcdError::unavailable(endpoint, timed_out(what, timeout))),
        }
    }
}
