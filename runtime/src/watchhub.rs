//! One etcd watch shared by many readers: what a voter serves its workers' watches from, so that etcd's
//! watchers do not grow with the workers (kube-apiserver's watch cache, in small).
//!
//! The hub watches everything under one root prefix and keeps the latest events (a bounded window). A
//! reader's watch of a prefix under the root, from a revision the window still covers, is served from
//! it: the events it missed, then each new one, filtered by its prefix. Taking the window and subscribing
//! happen under the lock the hub appends under, so a reader sees every event once. A reader the hub
//! cannot serve (a revision older than the window, a prefix outside the root, the hub not watching) gets
//! `None` and watches etcd itself; a reader that falls behind the live events, or a hub that had to start
//! its watch over, ends the reader's stream, and the reader resumes from its own revision.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::informer::{RawEvent, WatchItem};
use crate::{Etcd, EtcdError};

/// How many events the window keeps, and how many bytes of keys and values.
#[derive(Debug, Clone, Copy)]
pub struct HubLimits {
    pub events: usize,
    pub bytes: usize,
}

impl Default for HubLimits {
    fn default() -> Self {
        HubLimits {
            events: 8192,
            bytes: 32 << 20,
        }
    }
}

/// One answer of the hub's etcd watch.
#[derive(Debug)]
struct Batch {
    events: Vec<RawEvent>,
    bytes: usize,
}

#[derive(Debug, Clone)]
enum Message {
    Batch(Arc<Batch>),
    /// The hub started its watch over: readers end and resume.
    Reset,
}

#[derive(Debug, Default)]
struct Window {
    /// Every event from this revision on is in `batches` (0: the hub is not watching yet).
    oldest: i64,
    /// The revision after the last event seen.
    next: i64,
    batches: VecDeque<Arc<Batch>>,
    events: usize,
    bytes: usize,
}

/// A shared watch of one root prefix.
#[derive(Clone)]
pub struct WatchHub {
    root: String,
    window: Arc<Mutex<Window>>,
    tx: broadcast::Sender<Message>,
    /// Whether the window is open (`oldest != 0`), for readers that wait to be served by the hub.
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

fn revision_of(e: &RawEvent) -> i64 {
    match e {
        RawEvent::Put(kv) => kv.mod_revision,
        RawEvent::Delete { revision, .. } => *revision,
    }
}

fn key_of(e: &RawEvent) -> &str {
    match e {
        RawEvent::Put(kv) => &kv.key,
        RawEvent::Delete { key, .. } => key,
    }
}

fn size_of(e: &RawEvent) -> usize {
    match e {
        RawEvent::Put(kv) => kv.key.len() + kv.value.len(),
        RawEvent::Delete { key, .. } => key.len(),
    }
}

impl WatchHub {
    /// Starts watching everything under `root` (until `cancel`), keeping `limits` of events.
    pub fn start(
        etcd: Etcd,
        root: impl Into<String>,
        limits: HubLimits,
        cancel: CancellationToken,
    ) -> WatchHub {
        WatchHub::start_owned(etcd, root, limits, cancel).0
    }

