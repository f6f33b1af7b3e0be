//! The pod set controller: on the etcd leader's agent, it keeps one pod of each set on every node whose
//! labels match (`/hostlet/hosts/<node>/pods/<set>`) and rolls template changes out under the set's rules
//! ([`plan::decide`], pure).
//!
//! It reads the shared caches only: the sets with their revisions and status, the node records, the
//! admins' labels and cordons, and every host's pod keys and statuses. Each step is one etcd transaction
//! that also writes the set's status under a compare on its last version, and compares every pod key it
//! writes with what the cache showed: a controller whose caches lag behind its own last step, or a second
//! agent that briefly believes it leads, takes no step at all. That is what keeps `maxUnavailable` across
//! a change of leader: every piece of the rollout's state is in etcd.

pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::labels::AdminLabels;
use hostlet_api::objects::{NodeInfo, PodStatus};
use hostlet_api::podset::{self, PodSet, PodSetStatus, Revision};
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{
    Action, Controller, ErrorAction, Etcd, EtcdError, Members, Metrics, Run, Store,
};
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use tokio_util::sync::CancellationToken;

use crate::events::{EventKind, EventRecorder};
use plan::{Note, Observed, PodOp, PodView, SetState, StatusView};

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "podsets";
/// The informer labels of its caches.
pub const PODSETS_INFORMER: &str = "podsets";
pub const HOSTS_INFORMER: &str = "host-pods";
pub const NODE_LABELS_INFORMER: &str = "node-labels";
/// The counts `hostlet_podset_pods{set,count}` has for each set.
pub const COUNTS: [&str; 7] = [
    "desired",
    "current",
    "updated",
    "ready",
    "available",
    "unavailable",
    "misscheduled",
];
/// Outcomes counted by `hostlet_podset_rollouts_total{outcome}`.
pub const OUTCOMES: [&str; 3] = ["complete", "failed", "reverted"];
/// How soon a failed step is tried again (a compare that failed waits for the caches to catch up).
const STEP_AGAIN: Duration = Duration::from_secs(1);

/// A key under `/hostlet/podsets/`, decoded.
#[derive(Debug, Clone)]
pub enum PodSetEntry {
    Set { set: Box<PodSet>, raw: Vec<u8> },
    Revision(Revision),
    Status(Box<PodSetStatus>),
}

impl PodSetEntry {
    pub fn decode(keys: &KeyLayout, key: &str, value: &[u8]) -> Result<PodSetEntry, String> {
        match keys.parse(key) {
            Some(Key::PodSet { .. }) => podset::parse(value)
                .map(|set| PodSetEntry::Set {
                    set: Box::new(set),
                    raw: value.to_vec(),
                })
                .map_err(|es| hostlet_api::field::describe(&es)),
            Some(Key::PodSetRevision { .. }) => serde_json::from_slice(value)
                .map(PodSetEntry::Revision)
                .map_err(|e| e.to_string()),
            Some(Key::PodSetStatus { .. }) => serde_json::from_slice(value)
                .map(|s| PodSetEntry::Status(Box::new(s)))
                .map_err(|e| e.to_string()),
            _ => Err("not a pod set key".into()),
        }
    }
}

/// A key under `/hostlet/hosts/`, as much of it as pod sets read.
#[derive(Debug, Clone)]
pub enum HostEntry {
    Pod {
        owner: Option<String>,
        hash: Option<String>,
    },
    Status(StatusView),
    Other,
}

impl HostEntry {
    pub fn decode(keys: &KeyLayout, key: &str, value: &[u8]) -> HostEntry {
        match keys.parse(key) {
            Some(Key::Pod { .. }) => match hostlet_api::parse_manifest(value) {
                Ok(m) => HostEntry::Pod {
                    owner: m.annotations.get(podset::OWNER).cloned(),
                    hash: m.annotations.get(podset::HASH).cloned(),
                },
                Err(_) => HostEntry::Pod {
                    owner: None,
                    hash: None,
                },
            },
            Some(Key::PodStatus { .. }) => match serde_json::from_slice::<PodStatus>(value) {
                Ok(s) => HostEntry::Status(StatusView {
                    ready: s.ready,
                    hash: s.revision_hash,
                    updated: s.updated_at.0,
                    phase: s.phase,
                    message: s.message,
                    mod_revision: 0,
                }),
                Err(_) => HostEntry::Other,
            },
            _ => HostEntry::Other,
        }
    }
}

