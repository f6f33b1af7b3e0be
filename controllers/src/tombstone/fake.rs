//! A world in memory behind [`RejoinEffects`], and the rejoin controller's tests on it: its clocks on
//! tokio's paused time, every decision in milliseconds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::Stream;
use hostlet_runtime::informer::Object;
use hostlet_runtime::store::{Event, Writer};
use hostlet_runtime::Store;
use tokio::time::Instant;

use super::effects::RejoinEffects;
use super::handler::{PeersSay, RejoinCause};
use super::rejoin::RejoinTarget;

/// What the fake shows the controller, and what it was asked.
#[derive(Debug, Default)]
pub struct World {
    pub request: bool,
    pub removed_by_etcd: bool,
    pub left_out_of_cache: bool,
    /// What a fresh look says: `Some(true)` left out, `Some(false)` listed, `None` the look fails.
    pub fresh_look: Option<bool>,
    pub another_cluster: bool,
    /// The answers of the next rounds of asking; `Nothing` once they run out.
    pub peers: VecDeque<PeersSay>,
    /// When each round of asking happened.
    pub asks: Vec<Instant>,
    /// Whether a rejoin can be prepared now.
    pub can_prepare: bool,
    pub performed: Vec<RejoinCause>,
    pub cleared: u32,
}

#[derive(Clone)]
pub struct FakeRejoin {
    world: Arc<Mutex<World>>,
    request: Store<String, Object<String>>,
    _request_writer: Arc<Writer<String, Object<String>>>,
}

