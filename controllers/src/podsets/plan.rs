//! What the pod set controller does next for one set: a pure function of what the caches hold, so that
//! every rule of a rollout is tested without etcd ([`decide`]).
//!
//! The rules, as Kubernetes' DaemonSet controller has them where hostlet has the same thing:
//! - every matching node that is not cordoned has the set's pod; a node that stops matching loses it;
//! - a template change replaces old pods that are unavailable anyway first, then available ones while
//!   fewer than `maxUnavailable` matching nodes are without an available pod;
//! - a revision whose pods do not become available within `progressDeadlineSeconds` stops the rollout
//!   (and, with auto-revert, sends the set back to the last revision that was fully available).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{PodPhase, Timestamp};
use hostlet_api::podset::{Condition, Failure, PodSet, PodSetStatus, Revision, Rollout, Strategy};

/// At most this many pod writes in one step: one etcd transaction holds them all (etcd allows 128
/// operations), and the next step carries on.
pub const MAX_OPS: usize = 60;
/// etcd's default limit of operations (and of compares) in one transaction, less one for the status.
const MAX_COMPARES: usize = 127;

/// A node as the set sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// Its own labels with an admin's on top.
    pub labels: BTreeMap<String, String>,
    pub unschedulable: bool,
    /// The mod revision of the admin's record of the node (labels, cordon) the view was made from; 0 when
    /// there is none. A new pod is written only while it is still that: a cordon the caches have not
    /// shown yet fails the write.
    pub admin_revision: i64,
}

/// The pod key named after the set on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The set named in its annotations; `None` for a pod the controller did not write.
    pub owner: Option<String>,
    pub hash: Option<String>,
    pub mod_revision: i64,
}

/// The status a node wrote for that pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusView {
    pub ready: bool,
    pub hash: Option<String>,
    /// When the status was last written: it has been ready at least since then.
    pub updated: SystemTime,
    pub phase: PodPhase,
    pub message: String,
    /// The status key's mod revision: a step that replaces a pod is written only while every status it
    /// decided on is still the same, so that the bound holds against what etcd holds, not what was cached.
    pub mod_revision: i64,
}

/// The set's key.
#[derive(Debug, Clone)]
pub enum SetState {
    Valid {
        set: Box<PodSet>,
        generation: i64,
    },
    /// It does not parse or does not validate: nothing moves.
    Invalid {
        message: String,
        generation: i64,
    },
    Deleted,
}

/// Everything `decide` reads about one set.
#[derive(Debug, Clone)]
pub struct Observed {
    pub name: String,
    pub set: SetState,
    pub revisions: Vec<Revision>,
    pub status: Option<PodSetStatus>,
    pub nodes: Vec<NodeView>,
    /// The pod key `<node>/pods/<set name>`, by node.
    pub pods: BTreeMap<String, PodView>,
    /// Its status key, by node.
    pub statuses: BTreeMap<String, StatusView>,
    pub now: SystemTime,
}

/// One write of a node's pod key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOp {
    /// The key is absent.
    Create {
        node: String,
    },
    /// The set's own pod of another revision, at this mod revision.
    Replace {
        node: String,
        mod_revision: i64,
    },
    Delete {
        node: String,
        mod_revision: i64,
    },
}

/// What the controller says about a step (each becomes an event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Created {
        node: String,
        revision: u64,
    },
    Updated {
        node: String,
        revision: u64,
    },
    Deleted {
        node: String,
        why: &'static str,
    },
    RolloutStarted {
        revision: u64,
        nodes: usize,
    },
    RolloutProgress {
        revision: u64,
        available: u64,
        desired: u64,
    },
    RolloutComplete {
        revision: u64,
    },
    RolloutFailed {
        revision: u64,
        nodes: Vec<String>,
        reason: String,
    },
    RolloutReverted {
        from: u64,
        to: u64,
    },
    Invalid {
        message: String,
    },
}

