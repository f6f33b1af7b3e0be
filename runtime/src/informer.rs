//! The typed etcd informer: keeps a [`Store`] equal to a key prefix.
//!
//! It lists the prefix page by page at one revision, then watches from the next revision. When the watch
//! stream breaks it resumes from the last revision it saw; when that revision has been compacted away it
//! lists again from scratch and swaps the cache in whole. Connection errors back off ≈0.8 s → 30 s with
//! jitter, reset after two quiet minutes. A value the decoder rejects becomes an [`Invalid`] entry that
//! carries the error: it is never dropped and never panics anything.
//!
//! The list/watch logic is one [`step`] function over a small [`ListWatch`] trait, so each state is tested
//! against a fake.

use std::error::Error as StdError;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::backoff::ExponentialBackoff;
use crate::etcd::{key_after, Etcd, EtcdError, LIST_PAGE_SIZE};
use crate::metrics::{InformerMetrics, Metrics};
use crate::store::{Event, Store, Writer};

/// What a decoder may fail with.
pub type DecodeError = Box<dyn StdError + Send + Sync>;

type DecodeFn<T> = dyn Fn(&str, &[u8]) -> Result<T, DecodeError> + Send + Sync;

/// One key of the prefix as the cache holds it.
#[derive(Debug, Clone)]
pub struct Object<T> {
    /// The full etcd key.
    pub key: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// Writes to this key since it was created (1 for a new key).
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
    /// The decoded value, or why it could not be decoded.
    pub value: Result<T, Invalid>,
}

impl<T> Object<T> {
    /// A key written once, at revision 1, with no lease: a cache filled by hand (tests, fakes).
    pub fn fresh(key: impl Into<String>, value: Result<T, Invalid>) -> Self {
        Object {
            key: key.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
            value,
        }
    }

    /// The value when it decoded.
    pub fn valid(&self) -> Option<&T> {
        self.value.as_ref().ok()
    }

    /// Why the value did not decode, when it did not.
    pub fn invalid(&self) -> Option<&Invalid> {
        self.value.as_ref().err()
    }
}

/// A value the decoder rejected, with the error and the bytes as written.
#[derive(Debug, Clone)]
pub struct Invalid {
    pub error: Arc<dyn StdError + Send + Sync>,
    pub raw: Vec<u8>,
}

impl Invalid {
    /// The decoder's error as text (for statuses and events).
    pub fn message(&self) -> String {
        self.error.to_string()
    }

    /// The decoder's error as its own type, e.g. `hostlet_api::ParseError` with its line and column.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }
}

/// A key-value as etcd gave it (list or watch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawKv {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl From<etcd_client::KeyValue> for RawKv {
    fn from(kv: etcd_client::KeyValue) -> Self {
        let (create_revision, mod_revision, version, lease) = (
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            kv.lease(),
        );
        let (key, value) = kv.into_key_value();
        RawKv {
            key: key_string(key),
            value,
            create_revision,
            mod_revision,
            version,
            lease,
        }
    }
}

impl From<&etcd_client::KeyValue> for RawKv {
    fn from(kv: &etcd_client::KeyValue) -> Self {
        RawKv {
            key: key_string(kv.key().to_vec()),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        }
    }
}

/// hostlet's keys are text; a foreign key that is not is kept, lossily, rather than dropped.
fn key_string(key: Vec<u8>) -> String {
    String::from_utf8(key).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    Put(RawKv),
    Delete { key: String, revision: i64 },
}

/// One message of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    Events(Vec<RawEvent>),
    /// The watch was cancelled because its start revision is compacted (etcd's `compact_revision`).
    Compacted(i64),
    /// The reader asks for a fresh list: what it may read changed although no key did (through the node
    /// API, a node's pods began or stopped using a ConfigMap or Secret).
    Relist,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The revision the page was read at.
    pub revision: i64,
    pub kvs: Vec<RawKv>,
    /// Where the next page starts, if there is one.
    pub next: Option<Vec<u8>>,
}

/// The two calls an informer makes: the seam between the state machine and etcd.
pub trait ListWatch: Send + Sync {
    type Watch: Stream<Item = Result<WatchItem, EtcdError>> + Send + Unpin;

