//! Voter placement: the leader keeps the number of etcd voters at the cluster policy's target
//! (`/hostlet/config/cluster`). It grows from ready workers (asking one through its member request key),
//! replaces a voter whose host is gone (the replacement joins as a learner and catches up before the dead
//! member is removed), and shrinks newest-first (the leaving host is removed from the cluster, and its
//! agent rejoins as a worker through the tombstone path, its member dir backed up).
//!
//! The decision is [`plan::decide`], a pure function; this module observes (the shared caches: members,
//! statuses, leadership, node records, heartbeats, the policy, the request record) and acts through
//! [`VoterChanges`] ([`fake`] holds the controller's tests on a fake). Every removal waits for a fresh look
//! at the membership and is decided again on it.
//! [`worker`] is the other side: a worker's agent that sees its request stops and starts again as a
//! joiner.

pub mod effects;
#[cfg(test)]
mod fake;
pub mod plan;
pub mod worker;

pub use effects::{EtcdVoterChanges, VoterChanges};

pub use crate::members::Handoff;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{ClusterPolicy, MemberRequest, NodeInfo, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{
    Action, Controller, ErrorAction, Etcd, EtcdError, Members, Metrics, Run, Store,
};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventKind, EventRecorder};
use crate::learners::PromoteGate;
use plan::{MemberObs, NodeObs, Observed, Removal, RequestObs, Step};

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "placement";
/// Roles counted by `hostlet_nodes{role}`.
pub const NODE_ROLES: [&str; 3] = ["voter", "learner", "worker"];
/// Results counted by `hostlet_voter_replacements_total{result}`.
pub const REPLACEMENT_RESULTS: [&str; 2] = ["success", "failure"];
/// How soon a leader looks again while a change is under way.
const STEP_AGAIN: Duration = Duration::from_secs(1);
/// How long a fresh look at the membership may take before a removal is put off.
const FRESH_LOOK: Duration = Duration::from_secs(5);

/// The metrics of voter placement.
#[derive(Clone)]
pub struct PlacementMetrics {
    pub voters_target: IntGauge,
    pub nodes: IntGaugeVec,
    pub replacements: IntCounterVec,
}

impl PlacementMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let m = PlacementMetrics {
            voters_target: IntGauge::new(
                "hostlet_cluster_voters_target",
                "The etcd voter count the cluster policy asks for.",
            )?,
            nodes: IntGaugeVec::new(
                Opts::new(
                    "hostlet_nodes",
                    "Registered nodes by role: voter, learner, or worker (no etcd member).",
                ),
                &["role"],
            )?,
            replacements: IntCounterVec::new(
                Opts::new(
                    "hostlet_voter_replacements_total",
                    "Dead voters removed once their replacement caught up (success), or whose removal failed.",
                ),
                &["result"],
            )?,
        };
        registry.register(Box::new(m.voters_target.clone()))?;
        registry.register(Box::new(m.nodes.clone()))?;
        registry.register(Box::new(m.replacements.clone()))?;
        m.voters_target
            .set(i64::from(hostlet_api::objects::DEFAULT_VOTERS));
        for r in NODE_ROLES {
            m.nodes.with_label_values(&[r]).set(0);
        }
        for r in REPLACEMENT_RESULTS {
            m.replacements.with_label_values(&[r]).inc_by(0);
        }
        Ok(m)
    }
}

/// The caches placement reads (all shared, built in [`crate::caches::Caches`]).
#[derive(Clone)]
pub struct PlacementCaches {
    pub members: Members,
    pub nodes: Store<String, Object<NodeInfo>>,
    pub leases: Store<String, Object<String>>,
    pub policy: Store<String, Object<ClusterPolicy>>,
    pub request: Store<String, Object<MemberRequest>>,
    /// Voters of deleted nodes that member removal left to placement.
    pub handoff: Handoff,
}

/// The voter target in force: the policy key's, the default without one, `None` when the key does not
/// parse (then nothing moves: a typo never shrinks the cluster).
pub fn target_of(policy: &Store<String, Object<ClusterPolicy>>) -> Option<u8> {
    match policy.state().first() {
        None => Some(hostlet_api::objects::DEFAULT_VOTERS),
        Some(o) => o.valid().map(|p| p.voters_target()),
    }
}

/// The learner manager's gate: promote while the voters are fewer than the target, or when the learner's
/// node is pinned as a voter.
pub fn promote_gate(
    policy: Store<String, Object<ClusterPolicy>>,
    nodes: Store<String, Object<NodeInfo>>,
) -> PromoteGate {
    Arc::new(move |view, learner| {
        let Some(target) = target_of(&policy) else {
            return false;
        };
        if view.voters().count() < usize::from(target) {
            return true;
        }
        nodes.state().iter().filter_map(|o| o.valid()).any(|n| {
            n.member_id.as_deref() == Some(&format!("{:x}", learner.id))
                && n.role == Some(hostlet_api::objects::NodeRole::Voter)
        })
    })
}

