//! etcd membership: the seam to the cluster both membership controllers use ([`cluster`]), member removal
//! for deleted nodes ([`removal`]), and the rows of `hostlet etcd members` ([`table`]).
//!
//! Wiring (in `hostlet run`, embedded etcd only): `membership::spawn_membership_controllers` does all of it
//! over the agent's shared caches; piece by piece:
//!
//! ```no_run
//! # async fn demo(etcd: hostlet_runtime::Etcd, metrics: hostlet_runtime::Metrics) -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use hostlet_api::KeyLayout;
//! use hostlet_controllers::{learners, members};
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let keys = KeyLayout::default();
//! let local = "http://127.0.0.1:2379";
//! let caches = hostlet_controllers::caches::Caches::start(&etcd, &keys, "node-1", Some(local), &metrics, &shutdown);
//! let cluster = Arc::new(members::EtcdCluster::new(
//!     etcd.clone(), caches.members.clone(), keys.clone(), "node-1", local, None)?);
//! learners::spawn_learner_manager(cluster.clone(), learners::LearnerConfig::default(), None, &metrics, shutdown.clone())?;
//! members::spawn_member_removal(cluster, keys, caches.nodes.clone(), None, &metrics, shutdown.clone())?;
//! # Ok(()) }
//! ```

pub mod cluster;
pub mod etcd_metrics;
#[cfg(test)]
pub(crate) mod fake;
pub mod handoff;
pub mod plan;
pub mod removal;
pub mod table;

use std::sync::Arc;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{InformerFactory, Metrics, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use cluster::{Cluster, ClusterError, ClusterView, EtcdCluster, MemberInfo, PromoteOutcome};
pub use handoff::Handoff;
pub use plan::{plan_removal, RemovalStep};
pub use removal::MemberRemoval;
pub use table::{gather_member_rows, MemberRow, MEMBER_TABLE_HEADER};

/// The shared cache of `/hostlet/nodes/` (informer `nodes`), through the agent's `factory`: member
/// removal reads it, and so may anything else that needs the node records.
pub fn nodes_store(factory: &InformerFactory, keys: &KeyLayout) -> Store<String, Object<NodeInfo>> {
    factory.store("nodes", keys.nodes_prefix(), |_key, value| {
        serde_json::from_slice::<NodeInfo>(value)
    })
}

/// Starts member removal. Its metrics go into `metrics`' registry (call once per registry).
pub fn spawn_member_removal<C: Cluster>(
    cluster: Arc<C>,
    keys: KeyLayout,
    nodes: Store<String, Object<NodeInfo>>,
    handoff: Option<Handoff>,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, prometheus::Error> {
    let mut removal = MemberRemoval::new(cluster, keys, nodes, metrics)?;
    if let Some(h) = handoff {
        removal = removal.with_handoff(h);
    }
    let removal = Arc::new(removal);
    Ok(tokio::spawn(removal.run(shutdown)))
}
