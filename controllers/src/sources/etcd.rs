//! The etcd sources: one key per pod (`/hostlet/hosts/<node>/pods/<id>`) and the 2014 kubelet's list key
//! (`/registry/hosts/<node>/kubelet`).

use hostlet_api::validation::SourceKind;
use hostlet_api::{parse_manifest, Key, KeyLayout, PodManifest};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{InformerFactory, Store};
use tokio_util::sync::CancellationToken;

use std::collections::HashMap;

use super::{entries_from_list, SourceEntry, SourceSet, SourceSink};
use crate::events::{EventKind, EventRecorder};

/// What the etcd sources remember between changes: the last manifest each key held that could be read,
/// and the problems already reported, so that a broken value costs no running pod and is reported once.
#[derive(Default)]
pub struct LastGood {
    manifests: HashMap<String, Vec<SourceEntry>>,
    reported: HashMap<String, String>,
}

impl LastGood {
    /// `entries` read from `key` now, or why they could not be read; returns the entries to publish
    /// and a problem to report (new ones only). With nothing kept, an unreadable pod key is reported by
    /// the pod's own Rejected status and event, so only `report_unkept` sources report it here.
    fn settle(
        &mut self,
        key: &str,
        read: Result<Vec<SourceEntry>, String>,
        report_unkept: bool,
    ) -> (Vec<SourceEntry>, Option<String>) {
        match read {
            Ok(entries) => {
                self.reported.remove(key);
                self.manifests.insert(key.to_string(), entries.clone());
                (entries, None)
            }
            Err(problem) => {
                let kept = self.manifests.get(key).cloned();
                let message = match &kept {
                    Some(k) => format!(
                        "{key}: {problem} (keeping the {} pod(s) last read from it)",
                        k.len()
                    ),
                    None => format!("{key}: {problem}"),
                };
                let fresh =
                    self.reported.get(key) != Some(&message) && (kept.is_some() || report_unkept);
                if fresh {
                    self.reported.insert(key.to_string(), message.clone());
                }
                let entries = kept.unwrap_or_else(|| {
                    vec![SourceEntry {
                        origin: key.to_string(),
                        ordinal: 0,
                        id: None,
                        manifest: Err(problem),
                    }]
                });
                (entries, fresh.then_some(message))
            }
        }
    }

    /// Forgets keys that no longer exist.
    fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.manifests.retain(|k, _| exists(k));
        self.reported.retain(|k, _| exists(k));
    }
}

fn pod_key_set(
    layout: &KeyLayout,
    store: &Store<String, Object<PodManifest>>,
    memory: &mut LastGood,
    problems: &mut Vec<String>,
) -> SourceSet {
    let mut objs = store.entries();
    objs.sort_by(|a, b| a.0.cmp(&b.0));
    memory.retain(|k| objs.iter().any(|(key, _)| key == k));
    let mut entries = Vec::new();
    for (i, (key, obj)) in objs.into_iter().enumerate() {
        let id = match layout.parse(&key) {
            Some(Key::Pod { pod, .. }) => Some(pod),
            _ => key.rsplit('/').next().map(str::to_string),
        };
        let read = match &obj.value {
            Ok(m) => Ok(vec![SourceEntry {
                origin: key.clone(),
                ordinal: i,
                id: id.clone(),
                manifest: Ok(m.clone()),
            }]),
            Err(e) => Err(e.message()),
        };
        let (mut got, problem) = memory.settle(&key, read, false);
        problems.extend(problem);
        for e in &mut got {
            e.id = id.clone();
            e.ordinal = i;
        }
        entries.extend(got);
    }
    SourceSet {
        source: SourceKind::EtcdKey,
        entries,
    }
}

