//! The decision, on plain data: given what every member reports, what this agent does next.
//!
//! Every agent runs the same [`plan`] on the same cluster-wide figures, and each acts only on its own member
//! (or, on the leader, on the cluster's history and alarms). The member to defragment next is named by
//! the figures alone — the first follower by id that needs it, the leader only when no follower does —
//! so the agents agree on it without talking; the maintenance lock makes sure of it whenever etcd takes
//! writes. A member whose figures are unknown stops every defragmentation: silence is never taken for
//! health.

use std::time::{Duration, SystemTime};

/// Under NOSPACE, a member is defragmented once this much of its file is free and what is in use fits (after
/// the compaction nearly all of it is free; once defragmented, hardly any).
pub const NOSPACE_MIN_FREE: u64 = 1024 * 1024;
/// Under NOSPACE, the alarm is disarmed only when every member's file is below this share of the quota:
/// with less headroom the next writes would raise it again at once.
pub const FIT_RATIO: f64 = 0.9;

/// One member's figures, from its own status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// The database file's size on disk.
    pub db_size: u64,
    /// The part of it in use (the rest is free pages only a defragmentation returns).
    pub in_use: u64,
    /// The leader it knows; 0: none.
    pub leader: u64,
    pub raft_index: u64,
}

impl MemberStatus {
    pub fn free(&self) -> u64 {
        self.db_size.saturating_sub(self.in_use)
    }
}

/// One member as the membership lists it, with its status if it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberObs {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
    pub status: Option<MemberStatus>,
}

/// An etcd alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlarmKind {
    NoSpace,
    Corrupt,
}

impl AlarmKind {
    pub fn label(self) -> &'static str {
        match self {
            AlarmKind::NoSpace => "NOSPACE",
            AlarmKind::Corrupt => "CORRUPT",
        }
    }
}

/// Who holds the maintenance lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    Free,
    /// Held by someone else (another agent, `hostlet etcd defrag`), named by the lock's value.
    Held(String),
}

/// When a member counts as fragmented: `free ≥ ratio × size` and `free ≥ min_free`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub ratio: f64,
    pub min_free: u64,
}

impl Threshold {
    pub fn exceeded(&self, s: &MemberStatus) -> bool {
        let free = s.free();
        free >= self.min_free && (free as f64) >= self.ratio * s.db_size as f64
    }
}

/// Everything the decision looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub local_id: u64,
    pub members: Vec<MemberObs>,
    pub alarms: Vec<(u64, AlarmKind)>,
    pub lock: LockState,
    /// History up to the current revision is gone (asked only under NOSPACE).
    pub compacted_to_current: bool,
    pub current_revision: i64,
    /// The revision the retention allows compacting to, if that is past the last compaction (leader only).
    pub compaction_due: Option<i64>,
    /// A snapshot of the local member is being taken.
    pub local_snapshot_in_progress: bool,
    /// The defragmentation schedule fired and the local member has not been defragmented since.
    pub local_schedule_due: bool,
    pub threshold: Threshold,
    /// The backend quota in force (etcd's default when not set).
    pub quota: u64,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing to do.
    Idle,
    /// Something to do, but not yet (the reason is logged).
    Wait(String),
    Compact {
        revision: i64,
        /// Under NOSPACE: up to the current revision, whatever the retention.
        emergency: bool,
    },
    /// Defragment the local member.
    Defrag { reason: DefragReason },
    /// The leader needs defragmenting and no follower does: hand leadership to `to` first.
    MoveLeader { to: u64 },
    /// Every member fits again: clear these members' NOSPACE alarms.
    Disarm { members: Vec<u64> },
    /// Compacted and defragmented, and the data still does not fit under the quota.
    DoesNotFit {
        member: u64,
        db_size: u64,
        in_use: u64,
        quota: u64,
    },
}

/// Why a member is defragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefragReason {
    Fragmented,
    Schedule,
    NoSpace,
}

impl DefragReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DefragReason::Fragmented => "fragmented",
            DefragReason::Schedule => "scheduled",
            DefragReason::NoSpace => "NOSPACE",
        }
    }
}

impl Observation {
    fn member(&self, id: u64) -> Option<&MemberObs> {
        self.members.iter().find(|m| m.id == id)
    }

