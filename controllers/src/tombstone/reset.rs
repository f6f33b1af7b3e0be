//! Cluster reset (`hostlet run --cluster-reset [--cluster-reset-restore-path FILE]`): from this member's data,
//! or from a snapshot, force a new single-member cluster, prove that it serves alone, mark the reset and
//! stop. The old member dir is moved, never deleted.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_runtime::{Etcd, EtcdConfig};

use super::datadir::{self, DataDirError, RESET_FLAG};
use crate::etcd_member::bootstrap::{read_endpoints, write_endpoints};
use crate::etcd_member::layout::{new_member_name, MemberLayout};
use crate::etcd_member::process::{resolve_binary, ClusterStart, EtcdProcess, MemberSpec};
use crate::etcd_member::version::{Capabilities, RestoreTool};
use crate::pki::client_tls_files;
use crate::snapshots::restore::{self, RestoreTarget};

/// What a reset needs to know.
#[derive(Debug, Clone)]
pub struct ResetConfig {
    pub data_dir: PathBuf,
    pub hostname: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub etcd_binary: PathBuf,
    /// The program that restores a snapshot; `None`: the one that goes with the etcd binary
    /// ([`Capabilities::restore_tool`]).
    pub restore_tool: Option<RestoreTool>,
    pub insecure: bool,
    pub restore_path: Option<PathBuf>,
    /// `--snapshot-encryption-key-file`: an encrypted snapshot is opened with it.
    pub key: Option<crate::snapshots::encryption::SnapshotKey>,
    /// Members named lost on purpose (`--cluster-reset-lost`: client URLs, or `all`): their silence is
    /// accepted; an answer from one still refuses the reset.
    pub lost: Vec<String>,
}

/// Why a reset was refused or failed. A refusal happens before anything on disk is touched.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error(
        "a cluster reset was done already ({flag} exists): start hostlet normally, or reset again from a \
         snapshot with --cluster-reset-restore-path FILE (to reset again from this member's own data on \
         purpose, move {flag} away first)"
    )]
    AlreadyReset { flag: String },
    #[error("--cluster-reset-restore-path {path}: {why}")]
    BadSnapshot { path: String, why: String },
    #[error("--cluster-reset-restore-path {path}: no such file")]
    SnapshotMissing { path: String },
    #[error("nothing to reset: {dir} holds no etcd member; give --cluster-reset-restore-path FILE to start from a snapshot")]
    NoMember { dir: String },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(
        "the cluster still serves at {by} with this member ({member}) in it: a reset would split it in two. \
         A reset is for a lost quorum: stop hostlet on the other nodes first, or, to take this node out of a \
         healthy cluster, use `hostlet node delete` or the tombstone request key"
    )]
    QuorumAlive { by: String, member: String },
    #[error(
        "the member at {by} answers and still lists this member ({member}), with no leader yet (an election \
         may be under way): with this member it can form a quorum again, and a reset would split the cluster \
         in two. Stop hostlet on the other nodes first; a reset is for members that are gone"
    )]
    PeerHoldsUs { by: String, member: String },
    #[error(
        "the member at {by} answers but has no leader: it is alive and may form a quorum again, and a reset \
         would split the cluster in two. Stop hostlet on the other nodes first, or, if that member is lost for \
         good and only its etcd still runs, stop that etcd"
    )]
    PeerAlive { by: String },
    #[error(
        "the cluster serving at {by} goes on without this member ({member}): it was removed or left behind. \
         Start hostlet normally instead: it backs its member dir up and rejoins that cluster"
    )]
    ClusterMovedOn { by: String, member: String },
    #[error(
        "could not establish that the other members are down ({peers}): a reset needs each one shown down \
         (its host refusing connections every time it is asked, for {span_s} s) or named lost. Stop hostlet \
         and etcd on those hosts and try again, or, if a member is lost for good (its host dead or cut off), \
         name it: --cluster-reset-lost URL (once per member, or --cluster-reset-lost all)"
    )]
    PeersUnsettled { peers: String, span_s: u64 },
    #[error(
        "{file} is missing: this node cannot tell which members its cluster had, so it cannot show them \
         down. If every other member is lost for good, give --cluster-reset-lost all"
    )]
    NoPeerList { file: String },
    #[error("etcd binary {0} not found")]
    BinaryMissing(String),
    #[error("{0}")]
    Version(String),
    #[error("restoring the snapshot: {0}")]
    Restore(String),
    #[error("starting etcd: {0}")]
    Spawn(std::io::Error),
    #[error("etcd did not serve alone within {secs} s after the reset; see {log}")]
    NotServing { secs: u64, log: String },
}

