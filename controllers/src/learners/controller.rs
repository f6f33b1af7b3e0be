//! [`LearnerManager`]: promotes learners as soon as etcd accepts, evicts those that stall.
//!
//! Every agent follows the shared member cache (which looks fast while a learner exists); only where the
//! local member leads does it act. Each learner is a key of the work queue (its member id): a reconcile first asks etcd to
//! promote it, and when etcd answers that it is not in sync yet, looks at how far it got and keeps its
//! figures in `/hostlet/etcd/learner-progress`. That record is the stall clock; a leader reads it when it
//! takes over, so the clock continues across leader changes. The record is written with a compare on its
//! revision: a leader that lost its place cannot overwrite its successor's clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hostlet_api::objects::{LearnerProgress, LearnerRecord};
use hostlet_runtime::{Action, Controller, ErrorAction, Member, Metrics, Run};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::LearnerMetrics;
use super::stall::{assess, next_baseline, Assessment, SentBaseline};
use crate::events::EventKind;
use crate::members::cluster::{
    Cluster, ClusterError, ClusterView, LearnerObservation, PromoteOutcome,
};

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "learners";

/// How the learner manager paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnerConfig {
    /// A learner without progress for this long is removed (`--learner-stall-timeout`).
    pub stall_timeout: Duration,
    /// Next attempt while a learner answers: it may become promotable any moment.
    pub requeue_answering: Duration,
    /// Next attempt while a learner does not answer (not started, down)…
    pub requeue_silent: Duration,
    /// …unless it was added this recently: a learner just added is about to start and catch up, which on a
    /// fast network takes a fraction of a second, so it is looked at as often as an answering one.
    pub fresh_for: Duration,
    /// Least time between two writes of the progress record (a learner's first progress and removals are
    /// written at once).
    pub record_interval: Duration,
}

impl LearnerConfig {
    /// The defaults, with this stall timeout.
    pub fn new(stall_timeout: Duration) -> Self {
        LearnerConfig {
            stall_timeout,
            requeue_answering: Duration::from_millis(100),
            requeue_silent: Duration::from_millis(250),
            fresh_for: Duration::from_secs(10),
            record_interval: Duration::from_secs(1),
        }
    }
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig::new(Duration::from_secs(300))
    }
}

/// The member id as the record and the node records write it.
fn hex(id: u64) -> String {
    format!("{id:x}")
}

/// What only the leader holds: the record as last read or written, and what is not written yet.
struct Leading {
    progress: LearnerProgress,
    revision: i64,
    /// Changed since the last write.
    dirty: bool,
    /// Write now rather than at the next interval: a learner left the record, or showed its first progress.
    urgent: bool,
    last_write: Option<Instant>,
    /// What this leader has seen of each learner, beyond the record.
    watched: HashMap<u64, Watched>,
}

/// What a leader keeps of a learner between reconciles.
#[derive(Debug, Default)]
struct Watched {
    /// The leader's byte count when the learner last counted as moving.
    baseline: Option<SentBaseline>,
    /// The byte count at the last look: moving means connected, worth a quick look again.
    last_sent: Option<u64>,
    /// How long it has gone without progress, for the gauge.
    stalled: Duration,
    /// Its first progress has been written: later progress waits for the record interval.
    progress_written: bool,
}

impl Leading {
    fn record(&self, id: u64) -> Option<&LearnerRecord> {
        self.progress.learners.get(&hex(id))
    }

    fn put(&mut self, id: u64, record: LearnerRecord) {
        self.progress.learners.insert(hex(id), record);
        self.dirty = true;
    }

    fn forget(&mut self, id: u64) -> Option<LearnerRecord> {
        self.watched.remove(&id);
        let gone = self.progress.learners.remove(&hex(id));
        if gone.is_some() {
            self.dirty = true;
            self.urgent = true;
        }
        gone
    }

    fn longest_stall(&self) -> Duration {
        self.watched
            .values()
            .map(|w| w.stalled)
            .max()
            .unwrap_or_default()
    }
}

/// Whether a learner may be promoted now (the voter target): a learner held back is still tracked, and
/// evicted if it stalls.
pub type PromoteGate = Arc<dyn Fn(&ClusterView, &Member) -> bool + Send + Sync>;

