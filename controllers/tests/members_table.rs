//! The rows of `hostlet etcd members`, gathered from a real cluster.

mod learners_support;

use hostlet_api::objects::{LearnerProgress, LearnerRecord, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_controllers::members::{gather_member_rows, MEMBER_TABLE_HEADER};
use hostlet_runtime::testkit::TestEtcd;
use learners_support::{node_record, put_node, LateLearner};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_name_every_member_with_its_node_status_and_learner_progress() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    put_node(
        &etcd,
        &node_record("node-0", first.name(), &first.peer_url(), &first.endpoint()),
    )
    .await;
    let learner = LateLearner::add(&etcd).await;
    let record = LearnerRecord {
        name: String::new(),
        added: Timestamp::from_unix(1_800_000_000),
        applied_index: 0,
        snapshot_bytes_received: 0,
        last_progress: Timestamp::from_unix(1_800_000_000),
        bytes_sent: 4096,
        receiving_snapshot: false,
    };
    let mut progress = LearnerProgress::default();
    progress
        .learners
        .insert(format!("{:x}", learner.id), record.clone());
    etcd.put(
        KeyLayout::default().learner_progress(),
        serde_json::to_vec(&progress).unwrap(),
    )
    .await
    .unwrap();

    let rows = gather_member_rows(&etcd, &KeyLayout::default())
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let voter = rows.iter().find(|r| r.role == "voter").unwrap();
    assert_eq!(voter.name, first.name());
    assert_eq!(voter.node.as_deref(), Some("node-0"));
    assert_eq!(voter.client_url, first.endpoint());
    assert_eq!(voter.peer_url, first.peer_url());
    assert!(voter.leader);
    assert!(voter.applied_index.is_some_and(|i| i > 0));
    assert!(voter.db_size.is_some_and(|b| b > 0));
    assert!(voter.learner_progress.is_none());

    let l = rows.iter().find(|r| r.role == "learner").unwrap();
    assert_eq!(l.id, format!("{:x}", learner.id));
    assert_eq!(l.name, "");
    assert!(!l.leader);
    assert_eq!(l.status_error.as_deref(), Some("not started"));
    assert_eq!(l.learner_progress.as_ref(), Some(&record));

    let cells = l.cells(Timestamp::from_unix(1_800_000_005).0);
    assert_eq!(cells.len(), MEMBER_TABLE_HEADER.len());
    assert_eq!(cells[0], "(not started)");
    assert_eq!(cells[9], "applied 0, 4.0 KiB sent, last progress 5s ago");
    let json = serde_json::to_value(l).unwrap();
    assert_eq!(json["role"], "learner");
    assert_eq!(json["learnerProgress"]["bytesSent"], 4096);
    assert!(json.get("node").is_none());
}
