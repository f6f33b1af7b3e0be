//! The learner manager: on the etcd leader, promotes each learner as soon as etcd accepts, keeps
//! its progress in `/hostlet/etcd/learner-progress`, and removes one that made no progress for the stall
//! timeout. The decision is pure ([`stall`]); the controller ([`controller`]) acts through
//! [`crate::members::Cluster`].

pub mod controller;
pub mod metrics;
pub mod stall;

pub use controller::{LearnerConfig, LearnerManager, PromoteGate};
pub use metrics::LearnerMetrics;
pub use stall::{assess, Assessment};

/// Records when the learner `id` was added, into `/hostlet/etcd/learner-progress`, from the node that
/// added it: the leader's manager may first see it later (it was not leading, or not running), and its
/// promotion time is measured from the add. An earlier time already recorded wins. Best effort: a
/// failure is logged, and the manager then measures from when it first saw the learner.
pub async fn record_learner_added(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
    id: u64,
    added: std::time::SystemTime,
) {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    use hostlet_api::objects::{LearnerProgress, LearnerRecord, Timestamp};
    let key = keys.learner_progress();
    // A cluster that just took a member may refuse or time out a request for a moment: a failed
    // request is tried again (half a second apart) as a lost race is, rather than the record given up.
    for attempt in 0..10 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let current = match etcd.get(&key).await {
            Ok(kv) => kv,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the learner progress record yet");
                continue;
            }
        };
        let (mut progress, revision): (LearnerProgress, i64) = match &current {
            Some(kv) => (
                serde_json::from_slice(kv.value()).unwrap_or_default(),
                kv.mod_revision(),
            ),
            None => (LearnerProgress::default(), 0),
        };
        let at = Timestamp(added);
        let hex = format!("{id:x}");
        if progress.learners.get(&hex).is_some_and(|r| r.added <= at) {
            return;
        }
        progress
            .learners
            .entry(hex)
            .and_modify(|r| r.added = at)
            .or_insert_with(|| LearnerRecord {
                name: String::new(),
                added: at,
                applied_index: 0,
                snapshot_bytes_received: 0,
                last_progress: at,
                bytes_sent: 0,
                receiving_snapshot: false,
            });
        let value = serde_json::to_vec(&progress).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        match etcd.txn(txn).await {
            Ok(r) if r.succeeded() => return,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "cannot record when the learner was added yet");
                continue;
            }
        }
    }
    tracing::warn!(
        learner = %format!("{id:x}"),
        "cannot record when the learner was added: the leader measures its promotion from when it sees it"
    );
}
