//! Starting the local member under the tombstone rules. A member whose cluster moved on without it (the
//! other members serve and none lists it, or etcd exits saying it was removed) is tombstoned; a tombstoned
//! member, or one whose rejoin was cut short, backs its data up and joins again through another node, and
//! without one to join through refuses to start, so that a removed member never founds a second cluster.
//! The member itself (bootstrap, process, supervision) is [`crate::etcd_member`]'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hostlet_runtime::{Readiness, TlsFiles};
use tokio_util::sync::CancellationToken;

use super::datadir::{self, DataDirError};
use super::handler;
use super::standing::{self, Identity, Standing};
use crate::etcd_member::bootstrap;
use crate::etcd_member::gate;
use crate::etcd_member::supervisor::RestartGate;
use crate::etcd_member::version::Capabilities;
use crate::etcd_member::{
    worker, LocalMember, MemberConfig, MemberError, MemberLayout, MemberMetrics, StartedMember,
    WorkerStart,
};
use crate::pki::client_tls_files;

/// What a start brought up: this host's etcd member, or a worker's connection to the voters.
#[derive(Debug)]
pub enum Started {
    Member(Box<StartedMember>),
    Worker(WorkerStart),
}

/// Why the local member cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error(
        "{} holds a tombstone: this member was removed or asked to rejoin, and no other node of its cluster \
         answered. hostlet will not start it as a new cluster (that would split the cluster in two); start \
         with --server <url of a running hostlet> --token <token> to back the data up and rejoin", dir.display()
    )]
    Tombstoned { dir: PathBuf },
    #[error(
        "a rejoin was under way when hostlet stopped ({} exists: the old member is backed up, the new one \
         does not serve yet), and no other node of its cluster answered. hostlet will not start a new \
         cluster here (that would split the cluster in two); start with --server <url of a running \
         hostlet> --token <token> to finish the rejoin", marker.display()
    )]
    RejoinPending { marker: PathBuf },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
}

/// Checks, prepares and starts the local member, and returns once it serves, with what a rejoin did if
/// this start made one. `cancel` aborts the start (SIGTERM while joining); nothing of a brand-new member
/// is left behind when the start fails.
///
/// A member whose cluster moved on without it (the other members serve and none lists it, or etcd
/// exits saying it was removed) is tombstoned here and rejoins: its dir is backed up and it joins
/// through `--server`, or through a node found in the node records of the members that answered.
pub async fn start_member(
    cfg: &MemberConfig,
    metrics: MemberMetrics,
    readiness: &Readiness,
    cancel: &CancellationToken,
) -> Result<(Started, Option<Rejoined>), StartError> {
    let binary = bootstrap::preflight(cfg)?;
    let layout = MemberLayout::new(&cfg.data_dir);
    let member_dir = layout.member_dir();
    let mut prefer = None;
    let restart = !datadir::has_tombstone(&member_dir)
        && datadir::check_member_dir(&member_dir)?
        && layout.is_initialized();
    if restart {
        if let Some((reason, by)) = left_behind(cfg, &layout).await {
            tracing::warn!(%reason, "this member's cluster moved on without it: tombstoning it");
            datadir::write_tombstone(&member_dir, &reason)?;
            prefer = Some(by);
        }
    }
    let gate = version_gate(
        cfg,
        &layout,
        &binary,
        restart && prefer.is_none(),
        readiness,
        cancel,
    )
    .await?;
    // While a restarted member waits for its quorum, keep asking: the other members may come back
    // with a cluster that moved on — one restored from a snapshot has another cluster id, and its
    // members only refuse this one's messages instead of telling it that it was removed.
    let attempt = cancel.child_token();
    let verdict = Arc::new(std::sync::Mutex::new(None));
    let watcher = (restart && prefer.is_none()).then(|| {
        let (cfg, layout, attempt, verdict) = (
            cfg.clone(),
            layout.clone(),
            attempt.clone(),
            verdict.clone(),
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(LEFT_BEHIND_RECHECK) => {}
                    _ = attempt.cancelled() => return,
                }
                if let Some(found) = left_behind(&cfg, &layout).await {
                    *verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(found);
                    attempt.cancel();
                    return;
                }
            }
        })
    });
    let first = start_once(
        cfg,
        binary.clone(),
        &layout,
        prefer.as_deref(),
        metrics.clone(),
        readiness,
        &attempt,
    )
    .await
    .map(|started| gate.attach(started));
    if let Some(w) = watcher {
        w.abort();
    }
    let found = verdict.lock().unwrap_or_else(|p| p.into_inner()).take();
    let (reason, prefer) = match (first, found) {
        (Err(StartError::Member(MemberError::RemovedFromCluster { log })), _) => (
            format!(
                "etcd exited saying the cluster removed this member (see {})",
                log.display()
            ),
            None,
        ),
        (Err(StartError::Member(MemberError::Cancelled)), Some((reason, by)))
            if !cancel.is_cancelled() =>
        {
            (reason, Some(by))
        }
        (r, _) => return r,
    };
    tracing::warn!(%reason, "tombstoning the member and rejoining");
    datadir::write_tombstone(&member_dir, &reason)?;
    start_once(
        cfg,
        binary,
        &layout,
        prefer.as_deref(),
        metrics,
        readiness,
        cancel,
    )
    .await
    .map(|started| gate.attach(started))
}

