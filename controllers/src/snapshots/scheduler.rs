//! `SnapshotScheduler`: takes this node's snapshots on a schedule and on request, one at a time, records each
//! in etcd and keeps exactly the configured number.
//!
//! It runs as the controller [`CONTROLLER`] over the agent's shared caches of the policy keys and the
//! request key. Its keys are [`SnapshotKey`]s: the schedule's timer (a requeue until the next fire time),
//! the request key's changes, and policy changes (prune). A snapshot in progress makes any other "busy".

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hostlet_api::objects::{
    RemoteCopy, RemoteState, S3Policy, SnapshotPolicy, SnapshotRecord, SnapshotStatus, Timestamp,
};
use hostlet_api::KeyLayout;
use hostlet_runtime::controller::backoff;
use hostlet_runtime::etcd::{Etcd, EtcdConfig, EtcdError};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Action, Controller, Informer, Metrics, Store, WorkQueue};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::encryption::SnapshotKey as EncryptionKey;
use super::file::{self, sha256_file};
use super::remote::{Remote, RemoteError, S3Target};
use super::retention::{self, Candidate, SnapshotName, SCHEDULED_NAME};
use super::schedule::Schedule;
use super::take::{take_snapshot, TakeError, TakeRequest};
use crate::events::{EventKind, EventRecorder};

/// The name an on-demand snapshot gets when the request names none.
pub const ON_DEMAND_NAME: &str = "on-demand";

/// What the scheduler is set up with (flags; the policy keys override schedule, retention and compress).
#[derive(Debug, Clone)]
pub struct SnapshotSettings {
    pub node: String,
    pub dir: PathBuf,
    pub keys: KeyLayout,
    pub schedule: String,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    /// Up to this much random delay before a scheduled snapshot (at most 5 s is used).
    pub jitter: Duration,
    /// The local member only: a snapshot stream comes from one endpoint.
    pub local: EtcdConfig,
    /// The object-storage target from the flags (the policy keys' `s3` part may override bucket, prefix,
    /// region and retention; never the endpoint).
    pub s3: S3Flags,
    /// Encrypts every snapshot file (and so its object) when set.
    pub key: Option<Arc<EncryptionKey>>,
    /// Free space under the snapshot dir: a snapshot due while it is low is skipped with the reason rather
    /// than half-written.
    pub disk: Option<crate::disk::DiskPressure>,
}

/// The object-storage flags. Without a bucket (here or in a policy key) nothing is uploaded.
#[derive(Debug, Clone, Default)]
pub struct S3Flags {
    /// Endpoint, bucket, prefix, region and retention, as a policy would give them.
    pub policy: S3Policy,
    pub virtual_hosted: bool,
    pub ca_file: Option<PathBuf>,
    pub credentials_file: Option<PathBuf>,
    /// `--snapshot-s3-allow-http`: a plain `http://` endpoint is accepted.
    pub allow_http: bool,
}

/// Region used when none is set.
pub const DEFAULT_S3_REGION: &str = "us-east-1";
/// Objects kept per name when no remote retention is set.
pub const DEFAULT_S3_RETENTION: u32 = 5;

impl S3Flags {
    /// The target in force for `layered` (the flags' `s3` already under the keys'), or `None` without a
    /// bucket.
    pub fn target(&self, layered: &S3Policy) -> Option<S3Target> {
        let bucket = layered.bucket.clone().filter(|b| !b.is_empty())?;
        Some(S3Target {
            endpoint: layered.endpoint.clone().filter(|e| !e.is_empty()),
            bucket,
            prefix: layered.prefix.clone().unwrap_or_default(),
            region: layered
                .region
                .clone()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| DEFAULT_S3_REGION.to_string()),
            virtual_hosted: self.virtual_hosted,
            ca_file: self.ca_file.clone(),
            credentials_file: self.credentials_file.clone(),
            allow_http: self.allow_http,
        })
    }
}

/// Keys of the scheduler's controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SnapshotKey {
    /// The schedule: takes the scheduled snapshot once its time has come, then waits for the next.
    Scheduled,
    /// This node's on-demand request key.
    Request,
    /// A policy change: the object-storage pass and retention under the new policy.
    Prune,
}

/// Why a pass over object storage stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// Why a snapshot was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("busy: another snapshot is in progress")]
    Busy,
    #[error("skipped: this member is a learner; learners take no snapshots")]
    Learner,
    #[error("skipped: {0} (below --disk-min-free); the next snapshot runs once there is room")]
    NoRoom(String),
    #[error("local etcd member: {0}")]
    Local(#[from] EtcdError),
    #[error(transparent)]
    Take(#[from] TakeError),
}

/// The request an operator writes to `/hostlet/hosts/<node>/requests/snapshot`, and the answer the agent
/// writes back into it before deleting it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Chosen by the requester to recognise its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Where it stands; absent in a fresh request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RequestState>,
    /// Bytes of the snapshot stream received so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_bytes: Option<u64>,
    /// The upload under way (or last finished) in the object-storage pass that follows the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadProgress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<SnapshotRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a snapshot request stands, as the agent writes it into the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RequestState {
    /// Taken: the snapshot, then its uploads, under way.
    Running,
    /// Taken, verified and recorded.
    Done,
    /// Tried and failed, or refused (the error says why).
    Failed,
    /// Refused: another snapshot runs.
    Busy,
    /// Written by hand or by another version, kept as written.
    Other(String),
}

impl RequestState {
    /// An answer: the request is over (the key stays with it until the next request).
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            RequestState::Done | RequestState::Failed | RequestState::Busy
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            RequestState::Running => "running",
            RequestState::Done => "done",
            RequestState::Failed => "failed",
            RequestState::Busy => "busy",
            RequestState::Other(s) => s,
        }
    }
}

impl From<String> for RequestState {
    fn from(s: String) -> Self {
        match s.as_str() {
            "running" => RequestState::Running,
            "done" => RequestState::Done,
            "failed" => RequestState::Failed,
            "busy" => RequestState::Busy,
            _ => RequestState::Other(s),
        }
    }
}

impl From<RequestState> for String {
    fn from(s: RequestState) -> Self {
        s.as_str().to_string()
    }
}

impl std::fmt::Display for RequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far one upload to object storage has got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadProgress {
    pub file: String,
    pub url: String,
    /// Bytes the server has acknowledged (whole parts).
    pub sent_bytes: u64,
    pub total_bytes: u64,
}

impl UploadProgress {
    pub fn finished(&self) -> bool {
        self.sent_bytes >= self.total_bytes
    }
}

/// How far a snapshot taken with [`SnapshotScheduler::take`] has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeProgress {
    /// Bytes of the snapshot stream received so far.
    Received(u64),
    /// An upload of the object-storage pass that follows the snapshot.
    Upload(UploadProgress),
}

/// A request's progress is written at most this often (an upload's start and end are written at once).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

struct SnapshotMetrics {
    duration: HistogramVec,
    last_success: IntGaugeVec,
    size: IntGauge,
    total: IntCounterVec,
    files: IntGauge,
    uploads: IntCounterVec,
    upload_duration: Histogram,
    remote_count: IntGauge,
    period: IntGauge,
}

