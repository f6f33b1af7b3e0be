//! Starts the membership controllers of an agent that runs its own member: the learner manager
//! ([`crate::learners`]) and member removal ([`crate::members`]), over the shared caches. Kept apart from
//! both so that each depends only on the cluster seam, not on the other.

use std::sync::Arc;

use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, Metrics, TlsFiles};
use tokio_util::sync::CancellationToken;

use crate::caches::Caches;
use crate::events::EventRecorder;
use crate::learners::{spawn_learner_manager, LearnerConfig};
use crate::members::cluster::SetupError;
use crate::members::{spawn_member_removal, EtcdCluster};

/// Why the membership controllers could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Starts the membership controllers on an agent that runs its own member: the learner manager and
/// member removal, over the agent's shared caches. `local_client_url` is the local member's (loopback)
/// client URL; `tls` the agent's client certificate (`None` under `--etcd-insecure`). Everything stops
/// with `shutdown`.
#[allow(clippy::too_many_arguments)]
pub fn spawn_membership_controllers(
    etcd: &Etcd,
    caches: &Caches,
    keys: &KeyLayout,
    node: &str,
    local_client_url: &str,
    tls: Option<&TlsFiles>,
    stall_timeout: std::time::Duration,
    events: &EventRecorder,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<Vec<(&'static str, tokio::task::JoinHandle<()>)>, SpawnError> {
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
    let learners = spawn_learner_manager(
        cluster.clone(),
        LearnerConfig::new(stall_timeout),
        Some(crate::placement::promote_gate(
            caches.cluster_policy.clone(),
            caches.nodes.clone(),
        )),
        metrics,
        shutdown.clone(),
    )?;
    let removal = spawn_member_removal(
        cluster,
        keys.clone(),
        caches.nodes.clone(),
        Some(caches.handoff.clone()),
        metrics,
        shutdown.clone(),
    )?;
    Ok(vec![("learners", learners), ("member-removal", removal)])
}
