//! The learner manager against real etcd members on loopback ports.

mod learners_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostlet_api::objects::LearnerProgress;
use hostlet_api::KeyLayout;
use hostlet_controllers::learners::LearnerConfig;
use hostlet_runtime::testkit::{TestCluster, TestEtcd};
use hostlet_runtime::Etcd;
use learners_support::{
    events, eventually, fill, fill_small, leader_of, membership, put_node, Agent, LateLearner,
};
use tokio::time::Instant;

const STALL: Duration = Duration::from_secs(10);

fn config() -> LearnerConfig {
    let mut cfg = LearnerConfig::new(STALL);
    // Every step of the catch-up shows in the record.
    cfg.record_interval = Duration::ZERO;
    cfg
}

/// Watches the progress record and keeps every (applied index, bytes sent) written for `id`, in order.
/// Every write of learner `id`'s entry in the progress record from revision `from` on.
async fn record_history(etcd: &Etcd, id: u64, from: i64) -> Arc<Mutex<Vec<(u64, u64)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    let key = KeyLayout::default().learner_progress();
    let (watcher, mut stream) = etcd.watch_prefix(&key, from).await.unwrap();
    tokio::spawn(async move {
        let _keep = watcher;
        while let Ok(Some(resp)) = stream.message().await {
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                if let Ok(p) = serde_json::from_slice::<LearnerProgress>(kv.value()) {
                    if let Some(r) = p.learners.get(&format!("{id:x}")) {
                        out.lock().unwrap().push((r.applied_index, r.bytes_sent));
                    }
                }
            }
        }
    });
    seen
}

