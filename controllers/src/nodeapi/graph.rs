//! The node authoriser's graph: which ConfigMaps and Secrets each node's pods use, kept in memory on a
//! voter so that a node API decision about a ConfigMap or a Secret reads no etcd (the Kubernetes Node
//! authorizer keeps the same graph from its informers).
//!
//! It is fed from the voter's shared watches ([`WatchHub`]), after one list of every host's pods: the
//! hub of the key prefix carries every write hostlet makes, in revision order, so the revision the graph
//! has applied tells how fresh it is. A decision about what was read at revision R waits until the graph
//! has applied R; without that a node that saw its new pod through a watch could list its ConfigMaps
//! before this voter's graph had the pod, miss one, and never be told. When the graph does not reach R
//! within [`FRESH_WAIT`] (a write outside the key prefix, a hub that is not watching), the decision reads
//! the node's pods from etcd as before, and `hostlet_node_api_graph_fallbacks_total` counts it.
//!
//! The 2014 pod lists (`/registry/hosts/<node>/kubelet`) come from the other hub; their revisions do not
//! advance the graph's, so a change of one is applied as soon as that hub delivers it (milliseconds).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use hostlet_api::manifest::ConfigKind;
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::informer::{EtcdListWatch, ListWatch, RawEvent, RawKv, WatchItem};
use hostlet_runtime::watchhub::WatchHub;
use hostlet_runtime::Etcd;
use prometheus::{IntCounter, Opts, Registry};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a decision waits for the graph to reach the revision it is about.
pub const FRESH_WAIT: Duration = Duration::from_secs(1);

/// What one node's pods use.
pub type Uses = BTreeSet<(ConfigKind, String)>;

/// A task that keeps one part of the graph current.
pub type Feeder = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The graph's state: pure, applied event by event.
#[derive(Debug, Default)]
pub struct GraphState {
    /// Pod key → (node, what the pod uses); pods that use nothing are left out.
    pods: HashMap<String, (String, Uses)>,
    /// Node → what its 2014 list's pods use.
    legacy: HashMap<String, Uses>,
}

fn refs_of_manifest(value: &[u8]) -> Uses {
    hostlet_api::parse_manifest(value)
        .map(|m| m.config_refs())
        .unwrap_or_default()
}

fn refs_of_list(value: &[u8]) -> Uses {
    hostlet_api::parse_manifest_list(value)
        .map(|list| {
            list.into_iter()
                .flatten()
                .flat_map(|m| m.config_refs())
                .collect()
        })
        .unwrap_or_default()
}

impl GraphState {
    /// Takes in a key's new value (`None`: deleted); keys other than pods and 2014 lists change nothing.
    pub fn apply(&mut self, keys: &KeyLayout, key: &str, value: Option<&[u8]>) {
        match keys.parse(key) {
            Some(Key::Pod { node, .. }) => {
                let uses = value.map(refs_of_manifest).unwrap_or_default();
                if uses.is_empty() {
                    self.pods.remove(key);
                } else {
                    self.pods.insert(key.to_string(), (node, uses));
                }
            }
            Some(Key::LegacyPodList { node }) => {
                let uses = value.map(refs_of_list).unwrap_or_default();
                if uses.is_empty() {
                    self.legacy.remove(&node);
                } else {
                    self.legacy.insert(node, uses);
                }
            }
            _ => {}
        }
    }

    /// What `node`'s pods use.
    pub fn uses(&self, node: &str) -> Uses {
        let mut out: Uses = self
            .pods
            .values()
            .filter(|(n, _)| n == node)
            .flat_map(|(_, u)| u.iter().cloned())
            .collect();
        if let Some(l) = self.legacy.get(node) {
            out.extend(l.iter().cloned());
        }
        out
    }

    /// Forgets every pod (`legacy == false`) or every 2014 list: a list from etcd follows.
    fn clear(&mut self, legacy: bool) {
        if legacy {
            self.legacy.clear();
        } else {
            self.pods.clear();
        }
    }
}

