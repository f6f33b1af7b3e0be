//! The informers against a real etcd started by each test.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hostlet_runtime::informer::{EtcdListWatch, ListWatch, Page, WatchItem};
use hostlet_runtime::testkit::{eventually, TestEtcd};
use hostlet_runtime::{Etcd, EtcdError, Informer, MemberInformer, Metrics, Object, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

type TextStore = Store<String, Object<String>>;

fn text(_key: &str, v: &[u8]) -> Result<String, std::string::FromUtf8Error> {
    String::from_utf8(v.to_vec())
}

/// The prefix as etcd has it now: key → (value, mod revision).
async fn etcd_view(etcd: &Etcd, prefix: &str) -> BTreeMap<String, (Vec<u8>, i64)> {
    let (kvs, _) = etcd.get_prefix(prefix).await.unwrap();
    kvs.into_iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                (kv.value().to_vec(), kv.mod_revision()),
            )
        })
        .collect()
}

fn store_view(store: &TextStore) -> BTreeMap<String, (Vec<u8>, i64)> {
    store
        .entries()
        .into_iter()
        .map(|(k, o)| {
            let bytes = match &o.value {
                Ok(s) => s.as_bytes().to_vec(),
                Err(inv) => inv.raw.clone(),
            };
            (k, (bytes, o.mod_revision))
        })
        .collect()
}

async fn store_matches_etcd(store: &TextStore, etcd: &Etcd, prefix: &str) -> bool {
    store.is_ready() && store_view(store) == etcd_view(etcd, prefix).await
}

fn metric(m: &Metrics, line_start: &str) -> f64 {
    m.encode_text()
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line_start} not found"))
}

