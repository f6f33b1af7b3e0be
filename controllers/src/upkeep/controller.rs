//! [`UpkeepController`]: one work-queue key, reconciled on a timer (`Action::Requeue`): read the
//! cluster's figures, [`plan`](super::plan::plan), do the one step, requeue.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hostlet_api::objects::Timestamp;
use hostlet_runtime::{Action, Controller, ErrorAction, EtcdError, Metrics, Run};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::effects::{HeldLock, Members, Upkeep};
use super::lock::{LockHolder, LockStore};
use super::metrics::UpkeepMetrics;
use super::plan::{
    compaction_target, plan, AlarmKind, DefragReason, Observation, Retention, RevisionSamples,
    Step, Threshold, FIT_RATIO,
};
use crate::events::EventKind;
use crate::snapshots::schedule::Schedule;

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "upkeep";
/// etcd's backend quota when none is given.
pub const DEFAULT_QUOTA: u64 = 2 * 1024 * 1024 * 1024;
/// Events kept while etcd refuses writes, written once it takes them again.
const PENDING_EVENTS: usize = 200;

/// What the controller keeps and how it paces itself.
#[derive(Debug, Clone)]
pub struct UpkeepConfig {
    pub retention: Retention,
    pub threshold: Threshold,
    /// `--etcd-defrag-schedule`: defragment every member once per firing, in turn.
    pub schedule: Option<Schedule>,
    /// The quota etcd runs with (`--etcd-quota-backend-bytes`, else etcd's default).
    pub quota: u64,
    /// Next look when nothing is going on but a member's database is near the quota (a NOSPACE alarm
    /// may come any moment).
    pub poll_interval: Duration,
    /// Next look when nothing is going on and every database is well below the quota. A change the
    /// shared member cache sees (a member's db size, the leader) brings the next look forward.
    pub idle_interval: Duration,
    /// Next look while something is under way (an alarm, a turn to wait for).
    pub busy_interval: Duration,
    /// How long after a write has been applied everywhere the members' figures count it (see
    /// [`BACKEND_SETTLE`], the default).
    pub backend_settle: Duration,
}

impl Default for UpkeepConfig {
    fn default() -> Self {
        UpkeepConfig {
            retention: Retention::Period(Duration::from_secs(3600)),
            threshold: Threshold {
                ratio: 0.3,
                min_free: 64 * 1024 * 1024,
            },
            schedule: None,
            quota: DEFAULT_QUOTA,
            poll_interval: Duration::from_secs(5),
            idle_interval: Duration::from_secs(30),
            busy_interval: Duration::from_secs(1),
            backend_settle: BACKEND_SETTLE,
        }
    }
}

/// What the controller remembers between reconciles.
#[derive(Default)]
struct State {
    samples: RevisionSamples,
    last_compacted: i64,
    /// When this agent last compacted (or tried to).
    last_compaction_at: Option<Instant>,
    leading: bool,
    next_fire: Option<SystemTime>,
    schedule_due: bool,
    /// Events that etcd refused (NOSPACE), oldest first.
    pending: Vec<(EventKind, String, String, Timestamp)>,
    /// A NOSPACE alarm is up (since the reconcile that first saw it).
    nospace: bool,
    reported_no_fit: bool,
    /// Settling writes made at this revision (see [`UpkeepController::settle`]).
    settled: (i64, u32),
    last_wait: String,
    members_shown: BTreeSet<String>,
    /// A member's database was at [`NEAR_QUOTA`] of the quota or more at the last look.
    near_quota: bool,
    /// The last reconcile planned a step or a wait: something is under way.
    busy: bool,
    /// The leader's turn, or its idleness after maintenance, while the figures are being confirmed (see
    /// [`Confirmation`]).
    confirming: Option<Confirmation>,
    /// Look fresh once more: the maintenance lock changed hands a moment ago.
    recheck: bool,
}

/// What the leader's agent confirms before it acts on a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirming {
    /// Its own turn: no follower is due (the followers' figures).
    LeaderTurn,
    /// After maintenance, that nobody is due (every voter's figures, its own too).
    Idle,
}