    /// One page of the prefix from `from` (`None`: its start) at `revision` (0: the latest).
    fn list(
        &self,
        from: Option<&[u8]>,
        revision: i64,
    ) -> impl Future<Output = Result<Page, EtcdError>> + Send;

    /// A watch of the prefix from `start_revision` (inclusive).
    fn watch(
        &self,
        start_revision: i64,
    ) -> impl Future<Output = Result<Self::Watch, EtcdError>> + Send;
}

/// What one [`step`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Init,
    InitApply(RawKv),
    InitDone { revision: i64 },
    Apply(RawKv),
    Delete { key: String, revision: i64 },
}

/// Why a step failed. After [`StepError::Compacted`] the next step starts a full relist.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("revision {0} is compacted; relisting")]
    Compacted(i64),
    #[error("a relist was asked for")]
    RelistAsked,
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("the watch stream ended")]
    WatchEnded,
}

/// Where the informer is.
pub enum State<W> {
    /// Nothing listed, or a relist is due.
    Empty,
    /// A page is to be read (`revision` 0 for the first page: the latest).
    Listing {
        revision: i64,
        from: Option<Vec<u8>>,
    },
    /// Handing out a page's items.
    InitPage {
        revision: i64,
        items: std::vec::IntoIter<RawKv>,
        next: Option<Vec<u8>>,
    },
    /// A watch is to be opened after `revision`.
    Resume { revision: i64 },
    /// Watching; `revision` is the last one handed out.
    Watching {
        revision: i64,
        watch: W,
        pending: std::vec::IntoIter<RawEvent>,
    },
}

impl<W> State<W> {
    /// Watch events already received and not yet handed out: the next step returns without waiting.
    pub fn has_pending(&self) -> bool {
        matches!(self, State::Watching { pending, .. } if pending.len() > 0)
    }
}

impl<W> std::fmt::Debug for State<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            State::Empty => write!(f, "Empty"),
            State::Listing { revision, .. } => write!(f, "Listing({revision})"),
            State::InitPage { revision, .. } => write!(f, "InitPage({revision})"),
            State::Resume { revision } => write!(f, "Resume({revision})"),
            State::Watching { revision, .. } => write!(f, "Watching({revision})"),
        }
    }
}

/// Advances the informer by one event (or one failure) and returns the next state.
pub async fn step<L: ListWatch>(
    lw: &L,
    mut state: State<L::Watch>,
) -> (Result<Step, StepError>, State<L::Watch>) {
    loop {
        state = match state {
            State::Empty => {
                return (
                    Ok(Step::Init),
                    State::Listing {
                        revision: 0,
                        from: None,
                    },
                )
            }
            State::Listing { revision, from } => match lw.list(from.as_deref(), revision).await {
                Ok(page) => State::InitPage {
                    revision: page.revision,
                    items: page.kvs.into_iter(),
                    next: page.next,
                },
                Err(e) if e.is_compacted() => {
                    return (Err(StepError::Compacted(revision)), State::Empty)
                }
                // A page failed: the list starts over (the revision may be gone by the retry).
                Err(e) => return (Err(e.into()), State::Empty),
            },
            State::InitPage {
                revision,
                mut items,
                next,
            } => match items.next() {
                Some(kv) => {
                    return (
                        Ok(Step::InitApply(kv)),
                        State::InitPage {
                            revision,
                            items,
                            next,
                        },
                    )
                }
                None => match next {
                    Some(from) => State::Listing {
                        revision,
                        from: Some(from),
                    },
                    None => return (Ok(Step::InitDone { revision }), State::Resume { revision }),
                },
            },
            State::Resume { revision } => match lw.watch(revision + 1).await {
                Ok(watch) => State::Watching {
                    revision,
                    watch,
                    pending: Vec::new().into_iter(),
                },
                Err(e) if e.is_compacted() => {
                    return (Err(StepError::Compacted(revision)), State::Empty)
                }
                Err(e) => return (Err(e.into()), State::Resume { revision }),
            },
            State::Watching {
                revision,
                mut watch,
                mut pending,
            } => {
                if let Some(ev) = pending.next() {
                    let (at, step) = match ev {
                        RawEvent::Put(kv) => (kv.mod_revision, Step::Apply(kv)),
                        RawEvent::Delete { key, revision } => {
                            (revision, Step::Delete { key, revision })
                        }
                    };
                    return (
                        Ok(step),
                        State::Watching {
                            revision: revision.max(at),
                            watch,
                            pending,
                        },
                    );
                }
                match watch.next().await {
                    Some(Ok(WatchItem::Events(events))) => State::Watching {
                        revision,
                        watch,
                        pending: events.into_iter(),
                    },
                    Some(Ok(WatchItem::Compacted(_))) => {
                        return (Err(StepError::Compacted(revision)), State::Empty)
                    }
                    Some(Ok(WatchItem::Relist)) => {
                        return (Err(StepError::RelistAsked), State::Empty)
                    }
                    Some(Err(e)) => return (Err(e.into()), State::Resume { revision }),
                    None => return (Err(StepError::WatchEnded), State::Resume { revision }),
                }
            }
        }
    }
}

