//! A cluster in memory behind [`Upkeep`], and the controller's tests on it: every step the controller
//! takes, in the order it takes them, in milliseconds.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use hostlet_api::objects::Timestamp;
use hostlet_runtime::EtcdError;

use super::effects::{HeldLock, Members, Upkeep};
use super::plan::{AlarmKind, LockState, MemberObs, MemberStatus};
use crate::events::EventKind;

/// What the fake cluster holds and what was done to it.
#[derive(Debug, Default)]
pub struct World {
    pub local_id: u64,
    pub members: Vec<MemberObs>,
    pub alarms: Vec<(u64, AlarmKind)>,
    /// Who holds the maintenance lock.
    pub lock: Option<String>,
    pub revision: i64,
    pub compacted: i64,
    pub snapshot: bool,
    /// Each look at the members: whether it was asked fresh.
    pub looks: Vec<bool>,
    /// The operations the lock was taken for, in order.
    pub locked_for: Vec<String>,
    pub compactions: Vec<i64>,
    pub defrags: u32,
    pub moved_to: Vec<u64>,
    /// Events as (reason, message).
    pub events: Vec<(String, String)>,
    /// The alarm list never answers, as etcd's does not without quorum (until the request times out).
    pub alarms_hang: bool,
}

impl World {
    pub fn reasons(&self) -> Vec<&str> {
        self.events.iter().map(|(r, _)| r.as_str()).collect()
    }
}

const MIB: u64 = 1024 * 1024;

/// A voter whose database is `db` MiB of which `in_use` MiB hold data, following `leader`.
pub fn voter(id: u64, db: u64, in_use: u64, leader: u64) -> MemberObs {
    MemberObs {
        id,
        name: format!("m{id}"),
        is_learner: false,
        status: Some(MemberStatus {
            db_size: db * MIB,
            in_use: in_use * MIB,
            leader,
            raft_index: 1,
        }),
    }
}

#[derive(Clone)]
pub struct FakeUpkeep {
    node: String,
    world: Arc<Mutex<World>>,
}

impl FakeUpkeep {
    pub fn new(node: &str, world: World) -> FakeUpkeep {
        FakeUpkeep {
            node: node.to_string(),
            world: Arc::new(Mutex::new(world)),
        }
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct FakeLock(Arc<Mutex<World>>);

impl HeldLock for FakeLock {
    async fn release(self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).lock = None;
    }
}

impl Upkeep for FakeUpkeep {
    type Lock = FakeLock;

    fn node(&self) -> &str {
        &self.node
    }

    async fn members(&self, fresh: bool) -> Result<Members, EtcdError> {
        let mut w = self.world();
        w.looks.push(fresh);
        Ok(Members {
            local_id: w.local_id,
            members: w.members.clone(),
        })
    }

    async fn alarms(&self) -> Result<Vec<(u64, AlarmKind)>, EtcdError> {
        let (hang, alarms) = {
            let w = self.world();
            (w.alarms_hang, w.alarms.clone())
        };
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(alarms)
    }

    async fn lock_state(&self) -> Result<LockState, EtcdError> {
        Ok(match &self.world().lock {
            Some(h) => LockState::Held(h.clone()),
            None => LockState::Free,
        })
    }

    async fn lock(&self, operation: &str) -> Result<Result<FakeLock, String>, EtcdError> {
        let mut w = self.world();
        if let Some(h) = &w.lock {
            return Ok(Err(h.clone()));
        }
        w.lock = Some(self.node.clone());
        w.locked_for.push(operation.to_string());
        // The lock's write reaches every member's log.
        for m in &mut w.members {
            if let Some(s) = m.status.as_mut() {
                s.raft_index += 1;
            }
        }
        Ok(Ok(FakeLock(self.world.clone())))
    }

    async fn revision(&self) -> Result<i64, EtcdError> {
        Ok(self.world().revision)
    }

    async fn is_compacted_to(&self, revision: i64) -> Result<bool, EtcdError> {
        Ok(self.world().compacted >= revision)
    }