/// The 2014 list key: a list that cannot be read as a whole, or one with an item that cannot be read,
/// keeps the pods last read from it (as the URL source does).
fn legacy_set(
    key: &str,
    store: &Store<String, Object<Vec<u8>>>,
    memory: &mut LastGood,
    problems: &mut Vec<String>,
) -> SourceSet {
    let entries = match store.get(&key.to_string()) {
        None => {
            memory.retain(|_| false);
            Vec::new()
        }
        Some(obj) => {
            let read = match &obj.value {
                Ok(bytes) => entries_from_list(key, bytes, 0).and_then(|entries| {
                    match entries.iter().find_map(|e| e.manifest.as_ref().err()) {
                        Some(bad) => Err(bad.clone()),
                        None => Ok(entries),
                    }
                }),
                Err(e) => Err(e.message()),
            };
            // entries_from_list names the key in its outer error; settle names it once.
            let read = read.map_err(|e| {
                e.strip_prefix(&format!("{key}: "))
                    .map(str::to_string)
                    .unwrap_or(e)
            });
            let (entries, problem) = memory.settle(key, read, true);
            problems.extend(problem);
            entries
        }
    };
    SourceSet {
        source: SourceKind::EtcdList,
        entries,
    }
}

/// The pod keys' store (informer `pods`), through the agent's `factory`.
pub fn pod_keys_store(
    factory: &InformerFactory,
    layout: &KeyLayout,
    node: &str,
) -> Store<String, Object<PodManifest>> {
    factory.store("pods", layout.pods_prefix(node), |_k: &str, v: &[u8]| {
        parse_manifest(v)
    })
}

/// The legacy list key's store (informer `legacy-pod-list`), through the agent's `factory`. The prefix is
/// the exact key; a longer key sharing it is not ours (the set is built from that key alone).
pub fn legacy_list_store(
    factory: &InformerFactory,
    layout: &KeyLayout,
    node: &str,
) -> Store<String, Object<Vec<u8>>> {
    factory.key_store(
        "legacy-pod-list",
        layout.legacy_pod_list(node),
        |_k: &str, v: &[u8]| Ok::<Vec<u8>, std::convert::Infallible>(v.to_vec()),
    )
}

/// Runs the pod-key source over `store` until `shutdown`, publishing the whole set on every change.
pub async fn run_pod_keys(
    store: Store<String, Object<PodManifest>>,
    layout: KeyLayout,
    sink: SourceSink,
    events: Option<EventRecorder>,
    shutdown: CancellationToken,
) {
    let mut memory = LastGood::default();
    publish_on_change(store, sink, events, shutdown, move |store, problems| {
        pod_key_set(&layout, store, &mut memory, problems)
    })
    .await;
}

/// Runs the legacy list-key source over `store` until `shutdown`.
pub async fn run_legacy_list(
    store: Store<String, Object<Vec<u8>>>,
    layout: KeyLayout,
    node: String,
    sink: SourceSink,
    events: Option<EventRecorder>,
    shutdown: CancellationToken,
) {
    let key = layout.legacy_pod_list(&node);
    let mut memory = LastGood::default();
    publish_on_change(store, sink, events, shutdown, move |store, problems| {
        legacy_set(&key, store, &mut memory, problems)
    })
    .await;
}

/// Publishes the set `make_set` builds from `store`: once listed, then on every change, until
/// `shutdown`. The problems `make_set` reports become one event each.
async fn publish_on_change<T: Send + Sync + 'static>(
    store: Store<String, Object<T>>,
    sink: SourceSink,
    events: Option<EventRecorder>,
    shutdown: CancellationToken,
    mut make_set: impl FnMut(&Store<String, Object<T>>, &mut Vec<String>) -> SourceSet,
) {
    let mut changes = store.subscribe();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = store.wait_until_ready() => {}
    }
    let mut publish = |store: &Store<String, Object<T>>| {
        let mut problems = Vec::new();
        sink.publish(make_set(store, &mut problems));
        for p in problems {
            match &events {
                Some(ev) => {
                    ev.record_now(None, None, EventKind::Warning, "ManifestKeyError", p);
                }
                None => tracing::warn!("{p}"),
            }
        }
    };
    publish(&store);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            b = changes.next_batch() => match b {
                Some(_) => publish(&store),
                None => break,
            },
        }
    }
}