impl SnapshotMetrics {
    fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "hostlet_snapshot_duration_seconds",
                "Time to take one snapshot, by outcome.",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            &["status"],
        )?;
        let last_success = IntGaugeVec::new(
            Opts::new(
                "hostlet_snapshot_last_success_timestamp_seconds",
                "Unix time of the last successful snapshot of this node, by place (local file, remote object).",
            ),
            &["place"],
        )?;
        let size = IntGauge::new(
            "hostlet_snapshot_size_bytes",
            "Size on disk of the last successful snapshot.",
        )?;
        let total = IntCounterVec::new(
            Opts::new("hostlet_snapshots_total", "Snapshots attempted, by result."),
            &["result"],
        )?;
        let files = IntGauge::new(
            "hostlet_snapshot_files",
            "Snapshot files of this node in the snapshot dir.",
        )?;
        r.register(Box::new(duration.clone()))?;
        r.register(Box::new(last_success.clone()))?;
        r.register(Box::new(size.clone()))?;
        r.register(Box::new(total.clone()))?;
        r.register(Box::new(files.clone()))?;
        let uploads = IntCounterVec::new(
            Opts::new(
                "hostlet_snapshot_uploads_total",
                "Snapshot uploads to object storage, by result (a success is read back and matches).",
            ),
            &["result"],
        )?;
        let upload_duration = Histogram::with_opts(
            HistogramOpts::new(
                "hostlet_snapshot_upload_duration_seconds",
                "Time to upload and read back one snapshot.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
        )?;
        let remote_count = IntGauge::new(
            "hostlet_snapshot_remote_count",
            "Snapshot objects of this node under its prefix in object storage.",
        )?;
        let period = IntGauge::new(
            "hostlet_snapshot_schedule_period_seconds",
            "Seconds between two scheduled snapshots (0 while scheduled snapshots are off).",
        )?;
        r.register(Box::new(uploads.clone()))?;
        r.register(Box::new(upload_duration.clone()))?;
        r.register(Box::new(remote_count.clone()))?;
        r.register(Box::new(period.clone()))?;
        for s in ["success", "failure"] {
            uploads.with_label_values(&[s]);
        }
        // The remote series appears once a target is set, so that no alert fires on a host without one.
        last_success.with_label_values(&["local"]);
        for s in ["successful", "failed"] {
            duration.with_label_values(&[s]);
        }
        for r in ["success", "failure", "busy", "skipped", "refused"] {
            total.with_label_values(&[r]);
        }
        Ok(SnapshotMetrics {
            duration,
            last_success,
            size,
            total,
            files,
            uploads,
            upload_duration,
            remote_count,
            period,
        })
    }
}

/// The policy in force: flags, overridden by the cluster key, overridden by the node key.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectivePolicy {
    pub schedule: Schedule,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    /// The object-storage target, when one is set.
    pub s3: Option<S3Target>,
    pub s3_retention: u32,
}

impl EffectivePolicy {
    /// The policy from the flags layered under the cluster key and the node key (either may be absent).
    pub fn layer(
        settings: &SnapshotSettings,
        cluster: Option<&SnapshotPolicy>,
        node: Option<&SnapshotPolicy>,
        fallback_schedule: Schedule,
    ) -> EffectivePolicy {
        let mut layered = SnapshotPolicy {
            schedule: Some(settings.schedule.clone()),
            retention: Some(settings.retention),
            compress: Some(settings.compress),
            disabled: Some(settings.disabled),
            s3: Some(settings.s3.policy.clone()),
        };
        for p in [cluster, node].into_iter().flatten() {
            layered = without_endpoint(p).over(&layered);
        }
        let s3 = layered.s3.clone().unwrap_or_default();
        EffectivePolicy {
            schedule: layered
                .schedule
                .as_deref()
                .and_then(|s| Schedule::parse(s).ok())
                .unwrap_or(fallback_schedule),
            retention: layered.retention.unwrap_or(settings.retention),
            compress: layered.compress.unwrap_or(settings.compress),
            disabled: layered.disabled.unwrap_or(settings.disabled),
            s3_retention: s3.retention.unwrap_or(DEFAULT_S3_RETENTION),
            s3: settings.s3.target(&s3),
        }
    }

    /// Seconds between two scheduled snapshots, 0 when off.
    pub fn period_seconds(&self) -> u64 {
        if self.disabled {
            return 0;
        }
        let now = SystemTime::now();
        let a = self.schedule.next_after(now);
        let b = a.and_then(|a| self.schedule.next_after(a));
        match (a, b) {
            (Some(a), Some(b)) => b.duration_since(a).map(|d| d.as_secs()).unwrap_or(0),
            _ => 0,
        }
    }
}

/// A policy key's value without the fields only flags may set: where snapshots are sent (and so who may
/// read them) is the host's decision, not that of whoever can write to etcd.
fn without_endpoint(p: &SnapshotPolicy) -> SnapshotPolicy {
    let mut p = p.clone();
    if let Some(s3) = p.s3.as_mut() {
        s3.endpoint = None;
    }
    p
}

/// The fields of a policy key that are ignored, as `s3.endpoint`.
pub fn ignored_policy_fields(p: &SnapshotPolicy) -> Vec<&'static str> {
    let mut out = Vec::new();
    if p.s3.as_ref().is_some_and(|s| s.endpoint.is_some()) {
        out.push("s3.endpoint");
    }
    out
}

/// The scheduler. Build with [`SnapshotScheduler::new`], then [`SnapshotScheduler::run`].
pub struct SnapshotScheduler {
    settings: SnapshotSettings,
    etcd: Etcd,
    events: EventRecorder,
    metrics: SnapshotMetrics,
    runtime_metrics: Metrics,
    busy: tokio::sync::Mutex<()>,
    policy: Mutex<EffectivePolicy>,
    /// The client of the target in force, rebuilt when the target changes.
    remote: Mutex<Option<(S3Target, Arc<Remote>)>>,
    /// One remote pass at a time: a scheduled run and a policy change must not upload the same file twice.
    remote_pass: tokio::sync::Mutex<()>,
    /// The ids of the requests this process set running: a request found running with another id was left
    /// by an agent that stopped while taking it.
    started_requests: Mutex<std::collections::HashSet<Option<String>>>,
    /// Policy key revisions whose ignored fields were reported: one event per write of a key.
    ignored_reported: Mutex<HashSet<(String, i64)>>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A value's error in the operator's terms (see [`hostlet_api::parse::plain_words`]).
fn plain(e: yaml_serde::Error) -> hostlet_runtime::informer::DecodeError {
    hostlet_api::parse::plain_words(&e.to_string()).into()
}

/// A snapshot policy key's value (`/hostlet/config/snapshots`, or a node's), its schedule checked.
pub fn decode_policy(
    _key: &str,
    bytes: &[u8],
) -> Result<SnapshotPolicy, hostlet_runtime::informer::DecodeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(SnapshotPolicy::default());
    }
    let p: SnapshotPolicy = yaml_serde::from_slice(bytes).map_err(plain)?;
    if let Some(s) = &p.schedule {
        Schedule::parse(s)?;
    }
    Ok(p)
}

/// A snapshot request key's value; blank is an empty request.
pub fn decode_request(
    _key: &str,
    bytes: &[u8],
) -> Result<SnapshotRequest, hostlet_runtime::informer::DecodeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(SnapshotRequest::default());
    }
    yaml_serde::from_slice(bytes).map_err(plain)
}