/// The caches the controller reads (all shared, built in [`crate::caches::Caches`]).
#[derive(Clone)]
pub struct PodSetCaches {
    pub members: Members,
    pub nodes: Store<String, Object<NodeInfo>>,
    pub node_labels: Store<String, Object<AdminLabels>>,
    pub podsets: Store<String, Object<PodSetEntry>>,
    pub hosts: Store<String, Object<HostEntry>>,
}

/// The pod set metrics.
#[derive(Clone)]
pub struct PodSetMetrics {
    pub pods: IntGaugeVec,
    pub rollouts: IntCounterVec,
}

impl PodSetMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let m = PodSetMetrics {
            pods: IntGaugeVec::new(
                Opts::new(
                    "hostlet_podset_pods",
                    "Each pod set's status numbers (desired, current, updated, ready, available, unavailable, misscheduled), on the leader.",
                ),
                &["set", "count"],
            )?,
            rollouts: IntCounterVec::new(
                Opts::new(
                    "hostlet_podset_rollouts_total",
                    "Pod set rollouts that ended, by outcome: complete, failed (the progress deadline passed), reverted.",
                ),
                &["outcome"],
            )?,
        };
        registry.register(Box::new(m.pods.clone()))?;
        registry.register(Box::new(m.rollouts.clone()))?;
        for o in OUTCOMES {
            m.rollouts.with_label_values(&[o]).inc_by(0);
        }
        Ok(m)
    }
}

/// The pod set controller of one agent; it acts only where the local member leads.
pub struct PodSets {
    etcd: Etcd,
    keys: KeyLayout,
    caches: PodSetCaches,
    events: EventRecorder,
    metrics: PodSetMetrics,
    registry: Metrics,
    /// Pods of a set's name that the set did not write, reported once each (key and revision).
    reported_foreign: Mutex<HashSet<(String, i64)>>,
}

impl PodSets {
    pub fn new(
        etcd: Etcd,
        keys: KeyLayout,
        caches: PodSetCaches,
        events: EventRecorder,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        Ok(PodSets {
            etcd,
            keys,
            caches,
            events,
            metrics: PodSetMetrics::register(metrics.registry())?,
            registry: metrics.clone(),
            reported_foreign: Mutex::new(HashSet::new()),
        })
    }

