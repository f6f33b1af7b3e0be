//! The local etcd member: started as a child process, a new cluster or a join as learner, supervised, and
//! stopped cleanly.
//!
//! The agent starts it through the tombstone module's `start_member`, which checks what can be checked
//! before anything is created ([`bootstrap::preflight`]: the etcd binary, the ports, the data dir) and
//! deals with tombstones; then [`LocalMember::start_on`] decides how to come up ([`bootstrap::decide`]),
//! prepares the files (TLS material, token, name), starts etcd and waits until it serves, and hands
//! supervision to a task ([`supervisor::Supervisor`]). [`run_registration`] keeps the node's record and
//! heartbeat in etcd.
//! With `--etcd-endpoints` none of this runs: [`connect_external`] only connects and watches the cluster.

pub mod api;
pub mod bootstrap;
pub mod gate;
pub mod join;
pub mod layout;
pub mod lock;
pub mod metrics;
pub mod process;
pub mod registration;
pub mod supervisor;
pub mod version;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hostlet_runtime::{ComponentHandle, Etcd, EtcdConfig, EtcdError, Readiness};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use api::JoinService;
pub use bootstrap::Bootstrap;
pub use layout::MemberLayout;
pub use lock::DataDirLock;
pub use metrics::MemberMetrics;
pub use registration::run_registration;
pub use worker::{JoinRole, WorkerStart};

use crate::pki::{client_tls_files, ClusterCa, ClusterToken};
use bootstrap::{remove_created, Prepared};
use supervisor::{Supervisor, WaitError};

/// The readiness component the member reports as.
pub const READINESS_COMPONENT: &str = "etcd";

/// Everything the member needs from the agent's configuration.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub node_name: String,
    /// The host's name, for the member name and certificate names.
    pub hostname: String,
    pub data_dir: PathBuf,
    pub advertise_address: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub etcd_binary: PathBuf,
    /// `--etcd-insecure`: plain HTTP everywhere.
    pub insecure: bool,
    /// `--server`: join that cluster.
    pub server: Option<String>,
    /// `--token`.
    pub token: Option<String>,
    /// More names for the node's certificates (e.g. the `--listen` address).
    pub extra_sans: Vec<String>,
    /// `--key-prefix`: where the node records are, to find a node to rejoin through.
    pub key_prefix: String,
    /// More etcd flags (`--quota-backend-bytes=…`, `--etcd-arg`), checked by [`process::check_etcd_arg`].
    pub etcd_args: Vec<String>,
    /// `--role`: whether a join makes this host a member or a worker.
    pub role: worker::JoinRole,
    /// Free space under the data dir: a member that exits on a full disk is restarted once there is room.
    pub disk: Option<crate::disk::DiskPressure>,
    /// `--cert-lifetime`: how long the certificates this node issues (its own, and joiners') last.
    pub cert_lifetime: std::time::Duration,
}

