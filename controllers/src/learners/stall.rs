//! The stall clock: has a learner moved since it was last seen to move, and for how long has it not?
//!
//! Pure: the learner manager feeds in the recorded figures, what it sees now and the time, and acts on the
//! [`Assessment`]. Progress is either of:
//! - its raft applied index changed (it answers status only once it has nearly caught up);
//! - the leader sent it more than heartbeats since it last counted as moving — entries while it catches
//!   up — or, while a raft snapshot is on its way to it, anything at all: the snapshot's own bytes are
//!   counted only once it has been sent whole, so a live link is all there is to see meanwhile.
//!
//! A learner that answers nothing and gets nothing makes no progress.

use std::time::{Duration, SystemTime};

use hostlet_api::objects::{LearnerRecord, Timestamp};

use crate::members::cluster::LearnerObservation;

/// Bytes per second the leader may send an idle learner without it counting as progress: heartbeats come
/// to about 0.5 KiB/s; catching up moves megabytes.
pub const HEARTBEAT_ALLOWANCE: u64 = 4096;

/// The leader's byte count for a learner when it last counted as moving. Kept in memory, not in the
/// record: each leader counts from its own start, so a new leader starts a baseline of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentBaseline {
    pub bytes: u64,
    pub at: SystemTime,
}

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

/// Judges a learner against its record (if any) and the leader's baseline (if any). `name` is the
/// member's name as etcd knows it now (empty before it has published it).
pub fn assess(
    name: &str,
    record: Option<&LearnerRecord>,
    baseline: Option<&SentBaseline>,
    seen: &LearnerObservation,
    now: SystemTime,
    stall_timeout: Duration,
) -> Assessment {
    let Some(record) = record else {
        return Assessment::Track(LearnerRecord {
            name: name.to_string(),
            added: Timestamp(now),
            applied_index: seen.applied_index.unwrap_or(0),
            snapshot_bytes_received: 0,
            last_progress: Timestamp(now),
            bytes_sent: seen.sent.map_or(0, |s| s.bytes),
            receiving_snapshot: seen.sent.is_some_and(|s| s.sending_snapshot()),
        });
    };
    let applied_moved = seen
        .applied_index
        .is_some_and(|i| i != record.applied_index);
    let bytes_moved = match (seen.sent, baseline) {
        (Some(s), Some(b)) if s.bytes >= b.bytes => {
            let delta = s.bytes - b.bytes;
            let secs = now.duration_since(b.at).unwrap_or_default().as_secs_f64();
            (s.sending_snapshot() && delta > 0)
                || delta as f64 > HEARTBEAT_ALLOWANCE as f64 * (1.0 + secs)
        }
        _ => false,
    };
    if applied_moved || bytes_moved {
        return Assessment::Progressed(LearnerRecord {
            name: if name.is_empty() {
                record.name.clone()
            } else {
                name.to_string()
            },
            added: record.added,
            applied_index: seen.applied_index.unwrap_or(record.applied_index),
            snapshot_bytes_received: record.snapshot_bytes_received,
            last_progress: Timestamp(now),
            bytes_sent: seen.sent.map_or(record.bytes_sent, |s| s.bytes),
            receiving_snapshot: seen
                .sent
                .map_or(record.receiving_snapshot, |s| s.sending_snapshot()),
        });
    }
    // A clock behind the recorder's (another host) reads as no time stalled rather than as a panic.
    let stalled_for = now
        .duration_since(record.last_progress.0)
        .unwrap_or_default();
    if stalled_for >= stall_timeout {
        Assessment::Evict { stalled_for }
    } else {
        Assessment::Waiting { stalled_for }
    }
}

