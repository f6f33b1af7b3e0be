//! Which snapshots go: exact retention, decided from the node's files and records alone.

use std::collections::BTreeMap;
use std::time::Duration;

/// The name scheduled snapshots carry; on-demand snapshots carry the operator's name (default `on-demand`).
pub const SCHEDULED_NAME: &str = "etcd-snapshot";
/// How long the record of a failed snapshot is kept.
pub const FAILED_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// A snapshot file name's parts: `<name>-<node>-<unix>`, then `.zst` when compressed and `.enc` when
/// encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotName {
    pub name: String,
    pub node: String,
    pub unix: u64,
    pub compressed: bool,
    pub encrypted: bool,
}

impl SnapshotName {
    pub fn file(&self) -> String {
        format!(
            "{}-{}-{}{}{}",
            self.name,
            self.node,
            self.unix,
            if self.compressed { ".zst" } else { "" },
            if self.encrypted {
                super::encryption::SUFFIX
            } else {
                ""
            }
        )
    }

    /// Reads a file name of `node` back; `None` for files that are not this node's snapshots (including
    /// `.part` files).
    pub fn parse(file: &str, node: &str) -> Option<SnapshotName> {
        let (file, encrypted) = match file.strip_suffix(super::encryption::SUFFIX) {
            Some(s) => (s, true),
            None => (file, false),
        };
        let (stem, compressed) = match file.strip_suffix(".zst") {
            Some(s) => (s, true),
            None => (file, false),
        };
        let (rest, unix) = stem.rsplit_once('-')?;
        let unix = unix.parse::<u64>().ok()?;
        let name = rest.strip_suffix(node)?.strip_suffix('-')?;
        (!name.is_empty()).then(|| SnapshotName {
            name: name.to_string(),
            node: node.to_string(),
            unix,
            compressed,
            encrypted,
        })
    }
}

/// One snapshot as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub file: String,
    pub name: String,
    pub created_unix: u64,
    pub good: bool,
}

impl Candidate {
    /// A record as retention sees it.
    pub fn from_record(r: &hostlet_api::objects::SnapshotRecord) -> Self {
        Candidate {
            file: r.file.clone(),
            name: r.name.clone(),
            created_unix: r.created.unix_secs(),
            good: r.status == hostlet_api::objects::SnapshotStatus::Successful,
        }
    }
}

/// The files (or failed records) to delete so that each name keeps exactly its `retention` newest good
/// snapshots. Scheduled snapshots share one name; on-demand ones are counted by their own names. The newest
/// good snapshot overall is never deleted, even with a retention of 0. Failed entries go once older than a day.
pub fn to_prune(candidates: &[Candidate], retention: usize, now_unix: u64) -> Vec<String> {
    let newest_good = candidates
        .iter()
        .filter(|c| c.good)
        .max_by_key(|c| (c.created_unix, c.file.clone()))
        .map(|c| c.file.clone());
    let mut by_name: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for c in candidates.iter().filter(|c| c.good) {
        by_name.entry(c.name.as_str()).or_default().push(c);
    }
    let mut out = Vec::new();
    for group in by_name.values_mut() {
        group.sort_by(|a, b| (b.created_unix, &b.file).cmp(&(a.created_unix, &a.file)));
        out.extend(
            group
                .iter()
                .skip(retention)
                .filter(|c| Some(&c.file) != newest_good.as_ref())
                .map(|c| c.file.clone()),
        );
    }
    // Failed entries go after a day, and beyond the newest `retention` (at least one) per name, so that a
    // schedule failing every second cannot fill etcd.
    let mut failed_by_name: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for c in candidates.iter().filter(|c| !c.good) {
        failed_by_name.entry(c.name.as_str()).or_default().push(c);
    }
    for group in failed_by_name.values_mut() {
        group.sort_by(|a, b| (b.created_unix, &b.file).cmp(&(a.created_unix, &a.file)));
        out.extend(
            group
                .iter()
                .enumerate()
                .filter(|(i, c)| {
                    *i >= retention.max(1)
                        || now_unix.saturating_sub(c.created_unix) > FAILED_RECORD_TTL.as_secs()
                })
                .map(|(_, c)| c.file.clone()),
        );
    }
    out.sort();
    out
}