/// [`ListWatch`] over an etcd prefix.
pub struct EtcdListWatch {
    etcd: Etcd,
    prefix: String,
}

impl EtcdListWatch {
    pub fn new(etcd: Etcd, prefix: impl Into<String>) -> Self {
        EtcdListWatch {
            etcd,
            prefix: prefix.into(),
        }
    }
}

fn watch_item(resp: etcd_client::WatchResponse) -> Result<WatchItem, EtcdError> {
    if resp.compact_revision() != 0 {
        return Ok(WatchItem::Compacted(resp.compact_revision()));
    }
    if resp.canceled() {
        // Cancelled for another reason (e.g. the member lost its leader): open a new watch.
        return Err(EtcdError::unavailable(
            "watch",
            etcd_client::Error::WatchError(format!("watch cancelled: {}", resp.cancel_reason())),
        ));
    }
    let events = resp
        .events()
        .iter()
        .filter_map(|e| {
            let kv = e.kv()?;
            Some(match e.event_type() {
                etcd_client::EventType::Put => RawEvent::Put(RawKv::from(kv)),
                etcd_client::EventType::Delete => RawEvent::Delete {
                    key: key_string(kv.key().to_vec()),
                    revision: kv.mod_revision(),
                },
            })
        })
        .collect();
    Ok(WatchItem::Events(events))
}

impl ListWatch for EtcdListWatch {
    type Watch = BoxStream<'static, Result<WatchItem, EtcdError>>;

    async fn list(&self, from: Option<&[u8]>, revision: i64) -> Result<Page, EtcdError> {
        let prefix = self.prefix.as_bytes();
        let page = self
            .etcd
            .list_page(prefix, from.unwrap_or(prefix), revision, LIST_PAGE_SIZE)
            .await?;
        let next = if page.more {
            page.kvs.last().map(|kv| key_after(kv.key()))
        } else {
            None
        };
        Ok(Page {
            revision: page.revision,
            kvs: page.kvs.into_iter().map(RawKv::from).collect(),
            next,
        })
    }

    async fn watch(&self, start_revision: i64) -> Result<Self::Watch, EtcdError> {
        // etcd-client asserts on the first answer of a new watch; a surprise there must not end the informer.
        let opened = AssertUnwindSafe(self.etcd.watch_prefix(&self.prefix, start_revision))
            .catch_unwind()
            .await
            .map_err(|_| {
                EtcdError::unavailable(
                    self.etcd.current_endpoint(),
                    etcd_client::Error::WatchError("unexpected answer opening the watch".into()),
                )
            })?;
        let (watcher, stream) = opened?;
        let endpoint = self.etcd.current_endpoint();
        // The watcher rides along: dropping it would end the stream on the server side.
        let items = futures::stream::unfold(Some((watcher, stream)), move |state| {
            let endpoint = endpoint.clone();
            async move {
                let (watcher, mut stream) = state?;
                match stream.message().await {
                    Ok(Some(resp)) => Some((watch_item(resp), Some((watcher, stream)))),
                    Ok(None) => None,
                    Err(e) => Some((Err(EtcdError::unavailable(endpoint, e)), None)),
                }
            }
        });
        Ok(items.boxed())
    }
}

