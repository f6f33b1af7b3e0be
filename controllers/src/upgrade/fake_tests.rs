//! The upgrade controller's tests on [`super::FakeUpgrade`]: several agents over one cluster in memory,
//! each reconcile run to its end, on tokio's paused clock.

use hostlet_runtime::{Action, Metrics};

use super::*;
use crate::upgrade::controller::{UpgradeConfig, UpgradeController, SNAPSHOT_NAME};

type Agent = UpgradeController<FakeUpgrade>;

/// The controller of the agent of node `n<id>`.
fn agent(world: &Shared, id: u64) -> Agent {
    agent_with(world, id, UpgradeConfig::default())
}

fn agent_with(world: &Shared, id: u64, cfg: UpgradeConfig) -> Agent {
    UpgradeController::new(Arc::new(FakeUpgrade::new(world, id)), cfg, &Metrics::new())
}

/// One reconcile, then the wait it asked for, as the controller's queue would.
async fn step(c: &Agent) -> Action {
    let action = c.reconcile().await.unwrap();
    if let Action::Requeue(d) = action {
        tokio::time::advance(d).await;
    }
    action
}

/// `times` reconciles of `c`.
async fn steps(c: &Agent, times: usize) {
    for _ in 0..times {
        step(c).await;
    }
}

/// Three voters on 3.4.23 led by m1, every host's binary replaced by 3.5.1.
fn replaced_everywhere() -> Shared {
    let mut w = World::cluster(3, 1, "3.4.23");
    for n in ["n1", "n2", "n3"] {
        w.replace(n, "3.5.1");
    }
    shared(w)
}

/// Three voters on 3.4.23 led by m1, node `n<id>`'s binary replaced by 3.5.1.
fn replaced_on(id: u64) -> Shared {
    let mut w = World::cluster(3, 1, "3.4.23");
    w.replace(&format!("n{id}"), "3.5.1");
    shared(w)
}

fn phase(world: &Shared, member: &str) -> Option<(UpgradePhase, String)> {
    lock(world).phase(member)
}

