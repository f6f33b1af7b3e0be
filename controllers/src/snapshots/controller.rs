//! The snapshot scheduler as the controller [`CONTROLLER`] over the agent's shared caches of the policy
//! keys and the request key. Its keys are [`SnapshotKey`]s: the schedule's timer (a requeue until the next
//! fire time), the request key's changes, and policy changes (prune). A snapshot in progress makes any
//! other "busy". It reads and acts through [`SnapshotEffects`] (the [`SnapshotScheduler`] in the agent);
//! its sequencing is tested on [`super::fake`] on paused time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use hostlet_api::KeyLayout;
use hostlet_runtime::controller::backoff;
use hostlet_runtime::etcd::EtcdError;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Action, Controller, InformerFactory, Metrics, Run, Store, WorkQueue};
use tokio_util::sync::CancellationToken;

use super::effects::SnapshotEffects;
use super::policy::{decode_policy, next_fire, node_offset};
use super::request::{
    check_snapshot_name, decode_request, SnapshotRequest, SnapshotRequestState, TakeProgress,
    ON_DEMAND_NAME, PROGRESS_EVERY,
};
use super::retention::SCHEDULED_NAME;
use super::scheduler::{SnapshotError, SnapshotScheduler, STOP_GRACE};
use crate::events::EventKind;

/// Keys of the scheduler's controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SnapshotKey {
    /// The schedule: takes the scheduled snapshot once its time has come, then waits for the next.
    Scheduled,
    /// This node's on-demand request key.
    Request,
    /// A policy change: the object-storage pass and retention under the new policy.
    Prune,
}

/// The snapshot controller: `effects` (the [`SnapshotScheduler`] in the agent) over the agent's shared
/// `caches`. Started with [`Run`]: cleans up, then takes snapshots on schedule and on request, and prunes on
/// policy changes.
pub struct SnapshotController<S = SnapshotScheduler> {
    effects: Arc<S>,
    caches: SnapshotCaches,
    metrics: Metrics,
}

impl<S: SnapshotEffects> SnapshotController<S> {
    pub fn new(effects: Arc<S>, caches: SnapshotCaches, metrics: &Metrics) -> Self {
        SnapshotController {
            effects,
            caches,
            metrics: metrics.clone(),
        }
    }
}

impl<S: SnapshotEffects> Run for SnapshotController<S> {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        run(
            self.effects.clone(),
            self.caches.clone(),
            &self.metrics,
            shutdown,
        )
        .await
    }
}

/// Runs the snapshot controller on `effects` until `shutdown`.
async fn run<S: SnapshotEffects>(
    effects: Arc<S>,
    caches: SnapshotCaches,
    metrics: &Metrics,
    shutdown: CancellationToken,
) {
    let request_key = effects.request_key();
    let ctx = Arc::new(Context::new(effects, caches.clone(), shutdown.clone()));
    let prepared = {
        let ctx = ctx.clone();
        async move { ctx.prepare().await }
    };
    // Two at a time: a request that arrives during a scheduled snapshot is answered "busy" at once.
    let c = Controller::new(CONTROLLER, ctx.clone(), metrics)
        .ready_when(prepared)
        .watches(&caches.policy, |_| Some(SnapshotKey::Prune))
        .watches(&caches.node_policy, |_| Some(SnapshotKey::Prune))
        .watches(&caches.requests, move |k: &String| {
            (*k == request_key).then_some(SnapshotKey::Request)
        })
        .triggers(futures::stream::iter([SnapshotKey::Scheduled]))
        .concurrency(2);
    let _ = ctx.queue.set(c.queue());
    c.run(
        |key, ctx: Arc<Context<S>>| async move { ctx.reconcile(key).await },
        backoff,
        shutdown,
    )
    .await;
}

/// The informer label of the cluster-wide snapshot policy key's cache.
pub const SNAPSHOT_POLICY_INFORMER: &str = "snapshot-policy";
/// The informer label of this node's snapshot policy key's cache.
pub const SNAPSHOT_NODE_POLICY_INFORMER: &str = "snapshot-node-policy";
/// The informer label of this node's snapshot request key's cache.
pub const SNAPSHOT_REQUESTS_INFORMER: &str = "snapshot-requests";

pub use super::policy::PolicyStore;

