//! [`LearnerManager`]: promotes learners as soon as etcd accepts, evicts those that stall.
//!
//! Every agent polls the membership ([`LearnerConfig::poll_interval`]); only where the local member leads
//! does it act. Each learner is a key of the work queue (its member id): a reconcile first asks etcd to
//! promote it, and when etcd answers that it is not in sync yet, looks at how far it got and keeps its
//! figures in `/hostlet/etcd/learner-progress`. That record is the stall clock; a leader reads it when it
//! takes over, so the clock continues across leader changes. The record is written with a compare on its
//! revision: a leader that lost its place cannot overwrite its successor's clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::objects::{LearnerProgress, LearnerRecord};
use hostlet_runtime::metrics::ControllerMetrics;
use hostlet_runtime::{Metrics, WorkQueue};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::LearnerMetrics;
use super::stall::{assess, Assessment};
use crate::events::EventKind;
use crate::members::cluster::{
    Cluster, ClusterError, ClusterView, LearnerObservation, MemberInfo, PromoteOutcome,
};
use crate::members::worker::{run_worker, Action};

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "learners";

/// How the learner manager paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnerConfig {
    /// A learner without progress for this long is removed (`--learner-stall-timeout`).
    pub stall_timeout: Duration,
    /// How often the membership is read for new learners and leadership changes.
    pub poll_interval: Duration,
    /// Next attempt while a learner answers: it may become promotable any moment.
    pub requeue_answering: Duration,
    /// Next attempt while a learner does not answer (not started, down).
    pub requeue_silent: Duration,
    /// Least time between two writes of the progress record (removals are written at once).
    pub record_interval: Duration,
}