impl SnapshotScheduler {
    /// Checks the flag schedule and registers the metrics.
    pub fn new(
        settings: SnapshotSettings,
        etcd: Etcd,
        events: EventRecorder,
        metrics: &Metrics,
    ) -> Result<Self, String> {
        let schedule = Schedule::parse(&settings.schedule).map_err(|e| e.to_string())?;
        let m = SnapshotMetrics::new(metrics.registry()).map_err(|e| e.to_string())?;
        let policy = EffectivePolicy::layer(&settings, None, None, schedule);
        m.period.set(policy.period_seconds() as i64);
        if policy.s3.is_some() {
            m.last_success.with_label_values(&["remote"]);
        }
        Ok(SnapshotScheduler {
            settings,
            etcd,
            events,
            metrics: m,
            runtime_metrics: metrics.clone(),
            busy: tokio::sync::Mutex::new(()),
            policy: Mutex::new(policy),
            remote: Mutex::new(None),
            remote_pass: tokio::sync::Mutex::new(()),
            started_requests: Mutex::new(std::collections::HashSet::new()),
            ignored_reported: Mutex::new(HashSet::new()),
        })
    }

    /// Whether a snapshot is being taken now (the upkeep controller does not defragment meanwhile).
    pub fn in_progress(&self) -> bool {
        self.busy.try_lock().is_err()
    }

