//! The etcd sources: one key per pod (`/hostlet/hosts/<node>/pods/<id>`) and the 2014 kubelet's list key
//! (`/registry/hosts/<node>/kubelet`).

use hostlet_api::validation::SourceKind;
use hostlet_api::{parse_manifest, Key, KeyLayout, PodManifest};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, Informer, Metrics, Store};
use tokio_util::sync::CancellationToken;

use super::{entries_from_list, SourceEntry, SourceSet, SourceSink};

fn pod_key_set(layout: &KeyLayout, store: &Store<String, Object<PodManifest>>) -> SourceSet {
    let mut objs = store.entries();
    objs.sort_by(|a, b| a.0.cmp(&b.0));
    let entries = objs
        .into_iter()
        .enumerate()
        .map(|(i, (key, obj))| {
            let id = match layout.parse(&key) {
                Some(Key::Pod { pod, .. }) => Some(pod),
                _ => key.rsplit('/').next().map(str::to_string),
            };
            SourceEntry {
                origin: key.clone(),
                ordinal: i,
                id,
                manifest: obj
                    .value
                    .clone()
                    .map_err(|e| format!("{key}: {}", e.message())),
            }
        })
        .collect();
    SourceSet {
        source: SourceKind::EtcdKey,
        entries,
    }
}

fn legacy_set(key: &str, store: &Store<String, Object<Vec<u8>>>) -> SourceSet {
    let entries = match store.get(&key.to_string()) {
        None => Vec::new(),
        Some(obj) => match &obj.value {
            Ok(bytes) => entries_from_list(key, bytes, 0).unwrap_or_else(|e| {
                vec![SourceEntry {
                    origin: key.to_string(),
                    ordinal: 0,
                    id: None,
                    manifest: Err(e),
                }]
            }),
            Err(e) => vec![SourceEntry {
                origin: key.to_string(),
                ordinal: 0,
                id: None,
                manifest: Err(format!("{key}: {}", e.message())),
            }],
        },
    };
    SourceSet {
        source: SourceKind::EtcdList,
        entries,
    }
}

/// Runs the pod-key source until `shutdown`, publishing the whole set on every change.
pub async fn run_pod_keys(
    etcd: Etcd,
    layout: KeyLayout,
    node: String,
    metrics: Metrics,
    sink: SourceSink,
    shutdown: CancellationToken,
) {
    let informer = Informer::new(
        "pods",
        etcd,
        layout.pods_prefix(&node),
        |_k: &str, v: &[u8]| parse_manifest(v),
    )
    .with_metrics(&metrics);
    publish_on_change(informer, sink, shutdown, move |store| {
        pod_key_set(&layout, store)
    })
    .await;
}

/// Runs the legacy list-key source until `shutdown`.
pub async fn run_legacy_list(
    etcd: Etcd,
    layout: KeyLayout,
    node: String,
    metrics: Metrics,
    sink: SourceSink,
    shutdown: CancellationToken,
) {
    let key = layout.legacy_pod_list(&node);
    // The prefix is the exact key; a longer key sharing it is not ours.
    let informer = Informer::new(
        "legacy-pod-list",
        etcd,
        key.clone(),
        |_k: &str, v: &[u8]| Ok::<Vec<u8>, std::convert::Infallible>(v.to_vec()),
    )
    .with_metrics(&metrics);
    publish_on_change(informer, sink, shutdown, move |store| {
        legacy_set(&key, store)
    })
    .await;
}

/// Runs `informer` and publishes the set `make_set` builds from its store: once listed, then on every
/// change, until `shutdown`.
async fn publish_on_change<T: Send + Sync + 'static>(
    informer: Informer<T>,
    sink: SourceSink,
    shutdown: CancellationToken,
    make_set: impl Fn(&Store<String, Object<T>>) -> SourceSet,
) {
    let store = informer.store();
    let mut changes = store.subscribe();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    tokio::select! {
        _ = shutdown.cancelled() => { let _ = task.await; return; }
        _ = store.wait_until_ready() => {}
    }
    sink.publish(make_set(&store));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            b = changes.next_batch() => match b {
                Some(_) => sink.publish(make_set(&store)),
                None => break,
            },
        }
    }
    let _ = task.await;
}