/// Which of placement's keys a value that does not parse was found under.
#[derive(Debug, Clone, Copy)]
enum Unparsable {
    Policy,
    NodeRecord,
    MemberRequest,
}

/// The values of `store` that do not parse: key, revision, which key it is, and the message.
fn invalid_in<T>(
    store: &Store<String, Object<T>>,
    what: Unparsable,
    meanwhile: &str,
) -> Vec<(String, i64, Unparsable, String)> {
    store
        .state()
        .iter()
        .filter_map(|o| {
            let e = o.invalid()?;
            Some((
                o.key.clone(),
                o.mod_revision,
                what,
                format!("{}: {}; {meanwhile}", o.key, e.message()),
            ))
        })
        .collect()
}

/// A unit for every change of a watched value.
pub(crate) fn changes_of<T: Send + Sync + 'static>(
    rx: tokio::sync::watch::Receiver<T>,
) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// Voter placement on one agent; it acts only where the local member leads.
pub struct Placement<E = EtcdVoterChanges> {
    effects: E,
    keys: KeyLayout,
    node: String,
    caches: PlacementCaches,
    metrics: PlacementMetrics,
    registry: Metrics,
    replace_after: Duration,
    /// Since when each node's heartbeat has been missing, as this agent saw it (a new leader starts its
    /// clocks afresh: replacing later, never sooner).
    gone_since: Mutex<HashMap<String, Instant>>,
    /// The last reason logged, so a steady state logs once.
    last_said: Mutex<String>,
    /// Values that do not parse, reported once each (key and revision).
    reported_invalid: Mutex<HashSet<(String, i64)>>,
}

impl Placement {
    pub fn new(
        etcd: Etcd,
        keys: KeyLayout,
        node: &str,
        caches: PlacementCaches,
        events: EventRecorder,
        replace_after: Duration,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        let effects = EtcdVoterChanges {
            etcd,
            keys: keys.clone(),
            events,
        };
        Placement::with_effects(effects, keys, node, caches, replace_after, metrics)
    }
}

impl<E: VoterChanges> Placement<E> {
    pub fn with_effects(
        effects: E,
        keys: KeyLayout,
        node: &str,
        caches: PlacementCaches,
        replace_after: Duration,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        Ok(Placement {
            effects,
            keys,
            node: node.to_string(),
            caches,
            metrics: PlacementMetrics::register(metrics.registry())?,
            registry: metrics.clone(),
            replace_after,
            gone_since: Mutex::new(HashMap::new()),
            last_said: Mutex::new(String::new()),
            reported_invalid: Mutex::new(HashSet::new()),
        })
    }

    fn say(&self, what: &str) {
        let mut last = self.last_said.lock().unwrap_or_else(|p| p.into_inner());
        if *last != what {
            tracing::info!("voter placement: {what}");
            *last = what.to_string();
        }
    }

    /// One look: gauges everywhere, a step where the local member leads.
    pub async fn reconcile(&self) -> Result<Action, EtcdError> {
        let target = target_of(&self.caches.policy);
        if let Some(t) = target {
            self.metrics.voters_target.set(i64::from(t));
        }
        let (obs, next_deadline) = self.observe(target.unwrap_or(0) as usize);
        self.set_node_gauges(&obs);
        if !self.caches.members.leadership().local_leads() {
            return Ok(Action::AwaitChange);
        }
        self.report_invalid();
        let Some(_) = target else {
            self.say(&format!(
                "{} does not parse: no voter changes until it does",
                self.keys.cluster_policy()
            ));
            return Ok(Action::AwaitChange);
        };
        let step = plan::decide(&obs);
        match step {
            Step::Idle(why) => {
                self.say(&why);
                Ok(match next_deadline {
                    Some(d) => Action::Requeue(d),
                    None => Action::AwaitChange,
                })
            }
            Step::Wait(why) => {
                self.say(&why);
                Ok(Action::Requeue(STEP_AGAIN))
            }
            Step::RequestJoin { node, reason } => {
                self.request_join(&node, &reason).await?;
                Ok(Action::Requeue(STEP_AGAIN))
            }
            Step::CancelRequest { node, reason } => {
                self.say(&format!("member request of {node} withdrawn: {reason}"));
                self.cancel_request(&node).await?;
                Ok(Action::Requeue(STEP_AGAIN))
            }
            Step::MoveLeader { from, to } => {
                self.say(&format!(
                    "moving leadership from {from:x} to {to:x} before it leaves"
                ));
                self.effects.move_leader(to).await?;
                Ok(Action::Requeue(STEP_AGAIN))
            }
            Step::Remove { id, name, why } => {
                self.remove(target.unwrap_or(0) as usize, id, &name, why)
                    .await?;
                Ok(Action::Requeue(STEP_AGAIN))
            }
        }
    }

