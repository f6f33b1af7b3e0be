//! [`MemberRemoval`]: when a node record (`/hostlet/nodes/<node>`) is deleted, the leader removes that node's
//! etcd member.
//!
//! The node cache hands over a deleted record with the object it held last: that record names the member
//! (name and peer URL must both match), and it is the queue's key, so a deletion stays pending with what it
//! needs until the member is gone. Every agent keeps it pending, so whichever member leads when it is time
//! acts — including the one that takes over after the leader handed leadership away to have its own
//! member removed.

use std::sync::Arc;
use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Action, Change, Controller, ErrorAction, Metrics, Run, Store};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::cluster::{Cluster, ClusterError};
use super::handoff::Handoff;
use super::plan::{is_node_member, plan_removal, RemovalStep};
use crate::events::EventKind;

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "member-removal";

/// The `result` label values of `hostlet_member_removals_total`.
pub const REMOVAL_RESULTS: [&str; 3] = ["success", "error", "refused"];

/// How often a pending removal is looked at again while this member does not lead, or after a step.
const PENDING_RECHECK: Duration = Duration::from_secs(1);
/// How often a voter handed to voter placement is looked at again (until its member is gone).
const HANDED_OVER_RECHECK: Duration = Duration::from_secs(5);
/// After asking for a leadership move: time for the new leader to take over.
const AFTER_MOVE: Duration = Duration::from_millis(500);

/// `hostlet_member_removals_total{result}`.
#[derive(Debug, Clone)]
pub struct RemovalMetrics {
    pub removals: IntCounterVec,
}

impl RemovalMetrics {
    /// Creates the family (every result at 0) and registers it.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let removals = IntCounterVec::new(
            Opts::new(
                "hostlet_member_removals_total",
                "etcd members of deleted nodes, by result: removed, failed, refused (last voter).",
            ),
            &["result"],
        )?;
        for r in REMOVAL_RESULTS {
            removals.with_label_values(&[r]);
        }
        registry.register(Box::new(removals.clone()))?;
        Ok(RemovalMetrics { removals })
    }

    fn count(&self, result: &str) {
        self.removals.with_label_values(&[result]).inc();
    }
}

/// A node whose record was deleted, with the record it held last: the key of the removal queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeletedNode {
    pub node: String,
    pub record: NodeInfo,
}

/// The member removal controller. Build it with [`MemberRemoval::new`], start it with [`hostlet_runtime::spawn`].
pub struct MemberRemoval<C> {
    cluster: Arc<C>,
    keys: KeyLayout,
    nodes: Store<String, Object<NodeInfo>>,
    metrics: RemovalMetrics,
    registry: Metrics,
    /// Where voters go to be replaced learner-first (an agent with voter placement).
    handoff: Option<Handoff>,
}

impl<C: Cluster> MemberRemoval<C> {
    /// `nodes` is the shared cache of `/hostlet/nodes/` (see [`super::nodes_store`]).
    pub fn new(
        cluster: Arc<C>,
        keys: KeyLayout,
        nodes: Store<String, Object<NodeInfo>>,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        Ok(MemberRemoval {
            cluster,
            keys,
            nodes,
            metrics: RemovalMetrics::register(metrics.registry())?,
            registry: metrics.clone(),
            handoff: None,
        })
    }

    /// Hands the voters of deleted nodes to voter placement while it acts (see [`Handoff`]).
    pub fn with_handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// A node record that went (with a valid last value) is the key to reconcile; other changes are not.
    fn node_deleted(&self, change: &Change<String, Object<NodeInfo>>) -> Option<DeletedNode> {
        let Some(Key::Node { node }) = self.keys.parse(&change.key) else {
            return None;
        };
        let record = change.deleted.as_ref()?.valid()?.clone();
        tracing::info!(%node, "node record deleted: its etcd member is to be removed");
        Some(DeletedNode { node, record })
    }