    /// Every set name the caches know of: sets, and sets whose pods or records are left.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .caches
            .podsets
            .keys()
            .iter()
            .filter_map(|k| match self.keys.parse(k) {
                Some(Key::PodSet { name })
                | Some(Key::PodSetStatus { name })
                | Some(Key::PodSetRevision { name, .. }) => Some(name),
                _ => None,
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// What `decide` reads about set `name`.
    pub fn observe(&self, name: &str) -> (Observed, Option<i64>) {
        let set = match self.caches.podsets.get(&self.keys.podset(name)) {
            None => SetState::Deleted,
            Some(o) => match &o.value {
                Ok(PodSetEntry::Set { set, .. }) => SetState::Valid {
                    set: set.clone(),
                    generation: o.mod_revision,
                },
                Ok(_) => SetState::Deleted,
                Err(e) => SetState::Invalid {
                    message: format!("{}: {}", o.key, e.message()),
                    generation: o.mod_revision,
                },
            },
        };
        let status_obj = self.caches.podsets.get(&self.keys.podset_status(name));
        let status_rev = status_obj.as_ref().map(|o| o.mod_revision);
        let status = status_obj.and_then(|o| match &o.value {
            Ok(PodSetEntry::Status(s)) => Some((**s).clone()),
            _ => None,
        });
        let revisions = self
            .caches
            .podsets
            .entries()
            .into_iter()
            .filter(|(k, _)| k.starts_with(&self.keys.podset_revisions_prefix(name)))
            .filter_map(|(_, o)| match &o.value {
                Ok(PodSetEntry::Revision(r)) => Some(r.clone()),
                _ => None,
            })
            .collect();
        let admin: BTreeMap<String, Arc<Object<AdminLabels>>> = self
            .caches
            .node_labels
            .entries()
            .into_iter()
            .filter_map(|(k, o)| match self.keys.parse(&k) {
                Some(Key::NodeLabels { node }) => Some((node, o)),
                _ => None,
            })
            .collect();
        let nodes = self
            .caches
            .nodes
            .state()
            .iter()
            .filter_map(|o| o.valid())
            .map(|n| {
                let record = admin.get(&n.name);
                let a = record.and_then(|o| o.valid());
                plan::NodeView {
                    name: n.name.clone(),
                    labels: hostlet_api::labels::effective(&n.labels, a),
                    // A record that does not parse cordons nothing, but it is still compared.
                    unschedulable: a.is_some_and(|a| a.unschedulable),
                    admin_revision: record.map_or(0, |o| o.mod_revision),
                }
            })
            .collect();
        let mut pods = BTreeMap::new();
        let mut statuses = BTreeMap::new();
        for (key, o) in self.caches.hosts.entries() {
            match (self.keys.parse(&key), &o.value) {
                (Some(Key::Pod { node, pod }), Ok(HostEntry::Pod { owner, hash }))
                    if pod == name =>
                {
                    pods.insert(
                        node,
                        PodView {
                            owner: owner.clone(),
                            hash: hash.clone(),
                            mod_revision: o.mod_revision,
                        },
                    );
                }
                (Some(Key::PodStatus { node, pod }), Ok(HostEntry::Status(s))) if pod == name => {
                    statuses.insert(
                        node,
                        StatusView {
                            mod_revision: o.mod_revision,
                            ..s.clone()
                        },
                    );
                }
                _ => {}
            }
        }
        (
            Observed {
                name: name.to_string(),
                set,
                revisions,
                status,
                nodes,
                pods,
                statuses,
                now: SystemTime::now(),
            },
            status_rev,
        )
    }

    /// One look at set `name`: a step where the local member leads.
    pub async fn reconcile(&self, name: &str) -> Result<Action, EtcdError> {
        if !self.caches.members.leadership().local_leads() {
            // Only the leader's figures are current: an agent that led before says nothing stale.
            self.forget_gauges(name);
            return Ok(Action::AwaitChange);
        }
        let (obs, status_rev) = self.observe(name);
        let step = plan::decide(&obs);
        self.report_foreign(name, &step.foreign, &obs);
        if let Some(s) = step.status.as_ref().or(obs.status.as_ref()) {
            self.set_gauges(name, s);
        }
        if step.forget {
            self.forget_gauges(name);
        }
        if step.writes() {
            if !self.write(&obs, status_rev, &step).await? {
                // Another writer, or caches behind this controller's own last step: look again.
                return Ok(Action::Requeue(STEP_AGAIN));
            }
            for note in &step.notes {
                self.note(name, note);
            }
        }
        Ok(match step.again {
            Some(d) => Action::Requeue(d),
            None => Action::AwaitChange,
        })
    }

    /// The step as one transaction; false when a compare failed.
    async fn write(
        &self,
        obs: &Observed,
        status_rev: Option<i64>,
        step: &plan::Plan,
    ) -> Result<bool, EtcdError> {
        let name = obs.name.as_str();
        let status_key = self.keys.podset_status(name);
        let mut when = vec![match status_rev {
            Some(r) => Compare::mod_revision(status_key.as_str(), CompareOp::Equal, r),
            None => Compare::create_revision(status_key.as_str(), CompareOp::Equal, 0),
        }];
        let mut ops = Vec::new();
        let set = match &obs.set {
            SetState::Valid { set, .. } => Some(set),
            _ => None,
        };
        for op in &step.ops {
            match op {
                PodOp::Create { node } | PodOp::Replace { node, .. } => {
                    let (Some(set), Some(update)) = (set, &step.update) else {
                        continue;
                    };
                    let key = self.keys.pod(node, name);
                    if matches!(op, PodOp::Create { .. }) {
                        let admin = self.keys.node_labels(node);
                        let rev = obs
                            .nodes
                            .iter()
                            .find(|n| &n.name == node)
                            .map_or(0, |n| n.admin_revision);
                        when.push(if rev == 0 {
                            Compare::create_revision(admin.as_str(), CompareOp::Equal, 0)
                        } else {
                            Compare::mod_revision(admin.as_str(), CompareOp::Equal, rev)
                        });
                    }
                    when.push(match op {
                        PodOp::Replace { mod_revision, .. } => {
                            Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)
                        }
                        _ => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                    });
                    let manifest = set.pod_for(update.revision);
                    ops.push(TxnOp::put(
                        key,
                        hostlet_api::parse::to_json(&manifest),
                        None,
                    ));
                }
                PodOp::Delete { node, mod_revision } => {
                    let key = self.keys.pod(node, name);
                    when.push(Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        *mod_revision,
                    ));
                    ops.push(TxnOp::delete(key, None));
                }
            }
        }
        if step.ops.iter().any(|o| matches!(o, PodOp::Replace { .. })) {
            // The statuses the bound was judged on: one written meanwhile fails the step.
            for (node, st) in &obs.statuses {
                when.push(Compare::mod_revision(
                    self.keys.pod_status(node, name),
                    CompareOp::Equal,
                    st.mod_revision,
                ));
            }
        }
        if let Some(r) = &step.put_revision {
            ops.push(TxnOp::put(
                self.keys.podset_revision(name, r.revision),
                serde_json::to_vec(r).unwrap_or_default(),
                None,
            ));
        }
        for r in &step.drop_revisions {
            ops.push(TxnOp::delete(self.keys.podset_revision(name, *r), None));
        }
        if let (Some(r), SetState::Valid { generation, .. }) = (&step.revert_to, &obs.set) {
            let set_key = self.keys.podset(name);
            let raw = self
                .caches
                .podsets
                .get(&set_key)
                .and_then(|o| match &o.value {
                    Ok(PodSetEntry::Set { raw, .. }) => Some(raw.clone()),
                    _ => None,
                });
            if let Some(back) = raw.and_then(|raw| podset::with_template(&raw, &r.template)) {
                when.push(Compare::mod_revision(
                    set_key.as_str(),
                    CompareOp::Equal,
                    *generation,
                ));
                ops.push(TxnOp::put(set_key, back, None));
            }
        }
        if step.forget {
            ops.push(TxnOp::delete(status_key.as_str(), None));
            ops.push(TxnOp::delete(
                self.keys.podset_revisions_prefix(name),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ));
        } else if let Some(s) = &step.status {
            ops.push(TxnOp::put(
                status_key.as_str(),
                serde_json::to_vec(s).unwrap_or_default(),
                None,
            ));
        }
        if step.forget {
            // The set may have been written again meanwhile: forget only while it is absent.
            when.push(Compare::create_revision(
                self.keys.podset(name),
                CompareOp::Equal,
                0,
            ));
        }
        let txn = Txn::new().when(when).and_then(ops);
        Ok(self.etcd.txn(txn).await?.succeeded())
    }