/// The step.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub ops: Vec<PodOp>,
    /// The revision the pods are written from (absent while the set is invalid or deleted).
    pub update: Option<Revision>,
    /// A revision key to write (new, or an old template under a new number).
    pub put_revision: Option<Revision>,
    pub drop_revisions: Vec<u64>,
    /// Write the set back with this revision's template (an auto-revert).
    pub revert_to: Option<Revision>,
    /// The status to write, when it differs from the one held.
    pub status: Option<PodSetStatus>,
    /// The set is gone and so are its pods: remove its status and revisions.
    pub forget: bool,
    pub notes: Vec<Note>,
    /// Nodes whose pod of the set's name was not written by the set.
    pub foreign: Vec<String>,
    /// Look again after this long even if nothing changes (minReadySeconds, the deadline).
    pub again: Option<Duration>,
}

impl Plan {
    /// Whether the step writes anything.
    pub fn writes(&self) -> bool {
        !self.ops.is_empty()
            || self.put_revision.is_some()
            || !self.drop_revisions.is_empty()
            || self.revert_to.is_some()
            || self.status.is_some()
            || self.forget
    }
}

fn since(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or_default()
}

/// Where one matching node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Absent,
    Foreign,
    Old { ready: bool, available: bool },
    Updated { ready: bool, available: bool },
}

/// Decides the next step for one set.
pub fn decide(obs: &Observed) -> Plan {
    match &obs.set {
        SetState::Deleted => deleted(obs),
        SetState::Invalid {
            message,
            generation,
        } => invalid(obs, message, *generation),
        SetState::Valid { set, generation } => valid(obs, set, *generation),
    }
}

/// A deleted set's pods go, then its status and revisions.
fn deleted(obs: &Observed) -> Plan {
    let mut plan = Plan::default();
    for (node, pod) in &obs.pods {
        if pod.owner.as_deref() == Some(obs.name.as_str()) && plan.ops.len() < MAX_OPS {
            plan.ops.push(PodOp::Delete {
                node: node.clone(),
                mod_revision: pod.mod_revision,
            });
            plan.notes.push(Note::Deleted {
                node: node.clone(),
                why: "its pod set was deleted",
            });
        }
    }
    if plan.ops.is_empty() && (obs.status.is_some() || !obs.revisions.is_empty()) {
        plan.forget = true;
    }
    plan
}

/// A set that does not read: its pods stay as they are, and the status says why.
fn invalid(obs: &Observed, message: &str, generation: i64) -> Plan {
    let mut plan = Plan::default();
    let old = obs.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = generation;
    set_condition(
        &mut status,
        &old,
        "RolloutFailed",
        "True",
        "InvalidPodSet",
        message,
        obs.now,
    );
    if status != old {
        let was = old
            .condition("RolloutFailed")
            .is_some_and(|c| c.reason == "InvalidPodSet" && c.message == message);
        if !was {
            plan.notes.push(Note::Invalid {
                message: message.to_string(),
            });
        }
        plan.status = Some(status);
    }
    plan
}

/// The revision the set's template is: an existing one, or a new number (an old template applied again
/// gets a new number, as `kubectl rollout undo` does).
fn update_revision(obs: &Observed, set: &PodSet, plan: &mut Plan) -> Revision {
    let hash = set.hash();
    let max = obs.revisions.iter().map(|r| r.revision).max().unwrap_or(0);
    match obs.revisions.iter().find(|r| r.hash == hash) {
        Some(r) if r.revision == max => r.clone(),
        found => {
            let r = Revision {
                revision: max + 1,
                hash,
                template: set.template_value.clone(),
                created: Timestamp(obs.now),
            };
            if let Some(old) = found {
                plan.drop_revisions.push(old.revision);
            }
            plan.put_revision = Some(r.clone());
            r
        }
    }
}

/// Where the matching nodes stand, counted.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    desired: u64,
    scheduled: u64,
    updated: u64,
    ready: u64,
    available: u64,
    updated_available: u64,
}