/// The baseline after an assessment: moved to the current count when the learner moved (or was first
/// seen), started when there was none, restarted when the count went backwards (another leader's, or a
/// restarted one's); else kept, so heartbeats never add up to progress.
pub fn next_baseline(
    baseline: Option<SentBaseline>,
    seen: &LearnerObservation,
    assessment: &Assessment,
    now: SystemTime,
) -> Option<SentBaseline> {
    let Some(sent) = seen.sent else {
        return baseline;
    };
    let current = SentBaseline {
        bytes: sent.bytes,
        at: now,
    };
    match (assessment, baseline) {
        (Assessment::Track(_) | Assessment::Progressed(_), _) => Some(current),
        (_, None) => Some(current),
        (_, Some(b)) if sent.bytes < b.bytes => Some(current),
        (_, Some(b)) => Some(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::etcd_metrics::SentToPeer;

    const TIMEOUT: Duration = Duration::from_secs(300);

    fn at(secs: u64) -> SystemTime {
        Timestamp::from_unix(1_800_000_000 + secs).0
    }

    fn record(applied: u64, bytes: u64, last_progress: u64) -> LearnerRecord {
        LearnerRecord {
            name: "n2-0badcafe".into(),
            added: Timestamp(at(0)),
            applied_index: applied,
            snapshot_bytes_received: 0,
            last_progress: Timestamp(at(last_progress)),
            bytes_sent: bytes,
            receiving_snapshot: false,
        }
    }

    fn seen(applied: Option<u64>, sent: Option<(u64, u64)>) -> LearnerObservation {
        LearnerObservation {
            applied_index: applied,
            sent: sent.map(|(bytes, in_flight)| SentToPeer {
                bytes,
                snapshots_in_flight: in_flight,
            }),
        }
    }

    fn base(bytes: u64, secs: u64) -> Option<SentBaseline> {
        Some(SentBaseline {
            bytes,
            at: at(secs),
        })
    }

    #[test]
    fn table() {
        struct Case {
            what: &'static str,
            record: Option<LearnerRecord>,
            baseline: Option<SentBaseline>,
            seen: LearnerObservation,
            now: u64,
            want: Assessment,
        }
        let cases = [
            Case {
                what: "first sight of a learner that never started starts the clock",
                record: None,
                baseline: None,
                seen: seen(None, Some((0, 0))),
                now: 10,
                want: Assessment::Track(LearnerRecord {
                    added: Timestamp(at(10)),
                    ..record(0, 0, 10)
                }),
            },
            Case {
                what: "applied index moved: progress, clock restarts, added kept",
                record: Some(record(100, 0, 0)),
                baseline: None,
                seen: seen(Some(250), None),
                now: 299,
                want: Assessment::Progressed(LearnerRecord {
                    applied_index: 250,
                    last_progress: Timestamp(at(299)),
                    ..record(100, 0, 0)
                }),
            },
            Case {
                what: "catching up: megabytes sent, no status yet",
                record: Some(record(0, 1_000, 0)),
                baseline: base(1_000, 0),
                seen: seen(None, Some((30_000_000, 0))),
                now: 1,
                want: Assessment::Progressed(LearnerRecord {
                    bytes_sent: 30_000_000,
                    last_progress: Timestamp(at(1)),
                    ..record(0, 1_000, 0)
                }),
            },
            Case {
                what: "heartbeats to an idle learner are no progress",
                record: Some(record(0, 1_000, 0)),
                baseline: base(1_000, 0),
                seen: seen(None, Some((1_000 + 299 * 600, 0))),
                now: 299,
                want: Assessment::Waiting {
                    stalled_for: Duration::from_secs(299),
                },
            },
            Case {
                what: "heartbeats only, at the timeout: evicted",
                record: Some(record(0, 1_000, 0)),
                baseline: base(1_000, 0),
                seen: seen(None, Some((1_000 + 300 * 600, 0))),
                now: 300,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(300),
                },
            },
            Case {
                what: "unreachable learner at the timeout is evicted",
                record: Some(record(100, 0, 0)),
                baseline: base(0, 0),
                seen: seen(None, Some((0, 0))),
                now: 300,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(300),
                },
            },
            Case {
                what: "answering but standing still is no progress",
                record: Some(record(100, 0, 0)),
                baseline: None,
                seen: seen(Some(100), None),
                now: 301,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(301),
                },
            },
            Case {
                what: "a raft snapshot in flight on a live link: progress however long it takes",
                record: Some(record(100, 5_000, 3_000)),
                baseline: base(5_000, 3_000),
                seen: seen(None, Some((5_050, 1))),
                now: 3_600,
                want: Assessment::Progressed(LearnerRecord {
                    bytes_sent: 5_050,
                    receiving_snapshot: true,
                    last_progress: Timestamp(at(3_600)),
                    ..record(100, 5_000, 3_000)
                }),
            },
            Case {
                what: "a snapshot in flight on a dead link (nothing moves) is no progress",
                record: Some(record(100, 9_000, 0)),
                baseline: base(9_000, 0),
                seen: seen(None, Some((9_000, 1))),
                now: 400,
                want: Assessment::Evict {
                    stalled_for: Duration::from_secs(400),
                },
            },
            Case {
                what: "a new leader (no baseline yet) does not take its own count for progress",
                record: Some(record(0, 50_000_000, 0)),
                baseline: None,
                seen: seen(None, Some((70_000_000, 0))),
                now: 200,
                want: Assessment::Waiting {
                    stalled_for: Duration::from_secs(200),
                },
            },
            Case {
                what: "a recorder's clock ahead of ours reads as no stall",
                record: Some(record(100, 0, 50)),
                baseline: None,
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
                c.baseline.as_ref(),
                &c.seen,
                at(c.now),
                TIMEOUT,
            );
            assert_eq!(got, c.want, "{}", c.what);
        }
    }

    #[test]
    fn the_baseline_moves_with_progress_and_never_with_heartbeats() {
        let waiting = Assessment::Waiting {
            stalled_for: Duration::ZERO,
        };
        let progressed = Assessment::Progressed(record(0, 0, 0));
        let s = |bytes| seen(None, Some((bytes, 0)));
        assert_eq!(next_baseline(None, &s(10), &waiting, at(5)), base(10, 5));
        assert_eq!(
            next_baseline(base(10, 0), &s(900), &waiting, at(5)),
            base(10, 0),
            "heartbeats must not creep the baseline"
        );
        assert_eq!(
            next_baseline(base(10, 0), &s(9_000_000), &progressed, at(5)),
            base(9_000_000, 5)
        );
        assert_eq!(
            next_baseline(base(10_000, 0), &s(20), &waiting, at(5)),
            base(20, 5),
            "a count that went backwards restarts the baseline"
        );
        assert_eq!(
            next_baseline(base(10, 0), &seen(Some(1), None), &waiting, at(5)),
            base(10, 0)
        );
    }

    #[test]
    fn the_name_is_learned_once_the_learner_publishes_it_and_never_forgotten() {
        let mut r = record(0, 0, 0);
        r.name = String::new();
        let Assessment::Progressed(next) =
            assess("n4-1", Some(&r), None, &seen(Some(5), None), at(1), TIMEOUT)
        else {
            panic!("expected progress");
        };
        assert_eq!(next.name, "n4-1");
        let Assessment::Progressed(again) =
            assess("", Some(&next), None, &seen(Some(6), None), at(2), TIMEOUT)
        else {
            panic!("expected progress");
        };
        assert_eq!(again.name, "n4-1");
    }
}