    async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let mut w = self.world();
        assert!(
            w.lock.as_deref() == Some(self.node.as_str()) || !w.alarms.is_empty(),
            "compacted without the maintenance lock"
        );
        w.compactions.push(revision);
        w.compacted = revision;
        Ok(())
    }

    async fn defragment_local(&self) -> Result<(), EtcdError> {
        let mut w = self.world();
        assert!(
            w.lock.as_deref() == Some(self.node.as_str()) || !w.alarms.is_empty(),
            "defragmented without the maintenance lock"
        );
        w.defrags += 1;
        let local = w.local_id;
        if let Some(s) = w
            .members
            .iter_mut()
            .find(|m| m.id == local)
            .and_then(|m| m.status.as_mut())
        {
            s.db_size = s.in_use;
        }
        Ok(())
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        let mut w = self.world();
        w.moved_to.push(to);
        for s in w.members.iter_mut().filter_map(|m| m.status.as_mut()) {
            s.leader = to;
        }
        Ok(())
    }

    async fn disarm_nospace(&self, member: u64) -> Result<(), EtcdError> {
        self.world().alarms.retain(|(m, _)| *m != member);
        Ok(())
    }

    async fn raise_nospace(&self, member: u64) -> Result<(), EtcdError> {
        self.world().alarms.push((member, AlarmKind::NoSpace));
        Ok(())
    }

    fn snapshot_in_progress(&self) -> bool {
        self.world().snapshot
    }