    pub fn policy(&self) -> EffectivePolicy {
        self.policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the ignored fields of `key` at `revision` are to be reported now (the first time only).
    fn ignored_reported(&self, key: &str, revision: i64) -> bool {
        let mut seen = self
            .ignored_reported
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        seen.retain(|(k, r)| k != key || *r == revision);
        seen.insert((key.to_string(), revision))
    }

    /// Recomputes the policy from the two keys; an invalid key is reported and ignored.
    async fn refresh_policy(
        &self,
        cluster: &Store<String, Object<SnapshotPolicy>>,
        node: &Store<String, Object<SnapshotPolicy>>,
    ) -> bool {
        let mut found: [Option<SnapshotPolicy>; 2] = [None, None];
        for (i, (store, key)) in [
            (cluster, self.settings.keys.snapshot_policy()),
            (
                node,
                self.settings.keys.node_snapshot_policy(&self.settings.node),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(obj) = store.get(&key) {
                match &obj.value {
                    Ok(p) => {
                        let ignored = ignored_policy_fields(p);
                        if !ignored.is_empty() && self.ignored_reported(&key, obj.mod_revision) {
                            self.events
                                .node_event(
                                    EventKind::Warning,
                                    "SnapshotPolicyFieldIgnored",
                                    format!(
                                        "{key}: {} ignored: the object-storage endpoint and credentials come from this host's flags and files only (--snapshot-s3-endpoint, --snapshot-s3-credentials-file)",
                                        ignored.join(", ")
                                    ),
                                )
                                .await;
                        }
                        found[i] = Some(p.clone())
                    }
                    Err(e) => {
                        self.events
                            .node_event(
                                EventKind::Warning,
                                "InvalidSnapshotPolicy",
                                format!("{key}: {}; keeping the rest of the policy", e.message()),
                            )
                            .await
                    }
                }
            }
        }
        let new = EffectivePolicy::layer(
            &self.settings,
            found[0].as_ref(),
            found[1].as_ref(),
            self.policy().schedule,
        );
        self.metrics.period.set(new.period_seconds() as i64);
        if new.s3.is_some() {
            self.metrics.last_success.with_label_values(&["remote"]);
        }
        let mut cur = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *cur != new;
        if changed {
            tracing::info!(?new, "snapshot policy changed");
            *cur = new;
        }
        changed
    }

    /// Removes `.part` files a crash left behind, then makes records and files agree: records of
    /// missing files go, files without records are recorded.
    pub async fn reconcile_catalogue(&self) -> Result<(), EtcdError> {
        let dir = &self.settings.dir;
        let node = &self.settings.node;
        let mut files = HashSet::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".part") {
                    tracing::info!(file = %name, "removing a partial snapshot left by a crash");
                    let _ = std::fs::remove_file(e.path());
                } else if SnapshotName::parse(&name, node).is_some() {
                    files.insert(name);
                }
            }
        }
        let (kvs, _) = self
            .etcd
            .get_prefix(self.settings.keys.node_snapshots_prefix(node))
            .await?;
        let mut recorded = HashSet::new();
        let mut last_remote = None;
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let rec: Option<SnapshotRecord> = serde_json::from_slice(kv.value()).ok();
            if let Some(c) = rec.as_ref().and_then(|r| r.remote.as_ref()) {
                if c.state == RemoteState::Ok {
                    last_remote = last_remote.max(Some(c.updated.unix_secs()));
                }
            }
            match rec {
                Some(mut r)
                    if r.status == SnapshotStatus::Successful
                        && r.local
                        && !files.contains(&r.file) =>
                {
                    if r.remote
                        .as_ref()
                        .is_some_and(|c| c.state == RemoteState::Ok)
                    {
                        tracing::info!(file = %r.file, "snapshot file is gone; its object stays");
                        r.local = false;
                        self.put_record(&r).await?;
                    } else {
                        tracing::info!(file = %r.file, "snapshot file is gone; removing its record");
                        self.etcd.delete(&key).await?;
                    }
                }
                Some(r) => {
                    recorded.insert(r.file);
                }
                None => {}
            }
        }
        for f in files.difference(&recorded) {
            let Some(parsed) = SnapshotName::parse(f, node) else {
                continue;
            };
            let path = dir.join(f);
            // A plain file is checked as plain even when this node now has a key.
            let key = self.settings.key.as_deref().filter(|_| parsed.encrypted);
            let verified = file::verify(&path, None, key, |_| {});
            let meta = std::fs::metadata(&path).ok();
            let record = SnapshotRecord {
                name: parsed.name.clone(),
                node: node.clone(),
                file: f.clone(),
                size: meta.map(|m| m.len()).unwrap_or(0),
                sha256: sha256_file(&path).unwrap_or_default(),
                revision: 0,
                created: Timestamp::from_unix(parsed.unix),
                duration_seconds: 0.0,
                compressed: parsed.compressed,
                encrypted: parsed.encrypted,
                on_demand: parsed.name != SCHEDULED_NAME,
                status: if verified.is_ok() {
                    SnapshotStatus::Successful
                } else {
                    SnapshotStatus::Failed
                },
                error: verified.err().map(|e| e.to_string()),
                local: true,
                remote: None,
            };
            self.put_record(&record).await?;
        }
        if let Some(t) = last_remote {
            self.metrics
                .last_success
                .with_label_values(&["remote"])
                .set(t as i64);
        }
        self.count_files();
        Ok(())
    }

    fn count_files(&self) {
        let n = std::fs::read_dir(&self.settings.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        SnapshotName::parse(&e.file_name().to_string_lossy(), &self.settings.node)
                            .is_some()
                    })
                    .count()
            })
            .unwrap_or(0);
        self.metrics.files.set(n as i64);
    }

    async fn put_record(&self, r: &SnapshotRecord) -> Result<(), EtcdError> {
        let key = self.settings.keys.snapshot_record(&r.node, &r.file);
        self.etcd
            .put(key, serde_json::to_vec(r).unwrap_or_default())
            .await
            .map(|_| ())
    }

    /// Takes one snapshot now, then makes its object-storage pass. `progress` sees the bytes received, then
    /// each upload's.
    pub async fn take(
        &self,
        name: &str,
        on_demand: bool,
        mut progress: impl FnMut(TakeProgress) + Send,
    ) -> Result<SnapshotRecord, SnapshotError> {
        let Ok(_guard) = self.busy.try_lock() else {
            self.metrics.total.with_label_values(&["busy"]).inc();
            return Err(SnapshotError::Busy);
        };
        // Before anything else: with no room, nothing is written, not even a `.part` file.
        if let Some(low) = self
            .settings
            .disk
            .as_ref()
            .and_then(|d| d.low(&self.settings.dir))
        {
            let e = SnapshotError::NoRoom(low.to_string());
            self.events
                .node_event(EventKind::Warning, "SnapshotSkipped", e.to_string())
                .await;
            self.metrics.total.with_label_values(&["skipped"]).inc();
            return Err(e);
        }
        let local = Etcd::connect(self.settings.local.clone()).await?;
        let endpoint = local.current_endpoint();
        let status = local.status_of(&endpoint).await?;
        if status.is_learner() {
            self.events
                .node_event(
                    EventKind::Normal,
                    "SnapshotSkipped",
                    "no snapshot: this member is a learner (its data may lag the cluster); it snapshots once promoted",
                )
                .await;
            self.metrics.total.with_label_values(&["skipped"]).inc();
            return Err(SnapshotError::Learner);
        }
        let policy = self.policy();
        let req = TakeRequest {
            dir: self.settings.dir.clone(),
            node: self.settings.node.clone(),
            name: name.to_string(),
            compress: policy.compress,
            key: self.settings.key.clone(),
            on_demand,
        };
        // File names carry the second: a second snapshot of the same name within it gets the next one.
        let mut unix = now_unix();
        while self.settings.dir.join(req.file_name(unix).file()).exists() {
            unix += 1;
        }
        let mut client = local.client();
        let result = take_snapshot(&mut client, &req, unix, |b| {
            progress(TakeProgress::Received(b))
        })
        .await;
        match result {
            Ok(rec) => {
                self.metrics
                    .duration
                    .with_label_values(&["successful"])
                    .observe(rec.duration_seconds);
                self.metrics.total.with_label_values(&["success"]).inc();
                self.metrics
                    .last_success
                    .with_label_values(&["local"])
                    .set(unix as i64);
                self.metrics.size.set(rec.size as i64);
                self.put_record(&rec).await?;
                self.events
                    .node_event(
                        EventKind::Normal,
                        "SnapshotCreated",
                        format!(
                            "{} ({} bytes, revision {}) in {:.2}s",
                            rec.file, rec.size, rec.revision, rec.duration_seconds
                        ),
                    )
                    .await;
                // Off-host copies first: local retention then never deletes a file whose upload is due.
                let mut uploads = |u| progress(TakeProgress::Upload(u));
                if let Err(e) = self.sync_remote_with(&policy, true, &mut uploads).await {
                    tracing::warn!(error = %e, "object storage pass failed; retried after the next snapshot");
                }
                if let Err(e) = self.prune(policy.retention).await {
                    tracing::warn!(error = %e, "retention after a snapshot failed; retried after the next one");
                }
                let key = self.settings.keys.snapshot_record(&rec.node, &rec.file);
                let rec = match self.etcd.get(&key).await {
                    Ok(Some(kv)) => serde_json::from_slice(kv.value()).unwrap_or(rec),
                    _ => rec,
                };
                Ok(rec)
            }
            Err(e) => {
                self.metrics
                    .duration
                    .with_label_values(&["failed"])
                    .observe(0.0);
                self.metrics.total.with_label_values(&["failure"]).inc();
                let rec = req.failed_record(unix, &e.to_string());
                if let Err(pe) = self.put_record(&rec).await {
                    tracing::warn!(error = %pe, "could not record a failed snapshot");
                }
                self.events
                    .node_event(
                        EventKind::Warning,
                        "SnapshotFailed",
                        format!("{}: {e}", rec.file),
                    )
                    .await;
                let mut uploads = |u| progress(TakeProgress::Upload(u));
                if let Err(pe) = self.sync_remote_with(&policy, true, &mut uploads).await {
                    tracing::warn!(error = %pe, "object storage pass failed");
                }
                if let Err(pe) = self.prune(policy.retention).await {
                    tracing::warn!(error = %pe, "retention after a failed snapshot failed");
                }
                Err(e.into())
            }
        }
    }

    async fn node_records(&self) -> Result<BTreeMap<String, SnapshotRecord>, EtcdError> {
        let (kvs, _) = self
            .etcd
            .get_prefix(
                self.settings
                    .keys
                    .node_snapshots_prefix(&self.settings.node),
            )
            .await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<SnapshotRecord>(kv.value()).ok())
            .map(|r| (r.file.clone(), r))
            .collect())
    }

    /// Keeps exactly `retention` newest local files per name; deletes every file beyond. Its record goes
    /// too, unless the snapshot's object stays in object storage (then the record says `local: false`).
    pub async fn prune(&self, retention: u32) -> Result<Vec<String>, EtcdError> {
        let node = &self.settings.node;
        let records = self.node_records().await?;
        let candidates: Vec<Candidate> = records
            .values()
            .filter(|r| r.local)
            .map(Candidate::from_record)
            .collect();
        let gone = retention::to_prune(&candidates, retention as usize, now_unix());
        for f in &gone {
            let path = self.settings.dir.join(f);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "could not delete snapshot; keeping its record");
                    continue;
                }
            }
            match records.get(f) {
                Some(r)
                    if r.remote
                        .as_ref()
                        .is_some_and(|c| c.state == RemoteState::Ok) =>
                {
                    let mut r = r.clone();
                    r.local = false;
                    self.put_record(&r).await?;
                }
                _ => {
                    self.etcd
                        .delete(self.settings.keys.snapshot_record(node, f))
                        .await?;
                }
            }
        }
        if !gone.is_empty() {
            tracing::info!(deleted = ?gone, retention, "snapshot retention applied");
        }
        self.count_files();
        Ok(gone)
    }

    /// Sets `hostlet_snapshot_remote_count` from a listing of this node's objects; `None` without a bucket.
    pub async fn count_remote(&self) -> Result<Option<usize>, RemoteError> {
        let Some(target) = self.policy().s3 else {
            return Ok(None);
        };
        let n = self
            .remote_for(&target)?
            .list(&self.settings.node)
            .await?
            .len();
        self.metrics.remote_count.set(n as i64);
        Ok(Some(n))
    }

    /// The client of `target`, built once per target.
    fn remote_for(&self, target: &S3Target) -> Result<Arc<Remote>, RemoteError> {
        let mut cur = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((t, r)) = cur.as_ref() {
            if t == target {
                return Ok(r.clone());
            }
        }
        let r = Arc::new(Remote::new(target)?);
        *cur = Some((target.clone(), r.clone()));
        Ok(r)
    }

    /// One pass over object storage for this node: uploads every good local snapshot that has no verified
    /// copy yet (new ones and earlier failures) unless remote retention would delete it at once, then
    /// keeps exactly the newest `s3_retention` objects per name under this node's own prefix. Failures are
    /// written into the records; the next pass retries them. Without `upload` only retention is applied.
    /// Returns the objects deleted.
    pub async fn sync_remote(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
    ) -> Result<Vec<String>, SyncError> {
        self.sync_remote_with(policy, upload, &mut |_| {}).await
    }

    /// [`SnapshotScheduler::sync_remote`], telling `progress` how each upload goes.
    pub async fn sync_remote_with(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
        progress: &mut (dyn FnMut(UploadProgress) + Send),
    ) -> Result<Vec<String>, SyncError> {
        let Some(target) = &policy.s3 else {
            return Ok(Vec::new());
        };
        let _pass = self.remote_pass.lock().await;
        let node = &self.settings.node;
        let mut records = self.node_records().await?;
        let due: Vec<String> = records
            .values()
            .filter(|r| {
                upload
                    && r.local
                    && r.status == SnapshotStatus::Successful
                    && !r.sha256.is_empty()
                    && r.remote
                        .as_ref()
                        .is_none_or(|c| c.state == RemoteState::Failed)
            })
            .map(|r| r.file.clone())
            .collect();
        let listed = match self.remote_for(target) {
            Ok(remote) => remote.list(node).await.map(|l| (remote, l)),
            Err(e) => Err(e),
        };
        let (remote, listed) = match listed {
            Ok(x) => x,
            Err(e) => {
                // Unreachable or misconfigured: every due upload is recorded as failed, to be retried.
                let url = |f: &str| match self.remote_for(target) {
                    Ok(r) => r.url(node, f),
                    Err(_) => format!("s3://{}/{}", target.bucket, f),
                };
                for f in &due {
                    if let Some(r) = records.get_mut(f) {
                        let u = url(f);
                        self.record_upload(r, u, Err(&e)).await;
                    }
                }
                return Err(e.into());
            }
        };
        let mut objects: BTreeMap<String, u64> = listed.into_iter().collect();
        let created = |f: &str| {
            SnapshotName::parse(f, node)
                .map(|n| n.unix)
                .unwrap_or_default()
        };
        let name_of = |f: &str| {
            SnapshotName::parse(f, node)
                .map(|n| n.name)
                .unwrap_or_default()
        };
        let candidate = |f: &String| Candidate {
            file: f.clone(),
            name: name_of(f),
            created_unix: created(f),
            good: true,
        };
        // Due files that retention would drop even if every upload succeeded are not uploaded at all.
        let mut candidates: Vec<Candidate> = objects.keys().map(candidate).collect();
        candidates.extend(
            due.iter()
                .filter(|f| !objects.contains_key(*f))
                .map(candidate),
        );
        let beyond: HashSet<String> =
            retention::to_prune(&candidates, policy.s3_retention as usize, now_unix())
                .into_iter()
                .collect();
        // Newest first, so that the freshest snapshot is off the host soonest.
        let mut due = due;
        due.sort_by_key(|f| std::cmp::Reverse(created(f)));
        for f in &due {
            let Some(r) = records.get_mut(f) else {
                continue;
            };
            let url = remote.url(node, f);
            if beyond.contains(f) {
                r.remote = Some(RemoteCopy {
                    state: RemoteState::Pruned,
                    url,
                    attempts: r.remote.as_ref().map(|c| c.attempts).unwrap_or(0),
                    updated: Timestamp::now(),
                    error: None,
                });
                self.put_record(r).await?;
                continue;
            }
            let started = Instant::now();
            let result = remote
                .upload_with(
                    &self.settings.dir.join(f),
                    node,
                    f,
                    &r.sha256,
                    |sent, total| {
                        progress(UploadProgress {
                            file: f.clone(),
                            url: url.clone(),
                            sent_bytes: sent,
                            total_bytes: total,
                        })
                    },
                )
                .await;
            if result.is_ok() {
                self.metrics
                    .upload_duration
                    .observe(started.elapsed().as_secs_f64());
                objects.insert(f.clone(), r.size);
            }
            self.record_upload(r, url, result.as_ref().map(|_| ()))
                .await;
        }
        // Remote retention, over the objects that are there now: an upload that failed does not count, so
        // it never pushes a good copy out. Only this node's names under this node's prefix are deleted.
        let mut deleted = Vec::new();
        let there: Vec<Candidate> = objects.keys().map(candidate).collect();
        let mut beyond_there =
            retention::to_prune(&there, policy.s3_retention as usize, now_unix());
        beyond_there.sort();
        for f in &beyond_there {
            if let Err(e) = remote.delete(node, f).await {
                tracing::warn!(error = %e, "could not delete an object beyond remote retention");
                continue;
            }
            objects.remove(f);
            deleted.push(f.clone());
        }
        // Records follow the bucket: a copy gone from it is no longer claimed.
        for r in records.values_mut() {
            let Some(c) = r.remote.as_mut() else { continue };
            if c.state != RemoteState::Ok || objects.contains_key(&r.file) {
                continue;
            }
            if !r.local {
                self.etcd
                    .delete(self.settings.keys.snapshot_record(node, &r.file))
                    .await?;
                continue;
            }
            if deleted.contains(&r.file) {
                c.state = RemoteState::Pruned;
                c.error = None;
            } else {
                c.state = RemoteState::Failed;
                c.error =
                    Some("the object is gone from the bucket; uploaded again next run".into());
            }
            c.updated = Timestamp::now();
            self.put_record(r).await?;
        }
        if !deleted.is_empty() {
            tracing::info!(deleted = ?deleted, retention = policy.s3_retention, "remote snapshot retention applied");
        }
        self.metrics.remote_count.set(objects.len() as i64);
        Ok(deleted)
    }

    /// Writes an upload's outcome into its record, the metrics and the events.
    async fn record_upload(
        &self,
        r: &mut SnapshotRecord,
        url: String,
        result: Result<(), &RemoteError>,
    ) {
        let attempts = r.remote.as_ref().map(|c| c.attempts).unwrap_or(0) + 1;
        let now = Timestamp::now();
        match result {
            Ok(()) => {
                self.metrics.uploads.with_label_values(&["success"]).inc();
                self.metrics
                    .last_success
                    .with_label_values(&["remote"])
                    .set(now.unix_secs() as i64);
                tracing::info!(file = %r.file, %url, attempts, "snapshot uploaded and read back");
                r.remote = Some(RemoteCopy {
                    state: RemoteState::Ok,
                    url,
                    attempts,
                    updated: now,
                    error: None,
                });
            }
            Err(e) => {
                self.metrics.uploads.with_label_values(&["failure"]).inc();
                // One event per snapshot: an outage retried on every run does not flood the events;
                // the record and hostlet_snapshot_uploads_total count the retries.
                if attempts == 1 {
                    self.events
                        .node_event(
                            EventKind::Warning,
                            "SnapshotUploadFailed",
                            format!("{}: {e}; retried on every run", r.file),
                        )
                        .await;
                } else {
                    tracing::warn!(file = %r.file, attempts, error = %e, "snapshot upload failed again");
                }
                r.remote = Some(RemoteCopy {
                    state: RemoteState::Failed,
                    url,
                    attempts,
                    updated: now,
                    error: Some(e.to_string()),
                });
            }
        }
        if let Err(e) = self.put_record(r).await {
            tracing::warn!(error = %e, file = %r.file, "could not record an upload");
        }
    }

    async fn answer_request(&self, requests: &Store<String, Object<SnapshotRequest>>) {
        let key = self.settings.keys.snapshot_request(&self.settings.node);
        let Some(obj) = requests.get(&key) else {
            return;
        };
        let mut req = match &obj.value {
            // Left running by an agent that stopped while taking it: nobody will finish it, and while it
            // stays the CLI refuses every new request as pending. Answered as failed, then removed.
            Ok(r) if r.state == Some(RequestState::Running) && !self.started(&r.id) => {
                let mut r = r.clone();
                r.state = Some(RequestState::Failed);
                r.error = Some(
                    "interrupted: the agent stopped while taking this snapshot; ask again".into(),
                );
                tracing::warn!(key, id = ?r.id, "a snapshot request left running by an earlier agent: answered as failed");
                let _ = self
                    .etcd
                    .put(&key, serde_json::to_vec(&r).unwrap_or_default())
                    .await;
                let _ = self.etcd.delete(&key).await;
                return;
            }
            Ok(r) if r.state.is_some() => return, // our own answer, about to be deleted
            Ok(r) => r.clone(),
            Err(e) => {
                let reason = format!("not a snapshot request: {}", e.message());
                self.refuse_request(&key, SnapshotRequest::default(), reason)
                    .await;
                return;
            }
        };
        let name = req
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| ON_DEMAND_NAME.to_string());
        if let Err(msg) = check_snapshot_name(&name) {
            self.refuse_request(&key, req, msg).await;
            return;
        } else {
            self.started_requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(req.id.clone());
            req.state = Some(RequestState::Running);
            let _ = self
                .etcd
                .put(&key, serde_json::to_vec(&req).unwrap_or_default())
                .await;
            // Progress goes into the request key at a bounded rate, by a task of its own that is
            // stopped (never in the middle of a write) before the answer is written.
            let (ptx, prx) = tokio::sync::mpsc::unbounded_channel();
            let stop = CancellationToken::new();
            let reporter = tokio::spawn(report_progress(
                self.etcd.clone(),
                key.clone(),
                req.clone(),
                prx,
                stop.clone(),
            ));
            let result = self
                .take(&name, true, move |p| {
                    let _ = ptx.send(p);
                })
                .await;
            stop.cancel();
            let _ = reporter.await;
            match result {
                Ok(rec) => {
                    req.state = Some(RequestState::Done);
                    req.progress_bytes = Some(rec.size);
                    req.record = Some(rec);
                }
                Err(SnapshotError::Busy) => {
                    req.state = Some(RequestState::Busy);
                    req.error = Some(SnapshotError::Busy.to_string());
                }
                Err(e) => {
                    req.state = Some(RequestState::Failed);
                    req.error = Some(e.to_string());
                }
            }
        }
        // The answer is written, then the request removed: a watcher sees both.
        let _ = self
            .etcd
            .put(&key, serde_json::to_vec(&req).unwrap_or_default())
            .await;
        let _ = self.etcd.delete(&key).await;
    }

    /// Whether this process set the request with this id running.
    fn started(&self, id: &Option<String>) -> bool {
        self.started_requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Answers a request that will not be carried out: the answer (state `failed`, the reason) stays in
    /// the request key for the operator to read, and an event says the same.
    async fn refuse_request(&self, key: &str, mut req: SnapshotRequest, reason: String) {
        self.metrics.total.with_label_values(&["refused"]).inc();
        self.events
            .node_event(
                EventKind::Warning,
                "InvalidSnapshotRequest",
                format!("{key}: {reason}; no snapshot taken"),
            )
            .await;
        req.state = Some(RequestState::Failed);
        req.error = Some(reason);
        if let Err(e) = self
            .etcd
            .put(key, serde_json::to_vec(&req).unwrap_or_default())
            .await
        {
            tracing::warn!(error = %e, key, "cannot answer the snapshot request");
        }
    }

    /// Runs until `shutdown` as the controller [`CONTROLLER`] over the agent's shared `caches`: cleans up,
    /// then takes snapshots on schedule, on request and prunes on policy changes.
    pub async fn run(self: Arc<Self>, caches: SnapshotCaches, shutdown: CancellationToken) {
        let request_key = self.settings.keys.snapshot_request(&self.settings.node);
        let ctx = Arc::new(Run {
            sched: self.clone(),
            caches: caches.clone(),
            queue: OnceLock::new(),
            timer: Mutex::new(Timer {
                last_fire: SystemTime::now(),
                planned: None,
            }),
            prune_due: AtomicBool::new(false),
        });
        let prepared = {
            let ctx = ctx.clone();
            async move { ctx.prepare().await }
        };
        // Two at a time: a request that arrives during a scheduled snapshot is answered "busy" at once.
        let c = Controller::new(CONTROLLER, ctx.clone(), &self.runtime_metrics)
            .ready_when(prepared)
            .watches(&caches.policy, |_| Some(SnapshotKey::Prune))
            .watches(&caches.node_policy, |_| Some(SnapshotKey::Prune))
            .watches(&caches.requests, move |k: &String| {
                (*k == request_key).then_some(SnapshotKey::Request)
            })
            .triggers(futures::stream::iter([SnapshotKey::Scheduled]))
            .concurrency(2);
        let _ = ctx.queue.set(c.queue());
        c.run(
            |key, ctx: Arc<Run>| async move { ctx.reconcile(key).await },
            backoff,
            shutdown,
        )
        .await;
    }
}