impl ResetError {
    /// The reset was refused on purpose — the snapshot will not do, or the cluster or this member's
    /// state forbids it — rather than failing on the way (exit 4, where a failure exits 1).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ResetError::AlreadyReset { .. }
                | ResetError::BadSnapshot { .. }
                | ResetError::NoMember { .. }
                | ResetError::QuorumAlive { .. }
                | ResetError::PeerHoldsUs { .. }
                | ResetError::PeerAlive { .. }
                | ResetError::ClusterMovedOn { .. }
                | ResetError::PeersUnsettled { .. }
                | ResetError::NoPeerList { .. }
        )
    }
}

/// What the reset did, for the message to the operator.
#[derive(Debug, Clone)]
pub struct ResetOutcome {
    pub member_name: String,
    pub restored_from: Option<PathBuf>,
    pub old_dir: Option<PathBuf>,
    pub revision: i64,
}

/// Runs the whole reset and returns once the single member served and was stopped again.
pub async fn cluster_reset(cfg: &ResetConfig) -> Result<ResetOutcome, ResetError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let flag = layout.db_dir().join(RESET_FLAG);
    // Every check first: nothing on disk changes when one fails.
    if flag.exists() && cfg.restore_path.is_none() {
        return Err(ResetError::AlreadyReset {
            flag: flag.display().to_string(),
        });
    }
    let binary = resolve_binary(&cfg.etcd_binary)
        .ok_or_else(|| ResetError::BinaryMissing(cfg.etcd_binary.display().to_string()))?;
    if let Some(p) = &cfg.restore_path {
        let shown = p.display().to_string();
        let meta = std::fs::metadata(p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ResetError::SnapshotMissing {
                path: shown.clone(),
            },
            _ => ResetError::BadSnapshot {
                path: shown.clone(),
                why: e.to_string(),
            },
        })?;
        if !meta.is_file() {
            return Err(ResetError::BadSnapshot {
                path: shown,
                why: "not a file".into(),
            });
        }
        restore::check(p, cfg.key.as_ref(), |_| {}).map_err(|e| ResetError::BadSnapshot {
            path: shown,
            why: e.to_string(),
        })?;
    } else if !datadir::check_member_dir(&layout.member_dir())? {
        return Err(ResetError::NoMember {
            dir: layout.member_dir().display().to_string(),
        });
    }

    let name = layout
        .read_name()
        .unwrap_or_else(|| new_member_name(&cfg.hostname));
    let tls = (!cfg.insecure).then(|| layout.tls());
    let spec = MemberSpec {
        name: name.clone(),
        data_dir: layout.member_dir(),
        // Loopback only: nobody else may reach the member while it is reset.
        advertise: "127.0.0.1".into(),
        client_port: cfg.client_port,
        peer_port: cfg.peer_port,
        tls: tls.clone(),
    };
    unable_to_form_a_quorum(&layout, &spec, &name, tls.as_ref(), &cfg.lost).await?;
    let mut old_dir = None;
    if let Some(p) = &cfg.restore_path {
        let tool = match &cfg.restore_tool {
            Some(t) => t.clone(),
            None => Capabilities::probe(&binary)
                .await
                .map_err(|e| ResetError::Version(e.to_string()))?
                .restore_tool(),
        };
        old_dir = datadir::move_aside_for_restore(&layout.db_dir())?;
        let target = RestoreTarget {
            member_dir: layout.member_dir(),
            name: name.clone(),
            peer_url: spec.peer_url(),
            tool,
        };
        restore::restore(p, cfg.key.as_ref(), &target, |_| {})
            .map_err(|e| ResetError::Restore(e.to_string()))?;
        let _ =
            crate::files::write_atomic(&layout.name_file(), format!("{name}\n").as_bytes(), 0o600);
    }
    // A tombstone from before is moot: this member becomes the cluster.
    let _ = std::fs::remove_file(layout.member_dir().join(datadir::TOMBSTONE));

    let mut args = spec.args(&ClusterStart::Existing);
    args.push("--force-new-cluster=true".into());
    let log = layout.etcd_log();
    let child = EtcdProcess::spawn(&binary, &args, &log).map_err(ResetError::Spawn)?;
    let mut etcd_cfg = EtcdConfig::new([spec.local_client_url()]);
    if let Some(t) = &tls {
        etcd_cfg = etcd_cfg.with_tls(client_tls_files(t));
    }
    let served = wait_alone(etcd_cfg, Duration::from_secs(60)).await;
    let _ = child.stop(Duration::from_secs(15)).await;
    let revision = served.ok_or_else(|| ResetError::NotServing {
        secs: 60,
        log: log.display().to_string(),
    })?;
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let how = match &cfg.restore_path {
        Some(p) => format!("restored from {}", p.display()),
        None => "from the member's own data".to_string(),
    };
    // The member is alone now: the other members' URLs are forgotten, so that this member's next start
    // does not ask members left behind whether it still belongs (they would not know).
    write_endpoints(&layout, &[spec.local_client_url()]);
    // One line per reset: the flag is also the node's record of how many there were.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&flag)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, format!("reset at {unix} {how}\n").as_bytes())
        })
        .map_err(|e| DataDirError::Io {
            dir: flag.display().to_string(),
            source: e,
        })?;
    Ok(ResetOutcome {
        member_name: name,
        restored_from: cfg.restore_path.clone(),
        old_dir,
        revision,
    })
}

