//! The stall clock: has a learner moved since it was last seen to move, and for how long has it not?
//!
//! Pure: the learner manager feeds in the recorded figures, what it sees now and the time, and acts on the
//! [`Assessment`]. Progress is any change of the learner's raft applied index, or — while a raft snapshot
//! streams in and the applied index stands still — any change of the bytes it has received from its peers.
//! A learner that answers nothing makes no progress.

use std::time::{Duration, SystemTime};

use hostlet_api::objects::{LearnerRecord, Timestamp};

use crate::members::cluster::LearnerObservation;

/// What to do about one learner that etcd would not promote yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// First sight: start its record, and its stall clock, now.
    Track(LearnerRecord),
    /// It moved: the record with the new figures and the clock restarted.
    Progressed(LearnerRecord),
    /// It has not moved for `stalled_for`, which is still within the timeout.
    Waiting { stalled_for: Duration },
    /// It has not moved for `stalled_for`, the timeout or longer: remove it.
    Evict { stalled_for: Duration },
}

/// Judges a learner against its record (if any). `name` is the member's name as etcd knows it now (empty
/// before it first started).
pub fn assess(
    name: &str,
    record: Option<&LearnerRecord>,
    seen: &LearnerObservation,
    now: SystemTime,
    stall_timeout: Duration,
) -> Assessment {
    let traffic = seen.traffic.unwrap_or_default();
    let Some(record) = record else {
        return Assessment::Track(LearnerRecord {
            name: name.to_string(),
            added: Timestamp(now),
            applied_index: seen.applied_index.unwrap_or(0),
            snapshot_bytes_received: traffic.received_bytes,
            last_progress: Timestamp(now),
        });
    };
    let applied_moved = seen
        .applied_index
        .is_some_and(|i| i != record.applied_index);
    let snapshot_moved = seen.traffic.is_some_and(|t| {
        t.receiving_snapshot() && t.received_bytes != record.snapshot_bytes_received
    });
    if applied_moved || snapshot_moved {
        return Assessment::Progressed(LearnerRecord {
            name: if name.is_empty() {
                record.name.clone()
            } else {
                name.to_string()
            },
            added: record.added,
            applied_index: seen.applied_index.unwrap_or(record.applied_index),
            snapshot_bytes_received: seen
                .traffic
                .map_or(record.snapshot_bytes_received, |t| t.received_bytes),
            last_progress: Timestamp(now),
        });
    }
    // A clock behind the recorder's (another host) reads as no time stalled rather than as a panic.
    let stalled_for = now.duration_since(record.last_progress.0).unwrap_or_default();
    if stalled_for >= stall_timeout {
        Assessment::Evict { stalled_for }
    } else {
        Assessment::Waiting { stalled_for }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::etcd_metrics::PeerTraffic;

    const TIMEOUT: Duration = Duration::from_secs(300);

    fn at(secs: u64) -> SystemTime {
        Timestamp::from_unix(1_800_000_000 + secs).0
    }

    fn record(applied: u64, bytes: u64, last_progress: u64) -> LearnerRecord {
        LearnerRecord {
            name: "n2-0badcafe".into(),
            added: Timestamp(at(0)),
            applied_index: applied,
            snapshot_bytes_received: bytes,
            last_progress: Timestamp(at(last_progress)),
        }
    }

    fn seen(applied: Option<u64>, traffic: Option<(u64, u64)>) -> LearnerObservation {
        LearnerObservation {
            applied_index: applied,
            traffic: traffic.map(|(bytes, in_flight)| PeerTraffic {
                received_bytes: bytes,
                snapshots_in_flight: in_flight,
                snapshots_received: 0,
            }),
        }
    }

    #[test]
    fn table() {
        struct Case {
            what: &'static str,
            record: Option<LearnerRecord>,
            seen: LearnerObservation,
            now: u64,
            want: Assessment,
        }
        let cases = [
            Case {
                what: "first sight of a learner that never started starts the clock",
                record: None,
                seen: seen(None, None),
                now: 10,
                want: Assessment::Track(LearnerRecord {
                    name: "n2-0badcafe".into(),
                    added: Timestamp(at(10)),
                    applied_index: 0,
                    snapshot_bytes_received: 0,
                    last_progress: Timestamp(at(10)),
                }),
            },
            Case {
                what: "applied index moved: progress, clock restarts, added kept",
                record: Some(record(100, 0, 0)),
                seen: seen(Some(250), None),
                now: 299,
                want: Assessment::Progressed(LearnerRecord {
                    applied_index: 250,
                    last_progress: Timestamp(at(299)),
                    ..record(100, 0, 0)
                }),
            },
            Case {
                what: "unreachable learner within the timeout waits",
                record: Some(record(100, 0, 0)),
                seen: seen(None, None),
                now: 299,
                want: Assessment::Waiting {
                    stalled_for: Duration::from_secs(299),
                },
            },
            Case {
                what: "unreachable learner at the timeout is evicted",
                record: Some(record(100, 0, 0)),
                seen: seen(None, None),
                now: 300,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(300),
                },
            },
            Case {
                what: "answering but standing still is no progress",
                record: Some(record(100, 5_000, 0)),
                seen: seen(Some(100), Some((9_000, 0))),
                now: 301,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(301),
                },
            },
            Case {
                what: "snapshot streaming in, bytes moving: progress however long it takes",
                record: Some(record(100, 5_000, 0)),
                seen: seen(Some(100), Some((9_000, 1))),
                now: 3_600,
                want: Assessment::Progressed(LearnerRecord {
                    snapshot_bytes_received: 9_000,
                    last_progress: Timestamp(at(3_600)),
                    ..record(100, 5_000, 0)
                }),
            },
            Case {
                what: "snapshot in flight but no byte moved is no progress",
                record: Some(record(100, 9_000, 0)),
                seen: seen(Some(100), Some((9_000, 1))),
                now: 400,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(400),
                },
            },
            Case {
                what: "a restarted learner (counters reset) that streams counts as progress",
                record: Some(record(100, 9_000, 0)),
                seen: seen(Some(100), Some((50, 1))),
                now: 10,
                want: Assessment::Progressed(LearnerRecord {
                    snapshot_bytes_received: 50,
                    last_progress: Timestamp(at(10)),
                    ..record(100, 9_000, 0)
                }),
            },
            Case {
                what: "a recorder's clock ahead of ours reads as no stall",
                record: Some(record(100, 0, 50)),
                seen: seen(Some(100), None),
                now: 20,
                want: Assessment::Waiting {
                    stalled_for: Duration::ZERO,
                },
            },
        ];
        for c in cases {
            let got = assess(
                "n2-0badcafe",
                c.record.as_ref(),
                &c.seen,
                at(c.now),
                TIMEOUT,
            );
            assert_eq!(got, c.want, "{}", c.what);
        }
    }

    #[test]
    fn the_name_is_learned_once_the_learner_starts_and_never_forgotten() {
        let mut r = record(0, 0, 0);
        r.name = String::new();
        let Assessment::Progressed(next) = assess("n4-1", Some(&r), &seen(Some(5), None), at(1), TIMEOUT)
        else {
            panic!("expected progress");
        };
        assert_eq!(next.name, "n4-1");
        let Assessment::Progressed(again) = assess("", Some(&next), &seen(Some(6), None), at(2), TIMEOUT)
        else {
            panic!("expected progress");
        };
        assert_eq!(again.name, "n4-1");
    }
}