impl FakeRejoin {
    pub fn new(world: World) -> FakeRejoin {
        let mut w = Writer::new();
        w.apply_all([Event::Init, Event::InitDone]);
        FakeRejoin {
            world: Arc::new(Mutex::new(world)),
            request: w.store(),
            _request_writer: Arc::new(w),
        }
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub const ID: u64 = 0xabc;

impl RejoinEffects for FakeRejoin {
    fn member_id(&self) -> u64 {
        ID
    }

    fn request_store(&self) -> Store<String, Object<String>> {
        self.request.clone()
    }

    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::pending()
    }

    async fn requested(&self) -> Option<RejoinCause> {
        self.world()
            .request
            .then(|| RejoinCause::new("asked to rejoin through the request key"))
    }

    async fn removed_by_etcd(&self) -> Option<RejoinCause> {
        self.world()
            .removed_by_etcd
            .then(|| RejoinCause::new("etcd exited saying the cluster removed this member"))
    }

    fn left_out_of_cache(&self) -> bool {
        self.world().left_out_of_cache
    }

    fn another_cluster_in_sight(&self) -> bool {
        self.world().another_cluster
    }

    async fn confirm_removed_from_list(&self) -> Option<RejoinCause> {
        (self.world().fresh_look == Some(true))
            .then(|| RejoinCause::new(format!("member {ID:x} was removed from the cluster")))
    }

    async fn ask_peers(&self) -> PeersSay {
        let mut w = self.world();
        w.asks.push(Instant::now());
        w.peers.pop_front().unwrap_or(PeersSay::Nothing)
    }

    async fn perform(&self, cause: RejoinCause) -> Option<RejoinTarget> {
        let mut w = self.world();
        w.performed.push(cause);
        w.can_prepare.then(|| RejoinTarget {
            server: "https://voter:10250".into(),
            token: "t".into(),
        })
    }

    async fn clear_request(&self) {
        self.world().cleared += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hostlet_runtime::{Action, Metrics};

    use super::*;
    use crate::tombstone::controller::{
        RejoinController, RejoinOutcome, ASK_PEERS_EVERY, ASK_PEERS_GAP, CONFIRM_AFTER,
    };

    fn controller(world: World) -> (FakeRejoin, Arc<RejoinController<FakeRejoin>>, RejoinOutcome) {
        let fake = FakeRejoin::new(World {
            can_prepare: true,
            ..world
        });
        let (c, outcome) = RejoinController::with_effects(fake.clone(), &Metrics::new());
        (fake, c, outcome)
    }

    /// Reconciles the way the controller's queue would, with no trigger: at each requeue.
    async fn run_for(c: &RejoinController<FakeRejoin>, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            match c.reconcile().await {
                Action::Requeue(d) => tokio::time::sleep(d.max(Duration::from_millis(1))).await,
                _ => return,
            }
        }
    }

    fn removed_by(n: u32) -> PeersSay {
        PeersSay::Removed {
            by: format!("http://10.0.0.{n}:2379"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cache_that_leaves_the_member_out_is_believed_only_when_a_fresh_look_a_moment_later_agrees(
    ) {
        let (fake, c, mut outcome) = controller(World {
            left_out_of_cache: true,
            fresh_look: Some(true),
            ..World::default()
        });
        let t0 = Instant::now();
        match c.reconcile().await {
            Action::Requeue(d) => assert_eq!(d, CONFIRM_AFTER, "looks again a moment later"),
            other => panic!("{other:?}"),
        }
        assert!(
            fake.world().performed.is_empty(),
            "believed the cache alone"
        );
        run_for(&c, Duration::from_secs(5)).await;
        let target = outcome.try_recv().expect("no rejoin");
        assert_eq!(target.server, "https://voter:10250");
        let w = fake.world();
        assert_eq!(w.performed.len(), 1);
        assert!(w.performed[0]
            .reason
            .contains("was removed from the cluster"));
        assert!(Instant::now() - t0 >= CONFIRM_AFTER);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_look_that_fails_or_disagrees_proves_nothing() {
        for fresh_look in [None, Some(false)] {
            let (fake, c, mut outcome) = controller(World {
                left_out_of_cache: true,
                fresh_look,
                ..World::default()
            });
            run_for(&c, Duration::from_secs(30)).await;
            assert!(outcome.try_recv().is_err(), "{fresh_look:?}: rejoined");
            assert!(fake.world().performed.is_empty(), "{fresh_look:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_cluster_in_sight_asks_at_once_and_two_rounds_that_agree_decide() {
        let (fake, c, mut outcome) = controller(World {
            another_cluster: true,
            peers: VecDeque::from([removed_by(2), removed_by(3)]),
            ..World::default()
        });
        let t0 = Instant::now();
        run_for(&c, Duration::from_secs(5)).await;
        outcome.try_recv().expect("no rejoin");
        let w = fake.world();
        assert_eq!(w.asks.len(), 2, "{:?}", w.asks);
        assert_eq!(w.asks[0], t0, "asked at once");
        assert_eq!(
            w.asks[1] - w.asks[0],
            CONFIRM_AFTER,
            "the second round a moment later"
        );
        let cause = &w.performed[0];
        assert_eq!(
            cause.by.as_deref(),
            Some("http://10.0.0.3:2379"),
            "through the member that told last"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_that_disagree_prove_nothing_and_asking_rests_between_rounds() {
        let (fake, c, mut outcome) = controller(World {
            another_cluster: true,
            peers: VecDeque::from([removed_by(2), PeersSay::Nothing, removed_by(2)]),
            ..World::default()
        });
        run_for(&c, Duration::from_secs(60)).await;
        assert!(
            outcome.try_recv().is_err(),
            "rejoined on rounds that disagree"
        );
        let w = fake.world();
        assert!(w.performed.is_empty());
        // Prompted all the time, yet a first round at most every gap.
        for pair in w.asks.windows(2) {
            assert!(pair[1] - pair[0] >= CONFIRM_AFTER, "{:?}", w.asks);
        }
        let firsts = w.asks.len().div_ceil(2);
        assert!(
            firsts as u64 <= 60 / ASK_PEERS_GAP.as_secs() + 1,
            "{:?}",
            w.asks
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silence_is_asked_about_every_two_minutes_and_never_believed() {
        let (fake, c, mut outcome) = controller(World::default());
        run_for(&c, ASK_PEERS_EVERY * 5 + Duration::from_secs(1)).await;
        assert!(outcome.try_recv().is_err());
        let w = fake.world();
        assert_eq!(w.asks.len(), 5, "{:?}", w.asks);
        assert!(w.performed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_kept_until_the_rejoin_is_prepared() {
        let (fake, c, mut outcome) = controller(World {
            request: true,
            ..World::default()
        });
        fake.world().can_prepare = false;
        match c.reconcile().await {
            Action::Requeue(d) => assert_eq!(d, Duration::from_secs(5), "tried again soon"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            fake.world().cleared,
            0,
            "the request went with no rejoin prepared"
        );
        // The operator takes the request back meanwhile: a decided rejoin is not given up.
        fake.world().request = false;
        fake.world().can_prepare = true;
        tokio::time::advance(Duration::from_secs(5)).await;
        c.reconcile().await;
        outcome.try_recv().expect("no rejoin");
        {
            let w = fake.world();
            assert_eq!(w.performed.len(), 2);
            assert_eq!(w.performed[0], w.performed[1], "the same cause both times");
            assert_eq!(w.cleared, 1);
        }
        // Done: nothing more, whatever happens.
        fake.world().removed_by_etcd = true;
        assert!(matches!(c.reconcile().await, Action::AwaitChange));
        assert_eq!(fake.world().performed.len(), 2);
    }
}
