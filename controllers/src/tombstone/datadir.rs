//! The member dir on disk: tombstones, backups and the sanity check made before etcd is started. Data is
//! moved, never deleted — except that only the newest [`BACKUPS_KEPT`] backups are kept.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// How many `db/etcd-backup-<unix>` dirs are kept.
pub const BACKUPS_KEPT: usize = 5;
/// The file that marks a member dir for backup and rejoin.
pub const TOMBSTONE: &str = "tombstone";
/// Written by a cluster reset; a second reset without a restore path is refused while it exists.
pub const RESET_FLAG: &str = "reset-flag";
/// Where the first normal start that serves after a reset moves the flag's lines: the history of resets.
pub const RESET_HISTORY: &str = "reset-history";

/// Retires `db/reset-flag` once the member served after a reset: its lines are appended to
/// `db/reset-history` and the flag goes, so a later reset on purpose is not refused, while a reset
/// repeated by accident before the member served still is. True when there was a flag to retire.
pub fn retire_reset_flag(db_dir: &Path) -> std::io::Result<bool> {
    use std::io::Write;
    let flag = db_dir.join(RESET_FLAG);
    let lines = match std::fs::read_to_string(&flag) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut history = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(db_dir.join(RESET_HISTORY))?;
    history.write_all(lines.as_bytes())?;
    if !lines.is_empty() && !lines.ends_with('\n') {
        history.write_all(b"\n")?;
    }
    history.sync_all()?;
    std::fs::remove_file(&flag)?;
    Ok(true)
}

/// What is wrong with a member dir.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("{dir}: {source}")]
    Io {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{dir} is not a usable etcd member dir ({why}). hostlet will not start etcd on it. To back it up and \
         rejoin the cluster, create the file {dir}/tombstone and start again with --server <url of a running \
         hostlet> --token <token>; to start over from a snapshot, use --cluster-reset --cluster-reset-restore-path FILE"
    )]
    Unusable { dir: String, why: String },
}