    pub fn nospace(&self) -> bool {
        self.alarms.iter().any(|(_, a)| *a == AlarmKind::NoSpace)
    }

    /// No voter (the local member too when `with_local`) could need defragmenting whatever its in-use
    /// figure lags (a member frees at most its file's size): a look then needs no confirming. All must
    /// answer.
    pub fn none_can_be_due(&self, with_local: bool) -> bool {
        let nospace = self.nospace();
        self.members
            .iter()
            .filter(|m| !m.is_learner && (with_local || m.id != self.local_id))
            .all(|m| {
                m.status.is_some_and(|s| {
                    let bound = MemberStatus { in_use: 0, ..s };
                    self.need(m, &bound, nospace).is_none()
                })
            })
    }

    /// Whether `bytes` of file leave the headroom the disarm asks for.
    fn fits(&self, bytes: u64) -> bool {
        (bytes as f64) < FIT_RATIO * self.quota as f64
    }

    /// Why member `m` needs defragmenting, if it does.
    fn need(&self, m: &MemberObs, s: &MemberStatus, nospace: bool) -> Option<DefragReason> {
        // Under NOSPACE, only a defragmentation that makes the file fit: a member's in-use figure shows
        // the compaction only once the member has applied it and committed a later write, and one
        // defragmented before that would be defragmented again after.
        if nospace {
            // Nothing else while the alarm is up: a fragmented or scheduled member goes after the disarm.
            return (s.free() >= NOSPACE_MIN_FREE && self.fits(s.in_use) && !self.fits(s.db_size))
                .then_some(DefragReason::NoSpace);
        }
        if self.threshold.exceeded(s) {
            return Some(DefragReason::Fragmented);
        }
        if m.id == self.local_id && self.local_schedule_due {
            return Some(DefragReason::Schedule);
        }
        None
    }
}

