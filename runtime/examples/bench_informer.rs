//! Benchmark: events through the informer into the store, against a bare etcd-client watch (the floor).
//!
//! Writes KEYS keys (default 50,000) in transactions of BATCH puts (default 100) from WRITERS concurrent
//! writers (default 2, one per core), each value stamped with its send time. Two consumers see the same
//! writes: the informer (a value is visible once it is in the store and the store's change feed has woken
//! the consumer that reads it) and a bare etcd-client watch (the floor). For each: events/s from the first
//! put sent to the last key seen, and put-to-visible latency. ROUNDS rounds (default 3), each on a fresh
//! etcd; the figures are the medians over the rounds. Nothing is asserted. The last line of output is one
//! JSON object.
//!
//! Run it with `hack/bench.sh informer` (environment: KEYS, BATCH, WRITERS, ROUNDS).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use etcd_client::{Txn, TxnOp, WatchOptions};
use hostlet_runtime::testkit::TestEtcd;
use hostlet_runtime::{Etcd, Informer};
use tokio_util::sync::CancellationToken;

const VALUE_SIZE: usize = 256;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nanoseconds since the benchmark started, on the monotonic clock both consumers share.
fn now_nanos() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The send time a value carries (its first 20 characters).
fn stamp(value: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(value.get(..20).ok_or("short value")?)
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())
}

struct Params {
    keys: usize,
    batch: usize,
    writers: usize,
}