    /// The observation `decide` reads, and how soon a heartbeat deadline falls due.
    fn observe(&self, target: usize) -> (Observed, Option<Duration>) {
        let members = self.caches.members.list();
        let statuses = self.caches.members.statuses();
        let leadership = self.caches.members.leadership();
        let records: Vec<NodeInfo> = self
            .caches
            .nodes
            .state()
            .iter()
            .filter_map(|o| o.valid().cloned())
            .collect();
        let now = Instant::now();
        let mut gone = self.gone_since.lock().unwrap_or_else(|p| p.into_inner());
        let mut next: Option<Duration> = None;
        let mut nodes = std::collections::BTreeMap::new();
        for r in &records {
            let alive = self.caches.leases.contains(&self.keys.lease(&r.name));
            let gone_for = if alive {
                gone.remove(&r.name);
                Duration::ZERO
            } else {
                let since = *gone.entry(r.name.clone()).or_insert(now);
                let d = now.saturating_duration_since(since);
                if d < self.replace_after {
                    let left = self.replace_after - d;
                    next = Some(next.map_or(left, |n| n.min(left)));
                }
                d
            };
            nodes.insert(
                r.name.clone(),
                NodeObs {
                    name: r.name.clone(),
                    pin: r.role,
                    failure_domain: r.failure_domain.clone(),
                    member_since: r.member_since.map(|t| t.0),
                    started: r.started.0,
                    alive,
                    gone_for,
                },
            );
        }
        gone.retain(|n, _| nodes.contains_key(n));
        let leader_index = statuses.get(leadership.leader_id).map(|s| s.raft_index);
        let members = members
            .iter()
            .map(|m| {
                let status = statuses.get(m.id);
                let node = records
                    .iter()
                    .find(|r| {
                        r.member_id.as_deref() == Some(&format!("{:x}", m.id))
                            || (!m.name.is_empty() && r.member_name.as_deref() == Some(&m.name))
                    })
                    .map(|r| r.name.clone());
                MemberObs {
                    id: m.id,
                    name: if m.name.is_empty() {
                        format!("{:x}", m.id)
                    } else {
                        m.name.clone()
                    },
                    is_learner: m.is_learner,
                    retiring: !m.is_learner && self.caches.handoff.retiring().contains(&m.id),
                    answering: status.is_some(),
                    // etcd promotes a learner whose log is within a tenth of the leader's.
                    caught_up: match (status, leader_index) {
                        (Some(s), Some(li)) => {
                            s.raft_applied_index > 0 && s.raft_applied_index * 10 >= li * 9
                        }
                        _ => false,
                    },
                    node,
                }
            })
            .collect();
        let requests = self
            .caches
            .request
            .state()
            .iter()
            .filter_map(|o| o.valid().cloned())
            .map(|r| RequestObs {
                age: SystemTime::now()
                    .duration_since(r.requested.0)
                    .unwrap_or_default(),
                node: r.node,
            })
            .collect();
        (
            Observed {
                target,
                replace_after: self.replace_after,
                members,
                nodes,
                requests,
                leader: leadership.leader_id,
            },
            next,
        )
    }

    fn set_node_gauges(&self, obs: &Observed) {
        let mut counts = [0i64; 3];
        for n in obs.nodes.keys() {
            let role = match obs
                .members
                .iter()
                .find(|m| m.node.as_deref() == Some(n.as_str()))
            {
                Some(m) if m.is_learner => 1,
                Some(_) => 0,
                None => 2,
            };
            counts[role] += 1;
        }
        for (i, r) in NODE_ROLES.iter().enumerate() {
            self.metrics.nodes.with_label_values(&[r]).set(counts[i]);
        }
    }

    /// Writes the request to the worker's key and the leader's record, both or neither, and only while
    /// no other request is pending.
    async fn request_join(&self, node: &str, reason: &str) -> Result<(), EtcdError> {
        let server = self
            .caches
            .nodes
            .get(&self.keys.node(&self.node))
            .and_then(|o| o.valid().and_then(|n| n.api_url.clone()));
        let Some(server) = server else {
            self.say("this node's record has no API URL yet: cannot ask a worker to join");
            return Ok(());
        };
        let req = MemberRequest {
            node: node.to_string(),
            action: hostlet_api::objects::MemberAction::Join,
            server,
            reason: reason.to_string(),
            requested: Timestamp::now(),
        };
        if self.effects.request_join(&req).await? {
            self.say(&format!(
                "asked worker {node} to join as an etcd member: {reason}"
            ));
            self.event(
                EventKind::Normal,
                "VoterRequested",
                format!(
                    "asked worker {node} to start an etcd member and join as a learner: {reason}"
                ),
            );
        }
        Ok(())
    }