/// The next step for the agent of member `obs.local_id`.
pub fn plan(obs: &Observation) -> Step {
    let Some(local) = obs.member(obs.local_id) else {
        return Step::Wait("the local member is not in the member list".into());
    };
    let Some(local_status) = local.status else {
        return Step::Wait("the local member does not answer".into());
    };
    if local.is_learner {
        return Step::Idle;
    }
    let leader = local_status.leader;
    if leader == 0 {
        return Step::Wait("no leader".into());
    }
    let leads = leader == obs.local_id;
    if obs.alarms.iter().any(|(_, a)| *a == AlarmKind::Corrupt) {
        return Step::Wait(
            "a CORRUPT alarm is raised: nothing is done until an operator acts".into(),
        );
    }
    let nospace = obs.nospace();
    if nospace {
        if !obs.compacted_to_current {
            return if leads {
                Step::Compact {
                    revision: obs.current_revision,
                    emergency: true,
                }
            } else {
                Step::Wait("NOSPACE: the leader compacts first".into())
            };
        }
    } else if leads {
        if let Some(revision) = obs.compaction_due {
            if let LockState::Held(holder) = &obs.lock {
                return Step::Wait(format!(
                    "compaction due; the maintenance lock is held by {holder}"
                ));
            }
            return Step::Compact {
                revision,
                emergency: false,
            };
        }
    }

    // Which member defragments next: followers by id, then the leader.
    let voters: Vec<&MemberObs> = obs.members.iter().filter(|m| !m.is_learner).collect();
    let mut order: Vec<&MemberObs> = voters.iter().copied().filter(|m| m.id != leader).collect();
    order.sort_by_key(|m| m.id);
    if let Some(l) = obs.member(leader) {
        order.push(l);
    }
    let mut next = None;
    let mut blocked = false;
    for m in &order {
        // Fail closed: a member that does not answer may be down, and one more member out could cost the
        // quorum; or it may be defragmenting right now.
        let Some(s) = m.status else {
            return Step::Wait(format!(
                "member {} does not answer: no defragmentation",
                m.name
            ));
        };
        if next.is_none() && !blocked {
            if nospace {
                // One at a time with no lock (etcd takes no write under NOSPACE): the first member that
                // does not fit yet is next, or, while its figures do not show the compaction yet, no
                // one is. The members after it wait for it whatever their own figures show.
                if !obs.fits(s.db_size) {
                    match obs.need(m, &s, true) {
                        Some(reason) => next = Some((*m, reason)),
                        None => blocked = true,
                    }
                }
            } else if let Some(reason) = obs.need(m, &s, nospace) {
                next = Some((*m, reason));
            }
        }
    }
    let Some((next, reason)) = next else {
        if nospace && leads {
            // The member whose live data does not fit, when one's figures say so; else the largest file.
            let figures = || voters.iter().filter_map(|m| m.status.map(|s| (m.id, s)));
            let worst = figures()
                .filter(|(_, s)| !obs.fits(s.in_use))
                .max_by_key(|(_, s)| s.in_use)
                .or_else(|| figures().max_by_key(|(_, s)| s.db_size));
            if let Some((member, s)) = worst {
                if !obs.fits(s.db_size) {
                    return Step::DoesNotFit {
                        member,
                        db_size: s.db_size,
                        in_use: s.in_use,
                        quota: obs.quota,
                    };
                }
            }
            let mut members: Vec<u64> = obs
                .alarms
                .iter()
                .filter(|(_, a)| *a == AlarmKind::NoSpace)
                .map(|(m, _)| *m)
                .collect();
            members.sort_unstable();
            members.dedup();
            return Step::Disarm { members };
        }
        if nospace {
            // The figures may not show the compaction yet: look again soon.
            return Step::Wait(
                "NOSPACE: no member is due yet; the leader disarms once all fit".into(),
            );
        }
        return Step::Idle;
    };
    if next.id != obs.local_id {
        return Step::Wait(format!("member {} defragments first", next.name));
    }
    if obs.members.iter().any(|m| m.is_learner) {
        return Step::Wait("a learner is catching up: no defragmentation".into());
    }
    if let LockState::Held(holder) = &obs.lock {
        return Step::Wait(format!("the maintenance lock is held by {holder}"));
    }
    if leads && voters.len() > 1 {
        // Hand leadership to a follower that will not need defragmenting soon: the one with least free.
        let to = voters
            .iter()
            .filter(|m| m.id != obs.local_id)
            .filter_map(|m| m.status.map(|s| (m.id, s.free())))
            .min_by_key(|(id, free)| (*free, *id))
            .map(|(id, _)| id);
        return match to {
            Some(to) => Step::MoveLeader { to },
            None => Step::Wait("no follower to hand leadership to".into()),
        };
    }
    if obs.local_snapshot_in_progress {
        return Step::Wait("a snapshot of this member is being taken".into());
    }
    Step::Defrag { reason }
}

/// How much history to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keep this long (compacting to the revision seen that long ago).
    Period(Duration),
    /// Keep this many revisions.
    Revisions(i64),
    /// Never compact.
    Off,
}

impl Retention {
    /// `1h`, `30m` (a duration), `10000` (revisions), `0` (off).
    pub fn parse(s: &str) -> Result<Retention, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<i64>() {
            return match n {
                0 => Ok(Retention::Off),
                n if n > 0 => Ok(Retention::Revisions(n)),
                _ => Err(format!("{s:?}: a number of revisions must not be negative")),
            };
        }
        match humantime::parse_duration(s) {
            Ok(d) if d.is_zero() => Ok(Retention::Off),
            Ok(d) => Ok(Retention::Period(d)),
            Err(e) => Err(format!(
                "{s:?} is neither a duration like 1h or 30m nor a number of revisions: {e}"
            )),
        }
    }
}

/// Revisions seen at times, to find the revision of `retention` ago (etcd keeps no clock per revision).
#[derive(Debug, Clone, Default)]
pub struct RevisionSamples {
    samples: std::collections::VecDeque<(SystemTime, i64)>,
}

impl RevisionSamples {
    pub fn record(&mut self, at: SystemTime, revision: i64) {
        if self.samples.back().is_none_or(|(_, r)| *r != revision) {
            self.samples.push_back((at, revision));
        }
    }

    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// The newest revision seen at least `keep` before `now`; older samples are dropped.
    pub fn at_or_before(&mut self, now: SystemTime, keep: Duration) -> Option<i64> {
        let cutoff = now.checked_sub(keep)?;
        let mut found = None;
        while let Some((t, r)) = self.samples.front().copied() {
            if t > cutoff {
                break;
            }
            found = Some(r);
            // Keep the last sample at or before the cutoff: the next call may need it.
            if self.samples.get(1).is_some_and(|(t2, _)| *t2 <= cutoff) {
                self.samples.pop_front();
            } else {
                break;
            }
        }
        found
    }
}