/// Writes the keys under `prefix`; returns when the first transaction was sent.
async fn write_all(etcd: &Etcd, prefix: &str, p: &Params) -> u64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = now_nanos();
    let batches = p.keys.div_ceil(p.batch);
    let tasks: Vec<_> = (0..p.writers)
        .map(|_| {
            let next = next.clone();
            let mut client = etcd.client();
            let prefix = prefix.to_string();
            let (keys, batch) = (p.keys, p.batch);
            tokio::spawn(async move {
                let padding = "x".repeat(VALUE_SIZE - 21);
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= batches {
                        return;
                    }
                    let sent = now_nanos();
                    let ops: Vec<TxnOp> = (b * batch..((b + 1) * batch).min(keys))
                        .map(|i| {
                            TxnOp::put(
                                format!("{prefix}{i:08}"),
                                format!("{sent:020} {padding}"),
                                None,
                            )
                        })
                        .collect();
                    if let Err(e) = client.txn(Txn::new().and_then(ops)).await {
                        eprintln!("write failed: {e}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    started
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    events_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn figures(mut latencies: Vec<u64>, started: u64, finished: u64) -> Figures {
    latencies.sort_unstable();
    let pct = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1e6
    };
    Figures {
        events_per_s: latencies.len() as f64 / ((finished - started) as f64 / 1e9),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    }
}

/// Collects put-to-visible latencies until `keys` keys were seen; returns them and when the last was.
type Seen = (Vec<u64>, u64);

/// The floor: a bare etcd-client watch that reads each event's stamp.
async fn raw_consumer(etcd: &Etcd, prefix: &str, keys: usize) -> tokio::task::JoinHandle<Seen> {
    let mut client = etcd.client();
    let (watcher, mut stream) = client
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    tokio::spawn(async move {
        let _watcher = watcher;
        let mut latencies = Vec::with_capacity(keys);
        let mut last = 0;
        while latencies.len() < keys {
            let Ok(Some(resp)) = stream.message().await else {
                break;
            };
            for ev in resp.events() {
                if let Some(kv) = ev.kv() {
                    if let Ok(sent) = stamp(kv.value()) {
                        last = now_nanos();
                        latencies.push(last - sent);
                    }
                }
            }
        }
        (latencies, last)
    })
}

/// The informer into its store, and a controller-like consumer that reads each changed key from the store.
async fn informer_consumer(
    etcd: &Etcd,
    prefix: &str,
    keys: usize,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<Seen> {
    let informer = Informer::new("bench", etcd.clone(), prefix, |_, v| stamp(v));
    let store = informer.store();
    let mut changes = store.subscribe();
    tokio::spawn(informer.run(shutdown));
    store.wait_until_ready().await;
    tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(keys);
        let mut last = 0;
        while latencies.len() < keys {
            let Some(batch) = changes.next_batch().await else {
                break;
            };
            for key in batch {
                if let Some(obj) = store.get(&key) {
                    if let Ok(sent) = obj.value {
                        last = now_nanos();
                        latencies.push(last - sent);
                    }
                }
            }
        }
        (latencies, last)
    })
}

/// One round on a fresh etcd: both consumers watch the same writes.
async fn round(p: &Params) -> (Figures, Figures) {
    let etcd_proc = TestEtcd::start().await;
    let etcd = etcd_proc.connect().await;
    let prefix = "/bench/";
    let shutdown = CancellationToken::new();
    let raw = raw_consumer(&etcd, prefix, p.keys).await;
    let inf = informer_consumer(&etcd, prefix, p.keys, shutdown.clone()).await;
    let started = write_all(&etcd, prefix, p).await;
    let (raw_lat, raw_end) = raw.await.expect("raw consumer");
    let (inf_lat, inf_end) = inf.await.expect("informer consumer");
    shutdown.cancel();
    (
        figures(raw_lat, started, raw_end),
        figures(inf_lat, started, inf_end),
    )
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let p = Params {
        keys: env("KEYS", 50_000).max(1),
        batch: env("BATCH", 100).clamp(1, 128),
        writers: env("WRITERS", 2).max(1),
    };
    let rounds = env("ROUNDS", 3).max(1);
    now_nanos();
    println!(
        "informer benchmark: {} keys of {VALUE_SIZE} B, {} puts per transaction, {} writers, {rounds} rounds; \
         each round on a fresh etcd, the informer and the bare watch consuming the same writes",
        p.keys, p.batch, p.writers
    );
    let (mut raw, mut inf) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        let (r, i) = round(&p).await;
        println!(
            "round {n}: raw {:>9.0} ev/s p50 {:.2} ms p99 {:.2} ms | informer {:>9.0} ev/s p50 {:.2} ms p99 {:.2} ms",
            r.events_per_s, r.p50_ms, r.p99_ms, i.events_per_s, i.p50_ms, i.p99_ms
        );
        raw.push(r);
        inf.push(i);
    }
    let m = |xs: &[Figures], f: fn(&Figures) -> f64| median(xs.iter().map(f).collect());
    let raw_eps = m(&raw, |f| f.events_per_s);
    let inf_eps = m(&inf, |f| f.events_per_s);
    let raw_p99 = m(&raw, |f| f.p99_ms);
    let inf_p99 = m(&inf, |f| f.p99_ms);
    // Both consumers saw the same writes in a round: compare within rounds, then take the median.
    let ratio = median(
        raw.iter()
            .zip(&inf)
            .map(|(r, i)| i.events_per_s / r.events_per_s)
            .collect(),
    );
    let overhead = median(
        raw.iter()
            .zip(&inf)
            .map(|(r, i)| i.p99_ms - r.p99_ms)
            .collect(),
    );
    println!(
        "median: raw {raw_eps:.0} ev/s p99 {raw_p99:.2} ms | informer {inf_eps:.0} ev/s p99 {inf_p99:.2} ms"
    );
    println!(
        "throughput_ratio {ratio:.3} (target >= 0.9), p99_overhead_ms {overhead:.2} (target <= 2); \
         both are medians of the per-round comparisons"
    );
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let json = serde_json::json!({
        "bench": "informer",
        "keys": p.keys,
        "batch": p.batch,
        "writers": p.writers,
        "rounds": rounds,
        "informer_events_per_s": inf_eps.round(),
        "raw_events_per_s": raw_eps.round(),
        "throughput_ratio": round3(ratio),
        "informer_p50_ms": round3(m(&inf, |f| f.p50_ms)),
        "informer_p99_ms": round3(inf_p99),
        "raw_p50_ms": round3(m(&raw, |f| f.p50_ms)),
        "raw_p99_ms": round3(raw_p99),
        "p99_overhead_ms": round3(overhead),
        "target_throughput_ratio": 0.9,
        "target_p99_overhead_ms": 2.0,
    });
    println!("{json}");
}