    fn unmark(&self, id: Option<u64>) {
        if let (Some(h), Some(id)) = (&self.handoff, id) {
            h.unmark(id);
        }
    }

    /// One deleted node: remove its member, or move leadership first, or refuse for the last voter; a
    /// voter goes to voter placement instead while it acts.
    pub async fn reconcile(&self, deleted: DeletedNode) -> Result<Action, ClusterError> {
        let DeletedNode { node, record: info } = deleted;
        let recorded_id = info
            .member_id
            .as_deref()
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        if self.nodes.contains(&self.keys.node(&node)) {
            // The node registered again: nothing to remove.
            self.unmark(recorded_id);
            return Ok(Action::AwaitChange);
        }
        if node == self.cluster.node() {
            // Our own record went: once the leader has removed our member, our etcd cannot serve again, and
            // the operator should hear it from here, not only from the leader's events.
            let members = self.cluster.members().await?;
            if !members.iter().any(|m| is_node_member(&info, m)) {
                let member = info.member_name.clone().unwrap_or_default();
                tracing::error!(%node, %member, "this node's etcd member was removed from the cluster: its node record was deleted");
                self.cluster
                    .event(
                        EventKind::Warning,
                        "LocalMemberRemoved",
                        format!(
                            "this node's etcd member {member} was removed from the cluster because node record {} was deleted; its etcd cannot rejoin as it is (its data must be set aside first)",
                            self.keys.node(&node)
                        ),
                    )
                    .await;
                return Ok(Action::AwaitChange);
            }
        }
        // A removal (and the last-voter refusal) must not rest on an old look.
        let view = self.cluster.fresh_view().await?;
        let step = plan_removal(&info, &view);
        if step == RemovalStep::NothingToRemove {
            self.unmark(recorded_id);
            return Ok(Action::AwaitChange);
        }
        if let (Some(h), RemovalStep::Remove { id } | RemovalStep::MoveLeader { from: id, .. }) =
            (&self.handoff, &step)
        {
            let voter = view.voters().any(|m| m.id == *id);
            if voter && h.placement_acts() {
                if h.mark(*id) {
                    tracing::info!(%node, id = %format!("{id:x}"),
                        "the deleted node's member is a voter: voter placement replaces it (a worker joins as a learner first)");
                }
                // Kept pending: if placement stops acting (the policy no longer parses), removal is ours again.
                return Ok(Action::Requeue(HANDED_OVER_RECHECK));
            }
            h.unmark(*id);
        }
        if !view.local_is_leader() {
            // Keep it pending: this member may lead soon (the leader may hand over to us for this).
            return Ok(Action::Requeue(PENDING_RECHECK));
        }
        let member = info.member_name.clone().unwrap_or_default();
        match step {
            RemovalStep::NothingToRemove => Ok(Action::AwaitChange),
            RemovalStep::Remove { id } => {
                if let Err(e) = self.cluster.remove(id).await {
                    self.metrics.count("error");
                    return Err(e);
                }
                self.metrics.count("success");
                self.cluster
                    .event(
                        EventKind::Normal,
                        "MemberRemoved",
                        format!("etcd member {member} ({id:x}) of deleted node {node} removed"),
                    )
                    .await;
                Ok(Action::AwaitChange)
            }
            RemovalStep::MoveLeader { from, to } => {
                tracing::info!(%node, from = %format!("{from:x}"), to = %format!("{to:x}"),
                    "the deleted node's member leads: moving leadership before it is removed");
                self.cluster.move_leader(to).await?;
                self.cluster
                    .event(
                        EventKind::Normal,
                        "LeadershipMoved",
                        format!(
                            "etcd leadership moved from {member} ({from:x}) to {to:x} so that the member of deleted node {node} can be removed"
                        ),
                    )
                    .await;
                Ok(Action::Requeue(AFTER_MOVE))
            }
            RemovalStep::RefuseLastVoter { id } => {
                self.metrics.count("refused");
                self.cluster
                    .event(
                        EventKind::Warning,
                        "MemberNotRemoved",
                        format!(
                            "node {node} was deleted but its etcd member {member} ({id:x}) is the last voter: removing it would end the cluster, so it stays"
                        ),
                    )
                    .await;
                Ok(Action::AwaitChange)
            }
        }
    }
}