impl Counts {
    fn of(slots: &BTreeMap<&str, Slot>) -> Counts {
        let mut c = Counts::default();
        for s in slots.values() {
            let (updated, ready, available) = match *s {
                Slot::Foreign => continue,
                Slot::Absent => (false, false, false),
                Slot::Old { ready, available } => (false, ready, available),
                Slot::Updated { ready, available } => (true, ready, available),
            };
            c.desired += 1;
            c.scheduled += u64::from(*s != Slot::Absent);
            c.updated += u64::from(updated);
            c.ready += u64::from(ready);
            c.available += u64::from(available);
            c.updated_available += u64::from(updated && available);
        }
        c
    }

    fn complete(&self) -> bool {
        self.updated_available == self.desired
    }
}

/// One step's work on a valid set: what it reads, and the plan and status it makes.
struct Work<'a> {
    obs: &'a Observed,
    set: &'a PodSet,
    update: Revision,
    old: PodSetStatus,
    status: PodSetStatus,
    plan: Plan,
}

impl<'a> Work<'a> {
    fn soon(&mut self, d: Duration) {
        self.plan.again = Some(self.plan.again.map_or(d, |a| a.min(d)));
    }

    /// Where each matching node stands, and how many cordoned nodes keep their pod.
    fn slots(&mut self) -> (BTreeMap<&'a str, Slot>, u64) {
        let (obs, set) = (self.obs, self.set);
        let min_ready = Duration::from_secs(u64::from(set.min_ready_seconds));
        let mut slots: BTreeMap<&str, Slot> = BTreeMap::new();
        let mut kept = 0u64;
        for n in &obs.nodes {
            let matches = set.selects(&n.labels);
            let pod = obs.pods.get(&n.name);
            let owned = pod.is_some_and(|p| p.owner.as_deref() == Some(obs.name.as_str()));
            if matches && n.unschedulable && owned {
                // Cordoned: its pod stays until a drain removes it, and no new one goes there.
                kept += 1;
                continue;
            }
            if !matches || n.unschedulable {
                continue;
            }
            let slot = match pod {
                None => Slot::Absent,
                Some(_) if !owned => Slot::Foreign,
                Some(p) => {
                    let st = obs
                        .statuses
                        .get(&n.name)
                        .filter(|s| s.hash.is_some() && s.hash == p.hash);
                    let ready = st.is_some_and(|s| s.ready && s.phase == PodPhase::Running);
                    let ready_for = st.map(|s| since(obs.now, s.updated)).unwrap_or_default();
                    let available = ready && ready_for >= min_ready;
                    if ready && !available {
                        self.soon(min_ready - ready_for);
                    }
                    if p.hash.as_deref() == Some(self.update.hash.as_str()) {
                        Slot::Updated { ready, available }
                    } else {
                        Slot::Old { ready, available }
                    }
                }
            };
            slots.insert(n.name.as_str(), slot);
        }
        self.plan.foreign = slots
            .iter()
            .filter(|(_, s)| **s == Slot::Foreign)
            .map(|(n, _)| n.to_string())
            .collect();
        (slots, kept)
    }

    /// Pods on nodes that no longer match (or whose node record is gone) go; how many there are.
    fn remove_misscheduled(&mut self, slots: &BTreeMap<&str, Slot>) -> u64 {
        let (obs, set) = (self.obs, self.set);
        let mut misscheduled = 0u64;
        for (node, pod) in &obs.pods {
            if pod.owner.as_deref() != Some(obs.name.as_str()) || slots.contains_key(node.as_str())
            {
                continue;
            }
            let cordoned_match = obs
                .nodes
                .iter()
                .any(|n| &n.name == node && n.unschedulable && set.selects(&n.labels));
            if cordoned_match {
                continue;
            }
            misscheduled += 1;
            if self.plan.ops.len() < MAX_OPS {
                self.plan.ops.push(PodOp::Delete {
                    node: node.clone(),
                    mod_revision: pod.mod_revision,
                });
                self.plan.notes.push(Note::Deleted {
                    node: node.clone(),
                    why: "its node no longer matches the set's node selector",
                });
            }
        }
        misscheduled
    }

