//! Events: short JSON records under `/hostlet/events/<node>/…` that expire with a 48 h lease, the way
//! `kubectl get events` shows what happened and why.
//!
//! Repeats aggregate as the kubelet's do: the same (pod, container, type, reason, message) within
//! [`AGGREGATE_WINDOW`] of its last occurrence updates one event's `count` and `lastTimestamp` instead of
//! writing a new key; after its first [`UPDATE_BURST`] writes, an updated event is written again at most
//! every [`UPDATE_INTERVAL`]. At most
//! [`EVENT_KEYS_PER_NODE`] event keys exist per node: the oldest go first. So no input, however often it
//! repeats, makes the agent write more than that. Writes happen in the background: recording never waits on
//! etcd, and an etcd that is away delays events rather than losing them (up to the cap).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_api::objects::{Event, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::ClusterClient;
use hostlet_runtime::ExponentialBackoff;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How long an event stays in etcd after it was last written.
pub const EVENT_TTL: Duration = Duration::from_secs(48 * 3600);
/// Events share one lease for this long, so that writing an event is one put, not a grant and a put; each
/// event then lives between `EVENT_TTL - LEASE_REUSE` and `EVENT_TTL` after it was last written.
const LEASE_REUSE: Duration = Duration::from_secs(300);
/// A repeat this soon after the last occurrence updates the same event.
pub const AGGREGATE_WINDOW: Duration = Duration::from_secs(3600);
/// An aggregated event's first updates are written as they come (so a few repeats show at once)...
pub const UPDATE_BURST: u32 = 25;
/// ...then its key is written again at most this often; the count in between stays in memory.
pub const UPDATE_INTERVAL: Duration = Duration::from_secs(10);
/// Event keys kept per node; the oldest are deleted beyond this.
pub const EVENT_KEYS_PER_NODE: usize = 1000;
/// How long [`EventRecorder::record`] waits for a new event to reach etcd.
const FIRST_WRITE_WAIT: Duration = Duration::from_secs(2);
const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The writer checks this often whether its recorder is gone.
const IDLE_CHECK: Duration = Duration::from_secs(30);