impl Confirming {
    /// The maintenance lock's operation for this confirmation's settling writes.
    fn operation(self) -> &'static str {
        match self {
            Confirming::LeaderTurn => CONFIRM_LEADER_TURN,
            Confirming::Idle => CONFIRM_IDLE,
        }
    }
}

/// Lock operations that only make the members' figures count what was freed: no maintenance themselves,
/// so they bring the other agents a look but no confirmation of their own.
pub const CONFIRM_LEADER_TURN: &str = "confirm the leader's turn";
pub const CONFIRM_IDLE: &str = "confirm the members' figures after maintenance";

/// Whether a maintenance lock held for `operation` did maintenance (compacted, defragmented, restarted a
/// member), as opposed to a settling write.
pub fn is_maintenance(operation: &str) -> bool {
    operation != CONFIRM_LEADER_TURN && operation != CONFIRM_IDLE
}

/// Settling writes after which a confirmation ends even if the figures keep changing (a busy cluster's
/// writes move them on every look): by then every member has committed what the maintenance freed.
pub const MAX_SETTLING_WRITES: u32 = 4;

/// The leader goes last, so its turn is taken only on followers' figures that count what the last
/// compaction or defragmentation freed; and after maintenance, "nobody is due" holds only on figures that
/// count it. A member counts the pages a compaction freed only once a later write commits (3.4 and 3.5
/// alike; a quiet cluster makes none), and applies a compaction in the background: figures read at one
/// moment can be from before either. So the leader's agent writes, looks again once every member has that
/// write, writes again, and believes the look only when two such looks agree (or after
/// [`MAX_SETTLING_WRITES`]).
/// Unless no member concerned has a file big enough to be due however much of it were free: then the lag
/// cannot matter and one look does.
#[derive(Debug, Clone, PartialEq)]
struct Confirmation {
    what: Confirming,
    /// Each concerned voter's (id, db size, in use) at the look that recorded this.
    figures: Vec<(u64, u64, u64)>,
    /// That look came after every follower had got the previous settling write.
    after_write: bool,
    /// The leader's raft index once this turn's settling write was done.
    write_index: u64,
    /// When a look first showed every follower had applied that write: their figures count it only once
    /// their backends have committed twice since (see [`BACKEND_SETTLE`]).
    reached_at: Option<Instant>,
    /// Settling writes made so far.
    writes: u32,
}

/// A member's backend commits what it applied every 100 ms (etcd's default `--backend-batch-interval`), and
/// its in-use figure counts pages a commit freed only after the next one: two intervals and a margin after
/// a write has been applied everywhere, every follower's figures count it.
pub const BACKEND_SETTLE: Duration = Duration::from_millis(250);

/// The voters' figures as a [`Confirmation`] compares them (the local member's only for
/// [`Confirming::Idle`]); `None` if one does not answer.
fn voter_figures(obs: &Observation, what: Confirming) -> Option<Vec<(u64, u64, u64)>> {
    let with_local = what == Confirming::Idle;
    let mut figures: Vec<(u64, u64, u64)> = obs
        .members
        .iter()
        .filter(|m| !m.is_learner && (with_local || m.id != obs.local_id))
        .map(|m| m.status.map(|s| (m.id, s.db_size, s.in_use)))
        .collect::<Option<_>>()?;
    figures.sort_unstable();
    Some(figures)
}

/// Every voting follower has reached raft index `index`.
fn followers_reached(obs: &Observation, index: u64) -> bool {
    obs.members
        .iter()
        .filter(|m| !m.is_learner && m.id != obs.local_id)
        .all(|m| m.status.is_some_and(|s| s.raft_index >= index))
}

/// The share of the quota from which the controller looks every [`UpkeepConfig::poll_interval`].
const NEAR_QUOTA: f64 = 0.8;

/// The upkeep controller of one agent.
pub struct UpkeepController<U> {
    upkeep: Arc<U>,
    cfg: UpkeepConfig,
    metrics: UpkeepMetrics,
    registry: Metrics,
    state: Mutex<State>,
    /// The maintenance lock key's cache: its release is the next member's turn, looked at at once rather
    /// than at the next poll.
    lock: Option<LockStore>,
    /// The lock changed since the last reconcile: someone compacted or defragmented, and the figures the
    /// cache holds may be from before that.
    lock_changed: AtomicBool,
    /// Among those changes, one of maintenance (not a settling write): the leader's agent confirms that
    /// nobody is due before it goes idle.
    maintained: AtomicBool,
}

