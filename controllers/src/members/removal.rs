//! [`MemberRemoval`]: when a node record (`/hostlet/nodes/<node>`) is deleted, the leader removes that node's
//! etcd member.
//!
//! A delete carries no value, so the controller remembers the last record it saw of every node: that is
//! what names the member (name and peer URL must both match). Every agent remembers and keeps a deletion
//! pending until the member is gone, so whichever member leads when it is time acts — including the one
//! that takes over after the leader handed leadership away to have its own member removed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::informer::Object;
use hostlet_runtime::metrics::ControllerMetrics;
use hostlet_runtime::{Metrics, Store, WorkQueue};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::cluster::{Cluster, ClusterError};
use super::plan::{plan_removal, RemovalStep};
use super::worker::{run_worker, Action};
use crate::events::EventKind;

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "members";

/// The `result` label values of `hostlet_member_removals_total`.
pub const REMOVAL_RESULTS: [&str; 3] = ["success", "error", "refused"];

/// How often a pending removal is looked at again while this member does not lead, or after a step.
const PENDING_RECHECK: Duration = Duration::from_secs(1);
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

/// The member removal controller. Build it with [`MemberRemoval::new`], run it with [`MemberRemoval::run`].
pub struct MemberRemoval<C> {
    cluster: Arc<C>,
    keys: KeyLayout,
    nodes: Store<String, Object<NodeInfo>>,
    /// The last record seen of each node; a deleted node's stays until its member is gone.
    last_seen: StdMutex<HashMap<String, NodeInfo>>,
    metrics: RemovalMetrics,
    controller: ControllerMetrics,
    queue: WorkQueue<String>,
}

impl<C: Cluster> MemberRemoval<C> {
    /// `nodes` is the shared cache of `/hostlet/nodes/` (see [`super::nodes_informer`]).
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
            last_seen: StdMutex::new(HashMap::new()),
            metrics: RemovalMetrics::register(metrics.registry())?,
            controller: metrics.controller(CONTROLLER),
            queue: WorkQueue::new(CONTROLLER, metrics),
        })
    }

    fn last_seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeInfo>> {
        self.last_seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs until `shutdown` fires.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let watcher = {
            let this = self.clone();
            let shutdown = shutdown.clone();
            async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = this.watch_nodes() => {}
                }
                this.queue.shutdown();
            }
        };
        let worker = run_worker(
            CONTROLLER,
            &self.queue,
            &self.controller,
            PENDING_RECHECK,
            &shutdown,
            |node| self.reconcile(node),
        );
        tokio::join!(watcher, worker);
    }

    /// Remembers every node record; queues the nodes whose record went.
    async fn watch_nodes(&self) {
        self.nodes.wait_until_ready().await;
        let mut changes = self.nodes.subscribe();
        while let Some(keys) = changes.next_batch().await {
            for key in keys {
                let Some(Key::Node { node }) = self.keys.parse(&key) else {
                    continue;
                };
                match self.nodes.get(&key) {
                    Some(obj) => {
                        if let Some(info) = obj.valid() {
                            self.last_seen().insert(node, info.clone());
                        }
                    }
                    None => {
                        if self.last_seen().contains_key(&node) {
                            tracing::info!(%node, "node record deleted: its etcd member is to be removed");
                            self.queue.add(node);
                        }
                    }
                }
            }
        }
    }

    /// One deleted node: remove its member, or move leadership first, or refuse for the last voter.
    pub async fn reconcile(&self, node: String) -> Result<Action, ClusterError> {
        if self.nodes.contains(&self.keys.node(&node)) {
            // The node registered again: nothing to remove.
            return Ok(Action::AwaitChange);
        }
        let Some(info) = self.last_seen().get(&node).cloned() else {
            return Ok(Action::AwaitChange);
        };
        let view = self.cluster.view().await?;
        let step = plan_removal(&info, &view);
        if step == RemovalStep::NothingToRemove {
            self.last_seen().remove(&node);
            return Ok(Action::AwaitChange);
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
                self.last_seen().remove(&node);
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
                self.last_seen().remove(&node);
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
