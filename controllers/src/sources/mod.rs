//! Manifest sources, merged into one desired set of pods.
//!
//! Every source (etcd pod keys, the 2014 etcd list key, `--manifest-path`, `--manifest-url`, `POST /pods`)
//! publishes its whole current set to the [`Merger`]. A source never touches another's entries. The merger
//! validates each manifest, resolves duplicate ids and host-port conflicts by the fixed source order
//! ([`hostlet_api::validation::resolve`]) and publishes the winners into one [`Store`] keyed by pod id; the
//! losers and the invalid go to [`Merged::rejected`] with their reasons. Orphan removal waits for
//! [`Merged::all_synced`]: every configured source has answered once.

pub mod etcd;
pub mod file;
pub mod http;
pub mod url;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use hostlet_api::validation::{describe, resolve_admitted, validate, SourceKind, SourcedPod};
use hostlet_api::PodManifest;
use hostlet_runtime::store::{Event, Store, Writer};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// One entry a source found: a manifest, or why its text could not be read as one.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceEntry {
    /// The key, file or URL (with an item index for lists), for messages.
    pub origin: String,
    /// Position within the source, for ties between equal ids.
    pub ordinal: usize,
    /// The pod id when known (a manifest that does not parse may still be named by its key or file).
    pub id: Option<String>,
    pub manifest: Result<PodManifest, String>,
}

/// A source's whole current set.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSet {
    pub source: SourceKind,
    pub entries: Vec<SourceEntry>,
}

/// A pod to run, as the pod controller reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    pub manifest: PodManifest,
    pub source: SourceKind,
    pub origin: String,
}

/// A pod that will not run, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub id: Option<String>,
    pub source: SourceKind,
    pub origin: String,
    pub reason: String,
    /// True when another pod with the same id runs: the status key belongs to the winner.
    pub duplicate_id: bool,
}

/// The merged view the pod controller reads.
#[derive(Clone)]
pub struct Merged {
    /// Pods to run, by id. Ready once the etcd pod keys have been listed.
    pub store: Store<String, DesiredPod>,
    rejected: Arc<Mutex<Vec<Rejection>>>,
    all_synced: watch::Receiver<bool>,
    rejected_changed: watch::Receiver<u64>,
}

impl Merged {
    /// Pods that will not run, with the reasons.
    pub fn rejected(&self) -> Vec<Rejection> {
        self.rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether every configured source has answered once (orphans may be removed).
    pub fn all_synced(&self) -> bool {
        *self.all_synced.borrow()
    }

    /// Waits until every configured source has answered once.
    pub async fn wait_all_synced(&self) {
        let mut rx = self.all_synced.clone();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Notified whenever the set of rejections changes.
    pub fn rejections_changed(&self) -> watch::Receiver<u64> {
        self.rejected_changed.clone()
    }
}

/// Where sources send their sets.
#[derive(Clone)]
pub struct SourceSink {
    tx: mpsc::UnboundedSender<SourceSet>,
}

impl SourceSink {
    /// Replaces `set.source`'s whole set. Also marks that source as synced.
    pub fn publish(&self, set: SourceSet) {
        let _ = self.tx.send(set);
    }
}

/// When each pod was admitted (unix nanos), for host-port precedence: the pod admitted first keeps a port.
pub type Admitted = BTreeMap<String, u128>;

/// Merges the sets of the configured sources.
pub struct Merger {
    configured: Vec<SourceKind>,
    /// Pods already running on the host when the agent started, read before the first merge.
    seed: Option<Pin<Box<dyn Future<Output = Admitted> + Send>>>,
    admitted: Admitted,
    rx: mpsc::UnboundedReceiver<SourceSet>,
    writer: Writer<String, DesiredPod>,
    rejected: Arc<Mutex<Vec<Rejection>>>,
    synced_tx: watch::Sender<bool>,
    rejected_tx: watch::Sender<u64>,
    merged: Merged,
}

impl Merger {
    /// A merger waiting for each of `configured` sources to publish once.
    pub fn new(configured: Vec<SourceKind>) -> (Merger, SourceSink) {
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer::new();
        let rejected = Arc::new(Mutex::new(Vec::new()));
        let (synced_tx, synced_rx) = watch::channel(false);
        let (rejected_tx, rejected_rx) = watch::channel(0);
        let merged = Merged {
            store: writer.store(),
            rejected: rejected.clone(),
            all_synced: synced_rx,
            rejected_changed: rejected_rx,
        };
        (
            Merger {
                configured,
                seed: None,
                admitted: Admitted::new(),
                rx,
                writer,
                rejected,
                synced_tx,
                rejected_tx,
                merged,
            },
            SourceSink { tx },
        )
    }

    /// The same merger, reading which pods are admitted already (those with containers on the host, and
    /// since when) from `seed` before its first merge: admission order survives an agent restart.
    #[must_use]
    pub fn with_admitted(mut self, seed: impl Future<Output = Admitted> + Send + 'static) -> Self {
        self.seed = Some(Box::pin(seed));
        self
    }

    /// The view for the pod controller.
    pub fn merged(&self) -> Merged {
        self.merged.clone()
    }

    /// Applies sets as they come until `shutdown` or every sink is dropped.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut sets: HashMap<SourceKind, SourceSet> = HashMap::new();
        let mut published: Option<BTreeMap<String, DesiredPod>> = None;
        if let Some(seed) = self.seed.take() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                a = seed => self.admitted = a,
            }
        }
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                s = self.rx.recv() => match s { Some(s) => s, None => return },
            };
            sets.insert(first.source, first);
            // Take everything already queued, so a burst is merged once.
            while let Ok(s) = self.rx.try_recv() {
                sets.insert(s.source, s);
            }
            let (accepted, rejections) = merge_admitted(sets.values(), &self.admitted);
            let all = self.configured.iter().all(|k| sets.contains_key(k));
            self.admit(&accepted, all);
            self.publish(
                &mut published,
                accepted,
                sets.contains_key(&SourceKind::EtcdKey)
                    || !self.configured.contains(&SourceKind::EtcdKey),
            );
            {
                let mut r = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
                if *r != rejections {
                    *r = rejections;
                    self.rejected_tx.send_modify(|v| *v += 1);
                }
            }
            if all && !*self.synced_tx.borrow() {
                tracing::info!("every manifest source has synced once");
                self.synced_tx.send_replace(true);
            }
        }
    }

    /// Stamps newly accepted pods as admitted now, together; forgets pods no source gives any more, once
    /// every source has answered (before that, a running pod may only be waiting for its source).
    fn admit(&mut self, accepted: &BTreeMap<String, DesiredPod>, all_synced: bool) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for id in accepted.keys() {
            self.admitted.entry(id.clone()).or_insert(now);
        }
        if all_synced {
            self.admitted.retain(|id, _| accepted.contains_key(id));
        }
    }

    fn publish(
        &mut self,
        published: &mut Option<BTreeMap<String, DesiredPod>>,
        accepted: BTreeMap<String, DesiredPod>,
        primary_synced: bool,
    ) {
        match published {
            None if primary_synced => {
                self.writer.apply(Event::Init);
                for (id, p) in &accepted {
                    self.writer
                        .apply(Event::InitApply(id.clone(), Arc::new(p.clone())));
                }
                self.writer.apply(Event::InitDone);
                *published = Some(accepted);
            }
            None => {}
            Some(old) => {
                for id in old.keys().filter(|id| !accepted.contains_key(*id)) {
                    self.writer.apply(Event::Delete(id.clone()));
                }
                for (id, p) in &accepted {
                    if old.get(id) != Some(p) {
                        self.writer
                            .apply(Event::Apply(id.clone(), Arc::new(p.clone())));
                    }
                }
                *old = accepted;
            }
        }
    }
}

