//! The work queue: which key to reconcile next, and when.
//!
//! Semantics users of client-go know:
//! - a key waits at most once; adding it again keeps the earliest deadline;
//! - a key being processed is never handed out again until [`WorkQueue::done`]; re-added meanwhile, it is
//!   queued again at `done` (with the earliest deadline asked for);
//! - [`WorkQueue::add_rate_limited`] delays by a per-key exponential backoff (5 ms → 1000 s), which
//!   [`WorkQueue::forget`] clears after a success;
//! - after [`WorkQueue::shutdown`], adds are ignored and [`WorkQueue::get`] hands out nothing more; keys
//!   already handed out finish normally (the controller waits for them).
//!
//! Adding never blocks and never fails, so a reconcile can requeue keys freely without deadlocking.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff::ExponentialBackoff;
use crate::metrics::{Metrics, QueueMetrics};

/// What can key a queue: anything small, comparable and shareable (a pod id, a member id, a unit `()`).
pub trait QueueKey: Clone + Eq + Hash + Debug + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Debug + Send + Sync + 'static> QueueKey for T {}

/// The per-key retry delays of client-go's default rate limiter.
pub const RETRY_INITIAL: Duration = Duration::from_millis(5);
pub const RETRY_MAX: Duration = Duration::from_secs(1000);

#[derive(Debug, Clone, Copy)]
struct Waiting {
    due: Instant,
    added: Instant,
}

/// A heap slot; stale when the key's current deadline differs (the key was taken or moved earlier).
struct Slot<K> {
    due: Instant,
    seq: u64,
    key: K,
}

impl<K> PartialEq for Slot<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl<K> Eq for Slot<K> {}
impl<K> PartialOrd for Slot<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Slot<K> {
    // Reversed: BinaryHeap is a max-heap and the earliest deadline must come first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

struct State<K> {
    waiting: HashMap<K, Waiting>,
    heap: BinaryHeap<Slot<K>>,
    seq: u64,
    /// Keys handed out and not yet done, with when they were handed out.
    processing: HashMap<K, Instant>,
    /// Keys re-added while processing, with the earliest deadline asked for.
    dirty: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    shutting_down: bool,
}

struct Shared<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    retry: ExponentialBackoff,
    metrics: QueueMetrics,
}

/// A work queue of keys. Cheap to clone; all clones are the same queue.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use hostlet_runtime::{Metrics, WorkQueue};
/// let q = WorkQueue::new("demo", &Metrics::new());
/// q.add("web");
/// q.add("web"); // deduplicated
/// let key = q.get().await.unwrap();
/// q.done(&key);
/// assert_eq!(q.len(), 0);
/// # }
/// ```
pub struct WorkQueue<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<K: QueueKey> WorkQueue<K> {
    /// A queue whose series carry `name`.
    pub fn new(name: &str, metrics: &Metrics) -> Self {
        Self::with_queue_metrics(metrics.queue(name))
    }