/// What the version gate let through: the binary's capabilities and the warnings that go with them.
struct GatePassed {
    caps: Capabilities,
    warnings: Vec<gate::Warning>,
}

impl GatePassed {
    fn attach(
        &self,
        (started, rejoined): (Started, Option<Rejoined>),
    ) -> (Started, Option<Rejoined>) {
        match started {
            Started::Member(mut m) => {
                m.etcd_version = Some(self.caps.version);
                m.version_warnings = self.warnings.clone();
                (Started::Member(m), rejoined)
            }
            w => (w, rejoined),
        }
    }
}

/// How often a refused start looks again (the binary may be put back, or the cluster move on).
const GATE_RECHECK: Duration = Duration::from_secs(5);

/// The version gate before the member starts: the binary's `--version` against the cluster's version as the
/// other members this node knows report it (`check_cluster`: a restart of an initialized member). While
/// refused, nothing on disk changes: `/readyz` and an `EtcdUpgradeRefused` event (through the other
/// members) name both versions, and the gate looks again every few seconds until the binary or the
/// cluster changes, or the agent stops.
async fn version_gate(
    cfg: &MemberConfig,
    layout: &MemberLayout,
    binary: &std::path::Path,
    check_cluster: bool,
    readiness: &Readiness,
    cancel: &CancellationToken,
) -> Result<GatePassed, StartError> {
    let mut refused_with: Option<String> = None;
    loop {
        match gate_look(cfg, layout, binary, check_cluster, &mut refused_with).await? {
            Ok(passed) => {
                if refused_with.is_some() {
                    tracing::info!(version = %passed.caps.version, "the version gate lets the member start now");
                }
                return Ok(passed);
            }
            Err(message) => readiness
                .register(crate::etcd_member::READINESS_COMPONENT)
                .set_not_ready(message),
        }
        tokio::select! {
            _ = tokio::time::sleep(GATE_RECHECK) => {}
            _ = cancel.cancelled() => return Err(StartError::Member(MemberError::Cancelled)),
        }
    }
}

/// One look of the version gate: passed, or refused with a message naming both versions. A refusal other
/// than `last` is logged and sent as an `EtcdUpgradeRefused` event (through the other members), once.
async fn gate_look(
    cfg: &MemberConfig,
    layout: &MemberLayout,
    binary: &std::path::Path,
    check_cluster: bool,
    last: &mut Option<String>,
) -> Result<Result<GatePassed, String>, StartError> {
    let caps = Capabilities::probe(binary)
        .await
        .map_err(|e| MemberError::Inconsistent(e.to_string()))?;
    caps.check_args(&cfg.etcd_args)
        .map_err(MemberError::Inconsistent)?;
    let peers = if check_cluster {
        known_peers(cfg, layout)
    } else {
        Vec::new()
    };
    let tls = peer_tls(cfg, layout);
    let view = if peers.is_empty() {
        gate::ClusterView::default()
    } else {
        gate::ask_versions(&peers, tls.as_ref()).await
    };
    let refusal = match gate::decide(caps.version, &view) {
        gate::Verdict::Start { warnings } => return Ok(Ok(GatePassed { caps, warnings })),
        gate::Verdict::Refuse(r) => r,
    };
    let message = format!("member not started on {}: {refusal}", binary.display());
    if last.as_deref() != Some(message.as_str()) {
        tracing::error!("{message}");
        if let Some(etcd) = standing::peer_client(&peers, tls).await {
            let events = crate::events::EventRecorder::new(
                etcd,
                hostlet_api::KeyLayout::new(&cfg.key_prefix),
                cfg.node_name.clone(),
            );
            events
                .node_event(
                    crate::events::EventKind::Warning,
                    "EtcdUpgradeRefused",
                    message.clone(),
                )
                .await;
            events.flush(Duration::from_secs(5)).await;
        }
        *last = Some(message.clone());
    }
    Ok(Err(message))
}

