//! The event recorder against a real etcd: repeats aggregate into one key, the per-node cap holds for
//! any input (keys written before a restart included), and what is recorded reaches etcd.

use std::time::Duration;

use hostlet_api::objects::Event;
use hostlet_api::KeyLayout;
use hostlet_controllers::events::{EventKind, EventRecorder};
use hostlet_runtime::testkit::TestEtcd;
use hostlet_runtime::Etcd;

async fn node_events(etcd: &Etcd, node: &str) -> Vec<Event> {
    let (kvs, _) = etcd
        .get_prefix(KeyLayout::default().events_prefix(node))
        .await
        .unwrap();
    kvs.iter()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_of_one_failure_update_one_event_and_its_count() {
    let member = TestEtcd::start().await;
    let etcd = member.connect().await;
    let rec = EventRecorder::new(etcd.clone(), KeyLayout::default(), "n1")
        .with_limits(1000, Duration::from_millis(200));
    for _ in 0..500 {
        rec.record_now(
            Some("web"),
            Some("app"),
            EventKind::Warning,
            "BackOff",
            "back-off 10s",
        );
    }
    // Another pod's same reason and message is another event.
    rec.record_now(
        Some("db"),
        Some("app"),
        EventKind::Warning,
        "BackOff",
        "back-off 10s",
    );
    assert!(rec.flush(Duration::from_secs(20)).await, "flushed");
    let mut evs = node_events(&etcd, "n1").await;
    evs.sort_by_key(|e| e.count);
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[0].count, 1);
    assert_eq!(evs[1].count, 500);
    assert!(evs[1].last_timestamp >= evs[1].first_timestamp);
    // A later repeat updates the same key again.
    rec.record(
        Some("web"),
        Some("app"),
        EventKind::Warning,
        "BackOff",
        "back-off 10s",
    )
    .await;
    assert!(rec.flush(Duration::from_secs(20)).await);
    let evs = node_events(&etcd, "n1").await;
    assert_eq!(evs.len(), 2);
    assert!(evs.iter().any(|e| e.count == 501), "{evs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_events_never_exceed_the_cap_counting_keys_from_before() {
    let member = TestEtcd::start().await;
    let etcd = member.connect().await;
    let keys = KeyLayout::default();
    // Keys an earlier run of the agent left.
    for i in 0..30u64 {
        etcd.put(keys.event("n2", 1_000 + u128::from(i), i), b"{}")
            .await
            .unwrap();
    }
    let rec = EventRecorder::new(etcd.clone(), keys.clone(), "n2")
        .with_limits(20, Duration::from_millis(200));
    for i in 0..300 {
        rec.record_now(
            None,
            None,
            EventKind::Warning,
            "ManifestFileError",
            format!("bad {i}"),
        );
    }
    assert!(rec.flush(Duration::from_secs(30)).await, "flushed");
    let left = etcd
        .keys_with_prefix(keys.events_prefix("n2"))
        .await
        .unwrap();
    assert_eq!(left.len(), 20, "the cap holds");
    let evs = node_events(&etcd, "n2").await;
    assert!(
        evs.iter().all(|e| e.message.starts_with("bad ")),
        "the oldest went first: {evs:?}"
    );
    assert!(
        evs.iter().any(|e| e.message == "bad 299"),
        "the newest is kept"
    );
}