/// Why the member cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("etcd binary {} not found: install etcd or give --etcd-binary", binary.display())]
    BinaryMissing { binary: PathBuf },
    #[error("{what}: cannot listen on {addr}")]
    PortUnavailable {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("data dir {} is not writable", path.display())]
    DataDirUnwritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS")]
    Tls(#[from] crate::pki::TlsError),
    #[error("cluster token")]
    Token(#[source] crate::pki::TokenError),
    #[error("joining the cluster")]
    Join(#[source] join::JoinError),
    #[error("etcd")]
    Etcd(#[source] Box<EtcdError>),
    #[error("{0}")]
    Inconsistent(String),
    #[error("cannot start {}", binary.display())]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd exited ({status}) before it served; the end of its log ({}):\n{tail}", log.display())]
    EtcdExited {
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("stopped before the member served")]
    Cancelled,
    #[error("the cluster removed this member (etcd said so; see {})", log.display())]
    RemovedFromCluster { log: PathBuf },
}

impl MemberError {
    fn etcd(e: EtcdError) -> Self {
        MemberError::Etcd(Box::new(e))
    }
}

/// Starts the local member.
pub struct LocalMember;

/// A running, supervised member.
pub struct StartedMember {
    /// The agent's client: voting members only.
    pub etcd: Etcd,
    pub token: ClusterToken,
    /// `None` under `--etcd-insecure`.
    pub ca: Option<ClusterCa>,
    pub member_name: String,
    /// Hex.
    pub member_id: String,
    pub peer_url: String,
    pub client_url: String,
    /// The loopback URL of the local member.
    pub local_client_url: String,
    pub layout: MemberLayout,
    /// The etcd release it runs, as the version gate read it.
    pub etcd_version: Option<version::EtcdVersion>,
    /// What the version gate warned about (an advisory, a release past upstream support).
    pub version_warnings: Vec<gate::Warning>,
    spec: process::MemberSpec,
    pid: Arc<AtomicI32>,
    removed: CancellationToken,
    /// The agent's member cache, handed to the supervisor once it is built.
    cache: Arc<std::sync::OnceLock<hostlet_runtime::Members>>,
    stop: CancellationToken,
    supervisor: JoinHandle<()>,
    /// The binary the supervisor starts (the etcd upgrade watches it).
    binary: PathBuf,
    restarts: tokio::sync::mpsc::Sender<supervisor::RestartRequest>,
    /// The version gate its restarts pass (one refusal reported once, whoever asks).
    gate: Option<supervisor::RestartGate>,
}

impl std::fmt::Debug for StartedMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartedMember")
            .field("member_name", &self.member_name)
            .field("member_id", &self.member_id)
            .finish()
    }
}

fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Restarts the local member on request: see [`StartedMember::restart`].
#[derive(Clone, Debug)]
pub struct MemberRestarter(tokio::sync::mpsc::Sender<supervisor::RestartRequest>);

impl MemberRestarter {
    pub async fn restart(&self) -> Result<Duration, String> {
        restart_through(&self.0).await
    }
}

async fn restart_through(
    requests: &tokio::sync::mpsc::Sender<supervisor::RestartRequest>,
) -> Result<Duration, String> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    requests
        .send(reply)
        .await
        .map_err(|_| "the etcd supervisor has stopped".to_string())?;
    answer
        .await
        .map_err(|_| "the etcd supervisor stopped before the restart ended".to_string())?
}

