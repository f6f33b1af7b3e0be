//! The shared typed cache: one [`Writer`] (held by an informer) and any number of [`Store`] readers.
//!
//! Readers get `Arc<V>`, never copies. A relist (`Init`, `InitApply`…, `InitDone`) fills a buffer and
//! swaps it in whole, so readers never see half a list. [`Store::wait_until_ready`] returns once the first
//! full list is in. Controllers learn what changed through [`Store::subscribe`]: a set of changed keys that
//! the writer fills without ever waiting, however slow the reader. A deleted key comes with the object it
//! last held ([`Changes::next_changes`]), so no reader keeps its own copy of what it saw.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use tokio::sync::{watch, Notify};

/// A changed key, and the object it held if the change deleted it.
type Changed<K, V> = (K, Option<Arc<V>>);

/// A change to apply to a cache, in informer order.
#[derive(Debug, Clone)]
pub enum Event<K, V> {
    /// A full list starts: following `InitApply`s fill a fresh buffer.
    Init,
    /// One object of the list.
    InitApply(K, Arc<V>),
    /// The list is complete: the buffer replaces the cache and the cache is ready.
    InitDone,
    /// An object was created or changed.
    Apply(K, Arc<V>),
    /// An object is gone.
    Delete(K),
}

type IndexFn<K, V> = Box<dyn Fn(&K, &V) -> Vec<String> + Send + Sync>;

/// A secondary lookup: index value → keys of the objects that produce it.
struct Index<K, V> {
    name: String,
    values_of: IndexFn<K, V>,
    keys: HashMap<String, HashSet<K>>,
}

impl<K: Clone + Eq + Hash, V> Index<K, V> {
    fn add(&mut self, key: &K, value: &V) {
        for v in (self.values_of)(key, value) {
            self.keys.entry(v).or_default().insert(key.clone());
        }
    }

    fn remove(&mut self, key: &K, value: &V) {
        for v in (self.values_of)(key, value) {
            if let Some(set) = self.keys.get_mut(&v) {
                set.remove(key);
                if set.is_empty() {
                    self.keys.remove(&v);
                }
            }
        }
    }
}

struct Data<K, V> {
    map: HashMap<K, Arc<V>>,
    indexes: Vec<Index<K, V>>,
    subscribers: Vec<Weak<Subscriber<K, V>>>,
    /// The writer is gone: no more changes will come.
    closed: bool,
}

impl<K: Clone + Eq + Hash, V> Data<K, V> {
    /// Tells every live subscriber that these keys changed (with the last object of a deleted one);
    /// drops the dead subscribers.
    fn notify(&mut self, changed: &[Changed<K, V>]) {
        self.subscribers.retain(|w| match w.upgrade() {
            Some(sub) => {
                sub.push(changed.iter().map(|(k, gone)| (k, gone.as_ref())));
                true
            }
            None => false,
        });
    }
}

struct Shared<K, V> {
    data: RwLock<Data<K, V>>,
    ready: watch::Sender<bool>,
}

/// A reader of a cache. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use hostlet_runtime::store::{Event, Writer};
/// let mut writer: Writer<String, u32> = Writer::new();
/// let store = writer.store();
/// writer.apply(Event::Init);
/// writer.apply(Event::InitApply("a".into(), Arc::new(1)));
/// writer.apply(Event::InitDone);
/// store.wait_until_ready().await;
/// assert_eq!(store.get("a").as_deref(), Some(&1));
/// # }
/// ```
pub struct Store<K, V> {
    shared: Arc<Shared<K, V>>,
}

impl<K, V> Clone for Store<K, V> {
    fn clone(&self) -> Self {
        Store {
            shared: self.shared.clone(),
        }
    }
}

impl<K, V> std::fmt::Debug for Store<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("ready", &*self.shared.ready.borrow())
            .finish_non_exhaustive()
    }
}

