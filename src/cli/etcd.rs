//! `hostlet etcd …`: the cluster's etcd: snapshots, members, status and maintenance.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Subcommand;
use hostlet_api::objects::{check_snapshot_name, SnapshotRequest, SnapshotRequestState};
use hostlet_api::objects::{
    RemoteCopy, RemoteState, SnapshotPolicy, SnapshotRecord, SnapshotStatus,
};
use hostlet_controllers::etcd_member::MemberLayout;
use hostlet_controllers::snapshots::catalogue::Catalogue;
use hostlet_controllers::snapshots::encryption::SnapshotKey;
use hostlet_controllers::snapshots::metrics::SnapshotMetrics;
use hostlet_controllers::snapshots::policy::{EffectivePolicy, S3Flags, SnapshotSettings};
use hostlet_controllers::snapshots::remote::{parse_s3_url, Remote, RemoteError};
use hostlet_controllers::snapshots::restore::{self, RestoreTarget};
use hostlet_controllers::snapshots::sync::RemoteSync;

use super::cluster::{human_bytes, print_structured, print_table, AgentInfo, ClusterArgs, Output};
use super::exit::CliError;
use super::progress::Progress;
use crate::config::SnapshotS3Args;

#[derive(Debug, Subcommand)]
pub enum EtcdCommand {
    /// Snapshots of the etcd database: save, list, prune, delete, restore.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// The members: name, id, role, node, URLs, applied index, db size, leader mark, learner progress.
    Members {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Per member: etcd release, cluster and storage version, db size, in use, fragmentation, quota, alarms,
    /// leader, raft index.
    Status {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Defragment every member (followers first, the leader last after handing leadership over), or one,
    /// through the maintenance lock.
    Defrag {
        /// Only this member (name or hex id).
        #[arg(long)]
        member: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// The rolling etcd upgrade: status (each member's running and on-disk release, and who waits for what).
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
    /// Compact the history (physically) up to the current revision, through the maintenance lock.
    Compact {
        /// Keep this many revisions before the current one.
        #[arg(long, default_value_t = 0)]
        keep: i64,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum UpgradeCommand {
    /// Per member: the release it runs, the one its agent's binary holds now, and where the roll stands.
    Status {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Ask the node's agent for a snapshot now; shows its progress and, with object storage set, its
    /// upload's, then prints the record.
    Save {
        /// Name of the snapshot (file `<name>-<node>-<unix>`); retention counts it by this name.
        #[arg(long)]
        name: Option<String>,
        /// Give up waiting after this long.
        #[arg(long, default_value = "10m", value_parser = hostlet_api::objects::parse_duration)]
        timeout: Duration,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the snapshots of every node, from their records: the local file and the object-storage copy.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Apply retention now on this node, as its agent does: the newest N local files per name, and the newest
    /// M objects per name under this node's prefix; everything beyond goes. N, M and the target come from the
    /// agent's flags and config file (its agent.json) under the policy keys, unless given here.
    Prune {
        /// Local files kept per name [default: the agent's setting].
        #[arg(long)]
        retention: Option<u32>,
        /// Objects kept per name [default: the agent's setting].
        #[arg(long)]
        s3_retention: Option<u32>,
        /// The node's snapshot dir [default: <data-dir>/db/snapshots].
        #[arg(long, value_parser = crate::paths::absolute)]
        dir: Option<PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete one snapshot of this node (file and record), by file name.
    Delete {
        /// The snapshot's file name, as `snapshot ls` shows it.
        file: String,
        /// The node's snapshot dir [default: <data-dir>/db/snapshots].
        #[arg(long, value_parser = crate::paths::absolute)]
        dir: Option<PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Offline: check a snapshot file, or download an `s3://bucket/key` object, and restore it as a fresh
    /// member dir under `<data-dir>/db/etcd`. An encrypted snapshot is decrypted and authenticated with
    /// --snapshot-encryption-key-file; a plain one is checked against etcd's sha256 trailer.
    #[command(
        mut_arg("snapshot_s3_bucket", |a| a.help("Ignored here: the bucket is the s3:// URL's (the flag is shared with `hostlet run`)")),
        mut_arg("snapshot_s3_prefix", |a| a.help("Ignored here: the key is the s3:// URL's (the flag is shared with `hostlet run`)"))
    )]
    Restore {
        /// A snapshot file, or an `s3://bucket/key` object.
        #[arg(value_parser = crate::paths::absolute_or_s3)]
        file: PathBuf,
        /// The data dir to restore into; its db/etcd must not exist (not needed with --check-only).
        #[arg(long, required_unless_present = "check_only", value_parser = crate::paths::absolute)]
        data_dir: Option<PathBuf>,
        /// Member name [default: <hostname>-<8 hex>].
        #[arg(long)]
        name: Option<String>,
        /// The restored member's peer URL.
        #[arg(long, default_value = "https://127.0.0.1:2380")]
        peer_url: String,
        /// Only check the file (hash, size), restore nothing.
        #[arg(long)]
        check_only: bool,
        /// The snapshot key file (64 hex digits, owner-only) an encrypted snapshot was made with.
        #[arg(long, value_name = "FILE", value_parser = crate::paths::absolute)]
        snapshot_encryption_key_file: Option<PathBuf>,
        /// The etcd the restored member will run: etcdutl beside it (3.5 and later) or etcdctl (3.4) writes the
        /// member dir (a bare name is looked up on PATH).
        #[arg(long, env = "HOSTLET_ETCD_BINARY", default_value = "etcd", value_parser = crate::paths::program)]
        etcd_binary: PathBuf,
        /// The program that writes the member dir instead (etcdutl, or a 3.4 etcdctl) [default: the one that
        /// goes with --etcd-binary].
        #[arg(long, value_parser = crate::paths::program)]
        etcdctl: Option<PathBuf>,
        /// Endpoint, region, CA and credentials of an `s3://` source (the bucket is the URL's).
        #[command(flatten)]
        s3: SnapshotS3Args,
    },
}

pub fn execute(cmd: EtcdCommand) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hostlet: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cmd {
            EtcdCommand::Snapshot(s) => snapshot(s).await,
            EtcdCommand::Members { cluster } => members(&cluster).await,
            EtcdCommand::Status { cluster } => super::etcd_upkeep::status(&cluster).await,
            EtcdCommand::Defrag { member, cluster } => {
                super::etcd_upkeep::defrag(&cluster, member.as_deref()).await
            }
            EtcdCommand::Upgrade(UpgradeCommand::Status { cluster }) => {
                super::etcd_upgrade::status(&cluster).await
            }
            EtcdCommand::Compact { keep, cluster } => {
                super::etcd_upkeep::compact(&cluster, keep).await
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => e.report(),
    }
}

fn snapshot_dir(cluster: &ClusterArgs, dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| cluster.data_dir().join("db").join("snapshots"))
}

async fn snapshot(cmd: SnapshotCommand) -> Result<ExitCode, CliError> {
    match cmd {
        SnapshotCommand::Save {
            name,
            timeout,
            cluster,
        } => save(name, timeout, &cluster).await,
        SnapshotCommand::Ls { cluster } => ls(&cluster).await,
        SnapshotCommand::Prune {
            retention,
            s3_retention,
            dir,
            cluster,
        } => prune(retention, s3_retention, dir, &cluster).await,
        SnapshotCommand::Delete { file, dir, cluster } => delete(&file, dir, &cluster).await,
        SnapshotCommand::Restore {
            file,
            data_dir,
            name,
            peer_url,
            check_only,
            snapshot_encryption_key_file,
            etcd_binary,
            etcdctl,
            s3,
        } => {
            // The key first: nothing is downloaded or written for a snapshot that could not be opened.
            let key = snapshot_encryption_key_file
                .as_deref()
                .map(SnapshotKey::load)
                .transpose()
                .map_err(|e| CliError::refused(e.to_string()))?;
            let tool = RestoreToolChoice {
                etcd_binary,
                etcdctl,
            };
            let url = file.to_string_lossy().into_owned();
            if !url.starts_with("s3://") {
                return restore_cmd(
                    &file,
                    data_dir.as_deref(),
                    name,
                    peer_url,
                    check_only,
                    key.as_ref(),
                    tool,
                )
                .await;
            }
            s3.check().map_err(CliError::refused)?;
            // `--check-only` needs no data dir: the download goes to a folder of its own then.
            let scratch =
                std::env::temp_dir().join(format!("hostlet-restore-{}", std::process::id()));
            let base = data_dir.clone().unwrap_or_else(|| scratch.clone());
            let local = match download_s3(&url, &s3, &base).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = std::fs::remove_dir(&scratch); // only when empty
                    return Err(remote_error(e));
                }
            };
            eprintln!("downloaded {url}; checking it as a snapshot");
            let result = restore_cmd(
                &local,
                data_dir.as_deref(),
                name,
                peer_url,
                check_only,
                key.as_ref(),
                tool,
            )
            .await;
            let _ = std::fs::remove_file(&local);
            if let Some(dir) = local.parent() {
                let _ = std::fs::remove_dir(dir); // only when empty
            }
            let _ = std::fs::remove_dir(&scratch);
            result
        }
    }
}

async fn save(
    name: Option<String>,
    timeout: Duration,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    if let Some(n) = &name {
        check_snapshot_name(n).map_err(CliError::refused)?;
    }
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let node = cluster.node();
    let key = keys.snapshot_request(&node);
    let id = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let request = SnapshotRequest {
        name: name.clone(),
        id: Some(id.clone()),
        ..Default::default()
    };
    // A refused request's answer stays in the key for the operator; only one not yet answered is pending.
    if let Some(kv) = etcd.get(&key).await? {
        let answered = serde_json::from_slice::<SnapshotRequest>(kv.value()).is_ok_and(|r| {
            r.state
                .as_ref()
                .is_some_and(SnapshotRequestState::is_answer)
        });
        if !answered {
            return Err(CliError::refused(format!(
                "a snapshot request for node {node} is pending already ({key})"
            )));
        }
    }
    let rev = etcd
        .put(&key, serde_json::to_vec(&request).unwrap_or_default())
        .await?;
    let (_watcher, mut stream) = etcd.watch_prefix(&key, rev).await?;
    eprintln!("requested a snapshot of node {node}; waiting for its agent");
    // The snapshot is about the size of the db file: the bar's estimate.
    let db_size = etcd
        .status_all()
        .await
        .into_iter()
        .find_map(|(_, s)| s.ok())
        .and_then(|s| u64::try_from(s.db_size()).ok())
        .filter(|s| *s > 0);
    let mut received = Some(Progress::estimated("received", db_size));
    // The upload shown now: its file and, until it ends, its bar.
    let mut upload: Option<(String, Option<Progress>)> = None;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let msg = match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => {
                let _ = etcd.delete(&key).await;
                return Err(CliError::unreachable(format!(
                    "no answer from node {node}'s agent within {}; request withdrawn",
                    humantime::format_duration(timeout)
                )));
            }
            Ok(Err(e)) => return Err(CliError::unreachable(format!("watching {key}: {e}"))),
            Ok(Ok(None)) => return Err(CliError::unreachable(format!("watch on {key} ended"))),
            Ok(Ok(Some(m))) => m,
        };
        for ev in msg.events() {
            let Some(kv) = ev.kv() else { continue };
            let Ok(answer) = serde_json::from_slice::<SnapshotRequest>(kv.value()) else {
                continue;
            };
            if answer.id.as_deref() != Some(id.as_str()) {
                continue;
            }
            match answer.state {
                Some(SnapshotRequestState::Running) => {
                    if let (Some(b), Some(p)) = (answer.progress_bytes, received.as_mut()) {
                        p.update(b);
                    }
                    let Some(u) = answer.upload else { continue };
                    // Uploads follow the snapshot: it is complete.
                    if let Some(p) = received.take() {
                        p.finish(answer.progress_bytes.unwrap_or(0));
                    }
                    if upload.as_ref().is_none_or(|(file, _)| *file != u.file) {
                        // The pass moved on to another file (an earlier snapshot's retry); a bar left
                        // short is one whose upload failed, its record says why.
                        if let Some(bar) = upload.take().and_then(|(_, bar)| bar) {
                            bar.abandon();
                        }
                        eprintln!("uploading {} to {}", u.file, u.url);
                        upload = Some((
                            u.file.clone(),
                            Some(Progress::new("uploaded", Some(u.total_bytes))),
                        ));
                    }
                    if let Some((_, bar)) = upload.as_mut() {
                        if let Some(b) = bar.as_mut() {
                            b.update(u.sent_bytes);
                        }
                        if u.finished() {
                            if let Some(b) = bar.take() {
                                b.finish(u.sent_bytes);
                            }
                        }
                    }
                }
                Some(SnapshotRequestState::Done) => {
                    if let Some(p) = received.take() {
                        let size = answer.record.as_ref().map(|r| r.size);
                        p.finish(size.or(answer.progress_bytes).unwrap_or(0));
                    }
                    if let Some(bar) = upload.take().and_then(|(_, bar)| bar) {
                        bar.abandon();
                    }
                    if let Some(rec) = answer.record {
                        if let Some(line) = rec.remote.as_ref().map(remote_line) {
                            eprintln!("{line}");
                        }
                        print_records(&[rec], cluster.output);
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                Some(state) => {
                    if let Some(p) = received.take() {
                        p.abandon();
                    }
                    if let Some(bar) = upload.take().and_then(|(_, bar)| bar) {
                        bar.abandon();
                    }
                    let message = format!(
                        "snapshot {state}: {}",
                        answer.error.unwrap_or_else(|| "no reason given".into())
                    );
                    // `busy`: the agent refused, another snapshot runs; `failed`: it tried or refused.
                    return Err(if state == SnapshotRequestState::Busy {
                        CliError::refused(message)
                    } else {
                        message.into()
                    });
                }
                None => {}
            }
        }
    }
}

/// What became of a saved snapshot's object-storage copy, in a line.
fn remote_line(c: &RemoteCopy) -> String {
    match c.state {
        RemoteState::Ok => format!("remote copy ok: {} (size and sha256 read back)", c.url),
        RemoteState::Failed => format!(
            "remote copy failed: {}: {}; the agent retries it on every run",
            c.url,
            c.error.as_deref().unwrap_or("no reason given")
        ),
        RemoteState::Pruned => format!(
            "remote copy not kept: {} is beyond the remote retention",
            c.url
        ),
    }
}

async fn records(
    cluster: &ClusterArgs,
    node: Option<&str>,
) -> Result<Vec<SnapshotRecord>, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let prefix = match node {
        Some(n) => keys.node_snapshots_prefix(n),
        None => keys.snapshots_prefix(),
    };
    let (kvs, _) = etcd.get_prefix(prefix).await?;
    let mut out: Vec<SnapshotRecord> = kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    out.sort_by(|a, b| (&a.node, a.created, &a.file).cmp(&(&b.node, b.created, &b.file)));
    Ok(out)
}

fn print_records(recs: &[SnapshotRecord], output: Output) {
    if output.structured() {
        print_structured(&recs, output);
        return;
    }
    let rows: Vec<Vec<String>> = recs
        .iter()
        .map(|r| {
            vec![
                r.node.clone(),
                r.file.clone(),
                human_bytes(r.size),
                r.revision.to_string(),
                humantime::format_rfc3339_seconds(r.created.0).to_string(),
                match r.status {
                    SnapshotStatus::Successful => "ok".to_string(),
                    SnapshotStatus::Failed => {
                        format!("failed: {}", r.error.as_deref().unwrap_or(""))
                    }
                },
                if r.local { "yes" } else { "deleted" }.to_string(),
                match &r.remote {
                    None => "-".to_string(),
                    Some(c) => match c.state {
                        RemoteState::Ok => format!("ok {}", c.url),
                        RemoteState::Pruned => "pruned".to_string(),
                        RemoteState::Failed => format!(
                            "failed ({} attempts): {}",
                            c.attempts,
                            c.error.as_deref().unwrap_or("")
                        ),
                    },
                },
            ]
        })
        .collect();
    print_table(
        &[
            "NODE", "FILE", "SIZE", "REVISION", "CREATED", "STATUS", "LOCAL", "REMOTE",
        ],
        &rows,
    );
}

async fn ls(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let recs = records(cluster, None).await?;
    print_records(&recs, cluster.output);
    Ok(ExitCode::SUCCESS)
}

async fn remove_snapshot(
    cluster: &ClusterArgs,
    dir: &std::path::Path,
    node: &str,
    file: &str,
) -> Result<(), CliError> {
    let path = dir.join(file);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display()).into()),
    }
    let etcd = cluster.connect().await?;
    etcd.delete(cluster.keys().snapshot_record(node, file))
        .await?;
    Ok(())
}