impl<U: Upkeep> UpkeepController<U> {
    /// Registers the upkeep metrics in `metrics`' registry (once per registry).
    /// `db_size` is the member metrics' `hostlet_etcd_db_size_bytes{member}`.
    pub fn new(
        upkeep: Arc<U>,
        cfg: UpkeepConfig,
        metrics: &Metrics,
        db_size: prometheus::IntGaugeVec,
    ) -> Result<Self, prometheus::Error> {
        let m = UpkeepMetrics::register(metrics.registry(), db_size)?;
        m.quota.set(cfg.quota as f64);
        Ok(UpkeepController {
            upkeep,
            metrics: m,
            registry: metrics.clone(),
            cfg,
            state: Mutex::new(State::default()),
            lock: None,
            lock_changed: AtomicBool::new(false),
            maintained: AtomicBool::new(false),
        })
    }

    /// Watches the maintenance lock key's cache (see [`UpkeepController::run`]).
    #[must_use]
    pub fn with_lock(mut self, lock: LockStore) -> Self {
        self.lock = Some(lock);
        self
    }

    pub fn metrics(&self) -> &UpkeepMetrics {
        &self.metrics
    }

    /// The maintenance lock changed for `operation`: the next reconcile looks fresh, and once more a
    /// moment later; after maintenance, the leader's agent confirms before it goes idle.
    pub fn lock_changed(&self, operation: &str) {
        self.lock_changed.store(true, Ordering::SeqCst);
        if is_maintenance(operation) {
            self.maintained.store(true, Ordering::SeqCst);
        }
    }

    /// Logs an event now and writes it, or keeps it for when etcd takes writes again.
    async fn emit(&self, st: &mut State, kind: EventKind, reason: &str, message: String) {
        self.emit_at(st, kind, reason, message, Timestamp::now())
            .await
    }

    /// As [`Self::emit`], for something that happened at `at`.
    async fn emit_at(
        &self,
        st: &mut State,
        kind: EventKind,
        reason: &str,
        message: String,
        at: Timestamp,
    ) {
        match kind {
            EventKind::Normal => tracing::info!(reason, "{message}"),
            EventKind::Warning => tracing::warn!(reason, "{message}"),
        }
        let refused = st.nospace || self.upkeep.event(kind, reason, &message, at).await.is_err();
        if refused && st.pending.len() < PENDING_EVENTS {
            st.pending.push((kind, reason.to_string(), message, at));
        }
    }

    async fn flush_events(&self, st: &mut State) {
        while let Some((kind, reason, message, at)) = st.pending.first().cloned() {
            if self
                .upkeep
                .event(kind, &reason, &message, at)
                .await
                .is_err()
            {
                return;
            }
            st.pending.remove(0);
        }
    }

    fn show(&self, st: &mut State, members: &Members, alarms: &[(u64, AlarmKind)]) {
        let mut shown = BTreeSet::new();
        for m in &members.members {
            if let Some(s) = m.status {
                self.metrics
                    .db_size
                    .with_label_values(&[&m.name])
                    .set(s.db_size as i64);
                self.metrics
                    .db_in_use
                    .with_label_values(&[&m.name])
                    .set(s.in_use as i64);
                shown.insert(m.name.clone());
            }
        }
        for gone in st.members_shown.difference(&shown) {
            let _ = self.metrics.db_size.remove_label_values(&[gone]);
            let _ = self.metrics.db_in_use.remove_label_values(&[gone]);
        }
        st.members_shown = shown;
        for kind in [AlarmKind::NoSpace, AlarmKind::Corrupt] {
            let n = alarms.iter().filter(|(_, a)| *a == kind).count();
            self.metrics
                .alarms
                .with_label_values(&[kind.label()])
                .set(n as i64);
        }
    }