/// Succeeds only when the other members this node knows (`db/endpoints`) are shown unable to form a
/// quorum with it ([`quorum::judge`]). This member's own etcd is not running (the data dir is locked), so
/// only the others can answer.
async fn unable_to_form_a_quorum(
    layout: &MemberLayout,
    spec: &MemberSpec,
    name: &str,
    tls: Option<&crate::pki::TlsDir>,
    lost: &[String],
) -> Result<(), ResetError> {
    use super::quorum::{self, Asking, Refusal, Verdict};
    use super::standing::{self, Identity};
    let file = crate::etcd_member::bootstrap::endpoints_file(layout);
    if !file.exists() && !lost.iter().any(|l| l.trim() == "all") {
        return Err(ResetError::NoPeerList {
            file: file.display().to_string(),
        });
    }
    let own = spec.local_client_url();
    let peers: Vec<String> = read_endpoints(layout)
        .into_iter()
        .filter(|u| *u != own && *u != spec.client_url())
        .collect();
    if peers.is_empty() {
        return Ok(());
    }
    let asking = Asking::default();
    let verdict = match standing::peer_client(&peers, tls.map(client_tls_files)).await {
        Some(etcd) => {
            let me = Identity {
                name: name.to_string(),
                id: 0,
            };
            quorum::ask_until_settled(&etcd, &peers, lost, &me, asking).await
        }
        // Without a client nobody was asked: nothing is shown.
        None => Verdict::Refuse(Refusal::Unsettled {
            peers: peers
                .iter()
                .map(|p| (p.clone(), "cannot build a client to ask it".to_string()))
                .collect(),
        }),
    };
    let member = name.to_string();
    match verdict {
        Verdict::Proceed => Ok(()),
        Verdict::Refuse(r) => Err(match r {
            Refusal::Holds { by, leader: true } => ResetError::QuorumAlive { by, member },
            Refusal::Holds { by, leader: false } => ResetError::PeerHoldsUs { by, member },
            Refusal::Alive { by } => ResetError::PeerAlive { by },
            Refusal::MovedOn { by } => ResetError::ClusterMovedOn { by, member },
            Refusal::Unsettled { peers } => ResetError::PeersUnsettled {
                peers: peers
                    .iter()
                    .map(|(p, heard)| format!("{p}: {heard}"))
                    .collect::<Vec<_>>()
                    .join("; "),
                span_s: asking.span.as_secs(),
            },
        }),
    }
}

/// How many resets this data dir records: one line each in `db/reset-flag` and `db/reset-history`.
pub fn resets_recorded(db_dir: &Path) -> u64 {
    [RESET_FLAG, datadir::RESET_HISTORY]
        .iter()
        .map(|f| {
            std::fs::read_to_string(db_dir.join(f))
                .map(|s| s.lines().filter(|l| !l.trim().is_empty()).count() as u64)
                .unwrap_or(0)
        })
        .sum()
}

/// Waits until the member serves and is the only member; returns the revision it serves.
async fn wait_alone(cfg: EtcdConfig, timeout: Duration) -> Option<i64> {
    let deadline = tokio::time::Instant::now() + timeout;
    let etcd = Etcd::connect(cfg).await.ok()?;
    while tokio::time::Instant::now() < deadline {
        let ok = async {
            let members = etcd.member_list().await.ok()?;
            let status = etcd.status_of(&etcd.current_endpoint()).await.ok()?;
            let header = status.header()?;
            (members.len() == 1 && status.leader() == header.member_id()).then(|| header.revision())
        }
        .await;
        if let Some(rev) = ok {
            return Some(rev);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// What to tell the operator after a reset.
pub fn next_steps(outcome: &ResetOutcome, data_dir: &Path) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "cluster reset done: member {} now forms a single-member cluster (revision {}).\n",
        outcome.member_name, outcome.revision
    ));
    if let Some(p) = &outcome.restored_from {
        s.push_str(&format!("  data restored from {}\n", p.display()));
    }
    if let Some(old) = &outcome.old_dir {
        s.push_str(&format!(
            "  the previous member dir was moved to {}\n",
            old.display()
        ));
    }
    s.push_str(&format!(
        "Next:\n  1. start hostlet on this node normally (without --cluster-reset);\n  \
         2. start hostlet on the other nodes as they were, data dirs and all: each finds that the cluster moved \
         on without it, backs its member up under <data-dir>/db/etcd-backup-<unix> and rejoins this node as a \
         new member. Nothing needs deleting. A node that knows no other member of this cluster needs \
         --server <this node's API URL> --token <the token in {}>.\n",
        data_dir.join("token").display()
    ));
    s
}