/// The gate the supervisor passes before each restart of the member: the binary may have been replaced
/// since it started (a package upgrade), and a restart on a binary the cluster's version rules out is
/// refused as a start is. A binary that cannot be probed refuses too: the restart waits.
fn restart_gate(
    cfg: &MemberConfig,
    layout: &MemberLayout,
    binary: &std::path::Path,
) -> RestartGate {
    let (cfg, layout, binary) = (cfg.clone(), layout.clone(), binary.to_path_buf());
    let last = Arc::new(tokio::sync::Mutex::new(None::<String>));
    Arc::new(move || {
        let (cfg, layout, binary, last) =
            (cfg.clone(), layout.clone(), binary.clone(), last.clone());
        Box::pin(async move {
            let mut last = last.lock().await;
            match gate_look(&cfg, &layout, &binary, true, &mut last).await {
                Ok(Ok(_)) => {
                    if last.take().is_some() {
                        tracing::info!("the version gate lets the member restart now");
                    }
                    Ok(())
                }
                Ok(Err(message)) => Err(message),
                Err(e) => Err(format!("member not restarted on {}: {e}", binary.display())),
            }
        })
    })
}

/// One start; `prefer` is a member that answered for the cluster, asked first for a node to rejoin
/// through.
async fn start_once(
    cfg: &MemberConfig,
    binary: PathBuf,
    layout: &MemberLayout,
    prefer: Option<&str>,
    metrics: MemberMetrics,
    readiness: &Readiness,
    cancel: &CancellationToken,
) -> Result<(Started, Option<Rejoined>), StartError> {
    let mut cfg = cfg.clone();
    let mut rejoined = if datadir::has_tombstone(&layout.member_dir()) {
        find_rejoin_target(&mut cfg, layout, prefer, cancel).await;
        Some(handle_tombstone(&cfg, layout)?)
    } else {
        None
    };
    // A rejoin stopped after the backup and before its new member served: finish it.
    let pending = if rejoined.is_none() && !layout.is_initialized() {
        datadir::rejoin_pending(&layout.db_dir())
    } else {
        None
    };
    if pending.is_some() {
        find_rejoin_target(&mut cfg, layout, prefer, cancel).await;
        if cfg.server.is_none() {
            return Err(StartError::RejoinPending {
                marker: layout.db_dir().join(datadir::REJOIN_PENDING),
            });
        }
        tracing::warn!(
            "a rejoin was under way when the agent stopped (the old member is backed up): joining again"
        );
        rejoined = Some(Rejoined {
            backup: datadir::backups(&layout.db_dir()).pop().unwrap_or_default(),
            previous_name: pending.clone().filter(|n| !n.is_empty()),
            reason: "a rejoin the agent was stopped in".into(),
            server: cfg.server.clone().unwrap_or_default(),
            resumed: true,
        });
    }
    // No member here: a join makes one, or this host is (or becomes) a worker.
    if !layout.is_initialized() {
        let worker_start = match cfg.server.clone() {
            Some(server) => {
                if worker::joins_as_member(&cfg, &server, cancel).await? {
                    None
                } else {
                    Some(worker::join_as_worker(&cfg, &server, cancel).await?)
                }
            }
            None if worker::is_worker(layout) => Some(worker::restart_worker(&cfg).await?),
            None if cfg.role == worker::JoinRole::Worker => {
                return Err(StartError::Member(MemberError::Inconsistent(
                    "--role worker runs no etcd member, so it cannot found a cluster: give --server <url of a running hostlet> --token <token>".into(),
                )))
            }
            None => None,
        };
        if let Some(w) = worker_start {
            if let Err(e) = datadir::clear_rejoin_pending(&layout.db_dir()) {
                tracing::warn!(error = %e, "the rejoin's marker could not be removed");
            }
            return Ok((Started::Worker(w), rejoined));
        }
    }
    let previous_name = rejoined.as_ref().and_then(|r| r.previous_name.clone());
    datadir::check_member_dir(&layout.member_dir())?;
    let gate = restart_gate(&cfg, layout, &binary);
    let m = LocalMember::start_on(
        &cfg,
        binary,
        layout,
        previous_name.as_deref(),
        metrics,
        readiness,
        Some(gate),
        cancel,
    )
    .await?;
    if let Err(e) = datadir::clear_rejoin_pending(&layout.db_dir()) {
        tracing::warn!(error = %e, "the rejoin's marker could not be removed");
    }
    worker::clear_marker(layout);
    Ok((Started::Member(Box::new(m)), rejoined))
}

