//! The controller loop: triggers → work queue → `reconcile(key, ctx)` → what to do next.
//!
//! Triggers are store changes mapped to keys ([`Controller::watches`]), timers ([`Controller::every`]) and
//! external streams ([`Controller::triggers`]); each runs in its own task and only ever adds to the queue,
//! which never blocks, so a reconcile that feeds a trigger cannot deadlock the loop. Nothing is reconciled
//! before every store the controller reads is ready. A key is never reconciled twice at once; at most
//! `concurrency` keys run together. A reconcile that panics is caught, counted and retried with backoff.
//! On shutdown no new reconcile starts and the running ones finish.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ControllerMetrics, Metrics};
use crate::queue::{QueueKey, WorkQueue};
use crate::store::{Change, Store};

/// How the agent starts every controller: built by its own `new` (and builders), then run until
/// `shutdown` by [`spawn`]. The run returns once the controller's queue has drained.
pub trait Run: Send + Sync + 'static {
    fn run(
        self: Arc<Self>,
        shutdown: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static;
}

/// Starts `controller` on its own task.
pub fn spawn<C: Run>(
    controller: Arc<C>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(controller.run(shutdown))
}

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run this key again after the delay (timers, polling what has no events), even if nothing changes.
    Requeue(Duration),
    /// Nothing more until a trigger fires for this key.
    AwaitChange,
}

/// What to do after a failed reconcile (the error policy's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Retry after the key's exponential backoff (5 ms doubling to 1000 s; reset by a success).
    Backoff,
    /// Retry after this delay.
    Requeue(Duration),
    /// Do not retry; wait for a trigger.
    AwaitChange,
}

/// The error policy most controllers want: retry with the key's backoff.
pub fn backoff<K, E, C>(_key: &K, _error: &E, _ctx: &C) -> ErrorAction {
    ErrorAction::Backoff
}

/// A controller under construction; [`Controller::run`] runs it.
///
/// A pod controller keyed by pod id, reading the informer's store of manifests:
///
/// ```no_run
/// use std::sync::Arc;
/// use hostlet_api::{KeyLayout, Key, PodManifest};
/// use hostlet_runtime::controller::{backoff, Action, Controller};
/// use hostlet_runtime::{Metrics, Object, Store};
/// use tokio_util::sync::CancellationToken;
///
/// struct Ctx {
///     layout: KeyLayout,
///     node: String,
///     manifests: Store<String, Object<PodManifest>>,
/// }
///
/// async fn reconcile(pod: String, ctx: Arc<Ctx>) -> Result<Action, std::io::Error> {
///     match ctx.manifests.get(&ctx.layout.pod(&ctx.node, &pod)) {
///         Some(obj) => { /* make Docker match obj.value */ }
///         None => { /* remove the pod's containers */ }
///     }
///     Ok(Action::AwaitChange)
/// }
///
/// # async fn demo(ctx: Arc<Ctx>, metrics: Metrics) {
/// let layout = ctx.layout.clone();
/// let shutdown = CancellationToken::new();
/// Controller::new("pods", ctx.clone(), &metrics)
///     .watches(&ctx.manifests, move |key: &String| match layout.parse(key) {
///         Some(Key::Pod { pod, .. }) => Some(pod),
///         _ => None,
///     })
///     .concurrency(4)
///     .run(reconcile, backoff, shutdown)
///     .await;
/// # }
/// ```
pub struct Controller<K, C> {
    name: String,
    ctx: Arc<C>,
    queue: WorkQueue<K>,
    metrics: ControllerMetrics,
    concurrency: usize,
    gates: Vec<BoxFuture<'static, ()>>,
    triggers: Vec<BoxFuture<'static, ()>>,
}