/// Validates and resolves the sources' sets: the pods to run and every rejection with its reason.
pub fn merge<'a>(
    sets: impl Iterator<Item = &'a SourceSet>,
) -> (BTreeMap<String, DesiredPod>, Vec<Rejection>) {
    merge_admitted(sets, &Admitted::new())
}

/// As [`merge`], with host ports going to the pods admitted first.
pub fn merge_admitted<'a>(
    sets: impl Iterator<Item = &'a SourceSet>,
    admitted: &Admitted,
) -> (BTreeMap<String, DesiredPod>, Vec<Rejection>) {
    let mut candidates = Vec::new();
    let mut rejections = Vec::new();
    for set in sets {
        for e in &set.entries {
            match &e.manifest {
                Err(err) => rejections.push(Rejection {
                    id: e.id.clone(),
                    source: set.source,
                    origin: e.origin.clone(),
                    reason: err.clone(),
                    duplicate_id: false,
                }),
                Ok(m) => {
                    let errors = validate(m);
                    if let Some(key_id) = e.id.as_deref().filter(|k| *k != m.id && !m.id.is_empty())
                    {
                        rejections.push(Rejection {
                            id: Some(key_id.to_string()),
                            source: set.source,
                            origin: e.origin.clone(),
                            reason: format!(
                                "manifest id {:?} does not match its key's name {key_id:?}",
                                m.id
                            ),
                            duplicate_id: false,
                        });
                    } else if !errors.is_empty() {
                        rejections.push(Rejection {
                            id: (!m.id.is_empty())
                                .then(|| m.id.clone())
                                .or_else(|| e.id.clone()),
                            source: set.source,
                            origin: e.origin.clone(),
                            reason: format!("invalid manifest: {}", describe(&errors)),
                            duplicate_id: false,
                        });
                    } else {
                        candidates.push(SourcedPod {
                            source: set.source,
                            origin: e.origin.clone(),
                            ordinal: e.ordinal,
                            manifest: m.clone(),
                        });
                    }
                }
            }
        }
    }
    let resolution = resolve_admitted(candidates, admitted);
    for (pod, reason) in resolution.rejected {
        let duplicate_id = resolution.accepted.contains_key(&pod.manifest.id);
        rejections.push(Rejection {
            id: Some(pod.manifest.id.clone()),
            source: pod.source,
            origin: pod.origin,
            reason,
            duplicate_id,
        });
    }
    // A rejected id that another source runs stays marked so its status is not overwritten.
    let accepted: BTreeMap<String, DesiredPod> = resolution
        .accepted
        .into_iter()
        .map(|(id, p)| {
            (
                id,
                DesiredPod {
                    manifest: p.manifest,
                    source: p.source,
                    origin: p.origin,
                },
            )
        })
        .collect();
    for r in rejections.iter_mut() {
        if r.id.as_ref().is_some_and(|id| accepted.contains_key(id)) {
            r.duplicate_id = true;
        }
    }
    rejections.sort_by(|a, b| (a.source, &a.origin).cmp(&(b.source, &b.origin)));
    (accepted, rejections)
}

