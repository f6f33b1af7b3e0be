//! Taking one snapshot: stream the local member's database into a verified file and describe it as a record.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use hostlet_api::objects::{SnapshotRecord, SnapshotStatus, Timestamp};

use super::encryption::SnapshotKey;
use super::file::{self, SnapshotFileError, SnapshotWriter};
use super::retention::SnapshotName;

/// What to snapshot and where.
#[derive(Debug, Clone)]
pub struct TakeRequest {
    pub dir: PathBuf,
    pub node: String,
    /// `etcd-snapshot` for scheduled ones, the operator's name for on-demand ones.
    pub name: String,
    pub compress: bool,
    /// Encrypts the file when set.
    pub key: Option<Arc<SnapshotKey>>,
    pub on_demand: bool,
}

/// Why a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("snapshot stream from etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error(transparent)]
    File(#[from] SnapshotFileError),
    #[error("snapshot dir {dir}: {source}")]
    Dir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot writer stopped: {0}")]
    Writer(String),
}

impl TakeRequest {
    pub fn file_name(&self, unix: u64) -> SnapshotName {
        SnapshotName {
            name: self.name.clone(),
            node: self.node.clone(),
            unix,
            compressed: self.compress,
            encrypted: self.key.is_some(),
        }
    }

    /// A record of a failure, so the operator sees it where successes are listed.
    pub fn failed_record(&self, unix: u64, error: &str) -> SnapshotRecord {
        SnapshotRecord {
            name: self.name.clone(),
            node: self.node.clone(),
            file: self.file_name(unix).file(),
            size: 0,
            sha256: String::new(),
            revision: 0,
            created: Timestamp::from_unix(unix),
            duration_seconds: 0.0,
            compressed: self.compress,
            encrypted: self.key.is_some(),
            on_demand: self.on_demand,
            status: SnapshotStatus::Failed,
            error: Some(error.to_string()),
            local: true,
            remote: None,
        }
    }
}

/// Streams a snapshot from `client` (which must talk to the local member only: a snapshot stream comes from
/// one endpoint) into `<dir>/<name>-<node>-<unix>[.zst][.enc]` (0600 in a 0700 dir). Disk writes run on a blocking thread beside the
/// network reads. `progress` sees the bytes received so far.
pub async fn take_snapshot(
    client: &mut etcd_client::Client,
    req: &TakeRequest,
    unix: u64,
    mut progress: impl FnMut(u64) + Send,
) -> Result<SnapshotRecord, TakeError> {
    let started = Instant::now();
    // When it began, to the millisecond (the file name carries the second, possibly bumped past a taken
    // one): "a snapshot taken since T" is judged by this.
    let created = Timestamp::now();
    file::private_dir(&req.dir).map_err(|source| TakeError::Dir {
        dir: req.dir.display().to_string(),
        source,
    })?;
    let name = req.file_name(unix);
    let dest = req.dir.join(name.file());
    let revision = client
        .status()
        .await?
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let mut stream = client.snapshot().await?;

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let compress = req.compress;
    let key = req.key.clone();
    let writer = tokio::task::spawn_blocking(move || -> Result<_, SnapshotFileError> {
        let mut w = SnapshotWriter::create(&dest, compress, key.as_deref())?;
        while let Some(chunk) = rx.blocking_recv() {
            w.write_chunk(&chunk)?;
        }
        w.finish()
    });
    let mut received = 0u64;
    let streamed: Result<(), TakeError> = async {
        while let Some(msg) = stream.message().await? {
            received += msg.blob().len() as u64;
            progress(received);
            if tx.send(msg.blob().to_vec()).await.is_err() {
                // The writer stopped early; its own error says why.
                break;
            }
        }
        Ok(())
    }
    .await;
    drop(tx);
    let written = writer.await.map_err(|e| TakeError::Writer(e.to_string()))?;
    streamed?;
    let written = written?;
    Ok(SnapshotRecord {
        name: req.name.clone(),
        node: req.node.clone(),
        file: name.file(),
        size: written.file_size,
        sha256: written.file_sha256,
        revision,
        created,
        duration_seconds: started.elapsed().as_secs_f64(),
        compressed: req.compress,
        encrypted: req.key.is_some(),
        on_demand: req.on_demand,
        status: SnapshotStatus::Successful,
        error: None,
        local: true,
        remote: None,
    })
}