/// The informer label of the cluster-wide snapshot policy key's cache.
pub const SNAPSHOT_POLICY_INFORMER: &str = "snapshot-policy";
/// The informer label of this node's snapshot policy key's cache.
pub const SNAPSHOT_NODE_POLICY_INFORMER: &str = "snapshot-node-policy";
/// The informer label of this node's snapshot request key's cache.
pub const SNAPSHOT_REQUESTS_INFORMER: &str = "snapshot-requests";

/// A cache of a snapshot policy key.
pub type PolicyStore = Store<String, Object<SnapshotPolicy>>;

/// The caches the snapshot scheduler reads: reader clones of the agent's (see `caches::Caches::snapshots`).
#[derive(Clone)]
pub struct SnapshotCaches {
    pub policy: PolicyStore,
    pub node_policy: PolicyStore,
    pub requests: Store<String, Object<SnapshotRequest>>,
}

impl SnapshotCaches {
    /// Starts the three informers (they stop with `shutdown`). An agent does this once, in
    /// `caches::Caches::start`.
    pub fn start(
        etcd: &Etcd,
        keys: &KeyLayout,
        node: &str,
        metrics: &Metrics,
        shutdown: &CancellationToken,
    ) -> SnapshotCaches {
        let policy = Informer::new(
            SNAPSHOT_POLICY_INFORMER,
            etcd.clone(),
            keys.snapshot_policy(),
            decode_policy,
        )
        .with_metrics(metrics);
        let node_policy = Informer::new(
            SNAPSHOT_NODE_POLICY_INFORMER,
            etcd.clone(),
            keys.node_snapshot_policy(node),
            decode_policy,
        )
        .with_metrics(metrics);
        let requests = Informer::new(
            SNAPSHOT_REQUESTS_INFORMER,
            etcd.clone(),
            keys.snapshot_request(node),
            decode_request,
        )
        .with_metrics(metrics);
        let caches = SnapshotCaches {
            policy: policy.store(),
            node_policy: node_policy.store(),
            requests: requests.store(),
        };
        tokio::spawn(policy.run(shutdown.clone()));
        tokio::spawn(node_policy.run(shutdown.clone()));
        tokio::spawn(requests.run(shutdown.clone()));
        caches
    }
}