#[tokio::test(start_paused = true)]
async fn the_followers_go_first_and_the_leader_last() {
    let world = replaced_everywhere();
    let agents = [agent(&world, 1), agent(&world, 2), agent(&world, 3)];
    for _ in 0..3 {
        for a in &agents {
            a.reconcile().await.unwrap();
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let w = lock(&world);
    assert_eq!(w.restarts(), ["n2", "n3", "n1"]);
    // The leader said why it did not go at its first look: the others had not noticed yet.
    let (reason, message) = w.events_of("n1")[0];
    assert_eq!(reason, "EtcdUpgradeWaiting");
    assert!(message.contains("goes last"), "{message}");
    // Leadership moved to a member already on 3.5.1 before the leader's restart, never before another's.
    assert_eq!(
        w.acts("n1"),
        [
            Call::Event("EtcdUpgradeWaiting".into()),
            Call::Lock("etcd upgrade of m1 to 3.5.1".into()),
            Call::MoveLeader(2),
            Call::Restart,
            Call::Release,
            Call::Event("EtcdUpgraded".into()),
        ]
    );
    assert!(w
        .acts("n2")
        .iter()
        .all(|c| !matches!(c, Call::MoveLeader(_))));
    for m in ["m1", "m2", "m3"] {
        assert_eq!(w.records[m].phase, UpgradePhase::Current, "{m}");
        assert_eq!(w.records[m].running, "3.5.1", "{m}");
    }
    // One snapshot for the whole roll: the first agent's counts for the others.
    let snapshots: Vec<_> = w
        .calls
        .iter()
        .filter(|(_, c)| matches!(c, Call::Snapshot(_)))
        .collect();
    assert_eq!(
        snapshots,
        [&("n2".to_string(), Call::Snapshot(SNAPSHOT_NAME.into()))]
    );
}

#[tokio::test(start_paused = true)]
async fn the_leader_waits_while_a_follower_waits_for_its_turn() {
    let world = replaced_everywhere();
    lock(&world).lock = Some(("n9".into(), "defrag m9".into()));
    let (leader, follower, other) = (agent(&world, 1), agent(&world, 2), agent(&world, 3));
    step(&follower).await;
    step(&other).await;
    assert_eq!(
        phase(&world, "m2").map(|p| p.0),
        Some(UpgradePhase::Waiting)
    );
    // Long past the notice window: m2's record still says it waits, so the leader does.
    for _ in 0..30 {
        step(&leader).await;
    }
    {
        let w = lock(&world);
        assert!(w.restarts().is_empty());
        assert!(!w
            .calls
            .iter()
            .any(|(n, c)| n == "n1" && matches!(c, Call::Lock(_) | Call::LockRefused(_))));
        let (_, message) = w.phase("m1").unwrap();
        assert!(
            message.contains("waiting for m2, m3 to upgrade first"),
            "{message}"
        );
    }
    lock(&world).lock = None;
    step(&follower).await;
    assert_eq!(lock(&world).restarts(), ["n2"]);
    step(&leader).await;
    // m3 still has its binary waiting.
    assert_eq!(lock(&world).restarts(), ["n2"]);
    step(&other).await;
    step(&leader).await;
    assert_eq!(lock(&world).restarts(), ["n2", "n3", "n1"]);
}

#[tokio::test(start_paused = true)]
async fn the_maintenance_lock_is_taken_before_the_restart_and_given_back_after() {
    let world = replaced_on(2);
    step(&agent(&world, 2)).await;
    let w = lock(&world);
    assert_eq!(
        w.acts("n2"),
        [
            Call::Lock("etcd upgrade of m2 to 3.5.1".into()),
            Call::Snapshot(SNAPSHOT_NAME.into()),
            Call::Restart,
            Call::Release,
            Call::Event("EtcdUpgraded".into()),
        ]
    );
    assert_eq!(w.lock, None);
    let (_, message) = w.events_of("n2")[0];
    assert!(
        message.contains("m2 now runs etcd 3.5.1 (was 3.4.23)"),
        "{message}"
    );
    // The checks were made on a fresh look, under the lock.
    let locked = w
        .calls
        .iter()
        .position(|(_, c)| matches!(c, Call::Lock(_)))
        .unwrap();
    assert_eq!(w.calls[locked + 1].1, Call::Look { fresh: true });
    assert_eq!(w.records["m2"].phase, UpgradePhase::Current);
    assert_eq!(w.records["m2"].running, "3.5.1");
}

#[tokio::test(start_paused = true)]
async fn no_turn_is_taken_while_another_holds_the_maintenance_lock() {
    let world = replaced_on(2);
    lock(&world).lock = Some(("n3".into(), "defrag m3".into()));
    let c = agent(&world, 2);
    steps(&c, 10).await;
    {
        let w = lock(&world);
        assert!(w.restarts().is_empty());
        assert_eq!(
            w.lock,
            Some(("n3".into(), "defrag m3".into())),
            "left alone"
        );
        assert!(!w.acts("n2").iter().any(|c| matches!(c, Call::Lock(_))));
        // Said once, however many looks.
        assert_eq!(w.reasons("n2"), ["EtcdUpgradeWaiting"]);
        let (_, message) = w.events_of("n2")[0];
        assert!(
            message.contains("maintenance lock, held by n3 (defrag m3)"),
            "{message}"
        );
    }
    lock(&world).lock = None;
    step(&c).await;
    assert_eq!(lock(&world).restarts(), ["n2"]);
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_taken_before_the_change_was_noticed_does_not_count() {
    let world = replaced_on(2);
    {
        let mut w = lock(&world);
        let old = SnapshotRecord {
            created: Timestamp(w.now()),
            ..snapshot_of("n3")
        };
        w.snapshots.push(old);
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    step(&agent(&world, 2)).await;
    let w = lock(&world);
    let acts = w.acts("n2");
    let snap = acts
        .iter()
        .position(|c| matches!(c, Call::Snapshot(_)))
        .unwrap();
    let restart = acts.iter().position(|c| *c == Call::Restart).unwrap();
    assert!(snap < restart, "{acts:?}");
    assert_eq!(w.snapshots.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_snapshot_is_taken_when_one_was_taken_since_the_change_was_noticed() {
    let world = replaced_on(2);
    lock(&world).lock = Some(("n3".into(), "defrag m3".into()));
    let c = agent(&world, 2);
    // Noticed now; it waits for the lock meanwhile a scheduled snapshot is taken.
    step(&c).await;
    {
        let mut w = lock(&world);
        let newer = SnapshotRecord {
            created: Timestamp(w.now()),
            ..snapshot_of("n3")
        };
        w.snapshots.push(newer);
        w.lock = None;
    }
    step(&c).await;
    let w = lock(&world);
    assert_eq!(w.restarts(), ["n2"]);
    assert!(!w.acts("n2").iter().any(|c| matches!(c, Call::Snapshot(_))));
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_that_fails_stops_the_turn() {
    let world = replaced_on(2);
    lock(&world).snapshot_error = Some("the member's stream broke".into());
    let c = agent(&world, 2);
    steps(&c, 3).await;
    {
        let w = lock(&world);
        assert!(w.restarts().is_empty());
        assert_eq!(w.lock, None, "the lock is given back");
        let (_, message) = w.phase("m2").unwrap();
        assert!(
            message.contains("no snapshot before the restart: the member's stream broke"),
            "{message}"
        );
        assert_eq!(w.reasons("n2"), ["EtcdUpgradeWaiting"]);
    }
    lock(&world).snapshot_error = None;
    step(&c).await;
    assert_eq!(lock(&world).restarts(), ["n2"]);
}

fn snapshot_of(node: &str) -> SnapshotRecord {
    SnapshotRecord {
        name: "scheduled".into(),
        node: node.into(),
        file: format!("scheduled-{node}.db"),
        size: 4096,
        sha256: String::new(),
        revision: 7,
        created: Timestamp(SystemTime::UNIX_EPOCH),
        duration_seconds: 0.1,
        compressed: false,
        encrypted: false,
        on_demand: false,
        status: SnapshotStatus::Successful,
        error: None,
        local: true,
        remote: None,
    }
}

#[tokio::test(start_paused = true)]
async fn the_version_gate_refuses_a_downgrade_or_a_skipped_minor_and_the_member_runs_on() {
    for (running, binary, why) in [("3.5.1", "3.4.23", "3.4.23"), ("3.4.23", "3.6.0", "3.6.0")] {
        let mut w = World::cluster(3, 1, running);
        w.replace("n2", binary);
        let world = shared(w);
        let c = agent(&world, 2);
        for _ in 0..5 {
            let action = step(&c).await;
            assert_eq!(
                action,
                Action::Requeue(UpgradeConfig::default().check_interval)
            );
        }
        let w = lock(&world);
        assert!(w.restarts().is_empty(), "{binary}");
        assert_eq!(
            w.acts("n2"),
            [Call::Event("EtcdUpgradeRefused".into())],
            "{binary}: said once"
        );
        assert_eq!(w.members[1], voter(2, 1, running), "left running");
        let rec = &w.records["m2"];
        assert_eq!(rec.phase, UpgradePhase::Refused);
        assert!(rec.message.contains(why), "{}", rec.message);
    }
}

#[tokio::test(start_paused = true)]
async fn a_refusal_by_the_members_own_gate_is_left_to_it_to_report() {
    let world = replaced_on(2);
    lock(&world).side("n2").gate = Some(Err("etcd 3.5.1 refused: the supervisor says".into()));
    steps(&agent(&world, 2), 3).await;
    let w = lock(&world);
    assert!(w.restarts().is_empty());
    assert!(
        w.events.is_empty(),
        "the supervisor reports its gate's refusals"
    );
    assert_eq!(w.records["m2"].phase, UpgradePhase::Refused);
    assert_eq!(
        w.records["m2"].message,
        "etcd 3.5.1 refused: the supervisor says"
    );
}

/// A member's agent that keeps waiting under `change` says why once, and restarts nothing.
async fn waits_for(change: impl FnOnce(&mut World), want: &str) {
    let world = replaced_on(2);
    change(&mut lock(&world));
    steps(&agent(&world, 2), 8).await;
    let w = lock(&world);
    assert!(w.restarts().is_empty(), "{want}");
    assert_eq!(w.lock, None, "{want}: the lock is given back");
    assert_eq!(w.reasons("n2"), ["EtcdUpgradeWaiting"], "{want}");
    let (_, message) = w.events_of("n2")[0];
    assert!(message.contains(want), "{message}");
    assert!(
        !w.acts("n2").iter().any(|c| matches!(c, Call::Snapshot(_))),
        "{want}"
    );
}

#[tokio::test(start_paused = true)]
async fn fewer_than_three_voters_wait_unless_allowed() {
    waits_for(
        |w| {
            w.members.pop();
        },
        "only 2 voter(s)",
    )
    .await;
    let world = replaced_on(2);
    lock(&world).members.pop();
    let cfg = UpgradeConfig {
        allow_small: true,
        ..UpgradeConfig::default()
    };
    step(&agent_with(&world, 2, cfg)).await;
    assert_eq!(lock(&world).restarts(), ["n2"]);
}

#[tokio::test(start_paused = true)]
async fn a_learner_an_alarm_or_a_member_behind_makes_the_turn_wait() {
    waits_for(
        |w| {
            let mut learner = voter(4, 1, "3.4.23");
            learner.is_learner = true;
            w.members.push(learner);
        },
        "a learner (m4) is catching up",
    )
    .await;
    waits_for(
        |w| w.alarms.push("Nospace on 3".into()),
        "alarm raised: Nospace on 3",
    )
    .await;
    waits_for(
        |w| {
            if let Some(s) = w.member(1).status.as_mut() {
                s.raft_index = 5000;
            }
        },
        "this member is behind the leader",
    )
    .await;
    waits_for(|w| w.member(3).status = None, "m3 did not answer").await;
}

#[tokio::test(start_paused = true)]
async fn each_distinct_reason_to_wait_is_said_once() {
    let world = replaced_on(2);
    lock(&world).alarms.push("Nospace on 3".into());
    let c = agent(&world, 2);
    steps(&c, 3).await;
    lock(&world).alarms.clear();
    for index in [3000, 4000, 5000] {
        // The leader and m3 move on between looks: the figures change, not the reason.
        for id in [1, 3] {
            if let Some(s) = lock(&world).member(id).status.as_mut() {
                s.raft_index = index;
            }
        }
        step(&c).await;
    }
    {
        let w = lock(&world);
        assert_eq!(w.reasons("n2"), ["EtcdUpgradeWaiting"; 2]);
        assert!(w.events_of("n2")[1].1.contains("behind the leader"));
        assert!(w.restarts().is_empty());
    }
    if let Some(s) = lock(&world).member(2).status.as_mut() {
        s.raft_index = 5000;
    }
    step(&c).await;
    let w = lock(&world);
    assert_eq!(w.restarts(), ["n2"]);
    assert_eq!(
        w.reasons("n2"),
        ["EtcdUpgradeWaiting", "EtcdUpgradeWaiting", "EtcdUpgraded"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_hands_leadership_to_a_member_on_the_new_release_before_it_restarts() {
    let world = replaced_on(1);
    {
        let mut w = lock(&world);
        for id in [2, 3] {
            w.member(id).status.as_mut().unwrap().version = Some(v("3.5.1"));
        }
        w.member(2).status.as_mut().unwrap().raft_index = 90;
    }
    step(&agent(&world, 1)).await;
    let w = lock(&world);
    let acts = w.acts("n1");
    assert_eq!(acts[2], Call::MoveLeader(3), "{acts:?}");
    assert_eq!(acts[3], Call::Restart, "{acts:?}");
    assert!(w.members.iter().all(|m| m.status.unwrap().leader == 3));
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_leadership_does_not_move_is_not_restarted() {
    let world = replaced_on(1);
    {
        let mut w = lock(&world);
        w.leadership_moves = false;
        for id in [2, 3] {
            w.member(id).status.as_mut().unwrap().version = Some(v("3.5.1"));
        }
    }
    let c = agent(&world, 1);
    let began = Instant::now();
    step(&c).await;
    let w = lock(&world);
    assert!(w.restarts().is_empty());
    assert_eq!(w.lock, None);
    assert!(
        began.elapsed() >= Duration::from_secs(15),
        "it gave leadership 15 s to move"
    );
    let (_, message) = w.phase("m1").unwrap();
    assert_eq!(message, "leadership did not move away");
    assert_eq!(w.reasons("n1"), ["EtcdUpgradeWaiting"]);
}

#[tokio::test(start_paused = true)]
async fn a_member_that_does_not_come_back_fails_closed() {
    let mut w = World::cluster(3, 1, "3.4.23");
    w.replace("n2", "3.5.1");
    w.replace("n3", "3.5.1");
    w.side("n2").restart = Restart::Silent;
    let world = shared(w);
    let c = agent(&world, 2);
    let began = Instant::now();
    step(&c).await;
    {
        let w = lock(&world);
        assert!(
            began.elapsed() >= Duration::from_secs(120),
            "it waited for the member"
        );
        assert_eq!(w.restarts(), ["n2"]);
        assert!(!w.reasons("n2").contains(&"EtcdUpgraded"), "{:?}", w.events);
        let (phase, message) = w.phase("m2").unwrap();
        assert_eq!(
            phase,
            UpgradePhase::Waiting,
            "the leader keeps waiting for it"
        );
        assert!(
            message.contains("the member is not back on 3.5.1"),
            "{message}"
        );
        // The lock is given back: the next turn's own checks see the silent member.
        assert_eq!(w.lock, None);
    }
    // While m2 is silent its agent does nothing more, and no other member restarts.
    steps(&c, 5).await;
    let n3 = agent(&world, 3);
    steps(&n3, 5).await;
    steps(&agent(&world, 1), 5).await;
    let w = lock(&world);
    assert_eq!(w.restarts(), ["n2"]);
    assert!(w.events_of("n3")[0].1.contains("m2 did not answer"));
    assert!(!w.reasons("n2").contains(&"EtcdUpgraded"));
}

#[tokio::test(start_paused = true)]
async fn a_member_back_but_still_catching_up_holds_the_next_turn() {
    let mut w = World::cluster(3, 1, "3.4.23");
    w.replace("n2", "3.5.1");
    w.replace("n3", "3.5.1");
    w.side("n2").restart = Restart::Behind;
    let world = shared(w);
    step(&agent(&world, 2)).await;
    {
        let w = lock(&world);
        assert!(!w.reasons("n2").contains(&"EtcdUpgraded"));
        let (_, message) = w.phase("m2").unwrap();
        assert!(message.contains("catching up"), "{message}");
    }
    // m2 serves 3.5.1 far behind: n3 must not take the cluster's second member down.
    steps(&agent(&world, 3), 5).await;
    {
        let w = lock(&world);
        assert_eq!(w.restarts(), ["n2"]);
        let (_, message) = w.events_of("n3")[0];
        assert!(
            message.contains("m2 (raft index 100) behind the leader"),
            "{message}"
        );
    }
    // Caught up: n3 goes.
    {
        let mut w = lock(&world);
        let index = w.member(1).status.unwrap().raft_index;
        w.member(2).status.as_mut().unwrap().raft_index = index;
    }
    steps(&agent(&world, 3), 1).await;
    assert_eq!(lock(&world).restarts(), ["n2", "n3"]);
}

#[tokio::test(start_paused = true)]
async fn a_restart_the_supervisor_refuses_leaves_the_member_running() {
    let world = replaced_on(2);
    lock(&world).side("n2").restart = Restart::Fails("etcd was not restarted".into());
    step(&agent(&world, 2)).await;
    let w = lock(&world);
    assert_eq!(w.restarts(), ["n2"]);
    assert_eq!(w.lock, None);
    assert_eq!(w.members[1], voter(2, 1, "3.4.23"));
    assert!(!w.reasons("n2").contains(&"EtcdUpgraded"));
    assert_eq!(w.phase("m2").unwrap().1, "etcd was not restarted");
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_binary_starts_nothing() {
    let world = replaced_on(2);
    lock(&world).side("n2").binary = None;
    let c = agent(&world, 2);
    steps(&c, 3).await;
    let w = lock(&world);
    assert!(w.acts("n2").is_empty());
    assert!(w.records.is_empty());
}
