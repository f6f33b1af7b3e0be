//! The voter placement decision, a pure function of one look at the cluster: what the leader does next to
//! keep the voter count at the target. One membership change at a time; a dead voter is replaced by a
//! learner that has caught up before it is removed (a voter added beside a dead one would raise the
//! quorum the survivors must meet); never below quorum; never the last voter.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use hostlet_api::objects::NodeRole;

/// One etcd member as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberObs {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
    /// It answered the latest status call.
    pub answering: bool,
    /// A learner whose log is close enough to the leader's for etcd to promote it.
    pub caught_up: bool,
    /// The node whose record names this member.
    pub node: Option<String>,
    /// A voter whose node record was deleted, handed over by member removal: replaced as a dead one is.
    pub retiring: bool,
}

/// One node record as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObs {
    pub name: String,
    pub pin: Option<NodeRole>,
    pub failure_domain: Option<String>,
    /// When its member was made (voters), for "newest first".
    pub member_since: Option<SystemTime>,
    pub started: SystemTime,
    /// Its heartbeat lease is there.
    pub alive: bool,
    /// How long its heartbeat has been gone, as this leader measured it.
    pub gone_for: Duration,
}

/// A pending request asking a worker to become a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestObs {
    pub node: String,
    pub age: Duration,
}

/// Everything one decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub target: usize,
    pub replace_after: Duration,
    pub members: Vec<MemberObs>,
    pub nodes: BTreeMap<String, NodeObs>,
    pub requests: Vec<RequestObs>,
    pub leader: u64,
}

/// Why a member is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// A dead voter whose replacement has caught up.
    Replaced,
    /// Voters above the target: the newest leaves (or a dead one first).
    Shrink,
    /// A learner nobody needs (the target is met): its host goes on as a worker.
    NotNeeded,
    /// A voter whose node record was deleted, with no worker to replace it.
    Deleted,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do (the reason, for the logs).
    Idle(String),
    /// Waiting for something under way (a learner catching up, a worker starting its member).
    Wait(String),
    /// Ask this worker to start an etcd member and join as a learner.
    RequestJoin {
        node: String,
        reason: String,
    },
    /// Withdraw a request that no longer leads anywhere.
    CancelRequest {
        node: String,
        reason: String,
    },
    /// Leadership moves off the member about to be removed.
    MoveLeader {
        from: u64,
        to: u64,
    },
    Remove {
        id: u64,
        name: String,
        why: Removal,
    },
}

/// A pending request older than this, with no learner to show for it, is withdrawn (and the choice made
/// again): the worker may have gone or failed to start its member.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

impl Observed {
    fn node_of(&self, m: &MemberObs) -> Option<&NodeObs> {
        m.node.as_ref().and_then(|n| self.nodes.get(n))
    }

    /// A voter to replace: its heartbeat has been missing for `replace_after` and it does not answer,
    /// or its node record was deleted.
    fn is_dead(&self, m: &MemberObs) -> bool {
        m.retiring
            || (!m.answering
                && self
                    .node_of(m)
                    .is_some_and(|n| !n.alive && n.gone_for >= self.replace_after))
    }

    /// The live voter that takes leadership from `from`, the lowest id.
    fn heir(&self, from: u64) -> Option<u64> {
        self.members
            .iter()
            .filter(|m| !m.is_learner && m.id != from && m.answering && !self.is_dead(m))
            .map(|m| m.id)
            .min()
    }

    /// Removes voter `v`, leadership moved off it first; never below a majority that answers.
    fn remove_voter(&self, voters: &[&MemberObs], v: &MemberObs, why: Removal) -> Step {
        let alive_after = voters
            .iter()
            .filter(|m| m.id != v.id && m.answering)
            .count();
        if alive_after * 2 < voters.len() {
            return Step::Wait(format!(
                "removing {} would leave {alive_after} live voters of {}: below quorum",
                v.name,
                voters.len() - 1
            ));
        }
        if v.id == self.leader {
            return match self.heir(v.id) {
                Some(to) => Step::MoveLeader { from: v.id, to },
                None => Step::Wait(format!("no live voter to take leadership from {}", v.name)),
            };
        }
        Step::Remove {
            id: v.id,
            name: v.name.clone(),
            why,
        }
    }