    async fn cancel_request(&self, node: &str) -> Result<(), EtcdError> {
        self.effects.cancel_request(node).await
    }

    /// Removes a member, but only if a fresh look at the membership decides the same.
    async fn remove(
        &self,
        target: usize,
        id: u64,
        name: &str,
        why: Removal,
    ) -> Result<(), EtcdError> {
        if !self.caches.members.refresh(FRESH_LOOK).await {
            self.say("no fresh look at the membership: removal put off");
            return Ok(());
        }
        let (obs, _) = self.observe(target);
        let again = plan::decide(&obs);
        if again
            != (Step::Remove {
                id,
                name: name.to_string(),
                why,
            })
        {
            self.say(&format!("a fresh look decided otherwise: {again:?}"));
            return Ok(());
        }
        if !self.caches.members.leadership().local_leads() {
            return Ok(());
        }
        let result = self.effects.remove_member(id).await;
        // One literal reason per recording call, so the reference check sees every reason.
        let message = match why {
            Removal::Replaced => format!(
                "removed dead voter {name} ({id:x}): its replacement has caught up and is promoted next"
            ),
            Removal::Shrink => format!(
                "removed voter {name} ({id:x}): more voters than the target of {target}; its host goes on as a worker"
            ),
            Removal::NotNeeded => format!(
                "removed learner {name} ({id:x}): the target of {target} voters is met; its host goes on as a worker"
            ),
            Removal::Deleted => format!(
                "removed voter {name} ({id:x}): its node record was deleted and no worker can replace it"
            ),
        };
        match result {
            Ok(_) => {
                if why == Removal::Replaced {
                    self.metrics
                        .replacements
                        .with_label_values(&["success"])
                        .inc();
                }
                self.say(&message);
                match why {
                    Removal::Replaced => self.event(EventKind::Normal, "VoterReplaced", message),
                    Removal::Shrink | Removal::Deleted => {
                        self.event(EventKind::Normal, "VoterRemoved", message)
                    }
                    Removal::NotNeeded => self.event(EventKind::Normal, "LearnerRemoved", message),
                }
                self.caches.members.hurry();
                Ok(())
            }
            Err(e) => {
                if why == Removal::Replaced {
                    self.metrics
                        .replacements
                        .with_label_values(&["failure"])
                        .inc();
                }
                self.event(
                    EventKind::Warning,
                    "MemberRemoveFailed",
                    format!("cannot remove {name} ({id:x}): {e}"),
                );
                Err(e)
            }
        }
    }

    /// The leader says once, in an event with the parser's words (and so its line and column), which
    /// value of the keys placement reads does not parse and what is done meanwhile; the other agents
    /// stay quiet, so one bad value is one event, not one per host.
    fn report_invalid(&self) {
        let mut found = invalid_in(
            &self.caches.policy,
            Unparsable::Policy,
            "no voter changes until it parses",
        );
        found.extend(invalid_in(
            &self.caches.nodes,
            Unparsable::NodeRecord,
            "the node is left out of voter placement until its record parses",
        ));
        found.extend(invalid_in(
            &self.caches.request,
            Unparsable::MemberRequest,
            "no member request is made or withdrawn until it parses",
        ));
        let mut seen = self
            .reported_invalid
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now: HashSet<(String, i64)> = found
            .iter()
            .map(|(k, rev, _, _)| (k.clone(), *rev))
            .collect();
        seen.retain(|k| now.contains(k));
        for (key, rev, what, message) in found {
            if !seen.insert((key, rev)) {
                continue;
            }
            match what {
                Unparsable::Policy => {
                    self.event(EventKind::Warning, "InvalidClusterPolicy", message)
                }
                Unparsable::NodeRecord => {
                    self.event(EventKind::Warning, "InvalidNodeRecord", message)
                }
                Unparsable::MemberRequest => {
                    self.event(EventKind::Warning, "InvalidMemberRequest", message)
                }
            }
        }
    }

    fn event(&self, kind: EventKind, reason: &'static str, message: String) {
        self.effects.event(kind, reason, message);
    }
}

impl<E: VoterChanges> Run for Placement<E> {
    /// Runs until `shutdown` fires.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let c = self.caches.clone();
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .watches(c.members.store(), |_| [()])
            .watches(&c.nodes, |_| [()])
            .watches(&c.leases, |_| [()])
            .watches(&c.policy, |_| [()])
            .watches(&c.request, |_| [()])
            .watches(c.handoff.retiring(), |_| [()])
            .triggers(changes_of(c.members.watch_leadership()))
            .triggers(changes_of(c.members.watch_statuses()))
            .run(
                |(), this: Arc<Self>| async move { this.reconcile().await },
                |_, _, _| ErrorAction::Requeue(STEP_AGAIN * 2),
                shutdown,
            )
            .await;
    }
}
