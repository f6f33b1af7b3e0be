//! `SnapshotScheduler`: takes this node's snapshots on a schedule and on request, one at a time, records each
//! in etcd and keeps exactly the configured number. Its parts: [`super::policy`] (flags and policy keys),
//! [`super::catalogue`] (files, records, local retention), [`super::sync`] (object storage),
//! [`super::request`] (the on-demand protocol) and [`super::controller`] (how it runs in the agent).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostlet_api::objects::{SnapshotPolicy, SnapshotRecord};
use hostlet_runtime::etcd::{Etcd, EtcdError};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Metrics, Store};

use super::catalogue::{now_unix, Catalogue};
use super::metrics::SnapshotMetrics;
use super::policy::{ignored_policy_fields, EffectivePolicy, SnapshotSettings};
use super::remote::RemoteError;
use super::request::{TakeProgress, UploadProgress};
use super::schedule::Schedule;
use super::sync::{RemoteSync, SyncError};
use super::take::{take_snapshot, TakeError, TakeRequest};
use crate::events::{EventKind, EventRecorder};

/// How long a snapshot under way may go on once the agent stops: within the agent's drain, so that its
/// request is answered (`failed`, "interrupted") rather than left `running` with nobody to finish it.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

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
    #[error("interrupted: the agent stopped while taking this snapshot; ask again once it runs")]
    Interrupted,
}

/// The scheduler. Build with [`SnapshotScheduler::new`], then [`SnapshotScheduler::run`].
pub struct SnapshotScheduler {
    pub(super) settings: SnapshotSettings,
    pub(super) etcd: Etcd,
    pub(super) events: EventRecorder,
    pub(super) metrics: Arc<SnapshotMetrics>,
    pub(super) busy: tokio::sync::Mutex<()>,
    pub(super) policy: Mutex<EffectivePolicy>,
    /// This node's files and records.
    pub(super) catalogue: Catalogue,
    /// The object-storage passes.
    pub(super) remote: RemoteSync,
    /// Policy key revisions whose ignored fields were reported: one event per write of a key.
    pub(super) ignored_reported: Mutex<HashSet<(String, i64)>>,
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
        let m = Arc::new(SnapshotMetrics::new(metrics.registry()).map_err(|e| e.to_string())?);
        let policy = EffectivePolicy::layer(&settings, None, None, schedule);
        m.period.set(policy.period_seconds() as i64);
        if policy.s3.is_some() {
            m.last_success.with_label_values(&["remote"]);
        }
        let catalogue = Catalogue::of(&settings, etcd.clone());
        let remote = RemoteSync::new(catalogue.clone(), events.clone(), m.clone());
        Ok(SnapshotScheduler {
            settings,
            etcd,
            events,
            catalogue,
            remote,
            metrics: m,
            busy: tokio::sync::Mutex::new(()),
            policy: Mutex::new(policy),
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
    pub(super) async fn refresh_policy(
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

    /// Makes files and records agree (see [`Catalogue::reconcile`]) and counts them.
    pub async fn reconcile_catalogue(&self) -> Result<(), EtcdError> {
        if let Some(t) = self.catalogue.reconcile().await? {
            self.metrics
                .last_success
                .with_label_values(&["remote"])
                .set(t as i64);
        }
        self.count_files();
        Ok(())
    }

    fn count_files(&self) {
        self.metrics.files.set(self.catalogue.count_files() as i64);
    }

    /// Local retention (see [`Catalogue::prune`]); returns the files deleted.
    pub async fn prune(&self, retention: u32) -> Result<Vec<String>, EtcdError> {
        let gone = self.catalogue.prune(retention).await?;
        self.count_files();
        Ok(gone)
    }

    /// Sets `hostlet_snapshot_remote_count` from a listing of this node's objects; `None` without a bucket.
    pub async fn count_remote(&self) -> Result<Option<usize>, RemoteError> {
        let Some(target) = self.policy().s3 else {
            return Ok(None);
        };
        self.remote.count(&target).await.map(Some)
    }

    /// One pass over object storage (see [`RemoteSync::sync`]); returns the objects deleted.
    pub async fn sync_remote(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
    ) -> Result<Vec<String>, SyncError> {
        self.remote.sync(policy, upload, &mut |_| {}).await
    }

    /// [`SnapshotScheduler::sync_remote`], telling `progress` how each upload goes.
    pub async fn sync_remote_with(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
        progress: &mut (dyn FnMut(UploadProgress) + Send),
    ) -> Result<Vec<String>, SyncError> {
        self.remote.sync(policy, upload, progress).await
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
        // Room first: with the new file the node holds no more than the retention, so a disk sized for
        // that many snapshots does not fill. A failure here costs exactness, not the snapshot.
        if let Err(e) = self.catalogue.make_room(name, policy.retention).await {
            tracing::warn!(error = %e, "retention before a snapshot failed; applied after it");
        }
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
                self.catalogue.put_record(&rec).await?;
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
                if let Err(pe) = self.catalogue.put_record(&rec).await {
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
}
