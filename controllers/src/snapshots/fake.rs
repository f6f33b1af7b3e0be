//! A world in memory behind [`SnapshotEffects`], and the snapshot controller's tests on it: the request
//! protocol, the stop, the schedule and policy changes, on tokio's paused clock.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{
    SnapshotRecord, SnapshotRequest, SnapshotRequestState, SnapshotStatus, Timestamp,
};
use hostlet_runtime::etcd::EtcdError;
use hostlet_runtime::informer::Object;
use hostlet_runtime::store::{Event, Writer};
use tokio::time::Instant;

use super::controller::SnapshotCaches;
use super::effects::SnapshotEffects;
use super::policy::{EffectivePolicy, PolicyStore};
use super::remote::RemoteError;
use super::request::TakeProgress;
use super::schedule::Schedule;
use super::scheduler::SnapshotError;
use super::sync::SyncError;
use crate::events::EventKind;

/// How the next snapshot goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Taken,
    Busy,
    /// It never ends (a stream that hangs).
    Hangs,
}

/// What happened to the request key, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyOp {
    Write(Box<SnapshotRequest>),
    Delete,
}

#[derive(Debug)]
pub struct World {
    pub policy: EffectivePolicy,
    /// What the policy keys say now: the policy a refresh puts in force.
    pub keys_say: EffectivePolicy,
    pub outcome: Outcome,
    /// The catalogue check fails this many more times before it succeeds.
    pub catalogue_fails: u32,
    pub catalogue_checks: u32,
    /// `(name, on demand, when)`.
    pub takes: Vec<(String, bool, SystemTime)>,
    pub key: Vec<KeyOp>,
    pub syncs: u32,
    pub prunes: Vec<u32>,
    pub counted: Vec<&'static str>,
    pub events: Vec<(String, String)>,
}

pub fn every(period: &str) -> EffectivePolicy {
    EffectivePolicy {
        schedule: Schedule::parse(&format!("@every {period}")).unwrap(),
        retention: 5,
        compress: false,
        disabled: false,
        s3: None,
        s3_retention: 0,
    }
}

pub struct FakeSnapshots {
    world: Mutex<World>,
    origin: (Instant, SystemTime),
}

impl FakeSnapshots {
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub const NODE: &str = "n1";

impl SnapshotEffects for FakeSnapshots {
    fn node(&self) -> &str {
        NODE
    }

    fn request_key(&self) -> String {
        format!("/hostlet/hosts/{NODE}/requests/snapshot")
    }

    fn jitter(&self) -> Duration {
        Duration::ZERO
    }

    fn now(&self) -> SystemTime {
        self.origin.1 + self.origin.0.elapsed()
    }

    fn policy(&self) -> EffectivePolicy {
        self.world().policy.clone()
    }

    async fn refresh_policy(&self, _cluster: &PolicyStore, _node: &PolicyStore) -> bool {
        let mut w = self.world();
        let changed = w.policy != w.keys_say;
        w.policy = w.keys_say.clone();
        changed
    }

    async fn reconcile_catalogue(&self) -> Result<(), EtcdError> {
        let mut w = self.world();
        w.catalogue_checks += 1;
        if w.catalogue_fails > 0 {
            w.catalogue_fails -= 1;
            return Err(EtcdError::NoEndpoints);
        }
        Ok(())
    }

    async fn count_remote(&self) -> Result<Option<usize>, RemoteError> {
        Ok(None)
    }

    async fn take(
        &self,
        name: &str,
        on_demand: bool,
        mut progress: impl FnMut(TakeProgress) + Send,
    ) -> Result<SnapshotRecord, SnapshotError> {
        let now = self.now();
        let outcome = {
            let mut w = self.world();
            w.takes.push((name.to_string(), on_demand, now));
            w.outcome
        };
        match outcome {
            Outcome::Busy => Err(SnapshotError::Busy),
            Outcome::Hangs => {
                progress(TakeProgress::Received(1));
                std::future::pending().await
            }
            Outcome::Taken => {
                progress(TakeProgress::Received(4096));
                Ok(SnapshotRecord {
                    name: name.to_string(),
                    node: NODE.into(),
                    file: format!("{name}-{NODE}.db"),
                    size: 4096,
                    sha256: String::new(),
                    revision: 42,
                    created: Timestamp(now),
                    duration_seconds: 0.1,
                    compressed: false,
                    encrypted: false,
                    on_demand,
                    status: SnapshotStatus::Successful,
                    error: None,
                    local: true,
                    remote: None,
                })
            }
        }
    }

    async fn sync_remote(
        &self,
        _policy: &EffectivePolicy,
        _upload: bool,
    ) -> Result<Vec<String>, SyncError> {
        self.world().syncs += 1;
        Ok(vec![])
    }

    async fn prune(&self, retention: u32) -> Result<Vec<String>, EtcdError> {
        self.world().prunes.push(retention);
        Ok(vec![])
    }

    async fn write_request(&self, req: &SnapshotRequest) -> Result<(), EtcdError> {
        self.world().key.push(KeyOp::Write(Box::new(req.clone())));
        Ok(())
    }