impl<K, V> Store<K, V> {
    /// Whether both handles read one cache (clones of one store).
    pub fn same_as(&self, other: &Store<K, V>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<K: Clone + Eq + Hash, V> Store<K, V> {
    fn read(&self) -> RwLockReadGuard<'_, Data<K, V>> {
        self.shared.data.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Data<K, V>> {
        self.shared.data.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The object under `key` (a `&str` will do for `String` keys).
    pub fn get<Q>(&self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read().map.get(key).cloned()
    }

    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read().map.contains_key(key)
    }

    /// Every object, in no particular order.
    pub fn state(&self) -> Vec<Arc<V>> {
        self.read().map.values().cloned().collect()
    }

    /// Every key with its object, in no particular order.
    pub fn entries(&self) -> Vec<(K, Arc<V>)> {
        self.read()
            .map
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn keys(&self) -> Vec<K> {
        self.read().map.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().map.is_empty()
    }

    /// The objects whose index `index` yields `value` (empty for an unknown index).
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<V>> {
        let data = self.read();
        let Some(ix) = data.indexes.iter().find(|i| i.name == index) else {
            return Vec::new();
        };
        ix.keys
            .get(value)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| data.map.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the first full list is in.
    pub fn is_ready(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Waits until the first full list is in. Returns at once afterwards, relists included.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.shared.ready.subscribe();
        // The sender lives in `shared`, which `self` keeps alive: this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// A feed of changed keys. It starts with every key present now, so a late subscriber misses nothing.
    pub fn subscribe(&self) -> Changes<K, V> {
        let sub = Arc::new(Subscriber {
            pending: Mutex::new(Pending {
                order: VecDeque::new(),
                set: HashSet::new(),
                deleted: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
        });
        let mut data = self.write();
        sub.push(data.map.keys().map(|k| (k, None)));
        if data.closed {
            sub.close();
        }
        data.subscribers.push(Arc::downgrade(&sub));
        Changes { sub }
    }
}

struct Pending<K, V> {
    order: VecDeque<K>,
    set: HashSet<K>,
    /// Pending keys whose latest change deleted them: the object each held last.
    deleted: HashMap<K, Arc<V>>,
    closed: bool,
}

struct Subscriber<K, V> {
    pending: Mutex<Pending<K, V>>,
    notify: Notify,
}

impl<K: Clone + Eq + Hash, V> Subscriber<K, V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending<K, V>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push<'a>(&self, changes: impl IntoIterator<Item = (&'a K, Option<&'a Arc<V>>)>)
    where
        K: 'a,
        V: 'a,
    {
        let mut p = self.lock();
        let mut any = false;
        for (k, gone) in changes {
            // The latest change decides: a key deleted and then written again holds an object.
            match gone {
                Some(v) => p.deleted.insert(k.clone(), v.clone()),
                None => p.deleted.remove(k),
            };
            if p.set.insert(k.clone()) {
                p.order.push_back(k.clone());
                any = true;
            }
        }
        drop(p);
        if any {
            self.notify.notify_one();
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }
}

/// A changed key as a subscriber takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<K, V> {
    pub key: K,
    /// The object the key held before its latest change deleted it; `None` while it holds one.
    pub deleted: Option<Arc<V>>,
}

/// Keys that changed in a store since they were last taken, each once, in the order they first changed.
pub struct Changes<K, V> {
    sub: Arc<Subscriber<K, V>>,
}

impl<K: Clone + Eq + Hash, V> Changes<K, V> {
    /// Waits for at least one changed key and takes all pending ones. `None` once the writer is gone and
    /// everything was taken.
    pub async fn next_batch(&mut self) -> Option<Vec<K>> {
        let changes = self.next_changes().await?;
        Some(changes.into_iter().map(|c| c.key).collect())
    }

    /// As [`Changes::next_batch`], each deleted key with the object it held last.
    pub async fn next_changes(&mut self) -> Option<Vec<Change<K, V>>> {
        loop {
            {
                let mut p = self.sub.lock();
                if !p.order.is_empty() {
                    p.set.clear();
                    let mut deleted = std::mem::take(&mut p.deleted);
                    let order: Vec<K> = p.order.drain(..).collect();
                    return Some(
                        order
                            .into_iter()
                            .map(|key| Change {
                                deleted: deleted.remove(&key),
                                key,
                            })
                            .collect(),
                    );
                }
                if p.closed {
                    return None;
                }
            }
            self.sub.notify.notified().await;
        }
    }

    /// Keys waiting to be taken.
    pub fn pending(&self) -> usize {
        self.sub.lock().order.len()
    }
}

/// The single writer of a cache. Not `Clone`: one informer feeds one cache.
pub struct Writer<K, V> {
    store: Store<K, V>,
    buffer: Option<HashMap<K, Arc<V>>>,
}

impl<K: Clone + Eq + Hash, V> Default for Writer<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash, V> Writer<K, V> {
    pub fn new() -> Self {
        let (ready, _) = watch::channel(false);
        Writer {
            store: Store {
                shared: Arc::new(Shared {
                    data: RwLock::new(Data {
                        map: HashMap::new(),
                        indexes: Vec::new(),
                        subscribers: Vec::new(),
                        closed: false,
                    }),
                    ready,
                }),
            },
            buffer: None,
        }
    }

    /// Adds a secondary index: `values_of` gives the index values an object is found under.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use hostlet_runtime::store::{Event, Writer};
    /// let mut w: Writer<u64, String> = Writer::new().with_index("name", |_, v: &String| vec![v.clone()]);
    /// w.apply(Event::Apply(1, Arc::new("n1".into())));
    /// assert_eq!(w.store().by_index("name", "n1").len(), 1);
    /// ```
    #[must_use]
    pub fn with_index<F>(self, name: &str, values_of: F) -> Self
    where
        F: Fn(&K, &V) -> Vec<String> + Send + Sync + 'static,
    {
        {
            let mut data = self.store.write();
            let mut ix = Index {
                name: name.to_string(),
                values_of: Box::new(values_of),
                keys: HashMap::new(),
            };
            for (k, v) in &data.map {
                ix.add(k, v);
            }
            data.indexes.push(ix);
        }
        self
    }

    /// A reader of this cache.
    pub fn store(&self) -> Store<K, V> {
        self.store.clone()
    }

    pub fn apply(&mut self, event: Event<K, V>) {
        self.apply_all(std::iter::once(event));
    }

    /// Applies events in order, taking the lock once and telling subscribers once for a run of changes
    /// (a watch response carries many).
    pub fn apply_all(&mut self, events: impl IntoIterator<Item = Event<K, V>>) {
        let mut data: Option<RwLockWriteGuard<'_, Data<K, V>>> = None;
        let mut changed: Vec<Changed<K, V>> = Vec::new();
        for event in events {
            match event {
                Event::Init => self.buffer = Some(HashMap::new()),
                Event::InitApply(k, v) => {
                    self.buffer.get_or_insert_with(HashMap::new).insert(k, v);
                }
                Event::InitDone => {
                    if let Some(mut d) = data.take() {
                        d.notify(&changed);
                        changed.clear();
                    }
                    let fresh = self.buffer.take().unwrap_or_default();
                    swap(&self.store, fresh);
                    self.store.shared.ready.send_replace(true);
                }
                Event::Apply(k, v) => {
                    let d = data.get_or_insert_with(|| self.store.write());
                    let old = d.map.insert(k.clone(), v.clone());
                    for ix in d.indexes.iter_mut() {
                        if let Some(old) = &old {
                            ix.remove(&k, old);
                        }
                        ix.add(&k, &v);
                    }
                    changed.push((k, None));
                }
                Event::Delete(k) => {
                    let d = data.get_or_insert_with(|| self.store.write());
                    if let Some(old) = d.map.remove(&k) {
                        for ix in d.indexes.iter_mut() {
                            ix.remove(&k, &old);
                        }
                        changed.push((k, Some(old)));
                    }
                }
            }
        }
        if let Some(mut d) = data {
            d.notify(&changed);
        }
    }
}

/// Replaces the whole cache; every key present before or after counts as changed, so deletions that
/// happened while no watch ran are seen too.
fn swap<K: Clone + Eq + Hash, V>(store: &Store<K, V>, fresh: HashMap<K, Arc<V>>) {
    let mut data = store.write();
    let old = std::mem::replace(&mut data.map, fresh);
    let Data { indexes, map, .. } = &mut *data;
    for ix in indexes.iter_mut() {
        ix.keys.clear();
        for (k, v) in map.iter() {
            ix.add(k, v);
        }
    }
    let mut changed: Vec<Changed<K, V>> = data
        .map
        .keys()
        .filter(|k| !old.contains_key(*k))
        .map(|k| (k.clone(), None))
        .collect();
    for (k, v) in old {
        let gone = (!data.map.contains_key(&k)).then_some(v);
        changed.push((k, gone));
    }
    data.notify(&changed);
}

impl<K, V> Drop for Writer<K, V> {
    fn drop(&mut self) {
        let mut data = self
            .store
            .shared
            .data
            .write()
            .unwrap_or_else(|p| p.into_inner());
        data.closed = true;
        for sub in data.subscribers.iter().filter_map(Weak::upgrade) {
            let mut p = sub.pending.lock().unwrap_or_else(|p| p.into_inner());
            p.closed = true;
            drop(p);
            sub.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(w: &mut Writer<String, u32>, k: &str, v: u32) {
        w.apply(Event::Apply(k.to_string(), Arc::new(v)));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_is_released_by_the_first_init_done() {
        let mut w: Writer<String, u32> = Writer::new();
        let s = w.store();
        assert!(!s.is_ready());
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.wait_until_ready().await });
        w.apply(Event::Init);
        w.apply(Event::InitApply("a".into(), Arc::new(1)));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(s.is_empty(), "a list in progress is not visible");
        w.apply(Event::InitDone);
        waiter.await.unwrap();
        assert!(s.is_ready());
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_relist_swaps_the_whole_cache_at_once() {
        let mut w: Writer<String, u32> = Writer::new();
        let s = w.store();
        w.apply(Event::Init);
        w.apply(Event::InitApply("a".into(), Arc::new(1)));
        w.apply(Event::InitApply("b".into(), Arc::new(2)));
        w.apply(Event::InitDone);
        w.apply(Event::Init);
        w.apply(Event::InitApply("b".into(), Arc::new(3)));
        // Readers still see the old list in full.
        assert_eq!(s.len(), 2);
        assert_eq!(s.get("a").as_deref(), Some(&1));
        w.apply(Event::InitDone);
        assert_eq!(s.len(), 1);
        assert_eq!(s.get("b").as_deref(), Some(&3));
        assert!(s.is_ready());
    }

    #[tokio::test]
    async fn subscribers_see_each_changed_key_once_including_relist_deletions() {
        let mut w: Writer<String, u32> = Writer::new();
        let s = w.store();
        apply(&mut w, "a", 1);
        let mut changes = s.subscribe();
        apply(&mut w, "b", 1);
        apply(&mut w, "a", 2);
        apply(&mut w, "b", 2);
        w.apply(Event::Delete("zzz".into())); // absent: no change
        assert_eq!(changes.next_batch().await.unwrap(), vec!["a", "b"]);
        // A relist that drops "a" reports it.
        w.apply(Event::Init);
        w.apply(Event::InitApply("b".into(), Arc::new(2)));
        w.apply(Event::InitDone);
        let mut got = changes.next_batch().await.unwrap();
        got.sort();
        assert_eq!(got, vec!["a", "b"]);
        drop(w);
        assert_eq!(changes.next_batch().await, None);
    }

    #[tokio::test]
    async fn a_deleted_key_comes_with_the_object_it_held_last() {
        let mut w: Writer<String, u32> = Writer::new();
        let s = w.store();
        let mut changes = s.subscribe();
        apply(&mut w, "a", 1);
        apply(&mut w, "b", 1);
        apply(&mut w, "a", 2);
        w.apply(Event::Delete("a".into()));
        // Deleted and written again before it was taken: it holds an object, nothing was lost.
        w.apply(Event::Delete("b".into()));
        apply(&mut w, "b", 3);
        let got = changes.next_changes().await.unwrap();
        let deleted: Vec<(&str, Option<u32>)> = got
            .iter()
            .map(|c| (c.key.as_str(), c.deleted.as_deref().copied()))
            .collect();
        assert_eq!(deleted, vec![("a", Some(2)), ("b", None)]);
        // A relist that drops "b" reports it with its last object; "c" is new.
        w.apply(Event::Init);
        w.apply(Event::InitApply("c".into(), Arc::new(4)));
        w.apply(Event::InitDone);
        let mut got: Vec<(String, Option<u32>)> = changes
            .next_changes()
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.key, c.deleted.as_deref().copied()))
            .collect();
        got.sort();
        assert_eq!(got, vec![("b".into(), Some(3)), ("c".into(), None)]);
    }

    #[test]
    fn the_writer_never_waits_for_a_slow_subscriber() {
        let mut w: Writer<u32, u32> = Writer::new();
        let changes = w.store().subscribe();
        for round in 0..100 {
            for k in 0..1000 {
                w.apply(Event::Apply(k, Arc::new(round)));
            }
        }
        // Nobody read: the backlog is bounded by the number of distinct keys.
        assert_eq!(changes.pending(), 1000);
    }

    #[test]
    fn indexes_follow_updates_deletes_and_relists() {
        let mut w: Writer<String, u32> =
            Writer::new().with_index("parity", |_, v: &u32| vec![(v % 2).to_string()]);
        let s = w.store();
        apply(&mut w, "a", 1);
        apply(&mut w, "b", 3);
        assert_eq!(s.by_index("parity", "1").len(), 2);
        apply(&mut w, "a", 2);
        assert_eq!(s.by_index("parity", "1").len(), 1);
        assert_eq!(s.by_index("parity", "0").len(), 1);
        w.apply(Event::Delete("a".into()));
        assert!(s.by_index("parity", "0").is_empty());
        w.apply(Event::Init);
        w.apply(Event::InitApply("c".into(), Arc::new(4)));
        w.apply(Event::InitDone);
        assert!(s.by_index("parity", "1").is_empty());
        assert_eq!(s.by_index("parity", "0").len(), 1);
        assert!(s.by_index("nope", "0").is_empty());
    }
}