    /// The rollout's record carried on, or a new one for a new template.
    fn rollout(&mut self, c: &Counts) -> Rollout {
        let (now, revision) = (self.obs.now, self.update.revision);
        let mut rollout = match self.old.rollout.clone() {
            Some(r) if r.hash == self.update.hash => {
                let mut r = Rollout { revision, ..r };
                if c.updated_available > r.available {
                    r.progressed = Timestamp(now);
                    if !c.complete() {
                        self.plan.notes.push(Note::RolloutProgress {
                            revision,
                            available: c.updated_available,
                            desired: c.desired,
                        });
                    }
                }
                r.available = c.updated_available;
                r
            }
            _ => {
                self.plan.notes.push(Note::RolloutStarted {
                    revision,
                    nodes: c.desired as usize,
                });
                if self.status.reverted_to.as_deref() != Some(self.update.hash.as_str()) {
                    self.status.reverted_to = None;
                    self.status.last_failure = None;
                }
                Rollout {
                    revision,
                    hash: self.update.hash.clone(),
                    started: Timestamp(now),
                    progressed: Timestamp(now),
                    available: c.updated_available,
                    failed: None,
                    complete: false,
                }
            }
        };
        let was_paused = self
            .old
            .condition("Paused")
            .is_some_and(|c| c.status == "True");
        if was_paused && !self.set.paused {
            // The deadline counts from the resume, not from before the pause.
            rollout.progressed = Timestamp(now);
        }
        if c.complete() && !rollout.complete {
            rollout.complete = true;
            rollout.failed = None;
            self.status.last_good = Some(revision);
            self.plan.notes.push(Note::RolloutComplete { revision });
        } else if !c.complete() && rollout.complete {
            // A node joined or a pod fell over: the revision is still the good one, the rollout is on again.
            rollout.complete = false;
        }
        rollout
    }

    /// Stops the rollout once its deadline has passed with nodes whose new pod is not available.
    fn deadline(&mut self, slots: &BTreeMap<&str, Slot>, c: &Counts, rollout: &mut Rollout) {
        if rollout.complete || rollout.failed.is_some() || self.set.paused {
            return;
        }
        let deadline = Duration::from_secs(u64::from(self.set.progress_deadline_seconds));
        let stuck: Vec<String> = slots
            .iter()
            .filter(|(_, s)| {
                matches!(
                    s,
                    Slot::Updated {
                        available: false,
                        ..
                    }
                )
            })
            .map(|(n, _)| n.to_string())
            .collect();
        let waited = since(self.obs.now, rollout.progressed.0);
        if stuck.is_empty() || waited < deadline {
            if !stuck.is_empty() || c.updated < c.desired {
                self.soon(deadline.saturating_sub(waited).max(Duration::from_secs(1)));
            }
            return;
        }
        let hash = self.update.hash.as_str();
        let reason = stuck
            .iter()
            .filter_map(|n| {
                let s = self.obs.statuses.get(n)?;
                (s.hash.as_deref() == Some(hash)).then(|| {
                    if s.message.is_empty() {
                        format!("{n}: {:?}, not ready", s.phase)
                    } else {
                        format!("{n}: {:?}, {}", s.phase, s.message)
                    }
                })
            })
            .collect::<Vec<_>>()
            .join("; ");
        let reason = if reason.is_empty() {
            "no status from the node for the new revision".to_string()
        } else {
            reason
        };
        rollout.failed = Some(Failure {
            revision: self.update.revision,
            at: Timestamp(self.obs.now),
            nodes: stuck.clone(),
            reason: reason.clone(),
        });
        self.status.last_failure = rollout.failed.clone();
        self.plan.notes.push(Note::RolloutFailed {
            revision: self.update.revision,
            nodes: stuck,
            reason,
        });
    }

