//! What the boot takes ([`BootConfig`], from `hostlet run`'s flags) and what it gives back: a [`Running`]
//! agent, whose one stop drains every task it owns and says how it ended.

use std::path::PathBuf;
use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, ComponentHandle, Metrics, Readiness, TlsFiles};
use tokio_util::sync::CancellationToken;

use super::tasks::TaskSet;
use super::{Agent, SnapshotParts};
use crate::disk::DiskPressure;
use crate::etcd_member::{MemberConfig, MemberMetrics, StartedMember, WorkerStart};
use crate::events::EventRecorder;
use crate::pki::ClusterToken;
use crate::pods::controller::PodControllerConfig;
use crate::tombstone::rejoin::RejoinTarget;
use crate::upkeep::UpkeepConfig;

/// How long the stop waits for the agent's tasks (the controllers finishing the reconciles they are in,
/// then the writers, then the caches), before the member they write through stops: well inside a
/// service manager's 30 s stop timeout, with etcd's own 15 s.
pub const DRAIN: Duration = Duration::from_secs(8);

/// Where the cluster's data lives for this host.
pub enum Datastore {
    /// This host's own etcd member, or a worker's voters: the data dir decides.
    Member(Box<MemberConfig>),
    /// An etcd cluster hostlet does not run.
    External {
        endpoints: Vec<String>,
        tls: Option<TlsFiles>,
        /// `--token`, else the data dir's token file.
        token: Option<String>,
    },
}

/// What a member's controllers are set up with, beside the member itself.
pub struct MemberSettings {
    /// Where a rejoin goes, and with which token.
    pub server: Option<String>,
    pub token: Option<String>,
    pub learner_stall_timeout: Duration,
    /// `--voter-replace-after`.
    pub voter_replace_after: Duration,
    pub snapshots: SnapshotParts,
    pub upkeep: UpkeepConfig,
    pub upgrade: crate::upgrade::UpgradeConfig,
}

/// Everything the boot needs, from `hostlet run`'s flags.
pub struct BootConfig {
    pub node: String,
    pub keys: KeyLayout,
    pub data_dir: PathBuf,
    pub datastore: Datastore,
    /// `--etcd-insecure`: no TLS towards etcd, the API in plain HTTP.
    pub insecure: bool,
    /// `--etcd-voters`: seeds the cluster policy unless one exists.
    pub voters: Option<u8>,
    /// `--cert-lifetime`: how long the certificates this node issues to workers last.
    pub cert_lifetime: Duration,
    /// The node record as the flags make it (name, address, role, failure domain); the boot adds the
    /// member's part and the API's URL.
    pub node_info: NodeInfo,
    /// `host:port` the API is reached at (its scheme follows from the TLS the boot finds).
    pub api_host_port: String,
    pub member: MemberSettings,
    pub pods: PodControllerConfig,
    pub metrics: Metrics,
    pub member_metrics: MemberMetrics,
    pub readiness: Readiness,
    /// The readiness component of the node record.
    pub node_ready: ComponentHandle,
    pub disk: DiskPressure,
}

/// Where the API's certificate and key are read again after a worker renewed them, and the record whose
/// change says it did.
#[derive(Clone)]
pub struct ApiTlsReload {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub renewed: tokio::sync::watch::Receiver<NodeInfo>,
}

/// What a running agent holds of its role.
pub(super) enum Held {
    Member(Box<StartedMember>),
    Worker(WorkerStart),
    External,
}

/// A booted agent: what `hostlet run` serves, and what its stop takes down.
pub struct Running {
    /// etcd, or on a worker the voters' node API.
    pub client: ClusterClient,
    pub events: EventRecorder,
    /// The API's routes: pods, exec/logs, the HTTP manifest source, and a member's join service.
    pub api_routes: axum::Router,
    /// The token the API checks requests against.
    pub token: Option<ClusterToken>,
    /// The API's certificate and key; `None` serves plain HTTP.
    pub api_tls: Option<(Vec<u8>, Vec<u8>)>,
    /// The CA whose client certificates name the API's callers (the cluster CA); `None`: none are asked.
    pub api_client_ca: Option<Vec<u8>>,
    /// A worker's: its renewed certificate is served without a restart.
    pub api_tls_reload: Option<ApiTlsReload>,
    /// Who votes, for the API's callers by certificate (`None` on an agent of an external cluster).
    pub roles: Option<crate::nodeapi::NodeRoles>,
    pub node: String,
    /// Whether the agent talks TLS to etcd.
    pub etcd_tls: bool,
    pub api_url: String,
    /// The local member's client URL first, then the others the client knows.
    pub endpoints: Vec<String>,
    pub(super) agent: Agent,
    pub(super) held: Held,
    /// Every task the boot started (the node's registration last), drained by the stop.
    pub(super) tasks: TaskSet,
    /// Fired once this worker's certificate is revoked (its node deleted): its controllers have stopped.
    pub revoked: CancellationToken,
}

impl Running {
    /// Once [`Running::revoked`] has fired: drains the agent's tasks, the node's lease last (without
    /// writing the record again); the API keeps answering until [`Running::stop`].
    pub async fn stop_revoked(&mut self) {
        self.drain().await;
    }

    /// The revoked certificates of deleted nodes, for the API's callers.
    pub fn revocations(&self) -> crate::pki::Revocations {
        self.agent.revocations.clone()
    }

    /// Stops the agent once `shutdown` (given to [`super::boot()`]) has fired, the one stop of every
    /// agent (a revoked one's too): the tasks drain stage by stage (about [`DRAIN`]), the node's lease
    /// last, then the member stops. Says whether the agent is to start again as a joiner.
    pub async fn stop(mut self) -> Ended {
        self.drain().await;
        let worker_token = match self.held {
            Held::Member(m) => {
                m.stop().await;
                None
            }
            Held::Worker(w) => Some(w.token.to_string()),
            Held::External => None,
        };
        if self.revoked.is_cancelled() {
            // A deleted node does not come back through a request made before.
            return Ended::Stopped;
        }
        // A worker asked to become a member starts again as a joiner, through the leader's API.
        if let Some(req) = self.agent.member_request().await {
            return Ended::Rejoin(RejoinTarget {
                server: req.server,
                token: worker_token.unwrap_or_default(),
            });
        }
        // The rejoin, if that is what stopped the agent.
        match self.agent.rejoin_target().await {
            Some(t) => Ended::Rejoin(t),
            None => Ended::Stopped,
        }
    }

    async fn drain(&mut self) {
        // Informers a late reader started since the boot.
        self.agent.adopt_feeders(&mut self.tasks);
        let drained = self.tasks.drain(DRAIN).await;
        tracing::info!(
            finished = drained.finished.len(),
            unfinished = drained.unfinished.len(),
            "agent tasks drained"
        );
    }
}

/// How an agent ended.
#[derive(Debug)]
pub enum Ended {
    Stopped,
    /// Start again as a joiner through this node's API: a rejoin, or a worker asked to become a member.
    Rejoin(RejoinTarget),
}