/// The revision to compact to now, if any: what the retention allows, past the last compaction.
pub fn compaction_target(
    retention: Retention,
    current: i64,
    last_compacted: i64,
    samples: &mut RevisionSamples,
    now: SystemTime,
) -> Option<i64> {
    let target = match retention {
        Retention::Off => return None,
        Retention::Revisions(n) => current - n,
        Retention::Period(keep) => samples.at_or_before(now, keep)?,
    };
    (target > last_compacted && target > 0).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn st(db: u64, in_use: u64, leader: u64) -> Option<MemberStatus> {
        Some(MemberStatus {
            db_size: db * MIB,
            in_use: in_use * MIB,
            leader,
            raft_index: 1,
        })
    }

    fn m(id: u64, status: Option<MemberStatus>) -> MemberObs {
        MemberObs {
            id,
            name: format!("n{id}"),
            is_learner: false,
            status,
        }
    }

    /// Three voters, member 1 leads; `sizes` are (db, in use) in MiB per member 1..=3.
    fn obs(local: u64, sizes: [(u64, u64); 3]) -> Observation {
        Observation {
            local_id: local,
            members: (1..=3)
                .map(|i| m(i, st(sizes[i as usize - 1].0, sizes[i as usize - 1].1, 1)))
                .collect(),
            alarms: vec![],
            lock: LockState::Free,
            compacted_to_current: false,
            current_revision: 500,
            compaction_due: None,
            local_snapshot_in_progress: false,
            local_schedule_due: false,
            threshold: Threshold {
                ratio: 0.3,
                min_free: 64 * MIB,
            },
            quota: 2048 * MIB,
        }
    }

    const CLEAN: (u64, u64) = (100, 95);
    const FRAG: (u64, u64) = (300, 50);

    #[test]
    fn rolling_defragmentation_goes_follower_by_follower_then_the_leader() {
        let defrag = Step::Defrag {
            reason: DefragReason::Fragmented,
        };
        let cases: Vec<(&str, Observation, Step)> = vec![
            ("nothing fragmented", obs(2, [CLEAN; 3]), Step::Idle),
            (
                "first follower goes first",
                obs(2, [FRAG; 3]),
                defrag.clone(),
            ),
            (
                "second follower waits for the first",
                obs(3, [FRAG; 3]),
                Step::Wait("member n2 defragments first".into()),
            ),
            (
                "the leader waits for its followers",
                obs(1, [FRAG, CLEAN, FRAG]),
                Step::Wait("member n3 defragments first".into()),
            ),
            (
                "then the second follower",
                obs(3, [FRAG, CLEAN, FRAG]),
                defrag.clone(),
            ),
            (
                "the leader alone: leadership moves to the follower with least free",
                obs(1, [FRAG, (100, 90), CLEAN]),
                Step::MoveLeader { to: 3 },
            ),
            (
                "under 64 MiB free is not fragmented",
                obs(2, [CLEAN, (90, 40), CLEAN]),
                Step::Idle,
            ),
            (
                "under 30 % free is not fragmented",
                obs(2, [CLEAN, (1000, 800), CLEAN]),
                Step::Idle,
            ),
        ];
        for (name, o, want) in cases {
            assert_eq!(plan(&o), want, "{name}");
        }
    }

    #[test]
    fn defragmentation_fails_closed() {
        let mut silent = obs(2, [FRAG; 3]);
        silent.members[2].status = None;
        assert_eq!(
            plan(&silent),
            Step::Wait("member n3 does not answer: no defragmentation".into())
        );

        let mut learner = obs(2, [FRAG; 3]);
        learner.members.push(MemberObs {
            id: 9,
            name: "n9".into(),
            is_learner: true,
            status: None,
        });
        assert_eq!(
            plan(&learner),
            Step::Wait("a learner is catching up: no defragmentation".into())
        );

        let mut locked = obs(2, [FRAG; 3]);
        locked.lock = LockState::Held("n3 (cli)".into());
        assert_eq!(
            plan(&locked),
            Step::Wait("the maintenance lock is held by n3 (cli)".into())
        );

        let mut snap = obs(2, [FRAG; 3]);
        snap.local_snapshot_in_progress = true;
        assert_eq!(
            plan(&snap),
            Step::Wait("a snapshot of this member is being taken".into())
        );

        let mut no_leader = obs(2, [FRAG; 3]);
        for mem in &mut no_leader.members {
            if let Some(s) = &mut mem.status {
                s.leader = 0;
            }
        }
        assert_eq!(plan(&no_leader), Step::Wait("no leader".into()));

        let mut corrupt = obs(1, [FRAG; 3]);
        corrupt.alarms = vec![(2, AlarmKind::Corrupt)];
        assert!(matches!(plan(&corrupt), Step::Wait(_)));
    }

    #[test]
    fn nospace_compacts_then_defragments_then_disarms() {
        let full = (32, 31);
        let mut o = obs(1, [full; 3]);
        o.alarms = vec![(2, AlarmKind::NoSpace)];
        o.quota = 32 * MIB;
        // Before the compaction: the leader compacts to the current revision; the others wait.
        assert_eq!(
            plan(&o),
            Step::Compact {
                revision: 500,
                emergency: true
            }
        );
        o.local_id = 2;
        assert_eq!(
            plan(&o),
            Step::Wait("NOSPACE: the leader compacts first".into())
        );
        // Compacted, but the figures do not show it yet (a megabyte free from before): nobody goes, or
        // each would go again once they do; the leader makes its settling writes meanwhile.
        o.compacted_to_current = true;
        let lagging = (32, 30);
        o.members = (1..=3).map(|i| m(i, st(lagging.0, lagging.1, 1))).collect();
        assert!(matches!(plan(&o), Step::Wait(_)), "{:?}", plan(&o));
        o.local_id = 1;
        assert!(matches!(plan(&o), Step::DoesNotFit { .. }));
        o.local_id = 2;
        // Compacted: nearly everything is free; follower 2 goes first even below the usual threshold.
        let compacted = (32, 1);
        o.members = (1..=3)
            .map(|i| m(i, st(compacted.0, compacted.1, 1)))
            .collect();
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::NoSpace
            }
        );
        // Followers done, the leader hands over...
        o.members[1].status = st(1, 1, 1);
        o.members[2].status = st(1, 1, 1);
        o.local_id = 1;
        assert_eq!(plan(&o), Step::MoveLeader { to: 2 });
        // ...and is defragmented as a follower by its own agent.
        for mem in &mut o.members {
            mem.status.as_mut().unwrap().leader = 2;
        }
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::NoSpace
            }
        );
        // Everything fits: the new leader disarms.
        o.members[0].status = st(1, 1, 2);
        o.local_id = 2;
        assert_eq!(plan(&o), Step::Disarm { members: vec![2] });
        o.local_id = 3;
        assert!(matches!(plan(&o), Step::Wait(_)));
    }

    #[test]
    fn under_nospace_a_member_waits_for_the_one_before_it_whatever_its_own_figures_show() {
        // Leader 1; followers 2 and 3 go in that order. The compaction shows on 3 before it shows on 2.
        let mut o = obs(3, [(32, 31); 3]);
        o.alarms = vec![(2, AlarmKind::NoSpace)];
        o.quota = 32 * MIB;
        o.compacted_to_current = true;
        o.members = vec![m(1, st(32, 31, 1)), m(2, st(32, 31, 1)), m(3, st(32, 1, 1))];
        assert!(matches!(plan(&o), Step::Wait(_)), "{:?}", plan(&o));
        // The leader, whose own figures show the compaction, names the member whose figures do not (it
        // settles, and believes them only if they stay so), never itself.
        o.members[0].status = st(33, 1, 1);
        o.local_id = 1;
        assert!(
            matches!(plan(&o), Step::DoesNotFit { member: 2, .. }),
            "{:?}",
            plan(&o)
        );
        o.members[0].status = st(32, 31, 1);
        o.local_id = 3;
        // 2 shows it too: 2 goes, 3 still waits (2 does not fit until it is done).
        o.members[1].status = st(32, 1, 1);
        assert_eq!(plan(&o), Step::Wait("member n2 defragments first".into()));
        o.local_id = 2;
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::NoSpace
            }
        );
        // 2 done: 3 goes.
        o.members[1].status = st(1, 1, 1);
        o.local_id = 3;
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::NoSpace
            }
        );
    }

    #[test]
    fn live_data_over_the_quota_is_reported_not_looped_over() {
        // Defragmented: hardly a page free anywhere, and still at the quota.
        let mut o = obs(1, [(32, 32), (31, 31), (31, 31)]);
        o.alarms = vec![(1, AlarmKind::NoSpace)];
        o.quota = 32 * MIB;
        o.compacted_to_current = true;
        assert_eq!(
            plan(&o),
            Step::DoesNotFit {
                member: 1,
                db_size: 32 * MIB,
                in_use: 32 * MIB,
                quota: 32 * MIB
            }
        );
        o.local_id = 2;
        assert!(matches!(plan(&o), Step::Wait(_)));
    }

    #[test]
    fn a_due_schedule_defragments_the_local_member_in_turn() {
        let mut o = obs(3, [CLEAN; 3]);
        o.local_schedule_due = true;
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::Schedule
            }
        );
        // Fragmentation elsewhere goes first.
        o.members[1].status = st(FRAG.0, FRAG.1, 1);
        assert_eq!(plan(&o), Step::Wait("member n2 defragments first".into()));
    }

    #[test]
    fn compaction_happens_on_the_leader_only_and_not_under_a_held_lock() {
        let mut o = obs(1, [CLEAN; 3]);
        o.compaction_due = Some(400);
        assert_eq!(
            plan(&o),
            Step::Compact {
                revision: 400,
                emergency: false
            }
        );
        o.lock = LockState::Held("n2".into());
        assert!(matches!(plan(&o), Step::Wait(_)));
        o.local_id = 2;
        o.lock = LockState::Free;
        assert_eq!(plan(&o), Step::Idle);
    }

    #[test]
    fn a_single_member_defragments_itself_without_a_handover() {
        let mut o = obs(1, [FRAG; 3]);
        o.members.truncate(1);
        assert_eq!(
            plan(&o),
            Step::Defrag {
                reason: DefragReason::Fragmented
            }
        );
    }

    #[test]
    fn retention_parses_durations_and_revision_counts() {
        assert_eq!(
            Retention::parse("1h"),
            Ok(Retention::Period(Duration::from_secs(3600)))
        );
        assert_eq!(Retention::parse("10000"), Ok(Retention::Revisions(10000)));
        assert_eq!(Retention::parse("0"), Ok(Retention::Off));
        assert!(Retention::parse("-3").is_err());
        assert!(Retention::parse("soon").is_err());
    }

    #[test]
    fn compaction_targets_follow_the_retention() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut s = RevisionSamples::default();
        let hour = Duration::from_secs(3600);
        s.record(t0, 100);
        s.record(t0 + Duration::from_secs(1800), 200);
        s.record(t0 + hour, 300);
        let p = Retention::Period(hour);
        assert_eq!(compaction_target(p, 300, 0, &mut s, t0 + hour), Some(100));
        assert_eq!(
            compaction_target(p, 350, 0, &mut s, t0 + hour + Duration::from_secs(1800)),
            Some(200)
        );
        // Already compacted there: nothing to do.
        assert_eq!(
            compaction_target(p, 350, 200, &mut s, t0 + hour + Duration::from_secs(1800)),
            None
        );
        // Too young to know: nothing.
        let mut fresh = RevisionSamples::default();
        fresh.record(t0, 5);
        assert_eq!(compaction_target(p, 5, 0, &mut fresh, t0), None);
        assert_eq!(
            compaction_target(Retention::Revisions(1000), 5000, 0, &mut s, t0),
            Some(4000)
        );
        assert_eq!(
            compaction_target(Retention::Revisions(1000), 500, 0, &mut s, t0),
            None
        );
        assert_eq!(compaction_target(Retention::Off, 5000, 0, &mut s, t0), None);
    }
}