/// The caches the snapshot scheduler reads: reader clones of the agent's (see `caches::Caches::snapshots`).
#[derive(Clone)]
pub struct SnapshotCaches {
    pub policy: PolicyStore,
    pub node_policy: PolicyStore,
    pub requests: Store<String, Object<SnapshotRequest>>,
}

impl SnapshotCaches {
    /// The three stores, through the agent's `factory` (an agent does this once, in
    /// `caches::Caches::start`).
    pub fn start(factory: &InformerFactory, keys: &KeyLayout, node: &str) -> SnapshotCaches {
        SnapshotCaches {
            policy: factory.store(
                SNAPSHOT_POLICY_INFORMER,
                keys.snapshot_policy(),
                decode_policy,
            ),
            node_policy: factory.store(
                SNAPSHOT_NODE_POLICY_INFORMER,
                keys.node_snapshot_policy(node),
                decode_policy,
            ),
            requests: factory.store(
                SNAPSHOT_REQUESTS_INFORMER,
                keys.snapshot_request(node),
                decode_request,
            ),
        }
    }
}

/// The controller's name in `workqueue_*{name}` and `hostlet_reconcile_*{controller}`.
pub const CONTROLLER: &str = "snapshots";

/// How long the start waits for the bucket's listing before it goes on without the count.
const COUNT_REMOTE_WITHIN: Duration = Duration::from_secs(10);

/// How long the timer sleeps while no scheduled snapshot is due (off, or no next time): a policy change
/// wakes it earlier.
const IDLE: Duration = Duration::from_secs(24 * 3600);

/// Where the schedule stands.
struct Timer {
    /// The schedule time fired last, or when the timer (re)started.
    last_fire: SystemTime,
    /// The schedule time waited for, and when it fires (this node's offset added).
    planned: Option<(SystemTime, SystemTime)>,
}

/// The controller's context: its effects, the caches it reads and the schedule's state.
pub(super) struct Context<S> {
    sched: Arc<S>,
    caches: SnapshotCaches,
    /// The controller's own queue, for a policy change to wake the timer.
    queue: OnceLock<WorkQueue<SnapshotKey>>,
    timer: Mutex<Timer>,
    /// A policy change not yet followed by a successful prune (a failed one is retried with backoff).
    prune_due: AtomicBool,
    /// The ids of the requests this process set running: a request found running with another id was left
    /// by an agent that stopped while taking it.
    started_requests: Mutex<HashSet<Option<String>>>,
    /// The agent's shutdown.
    stopping: CancellationToken,
}

impl<S: SnapshotEffects> Context<S> {
    pub(super) fn new(sched: Arc<S>, caches: SnapshotCaches, stopping: CancellationToken) -> Self {
        let last_fire = sched.now();
        Context {
            sched,
            caches,
            queue: OnceLock::new(),
            timer: Mutex::new(Timer {
                last_fire,
                planned: None,
            }),
            prune_due: AtomicBool::new(false),
            started_requests: Mutex::new(HashSet::new()),
            stopping,
        }
    }

    /// Resolves `grace` after the agent began to stop.
    async fn stopped_for(&self, grace: Duration) {
        self.stopping.cancelled().await;
        tokio::time::sleep(grace).await;
    }

    fn timer(&self) -> std::sync::MutexGuard<'_, Timer> {
        self.timer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before the first reconcile: catalogue clean-up (retried until etcd answers), then the policy in
    /// force once the caches are listed. The timer starts from here.
    pub(super) async fn prepare(&self) {
        let mut backoff = hostlet_runtime::ExponentialBackoff::new(
            Duration::from_millis(500),
            Duration::from_secs(30),
        );
        while let Err(e) = self.sched.reconcile_catalogue().await {
            tracing::warn!(error = %e, "snapshot catalogue check failed; retrying");
            tokio::time::sleep(backoff.next_delay()).await;
        }
        self.caches.policy.wait_until_ready().await;
        self.caches.node_policy.wait_until_ready().await;
        self.caches.requests.wait_until_ready().await;
        self.sched
            .refresh_policy(&self.caches.policy, &self.caches.node_policy)
            .await;
        // The objects already in the bucket count from the start, not only after the first pass; a
        // bucket that does not answer soon is counted by that pass instead.
        match tokio::time::timeout(COUNT_REMOTE_WITHIN, self.sched.count_remote()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not count the snapshot objects"),
            Err(_) => tracing::warn!(
                within = ?COUNT_REMOTE_WITHIN,
                "the bucket did not answer; its objects are counted on the next pass"
            ),
        }
        self.timer().last_fire = self.sched.now();
    }

