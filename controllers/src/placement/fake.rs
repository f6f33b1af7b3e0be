//! A cluster in memory behind [`VoterChanges`] and the shared caches placement reads, and the controller's
//! tests on it: every step on tokio's paused clock, in milliseconds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hostlet_api::objects::{ClusterPolicy, MemberRequest, NodeInfo, NodeRole, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::{Invalid, Object};
use hostlet_runtime::store::{Event, Writer};
use hostlet_runtime::{
    EtcdError, Leadership, Member, MemberStatus, MembersFeed, Metrics, Statuses,
};

use super::effects::VoterChanges;
use super::{Placement, PlacementCaches};
use crate::events::EventKind;
use crate::members::Handoff;

/// The fake cluster: its members as etcd would list them, and what placement did to it.
#[derive(Debug, Default)]
pub struct World {
    /// `(id, node, is_learner)`; a member's name is its node's.
    pub members: Vec<(u64, String, bool)>,
    pub leader: u64,
    /// The local member (this agent's).
    pub local: u64,
    /// Members that do not answer their status.
    pub silent: HashSet<u64>,
    /// Raft applied index per member; the leader's is its log's end.
    pub applied: HashMap<u64, u64>,
    pub requests: Vec<MemberRequest>,
    pub cancelled: Vec<String>,
    pub moved_to: Vec<u64>,
    pub removed: Vec<u64>,
    /// `(reason, message)`.
    pub events: Vec<(String, String)>,
}

impl World {
    pub fn reasons(&self) -> Vec<&str> {
        self.events.iter().map(|(r, _)| r.as_str()).collect()
    }
}

fn object<T>(key: String, value: Result<T, Invalid>) -> Arc<Object<T>> {
    Arc::new(Object::fresh(key, value))
}

fn ready<K: Clone + Eq + std::hash::Hash, V>() -> Writer<K, V> {
    let mut w = Writer::new();
    w.apply_all([Event::Init, Event::InitDone]);
    w
}

/// The fake's shared parts: the world, the member cache it feeds, the request record's cache.
#[derive(Clone)]
struct Shared {
    world: Arc<Mutex<World>>,
    feed: Arc<Mutex<MembersFeed>>,
    request: Arc<Mutex<Writer<String, Object<MemberRequest>>>>,
    keys: KeyLayout,
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What one look of the member informer would find now.
    fn publish(&self) {
        let w = self.world();
        let members = w
            .members
            .iter()
            .map(|(id, node, is_learner)| Member {
                id: *id,
                name: node.clone(),
                peer_urls: vec![format!("http://{node}:2380")],
                client_urls: vec![format!("http://{node}:2379")],
                is_learner: *is_learner,
            })
            .collect();
        let leader_index = w.applied.get(&w.leader).copied().unwrap_or(100);
        let of = w
            .members
            .iter()
            .map(|(id, _, is_learner)| {
                let status = if w.silent.contains(id) {
                    Err("does not answer".to_string())
                } else {
                    let applied = w.applied.get(id).copied().unwrap_or(leader_index);
                    Ok(MemberStatus {
                        version: "3.4.23".into(),
                        db_size: 1 << 20,
                        db_size_in_use: 1 << 20,
                        leader: w.leader,
                        raft_term: 2,
                        raft_index: leader_index,
                        raft_applied_index: applied,
                        is_learner: *is_learner,
                        errors: vec![],
                        cluster_id: 7,
                        revision: 10,
                    })
                };
                (*id, status)
            })
            .collect();
        let statuses = Statuses {
            of,
            local_id: Some(w.local),
        };
        let leadership = Leadership {
            local_id: w.local,
            leader_id: w.leader,
            cluster_id: 7,
        };
        self.feed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(members, statuses, leadership);
    }
}

/// [`VoterChanges`] on the fake: every write lands in the world and, where an informer would carry it,
/// in the caches.
pub struct FakeVoters(Shared);