impl LocalMember {
    /// Prepares and starts the member on a data dir that holds no tombstone (the tombstone module's
    /// `start_member` sees to that first), and returns once it serves: a restart, a new cluster, or a join
    /// through `cfg.server` (`previous_name`: the member this node had before, for the join to remove).
    /// `cancel` aborts the start (SIGTERM while joining); nothing of a brand-new member is left behind
    /// when the start fails.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_on(
        cfg: &MemberConfig,
        binary: PathBuf,
        layout: &MemberLayout,
        previous_name: Option<&str>,
        metrics: MemberMetrics,
        readiness: &Readiness,
        gate: Option<supervisor::RestartGate>,
        cancel: &CancellationToken,
    ) -> Result<StartedMember, MemberError> {
        let how = bootstrap::decide(layout.is_initialized(), cfg.server.as_deref());
        tracing::info!(?how, data_dir = %cfg.data_dir.display(), "starting the etcd member");
        let ready = readiness.register(READINESS_COMPONENT);
        let prepared = match &how {
            Bootstrap::Restart => bootstrap::prepare_restart(cfg)?,
            Bootstrap::NewCluster => bootstrap::prepare_new_cluster(cfg)?,
            Bootstrap::Join { server } => {
                bootstrap::prepare_join(cfg, server, previous_name, cancel).await?
            }
        };
        match Self::launch(
            binary,
            layout,
            &prepared,
            &cfg.etcd_args,
            metrics,
            ready,
            cfg.disk.clone(),
            gate,
            cancel,
        )
        .await
        {
            Ok(m) => {
                if how == Bootstrap::Restart {
                    m.fix_peer_url().await;
                }
                Ok(m)
            }
            Err(e) => {
                if !prepared.created.is_empty() {
                    if let Some((id, etcd)) = &prepared.added_member {
                        match tokio::time::timeout(Duration::from_secs(5), etcd.member_remove(*id))
                            .await
                        {
                            Ok(Ok(_)) => {
                                tracing::info!(id = %format!("{id:x}"), "removed the member this failed join added")
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(error = %e, "cannot remove the member this failed join added")
                            }
                            Err(_) => tracing::warn!(
                                "removing the member this failed join added timed out"
                            ),
                        }
                    }
                    remove_created(&prepared.created);
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn launch(
        binary: PathBuf,
        layout: &MemberLayout,
        prepared: &Prepared,
        extra_args: &[String],
        metrics: MemberMetrics,
        ready: ComponentHandle,
        disk: Option<crate::disk::DiskPressure>,
        gate: Option<supervisor::RestartGate>,
        cancel: &CancellationToken,
    ) -> Result<StartedMember, MemberError> {
        let spec = prepared.spec.clone();
        let mut endpoints = vec![spec.local_client_url()];
        endpoints.extend(
            prepared
                .cluster_client_urls
                .iter()
                .filter(|u| **u != spec.local_client_url())
                .cloned(),
        );
        let mut etcd_cfg = EtcdConfig::new(endpoints);
        if let Some(tls) = &spec.tls {
            etcd_cfg = etcd_cfg.with_tls(client_tls_files(tls));
        }
        let etcd = Etcd::connect(etcd_cfg).await.map_err(MemberError::etcd)?;
        let pid = Arc::new(AtomicI32::new(0));
        let removed = CancellationToken::new();
        let cache = Arc::new(std::sync::OnceLock::new());
        let (restarts, restart_requests) = tokio::sync::mpsc::channel(1);
        let sup = Supervisor {
            restarts: Some(restart_requests),
            removed: removed.clone(),
            members: cache.clone(),
            binary: binary.clone(),
            layout: layout.clone(),
            spec: spec.clone(),
            extra_args: extra_args.to_vec(),
            start: prepared.start.clone(),
            etcd: etcd.clone(),
            metrics,
            ready,
            pid: pid.clone(),
            disk,
            gate: gate.clone(),
        };
        let (child, status) = match sup.start_first(cancel).await {
            Ok(v) => v,
            Err((e, None)) => return Err(MemberError::Spawn { binary, source: e }),
            Err((_, Some(WaitError::Cancelled))) => return Err(MemberError::Cancelled),
            Err((_, Some(WaitError::Removed))) => {
                return Err(MemberError::RemovedFromCluster {
                    log: layout.etcd_log(),
                })
            }
            Err((_, Some(WaitError::Exited(status)))) => {
                return Err(MemberError::EtcdExited {
                    status: match status {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    },
                    log: layout.etcd_log(),
                    tail: log_tail(&layout.etcd_log(), 15),
                })
            }
        };
        let member_id = status.header().map(|h| h.member_id()).unwrap_or(0);
        tracing::info!(
            member = %spec.name,
            id = %format!("{member_id:x}"),
            learner = status.is_learner(),
            pid = child.pid(),
            "etcd member serving"
        );
        let stop = CancellationToken::new();
        let supervisor = tokio::spawn(sup.run(child, stop.clone()));
        Ok(StartedMember {
            etcd,
            token: prepared.token.clone(),
            ca: prepared.ca.clone(),
            member_name: spec.name.clone(),
            member_id: format!("{member_id:x}"),
            peer_url: spec.peer_url(),
            client_url: spec.client_url(),
            local_client_url: spec.local_client_url(),
            layout: layout.clone(),
            etcd_version: None,
            version_warnings: Vec::new(),
            spec,
            pid,
            removed,
            cache,
            stop,
            supervisor,
            binary,
            restarts,
            gate,
        })
    }
}

impl StartedMember {
    /// The etcd child's pid (0 while it is being restarted).
    pub fn etcd_pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// The etcd binary the member runs from (the path; the file may have been replaced since).
    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    /// Restarts the member now, on whatever binary its path holds, through the version gate: `Ok(how long
    /// it did not serve)` once the new run serves; `Err(message)` when the gate refused (the old run still serves) or the new run did
    /// not serve (the supervisor goes on restarting it with its backoff).
    pub async fn restart(&self) -> Result<Duration, String> {
        restart_through(&self.restarts).await
    }

    /// The version gate the supervisor passes before each restart: `Err(message)` while the binary on disk
    /// is refused (the refusal is reported once, as an `EtcdUpgradeRefused` event, whoever asks).
    pub fn version_gate(&self) -> Option<supervisor::RestartGate> {
        self.gate.clone()
    }

    /// A handle that restarts the member as [`StartedMember::restart`] does.
    pub fn restarter(&self) -> MemberRestarter {
        MemberRestarter(self.restarts.clone())
    }

    /// Fired when etcd exited because the cluster removed this member (it is not restarted then).
    pub fn removed(&self) -> CancellationToken {
        self.removed.clone()
    }

    /// From now on the supervisor reads the local status and the endpoints from the agent's shared member
    /// cache instead of asking etcd (a second call changes nothing).
    pub fn follow(&self, members: hostlet_runtime::Members) {
        let _ = self.cache.set(members);
    }

    /// The member id as a number (0 if it could not be read).
    pub fn id(&self) -> u64 {
        u64::from_str_radix(&self.member_id, 16).unwrap_or(0)
    }

    /// A voter whose registered peer URL is not the one it now listens on (the advertise address
    /// changed, or a reset restored it with the loopback URL) is updated, so that the other members and
    /// joiners reach it. Learners are left alone: some etcd versions clear the learner flag on update.
    async fn fix_peer_url(&self) {
        let want = self.spec.peer_url();
        let id = self.id();
        let members = match self.etcd.member_list_of(&self.local_client_url).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot check this member's peer URL");
                return;
            }
        };
        let Some(me) = members.iter().find(|m| m.id() == id) else {
            return;
        };
        if me.is_learner() || me.peer_urls() == [want.clone()] {
            return;
        }
        let was = me.peer_urls().join(",");
        match self
            .etcd
            .member_update(id, std::slice::from_ref(&want))
            .await
        {
            Ok(_) => tracing::info!(%was, now = %want, "updated this member's peer URL"),
            Err(e) => {
                tracing::warn!(error = %e, %was, now = %want, "cannot update this member's peer URL")
            }
        }
    }

    /// Stops etcd (SIGTERM, 15 s, SIGKILL) and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.supervisor.await {
            tracing::warn!(error = %e, "the etcd supervisor ended badly");
        }
    }
}

