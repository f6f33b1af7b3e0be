//! etcd membership: the seam to the cluster both membership controllers use ([`cluster`]), member removal
//! for deleted nodes ([`removal`]), and the rows of `hostlet etcd members` ([`table`]).
//!
//! Wiring (in `hostlet run`, embedded etcd only): `membership::membership_controllers` builds both over
//! the agent's shared caches and the agent starts them; piece by piece:
//!
//! ```no_run
//! # async fn demo(etcd: hostlet_runtime::Etcd, metrics: hostlet_runtime::Metrics) -> anyhow::Result<()> {
//! //! use hostlet_api::KeyLayout;
//! use hostlet_controllers::{learners, members};
//! use hostlet_runtime::InformerFactory;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let keys = KeyLayout::default();
//! let local = "http://127.0.0.1:2379";
//! let informers = InformerFactory::new(etcd.clone(), metrics.clone(), shutdown.clone());
//! let caches = hostlet_controllers::caches::Caches::start(&informers, &keys, "node-1", Some(local));
//! let cluster = Arc::new(members::EtcdCluster::new(
//!     etcd.clone(), caches.members.clone(), keys.clone(), "node-1", local, None)?);
//! let manager = learners::LearnerManager::new(cluster.clone(), learners::LearnerConfig::default(), &metrics)?;
//! let removal = members::MemberRemoval::new(cluster, keys, caches.nodes.clone(), &metrics)?;
//! hostlet_runtime::spawn(Arc::new(manager), shutdown.clone());
//! hostlet_runtime::spawn(Arc::new(removal), shutdown.clone());
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

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{InformerFactory, Store};

pub use cluster::{Cluster, ClusterError, ClusterView, EtcdCluster, PromoteOutcome};
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