impl VoterChanges for FakeVoters {
    async fn request_join(&self, request: &MemberRequest) -> Result<bool, EtcdError> {
        let key = self.0.keys.member_request_record();
        let mut cache = self.0.request.lock().unwrap_or_else(|p| p.into_inner());
        if cache.store().contains(&key) {
            return Ok(false);
        }
        cache.apply(Event::Apply(key.clone(), object(key, Ok(request.clone()))));
        self.0.world().requests.push(request.clone());
        Ok(true)
    }

    async fn cancel_request(&self, node: &str) -> Result<(), EtcdError> {
        let key = self.0.keys.member_request_record();
        self.0
            .request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .apply(Event::Delete(key));
        self.0.world().cancelled.push(node.to_string());
        Ok(())
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        {
            let mut w = self.0.world();
            w.moved_to.push(to);
            w.leader = to;
        }
        self.0.publish();
        Ok(())
    }

    async fn remove_member(&self, id: u64) -> Result<(), EtcdError> {
        {
            let mut w = self.0.world();
            w.members.retain(|(m, _, _)| *m != id);
            w.removed.push(id);
        }
        self.0.publish();
        Ok(())
    }

    fn event(&self, _kind: EventKind, reason: &'static str, message: String) {
        self.0.world().events.push((reason.to_string(), message));
    }
}

/// One agent's placement on the fake cluster, with the caches it reads.
pub struct Harness {
    shared: Shared,
    nodes: Writer<String, Object<NodeInfo>>,
    leases: Writer<String, Object<String>>,
    policy: Writer<String, Object<ClusterPolicy>>,
    pub placement: Placement<FakeVoters>,
    pub metrics: Metrics,
}

impl Harness {
    /// `members`: `(id, node, is_learner)`; every node in `nodes` gets a record and a heartbeat. Call
    /// inside a tokio runtime.
    pub fn new(
        local: u64,
        leader: u64,
        members: &[(u64, &str, bool)],
        nodes: &[&str],
        replace_after: Duration,
    ) -> Harness {
        let keys = KeyLayout::default();
        let feed = MembersFeed::new();
        let members_cache = feed.members();
        let policy = ready();
        let handoff = Handoff::new(policy.store());
        let shared = Shared {
            world: Arc::new(Mutex::new(World {
                members: members
                    .iter()
                    .map(|(id, n, l)| (*id, n.to_string(), *l))
                    .collect(),
                leader,
                local,
                ..World::default()
            })),
            feed: Arc::new(Mutex::new(feed)),
            request: Arc::new(Mutex::new(ready())),
            keys: keys.clone(),
        };
        shared.publish();
        let request_store = shared
            .request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .store();
        let nodes_cache = ready();
        let leases = ready();
        let caches = PlacementCaches {
            members: members_cache,
            nodes: nodes_cache.store(),
            leases: leases.store(),
            policy: policy.store(),
            request: request_store,
            handoff,
        };
        let metrics = Metrics::new();
        let local_node = members
            .iter()
            .find(|(id, _, _)| *id == local)
            .map(|(_, n, _)| n.to_string())
            .unwrap_or_default();
        let placement = Placement::with_effects(
            FakeVoters(shared.clone()),
            keys,
            &local_node,
            caches,
            replace_after,
            &metrics,
        )
        .unwrap();
        let mut h = Harness {
            shared,
            nodes: nodes_cache,
            leases,
            policy,
            placement,
            metrics,
        };
        for (i, n) in nodes.iter().enumerate() {
            h.node(n, i as u64, None);
            h.heartbeat(n, true);
        }
        h
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        self.shared.world()
    }

    /// Changes the world and lets the member cache see it.
    pub fn change(&self, f: impl FnOnce(&mut World)) {
        f(&mut self.shared.world());
        self.shared.publish();
    }

    pub fn refreshes_answer(&self, answering: bool) {
        self.shared
            .feed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answer_refreshes(answering);
    }

