//! Builds the membership controllers of an agent that runs its own member: the learner manager
//! ([`crate::learners`]) and member removal ([`crate::members`]), over the shared caches. Kept apart from
//! both so that each depends only on the cluster seam, not on the other.

use std::sync::Arc;

use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, Metrics, TlsFiles};

use crate::caches::Caches;
use crate::events::EventRecorder;
use crate::learners::{LearnerConfig, LearnerManager};
use crate::members::cluster::SetupError;
use crate::members::{EtcdCluster, MemberRemoval};

/// Why the membership controllers could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The membership controllers of an agent that runs its own member, built over the agent's shared caches
/// and ready to start: the learner manager and member removal. `local_client_url` is the local member's
/// (loopback) client URL; `tls` the agent's client certificate (`None` under `--etcd-insecure`).
#[allow(clippy::too_many_arguments)]
pub fn membership_controllers(
    etcd: &Etcd,
    caches: &Caches,
    keys: &KeyLayout,
    node: &str,
    local_client_url: &str,
    tls: Option<&TlsFiles>,
    stall_timeout: std::time::Duration,
    events: &EventRecorder,
    metrics: &Metrics,
) -> Result<Membership, SpawnError> {
    let cluster = Arc::new(
        EtcdCluster::new(
            etcd.clone(),
            caches.members.clone(),
            keys.clone(),
            node,
            local_client_url,
            tls,
        )?
        .with_events(events.clone()),
    );
    let learners =
        LearnerManager::new(cluster.clone(), LearnerConfig::new(stall_timeout), metrics)?
            .with_gate(crate::placement::promote_gate(
                caches.cluster_policy.clone(),
                caches.nodes.clone(),
            ));
    let removal = MemberRemoval::new(cluster, keys.clone(), caches.nodes.clone(), metrics)?
        .with_handoff(caches.handoff.clone());
    Ok(Membership {
        learners: Arc::new(learners),
        removal: Arc::new(removal),
    })
}

/// The two membership controllers, built.
pub struct Membership {
    pub learners: Arc<LearnerManager<EtcdCluster>>,
    pub removal: Arc<MemberRemoval<EtcdCluster>>,
}