async fn recorded(etcd: &Etcd, id: u64) -> bool {
    match etcd.get(KeyLayout::default().learner_progress()).await {
        Ok(Some(kv)) => serde_json::from_slice::<LearnerProgress>(kv.value())
            .map(|p| p.learners.contains_key(&format!("{id:x}")))
            .unwrap_or(false),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_with_60mb_to_catch_up_is_promoted_and_its_record_grew_meanwhile() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    fill_small(&etcd, 60).await;
    let agent = Agent::start("node-1", first.endpoints(), &first.endpoint(), config()).await;
    // From before the add: the joiner's own write of the record (at the add) is its first.
    let before = etcd.revision().await.unwrap();
    let mut learner = LateLearner::add(&etcd).await;
    let history = record_history(&etcd, learner.id, before + 1).await;
    put_node(&etcd, &learner.node_record("node-2")).await;
    // Its agent adds it, then starts it: the leader has seen it by then.
    eventually("learner recorded", Duration::from_secs(5), || async {
        recorded(&etcd, learner.id).await
    })
    .await;
    learner.start();
    // On loopback the catch-up can be over before the manager looks twice. Stopped once the leader has
    // begun to send, the learner cannot catch up or be promoted: the record must show that progress
    // before the learner is let go.
    // Stopped once the leader has begun to send (64 KiB, a fraction of the 60 MB).
    let to = format!(
        "etcd_network_peer_sent_bytes_total{{To=\"{:x}\"}} ",
        learner.id
    );
    let metrics_url = format!("{}/metrics", first.endpoint());
    eventually("the leader sending", Duration::from_secs(20), || async {
        let text = match reqwest::get(&metrics_url).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => return false,
        };
        text.lines()
            .find_map(|l| l.strip_prefix(&to))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|b| b > 65536.0)
    })
    .await;
    learner.signal("STOP");
    let stopped = Instant::now();
    eventually(
        "progress recorded while stopped",
        Duration::from_secs(30),
        || async { history.lock().unwrap().iter().any(|(_, bytes)| *bytes > 0) },
    )
    .await;
    eprintln!(
        "progress recorded {:?} after the learner was stopped",
        stopped.elapsed()
    );
    learner.signal("CONT");
    let let_go = Instant::now();
    eventually("learner promoted", Duration::from_secs(60), || async {
        membership(&etcd, learner.id).await == Some(false)
    })
    .await;
    eprintln!("promoted {:?} after it was let go", let_go.elapsed());
    let seen = history.lock().unwrap().clone();
    // Written at first sight, then again as it caught up (on loopback the leader has sent it all within
    // a look or two; the learner applies it afterwards), never going back.
    let grew = seen.len() >= 2
        && seen
            .windows(2)
            .all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1)
        && seen.last() > seen.first();
    assert!(
        grew,
        "the record did not grow while it caught up: {seen:?}\n{}",
        learner.log_tail()
    );
    eventually("promotion counted", Duration::from_secs(5), || async {
        agent.metric("hostlet_learner_promotions_total") == Some(1.0)
    })
    .await;
    // The event follows the count (its write waits for the new voter's quorum).
    eventually("promotion event", Duration::from_secs(10), || async {
        events(&etcd, "LearnerPromoted").await.len() == 1
    })
    .await;
    eventually("record emptied", Duration::from_secs(5), || async {
        !recorded(&etcd, learner.id).await
    })
    .await;
    eventually("two voters counted", Duration::from_secs(5), || async {
        agent.metric("hostlet_etcd_members{role=\"voter\"}") == Some(2.0)
            && agent.metric("hostlet_etcd_members{role=\"learner\"}") == Some(0.0)
    })
    .await;
    assert_eq!(agent.metric("hostlet_learner_evictions_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_never_starts_is_evicted_after_the_stall_timeout_with_an_event() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    let agent = Agent::start("node-1", first.endpoints(), &first.endpoint(), config()).await;
    let learner = LateLearner::add(&etcd).await;
    let added = Instant::now();
    eventually("learner recorded", Duration::from_secs(5), || async {
        recorded(&etcd, learner.id).await
    })
    .await;
    eventually("learner evicted", Duration::from_secs(20), || async {
        membership(&etcd, learner.id).await.is_none()
    })
    .await;
    let since_add = added.elapsed();
    assert!(
        since_add >= STALL - Duration::from_millis(100),
        "evicted {since_add:?} after it was added, before the stall timeout"
    );
    assert!(
        since_add <= STALL + Duration::from_secs(3),
        "evicted late: {since_add:?}"
    );
    // The event and the count follow the removal (the event is written in the background).
    eventually(
        "eviction event and count",
        Duration::from_secs(10),
        || async {
            !events(&etcd, "LearnerEvicted").await.is_empty()
                && agent.metric("hostlet_learner_evictions_total") == Some(1.0)
        },
    )
    .await;
    let evicted = events(&etcd, "LearnerEvicted").await;
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(evicted[0].kind, "Warning");
    assert_eq!(agent.metric("hostlet_learner_evictions_total"), Some(1.0));
    eventually("record emptied", Duration::from_secs(5), || async {
        !recorded(&etcd, learner.id).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_starts_late_and_then_progresses_is_not_evicted() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    fill(&etcd, 10).await;
    let agent = Agent::start("node-1", first.endpoints(), &first.endpoint(), config()).await;
    let mut learner = LateLearner::add(&etcd).await;
    eventually("learner recorded", Duration::from_secs(5), || async {
        recorded(&etcd, learner.id).await
    })
    .await;
    // The scenario: its host comes up 8 s into a 10 s stall timeout.
    tokio::time::sleep(STALL - Duration::from_secs(2)).await;
    learner.start();
    eventually("learner promoted", Duration::from_secs(30), || async {
        let m = membership(&etcd, learner.id).await;
        assert!(
            m.is_some(),
            "evicted although it progressed\n{}",
            learner.log_tail()
        );
        m == Some(false)
    })
    .await;
    assert!(events(&etcd, "LearnerEvicted").await.is_empty());
    assert_eq!(agent.metric("hostlet_learner_evictions_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leaders_agent_dies_the_new_leader_promotes_continuing_the_record() {
    let mut cluster = TestCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let etcd = cluster.connect().await;
    let mut agents = Vec::new();
    for (i, m) in cluster.members.iter().enumerate() {
        agents.push(
            Agent::start(
                &format!("node-{i}"),
                endpoints.clone(),
                &m.endpoint(),
                config(),
            )
            .await,
        );
    }
    let mut learner = LateLearner::add(&etcd).await;
    let added = Instant::now();
    eventually("learner recorded", Duration::from_secs(5), || async {
        recorded(&etcd, learner.id).await
    })
    .await;
    // The leader's host dies: its agent and its member.
    let leader = leader_of(&etcd, &endpoints).await.expect("a leader");
    let members = etcd.member_list().await.unwrap();
    let leader_name = members
        .iter()
        .find(|m| m.id() == leader)
        .unwrap()
        .name()
        .to_string();
    let dead = cluster
        .members
        .iter()
        .position(|m| m.name() == leader_name)
        .unwrap();
    agents[dead].kill();
    cluster.members[dead].kill();
    let alive: Vec<String> = endpoints
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .map(|(_, e)| e.clone())
        .collect();
    eventually("a new leader", Duration::from_secs(15), || async {
        leader_of(&etcd, &alive).await.is_some_and(|l| l != leader)
    })
    .await;
    learner.start();
    eventually(
        "learner promoted by the new leader",
        Duration::from_secs(30),
        || async { membership(&etcd, learner.id).await == Some(false) },
    )
    .await;
    let since_add = added.elapsed().as_secs_f64();
    eventually("promotion event", Duration::from_secs(10), || async {
        !events(&etcd, "LearnerPromoted").await.is_empty()
    })
    .await;
    let promoted = events(&etcd, "LearnerPromoted").await;
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    let by = agents
        .iter()
        .position(|a| a.node == promoted[0].node)
        .unwrap();
    assert_ne!(by, dead);
    // The promotion was measured from the first leader's record, not from the takeover.
    let measured = agents[by]
        .metric("hostlet_learner_promotion_duration_seconds_sum")
        .unwrap();
    assert!(
        measured >= since_add - 2.0,
        "measured {measured:.2}s; the learner was added {since_add:.2}s before its promotion"
    );
}

/// A learner added while no learner manager leads (its agent joined while the leader's agent was down)
/// is promoted later: the promotion is measured from the add that the joining node recorded, not from
/// when the manager first saw it (that once read "2ms after it was added" for a learner added 24 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_is_measured_from_the_recorded_add_not_from_first_sight() {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    let mut learner = LateLearner::add(&etcd).await;
    // As the join does right after its add; the add is dated 24 s back instead of waiting 24 s.
    let added = std::time::SystemTime::now() - Duration::from_secs(24);
    hostlet_controllers::learners::record_learner_added(
        &etcd,
        &KeyLayout::default(),
        learner.id,
        added,
    )
    .await;
    assert!(recorded(&etcd, learner.id).await, "the add is recorded");
    learner.start();
    let agent = Agent::start("node-1", first.endpoints(), &first.endpoint(), config()).await;
    eventually("learner promoted", Duration::from_secs(60), || async {
        membership(&etcd, learner.id).await == Some(false)
    })
    .await;
    eventually("promotion event", Duration::from_secs(5), || async {
        !events(&etcd, "LearnerPromoted").await.is_empty()
    })
    .await;
    let ev = events(&etcd, "LearnerPromoted").await;
    let secs = agent
        .metric("hostlet_learner_promotion_duration_seconds_sum")
        .unwrap_or(0.0);
    assert!(
        secs >= 24.0,
        "promotion measured from first sight: {secs}s; {ev:?}"
    );
    let took = ev[0]
        .message
        .split_once("promoted to voter, ")
        .and_then(|(_, rest)| rest.split_once(" after it was added"))
        .and_then(|(d, _)| humantime::parse_duration(d).ok());
    assert!(
        took.is_some_and(|d| d >= Duration::from_secs(24)),
        "{}",
        ev[0].message
    );
}