/// Reads a manifest list's text into entries named `origin[i]` (or `origin` for a single manifest).
pub fn entries_from_list(
    origin: &str,
    bytes: &[u8],
    first_ordinal: usize,
) -> Result<Vec<SourceEntry>, String> {
    let items = hostlet_api::parse_manifest_list(bytes).map_err(|e| format!("{origin}: {e}"))?;
    let single = items.len() == 1;
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, item)| SourceEntry {
            origin: if single {
                origin.to_string()
            } else {
                format!("{origin}[{i}]")
            },
            ordinal: first_ordinal + i,
            id: item
                .as_ref()
                .ok()
                .map(|m| m.id.clone())
                .filter(|s| !s.is_empty()),
            // The entry's origin names the file or key; the error does not repeat it.
            manifest: item.map_err(|e| e.to_string()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(origin: &str, yaml: &str) -> SourceEntry {
        SourceEntry {
            origin: origin.into(),
            ordinal: 0,
            id: None,
            manifest: hostlet_api::parse_manifest(yaml.as_bytes()).map_err(|e| e.to_string()),
        }
    }

    fn pod(id: &str, port: u16) -> String {
        format!("version: v1beta1\nid: {id}\ncontainers: [{{name: a, image: busybox, ports: [{{containerPort: 80, hostPort: {port}}}]}}]\n")
    }

    #[test]
    fn higher_precedence_wins_and_the_loser_is_rejected_naming_the_winner() {
        let etcd = SourceSet {
            source: SourceKind::EtcdKey,
            entries: vec![entry("/k/web", &pod("web", 8001))],
        };
        let http = SourceSet {
            source: SourceKind::Http,
            entries: vec![entry("POST /pods", &pod("web", 8002))],
        };
        let (ok, rej) = merge([&http, &etcd].into_iter());
        assert_eq!(ok["web"].source, SourceKind::EtcdKey);
        assert_eq!(rej.len(), 1);
        assert!(rej[0].reason.contains("etcd key /k/web"), "{rej:?}");
        assert!(rej[0].duplicate_id);
    }

    #[test]
    fn invalid_and_unreadable_entries_are_rejected_alone() {
        let file = SourceSet {
            source: SourceKind::File,
            entries: vec![
                entry("/m/a.yaml", &pod("a", 8001)),
                SourceEntry {
                    origin: "/m/b.yaml".into(),
                    ordinal: 1,
                    id: None,
                    manifest: Err("/m/b.yaml: not UTF-8".into()),
                },
                entry("/m/c.yaml", "version: v1beta1\nid: c\ncontainers: []\n"),
            ],
        };
        let (ok, rej) = merge([&file].into_iter());
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(rej.len(), 2);
        assert!(rej.iter().any(|r| r.reason.contains("not UTF-8")));
        assert!(rej
            .iter()
            .any(|r| r.id.as_deref() == Some("c") && r.reason.contains("containers")));
    }

    #[test]
    fn key_name_and_manifest_id_must_agree() {
        let mut e = entry("/hostlet/hosts/n/pods/x", &pod("y", 8001));
        e.id = Some("x".into());
        let set = SourceSet {
            source: SourceKind::EtcdKey,
            entries: vec![e],
        };
        let (ok, rej) = merge([&set].into_iter());
        assert!(ok.is_empty());
        assert!(rej[0].reason.contains("does not match"), "{rej:?}");
    }

    #[tokio::test]
    async fn store_is_ready_with_the_etcd_keys_and_synced_when_every_source_answered() {
        let (merger, sink) = Merger::new(vec![SourceKind::EtcdKey, SourceKind::Url]);
        let merged = merger.merged();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(merger.run(shutdown.clone()));
        sink.publish(SourceSet {
            source: SourceKind::EtcdKey,
            entries: vec![entry("/k/a", &pod("a", 8001))],
        });
        merged.store.wait_until_ready().await;
        assert!(merged.store.get(&"a".to_string()).is_some());
        assert!(!merged.all_synced());
        sink.publish(SourceSet {
            source: SourceKind::Url,
            entries: vec![entry("http://x", &pod("b", 8002))],
        });
        merged.wait_all_synced().await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while merged.store.get(&"b".to_string()).is_none() {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        // Taking a source's pods away removes them from the store.
        sink.publish(SourceSet {
            source: SourceKind::Url,
            entries: vec![],
        });
        while merged.store.get(&"b".to_string()).is_some() {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        shutdown.cancel();
        let _ = task.await;
    }
}
