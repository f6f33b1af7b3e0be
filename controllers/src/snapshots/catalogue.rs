//! This node's snapshot catalogue: the files in its snapshot dir and their records under
//! `/hostlet/snapshots/<node>/`, kept in agreement, and local retention over them. It needs no scheduler:
//! `hostlet etcd snapshot prune` uses it on its own.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hostlet_api::objects::{RemoteState, SnapshotRecord, SnapshotStatus, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::etcd::{Etcd, EtcdError};

use super::encryption::SnapshotKey as EncryptionKey;
use super::file::{self, sha256_file};
use super::policy::SnapshotSettings;
use super::retention::{self, Candidate, SnapshotName, SCHEDULED_NAME};

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One node's snapshot files and records.
#[derive(Clone)]
pub struct Catalogue {
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    dir: PathBuf,
    /// Checks a file found without a record when it is encrypted.
    key: Option<Arc<EncryptionKey>>,
}

impl Catalogue {
    pub fn new(
        etcd: Etcd,
        keys: KeyLayout,
        node: String,
        dir: PathBuf,
        key: Option<Arc<EncryptionKey>>,
    ) -> Catalogue {
        Catalogue {
            etcd,
            keys,
            node,
            dir,
            key,
        }
    }

    /// The catalogue the settings describe.
    pub fn of(settings: &SnapshotSettings, etcd: Etcd) -> Catalogue {
        Catalogue::new(
            etcd,
            settings.keys.clone(),
            settings.node.clone(),
            settings.dir.clone(),
            settings.key.clone(),
        )
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes `.part` files a crash left behind, then makes records and files agree: records of
    /// missing files go, files without records are recorded. Returns when the newest verified upload was
    /// made (unix seconds), if any is recorded.
    pub async fn reconcile(&self) -> Result<Option<u64>, EtcdError> {
        let dir = &self.dir;
        let node = &self.node;
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
            .get_prefix(self.keys.node_snapshots_prefix(node))
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
            let key = self.key.as_deref().filter(|_| parsed.encrypted);
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
        Ok(last_remote)
    }

    /// Snapshot files of this node in the snapshot dir.
    pub fn count_files(&self) -> usize {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        SnapshotName::parse(&e.file_name().to_string_lossy(), &self.node).is_some()
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Writes a snapshot's record.
    pub async fn put_record(&self, r: &SnapshotRecord) -> Result<(), EtcdError> {
        let key = self.keys.snapshot_record(&r.node, &r.file);
        self.etcd
            .put(key, serde_json::to_vec(r).unwrap_or_default())
            .await
            .map(|_| ())
    }

    /// Removes the record of `file`.
    pub async fn delete_record(&self, file: &str) -> Result<(), EtcdError> {
        self.etcd
            .delete(self.keys.snapshot_record(&self.node, file))
            .await
            .map(|_| ())
    }

    /// This node's records by file name; a record that does not parse is left out.
    pub async fn records(&self) -> Result<BTreeMap<String, SnapshotRecord>, EtcdError> {
        let (kvs, _) = self
            .etcd
            .get_prefix(self.keys.node_snapshots_prefix(&self.node))
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
        let gone = self
            .delete_chosen(|c| retention::to_prune(c, retention as usize, now_unix()))
            .await?;
        if !gone.is_empty() {
            tracing::info!(deleted = ?gone, retention, "snapshot retention applied");
        }
        Ok(gone)
    }

    /// Before a snapshot named `name` is written: deletes the oldest of that name so that, with the new
    /// file, the node holds no more than `retention` of them (see [`retention::to_make_room`]).
    pub async fn make_room(&self, name: &str, retention: u32) -> Result<Vec<String>, EtcdError> {
        let gone = self
            .delete_chosen(|c| retention::to_make_room(c, name, retention as usize))
            .await?;
        if !gone.is_empty() {
            tracing::info!(deleted = ?gone, retention, "snapshot retention applied before a new snapshot");
        }
        Ok(gone)
    }

    /// Deletes the local snapshots `choose` picks among this node's (see [`Catalogue::delete_local`]).
    async fn delete_chosen(
        &self,
        choose: impl FnOnce(&[Candidate]) -> Vec<String>,
    ) -> Result<Vec<String>, EtcdError> {
        let records = self.records().await?;
        let candidates: Vec<Candidate> = records
            .values()
            .filter(|r| r.local)
            .map(Candidate::from_record)
            .collect();
        let gone = choose(&candidates);
        self.delete_local(&records, gone).await
    }

    /// Deletes the local files `gone` and their records (a record whose object stays in object storage is
    /// kept, saying `local: false`); returns the files deleted.
    async fn delete_local(
        &self,
        records: &BTreeMap<String, SnapshotRecord>,
        gone: Vec<String>,
    ) -> Result<Vec<String>, EtcdError> {
        let mut deleted = Vec::new();
        for f in gone {
            let path = self.dir.join(&f);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "could not delete snapshot; keeping its record");
                    continue;
                }
            }
            match records.get(&f) {
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
                    self.delete_record(&f).await?;
                }
            }
            deleted.push(f);
        }
        Ok(deleted)
    }
}
