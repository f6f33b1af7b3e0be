//! Offline restore of a snapshot file into a fresh member dir (for a cluster reset): decrypt and
//! authenticate an encrypted one, decompress when needed, verify etcd's sha256 trailer, then let
//! `etcdutl snapshot restore` (etcd 3.5 and later) or `etcdctl snapshot restore` (3.4) lay out the member:
//! [`RestoreTool`] says which.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::encryption::SnapshotKey;
use super::file::{self, SnapshotFileError};
pub use crate::etcd_member::version::RestoreTool;

/// How the restored member is named and where it listens to peers.
#[derive(Debug, Clone)]
pub struct RestoreTarget {
    /// The member dir to create (`<data-dir>/db/etcd`); it must not exist yet.
    pub member_dir: PathBuf,
    pub name: String,
    pub peer_url: String,
    /// etcdutl or etcdctl ([`crate::etcd_member::version::Capabilities::restore_tool`]).
    pub tool: RestoreTool,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    File(#[from] SnapshotFileError),
    #[error("{0} already exists; a restore only writes a fresh dir")]
    Exists(String),
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} snapshot restore failed: {message}")]
    Tool { tool: &'static str, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Checks a snapshot file without changing anything; returns the database size. An encrypted file needs
/// `key`; with a key, a plain file is refused.
pub fn check(
    snapshot: &Path,
    key: Option<&SnapshotKey>,
    progress: impl FnMut(u64),
) -> Result<u64, RestoreError> {
    Ok(file::verify(snapshot, None, key, progress)?)
}

/// Restores `snapshot` into `target.member_dir`. Nothing outside that new dir (and a temp file beside it) is
/// written; on failure the new dir is removed again, since it held nothing before.
pub fn restore(
    snapshot: &Path,
    key: Option<&SnapshotKey>,
    target: &RestoreTarget,
    progress: impl FnMut(u64),
) -> Result<u64, RestoreError> {
    if target.member_dir.exists() {
        return Err(RestoreError::Exists(
            target.member_dir.display().to_string(),
        ));
    }
    let parent = target
        .member_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    // The dirs this restore creates, deepest first, so a refused one removes them again.
    let made: Vec<PathBuf> = parent
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    file::private_dir(&parent).map_err(|source| RestoreError::Io {
        path: parent.display().to_string(),
        source,
    })?;
    let plain = parent.join(format!(".restore-{}.db", std::process::id()));
    let result = (|| {
        let size = file::verify(snapshot, Some(&plain), key, progress)?;
        let mut cmd = Command::new(target.tool.program());
        if let RestoreTool::Etcdctl(_) = target.tool {
            cmd.env("ETCDCTL_API", "3");
        }
        let out = cmd
            .arg("snapshot")
            .arg("restore")
            .arg(&plain)
            .arg("--data-dir")
            .arg(&target.member_dir)
            .arg("--name")
            .arg(&target.name)
            .arg("--initial-cluster")
            .arg(format!("{}={}", target.name, target.peer_url))
            .arg("--initial-advertise-peer-urls")
            .arg(&target.peer_url)
            .output()
            .map_err(|source| RestoreError::Spawn {
                program: target.tool.program().display().to_string(),
                source,
            })?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&target.member_dir);
            return Err(RestoreError::Tool {
                tool: target.tool.name(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(size)
    })();
    let _ = std::fs::remove_file(&plain);
    if result.is_err() {
        // A refused restore leaves the data dir as it found it.
        for d in &made {
            let _ = std::fs::remove_dir(d); // only when empty
        }
    }
    result
}
