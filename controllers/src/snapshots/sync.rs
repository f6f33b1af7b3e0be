//! The object-storage pass: uploads this node's good snapshots that have no verified copy yet, keeps
//! exactly the newest objects per name under this node's prefix, and makes the records say so.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hostlet_api::objects::{RemoteCopy, RemoteState, SnapshotRecord, SnapshotStatus, Timestamp};
use hostlet_runtime::etcd::EtcdError;

use super::catalogue::{now_unix, Catalogue};
use super::metrics::SnapshotMetrics;
use super::policy::EffectivePolicy;
use super::remote::{Remote, RemoteError, S3Target};
use super::request::UploadProgress;
use super::retention::{self, Candidate, SnapshotName};
use crate::events::{EventKind, EventRecorder};

/// Why a pass over object storage stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// Passes over object storage for one node's catalogue, one at a time.
pub struct RemoteSync {
    catalogue: Catalogue,
    events: EventRecorder,
    metrics: Arc<SnapshotMetrics>,
    /// The client of the target in force, rebuilt when the target changes.
    remote: Mutex<Option<(S3Target, Arc<Remote>)>>,
    /// One pass at a time: a scheduled run and a policy change must not upload the same file twice.
    pass: tokio::sync::Mutex<()>,
}

impl RemoteSync {
    pub fn new(
        catalogue: Catalogue,
        events: EventRecorder,
        metrics: Arc<SnapshotMetrics>,
    ) -> RemoteSync {
        RemoteSync {
            catalogue,
            events,
            metrics,
            remote: Mutex::new(None),
            pass: tokio::sync::Mutex::new(()),
        }
    }

    /// Sets `hostlet_snapshot_remote_count` from a listing of this node's objects in `target`.
    pub async fn count(&self, target: &S3Target) -> Result<usize, RemoteError> {
        let n = self
            .remote_for(target)?
            .list(self.catalogue.node())
            .await?
            .len();
        self.metrics.remote_count.set(n as i64);
        Ok(n)
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
    /// `progress` hears how each upload goes.
    pub async fn sync(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
        progress: &mut (dyn FnMut(UploadProgress) + Send),
    ) -> Result<Vec<String>, SyncError> {
        let Some(target) = &policy.s3 else {
            return Ok(Vec::new());
        };
        let _pass = self.pass.lock().await;
        let node = self.catalogue.node();
        let mut records = self.catalogue.records().await?;
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
                self.catalogue.put_record(r).await?;
                continue;
            }
            let started = Instant::now();
            let result = remote
                .upload_with(
                    &self.catalogue.dir().join(f),
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
                self.catalogue.delete_record(&r.file).await?;
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
            self.catalogue.put_record(r).await?;
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
        if let Err(e) = self.catalogue.put_record(r).await {
            tracing::warn!(error = %e, file = %r.file, "could not record an upload");
        }
    }
}