/// The learner manager. Build it with [`LearnerManager::new`], start it with [`hostlet_runtime::spawn`].
pub struct LearnerManager<C> {
    gate: Option<PromoteGate>,
    cluster: Arc<C>,
    cfg: LearnerConfig,
    metrics: LearnerMetrics,
    registry: Metrics,
    leading: Mutex<Option<Leading>>,
}

impl<C: Cluster> LearnerManager<C> {
    /// Registers the learner metrics in `metrics`' registry (once per registry).
    pub fn new(
        cluster: Arc<C>,
        cfg: LearnerConfig,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        Ok(LearnerManager {
            gate: None,
            cluster,
            metrics: LearnerMetrics::register(metrics.registry())?,
            registry: metrics.clone(),
            cfg,
            leading: Mutex::new(None),
        })
    }

    /// Promotes only the learners `gate` lets through (voter placement decides who becomes a voter).
    #[must_use]
    pub fn with_gate(mut self, gate: PromoteGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Reads the membership: gauges everywhere; on the leader, the learners to look at, and members the
    /// record still holds (gone or promoted while nobody led).
    async fn poll(&self) -> Vec<u64> {
        let view = match self.cluster.view().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "learner manager: cannot read the membership");
                return Vec::new();
            }
        };
        self.set_member_gauges(&view);
        let mut leading = self.leading.lock().await;
        if !view.local_is_leader() {
            self.step_down(&mut leading);
            return Vec::new();
        }
        let mut ids: Vec<u64> = view.learners().map(|l| l.id).collect();
        if let Some(l) = leading.as_ref() {
            ids.extend(
                l.progress
                    .learners
                    .keys()
                    .filter_map(|k| u64::from_str_radix(k, 16).ok())
                    .filter(|id| view.member(*id).is_none_or(|m| !m.is_learner)),
            );
        }
        ids
    }

    fn set_member_gauges(&self, view: &ClusterView) {
        self.metrics
            .set_members(view.voters().count(), view.learners().count());
    }

    fn step_down(&self, leading: &mut Option<Leading>) {
        if leading.take().is_some() {
            tracing::info!("the local etcd member no longer leads: learner manager idle");
        }
        self.metrics.stalled_seconds.set(0.0);
    }

    /// One learner (or a member that was one): promote, or track, or evict.
    pub async fn reconcile(&self, id: u64) -> Result<Action, ClusterError> {
        let view = self.cluster.view().await?;
        self.set_member_gauges(&view);
        let mut guard = self.leading.lock().await;
        if !view.local_is_leader() {
            self.step_down(&mut guard);
            return Ok(Action::AwaitChange);
        }
        let leading = match guard.as_mut() {
            Some(l) => l,
            None => {
                let (progress, revision) = self.cluster.load_progress().await?;
                tracing::info!(
                    recorded = progress.learners.len(),
                    "the local etcd member leads: learner manager active"
                );
                guard.insert(Leading {
                    progress,
                    revision,
                    dirty: false,
                    urgent: false,
                    last_write: None,
                    watched: HashMap::new(),
                })
            }
        };
        // The shared cache may not show a learner just added (its record written by the joiner already):
        // an entry is dropped only on a fresh look, never on a cache that may be behind.
        let view = match view.member(id) {
            Some(m) if m.is_learner => view,
            _ if leading.record(id).is_some() => {
                let fresh = self.cluster.fresh_view().await?;
                if !fresh.local_is_leader() {
                    self.step_down(&mut guard);
                    return Ok(Action::AwaitChange);
                }
                fresh
            }
            _ => view,
        };
        let Some(leading) = guard.as_mut() else {
            return Ok(Action::AwaitChange);
        };
        let action = match view.member(id) {
            Some(m) if m.is_learner => {
                let allowed = self.gate.as_ref().is_none_or(|g| g(&view, m));
                self.handle_learner(leading, m, allowed).await
            }
            // A voter now (promoted by a lost answer or by hand), or gone: its entry goes.
            _ => {
                leading.forget(id);
                Ok(Action::AwaitChange)
            }
        };
        self.metrics
            .stalled_seconds
            .set(leading.longest_stall().as_secs_f64());
        let flushed = self.flush(leading).await;
        if let Err(ClusterError::ProgressConflict) = flushed {
            // Someone else wrote the record: read it afresh next time rather than fight over it.
            *guard = None;
        }
        let action = action?;
        flushed.map(|_| action)
    }

    async fn handle_learner(
        &self,
        leading: &mut Leading,
        m: &Member,
        promote: bool,
    ) -> Result<Action, ClusterError> {
        let now = self.cluster.now();
        if leading.record(m.id).is_none() {
            // Start the clock before the first attempt, so a promotion has a start to measure from.
            if let Assessment::Track(record) = assess(
                &m.name,
                None,
                None,
                &LearnerObservation::default(),
                now,
                self.cfg.stall_timeout,
            ) {
                tracing::info!(member = %m.name, id = %hex(m.id), "learner seen; promoting it once etcd allows");
                leading.put(m.id, record);
            }
        }
        let outcome = if promote {
            self.cluster.promote(m.id).await?
        } else {
            PromoteOutcome::NotInSync
        };
        match outcome {
            PromoteOutcome::Promoted => {
                self.promoted(leading, m).await;
                return Ok(Action::AwaitChange);
            }
            PromoteOutcome::AlreadyVoter | PromoteOutcome::NotFound => {
                leading.forget(m.id);
                return Ok(Action::AwaitChange);
            }
            PromoteOutcome::NotInSync => {}
        }
        let Some(record) = leading.record(m.id).cloned() else {
            return Ok(Action::Requeue(self.cfg.requeue_silent));
        };
        let (applied_index, sent) = tokio::join!(
            self.cluster.learner_applied_index(m),
            self.cluster.sent_to(m.id)
        );
        let seen = LearnerObservation {
            applied_index,
            sent,
        };
        let now = self.cluster.now();
        let watched = leading.watched.entry(m.id).or_default();
        let connected = applied_index.is_some()
            || matches!((sent, watched.last_sent), (Some(s), Some(last)) if s.bytes > last);
        watched.last_sent = sent.map(|s| s.bytes);
        let fresh = now
            .duration_since(record.added.0)
            .is_ok_and(|age| age < self.cfg.fresh_for);
        let next = if connected || fresh {
            self.cfg.requeue_answering
        } else {
            self.cfg.requeue_silent
        };
        let assessment = assess(
            &m.name,
            Some(&record),
            watched.baseline.as_ref(),
            &seen,
            now,
            self.cfg.stall_timeout,
        );
        watched.baseline = next_baseline(watched.baseline, &seen, &assessment, now);
        match assessment {
            Assessment::Track(r) | Assessment::Progressed(r) => {
                tracing::debug!(member = %m.name, applied = r.applied_index, bytes_sent = r.bytes_sent, "learner progressing");
                watched.stalled = Duration::ZERO;
                // The first sign of life is written at once: a catch-up on a fast network is over within
                // the record interval, and the record should show that it happened.
                let first = !std::mem::replace(&mut watched.progress_written, true);
                leading.put(m.id, r);
                leading.urgent |= first;
                Ok(Action::Requeue(next))
            }
            Assessment::Waiting { stalled_for } => {
                watched.stalled = stalled_for;
                Ok(Action::Requeue(next))
            }
            Assessment::Evict { stalled_for } => {
                self.evict(leading, m, &record, stalled_for).await?;
                Ok(Action::AwaitChange)
            }
        }
    }

    async fn promoted(&self, leading: &mut Leading, m: &Member) {
        let now = self.cluster.now();
        let record = leading.forget(m.id);
        let took = record
            .as_ref()
            .and_then(|r| now.duration_since(r.added.0).ok())
            .unwrap_or_default();
        self.metrics.promotions.inc();
        self.metrics.promotion_duration.observe(took.as_secs_f64());
        let name = shown_name(&m.name, record.as_ref().map(|r| r.name.as_str()));
        self.cluster
            .event(
                EventKind::Normal,
                "LearnerPromoted",
                format!(
                    "etcd learner {name} ({}) promoted to voter, {} after it was added",
                    hex(m.id),
                    humantime::format_duration(round_ms(took))
                ),
            )
            .await;
    }

    async fn evict(
        &self,
        leading: &mut Leading,
        m: &Member,
        record: &LearnerRecord,
        stalled_for: Duration,
    ) -> Result<(), ClusterError> {
        self.cluster.remove(m.id).await?;
        leading.forget(m.id);
        self.metrics.evictions.inc();
        let name = shown_name(&m.name, Some(record.name.as_str()));
        self.cluster
            .event(
                EventKind::Warning,
                "LearnerEvicted",
                format!(
                    "etcd learner {name} ({}) removed: no progress for {} (stall timeout {}); last seen at applied index {}, {} bytes sent to it",
                    hex(m.id),
                    humantime::format_duration(round_ms(stalled_for)),
                    humantime::format_duration(self.cfg.stall_timeout),
                    record.applied_index,
                    record.bytes_sent,
                ),
            )
            .await;
        Ok(())
    }

    /// Writes the record when it changed and the interval passed (or a learner left it).
    async fn flush(&self, leading: &mut Leading) -> Result<(), ClusterError> {
        if !leading.dirty {
            return Ok(());
        }
        let due = leading
            .last_write
            .is_none_or(|t| t.elapsed() >= self.cfg.record_interval);
        if !(due || leading.urgent) {
            return Ok(());
        }
        leading.revision = self
            .cluster
            .store_progress(&leading.progress, leading.revision)
            .await?;
        leading.dirty = false;
        leading.urgent = false;
        leading.last_write = Some(Instant::now());
        Ok(())
    }
}