impl<K: QueueKey, C: Send + Sync + 'static> Controller<K, C> {
    /// A controller named `name` (its metrics' label and its queue's name) over context `ctx`.
    pub fn new(name: &str, ctx: Arc<C>, metrics: &Metrics) -> Self {
        let m = metrics.controller(name);
        Controller {
            name: name.to_string(),
            ctx,
            queue: WorkQueue::with_queue_metrics(m.queue.clone()),
            metrics: m,
            concurrency: 1,
            gates: Vec::new(),
            triggers: Vec::new(),
        }
    }

    /// How many keys may be reconciled at the same time (default 1).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// The controller's queue, to add keys from elsewhere (e.g. from the context).
    pub fn queue(&self) -> WorkQueue<K> {
        self.queue.clone()
    }

    /// Reconciles nothing before `store` is ready (for stores read but not watched).
    #[must_use]
    pub fn reads<SK, SV>(mut self, store: &Store<SK, SV>) -> Self
    where
        SK: Clone + Eq + Hash + Send + Sync + 'static,
        SV: Send + Sync + 'static,
    {
        let store = store.clone();
        self.gates
            .push(async move { store.wait_until_ready().await }.boxed());
        self
    }

    /// Reconciles nothing before `ready` completes (a cache that is not a [`Store`], say).
    #[must_use]
    pub fn ready_when(mut self, ready: impl Future<Output = ()> + Send + 'static) -> Self {
        self.gates.push(ready.boxed());
        self
    }

    /// Reads `store` (see [`Controller::reads`]) and queues the keys `map` gives for each changed store key.
    /// Every key present when the controller starts counts as changed.
    #[must_use]
    pub fn watches<SK, SV, F, I>(self, store: &Store<SK, SV>, map: F) -> Self
    where
        SK: Clone + Eq + Hash + Send + Sync + 'static,
        SV: Send + Sync + 'static,
        F: Fn(&SK) -> I + Send + 'static,
        I: IntoIterator<Item = K>,
    {
        self.watches_changes(store, move |c: &Change<SK, SV>| map(&c.key))
    }

    /// As [`Controller::watches`], with `map` seeing each change whole: a deleted key carries the object
    /// it held last, so a controller can act on what went without keeping copies of its own.
    #[must_use]
    pub fn watches_changes<SK, SV, F, I>(self, store: &Store<SK, SV>, map: F) -> Self
    where
        SK: Clone + Eq + Hash + Send + Sync + 'static,
        SV: Send + Sync + 'static,
        F: Fn(&Change<SK, SV>) -> I + Send + 'static,
        I: IntoIterator<Item = K>,
    {
        let mut changes = store.subscribe();
        let queue = self.queue.clone();
        let mut this = self.reads(store);
        this.triggers.push(
            async move {
                while let Some(batch) = changes.next_changes().await {
                    for k in batch.iter().flat_map(&map) {
                        queue.add(k);
                    }
                }
            }
            .boxed(),
        );
        this
    }

    /// Queues every key the stream yields (events from Docker, another controller…).
    #[must_use]
    pub fn triggers(mut self, stream: impl Stream<Item = K> + Send + 'static) -> Self {
        let queue = self.queue.clone();
        self.triggers.push(
            async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(k) = stream.next().await {
                    queue.add(k);
                }
            }
            .boxed(),
        );
        self
    }

    /// Queues `key` now and every `period` after.
    #[must_use]
    pub fn every(mut self, period: Duration, key: K) -> Self {
        let queue = self.queue.clone();
        self.triggers.push(
            async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    queue.add(key.clone());
                }
            }
            .boxed(),
        );
        self
    }

    /// Runs until `shutdown` fires, then lets running reconciles finish and returns.
    ///
    /// `error_policy` decides what a failed reconcile leads to ([`backoff`] for the usual answer).
    pub async fn run<F, Fut, E, P>(self, reconcile: F, error_policy: P, shutdown: CancellationToken)
    where
        F: Fn(K, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
        P: Fn(&K, &E, &C) -> ErrorAction + Send + Sync + 'static,
    {
        let Controller {
            name,
            ctx,
            queue,
            metrics,
            concurrency,
            gates,
            triggers,
        } = self;
        let mut background = JoinSet::new();
        for t in triggers {
            background.spawn(t);
        }
        {
            let queue = queue.clone();
            background.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(500));
                loop {
                    tick.tick().await;
                    queue.update_progress_metrics();
                }
            });
        }

        let all_ready = futures::future::join_all(gates);
        tokio::select! {
            _ = shutdown.cancelled() => {
                queue.shutdown();
                background.abort_all();
                return;
            }
            _ = all_ready => {}
        }
        tracing::debug!(controller = %name, "caches ready; reconciling");

        let worker = Arc::new(Worker {
            name,
            ctx,
            queue: queue.clone(),
            metrics,
            reconcile,
            error_policy,
        });
        let slots = Arc::new(Semaphore::new(concurrency));
        let mut running = JoinSet::new();
        loop {
            while running.try_join_next().is_some() {}
            let permit = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let key = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                k = queue.get() => match k {
                    Some(k) => k,
                    None => break,
                },
            };
            running.spawn(worker.clone().reconcile_one(key, permit));
        }
        queue.shutdown();
        background.abort_all();
        while running.join_next().await.is_some() {}
    }
}