/// The controller's name in `workqueue_*{name}` and `hostlet_reconcile_*{controller}`.
pub const CONTROLLER: &str = "snapshots";

/// How long the start waits for the bucket's listing before it goes on without the count.
const COUNT_REMOTE_WITHIN: Duration = Duration::from_secs(10);

/// How long the timer sleeps while no scheduled snapshot is due (off, or no next time): a policy change
/// wakes it earlier.
const IDLE: Duration = Duration::from_secs(24 * 3600);

/// Where the schedule stands.
struct Timer {
    /// The schedule time fired last, or when the timer (re)started.
    last_fire: SystemTime,
    /// The schedule time waited for, and when it fires (this node's offset added).
    planned: Option<(SystemTime, SystemTime)>,
}

/// The controller's context: the scheduler, the caches it reads and the schedule's state.
struct Run {
    sched: Arc<SnapshotScheduler>,
    caches: SnapshotCaches,
    /// The controller's own queue, for a policy change to wake the timer.
    queue: OnceLock<WorkQueue<SnapshotKey>>,
    timer: Mutex<Timer>,
    /// A policy change not yet followed by a successful prune (a failed one is retried with backoff).
    prune_due: AtomicBool,
}

impl Run {
    fn timer(&self) -> std::sync::MutexGuard<'_, Timer> {
        self.timer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before the first reconcile: catalogue clean-up (retried until etcd answers), then the policy in
    /// force once the caches are listed. The timer starts from here.
    async fn prepare(&self) {
        let mut backoff = hostlet_runtime::ExponentialBackoff::new(
            Duration::from_millis(500),
            Duration::from_secs(30),
        );
        while let Err(e) = self.sched.reconcile_catalogue().await {
            tracing::warn!(error = %e, "snapshot catalogue check failed; retrying");
            tokio::time::sleep(backoff.next_delay()).await;
        }
        self.caches.policy.wait_until_ready().await;
        self.caches.node_policy.wait_until_ready().await;
        self.caches.requests.wait_until_ready().await;
        self.sched
            .refresh_policy(&self.caches.policy, &self.caches.node_policy)
            .await;
        // The objects already in the bucket count from the start, not only after the first pass; a
        // bucket that does not answer soon is counted by that pass instead.
        match tokio::time::timeout(COUNT_REMOTE_WITHIN, self.sched.count_remote()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not count the snapshot objects"),
            Err(_) => tracing::warn!(
                within = ?COUNT_REMOTE_WITHIN,
                "the bucket did not answer; its objects are counted on the next pass"
            ),
        }
        self.timer().last_fire = SystemTime::now();
    }

