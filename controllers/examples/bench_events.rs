//! Benchmark: what a flood of events costs etcd. N identical failures (same pod, reason and message) and N
//! distinct ones (a new message each) are fed to the agent's [`EventRecorder`] and, as the baseline in the
//! same run, to a writer that puts one key per event on a shared lease (what hostlet did before events
//! aggregated). For each: event keys left in etcd, etcd requests (from the member's
//! `grpc_server_handled_total`), time until written, and the agent's RSS growth. Nothing is asserted;
//! the last line of output is one JSON object.
//!
//! Run it with `hack/bench.sh events` (environment: EVENTS, default 10000).

use std::time::{Duration, Instant};

use hostlet_api::objects::{Event, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_controllers::events::{
    EventKind, EventRecorder, AGGREGATE_WINDOW, EVENT_KEYS_PER_NODE, UPDATE_INTERVAL,
};
use hostlet_runtime::testkit::TestEtcd;
use hostlet_runtime::Etcd;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Requests the member has answered so far.
async fn handled(endpoint: &str) -> f64 {
    let text = match reqwest::get(format!("{endpoint}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

struct Run {
    keys: usize,
    rpc: f64,
    secs: f64,
    rss_mb: f64,
}

/// What a run left: its keys, the requests etcd answered, the time and the RSS growth since `start`.
async fn finish(etcd: &Etcd, endpoint: &str, node: &str, start: (f64, u64, Instant)) -> Run {
    let (rpc0, rss0, t0) = start;
    let secs = t0.elapsed().as_secs_f64();
    let rss = rss_kb().saturating_sub(rss0);
    let left = etcd
        .keys_with_prefix(KeyLayout::default().events_prefix(node))
        .await
        .map(|k| k.len())
        .unwrap_or(0);
    Run {
        keys: left,
        rpc: handled(endpoint).await - rpc0,
        secs,
        rss_mb: rss as f64 / 1024.0,
    }
}

fn message(distinct: bool, i: usize) -> String {
    if distinct {
        format!("Back-off restarting failed container (attempt {i})")
    } else {
        "Back-off restarting failed container".to_string()
    }
}

async fn recorder_run(etcd: &Etcd, endpoint: &str, node: &str, n: usize, distinct: bool) -> Run {
    let keys = KeyLayout::default();
    let rec = EventRecorder::new(etcd.clone(), keys.clone(), node);
    let (rpc0, rss0, t0) = (handled(endpoint).await, rss_kb(), Instant::now());
    for i in 0..n {
        rec.record_now(
            Some("web"),
            Some("app"),
            EventKind::Warning,
            "BackOff",
            message(distinct, i),
        );
    }
    let flushed = rec.flush(UPDATE_INTERVAL + Duration::from_secs(60)).await;
    if !flushed {
        eprintln!("warning: the recorder did not flush within its deadline");
    }
    finish(etcd, endpoint, node, (rpc0, rss0, t0)).await
}

/// One put per event on a shared lease: the writer events had before they aggregated.
async fn baseline_run(etcd: &Etcd, endpoint: &str, node: &str, n: usize, distinct: bool) -> Run {
    let keys = KeyLayout::default();
    let (rpc0, rss0, t0) = (handled(endpoint).await, rss_kb(), Instant::now());
    let lease = etcd
        .lease_grant(Duration::from_secs(48 * 3600))
        .await
        .unwrap_or(0);
    for i in 0..n {
        let now = std::time::SystemTime::now();
        let nanos = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let ev = Event {
            node: node.to_string(),
            pod: Some("web".into()),
            container: Some("app".into()),
            reason: "BackOff".into(),
            message: message(distinct, i),
            kind: "Warning".into(),
            timestamp: Timestamp(now),
            count: 1,
            first_timestamp: None,
            last_timestamp: None,
        };
        let key = keys.event(node, nanos, i as u64 % 1_000_000);
        let value = serde_json::to_vec(&ev).unwrap_or_default();
        if let Err(e) = etcd.put_with_lease(&key, value, lease).await {
            eprintln!("baseline put failed: {e}");
        }
    }
    finish(etcd, endpoint, node, (rpc0, rss0, t0)).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    hostlet_controllers::etcd_member::install_crypto_provider();
    let n = env("EVENTS", 10_000);
    let member = TestEtcd::start().await;
    let etcd = member.connect().await;
    let endpoint = member.endpoint();
    eprintln!(
        "{n} events each; cap {EVENT_KEYS_PER_NODE} keys per node, window {}s, updates at most every {}s",
        AGGREGATE_WINDOW.as_secs(),
        UPDATE_INTERVAL.as_secs()
    );
    let same_base = baseline_run(&etcd, &endpoint, "base-same", n, false).await;
    let same = recorder_run(&etcd, &endpoint, "rec-same", n, false).await;
    let diff_base = baseline_run(&etcd, &endpoint, "base-distinct", n, true).await;
    let diff = recorder_run(&etcd, &endpoint, "rec-distinct", n, true).await;
    println!(
        "{:<22} {:>8} {:>10} {:>9} {:>9}",
        "case", "keys", "requests", "seconds", "rss MB"
    );
    for (name, r) in [
        ("identical, baseline", &same_base),
        ("identical, recorder", &same),
        ("distinct, baseline", &diff_base),
        ("distinct, recorder", &diff),
    ] {
        println!(
            "{name:<22} {:>8} {:>10.0} {:>9.2} {:>9.1}",
            r.keys, r.rpc, r.secs, r.rss_mb
        );
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    println!(
        "{}",
        serde_json::json!({
            "bench": "events",
            "events": n,
            "cap": EVENT_KEYS_PER_NODE,
            "identical_keys": same.keys,
            "identical_keys_baseline": same_base.keys,
            "identical_rpc": same.rpc,
            "identical_rpc_baseline": same_base.rpc,
            "identical_rpc_ratio": ratio(same.rpc, same_base.rpc),
            "distinct_keys": diff.keys,
            "distinct_keys_baseline": diff_base.keys,
            "distinct_rpc": diff.rpc,
            "distinct_rpc_baseline": diff_base.rpc,
            "distinct_rpc_ratio": ratio(diff.rpc, diff_base.rpc),
            "recorder_rss_mb": same.rss_mb.max(diff.rss_mb),
            "baseline_rss_mb": same_base.rss_mb.max(diff_base.rss_mb),
        })
    );
}