/// A tombstone in the member dir: with a server to join through, move the dir to a backup (the join
/// makes a new member); without, refuse, so that a removed node never founds a second cluster.
fn handle_tombstone(cfg: &MemberConfig, layout: &MemberLayout) -> Result<Rejoined, StartError> {
    let dir = layout.member_dir();
    if cfg.server.is_none() {
        return Err(StartError::Tombstoned { dir });
    }
    let reason = std::fs::read_to_string(dir.join(datadir::TOMBSTONE))
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    datadir::mark_rejoin_pending(&layout.db_dir(), name_in_member_dir(&dir).as_deref())?;
    let backup = datadir::backup_member_dir(&layout.db_dir())?;
    tracing::warn!(backup = %backup.display(), "tombstone found: member data backed up; rejoining as a new member");
    Ok(Rejoined {
        previous_name: name_in_member_dir(&backup),
        backup,
        reason,
        server: cfg.server.clone().unwrap_or_default(),
        resumed: false,
    })
}

/// What a start that found a tombstone did.
#[derive(Debug, Clone)]
pub struct Rejoined {
    /// Where the old member dir went.
    pub backup: PathBuf,
    /// The old member's name, if its dir had one.
    pub previous_name: Option<String>,
    /// What the tombstone said.
    pub reason: String,
    /// The node's API the join went through.
    pub server: String,
    /// The backup was made by an earlier agent, stopped before its new member served; this start finished
    /// the rejoin.
    pub resumed: bool,
}

fn name_in_member_dir(member_dir: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(member_dir.join("name"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The other members' client URLs this node knows (from `db/endpoints`), without its own.
fn known_peers(cfg: &MemberConfig, layout: &MemberLayout) -> Vec<String> {
    let own = cfg.spec(String::new());
    let mine = [own.local_client_url(), own.client_url()];
    bootstrap::read_endpoints(layout)
        .into_iter()
        .filter(|u| !mine.contains(u))
        .collect()
}

fn peer_tls(cfg: &MemberConfig, layout: &MemberLayout) -> Option<TlsFiles> {
    (!cfg.insecure).then(|| client_tls_files(&layout.tls()))
}

/// Asks the other members known to this node whether the cluster still has this member; the reason to
/// rejoin when serving members answer and none lists it, twice in a row.
async fn left_behind(cfg: &MemberConfig, layout: &MemberLayout) -> Option<(String, String)> {
    let peers = known_peers(cfg, layout);
    let me = Identity {
        name: layout.read_name()?,
        id: 0,
    };
    let etcd = standing::peer_client(&peers, peer_tls(cfg, layout)).await?;
    let first = standing::check(&etcd, &peers, &me).await;
    if first == Standing::Member || first == Standing::Unknown {
        return None;
    }
    // Moving a member dir aside is not done on one answer: asked again after an election timeout.
    tokio::time::sleep(standing::CONFIRM_AFTER).await;
    let second = standing::check(&etcd, &peers, &me).await;
    match standing::confirmed(&first, &second) {
        Standing::Removed { by } => Some((
            format!(
                "the cluster serving at {by} no longer has member {}",
                me.name
            ),
            by,
        )),
        Standing::Member | Standing::Unknown => None,
    }
}

/// For a tombstoned member: the server to rejoin through when `--server` was not given (a voting node
/// from the node records, read through the other members, `prefer` first), and the token from the data
/// dir when `--token` was not given. The members may be busy (one restarting as a learner, say): a few
/// tries, a second apart.
async fn find_rejoin_target(
    cfg: &mut MemberConfig,
    layout: &MemberLayout,
    prefer: Option<&str>,
    cancel: &CancellationToken,
) {
    if cfg.token.as_deref().is_none_or(|t| t.trim().is_empty()) {
        cfg.token = std::fs::read_to_string(layout.token_file())
            .ok()
            .map(|t| t.trim().to_string());
    }
    if cfg.server.is_some() {
        return;
    }
    let mut peers = known_peers(cfg, layout);
    if let Some(p) = prefer {
        peers.retain(|u| u != p);
        peers.insert(0, p.to_string());
    }
    let Some(etcd) = standing::peer_client(&peers, peer_tls(cfg, layout)).await else {
        return;
    };
    let keys = hostlet_api::KeyLayout::new(&cfg.key_prefix);
    for attempt in 0..REJOIN_LOOKUPS {
        if attempt > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = cancel.cancelled() => return,
            }
        }
        cfg.server = handler::rejoin_server(&etcd, &keys, &cfg.node_name).await;
        if let Some(s) = &cfg.server {
            tracing::info!(server = %s, "rejoining through a node found in the node records");
            return;
        }
    }
    tracing::warn!(
        ?peers,
        "no node to rejoin through could be read from the other members"
    );
}

/// How often a restarted member that does not serve yet asks the other members whether it still belongs.
const LEFT_BEHIND_RECHECK: Duration = Duration::from_secs(3);

/// Tries at reading the node records through the other members before a tombstoned member gives up.
const REJOIN_LOOKUPS: u32 = 10;
