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

/// A worker's member request that does not parse, or asks for something unknown, is waited past with
/// one event per value written (however often the cache changes); a valid one ends the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_unreadable_member_request_is_said_once_per_value() {
    use std::sync::Arc;

    use hostlet_api::objects::{MemberAction, MemberRequest, Timestamp};
    use hostlet_runtime::store::{Event as StoreEvent, Writer};
    use hostlet_runtime::{Invalid, Object};
    use tokio_util::sync::CancellationToken;

    let member = TestEtcd::start().await;
    let etcd = member.connect().await;
    let rec = EventRecorder::new(etcd.clone(), KeyLayout::default(), "w1");
    let key = KeyLayout::default().member_request("w1");
    let object = |rev: i64, value: Result<MemberRequest, Invalid>| {
        Arc::new(Object {
            key: key.clone(),
            create_revision: 1,
            mod_revision: rev,
            version: rev,
            lease: 0,
            value,
        })
    };
    let garbage = |raw: &[u8]| {
        let error = serde_json::from_slice::<MemberRequest>(raw).unwrap_err();
        Err(Invalid {
            error: Arc::new(error),
            raw: raw.to_vec(),
        })
    };
    let request = |action: &str| MemberRequest {
        node: "w1".into(),
        action: MemberAction::from(action.to_string()),
        server: "https://127.0.0.1:1".into(),
        reason: String::new(),
        requested: Timestamp::now(),
    };
    let mut w: Writer<String, Object<MemberRequest>> = Writer::new();
    w.apply_all([
        StoreEvent::Init,
        StoreEvent::InitApply(key.clone(), object(2, garbage(b"{\"node\": "))),
        StoreEvent::InitDone,
    ]);
    let shutdown = CancellationToken::new();
    let task = hostlet_controllers::placement::worker::await_request(
        w.store(),
        rec.clone(),
        shutdown.clone(),
    );
    let said = |etcd: Etcd| async move {
        node_events(&etcd, "w1")
            .await
            .into_iter()
            .filter(|e| e.reason == "InvalidMemberRequest")
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while said(etcd.clone()).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another key under the prefix that does not parse either: said once too, and the first not again
    // (the cache changed, the value did not).
    let other = format!("{key}-other");
    let mut other_object = (*object(3, garbage(b"[]"))).clone();
    other_object.key = other.clone();
    w.apply(StoreEvent::Apply(other.clone(), Arc::new(other_object)));
    // A new value with an unknown action: one more event.
    w.apply(StoreEvent::Apply(
        key.clone(),
        object(4, Ok(request("dance"))),
    ));
    while said(etcd.clone()).await.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no event for the new values"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.apply(StoreEvent::Delete(other));
    w.apply(StoreEvent::Apply(
        key.clone(),
        object(5, Ok(request("join"))),
    ));
    let got = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("a valid request ends the wait")
        .unwrap();
    assert_eq!(got.map(|r| r.action), Some(MemberAction::Join));
    assert!(
        shutdown.is_cancelled(),
        "the agent is stopped to start as a joiner"
    );
    rec.flush(Duration::from_secs(5)).await;
    let events = said(etcd.clone()).await;
    assert_eq!(events.len(), 3, "{events:?}");
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains(&key) && m.contains("line 1 column")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("\"dance\"")),
        "{messages:?}"
    );
}