    async fn reconcile(&self, key: SnapshotKey) -> Result<Action, EtcdError> {
        match key {
            SnapshotKey::Scheduled => Ok(self.scheduled().await),
            SnapshotKey::Request => {
                self.sched.answer_request(&self.caches.requests).await;
                Ok(Action::AwaitChange)
            }
            SnapshotKey::Prune => self.policy_changed().await,
        }
    }

    /// Takes the scheduled snapshot if its time has come, then sleeps until the next one.
    async fn scheduled(&self) -> Action {
        let due = {
            let mut t = self.timer();
            match t.planned {
                Some((at, fires)) if fires <= SystemTime::now() => {
                    t.last_fire = at;
                    t.planned = None;
                    true
                }
                _ => false,
            }
        };
        if due {
            let _ = self.sched.take(SCHEDULED_NAME, false, |_| {}).await;
        }
        Action::Requeue(self.plan())
    }

    /// The time until the planned firing, planning the next one first if none is: the schedule's own
    /// times, shifted by this node's fixed offset, so the cadence stays exact.
    fn plan(&self) -> Duration {
        let policy = self.sched.policy();
        let mut t = self.timer();
        if policy.disabled {
            t.planned = None;
            return IDLE;
        }
        let now = SystemTime::now();
        if t.planned.is_none() {
            let s = &self.sched.settings;
            let offset = node_offset(&s.node, s.jitter, &policy.schedule);
            t.planned =
                next_fire(&policy.schedule, t.last_fire, offset, now).map(|at| (at, at + offset));
        }
        match t.planned {
            Some((_, fires)) => fires.duration_since(now).unwrap_or_default(),
            None => IDLE,
        }
    }

    /// A policy key changed: the policy in force is recomputed; if it moved, the timer is planned anew
    /// (from now, when the schedule itself changed), then object storage and retention follow it.
    async fn policy_changed(&self) -> Result<Action, EtcdError> {
        let before = self.sched.policy();
        if self
            .sched
            .refresh_policy(&self.caches.policy, &self.caches.node_policy)
            .await
        {
            {
                let mut t = self.timer();
                if self.sched.policy().schedule != before.schedule {
                    t.last_fire = SystemTime::now();
                }
                t.planned = None;
            }
            if let Some(q) = self.queue.get() {
                q.add(SnapshotKey::Scheduled);
            }
            self.prune_due.store(true, Ordering::SeqCst);
        }
        if !self.prune_due.load(Ordering::SeqCst) {
            return Ok(Action::AwaitChange);
        }
        let policy = self.sched.policy();
        if let Err(e) = self.sched.sync_remote(&policy, true).await {
            tracing::warn!(error = %e, "object storage pass failed; retried after the next snapshot");
        }
        self.sched.prune(policy.retention).await?;
        self.prune_due.store(false, Ordering::SeqCst);
        Ok(Action::AwaitChange)
    }
}

/// On-demand names end up in file names: keep them to letters, digits, `.`, `_` and `-`.
/// This node's fixed delay after each of the schedule's times, so that nodes sharing a schedule do not all
/// snapshot at once: derived from the node name, at most `jitter` and at most a tenth of an `@every`
/// period. Being fixed, it never bends the cadence.
/// Writes a running request's progress into its key: the first at once, then at most once per
/// [`PROGRESS_EVERY`] with the newest figures, except that an upload's start and end are written at once,
/// so that the requester times each upload from its start and sees it reach its total. Returns the number of writes once `stop` is cancelled
/// (checked only between writes) or the sender is gone.
async fn report_progress(
    etcd: Etcd,
    key: String,
    mut shown: SnapshotRequest,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<TakeProgress>,
    stop: CancellationToken,
) -> u64 {
    let mut writes = 0u64;
    let mut last: Option<tokio::time::Instant> = None;
    let mut pending = false;
    loop {
        let due = last.map_or_else(tokio::time::Instant::now, |t| t + PROGRESS_EVERY);
        let msg = tokio::select! {
            biased;
            _ = stop.cancelled() => return writes,
            _ = tokio::time::sleep_until(due), if pending => None,
            m = rx.recv() => match m {
                Some(m) => Some(m),
                None => return writes,
            },
        };
        let urgent = match msg {
            None => true,
            Some(TakeProgress::Received(b)) => {
                shown.progress_bytes = Some(b);
                false
            }
            Some(TakeProgress::Upload(u)) => {
                let edge = u.sent_bytes == 0 || u.finished();
                shown.upload = Some(u);
                edge
            }
        };
        pending = true;
        if urgent || last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            if let Err(e) = etcd
                .put(&key, serde_json::to_vec(&shown).unwrap_or_default())
                .await
            {
                tracing::debug!(error = %e, "could not write a snapshot request's progress");
            }
            writes += 1;
            last = Some(tokio::time::Instant::now());
            pending = false;
        }
    }
}