    /// [`WatchHub::start`], and its watch task, for an owner that waits for it at its stop.
    pub fn start_owned(
        etcd: Etcd,
        root: impl Into<String>,
        limits: HubLimits,
        cancel: CancellationToken,
    ) -> (WatchHub, tokio::task::JoinHandle<()>) {
        // Room for a burst while readers write to their connections; one that falls further behind ends.
        let (tx, _) = broadcast::channel(1024);
        let hub = WatchHub {
            root: root.into(),
            window: Arc::new(Mutex::new(Window::default())),
            tx,
            open: Arc::new(tokio::sync::watch::channel(false).0),
        };
        let task = tokio::spawn(hub.clone().run(etcd, limits, cancel));
        (hub, task)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prefix the hub watches everything under.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The first revision the window covers (0 while the hub is not watching).
    pub fn oldest(&self) -> i64 {
        self.lock().oldest
    }

    /// Waits until the hub's window is open: a reader that lists after this and watches from the
    /// list's revision is served by the hub, not by an etcd watch of its own.
    pub async fn watching(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }

    async fn run(self, etcd: Etcd, limits: HubLimits, cancel: CancellationToken) {
        let mut backoff = crate::backoff::ExponentialBackoff::new(
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        loop {
            // Where to watch from: after the last event seen, or now when the window is new.
            let from = {
                let w = self.lock();
                (w.oldest != 0).then_some(w.next)
            };
            let from = match from {
                Some(f) => f,
                None => {
                    let now = tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = etcd.list_page(self.root.as_bytes(), self.root.as_bytes(), 0, 1) => r,
                    };
                    match now {
                        Ok(page) => {
                            let mut w = self.lock();
                            w.oldest = page.revision + 1;
                            w.next = page.revision + 1;
                            self.open.send_replace(true);
                            w.oldest
                        }
                        Err(e) => {
                            tracing::debug!(root = %self.root, error = %e, "the watch hub cannot read the revision");
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(backoff.next_delay()) => continue,
                            }
                        }
                    }
                }
            };
            let lw = crate::informer::EtcdListWatch::new(etcd.clone(), self.root.clone());
            let opened = tokio::select! {
                _ = cancel.cancelled() => return,
                r = crate::informer::ListWatch::watch(&lw, from) => r,
            };
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(root = %self.root, error = %e, "the watch hub cannot watch");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => continue,
                    }
                }
            };
            loop {
                let item = tokio::select! {
                    _ = cancel.cancelled() => {
                        self.reset();
                        return;
                    }
                    item = stream.next() => item,
                };
                match item {
                    Some(Ok(WatchItem::Events(events))) => {
                        backoff.reset();
                        if !events.is_empty() {
                            self.append(events, limits);
                        }
                    }
                    Some(Ok(WatchItem::Compacted(_))) | Some(Ok(WatchItem::Relist)) => {
                        // Events were lost: the window starts over from now.
                        self.reset();
                        break;
                    }
                    Some(Err(_)) | None => break,
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    fn append(&self, events: Vec<RawEvent>, limits: HubLimits) {
        let bytes = events.iter().map(size_of).sum();
        let last = events.iter().map(revision_of).max().unwrap_or(0);
        let batch = Arc::new(Batch { events, bytes });
        let mut w = self.lock();
        w.events += batch.events.len();
        w.bytes += batch.bytes;
        w.next = w.next.max(last + 1);
        w.batches.push_back(batch.clone());
        while w.batches.len() > 1 && (w.events > limits.events || w.bytes > limits.bytes) {
            if let Some(old) = w.batches.pop_front() {
                w.events -= old.events.len();
                w.bytes -= old.bytes;
                let after = old.events.iter().map(revision_of).max().unwrap_or(0) + 1;
                w.oldest = w.oldest.max(after);
            }
        }
        // Sent under the lock: a reader subscribing meanwhile either found this batch in the window or
        // receives it, never both.
        let _ = self.tx.send(Message::Batch(batch));
    }

    /// Ends every reader; the window starts over from the revision read next.
    fn reset(&self) {
        let mut w = self.lock();
        *w = Window::default();
        self.open.send_replace(false);
        let _ = self.tx.send(Message::Reset);
    }

    /// The events under `prefix` from `revision` on (0: from now), then each new one; `None` when the
    /// hub cannot serve it (the reader watches etcd itself).
    pub fn watch(
        &self,
        prefix: &str,
        revision: i64,
    ) -> Option<BoxStream<'static, Result<WatchItem, EtcdError>>> {
        if !prefix.starts_with(&self.root) {
            return None;
        }
        let (missed, rx, from) = {
            let w = self.lock();
            if w.oldest == 0 {
                return None;
            }
            let from = if revision <= 0 { w.next } else { revision };
            if from < w.oldest {
                return None;
            }
            let missed: Vec<RawEvent> = w
                .batches
                .iter()
                .flat_map(|b| b.events.iter())
                .filter(|e| revision_of(e) >= from && key_of(e).starts_with(prefix))
                .cloned()
                .collect();
            (missed, self.tx.subscribe(), from)
        };
        let prefix = prefix.to_string();
        let first = (!missed.is_empty()).then(|| Ok(WatchItem::Events(missed)));
        let live = futures::stream::unfold(Some(rx), move |rx| {
            let prefix = prefix.clone();
            async move {
                let mut rx = rx?;
                loop {
                    match rx.recv().await {
                        Ok(Message::Batch(b)) => {
                            let events: Vec<RawEvent> = b
                                .events
                                .iter()
                                .filter(|e| {
                                    revision_of(e) >= from && key_of(e).starts_with(&prefix)
                                })
                                .cloned()
                                .collect();
                            if !events.is_empty() {
                                return Some((Ok(WatchItem::Events(events)), Some(rx)));
                            }
                        }
                        Ok(Message::Reset) | Err(broadcast::error::RecvError::Closed) => {
                            return None
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            return Some((
                                Err(EtcdError::unavailable(
                                    "watch hub",
                                    etcd_client::Error::WatchError(
                                        "this reader fell behind the shared watch".into(),
                                    ),
                                )),
                                None,
                            ))
                        }
                    }
                }
            }
        });
        Some(futures::stream::iter(first).chain(live).boxed())
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::testkit::TestEtcd;

    async fn next_events(
        s: &mut BoxStream<'static, Result<WatchItem, EtcdError>>,
    ) -> Vec<(String, i64)> {
        let item = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("an item within 10 s")
            .expect("the stream goes on")
            .expect("no error");
        match item {
            WatchItem::Events(events) => events
                .iter()
                .map(|e| (key_of(e).to_string(), revision_of(e)))
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn readers_get_the_events_they_missed_then_each_new_one_from_one_etcd_watch() {
        let server = TestEtcd::start().await;
        let etcd = server.connect().await;
        let cancel = CancellationToken::new();
        let hub = WatchHub::start(etcd.clone(), "/h/", HubLimits::default(), cancel.clone());
        tokio::time::timeout(Duration::from_secs(10), hub.watching())
            .await
            .expect("the hub never watched");
        assert_ne!(hub.oldest(), 0, "watching, but the window is not open");
        // Outside the root, or from before the hub watched: not served here.
        assert!(hub.watch("/other/", 0).is_none());
        assert!(hub.watch("/h/a/", hub.oldest() - 1).is_none());

        let a1 = etcd.put("/h/a/1", "x").await.unwrap();
        let b1 = etcd.put("/h/b/1", "y").await.unwrap();
        // Wait until the hub saw both.
        let mut probe = hub.watch("/h/", a1).expect("served");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.extend(next_events(&mut probe).await);
        }
        assert_eq!(
            seen,
            vec![("/h/a/1".to_string(), a1), ("/h/b/1".to_string(), b1)]
        );

        // A reader from a1: the missed event under its prefix, then the new ones, filtered.
        let mut a = hub.watch("/h/a/", a1).expect("served");
        assert_eq!(next_events(&mut a).await, vec![("/h/a/1".to_string(), a1)]);
        etcd.put("/h/b/2", "z").await.unwrap();
        let a2 = etcd.put("/h/a/2", "w").await.unwrap();
        etcd.delete("/h/a/1").await.unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            got.extend(next_events(&mut a).await);
        }
        assert_eq!(got[0], ("/h/a/2".to_string(), a2));
        assert_eq!(got[1].0, "/h/a/1");
        // A reader from after a2 does not see a2 again.
        let mut late = hub.watch("/h/a/", a2 + 1).expect("served");
        assert_eq!(next_events(&mut late).await, vec![got[1].clone()]);

        // A small window: old revisions fall out and go to etcd instead.
        let small = WatchHub::start(
            etcd.clone(),
            "/h/",
            HubLimits {
                events: 2,
                bytes: 1 << 20,
            },
            cancel.clone(),
        );
        small.watching().await;
        let first = small.oldest();
        // One put at a time, each seen before the next: the window drops whole batches, and puts made
        // before the hub's etcd watch opened would come as one batch that never falls out.
        let mut seen = small.watch("/h/c/", 0).expect("served");
        for i in 0..5 {
            let rev = etcd.put(format!("/h/c/{i}"), "v").await.unwrap();
            assert_eq!(
                next_events(&mut seen).await,
                vec![(format!("/h/c/{i}"), rev)]
            );
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while small.oldest() <= first + 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the window never moved"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(small.watch("/h/c/", first).is_none());
        assert!(small.watch("/h/c/", small.oldest()).is_some());
        cancel.cancel();
    }
}