impl<C: Cluster> Run for MemberRemoval<C> {
    /// Runs until `shutdown` fires.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let this = self.clone();
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .watches_changes(&self.nodes, move |c| this.node_deleted(c))
            .run(
                |node, this: Arc<Self>| async move { this.reconcile(node).await },
                |_, _, _| ErrorAction::Requeue(PENDING_RECHECK),
                shutdown,
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::fake::{learner, voter, FakeCluster, FakeWorld};
    use hostlet_api::objects::Timestamp;
    use hostlet_runtime::store::{Event, Writer};
    use hostlet_runtime::testkit::eventually;

    fn record(id: u64) -> NodeInfo {
        let m = voter(id);
        NodeInfo {
            name: format!("node{id}"),
            address: format!("127.0.0.{id}"),
            member_name: Some(m.name.clone()),
            member_id: Some(format!("{id:x}")),
            peer_url: m.peer_urls.first().cloned(),
            client_url: m.client_urls.first().cloned(),
            api_url: None,
            version: "test".into(),
            started: Timestamp::from_unix(0),
            role: None,
            failure_domain: None,
            member_since: None,
            cert_expires: None,
            cert_serials: Vec::new(),
            labels: Default::default(),
            images: Default::default(),
        }
    }

    fn object(keys: &KeyLayout, info: NodeInfo) -> (String, Arc<Object<NodeInfo>>) {
        let key = keys.node(&info.name);
        (key.clone(), Arc::new(Object::fresh(key, Ok(info))))
    }

    /// A node cache holding records of these members, and its writer.
    fn nodes(keys: &KeyLayout, ids: &[u64]) -> Writer<String, Object<NodeInfo>> {
        let mut w = Writer::new();
        w.apply(Event::Init);
        for id in ids {
            let (k, o) = object(keys, record(*id));
            w.apply(Event::InitApply(k, o));
        }
        w.apply(Event::InitDone);
        w
    }

    fn start(
        world: &FakeWorld,
        local: u64,
        store: Store<String, Object<NodeInfo>>,
    ) -> (Arc<MemberRemoval<FakeCluster>>, CancellationToken) {
        let r = Arc::new(
            MemberRemoval::new(
                world.agent(local),
                KeyLayout::default(),
                store,
                &Metrics::new(),
            )
            .unwrap(),
        );
        let stop = CancellationToken::new();
        tokio::spawn(r.clone().run(stop.clone()));
        (r, stop)
    }

    fn count(r: &MemberRemoval<FakeCluster>, result: &str) -> u64 {
        r.metrics.removals.with_label_values(&[result]).get()
    }

    /// Reconciles so far, of any result.
    fn reconciles(r: &MemberRemoval<FakeCluster>) -> u64 {
        let text = r.registry.encode_text();
        text.lines()
            .filter(|l| l.starts_with("hostlet_reconcile_total{controller=\"member-removal\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Nothing is pending any more: no reconcile over several recheck periods.
    async fn assert_settled(r: &MemberRemoval<FakeCluster>) {
        tokio::time::sleep(PENDING_RECHECK * 2).await;
        let before = reconciles(r);
        tokio::time::sleep(PENDING_RECHECK * 5).await;
        assert_eq!(reconciles(r), before, "a deletion is still pending");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_nodes_member_is_removed_by_the_leader() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), voter(2), voter(3)], 1);
        let mut w = nodes(&keys, &[1, 2, 3]);
        let (leader, _s1) = start(&world, 1, w.store());
        let (follower, _s2) = start(&world, 3, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(keys.node("node2")));
        eventually("removed", Duration::from_secs(2), || async {
            world.lock().removed == vec![2]
        })
        .await;
        assert_eq!(count(&leader, "success"), 1);
        assert_eq!(count(&follower, "success"), 0);
        assert!(world.reasons().contains(&"MemberRemoved".to_string()));
        // The follower lets the deletion go once the member is gone.
        assert_settled(&follower).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_leaders_own_member_hands_leadership_over_first() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), voter(2), voter(3)], 1);
        let mut w = nodes(&keys, &[1, 2, 3]);
        let (_a, _s1) = start(&world, 1, w.store());
        let (b, _s2) = start(&world, 2, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(keys.node("node1")));
        eventually("removed", Duration::from_secs(3), || async {
            world.lock().removed == vec![1]
        })
        .await;
        let s = world.lock();
        assert_eq!(
            s.leader_moves,
            vec![2],
            "leadership moved before the removal"
        );
        assert_eq!(s.leader, 2);
        drop(s);
        assert_eq!(count(&b, "success"), 1, "the new leader removed it");
        let reasons = world.reasons();
        let moved = reasons.iter().position(|r| r == "LeadershipMoved").unwrap();
        let removed = reasons.iter().position(|r| r == "MemberRemoved").unwrap();
        assert!(moved < removed);
    }

    #[tokio::test(start_paused = true)]
    async fn the_removed_nodes_own_agent_says_its_member_was_removed() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), voter(2), voter(3)], 1);
        let mut w = nodes(&keys, &[1, 2, 3]);
        let (_leader, _s1) = start(&world, 1, w.store());
        let (removed, _s2) = start(&world, 2, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(keys.node("node2")));
        eventually("removed", Duration::from_secs(2), || async {
            world.lock().removed == vec![2]
        })
        .await;
        // Its member gone, its local etcd stops answering; it still tells.
        world.lock().unreachable.insert(2);
        eventually("told", Duration::from_secs(3), || async {
            world
                .lock()
                .events
                .iter()
                .any(|(agent, reason, _)| *agent == 2 && reason == "LocalMemberRemoved")
        })
        .await;
        assert_settled(&removed).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_voter_is_never_removed() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), learner(4, true)], 1);
        let mut w = nodes(&keys, &[1]);
        let (r, _s) = start(&world, 1, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(keys.node("node1")));
        eventually("refused", Duration::from_secs(2), || async {
            count(&r, "refused") == 1
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s = world.lock();
        assert!(s.removed.is_empty());
        assert!(s.leader_moves.is_empty());
        assert_eq!(
            s.events
                .iter()
                .filter(|e| e.1 == "MemberNotRemoved")
                .count(),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_registered_again_keeps_its_member() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), voter(2)], 1);
        world.lock().unreachable.insert(1);
        let mut w = nodes(&keys, &[1, 2]);
        let (_r, _s) = start(&world, 1, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(keys.node("node2")));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (k, o) = object(&keys, record(2));
        w.apply(Event::Apply(k, o));
        world.lock().unreachable.clear();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(world.lock().removed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn another_member_with_the_same_name_is_not_removed() {
        let keys = KeyLayout::default();
        let world = FakeWorld::new(vec![voter(1), voter(2)], 1);
        let mut w = Writer::new();
        w.apply(Event::Init);
        let mut stale = record(2);
        stale.peer_url = Some("http://10.9.9.9:2380".into());
        let (k, o) = object(&keys, stale);
        w.apply(Event::InitApply(k.clone(), o));
        w.apply(Event::InitDone);
        let (r, _s) = start(&world, 1, w.store());
        tokio::time::sleep(Duration::from_millis(100)).await;
        w.apply(Event::Delete(k));
        eventually("looked at", Duration::from_secs(2), || async {
            reconciles(&r) > 0
        })
        .await;
        assert_settled(&r).await;
        assert!(world.lock().removed.is_empty());
    }
}