/// Keeps a [`Store`] equal to an etcd prefix, decoding each value with the caller's decoder.
///
/// ```no_run
/// # async fn demo(etcd: hostlet_runtime::Etcd, metrics: hostlet_runtime::Metrics) {
/// use hostlet_api::{parse_manifest, KeyLayout};
/// use hostlet_runtime::Informer;
/// use tokio_util::sync::CancellationToken;
///
/// let prefix = KeyLayout::default().pods_prefix("node-1");
/// let informer = Informer::new("pods", etcd, prefix, |_key, bytes| parse_manifest(bytes))
///     .with_metrics(&metrics);
/// let pods = informer.store();
/// let shutdown = CancellationToken::new();
/// tokio::spawn(informer.run(shutdown.clone()));
/// pods.wait_until_ready().await;
/// for pod in pods.state() {
///     match &pod.value {
///         Ok(manifest) => println!("{}: {}", pod.key, manifest.id),
///         Err(invalid) => println!("{}: invalid: {}", pod.key, invalid.message()),
///     }
/// }
/// # }
/// ```
pub struct Informer<T> {
    name: String,
    /// `None`: it lists and watches through another [`ListWatch`] ([`Informer::run_with`]).
    etcd: Option<Etcd>,
    prefix: String,
    decode: Arc<DecodeFn<T>>,
    writer: Writer<String, Object<T>>,
    metrics: InformerMetrics,
    backoff: ExponentialBackoff,
}