    pub(crate) fn with_queue_metrics(metrics: QueueMetrics) -> Self {
        WorkQueue {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    waiting: HashMap::new(),
                    heap: BinaryHeap::new(),
                    seq: 0,
                    processing: HashMap::new(),
                    dirty: HashMap::new(),
                    failures: HashMap::new(),
                    shutting_down: false,
                }),
                notify: Notify::new(),
                retry: ExponentialBackoff::new(RETRY_INITIAL, RETRY_MAX),
                metrics,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` to run now.
    pub fn add(&self, key: K) {
        self.add_at(key, Instant::now());
    }

    /// Queues `key` to run after `delay` (or earlier, if it is already due earlier).
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_at(key, Instant::now() + delay);
    }

    /// Queues `key` after its backoff delay and lengthens that delay for next time.
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut st = self.state();
            let n = st.failures.entry(key.clone()).or_insert(0);
            let delay = self.shared.retry.delay_for(*n);
            *n = n.saturating_add(1);
            delay
        };
        self.shared.metrics.retries.inc();
        self.add_after(key, delay);
    }

    /// Clears `key`'s backoff (after a success).
    pub fn forget(&self, key: &K) {
        self.state().failures.remove(key);
    }

    /// How many backoff retries `key` has had since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// Queues `key` with deadline `due`; the earliest deadline wins.
    pub fn add_at(&self, key: K, due: Instant) {
        let mut st = self.state();
        if st.shutting_down {
            return;
        }
        if st.processing.contains_key(&key) {
            st.dirty
                .entry(key)
                .and_modify(|d| *d = (*d).min(due))
                .or_insert(due);
            return;
        }
        if self.enqueue(&mut st, key, due) {
            drop(st);
            self.shared.notify.notify_waiters();
        }
    }

    /// Puts a key into the waiting set; true when its deadline moved (a waiter may need to wake).
    fn enqueue(&self, st: &mut State<K>, key: K, due: Instant) -> bool {
        let now = Instant::now();
        match st.waiting.get_mut(&key) {
            Some(w) if w.due <= due => return false,
            Some(w) => w.due = due,
            None => {
                st.waiting.insert(key.clone(), Waiting { due, added: now });
                self.shared.metrics.adds.inc();
                self.shared.metrics.depth.set(st.waiting.len() as i64);
            }
        }
        st.seq += 1;
        let seq = st.seq;
        st.heap.push(Slot { due, seq, key });
        true
    }

    /// Waits for the next due key and marks it processing. `None` once the queue shuts down.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so an add between the look and the wait still wakes us.
            notified.as_mut().enable();
            let next_due = {
                let mut st = self.state();
                if st.shutting_down {
                    return None;
                }
                let now = Instant::now();
                loop {
                    let (due, live) = match st.heap.peek() {
                        None => break None,
                        Some(top) => (
                            top.due,
                            st.waiting.get(&top.key).is_some_and(|w| w.due == top.due),
                        ),
                    };
                    if !live {
                        st.heap.pop();
                        continue;
                    }
                    if due > now {
                        break Some(due);
                    }
                    let Some(slot) = st.heap.pop() else {
                        break None;
                    };
                    let w = st.waiting.remove(&slot.key);
                    st.processing.insert(slot.key.clone(), now);
                    let m = &self.shared.metrics;
                    m.depth.set(st.waiting.len() as i64);
                    if let Some(w) = w {
                        let ready_since = w.due.max(w.added);
                        m.queue_duration
                            .observe(now.saturating_duration_since(ready_since).as_secs_f64());
                    }
                    return Some(slot.key);
                }
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` finished; if it was re-added while processing, it is queued again now.
    pub fn done(&self, key: &K) {
        let mut st = self.state();
        if let Some(started) = st.processing.remove(key) {
            self.shared
                .metrics
                .work_duration
                .observe(started.elapsed().as_secs_f64());
        }
        let requeue = match st.dirty.remove(key) {
            Some(due) if !st.shutting_down => self.enqueue(&mut st, key.clone(), due),
            _ => false,
        };
        drop(st);
        if requeue {
            self.shared.notify.notify_waiters();
        }
    }

    /// Stops the queue: adds are ignored and `get` returns `None`. Keys being processed still finish.
    pub fn shutdown(&self) {
        let mut st = self.state();
        st.shutting_down = true;
        st.waiting.clear();
        st.heap.clear();
        st.dirty.clear();
        self.shared.metrics.depth.set(0);
        drop(st);
        self.shared.notify.notify_waiters();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.state().shutting_down
    }