    async fn delete_request(&self) -> Result<(), EtcdError> {
        self.world().key.push(KeyOp::Delete);
        Ok(())
    }

    fn count(&self, result: &'static str) {
        self.world().counted.push(result);
    }

    async fn event(&self, _kind: EventKind, reason: &'static str, message: String) {
        self.world().events.push((reason.to_string(), message));
    }
}

/// The caches the controller reads; the request key's is fed by hand.
pub struct Caches {
    pub caches: SnapshotCaches,
    requests: Writer<String, Object<SnapshotRequest>>,
    _policies: (
        Writer<String, Object<hostlet_api::objects::SnapshotPolicy>>,
        Writer<String, Object<hostlet_api::objects::SnapshotPolicy>>,
    ),
}

fn ready<V>() -> Writer<String, V> {
    let mut w = Writer::new();
    w.apply_all([Event::Init, Event::InitDone]);
    w
}

impl Caches {
    pub fn new() -> Caches {
        let (policy, node_policy, requests) = (ready(), ready(), ready());
        Caches {
            caches: SnapshotCaches {
                policy: policy.store(),
                node_policy: node_policy.store(),
                requests: requests.store(),
            },
            requests,
            _policies: (policy, node_policy),
        }
    }

    /// The request key's value as the informer would decode it.
    pub fn request(&mut self, value: Result<SnapshotRequest, String>) {
        let key = format!("/hostlet/hosts/{NODE}/requests/snapshot");
        let value = value.map_err(|e| hostlet_runtime::informer::Invalid {
            error: Arc::new(std::io::Error::other(e)),
            raw: vec![],
        });
        self.requests.apply(Event::Apply(
            key.clone(),
            Arc::new(Object::fresh(key, value)),
        ));
    }
}

pub fn fake(policy: EffectivePolicy) -> Arc<FakeSnapshots> {
    Arc::new(FakeSnapshots {
        world: Mutex::new(World {
            keys_say: policy.clone(),
            policy,
            outcome: Outcome::Taken,
            catalogue_fails: 0,
            catalogue_checks: 0,
            takes: vec![],
            key: vec![],
            syncs: 0,
            prunes: vec![],
            counted: vec![],
            events: vec![],
        }),
        origin: (Instant::now(), Timestamp::from_unix(1_800_000_000).0),
    })
}

/// The states written into the request key, in order, with `D` for its deletion.
pub fn key_story(w: &World) -> Vec<String> {
    w.key
        .iter()
        .map(|op| match op {
            KeyOp::Write(r) => r
                .state
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_else(|| "fresh".into()),
            KeyOp::Delete => "D".into(),
        })
        .collect()
}

/// The last answer written.
pub fn last_answer(w: &World) -> Option<SnapshotRequest> {
    w.key.iter().rev().find_map(|op| match op {
        KeyOp::Write(r)
            if r.state
                .as_ref()
                .is_some_and(SnapshotRequestState::is_answer) =>
        {
            Some((**r).clone())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use hostlet_runtime::Action;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::snapshots::controller::{Context, SnapshotKey};
    use crate::snapshots::retention::SCHEDULED_NAME;
    use crate::snapshots::scheduler::STOP_GRACE;

    fn request(name: Option<&str>, id: &str) -> SnapshotRequest {
        SnapshotRequest {
            name: name.map(str::to_string),
            id: Some(id.to_string()),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_answered_running_then_done_and_then_removed() {
        let fx = fake(every("1h"));
        let mut c = Caches::new();
        c.request(Ok(request(Some("pre-upgrade"), "r1")));
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.reconcile(SnapshotKey::Request).await.unwrap();
        let w = fx.world();
        let story = key_story(&w);
        assert_eq!(
            story.first().map(String::as_str),
            Some("running"),
            "{story:?}"
        );
        assert_eq!(&story[story.len() - 2..], ["done", "D"], "{story:?}");
        assert!(
            story[1..story.len() - 2].iter().all(|s| s == "running"),
            "only progress between: {story:?}"
        );
        assert_eq!(w.takes.len(), 1);
        assert_eq!((w.takes[0].0.as_str(), w.takes[0].1), ("pre-upgrade", true));
        let answer = last_answer(&w).unwrap();
        assert_eq!(
            answer.id.as_deref(),
            Some("r1"),
            "the requester's id comes back"
        );
        assert_eq!(answer.record.map(|r| r.revision), Some(42));
        assert_eq!(answer.progress_bytes, Some(4096));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_while_a_snapshot_runs_is_answered_busy() {
        let fx = fake(every("1h"));
        fx.world().outcome = Outcome::Busy;
        let mut c = Caches::new();
        c.request(Ok(request(None, "r2")));
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.reconcile(SnapshotKey::Request).await.unwrap();
        let w = fx.world();
        assert_eq!(
            w.takes[0].0, "on-demand",
            "the name when the request gives none"
        );
        let answer = last_answer(&w).unwrap();
        assert_eq!(answer.state, Some(SnapshotRequestState::Busy));
        assert!(answer.error.unwrap_or_default().contains("busy"));
        assert_eq!(key_story(&w).last().map(String::as_str), Some("D"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_name_or_value_is_refused_and_the_answer_stays_in_the_key() {
        for value in [
            Ok(request(Some("../../evil"), "r3")),
            Err("not a mapping".to_string()),
        ] {
            let fx = fake(every("1h"));
            let mut c = Caches::new();
            c.request(value.clone());
            let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
            run.reconcile(SnapshotKey::Request).await.unwrap();
            let w = fx.world();
            assert!(w.takes.is_empty(), "{value:?}: a snapshot was taken");
            assert_eq!(
                key_story(&w),
                vec!["failed"],
                "{value:?}: kept for the operator"
            );
            assert_eq!(w.counted, vec!["refused"]);
            assert_eq!(w.events.len(), 1);
            assert_eq!(w.events[0].0, "InvalidSnapshotRequest");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_left_running_by_an_earlier_agent_is_answered_failed() {
        let fx = fake(every("1h"));
        let mut c = Caches::new();
        c.request(Ok(SnapshotRequest {
            state: Some(SnapshotRequestState::Running),
            ..request(None, "from-before")
        }));
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.reconcile(SnapshotKey::Request).await.unwrap();
        let w = fx.world();
        assert!(w.takes.is_empty());
        assert_eq!(key_story(&w), vec!["failed", "D"]);
        let answer = last_answer(&w).unwrap();
        assert!(answer.error.unwrap_or_default().starts_with("interrupted"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_during_a_snapshot_answers_its_request_once_the_grace_is_over() {
        let fx = fake(every("1h"));
        fx.world().outcome = Outcome::Hangs;
        let mut c = Caches::new();
        c.request(Ok(request(None, "r4")));
        let stop = CancellationToken::new();
        let run = Arc::new(Context::new(fx.clone(), c.caches.clone(), stop.clone()));
        let task = tokio::spawn({
            let run = run.clone();
            async move { run.reconcile(SnapshotKey::Request).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(last_answer(&fx.world()).is_none(), "answered while it ran");
        let stopped = Instant::now();
        stop.cancel();
        task.await.unwrap().unwrap();
        assert_eq!(stopped.elapsed(), STOP_GRACE);
        let w = fx.world();
        let answer = last_answer(&w).unwrap();
        assert_eq!(answer.state, Some(SnapshotRequestState::Failed));
        assert!(answer.error.unwrap_or_default().starts_with("interrupted"));
        assert_eq!(key_story(&w).last().map(String::as_str), Some("D"));
        assert_eq!(w.counted, vec!["failure"]);
    }

    /// Runs the timer the way the controller's queue would: each requeue is slept, then reconciled.
    async fn run_schedule(run: &Context<FakeSnapshots>, span: Duration) {
        let end = Instant::now() + span;
        loop {
            let Ok(Action::Requeue(d)) = run.reconcile(SnapshotKey::Scheduled).await else {
                panic!("the timer stopped");
            };
            if Instant::now() + d > end {
                return;
            }
            tokio::time::sleep(d).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_snapshots_keep_the_schedules_cadence() {
        let fx = fake(every("1h"));
        let c = Caches::new();
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.prepare().await;
        let start = fx.now();
        run_schedule(&run, Duration::from_secs(3 * 3600 + 60)).await;
        let w = fx.world();
        let at: Vec<u64> = w
            .takes
            .iter()
            .map(|(name, on_demand, t)| {
                assert_eq!((name.as_str(), *on_demand), (SCHEDULED_NAME, false));
                t.duration_since(start).unwrap().as_secs()
            })
            .collect();
        assert_eq!(at, vec![3600, 7200, 10800]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_change_replans_the_timer_and_prunes_once() {
        let fx = fake(every("1h"));
        let c = Caches::new();
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.prepare().await;
        // Nothing changed: nothing to prune.
        run.reconcile(SnapshotKey::Prune).await.unwrap();
        assert!(fx.world().prunes.is_empty());
        tokio::time::sleep(Duration::from_secs(600)).await;
        fx.world().keys_say = EffectivePolicy {
            retention: 2,
            ..every("15m")
        };
        run.reconcile(SnapshotKey::Prune).await.unwrap();
        run.reconcile(SnapshotKey::Prune).await.unwrap();
        {
            let w = fx.world();
            assert_eq!(w.prunes, vec![2], "pruned once, under the new retention");
            assert_eq!(w.syncs, 1);
        }
        // The new schedule counts from the change, not from the start.
        let changed = fx.now();
        run_schedule(&run, Duration::from_secs(16 * 60)).await;
        let w = fx.world();
        assert_eq!(w.takes.len(), 1, "{:?}", w.takes);
        assert_eq!(
            w.takes[0].2.duration_since(changed).unwrap().as_secs(),
            15 * 60
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_start_waits_for_the_catalogue_check_to_succeed() {
        let fx = fake(every("1h"));
        fx.world().catalogue_fails = 3;
        let c = Caches::new();
        let run = Context::new(fx.clone(), c.caches.clone(), CancellationToken::new());
        run.prepare().await;
        assert_eq!(fx.world().catalogue_checks, 4);
    }
}