    async fn event(
        &self,
        _kind: EventKind,
        reason: &str,
        message: &str,
        _at: Timestamp,
    ) -> Result<(), EtcdError> {
        self.world()
            .events
            .push((reason.to_string(), message.to_string()));
        Ok(())
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hostlet_runtime::{Action, Metrics};

    use super::*;
    use crate::upkeep::controller::{
        UpkeepConfig, UpkeepController, BACKEND_SETTLE, CONFIRM_IDLE, MAX_SETTLING_WRITES,
    };
    use crate::upkeep::plan::Retention;

    fn controller(fake: &FakeUpkeep, retention: Retention) -> UpkeepController<FakeUpkeep> {
        let db_size = prometheus::IntGaugeVec::new(
            prometheus::Opts::new("hostlet_etcd_db_size_bytes", "test"),
            &["member"],
        )
        .unwrap();
        let cfg = UpkeepConfig {
            retention,
            ..UpkeepConfig::default()
        };
        UpkeepController::new(Arc::new(fake.clone()), cfg, &Metrics::new(), db_size).unwrap()
    }

    /// One reconcile, then the wait it asked for, as the controller's queue would.
    async fn step(c: &UpkeepController<FakeUpkeep>) {
        if let Action::Requeue(d) = c.reconcile().await.unwrap() {
            tokio::time::advance(d).await;
        }
    }

    fn three(local: u64, leader: u64) -> World {
        World {
            local_id: local,
            members: vec![
                voter(1, 10, 10, leader),
                voter(2, 10, 10, leader),
                voter(3, 10, 10, leader),
            ],
            revision: 1000,
            ..World::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_compacts_to_what_the_retention_keeps_on_a_fresh_look_under_the_lock() {
        let fake = FakeUpkeep::new("n1", three(1, 1));
        let c = controller(&fake, Retention::Revisions(100));
        // The cache's look shows work: nothing is done before a look taken now.
        assert_eq!(
            c.reconcile().await.unwrap(),
            Action::Requeue(Duration::ZERO)
        );
        assert!(fake.world().compactions.is_empty());
        assert_eq!(
            c.reconcile().await.unwrap(),
            Action::Requeue(Duration::from_secs(1))
        );
        {
            let w = fake.world();
            assert_eq!(w.looks, vec![false, true]);
            assert_eq!(w.compactions, vec![900]);
            assert_eq!(w.locked_for, vec!["compact 900".to_string()]);
            assert_eq!(w.lock, None, "the lock is given back");
            assert_eq!(w.reasons(), vec!["EtcdCompacted"]);
        }
        // Nothing new to compact, and the interval has not passed: idle.
        fake.world().revision = 1050;
        assert!(
            matches!(c.reconcile().await.unwrap(), Action::Requeue(d) if d > Duration::from_secs(1))
        );
        assert_eq!(fake.world().compactions, vec![900]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_change_brings_two_fresh_looks_a_backend_commit_apart() {
        let fake = FakeUpkeep::new("n2", three(2, 1));
        let c = controller(&fake, Retention::Off);
        let idle = c.reconcile().await.unwrap();
        assert!(matches!(idle, Action::Requeue(d) if d > BACKEND_SETTLE));
        // Another agent defragmented: the cache may hold figures from before what it freed.
        c.lock_changed("defrag m3");
        assert_eq!(
            c.reconcile().await.unwrap(),
            Action::Requeue(BACKEND_SETTLE)
        );
        // The look after the commits shows m2 fragmented now.
        fake.world().members[1] = voter(2, 400, 20, 1);
        c.reconcile().await.unwrap();
        let w = fake.world();
        // The fourth look is the defragmentation's own, after it.
        assert_eq!(w.looks, vec![false, true, true, true]);
        assert_eq!(w.defrags, 1);
    }

    /// Three voters led by m1, the agent's own; none fragmented, every file big enough to be due were its
    /// in-use figure from before the maintenance.
    fn big_quiet_leader() -> (FakeUpkeep, UpkeepController<FakeUpkeep>) {
        leading([
            voter(1, 100, 100, 1),
            voter(2, 100, 100, 1),
            voter(3, 100, 100, 1),
        ])
    }

    #[tokio::test(start_paused = true)]
    async fn after_maintenance_the_leader_confirms_with_two_settling_writes_that_nobody_is_due() {
        let (fake, c) = big_quiet_leader();
        step(&c).await;
        assert!(fake.world().locked_for.is_empty(), "no maintenance yet");
        c.lock_changed("compact 900");
        // A write, a look once every member has it and its backend committed it; again; the two agree.
        for _ in 0..4 {
            step(&c).await;
        }
        assert_eq!(fake.world().locked_for, vec![CONFIRM_IDLE.to_string(); 2]);
        let looks = fake.world().looks.len();
        let idle = c.reconcile().await.unwrap();
        assert!(
            matches!(idle, Action::Requeue(d) if d > Duration::from_secs(1)),
            "{idle:?}"
        );
        let w = fake.world();
        assert_eq!(w.locked_for.len(), 2, "no more writes once confirmed");
        assert_eq!(w.looks[looks..], [true], "the confirming look was fresh");
        assert_eq!(w.defrags, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_whose_freed_space_shows_after_the_settling_write_is_defragmented() {
        let (fake, c) = big_quiet_leader();
        c.lock_changed("defrag m3");
        step(&c).await;
        assert_eq!(fake.world().locked_for.len(), 1);
        // m2's backend counts the compaction's pages once the settling write committed.
        fake.world().members[1] = voter(2, 100, 20, 1);
        for _ in 0..4 {
            step(&c).await;
        }
        let w = fake.world();
        assert_eq!(w.locked_for.len(), 1, "no settling write while m2 is due");
        assert_eq!(w.defrags, 0, "the leader goes last");
    }

    #[tokio::test(start_paused = true)]
    async fn figures_that_keep_changing_end_the_confirmation_after_a_bounded_number_of_writes() {
        let (fake, c) = big_quiet_leader();
        c.lock_changed("compact 900");
        for i in 0..40 {
            // A busy cluster: m3's figures move on every look.
            if let Some(s) = fake.world().members[2].status.as_mut() {
                (s.db_size, s.in_use) = ((100 + i) * MIB, (100 + i) * MIB);
            }
            step(&c).await;
        }
        assert_eq!(fake.world().locked_for.len(), MAX_SETTLING_WRITES as usize);
    }

    #[tokio::test(start_paused = true)]
    async fn settling_writes_and_small_files_bring_no_confirmation() {
        let (fake, c) = big_quiet_leader();
        // Another agent's settling write is no maintenance.
        c.lock_changed(CONFIRM_IDLE);
        for _ in 0..4 {
            step(&c).await;
        }
        assert!(fake.world().locked_for.is_empty());
        // After maintenance, files too small to be due whatever they free need no confirming.
        let fake = FakeUpkeep::new("n1", three(1, 1));
        let c = controller(&fake, Retention::Off);
        c.lock_changed("compact 900");
        for _ in 0..4 {
            step(&c).await;
        }
        assert!(fake.world().locked_for.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_compacts_nothing() {
        let fake = FakeUpkeep::new("n2", three(2, 1));
        let c = controller(&fake, Retention::Revisions(100));
        for _ in 0..3 {
            c.reconcile().await.unwrap();
        }
        assert!(fake.world().compactions.is_empty());
        assert!(fake.world().locked_for.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fragmented_follower_waits_for_the_lock_and_a_snapshot_then_defragments() {
        let mut world = three(2, 1);
        world.members[1] = voter(2, 400, 20, 1);
        world.lock = Some("n3".into());
        world.snapshot = true;
        let fake = FakeUpkeep::new("n2", world);
        let c = controller(&fake, Retention::Off);
        for _ in 0..3 {
            c.reconcile().await.unwrap();
        }
        assert_eq!(fake.world().defrags, 0, "the lock is another's");
        fake.world().lock = None;
        for _ in 0..3 {
            c.reconcile().await.unwrap();
        }
        assert_eq!(fake.world().defrags, 0, "a snapshot is being taken");
        fake.world().snapshot = false;
        c.reconcile().await.unwrap();
        let w = fake.world();
        assert_eq!(w.defrags, 1);
        assert_eq!(w.locked_for, vec!["defrag m2".to_string()]);
        assert_eq!(w.lock, None);
        assert_eq!(w.reasons(), vec!["EtcdDefragmenting", "EtcdDefragmented"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fragmented_leader_hands_leadership_over_before_it_defragments() {
        // Followers big enough to be due if their in-use figures lagged.
        let (fake, c) = leader_over(voter(2, 100, 100, 1), voter(3, 102, 100, 1));
        // A look from the cache, then two settling writes, each followed by looks once every follower
        // has it (and its backend committed it): the last agrees with the one before.
        for _ in 0..5 {
            step(&c).await;
        }
        {
            let w = fake.world();
            assert_eq!(
                w.moved_to,
                Vec::<u64>::new(),
                "moved before its followers' figures were confirmed"
            );
            assert_eq!(
                w.locked_for,
                vec!["confirm the leader's turn".to_string(); 2]
            );
            assert_eq!(w.lock, None);
        }
        step(&c).await;
        {
            let w = fake.world();
            // To the follower with the least free space: m2 (0 MiB free) before m3 (2 MiB).
            assert_eq!(w.moved_to, vec![2]);
            assert_eq!(w.defrags, 0);
        }
        step(&c).await;
        assert_eq!(fake.world().defrags, 1, "defragmented once it follows");
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_looks_again_only_once_the_followers_backends_have_committed_the_write() {
        let (fake, c) = fragmented_leader();
        step(&c).await;
        step(&c).await;
        assert_eq!(fake.world().locked_for.len(), 1, "the first settling write");
        // Every follower has applied it, but the time for two backend commits has not passed.
        for _ in 0..5 {
            c.reconcile().await.unwrap();
        }
        {
            let w = fake.world();
            assert!(w.moved_to.is_empty());
            assert_eq!(w.locked_for.len(), 1, "looked again before the commits");
        }
        tokio::time::advance(BACKEND_SETTLE).await;
        c.reconcile().await.unwrap();
        assert_eq!(
            fake.world().locked_for.len(),
            2,
            "the second settling write"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_followers_are_too_small_to_be_due_goes_on_one_fresh_look() {
        // 60 MiB files: below the 64 MiB of free space the threshold asks, even were all of it free.
        let (fake, c) = leader_over(voter(2, 60, 60, 1), voter(3, 60, 59, 1));
        c.reconcile().await.unwrap();
        assert!(
            fake.world().moved_to.is_empty(),
            "moved on the cache's look"
        );
        c.reconcile().await.unwrap();
        {
            let w = fake.world();
            assert_eq!(w.moved_to, vec![2]);
            assert!(
                w.locked_for.is_empty(),
                "no settling write: {:?}",
                w.locked_for
            );
        }
        c.reconcile().await.unwrap();
        assert_eq!(fake.world().defrags, 1, "defragmented once it follows");
    }

    #[tokio::test(start_paused = true)]
    async fn one_follower_big_enough_to_be_due_brings_the_confirmation_back() {
        // m3: 64 MiB with all of it in use; were that figure from before a compaction, m3 could be due.
        let (fake, c) = leader_over(voter(2, 60, 60, 1), voter(3, 64, 64, 1));
        for _ in 0..5 {
            step(&c).await;
        }
        {
            let w = fake.world();
            assert!(
                w.moved_to.is_empty(),
                "moved before m3's figures were confirmed"
            );
            assert_eq!(w.locked_for.len(), 2, "two settling writes");
        }
        step(&c).await;
        assert_eq!(fake.world().moved_to, vec![2]);
    }

    /// Three voters; m1 leads, is fragmented and is the agent's own; the followers are not, but their
    /// files are big enough to be due if their figures lagged.
    fn fragmented_leader() -> (FakeUpkeep, UpkeepController<FakeUpkeep>) {
        leader_over(voter(2, 100, 100, 1), voter(3, 100, 100, 1))
    }

    /// As [`fragmented_leader`], with these followers m2 and m3.
    fn leader_over(m2: MemberObs, m3: MemberObs) -> (FakeUpkeep, UpkeepController<FakeUpkeep>) {
        leading([voter(1, 400, 20, 1), m2, m3])
    }

    /// The agent of m1, which leads these three voters.
    fn leading(members: [MemberObs; 3]) -> (FakeUpkeep, UpkeepController<FakeUpkeep>) {
        let mut world = three(1, 1);
        world.members = members.into();
        let fake = FakeUpkeep::new("n1", world);
        let c = controller(&fake, Retention::Off);
        (fake, c)
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_whose_figures_catch_up_late_still_goes_before_the_leader() {
        let (fake, c) = fragmented_leader();
        step(&c).await;
        step(&c).await;
        assert_eq!(fake.world().locked_for.len(), 1, "the first settling write");
        // m3 applies the compaction late: after the settling write its figures show what it freed.
        fake.world().members[2] = voter(3, 400, 20, 1);
        for _ in 0..5 {
            step(&c).await;
        }
        let w = fake.world();
        assert_eq!(
            w.moved_to,
            Vec::<u64>::new(),
            "the leader took its turn before m3"
        );
        assert_eq!(w.defrags, 0);
        assert_eq!(
            w.locked_for.len(),
            1,
            "no settling write while a follower goes first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_that_does_not_have_the_settling_write_yet_holds_the_leader_back() {
        let (fake, c) = fragmented_leader();
        step(&c).await;
        step(&c).await;
        for _ in 0..4 {
            // m2 lags: it never reports the index of the writes made since.
            fake.world().members[1] = voter(2, 100, 100, 1);
            step(&c).await;
        }
        let w = fake.world();
        assert_eq!(
            w.moved_to,
            Vec::<u64>::new(),
            "moved on figures from before the write"
        );
        assert_eq!(
            w.locked_for.len(),
            1,
            "one settling write, then a wait for m2"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_member_stops_every_defragmentation() {
        let mut world = three(2, 1);
        world.members[1] = voter(2, 400, 20, 1);
        world.members[2].status = None;
        let fake = FakeUpkeep::new("n2", world);
        let c = controller(&fake, Retention::Off);
        for _ in 0..5 {
            c.reconcile().await.unwrap();
        }
        assert_eq!(fake.world().defrags, 0, "silence is not health");
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_waiting_on_etcd_is_dropped_at_the_stop() {
        use hostlet_runtime::Run;
        let fake = FakeUpkeep::new(
            "n1",
            World {
                alarms_hang: true,
                ..three(1, 1)
            },
        );
        let c = Arc::new(controller(&fake, Retention::Revisions(100)));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let run = tokio::spawn(c.run(shutdown.clone()));
        while fake.world().looks.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), run)
            .await
            .expect("the controller stops without waiting for etcd")
            .unwrap();
    }
}