    /// Keys waiting (due or not), not counting those being processed.
    pub fn len(&self) -> usize {
        self.state().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys handed out and not yet done.
    pub fn processing(&self) -> usize {
        self.state().processing.len()
    }

    /// When `key` is due, if it waits.
    pub fn due(&self, key: &K) -> Option<Instant> {
        self.state().waiting.get(key).map(|w| w.due)
    }

    /// Refreshes the in-progress gauges (unfinished work, longest running); call it periodically.
    pub fn update_progress_metrics(&self) {
        let st = self.state();
        let now = Instant::now();
        let mut total = 0.0;
        let mut longest = 0.0f64;
        for started in st.processing.values() {
            let secs = now.saturating_duration_since(*started).as_secs_f64();
            total += secs;
            longest = longest.max(secs);
        }
        self.shared.metrics.unfinished_work.set(total);
        self.shared.metrics.longest_running.set(longest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new("test", &Metrics::new())
    }

    /// `get` with a deadline, so a test fails instead of hanging (paused time makes this instant).
    async fn get_within(q: &WorkQueue<&'static str>, d: Duration) -> Option<&'static str> {
        tokio::time::timeout(d, q.get()).await.ok().flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn dedup_keeps_one_entry_with_the_earliest_deadline() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(1));
        q.add_after("a", Duration::from_secs(5));
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        q.done(&"a");
        // The later requests were absorbed, not kept.
        assert_eq!(get_within(&q, Duration::from_secs(100)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_come_out_in_deadline_order() {
        let q = queue();
        q.add_after("late", Duration::from_secs(3));
        q.add_after("early", Duration::from_secs(1));
        q.add("now");
        assert_eq!(q.get().await, Some("now"));
        assert_eq!(q.get().await, Some("early"));
        assert_eq!(q.get().await, Some("late"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_being_processed_is_not_handed_out_again() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add("a");
        assert_eq!(q.len(), 0, "re-added while processing: held back");
        assert_eq!(get_within(&q, Duration::from_secs(60)).await, None);
        assert_eq!(q.processing(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_runs_again_after_done() {
        let q = queue();
        q.add("a");
        assert_eq!(q.get().await, Some("a"));
        q.add_after("a", Duration::from_secs(30));
        q.add_after("a", Duration::from_secs(2));
        let start = Instant::now();
        q.done(&"a");
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(2),
            "earliest deadline kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_add_wakes_a_waiting_get() {
        let q = queue();
        let q2 = q.clone();
        let getter = tokio::spawn(async move { q2.get().await });
        tokio::task::yield_now().await;
        q.add_after("a", Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(getter.await.unwrap(), Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // An earlier add overtakes a later wait.
        q.add_after("b", Duration::from_secs(50));
        let q3 = q.clone();
        let getter = tokio::spawn(async move { q3.get().await });
        tokio::task::yield_now().await;
        q.add("c");
        assert_eq!(getter.await.unwrap(), Some("c"));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_per_key_and_resets_on_forget() {
        let q = queue();
        let mut delays = Vec::new();
        for _ in 0..4 {
            let start = Instant::now();
            q.add_rate_limited("a");
            assert_eq!(q.get().await, Some("a"));
            delays.push(start.elapsed());
            q.done(&"a");
        }
        let ms = |n| Duration::from_millis(n);
        assert_eq!(delays, vec![ms(5), ms(10), ms(20), ms(40)]);
        assert_eq!(q.num_requeues(&"a"), 4);
        // Another key has its own count.
        assert_eq!(q.num_requeues(&"b"), 0);
        q.forget(&"a");
        let start = Instant::now();
        q.add_rate_limited("a");
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), ms(5));
    }

    #[test]
    fn backoff_is_capped_at_1000_seconds() {
        let q = queue();
        assert_eq!(q.shared.retry.delay_for(40), RETRY_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_handing_out_and_ignores_adds() {
        let q = queue();
        q.add("a");
        q.add("b");
        assert_eq!(q.get().await, Some("a"));
        let q2 = q.clone();
        let waiter = tokio::spawn(async move {
            let first = q2.get().await;
            let second = q2.get().await;
            (first, second)
        });
        // "b" is handed out at once; the second get waits until shutdown.
        while q.processing() < 2 {
            tokio::task::yield_now().await;
        }
        q.shutdown();
        assert_eq!(waiter.await.unwrap(), (Some("b"), None));
        q.add("c");
        assert_eq!(q.len(), 0);
        assert_eq!(q.get().await, None);
        // Keys in flight still finish.
        q.done(&"a");
        q.done(&"b");
        assert_eq!(q.processing(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_follow_the_queue() {
        let m = Metrics::new();
        let q: WorkQueue<u32> = WorkQueue::new("m", &m);
        q.add(1);
        q.add(1);
        q.add(2);
        q.add_rate_limited(3);
        let text = m.encode_text();
        assert!(
            text.contains("workqueue_adds_total{name=\"m\"} 3"),
            "{text}"
        );
        assert!(text.contains("workqueue_depth{name=\"m\"} 3"));
        assert!(text.contains("workqueue_retries_total{name=\"m\"} 1"));
        let k = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        q.update_progress_metrics();
        let text = m.encode_text();
        assert!(text.contains("workqueue_longest_running_processor_seconds{name=\"m\"} 2"));
        q.done(&k);
        assert!(m
            .encode_text()
            .contains("workqueue_work_duration_seconds_count{name=\"m\"} 1"));
    }
}
