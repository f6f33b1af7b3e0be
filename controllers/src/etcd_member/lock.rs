//! One agent per data dir. `hostlet run` (and `--cluster-reset`) hold an exclusive lock on
//! `<data-dir>/hostlet.lock` for as long as they run, so a second agent, or a reset started while the agent
//! still runs, is refused before it moves, restores or starts anything on the member dir in use.
//!
//! The lock is the kernel's (`flock`): it goes away with the process however it ends, so a stale file never
//! blocks a start. The file holds the pid of the holder, for the refusal message.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name in the data dir.
pub const LOCK_FILE: &str = "hostlet.lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data dir {} is in use by another hostlet{}: stop it first (one agent per data dir; \
         --cluster-reset also needs the agent stopped)",
        dir.display(),
        holder.as_ref().map(|p| format!(" (pid {p}, see {})", dir.join(LOCK_FILE).display())).unwrap_or_default()
    )]
    InUse { dir: PathBuf, holder: Option<u32> },
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held while the agent runs; dropping it releases the data dir.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of `data_dir`, which must exist.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock only reads the descriptor, which `file` keeps open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io(e));
            }
            let holder = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(LockError::InUse {
                dir: data_dir.to_path_buf(),
                holder,
            });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file, path })
    }

    /// Takes the lock when `data_dir` exists; a data dir not created yet has nobody on it.
    pub fn acquire_if_exists(data_dir: &Path) -> Result<Option<DataDirLock>, LockError> {
        if data_dir.is_dir() {
            Self::acquire(data_dir).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let pid = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        match DataDirLock::acquire(dir.path()) {
            Err(e @ LockError::InUse { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&dir.path().display().to_string()), "{text}");
                assert!(
                    text.contains(&format!("pid {}", std::process::id())),
                    "{text}"
                );
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first);
        let again = DataDirLock::acquire(dir.path()).unwrap();
        assert!(again.path().exists());
    }

    #[test]
    fn a_missing_data_dir_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-yet");
        assert!(DataDirLock::acquire_if_exists(&missing).unwrap().is_none());
        assert!(!missing.exists());
    }
}