    /// With auto-revert, a failed rollout's set goes back to the last revision available everywhere.
    fn revert(&mut self, rollout: &Rollout) {
        if rollout.failed.is_none() || !self.set.auto_revert || self.plan.put_revision.is_some() {
            return;
        }
        let good = self
            .status
            .last_good
            .filter(|g| *g != self.update.revision)
            .and_then(|g| self.obs.revisions.iter().find(|r| r.revision == g));
        if let Some(good) = good {
            self.plan.revert_to = Some(good.clone());
            self.status.reverted_to = Some(good.hash.clone());
            self.plan.notes.push(Note::RolloutReverted {
                from: self.update.revision,
                to: good.revision,
            });
        }
    }

    /// New pods, then replacements within the bound.
    fn write_pods(&mut self, slots: &BTreeMap<&str, Slot>, c: &Counts, rollout: &Rollout) {
        let (obs, revision) = (self.obs, self.update.revision);
        for (node, slot) in slots {
            if *slot == Slot::Absent && self.plan.ops.len() < MAX_OPS {
                let node = node.to_string();
                self.plan.ops.push(PodOp::Create { node: node.clone() });
                self.plan.notes.push(Note::Created { node, revision });
            }
        }
        let Strategy::RollingUpdate { max_unavailable } = self.set.strategy else {
            return;
        };
        if self.set.paused || rollout.failed.is_some() {
            return;
        }
        let limit = max_unavailable.of(c.desired as usize, true);
        let unavailable = c.desired.saturating_sub(c.available) as usize;
        let mut budget = limit.saturating_sub(unavailable);
        let olds = |want_available: bool| {
            slots.iter().filter_map(move |(n, s)| match s {
                Slot::Old { available, .. } if *available == want_available => Some(*n),
                _ => None,
            })
        };
        // Each status is compared too when a pod is replaced, each write of a pod twice at most.
        let cap = (MAX_COMPARES.saturating_sub(obs.statuses.len()) / 2).clamp(1, MAX_OPS);
        let mut replace: Vec<&str> = olds(false).collect();
        for n in olds(true) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            replace.push(n);
        }
        for node in replace {
            if self.plan.ops.len() >= cap {
                break;
            }
            let mod_revision = obs.pods.get(node).map_or(0, |p| p.mod_revision);
            let node = node.to_string();
            self.plan.ops.push(PodOp::Replace {
                node: node.clone(),
                mod_revision,
            });
            self.plan.notes.push(Note::Updated { node, revision });
        }
    }
}

fn valid(obs: &Observed, set: &PodSet, generation: i64) -> Plan {
    let mut plan = Plan::default();
    let old = obs.status.clone().unwrap_or_default();
    let update = update_revision(obs, set, &mut plan);
    let mut w = Work {
        obs,
        set,
        update,
        status: old.clone(),
        old,
        plan,
    };
    let (slots, kept) = w.slots();
    let misscheduled = w.remove_misscheduled(&slots);
    let c = Counts::of(&slots);
    let mut rollout = w.rollout(&c);
    w.deadline(&slots, &c, &mut rollout);
    w.revert(&rollout);
    w.write_pods(&slots, &c, &rollout);

    let Work {
        update,
        old,
        mut status,
        mut plan,
        ..
    } = w;
    status.desired_number_scheduled = c.desired;
    status.current_number_scheduled = c.scheduled + kept;
    status.updated_number_scheduled = c.updated;
    status.number_ready = c.ready;
    status.number_available = c.available;
    status.number_unavailable = c.desired.saturating_sub(c.available);
    status.number_misscheduled = misscheduled;
    status.observed_generation = generation;
    status.update_revision = update.revision;
    status.current_revision = if rollout.complete {
        update.revision
    } else {
        status.last_good.unwrap_or(update.revision)
    };
    conditions(&mut status, &old, set, &rollout, obs.now);
    status.rollout = Some(rollout);
    if !plan.ops.is_empty() || plan.revert_to.is_some() || plan.put_revision.is_some() {
        status.steps += 1;
    }
    plan.drop_revisions
        .extend(prune(obs, set, &update, &status));
    if status != old {
        plan.status = Some(status);
    }
    plan.update = Some(update);
    plan
}