struct Inner {
    keys: KeyLayout,
    state: RwLock<GraphState>,
    /// The revision of the key prefix the graph has applied everything up to; 0 while it has not listed.
    applied: watch::Sender<i64>,
    fallbacks: IntCounter,
    own_watches: IntCounter,
}

/// The graph, shared by the node API's handlers.
#[derive(Clone)]
pub struct NodeGraph {
    inner: Arc<Inner>,
}

impl NodeGraph {
    /// An empty graph that nothing feeds (it never reaches a revision: every decision falls back).
    pub fn unfed(keys: KeyLayout, registry: &Registry) -> Result<NodeGraph, prometheus::Error> {
        let fallbacks = IntCounter::with_opts(Opts::new(
            "hostlet_node_api_graph_fallbacks_total",
            "Node API decisions about a ConfigMap or Secret that read the node's pods from etcd because \
             the in-memory graph had not reached the revision in time.",
        ))?;
        registry.register(Box::new(fallbacks.clone()))?;
        let own_watches = IntCounter::with_opts(Opts::new(
            "hostlet_node_api_graph_own_watches_total",
            "etcd watches the node graph opened itself because its shared watch hub could not serve \
             the revision it listed at.",
        ))?;
        registry.register(Box::new(own_watches.clone()))?;
        let (applied, _) = watch::channel(0);
        Ok(NodeGraph {
            inner: Arc::new(Inner {
                keys,
                state: RwLock::default(),
                applied,
                fallbacks,
                own_watches,
            }),
        })
    }

    /// The graph, and the tasks that feed it from `hubs` (by their roots: the key prefix's, the 2014
    /// lists') until `cancel`, named, for the caller to run.
    pub fn start(
        etcd: Etcd,
        keys: KeyLayout,
        hubs: &[WatchHub],
        registry: &Registry,
        cancel: CancellationToken,
    ) -> Result<(NodeGraph, Vec<(String, Feeder)>), prometheus::Error> {
        let graph = NodeGraph::unfed(keys.clone(), registry)?;
        let feeds = [
            (
                format!("{}/", keys.prefix()),
                format!("{}/hosts/", keys.prefix()),
                false,
            ),
            (
                format!("{}/", hostlet_api::keys::LEGACY_REGISTRY_PREFIX),
                format!("{}/", hostlet_api::keys::LEGACY_REGISTRY_PREFIX),
                true,
            ),
        ];
        let mut feeders = Vec::new();
        for (root, listed, legacy) in feeds {
            let hub = hubs.iter().find(|h| h.root() == root).cloned();
            let name = format!("node graph {root}");
            let feed = graph
                .clone()
                .feed(etcd.clone(), hub, root, listed, legacy, cancel.clone());
            feeders.push((name, Box::pin(feed) as Feeder));
        }
        Ok((graph, feeders))
    }

    /// What `node`'s pods use, as of revision `at` or later; `None` when the graph has not applied `at`
    /// within [`FRESH_WAIT`].
    pub async fn uses_at(&self, node: &str, at: i64) -> Option<Uses> {
        let mut applied = self.inner.applied.subscribe();
        let reached = tokio::time::timeout(FRESH_WAIT, applied.wait_for(|r| *r > 0 && *r >= at))
            .await
            .is_ok_and(|r| r.is_ok());
        if !reached {
            return None;
        }
        Some(self.read().uses(node))
    }

    /// The revision the graph has applied (0: not listed yet).
    pub fn applied(&self) -> i64 {
        *self.inner.applied.borrow()
    }

