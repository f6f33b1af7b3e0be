//! The snapshot scheduler against a real etcd: schedule, exact retention, policy changes without a restart,
//! on-demand requests, learners, failures and crash leftovers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::objects::{SnapshotRecord, SnapshotStatus};
use hostlet_api::KeyLayout;
use hostlet_controllers::caches::SnapshotCaches;
use hostlet_controllers::events::EventRecorder;
use hostlet_controllers::snapshots::policy::SnapshotSettings;
use hostlet_controllers::snapshots::request::{SnapshotRequest, SnapshotRequestState};
use hostlet_controllers::snapshots::retention::SnapshotName;
use hostlet_controllers::snapshots::scheduler::SnapshotScheduler;
use hostlet_runtime::testkit::{eventually, TestEtcd};
use hostlet_runtime::{Etcd, EtcdConfig, Metrics};
use tokio_util::sync::CancellationToken;

const NODE: &str = "snap-node";

struct Running {
    metrics: Metrics,
    etcd: Etcd,
    keys: KeyLayout,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start(
    etcd: &TestEtcd,
    local: EtcdConfig,
    dir: &Path,
    schedule: &str,
    retention: u32,
) -> Running {
    let client = etcd.connect().await;
    let metrics = Metrics::new();
    let keys = KeyLayout::default();
    let settings = SnapshotSettings {
        node: NODE.into(),
        dir: dir.to_path_buf(),
        keys: keys.clone(),
        schedule: schedule.into(),
        retention,
        compress: false,
        disabled: false,
        jitter: Duration::ZERO,
        local,
        s3: Default::default(),
        key: None,
        disk: None,
    };
    let events = EventRecorder::new(client.clone(), keys.clone(), NODE);
    let sched =
        Arc::new(SnapshotScheduler::new(settings, client.clone(), events, &metrics).unwrap());
    let shutdown = CancellationToken::new();
    let informers =
        hostlet_runtime::InformerFactory::new(client.clone(), metrics.clone(), shutdown.clone());
    let caches = SnapshotCaches::start(&informers, &keys, NODE);
    let controller = hostlet_controllers::snapshots::controller::SnapshotController::new(
        sched.clone(),
        caches,
        &metrics,
    );
    let task = hostlet_runtime::spawn(Arc::new(controller), shutdown.clone());
    Running {
        metrics,
        etcd: client,
        keys,
        shutdown,
        task,
    }
}

impl Running {
    fn counter(&self, result: &str) -> u64 {
        let text = self.metrics.encode_text();
        let needle = format!("hostlet_snapshots_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    async fn records(&self) -> Vec<SnapshotRecord> {
        let (kvs, _) = self
            .etcd
            .get_prefix(self.keys.node_snapshots_prefix(NODE))
            .await
            .unwrap();
        kvs.iter()
            .map(|kv| serde_json::from_slice(kv.value()).unwrap())
            .collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn every_two_seconds_keeps_exactly_retention_and_follows_policy_changes() {
    let etcd = TestEtcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snapshots");
    std::fs::create_dir_all(&snaps).unwrap();
    // A crash in the middle of a snapshot left this behind.
    std::fs::write(snaps.join(format!("etcd-snapshot-{NODE}-1.part")), b"half").unwrap();
    let r = start(&etcd, etcd.config(), &snaps, "@every 2s", 3).await;

    eventually(
        ".part cleaned at start",
        Duration::from_secs(10),
        || async { !files(&snaps).iter().any(|f| f.ends_with(".part")) },
    )
    .await;
    eventually(
        "5 snapshots taken and exactly 3 kept",
        Duration::from_secs(40),
        || async {
            r.counter("success") >= 5 && files(&snaps).len() == 3 && r.records().await.len() == 3
        },
    )
    .await;
    let kept = files(&snaps);
    let records = r.records().await;
    let newest: u64 = kept
        .iter()
        .filter_map(|f| SnapshotName::parse(f, NODE))
        .map(|n| n.unix)
        .max()
        .unwrap();
    let oldest_kept: u64 = kept
        .iter()
        .filter_map(|f| SnapshotName::parse(f, NODE))
        .map(|n| n.unix)
        .min()
        .unwrap();
    assert!(newest >= oldest_kept + 2, "{kept:?}");
    for rec in &records {
        assert_eq!(rec.status, SnapshotStatus::Successful);
        assert!(
            kept.contains(&rec.file),
            "record {} has no file in {kept:?}",
            rec.file
        );
    }

    // Retention 2 through the policy key, no restart.
    r.etcd
        .put(r.keys.snapshot_policy(), r#"{"retention": 2}"#)
        .await
        .unwrap();
    eventually(
        "2 files and 2 records after the policy change",
        Duration::from_secs(20),
        || async { files(&snaps).len() == 2 && r.records().await.len() == 2 },
    )
    .await;
    r.stop().await;
}

#[tokio::test]
async fn on_demand_request_is_answered_recorded_and_removed() {
    let etcd = TestEtcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let r = start(&etcd, etcd.config(), dir.path(), "0 0 1 1 *", 5).await;
    let key = r.keys.snapshot_request(NODE);
    let (_w, mut stream) = r.etcd.watch_prefix(&key, 0).await.unwrap();
    r.etcd
        .put(&key, r#"{"name": "pre-upgrade", "id": "t1"}"#)
        .await
        .unwrap();
    let mut answer: Option<SnapshotRequest> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Ok(Ok(Some(resp))) = tokio::time::timeout_at(deadline, stream.message()).await {
        for ev in resp.events() {
            if let Some(kv) = ev.kv() {
                if let Ok(req) = serde_json::from_slice::<SnapshotRequest>(kv.value()) {
                    if req.state.as_ref().is_some_and(|s| s.is_answer()) {
                        answer = Some(req);
                    }
                }
            }
        }
        if answer.is_some() {
            break;
        }
    }
    let answer = answer.expect("an answer in the request key");
    assert_eq!(answer.state, Some(SnapshotRequestState::Done), "{answer:?}");
    let rec = answer.record.unwrap();
    assert!(rec.file.starts_with(&format!("pre-upgrade-{NODE}-")));
    assert!(rec.on_demand);
    assert!(dir.path().join(&rec.file).is_file());
    eventually("request key deleted", Duration::from_secs(10), || async {
        r.etcd.get(&key).await.unwrap().is_none()
    })
    .await;
    assert_eq!(r.records().await.len(), 1);
    r.stop().await;
}

#[tokio::test]
async fn a_learner_takes_no_snapshot_and_says_why() {
    let etcd = TestEtcd::start().await;
    let (learner, _id) = etcd.join(true).await;
    let dir = tempfile::tempdir().unwrap();
    let r = start(&etcd, learner.config(), dir.path(), "@every 1s", 5).await;
    eventually("a skipped snapshot", Duration::from_secs(20), || async {
        r.counter("skipped") >= 1
    })
    .await;
    assert_eq!(r.counter("success"), 0);
    assert!(files(dir.path()).is_empty());
    eventually(
        "a SnapshotSkipped event that says why",
        Duration::from_secs(20),
        || async {
            let (events, _) = r.etcd.get_prefix(r.keys.events_prefix(NODE)).await.unwrap();
            events.iter().any(|kv| {
                let e = String::from_utf8_lossy(kv.value());
                e.contains("SnapshotSkipped") && e.contains("learner")
            })
        },
    )
    .await;
    r.stop().await;
}

#[tokio::test]
async fn unwritable_dir_records_the_failure_and_the_next_run_retries() {
    let etcd = TestEtcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let r = start(
        &etcd,
        etcd.config(),
        &blocker.join("snapshots"),
        "@every 1s",
        5,
    )
    .await;
    eventually("two failed attempts", Duration::from_secs(20), || async {
        r.counter("failure") >= 2
    })
    .await;
    let records = r.records().await;
    assert!(!records.is_empty());
    for rec in &records {
        assert_eq!(rec.status, SnapshotStatus::Failed);
        assert!(
            rec.error.as_deref().unwrap_or("").contains("not-a-dir"),
            "{rec:?}"
        );
    }
    // The agent is fine: the etcd client still works and the scheduler still runs.
    assert!(!r.task.is_finished());
    r.stop().await;
}