/// Old revisions beyond `revisionHistoryLimit`, oldest first; never the update revision, the last good
/// one, or one a node still runs.
fn prune(obs: &Observed, set: &PodSet, update: &Revision, status: &PodSetStatus) -> Vec<u64> {
    let in_use: Vec<&str> = obs
        .pods
        .values()
        .filter_map(|p| p.hash.as_deref())
        .collect();
    let mut old: Vec<&Revision> = obs
        .revisions
        .iter()
        .filter(|r| r.revision != update.revision && r.hash != update.hash)
        .collect();
    old.sort_by_key(|r| r.revision);
    let limit = set.revision_history_limit as usize;
    let mut extra = old.len().saturating_sub(limit);
    let mut out = Vec::new();
    for r in old {
        if extra == 0 {
            break;
        }
        if Some(r.revision) == status.last_good || in_use.contains(&r.hash.as_str()) {
            continue;
        }
        out.push(r.revision);
        extra -= 1;
    }
    out
}

/// Sets one condition, keeping its transition time while its status stays.
fn set_condition(
    status: &mut PodSetStatus,
    old: &PodSetStatus,
    kind: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: SystemTime,
) {
    let since = match old.condition(kind) {
        Some(c) if c.status == value => c.last_transition_time,
        _ => Timestamp(now),
    };
    let c = Condition {
        kind: kind.to_string(),
        status: value.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: since,
    };
    match status.conditions.iter_mut().find(|c| c.kind == kind) {
        Some(slot) => *slot = c,
        None => status.conditions.push(c),
    }
}

fn conditions(
    status: &mut PodSetStatus,
    old: &PodSetStatus,
    set: &PodSet,
    rollout: &Rollout,
    now: SystemTime,
) {
    let (value, reason, message) = if let Some(f) = &rollout.failed {
        (
            "False",
            "ProgressDeadlineExceeded",
            format!(
                "revision {} did not become available on {} within {}s",
                rollout.revision,
                f.nodes.join(", "),
                set.progress_deadline_seconds
            ),
        )
    } else if set.paused {
        ("Unknown", "Paused", "the rollout is paused".to_string())
    } else if rollout.complete {
        (
            "True",
            "RolloutComplete",
            format!("revision {} is available on every node", rollout.revision),
        )
    } else {
        (
            "True",
            "RollingUpdate",
            format!("rolling out revision {}", rollout.revision),
        )
    };
    set_condition(status, old, "Progressing", value, reason, &message, now);
    let available = status.number_available == status.desired_number_scheduled;
    set_condition(
        status,
        old,
        "Available",
        if available { "True" } else { "False" },
        if available {
            "AllAvailable"
        } else {
            "SomeUnavailable"
        },
        &format!(
            "{} of {} nodes have an available pod",
            status.number_available, status.desired_number_scheduled
        ),
        now,
    );
    // A revert's rollout still says which revision failed, until a new template is applied.
    match rollout.failed.as_ref().or(status.last_failure.as_ref()) {
        Some(f) => {
            let message = format!(
                "revision {} did not become available on {}: {}",
                f.revision,
                f.nodes.join(", "),
                f.reason
            );
            set_condition(
                status,
                old,
                "RolloutFailed",
                "True",
                "ProgressDeadlineExceeded",
                &message,
                now,
            )
        }
        None => set_condition(status, old, "RolloutFailed", "False", "", "", now),
    }
    match &status.reverted_to {
        Some(_) => {
            let message = old
                .condition("Reverted")
                .filter(|c| c.status == "True")
                .map(|c| c.message.clone())
                .unwrap_or_else(|| {
                    format!(
                        "a failed rollout went back to the last revision available everywhere ({})",
                        status.last_good.unwrap_or_default()
                    )
                });
            set_condition(status, old, "Reverted", "True", "AutoRevert", &message, now)
        }
        None => set_condition(status, old, "Reverted", "False", "", "", now),
    }
    let paused = if set.paused { "True" } else { "False" };
    set_condition(status, old, "Paused", paused, "", "", now);
}

#[cfg(test)]
mod tests;
