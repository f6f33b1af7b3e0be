//! Files the agent writes whole or not at all: certificates, keys, the revocation list, the token, the
//! data dir's markers. Each is written to a temporary name beside it (0600 while it is incomplete) and
//! renamed over the old one, so that a reader (etcd, the API's TLS reload, a restart) or an agent stopped
//! mid-write finds the old file or the new one, never part of one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `contents` to `path`, ending with `mode`, through a temporary file in the same directory.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic_with(path, mode, |f| f.write_all(contents))
}

/// [`write_atomic`], where `fill` writes the contents into the temporary file. An error or a panic in
/// `fill` leaves `path` as it was and removes the temporary file.
pub fn write_atomic_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = Temporary(temporary_name(path)?);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp.0)?;
    fill(&mut f)?;
    f.sync_all()?;
    drop(f);
    // The tests stop an agent while this write is held here (tests/agent_stop.rs).
    fail::fail_point!("files::before-rename");
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp.0, path)?;
    std::mem::forget(tmp);
    // The rename itself survives a power cut once the directory is synced; a failure here leaves the
    // file whole either way.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// `.<name>.<pid>.<n>.tmp` beside `path`: one per write, so that two writers (a certificate and its key,
/// a renewal and the revocation list) never share one.
fn temporary_name(path: &Path) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id());
    Ok(path.with_file_name(tmp))
}

/// Removes the temporary file unless the write got as far as renaming it.
struct Temporary(PathBuf);

impl Drop for Temporary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_ends_with_its_mode_and_no_temporary_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.crt");
        write_atomic(&path, b"old\n", 0o644).unwrap();
        write_atomic(&path, b"new\n", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(dir.path()), vec!["server.crt"]);
    }

    #[test]
    fn a_writer_stopped_mid_write_leaves_the_old_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked.crl");
        write_atomic(&path, b"old list\n", 0o644).unwrap();
        // Stopped by an error half way through.
        let stopped = write_atomic_with(&path, 0o644, |f| {
            f.write_all(b"new li")?;
            Err(std::io::Error::other("stopped"))
        });
        assert!(stopped.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old list\n");
        // Stopped by a panic half way through.
        let panicked = std::panic::catch_unwind(|| {
            let _ = write_atomic_with(&path, 0o644, |f| {
                f.write_all(b"new li")?;
                panic!("the writer's thread ends here");
            });
        });
        assert!(panicked.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old list\n");
        assert_eq!(names(dir.path()), vec!["revoked.crl"]);
    }

    #[test]
    fn a_reader_during_a_write_sees_the_old_file_and_then_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.key");
        write_atomic(&path, b"old key\n", 0o600).unwrap();
        let (half, half_rx) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                write_atomic_with(&path, 0o600, |f| {
                    f.write_all(b"new ")?;
                    half.send(()).unwrap();
                    go_rx.recv().unwrap();
                    f.write_all(b"key\n")
                })
            })
        };
        half_rx.recv().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old key\n");
        go.send(()).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new key\n");
        assert_eq!(names(dir.path()), vec!["client.key"]);
    }
}