    fn pinned_voter(&self, m: &MemberObs) -> bool {
        self.node_of(m)
            .is_some_and(|n| n.pin == Some(NodeRole::Voter))
    }

    /// Nodes that run no member, are alive, and are not pinned as workers.
    fn ready_workers(&self) -> Vec<&NodeObs> {
        self.nodes
            .values()
            .filter(|n| n.alive && n.pin != Some(NodeRole::Worker))
            .filter(|n| {
                !self
                    .members
                    .iter()
                    .any(|m| m.node.as_deref() == Some(&n.name))
            })
            .collect()
    }
}

/// The worker to ask: the failure domain with the fewest live voters first, then the oldest node (the
/// one started first), then by name.
fn choose_worker<'a>(obs: &'a Observed, workers: &[&'a NodeObs]) -> Option<&'a NodeObs> {
    let mut per_domain: BTreeMap<&str, usize> = BTreeMap::new();
    for m in obs
        .members
        .iter()
        .filter(|m| !m.is_learner && !obs.is_dead(m))
    {
        if let Some(n) = obs.node_of(m) {
            *per_domain
                .entry(n.failure_domain.as_deref().unwrap_or(""))
                .or_default() += 1;
        }
    }
    workers.iter().copied().min_by(|a, b| {
        let da = per_domain
            .get(a.failure_domain.as_deref().unwrap_or(""))
            .copied()
            .unwrap_or(0);
        let db = per_domain
            .get(b.failure_domain.as_deref().unwrap_or(""))
            .copied()
            .unwrap_or(0);
        da.cmp(&db)
            .then(a.started.cmp(&b.started))
            .then(a.name.cmp(&b.name))
    })
}

/// The next step toward `obs.target` voters.
pub fn decide(obs: &Observed) -> Step {
    let voters: Vec<&MemberObs> = obs.members.iter().filter(|m| !m.is_learner).collect();
    let learners: Vec<&MemberObs> = obs.members.iter().filter(|m| m.is_learner).collect();
    let dead: Vec<&MemberObs> = voters.iter().copied().filter(|m| obs.is_dead(m)).collect();

    // Requests that lead nowhere go first: the node became a member, or went, or took too long.
    for r in &obs.requests {
        let member = obs
            .members
            .iter()
            .any(|m| m.node.as_deref() == Some(&r.node));
        let reason = match obs.nodes.get(&r.node) {
            _ if member => "the node runs an etcd member now",
            None => "the node record is gone",
            // The worker's heartbeat lapses while it starts again as a joiner: only the clock counts.
            Some(_) if learners.is_empty() && r.age >= REQUEST_TIMEOUT => {
                "no learner joined within 2 minutes"
            }
            Some(_) => continue,
        };
        return Step::CancelRequest {
            node: r.node.clone(),
            reason: reason.to_string(),
        };
    }

    if let Some(l) = learners.first() {
        if obs.pinned_voter(l) {
            return Step::Wait(format!("learner {} is pinned as a voter", l.name));
        }
        if let Some(d) = dead.first() {
            if !l.caught_up {
                return Step::Wait(format!(
                    "learner {} catches up before dead voter {} goes",
                    l.name, d.name
                ));
            }
            if voters.len() > 1 {
                // A retiring voter may still lead: leadership moves off it first.
                if d.id == obs.leader {
                    if let Some(to) = obs.heir(d.id) {
                        return Step::MoveLeader { from: d.id, to };
                    }
                }
                return Step::Remove {
                    id: d.id,
                    name: d.name.clone(),
                    why: Removal::Replaced,
                };
            }
        }
        // Only a learner whose node record names it: the record says whether it is pinned.
        if voters.len() >= obs.target && dead.is_empty() && obs.node_of(l).is_some() {
            return Step::Remove {
                id: l.id,
                name: l.name.clone(),
                why: Removal::NotNeeded,
            };
        }
        return Step::Wait(format!("learner {} is on its way to voter", l.name));
    }

    if voters.len() > obs.target {
        // Dead voters leave first; then the newest voter that is not pinned.
        let victim = dead.first().copied().or_else(|| {
            voters
                .iter()
                .copied()
                .filter(|m| !obs.pinned_voter(m))
                .max_by(|a, b| {
                    let since = |m: &MemberObs| obs.node_of(m).and_then(|n| n.member_since);
                    since(a).cmp(&since(b)).then(a.name.cmp(&b.name))
                })
        });
        let Some(v) = victim else {
            return Step::Idle("every voter above the target is pinned".into());
        };
        return obs.remove_voter(&voters, v, Removal::Shrink);
    }

    if voters.len() < obs.target || !dead.is_empty() {
        if let Some(r) = obs.requests.first() {
            return Step::Wait(format!("worker {} was asked to join", r.node));
        }
        let workers = obs.ready_workers();
        let reason = match dead.first() {
            Some(d) if d.retiring => {
                format!("replaces voter {} (its node record was deleted)", d.name)
            }
            Some(d) => format!(
                "replaces voter {} (no heartbeat for {}s)",
                d.name,
                obs.nodes
                    .get(d.node.as_deref().unwrap_or(""))
                    .map(|n| n.gone_for.as_secs())
                    .unwrap_or(0)
            ),
            None => format!("{} voters of a target of {}", voters.len(), obs.target),
        };
        if let Some(w) = choose_worker(obs, &workers) {
            return Step::RequestJoin {
                node: w.name.clone(),
                reason,
            };
        }
        // Nobody to replace a deleted node's voter: it goes anyway, as the operator asked (never the last).
        if let Some(d) = dead.iter().find(|d| d.retiring) {
            if voters.len() > 1 {
                return obs.remove_voter(&voters, d, Removal::Deleted);
            }
        }
        return Step::Idle(format!("no ready worker: {reason}"));
    }
    Step::Idle(format!("{} voters, the target", voters.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn voter(id: u64) -> MemberObs {
        MemberObs {
            id,
            name: format!("m{id}"),
            is_learner: false,
            answering: true,
            caught_up: false,
            node: Some(format!("n{id}")),
            retiring: false,
        }
    }

    fn learner(id: u64, caught_up: bool) -> MemberObs {
        MemberObs {
            is_learner: true,
            caught_up,
            ..voter(id)
        }
    }

    fn node(i: u64) -> NodeObs {
        NodeObs {
            name: format!("n{i}"),
            pin: None,
            failure_domain: None,
            member_since: Some(t(i)),
            started: t(100 + i),
            alive: true,
            gone_for: Duration::ZERO,
        }
    }

    fn obs(target: usize, members: Vec<MemberObs>, nodes: &[u64]) -> Observed {
        Observed {
            target,
            replace_after: MIN,
            members,
            nodes: nodes.iter().map(|i| (format!("n{i}"), node(*i))).collect(),
            requests: vec![],
            leader: 1,
        }
    }

    fn kill(o: &mut Observed, id: u64, gone: Duration) {
        if let Some(m) = o.members.iter_mut().find(|m| m.id == id) {
            m.answering = false;
        }
        let n = o.nodes.get_mut(&format!("n{id}")).unwrap();
        n.alive = false;
        n.gone_for = gone;
    }

    #[test]
    fn at_the_target_nothing_moves() {
        let o = obs(3, vec![voter(1), voter(2), voter(3)], &[1, 2, 3, 4, 5]);
        assert!(matches!(decide(&o), Step::Idle(_)));
    }

    #[test]
    fn below_the_target_the_oldest_ready_worker_is_asked() {
        let mut o = obs(3, vec![voter(1), voter(2)], &[1, 2, 4, 5]);
        o.nodes.get_mut("n5").unwrap().started = t(1);
        assert_eq!(
            decide(&o),
            Step::RequestJoin {
                node: "n5".into(),
                reason: "2 voters of a target of 3".into()
            }
        );
        // Pinned workers and dead hosts are never asked.
        o.nodes.get_mut("n5").unwrap().pin = Some(NodeRole::Worker);
        o.nodes.get_mut("n4").unwrap().alive = false;
        assert!(matches!(decide(&o), Step::Idle(r) if r.contains("no ready worker")));
    }

    #[test]
    fn failure_domains_are_spread() {
        let mut o = obs(3, vec![voter(1), voter(2)], &[1, 2, 4, 5]);
        for (n, d) in [("n1", "a"), ("n2", "b"), ("n4", "a"), ("n5", "c")] {
            o.nodes.get_mut(n).unwrap().failure_domain = Some(d.into());
        }
        assert!(matches!(decide(&o), Step::RequestJoin { node, .. } if node == "n5"));
    }

    #[test]
    fn one_change_at_a_time_while_a_request_or_learner_is_under_way() {
        let mut o = obs(5, vec![voter(1), voter(2), voter(3)], &[1, 2, 3, 4, 5]);
        o.requests.push(RequestObs {
            node: "n4".into(),
            age: Duration::from_secs(3),
        });
        assert!(matches!(decide(&o), Step::Wait(_)));
        o.requests.clear();
        o.members.push(learner(4, false));
        assert!(matches!(decide(&o), Step::Wait(_)));
    }

    #[test]
    fn a_dead_voter_is_removed_only_once_its_replacement_caught_up() {
        let mut o = obs(3, vec![voter(1), voter(2), voter(3)], &[1, 2, 3, 4]);
        kill(&mut o, 3, Duration::from_secs(30));
        // Not gone long enough: nothing.
        assert!(matches!(decide(&o), Step::Idle(_)));
        kill(&mut o, 3, MIN);
        assert!(matches!(decide(&o), Step::RequestJoin { node, .. } if node == "n4"));
        o.members.push(MemberObs {
            node: Some("n4".into()),
            ..learner(4, false)
        });
        assert!(matches!(decide(&o), Step::Wait(_)));
        o.members.last_mut().unwrap().caught_up = true;
        assert_eq!(
            decide(&o),
            Step::Remove {
                id: 3,
                name: "m3".into(),
                why: Removal::Replaced
            }
        );
    }

    #[test]
    fn a_voter_that_still_answers_is_not_dead() {
        let mut o = obs(3, vec![voter(1), voter(2), voter(3)], &[1, 2, 3, 4]);
        kill(&mut o, 3, MIN * 10);
        o.members[2].answering = true;
        assert!(matches!(decide(&o), Step::Idle(_)));
    }

    #[test]
    fn shrinking_removes_the_newest_voter_after_moving_leadership() {
        let mut o = obs(
            3,
            vec![voter(1), voter(2), voter(3), voter(4), voter(5)],
            &[1, 2, 3, 4, 5],
        );
        assert_eq!(
            decide(&o),
            Step::Remove {
                id: 5,
                name: "m5".into(),
                why: Removal::Shrink
            }
        );
        o.leader = 5;
        assert_eq!(decide(&o), Step::MoveLeader { from: 5, to: 1 });
        // A pinned voter stays; the next newest goes.
        o.leader = 1;
        o.nodes.get_mut("n5").unwrap().pin = Some(NodeRole::Voter);
        assert!(matches!(decide(&o), Step::Remove { id: 4, .. }));
        // A dead voter goes before any live one.
        kill(&mut o, 2, MIN);
        assert!(matches!(decide(&o), Step::Remove { id: 2, .. }));
    }

    #[test]
    fn shrinking_never_goes_below_quorum() {
        let mut o = obs(1, vec![voter(1), voter(2), voter(3)], &[1, 2, 3]);
        kill(&mut o, 2, Duration::from_secs(1));
        o.members[1].answering = false;
        // 3 voters, one silent but not yet dead: removing a live one leaves 1 live of 2.
        assert!(matches!(decide(&o), Step::Wait(r) if r.contains("below quorum")));
    }

    #[test]
    fn a_learner_nobody_needs_is_removed_and_a_pinned_one_stays() {
        let mut o = obs(
            3,
            vec![voter(1), voter(2), voter(3), learner(4, true)],
            &[1, 2, 3, 4],
        );
        assert!(matches!(
            decide(&o),
            Step::Remove {
                id: 4,
                why: Removal::NotNeeded,
                ..
            }
        ));
        o.nodes.get_mut("n4").unwrap().pin = Some(NodeRole::Voter);
        assert!(matches!(decide(&o), Step::Wait(_)));
        // A learner no node record names yet (its agent registers once it serves) is left alone.
        o.members[3].node = None;
        assert!(matches!(decide(&o), Step::Wait(_)));
    }

    #[test]
    fn requests_that_lead_nowhere_are_withdrawn() {
        let mut o = obs(3, vec![voter(1), voter(2), voter(3)], &[1, 2, 3, 4]);
        o.requests.push(RequestObs {
            node: "n3".into(),
            age: Duration::ZERO,
        });
        assert!(matches!(decide(&o), Step::CancelRequest { node, .. } if node == "n3"));
        o.requests[0] = RequestObs {
            node: "n4".into(),
            age: REQUEST_TIMEOUT,
        };
        assert!(matches!(decide(&o), Step::CancelRequest { node, .. } if node == "n4"));
        o.requests[0].node = "gone".into();
        assert!(matches!(decide(&o), Step::CancelRequest { .. }));
        // A worker restarting as a joiner has no heartbeat for a moment: its request stands.
        o.requests[0] = RequestObs {
            node: "n4".into(),
            age: Duration::from_secs(5),
        };
        o.nodes.get_mut("n4").unwrap().alive = false;
        assert!(!matches!(decide(&o), Step::CancelRequest { .. }));
    }

    #[test]
    fn the_last_voter_is_never_removed() {
        let mut o = obs(1, vec![voter(1)], &[1, 2]);
        o.members.push(MemberObs {
            node: Some("n2".into()),
            ..learner(2, true)
        });
        kill(&mut o, 1, MIN);
        // The learner is the only way on, but the last voter stays; the learner is not removed either.
        assert!(matches!(decide(&o), Step::Wait(_)));
    }

    #[test]
    fn a_deleted_nodes_voter_is_replaced_learner_first_or_removed_when_no_worker_can() {
        // n3's record was deleted and member removal handed its voter over; it still answers, and leads.
        let retiring = |id| MemberObs {
            retiring: true,
            node: None,
            ..voter(id)
        };
        let mut o = obs(3, vec![voter(1), voter(2), retiring(3)], &[1, 2, 4]);
        o.leader = 3;
        assert!(matches!(decide(&o), Step::RequestJoin { node, reason }
            if node == "n4" && reason.contains("node record was deleted")));
        o.members.push(MemberObs {
            node: Some("n4".into()),
            ..learner(4, false)
        });
        assert!(matches!(decide(&o), Step::Wait(_)));
        o.members.last_mut().unwrap().caught_up = true;
        assert_eq!(decide(&o), Step::MoveLeader { from: 3, to: 1 });
        o.leader = 1;
        assert_eq!(
            decide(&o),
            Step::Remove {
                id: 3,
                name: "m3".into(),
                why: Removal::Replaced
            }
        );
        // No worker to ask: it goes at once.
        let o = obs(3, vec![voter(1), voter(2), retiring(3)], &[1, 2]);
        assert_eq!(
            decide(&o),
            Step::Remove {
                id: 3,
                name: "m3".into(),
                why: Removal::Deleted
            }
        );
        // Never the last voter.
        let o = obs(3, vec![retiring(1)], &[]);
        assert!(matches!(decide(&o), Step::Idle(_)));
    }
}