impl<C: Cluster> Run for LearnerManager<C> {
    /// Runs until `shutdown` fires.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // The trigger: every change of the members or the leadership the shared member cache sees,
        // mapped to the ids to reconcile. Nothing comes while nothing changes; a learner being looked at
        // requeues itself.
        let this = self.clone();
        let polls = self
            .cluster
            .changes()
            .then(move |()| {
                let this = this.clone();
                async move { futures::stream::iter(this.poll().await) }
            })
            .flatten();
        let retry = self.cfg.requeue_silent;
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .triggers(polls)
            .run(
                |id, this: Arc<Self>| async move { this.reconcile(id).await },
                // Flat and short: a learner may become promotable any moment, and etcd errors pass.
                move |_, _, _| ErrorAction::Requeue(retry),
                shutdown,
            )
            .await;
    }
}

/// A learner's name for messages: etcd's, else the record's, else a note that it has none yet.
fn shown_name(current: &str, recorded: Option<&str>) -> String {
    match (current, recorded) {
        ("", Some(r)) if !r.is_empty() => r.to_string(),
        ("", _) => "(not named yet)".to_string(),
        (c, _) => c.to_string(),
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::etcd_metrics::SentToPeer;
    use crate::members::fake::{learner, voter, FakeWorld};
    use hostlet_api::objects::Timestamp;
    use hostlet_runtime::testkit::eventually;

    const STALL: Duration = Duration::from_secs(10);

    /// A record of a learner added at `then`, as the joiner writes it.
    fn added_at(name: String, then: Timestamp) -> LearnerRecord {
        LearnerRecord {
            name,
            added: then,
            applied_index: 0,
            snapshot_bytes_received: 0,
            last_progress: then,
            bytes_sent: 0,
            receiving_snapshot: false,
        }
    }

    fn start(
        world: &FakeWorld,
        local: u64,
    ) -> (
        Arc<LearnerManager<crate::members::fake::FakeCluster>>,
        CancellationToken,
    ) {
        let manager = Arc::new(
            LearnerManager::new(
                world.agent(local),
                LearnerConfig::new(STALL),
                &Metrics::new(),
            )
            .unwrap(),
        );
        let shutdown = CancellationToken::new();
        tokio::spawn(manager.clone().run(shutdown.clone()));
        (manager, shutdown)
    }

    #[tokio::test(start_paused = true)]
    async fn promotes_within_a_moment_of_etcd_accepting() {
        let world = FakeWorld::new(vec![voter(1), learner(2, true)], 1);
        world.lock().applied.insert(2, 10);
        let (manager, _stop) = start(&world, 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(world.lock().members[1].is_learner);
        let recorded = world
            .lock()
            .progress
            .learners
            .get("2")
            .cloned()
            .expect("recorded");
        assert_eq!(recorded.applied_index, 10);
        world.lock().in_sync.insert(2);
        let start = tokio::time::Instant::now();
        eventually("promoted", Duration::from_secs(2), || async {
            !world.lock().members[1].is_learner
        })
        .await;
        let took = start.elapsed();
        assert!(
            took <= Duration::from_millis(300),
            "promoted {took:?} after etcd allowed it"
        );
        eventually("record emptied", Duration::from_secs(1), || async {
            world.lock().progress.learners.is_empty()
        })
        .await;
        assert_eq!(manager.metrics.promotions.get(), 1);
        assert_eq!(manager.metrics.promotion_duration.get_sample_count(), 1);
        let secs = manager.metrics.promotion_duration.get_sample_sum();
        assert!(
            (2.5..4.0).contains(&secs),
            "promotion took {secs}s from first sight"
        );
        assert!(world.reasons().contains(&"LearnerPromoted".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_that_never_starts_is_evicted_at_the_stall_timeout_not_before() {
        let world = FakeWorld::new(vec![voter(1), learner(2, false)], 1);
        let (manager, _stop) = start(&world, 1);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(world.lock().removed.is_empty(), "evicted early");
        assert!(manager.metrics.stalled_seconds.get() >= 7.0);
        eventually("evicted", Duration::from_secs(3), || async {
            world.lock().removed == vec![2]
        })
        .await;
        assert_eq!(manager.metrics.evictions.get(), 1);
        assert!(world.reasons().contains(&"LearnerEvicted".to_string()));
        assert!(world.lock().progress.learners.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_that_progresses_is_never_evicted_however_long_it_takes() {
        let world = FakeWorld::new(vec![voter(1), learner(2, true)], 1);
        let (_manager, _stop) = start(&world, 1);
        for i in 0..60u64 {
            world.lock().applied.insert(2, i * 100);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(world.lock().removed.is_empty());
        let r = world.lock().progress.learners.get("2").cloned().unwrap();
        assert!(r.applied_index >= 5_000, "{r:?}");
        assert!(world.now().duration_since(r.last_progress.0).unwrap() <= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_sent_while_it_catches_up_count_as_progress_and_heartbeats_do_not() {
        let world = FakeWorld::new(vec![voter(1), learner(2, false)], 1);
        let (_manager, _stop) = start(&world, 1);
        // Catching up for 30 s: no status, megabytes a second from the leader.
        for i in 1..=30u64 {
            world.lock().sent.insert(
                2,
                SentToPeer {
                    bytes: i * 2_000_000,
                    snapshots_in_flight: 0,
                },
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(world.lock().removed.is_empty(), "evicted while catching up");
        let bytes = world.lock().progress.learners["2"].bytes_sent;
        assert!(bytes >= 56_000_000, "{bytes}");
        // Then only heartbeats.
        let mut bytes = 60_000_000;
        let start = tokio::time::Instant::now();
        eventually(
            "evicted with heartbeats only",
            Duration::from_secs(14),
            || {
                bytes += 30;
                world.lock().sent.insert(
                    2,
                    SentToPeer {
                        bytes,
                        snapshots_in_flight: 0,
                    },
                );
                let evicted = world.lock().removed == vec![2];
                async move { evicted }
            },
        )
        .await;
        let stalled = start.elapsed();
        assert!(stalled >= Duration::from_secs(8), "{stalled:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_raft_snapshot_on_a_live_link_is_progress_until_the_link_dies() {
        let world = FakeWorld::new(vec![voter(1), learner(2, false)], 1);
        let (_manager, _stop) = start(&world, 1);
        for i in 1..=30u64 {
            world.lock().sent.insert(
                2,
                SentToPeer {
                    bytes: 1_000 + i * 500,
                    snapshots_in_flight: 1,
                },
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(
            world.lock().removed.is_empty(),
            "evicted while a snapshot streams"
        );
        assert!(world.lock().progress.learners["2"].receiving_snapshot);
        let start = tokio::time::Instant::now();
        eventually(
            "evicted after the link died",
            Duration::from_secs(13),
            || async { world.lock().removed == vec![2] },
        )
        .await;
        let stalled = start.elapsed();
        assert!(stalled >= Duration::from_secs(8), "{stalled:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_leader_acts() {
        let world = FakeWorld::new(vec![voter(1), voter(3), learner(2, false)], 3);
        let (_manager, _stop) = start(&world, 1);
        tokio::time::sleep(Duration::from_secs(20)).await;
        let s = world.lock();
        assert!(s.promote_attempts.is_empty());
        assert!(s.removed.is_empty());
        assert_eq!(s.progress_writes, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_continues_the_recorded_clock() {
        let world = FakeWorld::new(vec![voter(1), voter(3), learner(2, false)], 1);
        let (_old, stop_old) = start(&world, 1);
        let (_new, _stop_new) = start(&world, 3);
        tokio::time::sleep(Duration::from_secs(6)).await;
        let added = world.lock().progress.learners["2"].added;
        // The old leader's agent dies; leadership moves to member 3.
        stop_old.cancel();
        world.lock().leader = 3;
        let start = tokio::time::Instant::now();
        eventually(
            "evicted by the new leader",
            Duration::from_secs(8),
            || async { world.lock().removed == vec![2] },
        )
        .await;
        let took = start.elapsed();
        assert!(
            took <= Duration::from_secs(5),
            "clock restarted: evicted {took:?} after takeover"
        );
        let events = world.lock().events.clone();
        assert!(events
            .iter()
            .any(|(agent, reason, _)| *agent == 3 && reason == "LearnerEvicted"));
        assert!(added.0 < world.now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_written_by_a_previous_leader_is_honoured() {
        let world = FakeWorld::new(vec![voter(1), learner(2, false)], 1);
        {
            let mut s = world.lock();
            let then = Timestamp(world.now() - Duration::from_secs(9));
            s.progress
                .learners
                .insert("2".into(), added_at(String::new(), then));
            s.progress_revision = 42;
            // An entry of a learner that went while nobody led.
            s.progress
                .learners
                .insert("9".into(), added_at("gone".into(), then));
        }
        let (_m, _stop) = start(&world, 1);
        let start = tokio::time::Instant::now();
        eventually("evicted", Duration::from_secs(5), || async {
            world.lock().removed == vec![2]
        })
        .await;
        let took = start.elapsed();
        assert!(took <= Duration::from_secs(3), "{took:?}");
        eventually("stale entry dropped", Duration::from_secs(2), || async {
            world.lock().progress.learners.is_empty()
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_joiners_record_is_kept_while_the_member_cache_is_behind() {
        // The leader tracks learner 3, so its record is loaded and written.
        let world = FakeWorld::new(vec![voter(1), learner(3, true)], 1);
        world.lock().applied.insert(3, 1);
        let (_m, _stop) = start(&world, 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(world.lock().progress.learners.contains_key("3"));
        // A joiner adds learner 2 and records when; the leader's member cache has not seen it yet.
        let then = Timestamp(world.now());
        {
            let mut s = world.lock();
            s.cached_members = Some(s.members.clone());
            s.members.push(learner(2, false));
            s.progress
                .learners
                .insert("2".into(), added_at(String::new(), then));
            s.progress_revision += 1;
        }
        // Learner 3's progress makes the leader write: it meets the joiner's write, reads the record
        // afresh, and finds learner 2 in it but not in its cache.
        for i in 2..6u64 {
            world.lock().applied.insert(3, i);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let r = world.lock().progress.learners.get("2").cloned();
        assert_eq!(
            r.map(|r| r.added),
            Some(then),
            "the joiner's record was dropped"
        );
        assert!(world.lock().progress.learners["3"].applied_index >= 4);
        // Gone for real (a fresh look agrees): its entry goes.
        world.lock().members.retain(|m| m.id != 2);
        eventually(
            "entry of a gone learner dropped",
            Duration::from_secs(3),
            || async { !world.lock().progress.learners.contains_key("2") },
        )
        .await;
        assert!(world.lock().removed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflicting_write_rereads_the_record_instead_of_overwriting_it() {
        let world = FakeWorld::new(vec![voter(1), learner(2, true)], 1);
        world.lock().applied.insert(2, 1);
        let (_m, _stop) = start(&world, 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut foreign = world.lock().progress.clone();
        foreign.learners.get_mut("2").unwrap().name = "written-elsewhere".into();
        {
            let mut s = world.lock();
            s.progress = foreign;
            s.progress_revision += 100;
        }
        for i in 2..6u64 {
            world.lock().applied.insert(2, i);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let r = world.lock().progress.learners["2"].clone();
        // Written again after the conflict: the record was read afresh, not fought over.
        assert_eq!(r.name, "n2");
        assert!(world.lock().progress_revision > 100);
        assert_eq!(r.applied_index, 5);
    }
}