    pub(super) async fn reconcile(&self, key: SnapshotKey) -> Result<Action, EtcdError> {
        match key {
            SnapshotKey::Scheduled => Ok(self.scheduled().await),
            SnapshotKey::Request => {
                self.answer_request().await;
                Ok(Action::AwaitChange)
            }
            SnapshotKey::Prune => self.policy_changed().await,
        }
    }

    /// Takes the scheduled snapshot if its time has come, then sleeps until the next one.
    async fn scheduled(&self) -> Action {
        let due = {
            let mut t = self.timer();
            match t.planned {
                Some((at, fires)) if fires <= self.sched.now() => {
                    t.last_fire = at;
                    t.planned = None;
                    true
                }
                _ => false,
            }
        };
        if due {
            tokio::select! {
                _ = self.sched.take(SCHEDULED_NAME, false, |_| {}) => {}
                () = self.stopped_for(STOP_GRACE) => {
                    // The stream dropped: the writer finds no trailer and removes its `.part`.
                    tracing::warn!("the agent is stopping: a scheduled snapshot under way is abandoned");
                }
            }
        }
        Action::Requeue(self.plan())
    }

    /// The time until the planned firing, planning the next one first if none is: the schedule's own
    /// times, shifted by this node's fixed offset, so the cadence stays exact.
    fn plan(&self) -> Duration {
        let policy = self.sched.policy();
        let mut t = self.timer();
        if policy.disabled {
            t.planned = None;
            return IDLE;
        }
        let now = self.sched.now();
        if t.planned.is_none() {
            let offset = node_offset(self.sched.node(), self.sched.jitter(), &policy.schedule);
            t.planned =
                next_fire(&policy.schedule, t.last_fire, offset, now).map(|at| (at, at + offset));
        }
        match t.planned {
            Some((_, fires)) => fires.duration_since(now).unwrap_or_default(),
            None => IDLE,
        }
    }

    /// A policy key changed: the policy in force is recomputed; if it moved, the timer is planned anew
    /// (from now, when the schedule itself changed), then object storage and retention follow it.
    async fn policy_changed(&self) -> Result<Action, EtcdError> {
        let before = self.sched.policy();
        if self
            .sched
            .refresh_policy(&self.caches.policy, &self.caches.node_policy)
            .await
        {
            {
                let mut t = self.timer();
                if self.sched.policy().schedule != before.schedule {
                    t.last_fire = self.sched.now();
                }
                t.planned = None;
            }
            if let Some(q) = self.queue.get() {
                q.add(SnapshotKey::Scheduled);
            }
            self.prune_due.store(true, Ordering::SeqCst);
        }
        if !self.prune_due.load(Ordering::SeqCst) {
            return Ok(Action::AwaitChange);
        }
        let policy = self.sched.policy();
        if let Err(e) = self.sched.sync_remote(&policy, true).await {
            tracing::warn!(error = %e, "object storage pass failed; retried after the next snapshot");
        }
        self.sched.prune(policy.retention).await?;
        self.prune_due.store(false, Ordering::SeqCst);
        Ok(Action::AwaitChange)
    }
}