    /// One look at the cluster and at most one step.
    pub async fn reconcile(&self) -> Result<Action, EtcdError> {
        let mut st = self.state.lock().await;
        // While acting (or near the quota) the figures must be fresh; otherwise the cache's last look does,
        // unless maintenance just happened: the cache may have looked before it freed anything.
        let lock_changed = self.lock_changed.swap(false, Ordering::SeqCst);
        let maintained = self.maintained.swap(false, Ordering::SeqCst);
        let recheck = std::mem::take(&mut st.recheck);
        let fresh = st.busy
            || st.nospace
            || st.near_quota
            || lock_changed
            || recheck
            || st.confirming.is_some();
        let began = Instant::now();
        let members = self.upkeep.members(fresh).await?;
        let looked = began.elapsed();
        let alarms = self.upkeep.alarms().await?;
        self.show(&mut st, &members, &alarms);
        let nospace = alarms.iter().any(|(_, a)| *a == AlarmKind::NoSpace);
        st.near_quota = members.members.iter().any(|m| {
            m.status
                .is_some_and(|s| s.db_size as f64 >= NEAR_QUOTA * self.cfg.quota as f64)
        });
        let local = members.members.iter().find(|m| m.id == members.local_id);
        let leads = local
            .and_then(|m| m.status)
            .is_some_and(|s| s.leader != 0 && s.leader == members.local_id);
        if !nospace {
            if st.nospace {
                st.nospace = false;
                st.reported_no_fit = false;
                self.metrics.space_exhausted.set(0);
            }
            self.flush_events(&mut st).await;
        } else if !st.nospace {
            st.nospace = true;
            if leads {
                let sizes: Vec<String> = members
                    .members
                    .iter()
                    .filter_map(|m| {
                        m.status
                            .map(|s| format!("{} {} B (in use {} B)", m.name, s.db_size, s.in_use))
                    })
                    .collect();
                self.emit(
                    &mut st,
                    EventKind::Warning,
                    "EtcdNoSpace",
                    format!(
                        "etcd raised NOSPACE (quota {} B) and refuses writes: compacting, defragmenting each member, then disarming; members: {}",
                        self.cfg.quota,
                        sizes.join(", ")
                    ),
                )
                .await;
            }
        }
        let lock = self.upkeep.lock_state().await?;
        let current_revision = self.upkeep.revision().await?;
        let compacted_to_current = nospace && self.upkeep.is_compacted_to(current_revision).await?;
        let now = self.upkeep.now();
        if leads {
            if !st.leading {
                st.samples.clear();
            }
            st.samples.record(now, current_revision);
        }
        st.leading = leads;
        let compaction_rested = st
            .last_compaction_at
            .is_none_or(|t| t.elapsed() >= compaction_interval(self.cfg.retention));
        let compaction_due = if leads && !nospace && compaction_rested {
            let last = st.last_compacted;
            compaction_target(
                self.cfg.retention,
                current_revision,
                last,
                &mut st.samples,
                now,
            )
        } else {
            None
        };
        if let Some(schedule) = &self.cfg.schedule {
            match st.next_fire {
                None => st.next_fire = schedule.next_after(now),
                Some(t) if t <= now => {
                    st.schedule_due = true;
                    st.next_fire = schedule.next_after(now);
                }
                _ => {}
            }
        }
        let obs = Observation {
            local_id: members.local_id,
            members: members.members.clone(),
            alarms,
            lock,
            compacted_to_current,
            current_revision,
            compaction_due,
            local_snapshot_in_progress: self.upkeep.snapshot_in_progress(),
            local_schedule_due: st.schedule_due,
            threshold: self.cfg.threshold,
            quota: self.cfg.quota,
        };
        let step = plan(&obs);
        tracing::debug!(
            ?step,
            fresh,
            members_ms = looked.as_millis() as u64,
            all_ms = began.elapsed().as_millis() as u64,
            "upkeep look"
        );
        st.busy = !matches!(step, Step::Idle);
        if st.busy && !fresh {
            // The cache's last look says there is something to do: act only on a look taken now.
            return Ok(Action::Requeue(Duration::ZERO));
        }
        if !matches!(step, Step::Wait(_)) {
            st.last_wait.clear();
        }
        let kept = match step {
            Step::MoveLeader { .. } => Some(Confirming::LeaderTurn),
            Step::Idle => Some(Confirming::Idle),
            _ => None,
        };
        if st.confirming.as_ref().map(|c| c.what) != kept {
            st.confirming = None;
        }
        let busy = self.cfg.busy_interval;
        let name_of = |id: u64| {
            obs.members
                .iter()
                .find(|m| m.id == id)
                .map(|m| m.name.clone())
                .unwrap_or_else(|| format!("{id:x}"))
        };
        match step {
            Step::Idle
                if leads
                    && (maintained || st.confirming.is_some())
                    && !obs.none_can_be_due(true) =>
            {
                match self.confirmed(&mut st, &obs, Confirming::Idle).await? {
                    Some(again) => Ok(Action::Requeue(again.min(busy))),
                    None => Ok(Action::Requeue(self.next_poll(&st, now))),
                }
            }
            Step::Idle if lock_changed => {
                // What the maintenance freed is counted only once the backends have committed it.
                st.recheck = true;
                Ok(Action::Requeue(self.cfg.backend_settle))
            }
            Step::Idle => Ok(Action::Requeue(self.next_poll(&st, now))),
            Step::Wait(reason) => {
                if reason != st.last_wait {
                    tracing::info!(%reason, "upkeep waits");
                    st.last_wait = reason;
                }
                Ok(Action::Requeue(busy))
            }
            Step::Compact {
                revision,
                emergency,
            } => {
                let lock = if emergency {
                    // etcd refuses the lock's write under NOSPACE; the leader alone compacts.
                    None
                } else {
                    match self.upkeep.lock(&format!("compact {revision}")).await? {
                        Ok(l) => Some(l),
                        Err(holder) => {
                            tracing::info!(%holder, "compaction due; the maintenance lock is held");
                            return Ok(Action::Requeue(busy));
                        }
                    }
                };
                let started = Instant::now();
                // The event carries when the compaction began: the other members may see it done and go
                // on before this agent has settled and written it.
                let began = Timestamp::now();
                st.last_compaction_at = Some(started);
                let result = self.upkeep.compact(revision).await;
                if let Some(l) = lock {
                    l.release().await;
                }
                if emergency && result.is_ok() {
                    self.settle(&obs).await;
                }
                match result {
                    Ok(()) => {
                        st.last_compacted = revision;
                        self.metrics
                            .compactions_total
                            .with_label_values(&["success"])
                            .inc();
                        let message = if emergency {
                            format!("NOSPACE: compacted the history up to the current revision {revision}, whatever the retention, in {:.2}s; defragmenting next", started.elapsed().as_secs_f64())
                        } else {
                            format!("compacted the history up to revision {revision} (retention {}) in {:.2}s", retention_text(self.cfg.retention), started.elapsed().as_secs_f64())
                        };
                        self.emit_at(&mut st, EventKind::Normal, "EtcdCompacted", message, began)
                            .await;
                        Ok(Action::Requeue(busy))
                    }
                    Err(e) if e.is_compacted() => {
                        // Compacted there already (by an earlier leader, or by hand).
                        st.last_compacted = st.last_compacted.max(revision);
                        Ok(Action::Requeue(busy))
                    }
                    Err(e) => {
                        self.metrics
                            .compactions_total
                            .with_label_values(&["failure"])
                            .inc();
                        self.emit(
                            &mut st,
                            EventKind::Warning,
                            "EtcdCompactionFailed",
                            format!("compaction up to revision {revision} failed: {e}"),
                        )
                        .await;
                        Ok(Action::Requeue(busy))
                    }
                }
            }
            Step::Defrag { reason } => {
                let me = name_of(obs.local_id);
                let before = obs
                    .members
                    .iter()
                    .find(|m| m.id == obs.local_id)
                    .and_then(|m| m.status);
                let lock = if nospace {
                    None
                } else {
                    match self.upkeep.lock(&format!("defrag {me}")).await? {
                        Ok(l) => Some(l),
                        Err(holder) => {
                            tracing::info!(%holder, "defragmentation due; the maintenance lock is held");
                            return Ok(Action::Requeue(busy));
                        }
                    }
                };
                let (db, in_use) = before.map(|s| (s.db_size, s.in_use)).unwrap_or((0, 0));
                self.emit(
                    &mut st,
                    EventKind::Normal,
                    "EtcdDefragmenting",
                    format!(
                        "defragmenting member {me} ({}): db {db} B, in use {in_use} B",
                        reason.as_str()
                    ),
                )
                .await;
                let started = Instant::now();
                let result = self.upkeep.defragment_local().await;
                let took = started.elapsed();
                // The end is when etcd answered, not after the look below: the next member may already
                // have seen this one done and begun.
                let finished = Timestamp::now();
                // The lock goes first: the look below only describes this member, and the next one
                // should not wait for it.
                if let Some(l) = lock {
                    l.release().await;
                }
                let after = match self.upkeep.members(true).await {
                    Ok(m) => m
                        .members
                        .iter()
                        .find(|x| x.id == m.local_id)
                        .and_then(|x| x.status),
                    Err(_) => None,
                };
                self.metrics.defrag_duration.observe(took.as_secs_f64());
                match result {
                    Ok(()) => {
                        self.metrics
                            .defrag_total
                            .with_label_values(&["success"])
                            .inc();
                        if reason == DefragReason::Schedule || after.is_some() {
                            st.schedule_due = false;
                        }
                        let now_size = after
                            .map(|s| format!("{} B (in use {} B)", s.db_size, s.in_use))
                            .unwrap_or_else(|| "unknown".into());
                        self.emit_at(
                            &mut st,
                            EventKind::Normal,
                            "EtcdDefragmented",
                            format!(
                                "defragmented member {me} ({}) in {:.2}s: db {db} B → {now_size}",
                                reason.as_str(),
                                took.as_secs_f64()
                            ),
                            finished,
                        )
                        .await;
                    }
                    Err(e) => {
                        self.metrics
                            .defrag_total
                            .with_label_values(&["failure"])
                            .inc();
                        self.emit(
                            &mut st,
                            EventKind::Warning,
                            "EtcdDefragFailed",
                            format!(
                                "defragmentation of member {me} failed after {:.2}s: {e}",
                                took.as_secs_f64()
                            ),
                        )
                        .await;
                    }
                }
                Ok(Action::Requeue(busy))
            }
            Step::MoveLeader { to } => {
                if let Some(again) = self
                    .confirmed(&mut st, &obs, Confirming::LeaderTurn)
                    .await?
                {
                    return Ok(Action::Requeue(again.min(busy)));
                }
                let me = name_of(obs.local_id);
                match self.upkeep.move_leader(to).await {
                    Ok(()) => {
                        self.emit(
                            &mut st,
                            EventKind::Normal,
                            "EtcdLeaderMoved",
                            format!("leadership moved from {me} to {} before defragmenting {me} (the leader goes last)", name_of(to)),
                        )
                        .await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, to = %name_of(to), "cannot move leadership before defragmenting");
                        return Ok(Action::Requeue(busy));
                    }
                }
                // A follower now: its own turn comes next.
                Ok(Action::Requeue(Duration::ZERO))
            }
            Step::Disarm { members: alarmed } => {
                for m in &alarmed {
                    self.upkeep.disarm_nospace(*m).await?;
                }
                st.nospace = false;
                st.reported_no_fit = false;
                self.metrics.space_exhausted.set(0);
                self.flush_events(&mut st).await;
                let sizes: Vec<String> = obs
                    .members
                    .iter()
                    .filter_map(|m| m.status.map(|s| format!("{} {} B", m.name, s.db_size)))
                    .collect();
                self.emit(
                    &mut st,
                    EventKind::Normal,
                    "EtcdAlarmDisarmed",
                    format!(
                        "NOSPACE disarmed (raised by {}): every member fits under the quota of {} B again ({}); writes are accepted",
                        alarmed.iter().map(|m| name_of(*m)).collect::<Vec<_>>().join(", "),
                        self.cfg.quota,
                        sizes.join(", ")
                    ),
                )
                .await;
                Ok(Action::Requeue(busy))
            }
            Step::DoesNotFit {
                member,
                db_size,
                in_use,
                quota,
            } => {
                // The figures may lag what the compaction freed; believe them only after two more
                // settling writes, a look apart, at this revision.
                if st.settled.0 != current_revision {
                    st.settled = (current_revision, 0);
                }
                if st.settled.1 < 2 {
                    st.settled.1 += 1;
                    self.settle(&obs).await;
                    return Ok(Action::Requeue(busy));
                }
                // Every later look settles again: a member that applied the compaction after the last
                // settling write shows it only after a later one, and without it would never be
                // defragmented.
                self.settle(&obs).await;
                self.metrics.space_exhausted.set(1);
                if !st.reported_no_fit {
                    st.reported_no_fit = true;
                    tracing::error!(member = %name_of(member), db_size, in_use, quota, "etcd data does not fit under the quota");
                    self.emit(
                        &mut st,
                        EventKind::Warning,
                        "EtcdSpaceExhausted",
                        format!(
                            "the live data does not fit: member {} holds {db_size} B ({in_use} B in use) after compacting to the current revision and defragmenting, against a quota of {quota} B; NOSPACE stays raised and writes refused. Next step: delete keys (etcd accepts deletes now) or restart the members with a larger --etcd-quota-backend-bytes; hostlet disarms the alarm once the data fits",
                            name_of(member)
                        ),
                    )
                    .await;
                }
                Ok(Action::Requeue(self.cfg.poll_interval))
            }
        }
    }

    /// `None` when the look may be acted on now (see [`Confirmation`]); otherwise makes the next settling
    /// write when one is due, and says when to look again.
    async fn confirmed(
        &self,
        st: &mut State,
        obs: &Observation,
        what: Confirming,
    ) -> Result<Option<Duration>, EtcdError> {
        let busy = self.cfg.busy_interval;
        let Some(figures) = voter_figures(obs, what) else {
            st.confirming = None;
            return Ok(Some(busy));
        };
        if obs.none_can_be_due(what == Confirming::Idle) {
            st.confirming = None;
            return Ok(None);
        }
        if let Some(c) = &mut st.confirming {
            if !followers_reached(obs, c.write_index) {
                // A follower has not got the last settling write yet: wait for it rather than write more.
                return Ok(Some(busy));
            }
            // Applied is not yet committed to the followers' backends, where their figures come from.
            let reached_at = *c.reached_at.get_or_insert_with(Instant::now);
            let settling = self.cfg.backend_settle.saturating_sub(reached_at.elapsed());
            if !settling.is_zero() {
                return Ok(Some(settling));
            }
            if (c.after_write && c.figures == figures) || c.writes >= MAX_SETTLING_WRITES {
                st.confirming = None;
                return Ok(None);
            }
        }
        let (had_write, writes) = st
            .confirming
            .as_ref()
            .map_or((false, 0), |c| (true, c.writes));
        // The settling write: the maintenance lock taken and given back, or under NOSPACE (which refuses
        // writes) an alarm that holds anyway.
        if obs.nospace() {
            self.settle(obs).await;
        } else {
            match self.upkeep.lock(what.operation()).await? {
                Ok(l) => l.release().await,
                Err(holder) => {
                    tracing::info!(%holder, confirming = what.operation(), "the maintenance lock is held");
                    return Ok(Some(busy));
                }
            }
        }
        tracing::debug!(
            confirming = what.operation(),
            writes = writes + 1,
            "upkeep settling write"
        );
        let after = self.upkeep.members(true).await?;
        let write_index = after
            .members
            .iter()
            .find(|m| m.id == after.local_id)
            .and_then(|m| m.status)
            .map(|s| s.raft_index);
        st.confirming = write_index.map(|write_index| Confirmation {
            what,
            figures,
            after_write: had_write,
            write_index,
            reached_at: None,
            writes: writes + 1,
        });
        Ok(Some(Duration::ZERO))
    }

    /// After a compaction under NOSPACE: one write to each member's backend, so that the members report
    /// the space the compaction freed. bbolt counts pages freed by a transaction as free only once a later
    /// transaction commits, and etcd refuses every write but alarms now. The write is an alarm that holds
    /// anyway: NOSPACE for a member whose file is at the quota and has none yet; failing that, the leader's
    /// own alarm cleared and raised again (another alarm, or the files over the quota, keep writes refused
    /// in between). Every NOSPACE alarm goes at the disarm.
    async fn settle(&self, obs: &Observation) {
        let alarmed: BTreeSet<u64> = obs
            .alarms
            .iter()
            .filter(|(_, a)| *a == AlarmKind::NoSpace)
            .map(|(m, _)| *m)
            .collect();
        let full = obs.members.iter().find(|m| {
            !m.is_learner
                && !alarmed.contains(&m.id)
                && m.status
                    .is_some_and(|s| s.db_size as f64 >= FIT_RATIO * self.cfg.quota as f64)
        });
        let result = match full {
            Some(m) => self.upkeep.raise_nospace(m.id).await,
            None => match self.upkeep.disarm_nospace(obs.local_id).await {
                Ok(()) => self.upkeep.raise_nospace(obs.local_id).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot make the members count the space the compaction freed; their in-use figures may lag");
        }
    }

    /// The next look when idle: the poll interval, or the schedule's next firing if sooner.
    fn next_poll(&self, st: &State, now: SystemTime) -> Duration {
        let mut poll = if st.near_quota || st.nospace {
            self.cfg.poll_interval
        } else {
            self.cfg.idle_interval
        };
        if st.leading {
            // Compaction by retention needs its revision samples.
            poll = poll.min(compaction_interval(self.cfg.retention));
        }
        match st.next_fire {
            Some(t) => t.duration_since(now).unwrap_or_default().min(poll),
            None => poll,
        }
    }
}

