//! Where the member keeps its files under `<data-dir>`, and the member name.

use std::path::{Path, PathBuf};

use rand::RngCore;

use crate::pki::TlsDir;

/// The member's paths under one data dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLayout {
    pub data_dir: PathBuf,
}

impl MemberLayout {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        MemberLayout {
            data_dir: data_dir.into(),
        }
    }
    /// `<data-dir>/db`.
    pub fn db_dir(&self) -> PathBuf {
        self.data_dir.join("db")
    }
    /// etcd's `--data-dir`: `<data-dir>/db/etcd`.
    pub fn member_dir(&self) -> PathBuf {
        self.db_dir().join("etcd")
    }
    /// `<data-dir>/db/etcd/name`: the member name, kept across restarts.
    pub fn name_file(&self) -> PathBuf {
        self.member_dir().join("name")
    }
    /// etcd's write-ahead log: its presence means the member was initialized.
    pub fn wal_dir(&self) -> PathBuf {
        self.member_dir().join("member").join("wal")
    }
    /// etcd's output (appended across restarts).
    pub fn etcd_log(&self) -> PathBuf {
        self.db_dir().join("etcd.log")
    }
    pub fn tls(&self) -> TlsDir {
        TlsDir::new(self.data_dir.join("tls"))
    }
    /// `<data-dir>/token`: the cluster token, 0600.
    pub fn token_file(&self) -> PathBuf {
        self.data_dir.join("token")
    }

    /// Whether the member exists on disk (its WAL dir is there).
    pub fn is_initialized(&self) -> bool {
        has_entries(&self.wal_dir())
    }

    /// The persisted member name, if any.
    pub fn read_name(&self) -> Option<String> {
        std::fs::read_to_string(self.name_file())
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }
}

fn has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// A new member name: `<hostname>-<8 hex>`, so that a host that rejoins never reuses a name etcd may still
/// remember.
pub fn new_member_name(hostname: &str) -> String {
    let mut b = [0u8; 4];
    rand::rng().fill_bytes(&mut b);
    let host: String = hostname
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{host}-{}", hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_hostname_and_eight_hex_digits() {
        let n = new_member_name("web_1");
        let (host, suffix) = n.rsplit_once('-').unwrap();
        assert_eq!(host, "web-1");
        assert_eq!(suffix.len(), 8);
        assert!(suffix.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(new_member_name("h"), new_member_name("h"));
    }

    #[test]
    fn initialized_means_a_wal_dir_with_files() {
        let tmp = tempfile::tempdir().unwrap();
        let l = MemberLayout::new(tmp.path());
        assert!(!l.is_initialized());
        std::fs::create_dir_all(l.wal_dir()).unwrap();
        assert!(!l.is_initialized(), "an empty WAL dir is not a member");
        std::fs::write(l.wal_dir().join("0.wal"), b"x").unwrap();
        assert!(l.is_initialized());
        assert_eq!(l.read_name(), None);
        std::fs::write(l.name_file(), "h-00000000\n").unwrap();
        assert_eq!(l.read_name().as_deref(), Some("h-00000000"));
    }
}