/// Every reason the agent records events with, and the type it records each with. docs/reference.md
/// says when each happens; a test of the binary compares the two, and checks that every reason written at
/// a recording call in the sources is listed here, so a new reason cannot go undocumented.
pub const REASONS: &[(&str, EventKind)] = &[
    // Pods.
    ("Pulled", EventKind::Normal),
    ("Created", EventKind::Normal),
    ("Started", EventKind::Normal),
    ("Killing", EventKind::Normal),
    ("Failed", EventKind::Warning),
    ("BackOff", EventKind::Warning),
    ("Unhealthy", EventKind::Warning),
    ("FailedPostStartHook", EventKind::Warning),
    ("FailedPreStopHook", EventKind::Warning),
    ("Rejected", EventKind::Warning),
    ("PodSecurityWarning", EventKind::Warning),
    ("ConfigChanged", EventKind::Normal),
    // Images.
    ("ImagesRemoved", EventKind::Normal),
    ("ImageFileLoaded", EventKind::Normal),
    ("ImageFileFailed", EventKind::Warning),
    ("FreeDiskSpaceFailed", EventKind::Warning),
    // Manifest sources.
    ("ManifestKeyError", EventKind::Warning),
    ("ManifestFileError", EventKind::Warning),
    ("ManifestUrlError", EventKind::Warning),
    // Learners and members.
    ("LearnerPromoted", EventKind::Normal),
    ("LearnerEvicted", EventKind::Warning),
    ("MemberRemoved", EventKind::Normal),
    ("MemberRemoved", EventKind::Warning),
    ("MemberNotRemoved", EventKind::Warning),
    ("LeadershipMoved", EventKind::Normal),
    ("LocalMemberRemoved", EventKind::Warning),
    // Voter placement and roles.
    ("InvalidClusterPolicy", EventKind::Warning),
    ("InvalidNodeRecord", EventKind::Warning),
    ("InvalidMemberRequest", EventKind::Warning),
    // Pod sets.
    ("SuccessfulCreate", EventKind::Normal),
    ("SuccessfulDelete", EventKind::Normal),
    ("FailedCreate", EventKind::Warning),
    ("RolloutStarted", EventKind::Normal),
    ("RolloutProgress", EventKind::Normal),
    ("RolloutComplete", EventKind::Normal),
    ("RolloutFailed", EventKind::Warning),
    ("RolloutReverted", EventKind::Warning),
    ("InvalidPodSet", EventKind::Warning),
    ("NodeCordoned", EventKind::Normal),
    ("NodeDrained", EventKind::Normal),
    ("VoterRequested", EventKind::Normal),
    ("VoterReplaced", EventKind::Normal),
    ("VoterRemoved", EventKind::Normal),
    ("LearnerRemoved", EventKind::Normal),
    ("MemberRemoveFailed", EventKind::Warning),
    ("JoinedAsWorker", EventKind::Normal),
    ("BecameMember", EventKind::Normal),
    // Tombstones and rejoins.
    ("Tombstone", EventKind::Warning),
    ("LeaveFailed", EventKind::Warning),
    ("Rejoined", EventKind::Normal),
    // Snapshots.
    ("SnapshotCreated", EventKind::Normal),
    ("SnapshotFailed", EventKind::Warning),
    ("SnapshotUploadFailed", EventKind::Warning),
    ("SnapshotSkipped", EventKind::Normal),
    ("SnapshotSkipped", EventKind::Warning),
    ("DiskPressure", EventKind::Warning),
    ("DiskPressureRelieved", EventKind::Normal),
    ("InvalidSnapshotPolicy", EventKind::Warning),
    ("SnapshotPolicyFieldIgnored", EventKind::Warning),
    ("InvalidSnapshotRequest", EventKind::Warning),
    // etcd upkeep.
    ("EtcdCompacted", EventKind::Normal),
    ("EtcdCompactionFailed", EventKind::Warning),
    ("EtcdDefragmenting", EventKind::Normal),
    ("EtcdDefragmented", EventKind::Normal),
    ("EtcdDefragFailed", EventKind::Warning),
    ("EtcdLeaderMoved", EventKind::Normal),
    ("EtcdNoSpace", EventKind::Warning),
    ("EtcdAlarmDisarmed", EventKind::Normal),
    ("EtcdSpaceExhausted", EventKind::Warning),
    // etcd versions.
    ("EtcdUpgradeRefused", EventKind::Warning),
    ("EtcdUpgradeWaiting", EventKind::Normal),
    ("EtcdUpgraded", EventKind::Normal),
    ("EtcdVersionWarning", EventKind::Warning),
];

/// Whether an event reports the normal course of things or something an operator should look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Normal,
    Warning,
}

impl EventKind {
    /// `Normal` or `Warning`, as events carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        }
    }
}

/// What makes two events the same one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Signature {
    pod: Option<String>,
    container: Option<String>,
    kind: EventKind,
    reason: String,
    message: String,
}

struct Aggregate {
    key: String,
    event: Event,
    last_seen: SystemTime,
    /// Changed since it was last written.
    dirty: bool,
    written_at: Option<Instant>,
    /// How often its key was written.
    writes: u32,
    /// The recorder's generation at the last change.
    generation: u64,
}

#[derive(Default)]
struct State {
    by_signature: HashMap<Signature, Aggregate>,
    /// Every event key of this node known to exist (or about to be written), oldest first.
    keys: VecDeque<String>,
    /// Whether the keys written before this process started have been listed.
    seeded: bool,
    seq: u64,
    generation: u64,
}

struct Inner {
    /// etcd, or on a worker the voters' node API.
    etcd: ClusterClient,
    layout: KeyLayout,
    node: String,
    cap: usize,
    update_interval: Duration,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// The highest generation whose changes are all written.
    written: watch::Sender<u64>,
    /// The same, once the keys beyond the cap are deleted too.
    settled: watch::Sender<u64>,
    writer_started: AtomicBool,
}