    /// Counts a decision that read etcd instead.
    pub fn fell_back(&self) {
        self.inner.fallbacks.inc();
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, GraphState> {
        self.inner.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, GraphState> {
        self.inner.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one batch of the watch of `root`; under the key prefix, the graph has then applied
    /// `revision`.
    fn apply_events(&self, events: &[RawEvent], legacy: bool) {
        let mut last = 0;
        {
            let mut state = self.write();
            for e in events {
                match e {
                    RawEvent::Put(kv) => {
                        state.apply(&self.inner.keys, &kv.key, Some(&kv.value));
                        last = last.max(kv.mod_revision);
                    }
                    RawEvent::Delete { key, revision } => {
                        state.apply(&self.inner.keys, key, None);
                        last = last.max(*revision);
                    }
                }
            }
        }
        if !legacy {
            self.inner.applied.send_if_modified(|r| {
                let moved = last > *r;
                *r = (*r).max(last);
                moved
            });
        }
    }

    /// Lists `listed` from etcd into the graph; the revision it was read at.
    async fn list(&self, etcd: &Etcd, listed: &str, legacy: bool) -> Option<i64> {
        let lw = EtcdListWatch::new(etcd.clone(), listed);
        let mut kvs: Vec<RawKv> = Vec::new();
        let mut from: Option<Vec<u8>> = None;
        let mut revision = 0;
        loop {
            let page = lw.list(from.as_deref(), revision).await.ok()?;
            revision = page.revision;
            kvs.extend(page.kvs);
            match page.next {
                Some(n) => from = Some(n),
                None => break,
            }
        }
        {
            let mut state = self.write();
            state.clear(legacy);
            for kv in &kvs {
                state.apply(&self.inner.keys, &kv.key, Some(&kv.value));
            }
        }
        if !legacy {
            self.inner.applied.send_replace(revision);
        }
        Some(revision)
    }

    /// Keeps the graph's part under `root` current: a list of `listed`, then the hub's events (or an etcd
    /// watch of its own when the hub cannot serve the revision), listing again after a compaction.
    async fn feed(
        self,
        etcd: Etcd,
        hub: Option<WatchHub>,
        root: String,
        listed: String,
        legacy: bool,
        cancel: CancellationToken,
    ) {
        let mut backoff = hostlet_runtime::backoff::ExponentialBackoff::new(
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        let mut next: Option<i64> = None;
        while !cancel.is_cancelled() {
            let from = match next {
                Some(f) => f,
                None => {
                    // Listed before the hub opens its window, the graph could not be served by it
                    // and would keep an etcd watch of its own.
                    if let Some(h) = &hub {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = h.watching() => {}
                        }
                    }
                    let listed_at = tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = self.list(&etcd, &listed, legacy) => r,
                    };
                    match listed_at {
                        Some(r) => r + 1,
                        None => {
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(backoff.next_delay()) => continue,
                            }
                        }
                    }
                }
            };
            let stream = match hub.as_ref().and_then(|h| h.watch(&root, from)) {
                Some(s) => Ok(s),
                None => {
                    if hub.is_some() {
                        self.inner.own_watches.inc();
                    }
                    EtcdListWatch::new(etcd.clone(), root.clone())
                        .watch(from)
                        .await
                }
            };
            let Ok(mut stream) = stream else {
                next = Some(from);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                }
            };
            let mut resume = from;
            loop {
                let item = tokio::select! {
                    _ = cancel.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    Some(Ok(WatchItem::Events(events))) => {
                        backoff.reset();
                        if let Some(r) = events.iter().map(revision_of).max() {
                            resume = resume.max(r + 1);
                        }
                        self.apply_events(&events, legacy);
                    }
                    Some(Ok(WatchItem::Compacted(_))) | Some(Ok(WatchItem::Relist)) => {
                        resume = 0;
                        break;
                    }
                    Some(Err(_)) | None => break,
                }
            }
            next = (resume > 0).then_some(resume);
            if next.is_none() {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// The revision an event was made at.
pub fn revision_of(e: &RawEvent) -> i64 {
    match e {
        RawEvent::Put(kv) => kv.mod_revision,
        RawEvent::Delete { revision, .. } => *revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, revision: i64) -> RawEvent {
        RawEvent::Put(RawKv {
            key: key.to_string(),
            value: value.as_bytes().to_vec(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: 0,
        })
    }

    const USES_CM: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},
        "spec":{"containers":[{"name":"c","image":"busybox"}],
        "volumes":[{"name":"v","configMap":{"name":"settings"}}]}}"#;
    const USES_SECRET_ENV: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"db"},
        "spec":{"containers":[{"name":"c","image":"busybox",
        "env":[{"name":"P","valueFrom":{"secretKeyRef":{"name":"pw","key":"k"}}}]}]}}"#;

    fn cm(name: &str) -> (ConfigKind, String) {
        (ConfigKind::ConfigMap, name.to_string())
    }

    #[test]
    fn a_nodes_uses_come_from_its_pods_and_its_2014_list_only() {
        let keys = KeyLayout::default();
        let mut g = GraphState::default();
        g.apply(&keys, &keys.pod("w1", "web"), Some(USES_CM.as_bytes()));
        g.apply(
            &keys,
            &keys.pod("w2", "db"),
            Some(USES_SECRET_ENV.as_bytes()),
        );
        // A status that names a ConfigMap is not a pod.
        g.apply(
            &keys,
            &keys.pod_status("w3", "web"),
            Some(USES_CM.as_bytes()),
        );
        g.apply(
            &keys,
            &keys.legacy_pod_list("w3"),
            Some(format!("[{USES_SECRET_ENV}]").as_bytes()),
        );
        assert_eq!(g.uses("w1"), [cm("settings")].into());
        assert_eq!(
            g.uses("w2"),
            [(ConfigKind::Secret, "pw".to_string())].into()
        );
        assert_eq!(
            g.uses("w3"),
            [(ConfigKind::Secret, "pw".to_string())].into()
        );
        assert!(g.uses("ghost").is_empty());
        // The pod goes, or stops using it: so does the use.
        g.apply(&keys, &keys.pod("w1", "web"), None);
        assert!(g.uses("w1").is_empty());
        g.apply(&keys, &keys.pod("w2", "db"), Some(b"not a manifest"));
        assert!(g.uses("w2").is_empty());
        g.apply(&keys, &keys.legacy_pod_list("w3"), None);
        assert!(g.uses("w3").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_waits_for_the_revision_it_is_about_and_gives_up_after_the_wait() {
        let keys = KeyLayout::default();
        let graph = NodeGraph::unfed(keys.clone(), &Registry::new()).unwrap();
        // Not listed yet: no answer, whatever the revision.
        assert_eq!(graph.uses_at("w1", 0).await, None);
        graph.apply_events(&[put(&keys.pod("w1", "web"), USES_CM, 7)], false);
        assert_eq!(graph.applied(), 7);
        assert_eq!(graph.uses_at("w1", 7).await, Some([cm("settings")].into()));
        // Behind: the answer comes once the graph applies the revision.
        let later = {
            let graph = graph.clone();
            tokio::spawn(async move { graph.uses_at("w1", 9).await })
        };
        tokio::time::sleep(FRESH_WAIT / 2).await;
        graph.apply_events(&[put(&keys.pod("w1", "web"), "{}", 9)], false);
        assert_eq!(later.await.unwrap(), Some(Uses::new()));
        // Never reached: none, after the wait.
        let start = tokio::time::Instant::now();
        assert_eq!(graph.uses_at("w1", 10).await, None);
        assert_eq!(start.elapsed(), FRESH_WAIT);
        // The 2014 lists' events do not move the revision.
        graph.apply_events(
            &[put(
                &keys.legacy_pod_list("w1"),
                &format!("[{USES_CM}]"),
                12,
            )],
            true,
        );
        assert_eq!(graph.applied(), 9);
        assert_eq!(graph.uses_at("w1", 9).await, Some([cm("settings")].into()));
    }
}
