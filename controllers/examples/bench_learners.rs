//! Benchmark: how long after a learner's etcd starts it is a voter, with the learner manager doing the
//! promoting, at 0, 60 and 200 MiB of data — beside the floor, the earliest moment etcd itself accepts the
//! promote, found by a bare promote-retry loop (every 5 ms) on an identical cluster in the same run.
//!
//! Each run starts a fresh one-member cluster (tmpfs), writes the data (1 KiB values, 128 to a
//! transaction), adds a learner through the API and starts its etcd; the clock runs from that start. The
//! managed runs have the learner manager (default configuration) on the first member; the floor runs have
//! nothing but the loop. Medians of RUNS (3) runs per figure. Nothing is asserted; the last line of output
//! is one JSON object.
//!
//! Run it with `hack/bench.sh learners` (environment: RUNS, SIZES_MB = "0,60,200").

#[path = "../tests/learners_support/mod.rs"]
mod learners_support;

use std::time::Duration;

use hostlet_controllers::learners::LearnerConfig;
use hostlet_runtime::testkit::TestEtcd;
use learners_support::{fill_small, membership, Agent, LateLearner};
use tokio::time::Instant;

/// How often the bench itself looks (membership for the managed runs, promote for the floor).
const LOOK: Duration = Duration::from_millis(5);
/// A learner not promoted by then counts as a failed run.
const GIVE_UP: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Promoter {
    /// The learner manager on the first member.
    Manager,
    /// A bare loop calling member promote until etcd accepts.
    Floor,
}

/// One run: seconds from the learner's start to its promotion.
async fn run_once(mb: usize, who: Promoter) -> Option<f64> {
    let first = TestEtcd::start().await;
    let etcd = first.connect().await;
    fill_small(&etcd, mb).await;
    let _agent = match who {
        Promoter::Manager => {
            let agent = Agent::start(
                "node-1",
                first.endpoints(),
                &first.endpoint(),
                LearnerConfig::default(),
            )
            .await;
            // The agent has looked at the membership once: it knows it leads.
            let deadline = Instant::now() + Duration::from_secs(10);
            while agent.metric("hostlet_etcd_members{role=\"voter\"}") != Some(1.0) {
                if Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(LOOK).await;
            }
            Some(agent)
        }
        Promoter::Floor => None,
    };
    let mut learner = LateLearner::add(&etcd).await;
    let started = Instant::now();
    learner.start();
    loop {
        let done = match who {
            Promoter::Manager => membership(&etcd, learner.id).await == Some(false),
            Promoter::Floor => etcd.member_promote(learner.id).await.is_ok(),
        };
        if done {
            return Some(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > GIVE_UP {
            eprintln!(
                "learner not promoted within {GIVE_UP:?}\n{}",
                learner.log_tail()
            );
            return None;
        }
        tokio::time::sleep(LOOK).await;
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = std::env::var("SIZES_MB")
        .unwrap_or_else(|_| "0,60,200".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("learner start → voter, medians of {runs} runs (seconds)");
    println!(
        "{:>8}  {:>12}  {:>12}  {:>8}",
        "data", "manager", "etcd floor", "gap"
    );
    let mut json = serde_json::Map::new();
    json.insert("bench".into(), "learners".into());
    let mut worst_gap: Option<f64> = None;
    for mb in sizes {
        let mut managed = Vec::new();
        let mut floor = Vec::new();
        for _ in 0..runs {
            // Alternated, so that neither side always runs on a warmer machine.
            if let Some(s) = run_once(mb, Promoter::Floor).await {
                floor.push(s);
            }
            if let Some(s) = run_once(mb, Promoter::Manager).await {
                managed.push(s);
            }
        }
        let (m, f) = (median(managed), median(floor));
        let gap = m.zip(f).map(|(m, f)| m - f);
        if let Some(g) = gap {
            worst_gap = Some(worst_gap.map_or(g, |w: f64| w.max(g)));
        }
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!(
            "{:>6}MB  {:>12}  {:>12}  {:>8}",
            mb,
            show(m),
            show(f),
            show(gap)
        );
        json.insert(
            format!("promote_s_{mb}mb"),
            m.map(round3).map_or(serde_json::Value::Null, Into::into),
        );
        json.insert(
            format!("floor_s_{mb}mb"),
            f.map(round3).map_or(serde_json::Value::Null, Into::into),
        );
    }
    json.insert(
        "worst_gap_s".into(),
        worst_gap
            .map(round3)
            .map_or(serde_json::Value::Null, Into::into),
    );
    println!("{}", serde_json::Value::Object(json));
}