/// A little deterministic PRNG, so a failure can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_equals_a_fresh_get_prefix_after_10000_mixed_puts_and_deletes() {
    let etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    let prefix = "/hostlet/hosts/n1/pods/";
    // Some keys before the informer starts, and some outside its prefix.
    for i in 0..50 {
        etcd.put(format!("{prefix}pre-{i}"), format!("v{i}"))
            .await
            .unwrap();
    }
    etcd.put("/hostlet/hosts/n1/podsX", "outside")
        .await
        .unwrap();
    let metrics = Metrics::new();
    let informer = Informer::new("pods", etcd.clone(), prefix, text).with_metrics(&metrics);
    let store = informer.store();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));

    // Four writers, 2,500 operations each, over 400 keys: puts, overwrites and deletes interleave.
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let etcd = etcd.clone();
            tokio::spawn(async move {
                let mut rng = Lcg(w + 1);
                for op in 0..2500 {
                    let key = format!("{prefix}k{}", rng.next() % 400);
                    if rng.next() % 3 == 0 {
                        etcd.delete(&key).await.unwrap();
                    } else {
                        etcd.put(&key, format!("w{w}-op{op}")).await.unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    eventually("store equals etcd", Duration::from_secs(30), || {
        store_matches_etcd(&store, &etcd, prefix)
    })
    .await;
    assert!(store.get("/hostlet/hosts/n1/podsX").is_none());
    assert!(
        metric(
            &metrics,
            "hostlet_informer_events_total{informer=\"pods\",type=\"apply\"}"
        ) > 5000.0
    );
    assert!(
        metric(
            &metrics,
            "hostlet_informer_events_total{informer=\"pods\",type=\"delete\"}"
        ) > 100.0
    );
    assert_eq!(
        metric(
            &metrics,
            "hostlet_informer_relists_total{informer=\"pods\"}"
        ),
        0.0
    );
    shutdown.cancel();
    task.await.unwrap();
}

/// The real list/watch, with a switch that cuts the watch off (as a partition would) and holds new ones
/// back until it is switched on again.
struct Severable {
    inner: EtcdListWatch,
    connected: watch::Receiver<bool>,
}

impl ListWatch for Severable {
    type Watch = futures::stream::BoxStream<'static, Result<WatchItem, EtcdError>>;

    async fn list(&self, from: Option<&[u8]>, revision: i64) -> Result<Page, EtcdError> {
        self.inner.list(from, revision).await
    }

    async fn watch(&self, start_revision: i64) -> Result<Self::Watch, EtcdError> {
        use futures::StreamExt;
        let mut connected = self.connected.clone();
        let _ = connected.wait_for(|c| *c).await;
        let inner = self.inner.watch(start_revision).await?;
        let cut = async move {
            let _ = connected.wait_for(|c| !*c).await;
        };
        let cut_off = futures::stream::once(cut).map(|_| {
            Err(EtcdError::unavailable(
                "test",
                etcd_client::Error::WatchError("cut off by the test".into()),
            ))
        });
        // Whichever comes first: the real items, or the cut.
        Ok(futures::stream::select(inner, cut_off).boxed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_whose_revision_was_compacted_while_it_was_behind_relists() {
    let etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    let prefix = "/c/";
    for i in 0..20 {
        etcd.put(format!("{prefix}{i}"), "old").await.unwrap();
    }
    let metrics = Metrics::new();
    let informer = Informer::new("c", etcd.clone(), prefix, text).with_metrics(&metrics);
    let store = informer.store();
    let (connect, connected) = watch::channel(true);
    let lw = Severable {
        inner: EtcdListWatch::new(etcd.clone(), prefix),
        connected,
    };
    let shutdown = CancellationToken::new();
    let task = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { informer.run_with(&lw, shutdown).await })
    };
    eventually("first sync", Duration::from_secs(10), || {
        store_matches_etcd(&store, &etcd, prefix)
    })
    .await;

    // Cut off, the informer falls behind: keys change, some go, and history is compacted away.
    connect.send_replace(false);
    for i in 0..10 {
        etcd.delete(format!("{prefix}{i}")).await.unwrap();
    }
    for i in 10..30 {
        etcd.put(format!("{prefix}{i}"), "new").await.unwrap();
    }
    let rev = etcd.put("/elsewhere", "x").await.unwrap();
    etcd.client().compact(rev, None).await.unwrap();
    assert_eq!(store.len(), 20, "still the old view");
    connect.send_replace(true);

    eventually(
        "store equals etcd after the relist",
        Duration::from_secs(30),
        || store_matches_etcd(&store, &etcd, prefix),
    )
    .await;
    assert_eq!(store.len(), 20);
    assert!(store.get(&format!("{prefix}0")).is_none());
    assert_eq!(
        metric(&metrics, "hostlet_informer_relists_total{informer=\"c\"}"),
        1.0
    );
    // And it keeps watching after the relist.
    etcd.put(format!("{prefix}after"), "yes").await.unwrap();
    eventually("a write after the relist", Duration::from_secs(10), || {
        store_matches_etcd(&store, &etcd, prefix)
    })
    .await;
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_informer_recovers_by_itself_when_etcd_is_killed_and_restarted_mid_stream() {
    let mut etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    let prefix = "/r/";
    let metrics = Metrics::new();
    let informer = Informer::new("r", etcd.clone(), prefix, text).with_metrics(&metrics);
    let store = informer.store();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    store.wait_until_ready().await;

    // A writer that keeps going through the outage (its failed writes are retried).
    let writer = {
        let etcd = etcd.clone();
        tokio::spawn(async move {
            for i in 0..600 {
                let key = format!("{prefix}{}", i % 150);
                loop {
                    let r = if i % 7 == 0 {
                        etcd.delete(&key).await.map(|_| ())
                    } else {
                        etcd.put(&key, format!("v{i}")).await.map(|_| ())
                    };
                    if r.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };
    eventually("some writes seen", Duration::from_secs(10), || {
        let n = store.len();
        async move { n > 20 }
    })
    .await;
    etcd_proc.kill();
    tokio::time::sleep(Duration::from_millis(300)).await; // the outage lasts a moment
    etcd_proc.restart().await;
    writer.await.unwrap();

    eventually(
        "store equals etcd after the restart",
        Duration::from_secs(60),
        || store_matches_etcd(&store, &etcd, prefix),
    )
    .await;
    assert!(
        metric(
            &metrics,
            "hostlet_informer_events_total{informer=\"r\",type=\"error\"}"
        ) >= 1.0
    );
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_not_valid_yaml_or_json_becomes_an_invalid_entry() {
    use hostlet_api::{parse_manifest, ParseError, PodManifest};
    let etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    let prefix = "/hostlet/hosts/n1/pods/";
    let good = "version: v1beta1\nid: web\ncontainers:\n  - name: app\n    image: busybox:latest\n";
    let broken = "version: v1beta1\nid: [unclosed\ncontainers: {\n";
    etcd.put(format!("{prefix}web"), good).await.unwrap();
    etcd.put(format!("{prefix}broken"), broken).await.unwrap();
    etcd.put(
        format!("{prefix}json"),
        "{\"version\": \"v1beta1\", \"id\": ",
    )
    .await
    .unwrap();
    let metrics = Metrics::new();
    let informer: Informer<PodManifest> =
        Informer::new("pods", etcd.clone(), prefix, |_, v| parse_manifest(v))
            .with_metrics(&metrics);
    let store = informer.store();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    store.wait_until_ready().await;

    assert_eq!(store.len(), 3, "nothing dropped");
    let web = store.get(&format!("{prefix}web")).unwrap();
    assert_eq!(web.valid().map(|m| m.id.as_str()), Some("web"));
    for name in ["broken", "json"] {
        let obj = store.get(&format!("{prefix}{name}")).unwrap();
        let invalid = obj.invalid().expect("invalid entry");
        let parse = invalid
            .downcast_ref::<ParseError>()
            .expect("the parser's own error");
        assert!(parse.line.is_some(), "{name}: {parse}");
        assert!(!invalid.message().is_empty());
    }
    assert_eq!(
        store
            .get(&format!("{prefix}broken"))
            .unwrap()
            .invalid()
            .unwrap()
            .raw,
        broken.as_bytes()
    );
    assert_eq!(
        metric(
            &metrics,
            "hostlet_informer_events_total{informer=\"pods\",type=\"invalid\"}"
        ),
        2.0
    );

    // Fixed in place, the entry turns valid; the others are untouched.
    let rev = etcd
        .put(format!("{prefix}broken"), good.replace("web", "broken"))
        .await
        .unwrap();
    eventually("the fix is seen", Duration::from_secs(10), || {
        let o = store.get(&format!("{prefix}broken"));
        async move { o.is_some_and(|o| o.mod_revision == rev && o.valid().is_some()) }
    })
    .await;
    assert!(store
        .get(&format!("{prefix}json"))
        .unwrap()
        .invalid()
        .is_some());
    assert_eq!(
        store.get(&format!("{prefix}web")).unwrap().mod_revision,
        web.mod_revision
    );
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_member_informer_sees_a_member_added_and_removed() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    let metrics = Metrics::new();
    let informer = MemberInformer::new(etcd.clone())
        .with_local(first.endpoint())
        .with_period(Duration::from_millis(100))
        .with_metrics(&metrics)
        .with_endpoint_sync();
    let handle = informer.members();
    let members = handle.store().clone();
    let mut changes = members.subscribe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    members.wait_until_ready().await;
    assert_eq!(members.len(), 1);
    let me = members.state().pop().unwrap();
    assert_eq!(me.name, first.name());
    assert!(!me.is_learner);
    let me_id = me.id;
    eventually("the local member leads", Duration::from_secs(10), || {
        let l = handle.leadership();
        async move { l.local_leads() && l.local_id == me_id }
    })
    .await;

    let (second, id) = first.join(true).await;
    eventually(
        "the learner, started and answering",
        Duration::from_secs(20),
        || {
            let started = members
                .get(&id)
                .is_some_and(|m| m.is_learner && m.is_started());
            let answering = handle.statuses().get(id).is_some_and(|s| s.is_learner);
            async move { started && answering }
        },
    )
    .await;
    assert_eq!(members.get(&id).unwrap().name, second.name());
    // The learner never joins the client's endpoints.
    assert_eq!(etcd.endpoints(), vec![first.endpoint()]);

    etcd.member_remove(id).await.unwrap();
    eventually("the member gone", Duration::from_secs(10), || {
        let gone = !members.contains(&id);
        async move { gone }
    })
    .await;
    assert_eq!(members.len(), 1);
    // The change feed named the added and removed member.
    let mut seen = Vec::new();
    while changes.pending() > 0 {
        seen.extend(changes.next_batch().await.unwrap());
    }
    assert!(seen.contains(&id));
    assert!(
        metric(
            &metrics,
            "hostlet_informer_events_total{informer=\"members\",type=\"delete\"}"
        ) >= 1.0
    );
    shutdown.cancel();
    task.await.unwrap();
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_member_informer_looks_only_when_asked_and_status_moves_wake_no_store_reader() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    let informer = MemberInformer::new(etcd.clone())
        .with_local(first.endpoint())
        .with_pace(hostlet_runtime::Pace {
            slow: Duration::from_secs(3600),
            fast: Duration::from_millis(50),
            fast_for: Duration::ZERO,
        });
    let handle = informer.members();
    let mut changes = handle.store().subscribe();
    let mut leadership = handle.watch_leadership();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    handle.store().wait_until_ready().await;
    // The first look is in once the store is ready; its statuses follow within the same look.
    assert!(handle.refresh(Duration::from_secs(10)).await);
    let before = handle.statuses().local().unwrap().raft_index;
    leadership.mark_unchanged();
    while changes.pending() > 0 {
        changes.next_batch().await.unwrap();
    }

    for i in 0..20 {
        etcd.put(format!("/moves/{i}"), "x").await.unwrap();
    }
    // No look of its own within the slow period: the statuses stay as they were…
    assert_eq!(handle.statuses().local().unwrap().raft_index, before);
    // …until asked; the raft index moved, the identity did not.
    assert!(handle.refresh(Duration::from_secs(10)).await);
    let after = handle.statuses().local().unwrap().raft_index;
    assert!(after >= before + 20, "raft index {before} -> {after}");
    assert_eq!(
        changes.pending(),
        0,
        "a status move woke readers of identity"
    );
    assert!(
        !leadership.has_changed().unwrap(),
        "leadership did not change"
    );
    assert!(handle.leadership().local_leads());
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_are_shared_not_copied() {
    let etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    etcd.put("/s/a", "1").await.unwrap();
    let informer = Informer::new("s", etcd.clone(), "/s/", text);
    let a = informer.store();
    let b = a.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(informer.run(shutdown.clone()));
    a.wait_until_ready().await;
    let x = a.get("/s/a").unwrap();
    let y = b.get("/s/a").unwrap();
    assert!(Arc::ptr_eq(&x, &y));
    shutdown.cancel();
    task.await.unwrap();
}