/// An external cluster (`--etcd-endpoints`): connect, and report its health as the `etcd` component.
pub async fn connect_external(
    endpoints: &[String],
    tls: Option<hostlet_runtime::TlsFiles>,
    metrics: MemberMetrics,
    readiness: &Readiness,
    cancel: CancellationToken,
) -> Result<Etcd, MemberError> {
    let mut cfg = EtcdConfig::new(endpoints.to_vec());
    if let Some(t) = tls {
        cfg = cfg.with_tls(t);
    }
    let etcd = Etcd::connect(cfg).await.map_err(MemberError::etcd)?;
    let ready = readiness.register(READINESS_COMPONENT);
    let watched = etcd.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let statuses = watched.status_all().await;
            let ok = statuses
                .iter()
                .filter(|(_, r)| matches!(r, Ok(s) if s.leader() != 0))
                .count();
            metrics.up.set((ok > 0) as i64);
            for s in statuses.iter().filter_map(|(_, r)| r.as_ref().ok()) {
                let id = s.header().map(|h| h.member_id()).unwrap_or(0);
                metrics
                    .db_size_bytes
                    .with_label_values(&[&format!("{id:x}")])
                    .set(s.db_size());
            }
            if ok > 0 {
                ready.set_ready(format!(
                    "{ok}/{} external endpoints serving",
                    statuses.len()
                ));
            } else {
                ready.set_not_ready("no external etcd endpoint serves");
            }
        }
    });
    Ok(etcd)
}

/// Makes ring rustls' process-wide crypto provider (several TLS users share one process); idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