fn io(dir: &Path) -> impl Fn(std::io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io {
        dir: dir.display().to_string(),
        source,
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `db/rejoin-pending`: written before a tombstoned member dir is backed up and removed once the new
/// member serves, so that an agent stopped in between (the member dir moved, no new one yet) rejoins at
/// its next start instead of taking the empty `db/etcd` for a first node's and founding a cluster of its
/// own. It holds the previous member's name.
pub const REJOIN_PENDING: &str = "rejoin-pending";

/// Records that a rejoin has begun (before the member dir is moved).
pub fn mark_rejoin_pending(db_dir: &Path, previous_name: Option<&str>) -> Result<(), DataDirError> {
    std::fs::create_dir_all(db_dir).map_err(io(db_dir))?;
    let path = db_dir.join(REJOIN_PENDING);
    let body = format!("{}\n", previous_name.unwrap_or(""));
    crate::files::write_atomic(&path, body.as_bytes(), 0o644).map_err(io(&path))
}

/// `Some(previous member name, empty when unknown)` while a rejoin begun earlier has not served yet.
pub fn rejoin_pending(db_dir: &Path) -> Option<String> {
    std::fs::read_to_string(db_dir.join(REJOIN_PENDING))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The new member serves: the rejoin is over.
pub fn clear_rejoin_pending(db_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(db_dir.join(REJOIN_PENDING)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `member_dir/tombstone` exists.
pub fn has_tombstone(member_dir: &Path) -> bool {
    member_dir.join(TOMBSTONE).exists()
}

/// Marks the member dir for backup and rejoin at the next start, with the reason inside.
pub fn write_tombstone(member_dir: &Path, reason: &str) -> Result<(), DataDirError> {
    std::fs::create_dir_all(member_dir).map_err(io(member_dir))?;
    let path = member_dir.join(TOMBSTONE);
    crate::files::write_atomic(&path, format!("{reason}\n").as_bytes(), 0o644).map_err(io(&path))
}

/// Checks an existing member dir before etcd runs on it: it must hold a WAL or a snapshot, and its bolt
/// database, when present, must be readable and start like one. `Ok(false)` when there is no member dir,
/// or it holds nothing but hostlet's own files (name, tombstone).
pub fn check_member_dir(member_dir: &Path) -> Result<bool, DataDirError> {
    let shown = member_dir.display().to_string();
    let entries: Vec<String> = match std::fs::read_dir(member_dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(DataDirError::Unusable {
                dir: shown,
                why: format!("cannot be read: {e}"),
            })
        }
    };
    if entries.iter().all(|n| n == "name" || n == TOMBSTONE) {
        return Ok(false);
    }
    let member = member_dir.join("member");
    if first_start_scaffolding_only(member_dir, &entries) {
        // etcd makes member/snap, then asks the cluster, then writes its WAL: stopped in between, a
        // joining or founding member leaves empty dirs and no data, and etcd starts over on them.
        return Ok(false);
    }
    let wal = member.join("wal");
    let snap = member.join("snap");
    let non_empty = |p: &Path| {
        std::fs::read_dir(p)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    };
    if !non_empty(&wal) && !non_empty(&snap) {
        return Err(DataDirError::Unusable {
            dir: shown,
            why: "it has neither member/wal nor member/snap".into(),
        });
    }
    let db = snap.join("db");
    if db.exists() {
        let mut head = [0u8; 32];
        let read =
            std::fs::File::open(&db).and_then(|mut f| std::io::Read::read(&mut f, &mut head));
        match read {
            Err(e) => {
                return Err(DataDirError::Unusable {
                    dir: shown,
                    why: format!("member/snap/db cannot be read: {e}"),
                })
            }
            // A bolt database starts with a meta page whose magic is 0xED0CDAED at offset 16+0..4 of the page.
            Ok(n) if n < 32 || head[16..20] != 0xED0C_DAEDu32.to_le_bytes() => {
                return Err(DataDirError::Unusable {
                    dir: shown,
                    why: "member/snap/db is not a bolt database".into(),
                })
            }
            Ok(_) => {}
        }
    }
    Ok(true)
}

/// Only hostlet's own files and the empty dirs etcd makes before its WAL exists (`member/snap`,
/// `member/wal`, and the `member/wal.tmp` it removes itself): nothing of a member's data.
fn first_start_scaffolding_only(member_dir: &Path, entries: &[String]) -> bool {
    let empty_dir = |p: &Path| {
        std::fs::read_dir(p)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false)
    };
    let ours = |n: &String| n == "name" || n == TOMBSTONE || n == "member";
    if !entries.iter().all(ours) {
        return false;
    }
    let member = member_dir.join("member");
    let Ok(inner) = std::fs::read_dir(&member) else {
        return false;
    };
    inner.flatten().all(|e| {
        let name = e.file_name();
        match name.to_str() {
            Some("snap") | Some("wal") => empty_dir(&e.path()),
            Some("wal.tmp") => e.file_type().map(|t| t.is_dir()).unwrap_or(false),
            _ => false,
        }
    })
}

/// Moves `db/etcd` to `db/etcd-backup-<unix>` and keeps the newest [`BACKUPS_KEPT`] backups. Returns the
/// backup's path.
pub fn backup_member_dir(db_dir: &Path) -> Result<PathBuf, DataDirError> {
    let member_dir = db_dir.join("etcd");
    let mut unix = now_unix();
    let mut dest = db_dir.join(format!("etcd-backup-{unix}"));
    while dest.exists() {
        unix += 1;
        dest = db_dir.join(format!("etcd-backup-{unix}"));
    }
    std::fs::rename(&member_dir, &dest).map_err(io(&member_dir))?;
    rotate_backups(db_dir)?;
    Ok(dest)
}

/// Moves `db/etcd` aside to `db/etcd-old-<unix>` (before a restore). Returns where it went.
pub fn move_aside_for_restore(db_dir: &Path) -> Result<Option<PathBuf>, DataDirError> {
    let member_dir = db_dir.join("etcd");
    if !member_dir.exists() {
        return Ok(None);
    }
    let mut unix = now_unix();
    let mut dest = db_dir.join(format!("etcd-old-{unix}"));
    while dest.exists() {
        unix += 1;
        dest = db_dir.join(format!("etcd-old-{unix}"));
    }
    std::fs::rename(&member_dir, &dest).map_err(io(&member_dir))?;
    Ok(Some(dest))
}

/// The backups, oldest first.
pub fn backups(db_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(db_dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let unix = name.strip_prefix("etcd-backup-")?.parse::<u64>().ok()?;
                    Some((unix, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

fn rotate_backups(db_dir: &Path) -> Result<(), DataDirError> {
    let all = backups(db_dir);
    if all.len() > BACKUPS_KEPT {
        for old in &all[..all.len() - BACKUPS_KEPT] {
            tracing::info!(backup = %old.display(), "removing the oldest member backup ({BACKUPS_KEPT} are kept)");
            std::fs::remove_dir_all(old).map_err(io(old))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retiring_the_reset_flag_keeps_its_lines_in_the_history() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            !retire_reset_flag(dir.path()).unwrap(),
            "no flag: nothing to do"
        );
        std::fs::write(dir.path().join(RESET_FLAG), "reset 1\n").unwrap();
        assert!(retire_reset_flag(dir.path()).unwrap());
        assert!(!dir.path().join(RESET_FLAG).exists());
        std::fs::write(dir.path().join(RESET_FLAG), "reset 2").unwrap();
        assert!(retire_reset_flag(dir.path()).unwrap());
        let history = std::fs::read_to_string(dir.path().join(RESET_HISTORY)).unwrap();
        assert_eq!(history, "reset 1\nreset 2\n");
    }

    #[test]
    fn a_pending_rejoin_is_marked_read_and_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("db");
        assert_eq!(rejoin_pending(&db), None);
        mark_rejoin_pending(&db, Some("n-00000000")).unwrap();
        assert_eq!(rejoin_pending(&db).as_deref(), Some("n-00000000"));
        clear_rejoin_pending(&db).unwrap();
        assert_eq!(rejoin_pending(&db), None);
        clear_rejoin_pending(&db).unwrap();
        mark_rejoin_pending(&db, None).unwrap();
        assert_eq!(rejoin_pending(&db).as_deref(), Some(""));
    }

    fn fake_member(dir: &Path) {
        std::fs::create_dir_all(dir.join("member/wal")).unwrap();
        std::fs::write(dir.join("member/wal/0.wal"), b"x").unwrap();
        std::fs::write(dir.join("name"), b"n-00000000\n").unwrap();
    }

    #[test]
    fn six_backups_leave_five_newest_and_the_dir_moves_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("db");
        let mut made = Vec::new();
        for round in 0..6 {
            fake_member(&db.join("etcd"));
            std::fs::write(db.join("etcd/round"), round.to_string()).unwrap();
            made.push(backup_member_dir(&db).unwrap());
            assert!(!db.join("etcd").exists());
        }
        let kept = backups(&db);
        assert_eq!(kept.len(), 5);
        assert_eq!(kept, made[1..].to_vec());
        assert_eq!(std::fs::read_to_string(kept[4].join("round")).unwrap(), "5");
    }

    #[test]
    fn garbage_member_dir_is_refused_with_the_way_out() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("etcd");
        assert!(!check_member_dir(&dir).unwrap(), "no dir: nothing to check");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("name"), "n").unwrap();
        assert!(!check_member_dir(&dir).unwrap(), "only our own files");
        std::fs::write(dir.join("junk"), "x").unwrap();
        let e = check_member_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains(&dir.display().to_string()) && e.contains("tombstone"),
            "{e}"
        );
        std::fs::remove_file(dir.join("junk")).unwrap();
        std::fs::create_dir_all(dir.join("member/snap")).unwrap();
        std::fs::create_dir_all(dir.join("member/wal.tmp")).unwrap();
        std::fs::write(dir.join("member/wal.tmp/0.tmp"), vec![0u8; 64]).unwrap();
        assert!(
            !check_member_dir(&dir).unwrap(),
            "an etcd stopped before its first WAL left no data: a first start again"
        );
        std::fs::create_dir_all(dir.join("member/other")).unwrap();
        assert!(
            check_member_dir(&dir).is_err(),
            "anything else in member/ is not scaffolding"
        );
        std::fs::remove_dir_all(dir.join("member")).unwrap();
        std::fs::write(dir.join("junk"), "x").unwrap();
        fake_member(&dir);
        assert!(check_member_dir(&dir).unwrap());
        std::fs::create_dir_all(dir.join("member/snap")).unwrap();
        std::fs::write(dir.join("member/snap/db"), vec![7u8; 4096]).unwrap();
        assert!(check_member_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("bolt"));
    }

    #[test]
    fn tombstone_round_trip_and_move_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("db");
        fake_member(&db.join("etcd"));
        assert!(!has_tombstone(&db.join("etcd")));
        write_tombstone(&db.join("etcd"), "member removed").unwrap();
        assert!(has_tombstone(&db.join("etcd")));
        let old = move_aside_for_restore(&db).unwrap().unwrap();
        assert!(old
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("etcd-old-"));
        assert!(old.join("member/wal/0.wal").exists());
        assert_eq!(move_aside_for_restore(&db).unwrap(), None);
    }
}