/// Writes this node's events. Cheap to clone; failures to write are logged and retried, never fatal.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("node", &self.inner.node)
            .field("cap", &self.inner.cap)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    pub fn new(etcd: impl Into<ClusterClient>, keys: KeyLayout, node: impl Into<String>) -> Self {
        EventRecorder::from_parts(
            etcd.into(),
            keys,
            node.into(),
            EVENT_KEYS_PER_NODE,
            UPDATE_INTERVAL,
        )
    }

    /// The same recorder with another cap on event keys and update interval (benchmarks, tests).
    #[must_use]
    pub fn with_limits(self, cap: usize, update_interval: Duration) -> Self {
        let i = &self.inner;
        EventRecorder::from_parts(
            i.etcd.clone(),
            i.layout.clone(),
            i.node.clone(),
            cap.max(1),
            update_interval,
        )
    }

    fn from_parts(
        etcd: ClusterClient,
        layout: KeyLayout,
        node: String,
        cap: usize,
        update_interval: Duration,
    ) -> Self {
        EventRecorder {
            inner: Arc::new(Inner {
                etcd,
                layout,
                node,
                cap,
                update_interval,
                state: Mutex::default(),
                wake: Arc::new(Notify::new()),
                written: watch::channel(0).0,
                settled: watch::channel(0).0,
                writer_started: AtomicBool::new(false),
            }),
        }
    }

    /// Records an event about the node itself (no pod).
    pub async fn node_event(&self, kind: EventKind, reason: &str, message: impl Into<String>) {
        self.record(None, None, kind, reason, message).await;
    }

    /// Records an event and, when it is a new one (not a repeat), waits briefly for it to reach etcd, so
    /// that an event recorded just before the process exits is not lost.
    pub async fn record(
        &self,
        pod: Option<&str>,
        container: Option<&str>,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
    ) {
        if let Some(generation) = self.record_now(pod, container, kind, reason, message) {
            let mut rx = self.inner.written.subscribe();
            let _ = tokio::time::timeout(FIRST_WRITE_WAIT, rx.wait_for(|w| *w >= generation)).await;
        }
    }

    /// Records an event without waiting; returns the generation to wait for when it made a new event.
    /// Logs it as well (repeats at debug level), so the journal tells the same story without a flood.
    pub fn record_now(
        &self,
        pod: Option<&str>,
        container: Option<&str>,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
    ) -> Option<u64> {
        self.record_at(pod, container, kind, reason, message, SystemTime::now())
    }

    /// [`EventRecorder::record_now`] for an event that happened at `now`.
    pub fn record_at(
        &self,
        pod: Option<&str>,
        container: Option<&str>,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
        now: SystemTime,
    ) -> Option<u64> {
        let message = message.into();
        let sig = Signature {
            pod: pod.map(str::to_string),
            container: container.map(str::to_string),
            kind,
            reason: reason.to_string(),
            message,
        };
        let mut st = self.lock();
        st.generation += 1;
        let generation = st.generation;
        let repeat = st.by_signature.get_mut(&sig).filter(|a| {
            now.duration_since(a.last_seen)
                .map_or(true, |d| d < AGGREGATE_WINDOW)
        });
        let fresh = match repeat {
            Some(a) => {
                a.event.count += 1;
                a.event.last_timestamp = Some(Timestamp(now));
                a.last_seen = now;
                a.dirty = true;
                a.generation = generation;
                tracing::debug!(
                    pod,
                    container,
                    reason,
                    count = a.event.count,
                    "{}",
                    sig.message
                );
                false
            }
            None => {
                match kind {
                    EventKind::Normal => tracing::info!(pod, container, reason, "{}", sig.message),
                    EventKind::Warning => tracing::warn!(pod, container, reason, "{}", sig.message),
                }
                let nanos = now
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let seq = st.seq;
                st.seq = (st.seq + 1) % 1_000_000;
                let key = self.inner.layout.event(&self.inner.node, nanos, seq);
                let event = Event {
                    node: self.inner.node.clone(),
                    pod: sig.pod.clone(),
                    container: sig.container.clone(),
                    reason: sig.reason.clone(),
                    message: sig.message.clone(),
                    kind: kind.as_str().into(),
                    timestamp: Timestamp(now),
                    count: 1,
                    first_timestamp: Some(Timestamp(now)),
                    last_timestamp: Some(Timestamp(now)),
                };
                st.keys.push_back(key.clone());
                st.by_signature.insert(
                    sig,
                    Aggregate {
                        key,
                        event,
                        last_seen: now,
                        dirty: true,
                        written_at: None,
                        writes: 0,
                        generation,
                    },
                );
                // Aggregates of keys the cap will delete go with them; this bounds the memory too.
                while st.by_signature.len() > self.inner.cap {
                    let oldest = st
                        .by_signature
                        .iter()
                        .min_by_key(|(_, a)| a.last_seen)
                        .map(|(s, _)| s.clone());
                    let Some(gone) = oldest.and_then(|s| st.by_signature.remove(&s)) else {
                        break;
                    };
                    if gone.written_at.is_none() {
                        // Never written: nothing to delete later either.
                        st.keys.retain(|k| *k != gone.key);
                    }
                }
                true
            }
        };
        drop(st);
        self.start_writer();
        self.inner.wake.notify_one();
        fresh.then_some(generation)
    }

    /// Records an event about the node that happened at `at` (one held back while etcd refused writes,
    /// say); it is written in the background like any other, so this never fails.
    pub async fn node_event_at(
        &self,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
        at: Timestamp,
    ) -> Result<(), hostlet_runtime::etcd::EtcdError> {
        self.record_at(None, None, kind, reason, message, at.0);
        Ok(())
    }

    /// Waits until every event recorded so far has been written and the keys beyond the cap deleted (or
    /// `within` passed); true if it has.
    pub async fn flush(&self, within: Duration) -> bool {
        let target = self.lock().generation;
        self.inner.wake.notify_one();
        let mut rx = self.inner.settled.subscribe();
        tokio::time::timeout(within, rx.wait_for(|w| *w >= target))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether every event recorded so far has been written.
    pub fn is_flushed(&self) -> bool {
        *self.inner.written.borrow() >= self.lock().generation
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start_writer(&self) {
        if self.inner.writer_started.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(write_events(
                    Arc::downgrade(&self.inner),
                    self.inner.wake.clone(),
                ));
            }
            Err(_) => self.inner.writer_started.store(false, Ordering::Release),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one pass of the writer has to do.
struct Pass {
    writes: Vec<(Signature, String, Event, u64)>,
    /// When the next throttled update falls due.
    next_due: Option<Instant>,
}

fn due_writes(st: &State, update_interval: Duration, now: Instant) -> Pass {
    let mut pass = Pass {
        writes: Vec::new(),
        next_due: None,
    };
    for (sig, a) in st.by_signature.iter().filter(|(_, a)| a.dirty) {
        let throttled = a.writes >= UPDATE_BURST;
        match a
            .written_at
            .filter(|_| throttled)
            .map(|w| w + update_interval)
        {
            Some(due) if due > now => {
                pass.next_due = Some(pass.next_due.map_or(due, |d| d.min(due)));
            }
            _ => pass
                .writes
                .push((sig.clone(), a.key.clone(), a.event.clone(), a.generation)),
        }
    }
    // Oldest first, so that keys reach etcd in the order they sort.
    pass.writes.sort_by(|a, b| a.1.cmp(&b.1));
    pass
}

/// The generation up to which everything is written: just below the oldest unwritten change.
fn written_generation(st: &State) -> u64 {
    st.by_signature
        .values()
        .filter(|a| a.dirty)
        .map(|a| a.generation - 1)
        .min()
        .unwrap_or(st.generation)
}

async fn write_events(inner: Weak<Inner>, wake: Arc<Notify>) {
    let mut lease: Option<(i64, Instant)> = None;
    let mut backoff = ExponentialBackoff::new(RETRY_INITIAL, RETRY_MAX);
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else { return };
            match write_pass(&inner, &mut lease).await {
                Ok(next_due) => {
                    backoff.reset();
                    next_due.map_or(IDLE_CHECK, |d| {
                        d.saturating_duration_since(Instant::now()).min(IDLE_CHECK)
                    })
                }
                Err(e) => {
                    let retry = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?retry, "writing events failed; will retry");
                    lease = None;
                    retry
                }
            }
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Writes what is due and deletes keys beyond the cap; returns when the next throttled update is due.
async fn write_pass(
    inner: &Inner,
    lease: &mut Option<(i64, Instant)>,
) -> Result<Option<Instant>, hostlet_runtime::etcd::EtcdError> {
    if !inner.lock().seeded {
        let prefix = inner.layout.events_prefix(&inner.node);
        let existing = inner.etcd.keys_with_prefix(&prefix).await?;
        let mut st = inner.lock();
        let ours: Vec<String> = st.keys.drain(..).collect();
        for k in existing {
            let k = String::from_utf8_lossy(&k).to_string();
            if !ours.contains(&k) {
                st.keys.push_back(k);
            }
        }
        st.keys.extend(ours);
        st.seeded = true;
    }
    let pass = due_writes(&inner.lock(), inner.update_interval, Instant::now());
    for (sig, key, event, generation) in pass.writes {
        let reuse = lease
            .filter(|(_, granted)| granted.elapsed() < LEASE_REUSE)
            .map(|(id, _)| id);
        if inner
            .lock()
            .by_signature
            .get(&sig)
            .is_none_or(|a| a.key != key)
        {
            // Pushed out of memory by newer events meanwhile: its key is not to be written at all.
            continue;
        }
        let value = serde_json::to_vec(&event).unwrap_or_default();
        match reuse {
            Some(id) => {
                inner.etcd.put_with_lease(&key, value, id).await?;
            }
            None => {
                let id = inner
                    .etcd
                    .put_with_new_lease(&key, value, EVENT_TTL)
                    .await?;
                *lease = Some((id, Instant::now()));
            }
        }
        let mut st = inner.lock();
        // Pushed out while the put was on its way: the key exists now, so the cap must see it.
        if !st.keys.contains(&key) {
            let at = st.keys.partition_point(|k| *k < key);
            st.keys.insert(at, key.clone());
        }
        if let Some(a) = st.by_signature.get_mut(&sig).filter(|a| a.key == key) {
            a.written_at = Some(Instant::now());
            a.writes = a.writes.saturating_add(1);
            if a.generation == generation {
                a.dirty = false;
            }
        }
        let w = written_generation(&st);
        drop(st);
        inner.written.send_if_modified(|cur| {
            let changed = *cur != w;
            *cur = w;
            changed
        });
    }
    // The cap: the oldest keys go, and a repeat of an event whose key went starts a new one.
    loop {
        let oldest = {
            let st = inner.lock();
            (st.keys.len() > inner.cap)
                .then(|| st.keys.front().cloned())
                .flatten()
        };
        let Some(key) = oldest else { break };
        inner.etcd.delete(&key).await?;
        let mut st = inner.lock();
        if st.keys.front() == Some(&key) {
            st.keys.pop_front();
        }
        st.by_signature.retain(|_, a| a.key != key);
    }
    let st = inner.lock();
    let w = written_generation(&st);
    let within_cap = st.keys.len() <= inner.cap;
    let next_due = due_writes(&st, inner.update_interval, Instant::now()).next_due;
    drop(st);
    for tx in std::iter::once(&inner.written).chain(within_cap.then_some(&inner.settled)) {
        tx.send_if_modified(|cur| {
            let changed = *cur != w;
            *cur = w;
            changed
        });
    }
    Ok(next_due)
}