impl<U: Upkeep> Run for UpkeepController<U> {
    /// Runs until `shutdown` fires.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let retry = self.cfg.poll_interval;
        let mut c = Controller::new(CONTROLLER, self.clone(), &self.registry)
            .triggers(futures::stream::iter([()]))
            .triggers(self.upkeep.changes());
        if let Some(store) = &self.lock {
            let (this, lock) = (self.clone(), store.clone());
            c = c.watches_changes(store, move |change| {
                // A put's holder is in the store; a release carries the holder it deleted. An unreadable
                // one counts as maintenance.
                let value = change.deleted.clone().or_else(|| lock.get(&change.key));
                let operation = value
                    .and_then(|o| o.value.as_ref().ok().cloned())
                    .and_then(|v| serde_json::from_slice::<LockHolder>(&v).ok())
                    .map(|h| h.operation)
                    .unwrap_or_default();
                this.lock_changed(&operation);
                Some(())
            });
        }
        let stop = shutdown.clone();
        c.run(
            move |(), this: Arc<Self>| {
                let stop = stop.clone();
                async move {
                    // A look in progress is dropped at the stop: without quorum each of its etcd reads
                    // waits out the request timeout, past the agent's drain. What it does is safe to
                    // leave midway (a compaction or defragmentation is one request; the lock is leased)
                    // and is looked at afresh after the next start.
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => Ok(Action::AwaitChange),
                        r = this.reconcile() => r,
                    }
                }
            },
            // etcd down or the member restarting: look again soon, the way a timer would.
            move |_, _, _| ErrorAction::Requeue(retry),
            shutdown,
        )
        .await;
    }
}

/// Least time between two compactions by retention: a tenth of the period kept (1 s to 5 min), or 30 s when
/// a number of revisions is kept. Compacting on every look would starve the rest of the work.
pub fn compaction_interval(r: Retention) -> Duration {
    match r {
        Retention::Period(d) => (d / 10).clamp(Duration::from_secs(1), Duration::from_secs(300)),
        Retention::Revisions(_) | Retention::Off => Duration::from_secs(30),
    }
}

fn retention_text(r: Retention) -> String {
    match r {
        Retention::Period(d) => humantime::format_duration(d).to_string(),
        Retention::Revisions(n) => format!("{n} revisions"),
        Retention::Off => "off".into(),
    }
}