impl<T: Send + Sync + 'static> Informer<T> {
    /// An informer named `name` (its metrics' label) over `prefix`. `decode` gets the key and the value.
    pub fn new<D, E>(name: &str, etcd: Etcd, prefix: impl Into<String>, decode: D) -> Self
    where
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        Informer {
            etcd: Some(etcd),
            ..Informer::over(name, prefix, decode)
        }
    }

    /// An informer of `prefix` that reaches it through a [`ListWatch`] of the caller's, given to
    /// [`Informer::run_with`].
    pub fn over<D, E>(name: &str, prefix: impl Into<String>, decode: D) -> Self
    where
        D: Fn(&str, &[u8]) -> Result<T, E> + Send + Sync + 'static,
        E: Into<DecodeError>,
    {
        Informer {
            name: name.to_string(),
            etcd: None,
            prefix: prefix.into(),
            decode: Arc::new(move |k: &str, v: &[u8]| decode(k, v).map_err(Into::into)),
            writer: Writer::new(),
            metrics: Metrics::new().informer(name),
            backoff: ExponentialBackoff::for_informer(),
        }
    }

    /// Reports into `metrics` (without it, the informer's series go nowhere).
    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = metrics.informer(&self.name);
        self
    }

    /// Adds a secondary index to the store (see [`Writer::with_index`]).
    #[must_use]
    pub fn with_index<F>(mut self, name: &str, values_of: F) -> Self
    where
        F: Fn(&String, &Object<T>) -> Vec<String> + Send + Sync + 'static,
    {
        self.writer = self.writer.with_index(name, values_of);
        self
    }

    /// Replaces the connection-error backoff (tests shorten it).
    #[must_use]
    pub fn with_backoff(mut self, backoff: ExponentialBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The cache this informer fills.
    pub fn store(&self) -> Store<String, Object<T>> {
        self.writer.store()
    }

    /// Runs until `shutdown` fires. Never gives up on etcd.
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(etcd) = self.etcd.clone() else {
            tracing::error!(informer = %self.name, "an informer made without etcd runs only with run_with");
            return;
        };
        let lw = EtcdListWatch::new(etcd, self.prefix.clone());
        self.run_with(&lw, shutdown).await;
    }

    /// The informer loop over any [`ListWatch`].
    pub async fn run_with<L: ListWatch>(mut self, lw: &L, shutdown: CancellationToken) {
        let mut state = State::Empty;
        let mut synced = false;
        // The events of one watch response go into the cache together (one lock, one wake-up).
        let mut batch = Vec::new();
        loop {
            let (result, next) = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = step(lw, state) => r,
            };
            state = next;
            match result {
                Ok(ev) => batch.push(self.event(ev, &mut synced)),
                Err(e) => {
                    self.writer.apply_all(batch.drain(..));
                    self.failed(e, &shutdown).await;
                }
            }
            if !state.has_pending() && !batch.is_empty() {
                self.writer.apply_all(batch.drain(..));
                // Let the readers just woken run before the next response is read: under a backlog the
                // stream is always ready and this task would otherwise hold its worker.
                tokio::task::yield_now().await;
            }
        }
    }

    /// Counts and logs a failed step, and waits before the next unless the failure asks for a relist.
    async fn failed(&mut self, e: StepError, shutdown: &CancellationToken) {
        if let StepError::Compacted(revision) = e {
            self.metrics.relists.inc();
            tracing::info!(informer = %self.name, revision, "watched revision compacted; relisting");
            return;
        }
        if let StepError::RelistAsked = e {
            tracing::debug!(informer = %self.name, "relisting as asked");
            return;
        }
        self.metrics.error.inc();
        let delay = self.backoff.next_delay();
        tracing::warn!(informer = %self.name, error = %e, retry_in = ?delay, "list/watch failed");
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }

    fn object(&self, kv: RawKv) -> Object<T> {
        // A decoder that panics on some value is that value's problem, not the informer's.
        let decoded =
            std::panic::catch_unwind(AssertUnwindSafe(|| (self.decode)(&kv.key, &kv.value)))
                .unwrap_or_else(|_| Err("the decoder panicked on this value".into()));
        let value = match decoded {
            Ok(v) => Ok(v),
            Err(error) => {
                self.metrics.invalid.inc();
                tracing::debug!(informer = %self.name, key = %kv.key, %error, "value does not decode");
                Err(Invalid {
                    error: Arc::from(error),
                    raw: kv.value,
                })
            }
        };
        Object {
            key: kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
            value,
        }
    }

    /// The cache event for a step, counted.
    fn event(&self, ev: Step, synced: &mut bool) -> Event<String, Object<T>> {
        let m = &self.metrics;
        match ev {
            Step::Init => {
                m.init.inc();
                Event::Init
            }
            Step::InitApply(kv) => {
                m.init_apply.inc();
                let obj = self.object(kv);
                Event::InitApply(obj.key.clone(), Arc::new(obj))
            }
            Step::InitDone { revision } => {
                m.init_done.inc();
                m.stamp();
                m.last_revision.set(revision);
                if !*synced {
                    tracing::debug!(informer = %self.name, revision, "synced");
                }
                *synced = true;
                Event::InitDone
            }
            Step::Apply(kv) => {
                m.apply.inc();
                m.stamp();
                m.last_revision.set(kv.mod_revision);
                let obj = self.object(kv);
                Event::Apply(obj.key.clone(), Arc::new(obj))
            }
            Step::Delete { key, revision } => {
                m.delete.inc();
                m.stamp();
                m.last_revision.set(revision);
                Event::Delete(key)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// A scripted watch: the items it yields before it ends, or why it could not open.
    type ScriptedWatch = Result<Vec<Result<WatchItem, EtcdError>>, EtcdError>;

    /// A scripted etcd: each call takes the next scripted answer and is recorded.
    #[derive(Default)]
    struct Fake {
        lists: Mutex<VecDeque<Result<Page, EtcdError>>>,
        watches: Mutex<VecDeque<ScriptedWatch>>,
        /// (from, revision) of each list call.
        list_calls: Mutex<Vec<(Option<Vec<u8>>, i64)>>,
        watch_calls: Mutex<Vec<i64>>,
        call_times: Mutex<Vec<tokio::time::Instant>>,
    }

    fn unavailable() -> EtcdError {
        EtcdError::unavailable("fake", etcd_client::Error::WatchError("down".into()))
    }

    fn compacted() -> EtcdError {
        EtcdError::Compacted {
            revision: 1,
            source: Box::new(etcd_client::Error::WatchError("compacted".into())),
        }
    }

    fn kv(key: &str, value: &str, rev: i64) -> RawKv {
        RawKv {
            key: key.into(),
            value: value.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
    }

    fn page(revision: i64, kvs: Vec<RawKv>, next: Option<&str>) -> Result<Page, EtcdError> {
        Ok(Page {
            revision,
            kvs,
            next: next.map(|n| n.as_bytes().to_vec()),
        })
    }

    impl Fake {
        fn list_then(self, p: Result<Page, EtcdError>) -> Self {
            self.lists.lock().unwrap().push_back(p);
            self
        }
        fn watch_then(self, w: ScriptedWatch) -> Self {
            self.watches.lock().unwrap().push_back(w);
            self
        }
    }

    impl ListWatch for Fake {
        type Watch = BoxStream<'static, Result<WatchItem, EtcdError>>;

        async fn list(&self, from: Option<&[u8]>, revision: i64) -> Result<Page, EtcdError> {
            self.list_calls
                .lock()
                .unwrap()
                .push((from.map(<[u8]>::to_vec), revision));
            self.call_times
                .lock()
                .unwrap()
                .push(tokio::time::Instant::now());
            self.lists
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Err(unavailable()))
        }

        async fn watch(&self, start_revision: i64) -> Result<Self::Watch, EtcdError> {
            self.watch_calls.lock().unwrap().push(start_revision);
            match self.watches.lock().unwrap().pop_front() {
                Some(Ok(items)) => Ok(futures::stream::iter(items).boxed()),
                Some(Err(e)) => Err(e),
                // Nothing scripted: a watch that stays open and quiet.
                None => Ok(futures::stream::pending().boxed()),
            }
        }
    }

    async fn steps<L: ListWatch>(
        lw: &L,
        mut state: State<L::Watch>,
        n: usize,
    ) -> (Vec<Result<Step, StepError>>, State<L::Watch>) {
        let mut out = Vec::new();
        for _ in 0..n {
            let (r, s) = step(lw, state).await;
            out.push(r);
            state = s;
        }
        (out, state)
    }

    fn ok(results: Vec<Result<Step, StepError>>) -> Vec<Step> {
        results.into_iter().map(|r| r.unwrap()).collect()
    }

    #[tokio::test]
    async fn lists_at_one_revision_then_watches_from_the_next() {
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/a", "1", 3)], Some("/p/a\0")))
            .list_then(page(10, vec![kv("/p/b", "2", 4)], None))
            .watch_then(Ok(vec![Ok(WatchItem::Events(vec![
                RawEvent::Put(kv("/p/c", "3", 11)),
                RawEvent::Delete {
                    key: "/p/a".into(),
                    revision: 12,
                },
            ]))]));
        let (results, state) = steps(&fake, State::Empty, 6).await;
        assert_eq!(
            ok(results),
            vec![
                Step::Init,
                Step::InitApply(kv("/p/a", "1", 3)),
                Step::InitApply(kv("/p/b", "2", 4)),
                Step::InitDone { revision: 10 },
                Step::Apply(kv("/p/c", "3", 11)),
                Step::Delete {
                    key: "/p/a".into(),
                    revision: 12
                },
            ]
        );
        assert!(matches!(state, State::Watching { revision: 12, .. }));
        assert_eq!(
            *fake.list_calls.lock().unwrap(),
            vec![(None, 0), (Some(b"/p/a\0".to_vec()), 10)],
            "the second page is read at the first page's revision"
        );
        assert_eq!(*fake.watch_calls.lock().unwrap(), vec![11]);
    }

    #[tokio::test]
    async fn a_broken_stream_resumes_after_the_last_revision_seen() {
        let fake = Fake::default()
            .list_then(page(10, vec![], None))
            .watch_then(Ok(vec![
                Ok(WatchItem::Events(vec![RawEvent::Put(kv("/p/a", "1", 15))])),
                Err(unavailable()),
            ]))
            .watch_then(Ok(vec![]));
        let (results, state) = steps(&fake, State::Empty, 5).await;
        assert!(matches!(results[2], Ok(Step::Apply(_))));
        assert!(matches!(results[3], Err(StepError::Etcd(_))));
        assert!(matches!(results[4], Err(StepError::WatchEnded)));
        assert!(matches!(state, State::Resume { revision: 15 }));
        assert_eq!(*fake.watch_calls.lock().unwrap(), vec![11, 16]);
    }

    #[tokio::test]
    async fn a_failed_watch_open_retries_from_the_same_revision() {
        let fake = Fake::default()
            .list_then(page(10, vec![], None))
            .watch_then(Err(unavailable()));
        let (results, state) = steps(&fake, State::Empty, 3).await;
        assert!(matches!(results[2], Err(StepError::Etcd(_))));
        assert!(matches!(state, State::Resume { revision: 10 }));
    }

    #[tokio::test]
    async fn a_relist_asked_for_lists_from_scratch() {
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/a", "1", 3)], None))
            .watch_then(Ok(vec![Ok(WatchItem::Relist)]))
            .list_then(page(12, vec![kv("/p/b", "2", 11)], None));
        let (results, _) = steps(&fake, State::Empty, 7).await;
        assert!(matches!(results[3], Err(StepError::RelistAsked)));
        assert_eq!(
            ok(results.into_iter().skip(4).collect()),
            vec![
                Step::Init,
                Step::InitApply(kv("/p/b", "2", 11)),
                Step::InitDone { revision: 12 }
            ]
        );
    }

    #[tokio::test]
    async fn compaction_of_the_watched_revision_relists_from_scratch() {
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/a", "1", 3)], None))
            .watch_then(Ok(vec![Ok(WatchItem::Compacted(20))]))
            .list_then(page(30, vec![kv("/p/b", "2", 25)], None));
        let (results, state) = steps(&fake, State::Empty, 7).await;
        assert!(matches!(results[3], Err(StepError::Compacted(10))));
        assert_eq!(
            ok(results.into_iter().skip(4).collect()),
            vec![
                Step::Init,
                Step::InitApply(kv("/p/b", "2", 25)),
                Step::InitDone { revision: 30 }
            ]
        );
        assert!(matches!(state, State::Resume { revision: 30 }));
    }

    #[tokio::test]
    async fn compaction_when_reopening_the_watch_relists() {
        let fake = Fake::default()
            .list_then(page(10, vec![], None))
            .watch_then(Err(compacted()));
        let (results, state) = steps(&fake, State::Empty, 3).await;
        assert!(matches!(results[2], Err(StepError::Compacted(10))));
        assert!(matches!(state, State::Empty));
    }

    #[tokio::test]
    async fn a_failed_page_restarts_the_list() {
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/a", "1", 3)], Some("/p/a\0")))
            .list_then(Err(compacted()))
            .list_then(page(12, vec![], None));
        let (results, _) = steps(&fake, State::Empty, 5).await;
        assert!(matches!(results[2], Err(StepError::Compacted(10))));
        assert_eq!(
            ok(results.into_iter().skip(3).collect()),
            vec![Step::Init, Step::InitDone { revision: 12 }]
        );
    }

    async fn text_informer(metrics: &Metrics) -> Informer<String> {
        // The fake never touches the client; it only has to exist.
        let etcd = Etcd::connect(crate::EtcdConfig::new(["http://127.0.0.1:1"]))
            .await
            .unwrap();
        Informer::new("test", etcd, "/p/", |_, v: &[u8]| {
            String::from_utf8(v.to_vec())
        })
        .with_metrics(metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn connection_errors_back_off_with_growing_delays() {
        let metrics = Metrics::new();
        let fake = Fake::default(); // every list fails
        let informer = text_informer(&metrics).await;
        let shutdown = CancellationToken::new();
        let run = informer.run_with(&fake, shutdown.clone());
        let _ = tokio::time::timeout(Duration::from_secs(120), run).await;
        let times = fake.call_times.lock().unwrap().clone();
        let gaps: Vec<f64> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect();
        assert!(gaps.len() >= 5, "{gaps:?}");
        // ≈0.8 s, 1.6 s, 3.2 s… each within ±25 %, never above 30 s.
        for (i, g) in gaps.iter().enumerate() {
            let base = (0.8 * 2f64.powi(i as i32)).min(30.0);
            assert!(
                *g >= base * 0.75 - 1e-6 && *g <= (base * 1.25).min(30.0) + 1e-6,
                "gap {i}: {g} (base {base})"
            );
        }
        assert!(metrics.encode_text().contains(&format!(
            "hostlet_informer_events_total{{informer=\"test\",type=\"error\"}} {}",
            times.len()
        )));
    }

    /// Runs the informer over `fake` until `check` returns, then stops it.
    async fn with_informer<F: Future<Output = ()>>(
        fake: Fake,
        metrics: &Metrics,
        check: impl FnOnce(Store<String, Object<String>>) -> F,
    ) {
        let informer = text_informer(metrics).await;
        let store = informer.store();
        let shutdown = CancellationToken::new();
        let run = informer.run_with(&fake, shutdown.clone());
        let check = async {
            check(store).await;
            shutdown.cancel();
        };
        tokio::join!(run, check);
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_that_does_not_decode_becomes_an_invalid_entry() {
        let metrics = Metrics::new();
        let bad = RawKv {
            value: vec![0xff, 0xfe],
            ..kv("/p/bad", "", 4)
        };
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/good", "fine", 3), bad.clone()], None))
            .watch_then(Ok(vec![Ok(WatchItem::Events(vec![RawEvent::Put(
                RawKv {
                    mod_revision: 11,
                    ..bad
                },
            )]))]));
        with_informer(fake, &metrics, |store| async move {
            store.wait_until_ready().await;
            while store.get("/p/bad").map(|o| o.mod_revision) != Some(11) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let bad = store.get("/p/bad").unwrap();
            let invalid = bad.invalid().unwrap();
            assert!(invalid.message().contains("utf-8"), "{}", invalid.message());
            assert!(invalid
                .downcast_ref::<std::string::FromUtf8Error>()
                .is_some());
            assert_eq!(invalid.raw, vec![0xff, 0xfe]);
            let good = store.get("/p/good").unwrap();
            assert_eq!(good.valid().map(String::as_str), Some("fine"));
        })
        .await;
        let text = metrics.encode_text();
        assert!(
            text.contains("hostlet_informer_events_total{informer=\"test\",type=\"invalid\"} 2"),
            "{text}"
        );
        assert!(text.contains("hostlet_informer_last_revision{informer=\"test\"} 11"));
        let stamped: f64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("hostlet_informer_last_event_timestamp_seconds{informer=\"test\"} ")
            })
            .and_then(|v| v.parse().ok())
            .expect("the last event's time is reported");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        assert!(
            stamped > now - 600.0 && stamped <= now,
            "{stamped} vs {now}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_decoder_that_panics_makes_an_invalid_entry_not_a_dead_informer() {
        let etcd = Etcd::connect(crate::EtcdConfig::new(["http://127.0.0.1:1"]))
            .await
            .unwrap();
        let informer = Informer::new("p", etcd, "/p/", |_, v: &[u8]| {
            assert!(v != b"boom", "decoder bug");
            String::from_utf8(v.to_vec())
        });
        let store = informer.store();
        let fake = Fake::default()
            .list_then(page(
                10,
                vec![kv("/p/a", "boom", 3), kv("/p/b", "fine", 4)],
                None,
            ))
            .watch_then(Ok(vec![Ok(WatchItem::Events(vec![RawEvent::Put(kv(
                "/p/c", "later", 11,
            ))]))]));
        let shutdown = CancellationToken::new();
        let check = async {
            while !store.contains("/p/c") {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let a = store.get("/p/a").unwrap();
            assert!(a.invalid().unwrap().message().contains("panicked"));
            assert!(store.get("/p/b").unwrap().valid().is_some());
            shutdown.cancel();
        };
        tokio::join!(informer.run_with(&fake, shutdown.clone()), check);
    }

    #[tokio::test(start_paused = true)]
    async fn a_compacted_watch_relists_swaps_the_cache_and_is_counted() {
        let metrics = Metrics::new();
        let fake = Fake::default()
            .list_then(page(10, vec![kv("/p/a", "1", 3), kv("/p/b", "2", 4)], None))
            .watch_then(Ok(vec![Ok(WatchItem::Compacted(20))]))
            .list_then(page(30, vec![kv("/p/b", "3", 25)], None));
        with_informer(fake, &metrics, |store| async move {
            store.wait_until_ready().await;
            while store
                .get("/p/b")
                .and_then(|o| o.valid().cloned())
                .as_deref()
                != Some("3")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(store.len(), 1, "the key deleted during the gap is gone");
        })
        .await;
        let text = metrics.encode_text();
        assert!(
            text.contains("hostlet_informer_relists_total{informer=\"test\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hostlet_informer_events_total{informer=\"test\",type=\"init_done\"} 2")
        );
        assert!(text.contains("hostlet_informer_events_total{informer=\"test\",type=\"error\"} 0"));
        assert!(text.contains("hostlet_informer_last_revision{informer=\"test\"} 30"));
    }
}