pub fn node_offset(node: &str, jitter: Duration, schedule: &Schedule) -> Duration {
    let cap = match schedule {
        Schedule::Every(d) => jitter.min(*d / 10),
        Schedule::Cron { .. } => jitter,
    };
    let ms = cap.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    // FNV-1a: stable across runs and versions, unlike the standard hasher.
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Duration::from_millis(h % (ms + 1))
}

/// The schedule's next time after `last` (the previous scheduled time, not when it ran). Times whose
/// firing (`+ offset`) has passed by more than a second are skipped, so a host that was busy or suspended
/// does not run the missed snapshots back to back.
pub fn next_fire(
    schedule: &Schedule,
    last: SystemTime,
    offset: Duration,
    now: SystemTime,
) -> Option<SystemTime> {
    let mut next = schedule.next_after(last)?;
    while next + offset + Duration::from_secs(1) < now {
        next = schedule.next_after(next)?;
    }
    Some(next)
}

pub fn check_snapshot_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("snapshot name {name:?}: 1 to 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(format!(
            "snapshot name {name:?}: only letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_states_are_written_as_the_protocol_spells_them() {
        for (state, text) in [
            (RequestState::Running, "running"),
            (RequestState::Done, "done"),
            (RequestState::Failed, "failed"),
            (RequestState::Busy, "busy"),
        ] {
            let req = SnapshotRequest {
                state: Some(state.clone()),
                ..Default::default()
            };
            let json = serde_json::to_string(&req).unwrap();
            assert_eq!(json, format!(r#"{{"state":"{text}"}}"#));
            let back: SnapshotRequest = serde_json::from_str(&json).unwrap();
            assert_eq!(back.state, Some(state.clone()));
            assert_eq!(state.is_answer(), text != "running");
        }
        let odd: SnapshotRequest = serde_json::from_str(r#"{"state":"paused"}"#).unwrap();
        assert_eq!(odd.state, Some(RequestState::Other("paused".into())));
        assert!(!RequestState::Other("paused".into()).is_answer());
    }

    fn t(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(1_800_000_000.0 + secs)
    }

    #[test]
    fn every_fires_on_a_fixed_cadence_however_late_each_run_starts() {
        let every = Schedule::parse("@every 3s").unwrap();
        let offset = node_offset("n1", Duration::from_secs(5), &every);
        assert!(
            offset <= Duration::from_millis(300),
            "a tenth of the period at most: {offset:?}"
        );
        // Each wake-up comes late by a varying amount; the times fired stay 3 s apart.
        let mut last = t(0.0);
        let mut fired = Vec::new();
        for late in [0.0, 0.9, 0.05, 1.7, 0.4] {
            let next = next_fire(&every, last, offset, last).unwrap();
            let woke = next + offset + Duration::from_secs_f64(late);
            fired.push(next);
            last = next;
            assert!(woke >= next);
        }
        for pair in fired.windows(2) {
            assert_eq!(
                pair[1].duration_since(pair[0]).unwrap(),
                Duration::from_secs(3)
            );
        }
    }

    #[test]
    fn missed_times_are_skipped_not_run_back_to_back() {
        let every = Schedule::parse("@every 3s").unwrap();
        let next = next_fire(&every, t(0.0), Duration::ZERO, t(10.5)).unwrap();
        assert_eq!(next, t(12.0));
        let cron = Schedule::parse("*/10 * * * * *").unwrap();
        let next = next_fire(&cron, t(0.0), Duration::ZERO, t(35.0)).unwrap();
        assert!(next >= t(34.0) && next <= t(40.0), "{next:?}");
    }

    #[test]
    fn node_offsets_are_stable_bounded_and_differ_between_nodes() {
        let cron = Schedule::parse("0 */12 * * *").unwrap();
        let j = Duration::from_secs(5);
        let a = node_offset("node-a", j, &cron);
        assert_eq!(a, node_offset("node-a", j, &cron));
        assert!(a <= j);
        let offsets: HashSet<Duration> = (0..20)
            .map(|i| node_offset(&format!("n{i}"), j, &cron))
            .collect();
        assert!(offsets.len() > 10, "{offsets:?}");
        assert_eq!(node_offset("n", Duration::ZERO, &cron), Duration::ZERO);
    }

    #[test]
    fn s3_target_layers_flags_under_the_policy_keys_and_needs_a_bucket() {
        let settings = SnapshotSettings {
            node: "n1".into(),
            dir: PathBuf::from("/tmp/x"),
            keys: KeyLayout::default(),
            schedule: "@every 1h".into(),
            retention: 2,
            compress: false,
            disabled: false,
            jitter: Duration::ZERO,
            local: EtcdConfig::new(Vec::<String>::new()),
            s3: S3Flags {
                policy: S3Policy {
                    endpoint: Some("https://s3.local:9000".into()),
                    prefix: Some("etcd".into()),
                    retention: Some(3),
                    ..Default::default()
                },
                credentials_file: Some(PathBuf::from("/etc/hostlet/s3")),
                ..Default::default()
            },
            key: None,
            disk: None,
        };
        let hourly = Schedule::parse("@every 1h").unwrap();
        let off = EffectivePolicy::layer(&settings, None, None, hourly.clone());
        assert_eq!(off.s3, None, "no bucket, no uploads");
        assert_eq!(off.s3_retention, 3);
        assert_eq!(off.period_seconds(), 3600);
        let cluster: SnapshotPolicy =
            serde_json::from_str(r#"{"s3": {"bucket": "backups", "retention": 10}}"#).unwrap();
        let node: SnapshotPolicy =
            serde_json::from_str(r#"{"s3": {"prefix": "n1-only"}}"#).unwrap();
        let on = EffectivePolicy::layer(&settings, Some(&cluster), Some(&node), hourly.clone());
        let t = on.s3.unwrap();
        assert_eq!(t.bucket, "backups");
        assert_eq!(t.prefix, "n1-only");
        assert_eq!(t.endpoint.as_deref(), Some("https://s3.local:9000"));
        assert_eq!(t.region, DEFAULT_S3_REGION);
        assert_eq!(t.credentials_file, Some(PathBuf::from("/etc/hostlet/s3")));
        assert_eq!(on.s3_retention, 10);
        assert!(serde_json::from_str::<SnapshotPolicy>(r#"{"s3": {"secretKey": "x"}}"#).is_err());
        // Whoever writes a policy key cannot send the snapshots elsewhere: its endpoint is ignored.
        let redirect: SnapshotPolicy = serde_json::from_str(
            r#"{"s3": {"endpoint": "https://attacker.example", "bucket": "b2"}}"#,
        )
        .unwrap();
        assert_eq!(ignored_policy_fields(&redirect), vec!["s3.endpoint"]);
        assert!(ignored_policy_fields(&cluster).is_empty());
        let t = EffectivePolicy::layer(&settings, Some(&redirect), None, hourly)
            .s3
            .unwrap();
        assert_eq!(t.endpoint.as_deref(), Some("https://s3.local:9000"));
        assert_eq!(t.bucket, "b2");
    }

    #[test]
    fn invalid_names_are_refused_with_the_reason() {
        for bad in ["../../evil", "a/b", &"x".repeat(300)] {
            let e = check_snapshot_name(bad).unwrap_err();
            assert!(e.contains("snapshot name"), "{e}");
        }
        assert!(check_snapshot_name("pre-upgrade_1.2").is_ok());
    }
}