/// A policy key's value, or `None` when it is absent, empty or invalid (as the agent, which ignores an
/// invalid key with a warning).
async fn policy_key(etcd: &hostlet_runtime::Etcd, key: &str) -> Option<SnapshotPolicy> {
    let kv = etcd.get(key).await.ok()??;
    if kv.value().iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match yaml_serde::from_slice::<SnapshotPolicy>(kv.value()) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("warning: {key}: {e}; ignored, as the agent does");
            None
        }
    }
}

async fn prune(
    retention: Option<u32>,
    s3_retention: Option<u32>,
    dir: Option<PathBuf>,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let agent = AgentInfo::load(&cluster.data_dir()).and_then(|a| a.snapshots);
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let default_schedule = "0 */12 * * *";
    let settings = SnapshotSettings {
        node: node.clone(),
        dir: dir
            .or_else(|| agent.as_ref().map(|a| a.dir.clone()))
            .unwrap_or_else(|| snapshot_dir(cluster, None)),
        keys: keys.clone(),
        schedule: agent
            .as_ref()
            .map(|a| a.schedule.clone())
            .unwrap_or_else(|| default_schedule.to_string()),
        retention: agent.as_ref().map(|a| a.retention).unwrap_or(5),
        compress: agent.as_ref().is_some_and(|a| a.compress),
        disabled: agent.as_ref().is_some_and(|a| a.disabled),
        jitter: Duration::ZERO,
        local: hostlet_runtime::EtcdConfig::new(Vec::<String>::new()),
        s3: S3Flags {
            policy: agent.as_ref().map(|a| a.s3.clone()).unwrap_or_default(),
            virtual_hosted: agent.as_ref().is_some_and(|a| a.s3_virtual_hosted),
            ca_file: agent.as_ref().and_then(|a| a.s3_ca_file.clone()),
            credentials_file: agent.as_ref().and_then(|a| a.s3_credentials_file.clone()),
            allow_http: agent.as_ref().is_some_and(|a| a.s3_allow_http),
        },
        key: None,
        disk: None,
    };
    let cluster_policy = policy_key(&etcd, &keys.snapshot_policy()).await;
    let node_policy = policy_key(&etcd, &keys.node_snapshot_policy(&node)).await;
    let fallback = hostlet_controllers::snapshots::schedule::Schedule::parse(default_schedule)
        .map_err(|e| e.to_string())?;
    let mut policy = EffectivePolicy::layer(
        &settings,
        cluster_policy.as_ref(),
        node_policy.as_ref(),
        fallback,
    );
    if let Some(r) = retention {
        policy.retention = r;
    }
    if let Some(r) = s3_retention {
        policy.s3_retention = r;
    }
    let catalogue = Catalogue::of(&settings, etcd.clone());
    let gone = catalogue.prune(policy.retention).await?;
    for f in &gone {
        println!("deleted {f}");
    }
    println!(
        "{} snapshot(s) deleted, retention {}",
        gone.len(),
        policy.retention
    );
    if let Some(target) = &policy.s3 {
        let events = hostlet_controllers::events::EventRecorder::new(etcd, keys, node.clone());
        // A one-off pass: its metrics go nowhere.
        let metrics = SnapshotMetrics::new(hostlet_runtime::Metrics::new().registry())
            .map_err(|e| e.to_string())?;
        let deleted = RemoteSync::new(catalogue, events, std::sync::Arc::new(metrics))
            .sync(&policy, false, &mut |_| {})
            .await
            .map_err(|e| e.to_string())?;
        let remote = Remote::new(target).map_err(remote_error)?;
        for f in &deleted {
            println!("deleted object {}", remote.url(&node, f));
        }
        println!(
            "{} object(s) deleted under this node's prefix, retention {}",
            deleted.len(),
            policy.s3_retention
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A download that does not match its object's size or sha256 is refused; a missing one is "not found".
fn remote_error(e: RemoteError) -> CliError {
    let message = e.to_string();
    if e.is_not_found() {
        return CliError::not_found(message);
    }
    match e {
        RemoteError::BadHash { .. } | RemoteError::BadSize { .. } | RemoteError::Config(_) => {
            CliError::refused(message)
        }
        _ => message.into(),
    }
}

/// Downloads `s3://bucket/key` with the `s3` settings into `<data_dir>/restore-download/` (0700, through a
/// 0600 `.part`), checking its size; returns the file. The caller checks it as a snapshot.
pub async fn download_s3(
    url: &str,
    s3: &SnapshotS3Args,
    data_dir: &std::path::Path,
) -> Result<PathBuf, RemoteError> {
    let Some((bucket, key)) = parse_s3_url(url) else {
        return Err(RemoteError::Config(format!(
            "{url:?}: must be s3://<bucket>/<key>"
        )));
    };
    let remote = Remote::new(&s3.target_for(&bucket))?;
    let dir = data_dir.join("restore-download");
    hostlet_controllers::snapshots::file::private_dir(&dir).map_err(|source| RemoteError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let file = key.rsplit('/').next().unwrap_or(&key);
    let dest = dir.join(file);
    let mut bar: Option<Progress> = None;
    let got = remote
        .download_with(&key, &dest, |n, total| {
            bar.get_or_insert_with(|| Progress::new("downloaded", Some(total)))
                .update(n)
        })
        .await;
    match (bar, &got) {
        (Some(b), Ok(size)) => b.finish(*size),
        (Some(b), Err(_)) => b.abandon(),
        (None, _) => {}
    }
    if got.is_err() {
        // A refused download leaves nothing behind, not even its folder.
        let _ = std::fs::remove_dir(&dir); // only when empty
    }
    got?;
    Ok(dest)
}

async fn delete(
    file: &str,
    dir: Option<PathBuf>,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let dir = snapshot_dir(cluster, dir);
    if file.contains('/') {
        return Err(CliError::refused(format!(
            "{file:?}: give the file name as `snapshot ls` shows it, not a path"
        )));
    }
    let known = records(cluster, Some(&node))
        .await?
        .iter()
        .any(|r| r.file == file);
    if !known && !dir.join(file).exists() {
        return Err(CliError::not_found(format!(
            "no snapshot {file:?} on node {node}"
        )));
    }
    remove_snapshot(cluster, &dir, &node, file).await?;
    println!("deleted {file}");
    Ok(ExitCode::SUCCESS)
}

/// A snapshot file that is missing is "not found"; one that fails its check is refused.
fn restore_error(e: restore::RestoreError) -> CliError {
    use hostlet_controllers::snapshots::file::SnapshotFileError as F;
    let message = e.to_string();
    match e {
        restore::RestoreError::File(F::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            CliError::not_found(message)
        }
        restore::RestoreError::File(
            F::BadSize { .. } | F::BadHash { .. } | F::IsDir { .. } | F::Encrypted { .. },
        )
        | restore::RestoreError::Exists(_) => CliError::refused(message),
        _ => message.into(),
    }
}

/// `--etcd-binary` and `--etcdctl` of `snapshot restore`: which program writes the member dir.
struct RestoreToolChoice {
    etcd_binary: PathBuf,
    etcdctl: Option<PathBuf>,
}

impl RestoreToolChoice {
    async fn resolve(self) -> Result<restore::RestoreTool, CliError> {
        use hostlet_controllers::etcd_member::{process::resolve_binary, version::Capabilities};
        if let Some(p) = self.etcdctl {
            return Ok(restore::RestoreTool::named(p));
        }
        let binary = resolve_binary(&self.etcd_binary).ok_or_else(|| {
            CliError::not_found(format!(
                "--etcd-binary {}: not found (give the etcd the member will run, or --etcdctl)",
                self.etcd_binary.display()
            ))
        })?;
        let caps = Capabilities::probe(&binary)
            .await
            .map_err(|e| CliError::from(format!("--etcd-binary: {e}")))?;
        Ok(caps.restore_tool())
    }
}

async fn restore_cmd(
    file: &std::path::Path,
    data_dir: Option<&std::path::Path>,
    name: Option<String>,
    peer_url: String,
    check_only: bool,
    key: Option<&SnapshotKey>,
    tool: RestoreToolChoice,
) -> Result<ExitCode, CliError> {
    use hostlet_controllers::snapshots::file::{is_encrypted, is_zstd};
    // A compressed (or encrypted, perhaps compressed) file's progress counts the bytes it opens to: no
    // known total.
    let total = match (is_zstd(file), is_encrypted(file)) {
        (Ok(false), Ok(false)) => std::fs::metadata(file).ok().map(|m| m.len()),
        _ => None,
    };
    let mut progress = Progress::new("checked", total);
    if check_only {
        let size = restore::check(file, key, |b| progress.update(b)).map_err(restore_error)?;
        progress.finish(size);
        println!(
            "{}: a whole snapshot, {} ({}sha256 trailer matches)",
            file.display(),
            human_bytes(size),
            if key.is_some() {
                "decrypted and authenticated, "
            } else {
                ""
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    // clap requires --data-dir unless --check-only.
    let Some(data_dir) = data_dir else {
        return Err(CliError {
            exit: super::exit::Exit::Usage,
            message: "--data-dir is needed to restore (or give --check-only)".into(),
        });
    };
    let layout = MemberLayout::new(data_dir);
    let name = name.unwrap_or_else(|| {
        hostlet_controllers::etcd_member::layout::new_member_name(&crate::config::hostname())
    });
    let target = RestoreTarget {
        member_dir: layout.member_dir(),
        name: name.clone(),
        peer_url,
        tool: tool.resolve().await?,
    };
    let size =
        restore::restore(file, key, &target, |b| progress.update(b)).map_err(restore_error)?;
    progress.finish(size);
    std::fs::write(layout.name_file(), format!("{name}\n"))
        .map_err(|e| format!("{}: {e}", layout.name_file().display()))?;
    println!(
        "restored {} ({}) into {} as member {name}",
        file.display(),
        human_bytes(size),
        target.member_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn members(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let rows = hostlet_controllers::members::gather_member_rows(&etcd, &cluster.keys()).await?;
    if cluster.output.structured() {
        print_structured(&rows, cluster.output);
    } else {
        let now = SystemTime::now();
        let cells: Vec<Vec<String>> = rows.iter().map(|r| r.cells(now)).collect();
        print_table(&hostlet_controllers::members::MEMBER_TABLE_HEADER, &cells);
    }
    Ok(ExitCode::SUCCESS)
}