/// The good snapshots of `name` to delete before a new one of that name is written, so that the files on
/// disk never number more than `retention`: all but its newest `retention - 1`. The newest good snapshot
/// overall stays, so a failing take never leaves the node with none (with a retention of 1, its one
/// snapshot stays until its successor is written).
pub fn to_make_room(candidates: &[Candidate], name: &str, retention: usize) -> Vec<String> {
    let newest_good = candidates
        .iter()
        .filter(|c| c.good)
        .max_by_key(|c| (c.created_unix, c.file.clone()))
        .map(|c| c.file.clone());
    let mut group: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.good && c.name == name)
        .collect();
    group.sort_by(|a, b| (b.created_unix, &b.file).cmp(&(a.created_unix, &a.file)));
    let mut out: Vec<String> = group
        .iter()
        .skip(retention.saturating_sub(1))
        .filter(|c| Some(&c.file) != newest_good.as_ref())
        .map(|c| c.file.clone())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, t: u64, good: bool) -> Candidate {
        Candidate {
            file: SnapshotName {
                name: name.into(),
                node: "n-1".into(),
                unix: t,
                compressed: false,
                encrypted: false,
            }
            .file(),
            name: name.into(),
            created_unix: t,
            good,
        }
    }

    #[test]
    fn names_round_trip_even_with_dashes_in_name_and_node() {
        let n = SnapshotName {
            name: "pre-upgrade".into(),
            node: "node-1".into(),
            unix: 1700000000,
            compressed: true,
            encrypted: false,
        };
        assert_eq!(n.file(), "pre-upgrade-node-1-1700000000.zst");
        assert_eq!(SnapshotName::parse(&n.file(), "node-1"), Some(n.clone()));
        let sealed = SnapshotName {
            encrypted: true,
            ..n
        };
        assert_eq!(sealed.file(), "pre-upgrade-node-1-1700000000.zst.enc");
        assert_eq!(SnapshotName::parse(&sealed.file(), "node-1"), Some(sealed));
        assert_eq!(
            SnapshotName::parse("etcd-snapshot-node-1-17.part", "node-1"),
            None
        );
        assert_eq!(
            SnapshotName::parse("etcd-snapshot-node-2-17", "node-1"),
            None
        );
        assert_eq!(SnapshotName::parse("node-1-17", "node-1"), None);
    }

    #[test]
    fn every_file_beyond_the_limit_goes_not_just_one() {
        let all: Vec<_> = (1..=9).map(|t| c(SCHEDULED_NAME, t, true)).collect();
        let gone = to_prune(&all, 3, 100);
        assert_eq!(gone.len(), 6);
        for t in 1..=6 {
            assert!(gone.contains(&c(SCHEDULED_NAME, t, true).file));
        }
    }

    #[test]
    fn on_demand_snapshots_are_counted_by_their_own_name() {
        let mut all: Vec<_> = (1..=4).map(|t| c(SCHEDULED_NAME, t, true)).collect();
        all.push(c("pre-upgrade", 1, true));
        all.push(c("pre-upgrade", 2, true));
        let gone = to_prune(&all, 2, 100);
        assert_eq!(gone, {
            let mut v = vec![
                c(SCHEDULED_NAME, 1, true).file,
                c(SCHEDULED_NAME, 2, true).file,
            ];
            v.sort();
            v
        });
    }

    #[test]
    fn failures_are_kept_at_most_retention_per_name() {
        let all: Vec<_> = (1..=10).map(|t| c(SCHEDULED_NAME, t, false)).collect();
        let gone = to_prune(&all, 3, 20);
        assert_eq!(gone.len(), 7);
        assert!(!gone.contains(&c(SCHEDULED_NAME, 10, false).file));
    }

    #[test]
    fn newest_good_is_never_deleted_and_failures_expire_after_a_day() {
        let all = vec![
            c(SCHEDULED_NAME, 10, true),
            c(SCHEDULED_NAME, 20, false),
            c(SCHEDULED_NAME, 100_000, false),
        ];
        assert!(to_prune(&all, 0, 100_001).contains(&c(SCHEDULED_NAME, 20, false).file));
        assert!(!to_prune(&all, 0, 100_001).contains(&c(SCHEDULED_NAME, 10, true).file));
        assert!(!to_prune(&all, 0, 100_001).contains(&c(SCHEDULED_NAME, 100_000, false).file));
    }

    #[test]
    fn room_is_made_before_a_take_so_the_files_never_exceed_the_retention() {
        let mut all: Vec<_> = (1..=4).map(|t| c(SCHEDULED_NAME, t, true)).collect();
        all.push(c("pre-upgrade", 5, true));
        all.push(c(SCHEDULED_NAME, 6, false));
        // Three kept: the two newest stay, the new one makes three.
        assert_eq!(
            to_make_room(&all, SCHEDULED_NAME, 3),
            vec![
                c(SCHEDULED_NAME, 1, true).file,
                c(SCHEDULED_NAME, 2, true).file
            ]
        );
        // Another name's files and failed records are not counted.
        assert!(to_make_room(&all, "pre-upgrade", 3).is_empty());
        assert_eq!(to_make_room(&all, "pre-upgrade", 1), Vec::<String>::new());
        // A retention of 1 deletes every one of the name but the newest good snapshot overall.
        assert_eq!(to_make_room(&all, SCHEDULED_NAME, 1).len(), 4);
        let only: Vec<_> = vec![c(SCHEDULED_NAME, 1, true)];
        assert!(to_make_room(&only, SCHEDULED_NAME, 1).is_empty());
        assert!(to_make_room(&only, SCHEDULED_NAME, 0).is_empty());
    }
}