impl LearnerConfig {
    /// The defaults, with this stall timeout.
    pub fn new(stall_timeout: Duration) -> Self {
        LearnerConfig {
            stall_timeout,
            poll_interval: Duration::from_secs(1),
            requeue_answering: Duration::from_millis(200),
            requeue_silent: Duration::from_secs(1),
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
    /// A learner left the record: write now rather than at the next interval.
    urgent: bool,
    last_write: Option<Instant>,
    /// How long each learner has been stalled, for the gauge.
    stalled: HashMap<u64, Duration>,
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
        self.stalled.remove(&id);
        let gone = self.progress.learners.remove(&hex(id));
        if gone.is_some() {
            self.dirty = true;
            self.urgent = true;
        }
        gone
    }

    fn longest_stall(&self) -> Duration {
        self.stalled.values().copied().max().unwrap_or_default()
    }
}

/// The learner manager. Build it with [`LearnerManager::new`], run it with [`LearnerManager::run`].
pub struct LearnerManager<C> {
    cluster: Arc<C>,
    cfg: LearnerConfig,
    metrics: LearnerMetrics,
    controller: ControllerMetrics,
    queue: WorkQueue<u64>,
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
            cluster,
            metrics: LearnerMetrics::register(metrics.registry())?,
            controller: metrics.controller(CONTROLLER),
            queue: WorkQueue::new(CONTROLLER, metrics),
            cfg,
            leading: Mutex::new(None),
        })
    }

    /// Runs until `shutdown` fires.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let poller = {
            let this = self.clone();
            let shutdown = shutdown.clone();
            async move {
                let mut tick = tokio::time::interval(this.cfg.poll_interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = async { tick.tick().await; this.poll().await } => {}
                    }
                }
                this.queue.shutdown();
            }
        };
        let worker = run_worker(
            CONTROLLER,
            &self.queue,
            &self.controller,
            self.cfg.requeue_silent,
            &shutdown,
            |id| self.reconcile(id),
        );
        tokio::join!(poller, worker);
    }

    /// Reads the membership: gauges everywhere; on the leader, queues every learner.
    async fn poll(&self) {
        let view = match self.cluster.view().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "learner manager: cannot read the membership");
                return;
            }
        };
        self.set_member_gauges(&view);
        if !view.local_is_leader() {
            self.step_down(&mut *self.leading.lock().await);
            return;
        }
        for l in view.learners() {
            if self.queue.due(&l.id).is_none() {
                self.queue.add(l.id);
            }
        }
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
                // Entries of learners that went while nobody led get cleaned up by their own reconcile.
                for key in progress.learners.keys() {
                    if let Ok(other) = u64::from_str_radix(key, 16) {
                        if other != id {
                            self.queue.add(other);
                        }
                    }
                }
                guard.insert(Leading {
                    progress,
                    revision,
                    dirty: false,
                    urgent: false,
                    last_write: None,
                    stalled: HashMap::new(),
                })
            }
        };
        let action = match view.member(id) {
            Some(m) if m.is_learner => self.handle_learner(leading, m).await,
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
        m: &MemberInfo,
    ) -> Result<Action, ClusterError> {
        let now = self.cluster.now();
        if leading.record(m.id).is_none() {
            // Start the clock before the first attempt, so a promotion has a start to measure from.
            if let Assessment::Track(record) = assess(
                &m.name,
                None,
                &LearnerObservation::default(),
                now,
                self.cfg.stall_timeout,
            ) {
                tracing::info!(member = %m.name, id = %hex(m.id), "learner seen; promoting it once etcd allows");
                leading.put(m.id, record);
            }
        }
        match self.cluster.promote(m.id).await? {
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
        let applied_index = self.cluster.learner_applied_index(m).await;
        // The applied index stands still while a raft snapshot streams in: then the metrics tell.
        let traffic = if applied_index == Some(record.applied_index) {
            self.cluster.learner_traffic(m).await
        } else {
            None
        };
        let seen = LearnerObservation {
            applied_index,
            traffic,
        };
        let next = if applied_index.is_some() {
            self.cfg.requeue_answering
        } else {
            self.cfg.requeue_silent
        };
        match assess(
            &m.name,
            Some(&record),
            &seen,
            self.cluster.now(),
            self.cfg.stall_timeout,
        ) {
            Assessment::Track(r) | Assessment::Progressed(r) => {
                tracing::debug!(member = %m.name, applied = r.applied_index, bytes = r.snapshot_bytes_received, "learner progressing");
                leading.stalled.insert(m.id, Duration::ZERO);
                leading.put(m.id, r);
                Ok(Action::Requeue(next))
            }
            Assessment::Waiting { stalled_for } => {
                leading.stalled.insert(m.id, stalled_for);
                Ok(Action::Requeue(next))
            }
            Assessment::Evict { stalled_for } => {
                self.evict(leading, m, &record, stalled_for).await?;
                Ok(Action::AwaitChange)
            }
        }
    }

    async fn promoted(&self, leading: &mut Leading, m: &MemberInfo) {
        let now = self.cluster.now();
        let record = leading.forget(m.id);
        let took = record
            .as_ref()
            .and_then(|r| now.duration_since(r.added.0).ok())
            .unwrap_or_default();
        self.metrics.promotions.inc();
        self.metrics
            .promotion_duration
            .observe(took.as_secs_f64());
        let name = if m.name.is_empty() {
            record.map(|r| r.name).unwrap_or_default()
        } else {
            m.name.clone()
        };
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
        m: &MemberInfo,
        record: &LearnerRecord,
        stalled_for: Duration,
    ) -> Result<(), ClusterError> {
        self.cluster.remove(m.id).await?;
        leading.forget(m.id);
        self.metrics.evictions.inc();
        let name = if m.name.is_empty() {
            "(never started)".to_string()
        } else {
            m.name.clone()
        };
        self.cluster
            .event(
                EventKind::Warning,
                "LearnerEvicted",
                format!(
                    "etcd learner {name} ({}) removed: no progress for {} (stall timeout {}); it was at applied index {}, {} bytes received",
                    hex(m.id),
                    humantime::format_duration(round_ms(stalled_for)),
                    humantime::format_duration(self.cfg.stall_timeout),
                    record.applied_index,
                    record.snapshot_bytes_received,
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

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