    /// Writes `name`'s node record: started `order` seconds after the others' epoch; it names its member
    /// when the world has one on it.
    pub fn node(&mut self, name: &str, order: u64, pin: Option<NodeRole>) {
        let member = self
            .world()
            .members
            .iter()
            .find(|(_, n, _)| n == name)
            .map(|(id, _, _)| *id);
        let key = self.shared.keys.node(name);
        let record = NodeInfo {
            name: name.to_string(),
            address: "127.0.0.1".into(),
            member_name: member.map(|_| name.to_string()),
            member_id: member.map(|id| format!("{id:x}")),
            peer_url: None,
            client_url: None,
            api_url: Some(format!("https://{name}:10250")),
            version: "test".into(),
            started: Timestamp::from_unix(1_800_000_000 + order),
            role: pin,
            failure_domain: None,
            member_since: member.map(|id| Timestamp::from_unix(1_800_000_000 + id)),
            cert_expires: None,
            cert_serials: Vec::new(),
            labels: Default::default(),
            images: Default::default(),
        };
        self.nodes
            .apply(Event::Apply(key.clone(), object(key, Ok(record))));
    }

    pub fn heartbeat(&mut self, name: &str, alive: bool) {
        let key = self.shared.keys.lease(name);
        if alive {
            self.leases
                .apply(Event::Apply(key.clone(), object(key, Ok(name.to_string()))));
        } else {
            self.leases.apply(Event::Delete(key));
        }
    }

    /// A policy value that does not parse.
    pub fn break_policy(&mut self) {
        let key = self.shared.keys.cluster_policy();
        let error = ClusterPolicy::parse(b"voters: three").unwrap_err();
        let invalid = Invalid {
            error: Arc::new(std::io::Error::other(error)),
            raw: b"voters: three".to_vec(),
        };
        self.policy
            .apply(Event::Apply(key.clone(), object(key, Err(invalid))));
    }

    pub fn set_target(&mut self, voters: u8) {
        let key = self.shared.keys.cluster_policy();
        let policy = ClusterPolicy {
            voters: Some(voters),
        };
        self.policy
            .apply(Event::Apply(key.clone(), object(key, Ok(policy))));
    }
}

