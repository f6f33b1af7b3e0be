//! The learner manager (DESIGN §6): on the etcd leader, promotes each learner as soon as etcd accepts, keeps
//! its progress in `/hostlet/etcd/learner-progress`, and removes one that made no progress for the stall
//! timeout. The decision is pure ([`stall`]); the controller ([`controller`]) acts through
//! [`crate::members::Cluster`].

pub mod controller;
pub mod metrics;
pub mod stall;

use std::sync::Arc;

use hostlet_runtime::Metrics;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::members::Cluster;

pub use controller::{LearnerConfig, LearnerManager};
pub use metrics::LearnerMetrics;
pub use stall::{assess, Assessment};

/// Starts the learner manager. Its metrics go into `metrics`' registry (call once per registry).
pub fn spawn_learner_manager<C: Cluster>(
    cluster: Arc<C>,
    cfg: LearnerConfig,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, prometheus::Error> {
    let manager = Arc::new(LearnerManager::new(cluster, cfg, metrics)?);
    Ok(tokio::spawn(manager.run(shutdown)))
}