/// What each reconcile task needs.
struct Worker<K, C, F, P> {
    name: String,
    ctx: Arc<C>,
    queue: WorkQueue<K>,
    metrics: ControllerMetrics,
    reconcile: F,
    error_policy: P,
}

impl<K, C, F, Fut, E, P> Worker<K, C, F, P>
where
    K: QueueKey,
    C: Send + Sync + 'static,
    F: Fn(K, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
    P: Fn(&K, &E, &C) -> ErrorAction + Send + Sync + 'static,
{
    async fn reconcile_one(self: Arc<Self>, key: K, permit: OwnedSemaphorePermit) {
        let started = Instant::now();
        // Both the call and the future it returns may panic.
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            (self.reconcile)(key.clone(), self.ctx.clone())
        })) {
            Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await,
            Err(panic) => Err(panic),
        };
        let m = &self.metrics;
        m.duration.observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok(Ok(Action::AwaitChange)) => {
                m.success.inc();
                self.queue.forget(&key);
            }
            Ok(Ok(Action::Requeue(after))) => {
                m.requeue.inc();
                self.queue.forget(&key);
                self.queue.add_after(key.clone(), after);
            }
            Ok(Err(error)) => {
                m.error.inc();
                m.errors.inc();
                let action = (self.error_policy)(&key, &error, &self.ctx);
                tracing::warn!(
                    controller = %self.name,
                    key = ?key,
                    %error,
                    retries = self.queue.num_requeues(&key),
                    ?action,
                    "reconcile failed"
                );
                match action {
                    ErrorAction::Backoff => self.queue.add_rate_limited(key.clone()),
                    ErrorAction::Requeue(after) => self.queue.add_after(key.clone(), after),
                    ErrorAction::AwaitChange => self.queue.forget(&key),
                }
            }
            Err(panic) => {
                m.error.inc();
                m.errors.inc();
                m.panics.inc();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                tracing::error!(controller = %self.name, key = ?key, panic = %message, "reconcile panicked");
                self.queue.add_rate_limited(key.clone());
            }
        }
        self.queue.done(&key);
        drop(permit);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::store::{Event, Writer};

    /// Records every run: when, which key, and how many runs of that key overlapped.
    #[derive(Default)]
    struct Probe {
        runs: Mutex<Vec<(u32, Instant)>>,
        active: Mutex<HashMap<u32, usize>>,
        max_overlap_per_key: AtomicUsize,
        max_overlap: AtomicUsize,
        total_active: AtomicUsize,
    }

    impl Probe {
        fn enter(&self, key: u32) {
            self.runs.lock().unwrap().push((key, Instant::now()));
            let mut a = self.active.lock().unwrap();
            let n = a.entry(key).or_default();
            *n += 1;
            self.max_overlap_per_key.fetch_max(*n, Ordering::SeqCst);
            let t = self.total_active.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_overlap.fetch_max(t, Ordering::SeqCst);
        }
        fn leave(&self, key: u32) {
            *self.active.lock().unwrap().get_mut(&key).unwrap() -= 1;
            self.total_active.fetch_sub(1, Ordering::SeqCst);
        }
        fn runs_of(&self, key: u32) -> Vec<Instant> {
            self.runs
                .lock()
                .unwrap()
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, t)| *t)
                .collect()
        }
        fn count(&self) -> usize {
            self.runs.lock().unwrap().len()
        }
    }

    /// Waits (on paused time) until `cond` holds; panics after an hour of virtual time.
    async fn until(cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(3600);
        while !cond() {
            assert!(Instant::now() < deadline, "condition not met");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn metric(m: &Metrics, line_start: &str) -> f64 {
        m.encode_text()
            .lines()
            .find_map(|l| l.strip_prefix(line_start))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line_start} not found"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_never_reconciled_concurrently_and_reruns_after_add_while_processing() {
        let probe = Arc::new(Probe::default());
        let metrics = Metrics::new();
        let c = Controller::new("t", probe.clone(), &metrics).concurrency(4);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.enter(key);
                tokio::time::sleep(Duration::from_secs(1)).await;
                p.leave(key);
                Ok::<_, String>(Action::AwaitChange)
            },
            backoff,
            shutdown.clone(),
        ));
        q.add(7);
        until(|| probe.count() == 1).await;
        // Re-added many times while running: one more run, after the first.
        for _ in 0..10 {
            q.add(7);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        until(|| probe.count() == 2).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let runs = probe.runs_of(7);
        assert_eq!(runs.len(), 2);
        assert!(runs[1] - runs[0] >= Duration::from_secs(1));
        assert_eq!(probe.max_overlap_per_key.load(Ordering::SeqCst), 1);
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_is_bounded() {
        let probe = Arc::new(Probe::default());
        let c = Controller::new("t", probe.clone(), &Metrics::new()).concurrency(3);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.enter(key);
                tokio::time::sleep(Duration::from_secs(1)).await;
                p.leave(key);
                Ok::<_, String>(Action::AwaitChange)
            },
            backoff,
            shutdown.clone(),
        ));
        for k in 0..20 {
            q.add(k);
        }
        until(|| probe.count() == 20).await;
        assert_eq!(probe.max_overlap.load(Ordering::SeqCst), 3);
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_exponentially_and_success_resets_the_backoff() {
        let probe = Arc::new(Probe::default());
        let metrics = Metrics::new();
        let c = Controller::new("t", probe.clone(), &metrics);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        // Fails 5 times, succeeds once (requeueing itself after 10 s), then fails again.
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.enter(key);
                p.leave(key);
                match p.count() {
                    6 => Ok(Action::Requeue(Duration::from_secs(10))),
                    n if n < 8 => Err(format!("failure {n}")),
                    _ => Ok(Action::AwaitChange),
                }
            },
            backoff,
            shutdown.clone(),
        ));
        q.add(1);
        until(|| probe.count() == 8).await;
        let runs = probe.runs_of(1);
        let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1] - w[0]).collect();
        let ms = Duration::from_millis;
        assert_eq!(
            gaps,
            vec![ms(5), ms(10), ms(20), ms(40), ms(80), ms(10_000), ms(5)],
            "backoff doubles, the success requeue is honoured, and the next failure starts over at 5 ms"
        );
        assert_eq!(
            metric(
                &metrics,
                "hostlet_reconcile_total{controller=\"t\",result=\"error\"}"
            ),
            6.0
        );
        assert_eq!(
            metric(
                &metrics,
                "hostlet_reconcile_total{controller=\"t\",result=\"requeue\"}"
            ),
            1.0
        );
        assert_eq!(
            metric(&metrics, "hostlet_reconcile_errors_total{controller=\"t\"}"),
            6.0
        );
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_is_caught_counted_and_the_key_requeued() {
        let probe = Arc::new(Probe::default());
        let metrics = Metrics::new();
        let c = Controller::new("t", probe.clone(), &metrics);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.runs.lock().unwrap().push((key, Instant::now()));
                if p.count() == 1 {
                    panic!("boom");
                }
                Ok::<_, String>(Action::AwaitChange)
            },
            backoff,
            shutdown.clone(),
        ));
        q.add(1);
        until(|| probe.count() == 2).await;
        let runs = probe.runs_of(1);
        assert_eq!(
            runs[1] - runs[0],
            Duration::from_millis(5),
            "requeued with backoff"
        );
        assert_eq!(
            metric(&metrics, "hostlet_reconcile_panics_total{controller=\"t\"}"),
            1.0
        );
        assert_eq!(
            metric(
                &metrics,
                "hostlet_reconcile_total{controller=\"t\",result=\"success\"}"
            ),
            1.0
        );
        // The loop survived and still serves other keys.
        q.add(2);
        until(|| probe.count() == 3).await;
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_reconciled_before_the_stores_are_ready() {
        let probe = Arc::new(Probe::default());
        let mut writer: Writer<String, u32> = Writer::new();
        let store = writer.store();
        let mut other: Writer<String, u32> = Writer::new();
        let c = Controller::new("t", probe.clone(), &Metrics::new())
            .watches(&store, |k: &String| k.parse::<u32>().ok())
            .reads(&other.store());
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.runs.lock().unwrap().push((key, Instant::now()));
                Ok::<_, String>(Action::AwaitChange)
            },
            backoff,
            shutdown.clone(),
        ));
        q.add(99);
        writer.apply(Event::Init);
        writer.apply(Event::InitApply("1".into(), Arc::new(1)));
        writer.apply(Event::InitDone);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(probe.count(), 0, "the second store is not ready yet");
        other.apply(Event::Init);
        other.apply(Event::InitDone);
        until(|| probe.count() == 2).await;
        let mut keys: Vec<u32> = probe.runs.lock().unwrap().iter().map(|r| r.0).collect();
        keys.sort();
        assert_eq!(
            keys,
            vec![1, 99],
            "what queued up meanwhile runs once ready"
        );
        // Store changes trigger their mapped keys.
        writer.apply(Event::Apply("5".into(), Arc::new(5)));
        writer.apply(Event::Apply("not-a-number".into(), Arc::new(0)));
        until(|| probe.count() == 3).await;
        assert_eq!(probe.runs.lock().unwrap()[2].0, 5);
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drains_running_reconciles_and_starts_no_more() {
        let probe = Arc::new(Probe::default());
        let finished = Arc::new(AtomicUsize::new(0));
        let c = Controller::new("t", probe.clone(), &Metrics::new()).concurrency(2);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let f = finished.clone();
        let run = tokio::spawn(c.run(
            move |key: u32, p: Arc<Probe>| {
                let f = f.clone();
                async move {
                    p.enter(key);
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    p.leave(key);
                    f.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Action::AwaitChange)
                }
            },
            backoff,
            shutdown.clone(),
        ));
        for k in 0..5 {
            q.add(k);
        }
        until(|| probe.count() == 2).await;
        let cancelled_at = Instant::now();
        shutdown.cancel();
        run.await.unwrap();
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "both running reconciles finished"
        );
        assert!(Instant::now() - cancelled_at >= Duration::from_secs(9));
        assert_eq!(probe.count(), 2, "nothing new started after shutdown");
        assert!(q.is_shutting_down());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_trigger_channel_never_deadlocks() {
        // A reconcile that feeds its own trigger channel (capacity 1) with two keys each time: if the loop
        // waited for reconciles before draining triggers, the second send would block forever.
        let probe = Arc::new(Probe::default());
        let (tx, rx) = tokio::sync::mpsc::channel::<u32>(1);
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|k| (k, rx)) });
        let c = Controller::new("t", probe.clone(), &Metrics::new()).triggers(stream);
        let q = c.queue();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            move |key: u32, p: Arc<Probe>| {
                let tx = tx.clone();
                async move {
                    p.runs.lock().unwrap().push((key, Instant::now()));
                    if key < 200 {
                        tx.send(key + 1).await.map_err(|e| e.to_string())?;
                        tx.send(key + 1001).await.map_err(|e| e.to_string())?;
                    }
                    Ok::<_, String>(Action::AwaitChange)
                }
            },
            backoff,
            shutdown.clone(),
        ));
        q.add(0);
        // Keys 0..=200 and 1001..=1200, each once.
        until(|| probe.count() == 401).await;
        shutdown.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_queues_its_key_every_period() {
        let probe = Arc::new(Probe::default());
        let c = Controller::new("t", probe.clone(), &Metrics::new())
            .every(Duration::from_secs(60), 1u32);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(c.run(
            |key: u32, p: Arc<Probe>| async move {
                p.runs.lock().unwrap().push((key, Instant::now()));
                Ok::<_, String>(Action::AwaitChange)
            },
            backoff,
            shutdown.clone(),
        ));
        until(|| probe.count() == 3).await;
        let runs = probe.runs_of(1);
        assert_eq!(runs[1] - runs[0], Duration::from_secs(60));
        assert_eq!(runs[2] - runs[1], Duration::from_secs(60));
        shutdown.cancel();
        run.await.unwrap();
    }
}