    fn forget_gauges(&self, name: &str) {
        for c in COUNTS {
            let _ = self.metrics.pods.remove_label_values(&[name, c]);
        }
    }

    fn set_gauges(&self, name: &str, s: &PodSetStatus) {
        let values = [
            s.desired_number_scheduled,
            s.current_number_scheduled,
            s.updated_number_scheduled,
            s.number_ready,
            s.number_available,
            s.number_unavailable,
            s.number_misscheduled,
        ];
        for (c, v) in COUNTS.iter().zip(values) {
            self.metrics
                .pods
                .with_label_values(&[name, c])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }

    /// A pod of the set's name that the set did not write is left alone and said once.
    fn report_foreign(&self, name: &str, foreign: &[String], obs: &Observed) {
        let mut seen = self
            .reported_foreign
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for node in foreign {
            let rev = obs.pods.get(node).map_or(0, |p| p.mod_revision);
            if seen.insert((self.keys.pod(node, name), rev)) {
                self.event(
                    EventKind::Warning,
                    "FailedCreate",
                    format!(
                        "pod set {name}: node {node} already has a pod {name} that the set did not write; it is left alone and the node gets none from the set until it is deleted"
                    ),
                );
            }
        }
    }

    fn note(&self, name: &str, note: &Note) {
        let at = |what: String| format!("pod set {name}: {what}");
        match note {
            Note::Created { node, revision } => self.event(
                EventKind::Normal,
                "SuccessfulCreate",
                at(format!(
                    "created its pod on node {node} (revision {revision})"
                )),
            ),
            Note::Updated { node, revision } => self.event(
                EventKind::Normal,
                "SuccessfulCreate",
                at(format!(
                    "replaced its pod on node {node} with revision {revision}"
                )),
            ),
            Note::Deleted { node, why } => self.event(
                EventKind::Normal,
                "SuccessfulDelete",
                at(format!("deleted its pod on node {node}: {why}")),
            ),
            Note::RolloutStarted { revision, nodes } => self.event(
                EventKind::Normal,
                "RolloutStarted",
                at(format!("rolling out revision {revision} to {nodes} nodes")),
            ),
            Note::RolloutProgress {
                revision,
                available,
                desired,
            } => self.event(
                EventKind::Normal,
                "RolloutProgress",
                at(format!(
                    "revision {revision} is available on {available} of {desired} nodes"
                )),
            ),
            Note::RolloutComplete { revision } => {
                self.metrics.rollouts.with_label_values(&["complete"]).inc();
                self.event(
                    EventKind::Normal,
                    "RolloutComplete",
                    at(format!("revision {revision} is available on every node")),
                )
            }
            Note::RolloutFailed {
                revision,
                nodes,
                reason,
            } => {
                self.metrics.rollouts.with_label_values(&["failed"]).inc();
                self.event(
                    EventKind::Warning,
                    "RolloutFailed",
                    at(format!(
                        "revision {revision} did not become available on {} within the progress deadline; the rollout has stopped: {reason}",
                        nodes.join(", ")
                    )),
                )
            }
            Note::RolloutReverted { from, to } => {
                self.metrics.rollouts.with_label_values(&["reverted"]).inc();
                self.event(
                    EventKind::Warning,
                    "RolloutReverted",
                    at(format!(
                        "revision {from} failed: going back to revision {to}, the last one available on every node"
                    )),
                )
            }
            Note::Invalid { message } => self.event(
                EventKind::Warning,
                "InvalidPodSet",
                at(format!("{message}; its pods keep running as they are")),
            ),
        }
    }

    fn event(&self, kind: EventKind, reason: &'static str, message: String) {
        let events = self.events.clone();
        tokio::spawn(async move { events.node_event(kind, reason, message).await });
    }
}

/// The set a changed key under `/hostlet/hosts/` concerns: the pod id is the set's name.
fn set_of_host_key(keys: &KeyLayout, key: &str) -> Option<String> {
    match keys.parse(key)? {
        Key::Pod { pod, .. } | Key::PodStatus { pod, .. } => Some(pod),
        _ => None,
    }
}

fn set_of_podset_key(keys: &KeyLayout, key: &str) -> Option<String> {
    match keys.parse(key)? {
        Key::PodSet { name } | Key::PodSetStatus { name } | Key::PodSetRevision { name, .. } => {
            Some(name)
        }
        _ => None,
    }
}

impl Run for PodSets {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let c = self.caches.clone();
        let (k1, k2) = (self.keys.clone(), self.keys.clone());
        let all = |this: &Arc<Self>| {
            let this = this.clone();
            move |_: &String| this.names()
        };
        let known = self.clone();
        let leadership = {
            use futures::StreamExt;
            let this = self.clone();
            crate::placement::changes_of(c.members.watch_leadership())
                .flat_map(move |()| futures::stream::iter(this.names()))
        };
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .watches(&c.podsets, move |k| set_of_podset_key(&k1, k))
            .watches(&c.hosts, move |k| {
                // Only pods and statuses named after a set this controller knows of.
                set_of_host_key(&k2, k).filter(|n| {
                    known.caches.podsets.contains(&known.keys.podset(n))
                        || known.caches.podsets.contains(&known.keys.podset_status(n))
                })
            })
            .watches(&c.nodes, all(&self))
            .watches(&c.node_labels, all(&self))
            .triggers(leadership)
            .run(
                |name: String, this: Arc<Self>| async move { this.reconcile(&name).await },
                |_, _, _| ErrorAction::Requeue(STEP_AGAIN * 2),
                shutdown,
            )
            .await;
    }
}