#[cfg(test)]
mod tests {
    use hostlet_runtime::Action;

    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    /// Three voters on n1..n3 (n1 leads, the local one) and a worker w.
    fn three_and_a_worker() -> Harness {
        Harness::new(
            1,
            1,
            &[(1, "n1", false), (2, "n2", false), (3, "n3", false)],
            &["n1", "n2", "n3", "w"],
            GRACE,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_below_its_target_asks_the_oldest_ready_worker_once() {
        // One voter, the default target of three; w2 started before w1.
        let mut h = Harness::new(1, 1, &[(1, "n1", false)], &["n1"], GRACE);
        h.node("w1", 5, None);
        h.heartbeat("w1", true);
        h.node("w2", 3, None);
        h.heartbeat("w2", true);
        h.node("pinned", 1, Some(NodeRole::Worker));
        h.heartbeat("pinned", true);
        h.placement.reconcile().await.unwrap();
        h.placement.reconcile().await.unwrap();
        let w = h.world();
        let asked: Vec<&str> = w.requests.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(
            asked,
            vec!["w2"],
            "one request, to the oldest worker not pinned"
        );
        assert_eq!(w.requests[0].server, "https://n1:10250");
        assert!(w.requests[0].reason.contains("1 voters of a target of 3"));
        assert_eq!(w.reasons(), vec!["VoterRequested"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_changes_nothing() {
        let mut h = Harness::new(
            2,
            1,
            &[(1, "n1", false), (2, "n2", false)],
            &["n1", "n2", "w"],
            GRACE,
        );
        h.set_target(3);
        let action = h.placement.reconcile().await.unwrap();
        assert!(matches!(action, Action::AwaitChange), "{action:?}");
        let w = h.world();
        assert!(w.requests.is_empty() && w.removed.is_empty() && w.events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_voter_is_replaced_after_the_grace_and_removed_once_its_replacement_caught_up() {
        let mut h = three_and_a_worker();
        h.heartbeat("n3", false);
        h.change(|w| {
            w.silent.insert(3);
        });
        let action = h.placement.reconcile().await.unwrap();
        assert!(h.world().requests.is_empty(), "replaced within the grace");
        // It looks again when the grace ends, not sooner and not at the next poll.
        match action {
            Action::Requeue(d) => {
                assert!(d <= GRACE && d > GRACE - Duration::from_secs(1), "{d:?}")
            }
            other => panic!("no look at the grace's end: {other:?}"),
        }
        tokio::time::advance(GRACE).await;
        h.placement.reconcile().await.unwrap();
        assert_eq!(
            h.world()
                .requests
                .iter()
                .map(|r| r.node.as_str())
                .collect::<Vec<_>>(),
            vec!["w"]
        );
        // The worker joins as a learner and is far behind.
        h.change(|w| {
            w.members.push((4, "w".into(), true));
            w.applied.insert(1, 1000);
            w.applied.insert(4, 10);
        });
        h.node("w", 9, None);
        for _ in 0..3 {
            h.placement.reconcile().await.unwrap();
        }
        assert!(
            h.world().removed.is_empty(),
            "removed before its replacement caught up"
        );
        h.change(|w| {
            w.applied.insert(4, 990);
        });
        h.placement.reconcile().await.unwrap();
        let w = h.world();
        assert_eq!(w.removed, vec![3]);
        assert_eq!(
            w.cancelled,
            vec!["w".to_string()],
            "the request withdrawn once w runs a member"
        );
        assert!(w.reasons().contains(&"VoterReplaced"), "{:?}", w.reasons());
        drop(w);
        let text = h.metrics.encode_text();
        assert!(
            text.contains("hostlet_voter_replacements_total{result=\"success\"} 1"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_removal_waits_for_a_fresh_look_at_the_membership() {
        let mut h = three_and_a_worker();
        h.set_target(1);
        h.refreshes_answer(false);
        for _ in 0..3 {
            h.placement.reconcile().await.unwrap();
        }
        assert!(h.world().removed.is_empty(), "removed on an old look");
        h.refreshes_answer(true);
        h.placement.reconcile().await.unwrap();
        h.placement.reconcile().await.unwrap();
        // The newest voters leave first (n3, then n2), one at a time; never the leader while it leads.
        assert_eq!(h.world().removed, vec![3, 2]);
        assert_eq!(h.world().reasons(), vec!["VoterRemoved", "VoterRemoved"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_must_leave_hands_leadership_over_first() {
        // n3 is the newest voter and leads; the target is two.
        let mut h = Harness::new(
            3,
            3,
            &[(1, "n1", false), (2, "n2", false), (3, "n3", false)],
            &["n1", "n2", "n3"],
            GRACE,
        );
        h.set_target(1);
        h.placement.reconcile().await.unwrap();
        {
            let w = h.world();
            assert_eq!(w.moved_to, vec![1], "to the live voter with the lowest id");
            assert!(w.removed.is_empty());
        }
        // No longer the leader: this agent changes nothing more.
        let action = h.placement.reconcile().await.unwrap();
        assert!(matches!(action, Action::AwaitChange), "{action:?}");
        assert!(h.world().removed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_that_does_not_parse_moves_nothing_and_is_reported_once() {
        let mut h = Harness::new(1, 1, &[(1, "n1", false)], &["n1", "w1", "w2"], GRACE);
        h.break_policy();
        for _ in 0..3 {
            h.placement.reconcile().await.unwrap();
        }
        let w = h.world();
        assert!(w.requests.is_empty(), "a typo moved voters");
        assert_eq!(w.reasons(), vec!["InvalidClusterPolicy"]);
    }
}