impl<S: SnapshotEffects> Context<S> {
    /// Answers this node's request: takes the snapshot and writes how it went into the key, then deletes it.
    async fn answer_request(&self) {
        let key = self.sched.request_key();
        let Some(obj) = self.caches.requests.get(&key) else {
            return;
        };
        let mut req = match &obj.value {
            // Left running by an agent that stopped while taking it: nobody will finish it, and while it
            // stays the CLI refuses every new request as pending. Answered as failed, then removed.
            Ok(r) if r.state == Some(SnapshotRequestState::Running) && !self.started(&r.id) => {
                let mut r = r.clone();
                r.state = Some(SnapshotRequestState::Failed);
                r.error = Some(
                    "interrupted: the agent stopped while taking this snapshot; ask again".into(),
                );
                tracing::warn!(key, id = ?r.id, "a snapshot request left running by an earlier agent: answered as failed");
                let _ = self.sched.write_request(&r).await;
                let _ = self.sched.delete_request().await;
                return;
            }
            Ok(r) if r.state.is_some() => return, // our own answer, about to be deleted
            Ok(r) => r.clone(),
            Err(e) => {
                let reason = format!("not a snapshot request: {}", e.message());
                self.refuse_request(&key, SnapshotRequest::default(), reason)
                    .await;
                return;
            }
        };
        let name = req
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| ON_DEMAND_NAME.to_string());
        if let Err(msg) = check_snapshot_name(&name) {
            self.refuse_request(&key, req, msg).await;
            return;
        } else {
            self.started_requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(req.id.clone());
            req.state = Some(SnapshotRequestState::Running);
            let _ = self.sched.write_request(&req).await;
            // Progress goes into the request key at a bounded rate, by a task of its own that is
            // stopped (never in the middle of a write) before the answer is written.
            let (ptx, prx) = tokio::sync::mpsc::unbounded_channel();
            let stop = CancellationToken::new();
            let reporter = tokio::spawn(report_progress(
                self.sched.clone(),
                req.clone(),
                prx,
                stop.clone(),
            ));
            let take = self.sched.take(&name, true, move |p| {
                let _ = ptx.send(p);
            });
            let result = tokio::select! {
                r = take => r,
                () = self.stopped_for(STOP_GRACE) => {
                    tracing::warn!(key, "the agent is stopping: the snapshot under way is abandoned and its request answered");
                    self.sched.count("failure");
                    Err(SnapshotError::Interrupted)
                }
            };
            stop.cancel();
            let _ = reporter.await;
            match result {
                Ok(rec) => {
                    req.state = Some(SnapshotRequestState::Done);
                    req.progress_bytes = Some(rec.size);
                    req.record = Some(rec);
                }
                Err(SnapshotError::Busy) => {
                    req.state = Some(SnapshotRequestState::Busy);
                    req.error = Some(SnapshotError::Busy.to_string());
                }
                Err(e) => {
                    req.state = Some(SnapshotRequestState::Failed);
                    req.error = Some(e.to_string());
                }
            }
        }
        // The answer is written, then the request removed: a watcher sees both.
        let _ = self.sched.write_request(&req).await;
        let _ = self.sched.delete_request().await;
    }

    /// Whether this process set the request with this id running.
    fn started(&self, id: &Option<String>) -> bool {
        self.started_requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Answers a request that will not be carried out: the answer (state `failed`, the reason) stays in
    /// the request key for the operator to read, and an event says the same.
    async fn refuse_request(&self, key: &str, mut req: SnapshotRequest, reason: String) {
        self.sched.count("refused");
        self.sched
            .event(
                EventKind::Warning,
                "InvalidSnapshotRequest",
                format!("{key}: {reason}; no snapshot taken"),
            )
            .await;
        req.state = Some(SnapshotRequestState::Failed);
        req.error = Some(reason);
        if let Err(e) = self.sched.write_request(&req).await {
            tracing::warn!(error = %e, key, "cannot answer the snapshot request");
        }
    }
}

/// Writes a running request's progress into its key: the first at once, then at most once per
/// [`PROGRESS_EVERY`] with the newest figures, except that an upload's start and end are written at once,
/// so that the requester times each upload from its start and sees it reach its total. Returns the number of writes once `stop` is cancelled
/// (checked only between writes) or the sender is gone.
async fn report_progress<S: SnapshotEffects>(
    effects: Arc<S>,
    mut shown: SnapshotRequest,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<TakeProgress>,
    stop: CancellationToken,
) -> u64 {
    let mut writes = 0u64;
    let mut last: Option<tokio::time::Instant> = None;
    let mut pending = false;
    loop {
        let due = last.map_or_else(tokio::time::Instant::now, |t| t + PROGRESS_EVERY);
        let msg = tokio::select! {
            biased;
            _ = stop.cancelled() => return writes,
            _ = tokio::time::sleep_until(due), if pending => None,
            m = rx.recv() => match m {
                Some(m) => Some(m),
                None => return writes,
            },
        };
        let urgent = match msg {
            None => true,
            Some(TakeProgress::Received(b)) => {
                shown.progress_bytes = Some(b);
                false
            }
            Some(TakeProgress::Upload(u)) => {
                let edge = u.sent_bytes == 0 || u.finished();
                shown.upload = Some(u);
                edge
            }
        };
        pending = true;
        if urgent || last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            if let Err(e) = effects.write_request(&shown).await {
                tracing::debug!(error = %e, "could not write a snapshot request's progress");
            }
            writes += 1;
            last = Some(tokio::time::Instant::now());
            pending = false;
        }
    }
}
