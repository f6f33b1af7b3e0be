//! Benchmark probe: a pod key put → seen by an agent's pod informer, against a direct etcd watch on the
//! same key in the same run (`hack/bench.sh scale` runs it against workers, whose informers go through a
//! voter's node API).
//!
//! For each round, one put of a pod manifest whose only change is an annotation (the pod's containers are
//! left as they are). The time of the put is taken just before it is sent; the direct watch (opened once,
//! before the first round, on the same etcd endpoints) notes when the event arrives; the agent notes when
//! its pod informer took the change in (`hostlet_informer_last_event_timestamp_seconds{informer="pods"}`,
//! read once `hostlet_informer_last_revision` shows the put's revision; both clocks are this host's).
//! Rounds go to the targets in turn, one at a time. Nothing is asserted; the last line of output is one
//! JSON object.
//!
//! Usage: `watch_probe --endpoints URL[,URL...] --ca FILE --cert FILE --key FILE [--rounds N]
//!         [--gap-ms MS] KEY=METRICS_ADDR...` (METRICS_ADDR as `127.0.0.1:PORT`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_runtime::{Etcd, EtcdConfig, TlsFiles};

const INFORMER: &str = "pods";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

struct Args {
    endpoints: Vec<String>,
    tls: TlsFiles,
    rounds: usize,
    gap: Duration,
    targets: Vec<(String, String)>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut endpoints, mut ca, mut cert, mut key) = (None, None, None, None);
    let (mut rounds, mut gap_ms, mut targets) = (50usize, 200u64, Vec::new());
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--endpoints" => endpoints = Some(value("--endpoints")?),
            "--ca" => ca = Some(value("--ca")?),
            "--cert" => cert = Some(value("--cert")?),
            "--key" => key = Some(value("--key")?),
            "--rounds" => {
                rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--gap-ms" => {
                gap_ms = value("--gap-ms")?
                    .parse()
                    .map_err(|e| format!("--gap-ms: {e}"))?
            }
            t => {
                let (k, m) = t
                    .split_once('=')
                    .ok_or(format!("{t}: expected KEY=METRICS_ADDR"))?;
                targets.push((k.to_string(), m.to_string()));
            }
        }
    }
    if targets.is_empty() {
        return Err("no KEY=METRICS_ADDR targets given".into());
    }
    Ok(Args {
        endpoints: endpoints
            .ok_or("--endpoints is required")?
            .split(',')
            .map(str::to_string)
            .collect(),
        tls: TlsFiles {
            ca: ca.ok_or("--ca is required")?.into(),
            cert: cert.ok_or("--cert is required")?.into(),
            key: key.ok_or("--key is required")?.into(),
        },
        rounds,
        gap: Duration::from_millis(gap_ms),
        targets,
    })
}

fn manifest(name: &str, seq: usize) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"bench.hostlet.io/seq": seq.to_string()}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    })
    .to_string()
}

/// The informer's revision and last-event time from the agent's metrics.
async fn informer_state(http: &reqwest::Client, addr: &str) -> Result<(i64, f64), String> {
    let body = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("{addr}: {e}"))?
        .text()
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let series = |name: &str| {
        let prefix = format!("{name}{{informer=\"{INFORMER}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (
        series("hostlet_informer_last_revision"),
        series("hostlet_informer_last_event_timestamp_seconds"),
    ) {
        (Some(r), Some(t)) => Ok((r as i64, t)),
        _ => Err(format!("{addr}: no {INFORMER} informer series")),
    }
}

/// The longest common prefix of the keys, where the direct watch looks.
fn common_prefix(keys: &[&str]) -> String {
    let first = keys.first().copied().unwrap_or("/");
    let mut n = first.len();
    for k in keys {
        n = n.min(
            first
                .bytes()
                .zip(k.bytes())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    first[..n].to_string()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| format!("watch_probe: {e}"))?;
    let etcd =
        Etcd::connect(EtcdConfig::new(args.endpoints.clone()).with_tls(args.tls.clone())).await?;
    let http = reqwest::Client::new();
    // One direct watch over the target keys' common prefix, opened before the first put.
    let keys: Vec<&str> = args.targets.iter().map(|(k, _)| k.as_str()).collect();
    let (_watcher, mut stream) = etcd.watch_prefix(common_prefix(&keys), 0).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, f64)>();
    tokio::spawn(async move {
        while let Ok(Some(resp)) = stream.message().await {
            let at = unix_now();
            for ev in resp.events() {
                if let Some(kv) = ev.kv() {
                    if tx.send((kv.mod_revision(), at)).is_err() {
                        return;
                    }
                }
            }
        }
    });

    let (mut direct, mut informer, mut lost) = (Vec::new(), Vec::new(), 0usize);
    for round in 0..args.rounds {
        let (key, metrics) = &args.targets[round % args.targets.len()];
        let name = key.rsplit('/').next().unwrap_or("probe");
        let t0 = unix_now();
        let rev = etcd.put(key, manifest(name, round)).await?;
        // The direct watch's arrival of this revision (a later one means this one was missed).
        let seen_direct = loop {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some((r, at))) if r == rev => break Some(at),
                Ok(Some((r, _))) if r < rev => continue,
                _ => break None,
            }
        };
        // The informer: polled until its revision reaches the put's; its own clock says when.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let seen_informer = loop {
            match informer_state(&http, metrics).await {
                Ok((r, at)) if r == rev => break Some(at),
                Ok((r, _)) if r > rev => break None,
                Ok(_) => {}
                Err(e) => eprintln!("watch_probe: {e}"),
            }
            if tokio::time::Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        match (seen_direct, seen_informer) {
            (Some(d), Some(i)) => {
                direct.push((d - t0) * 1000.0);
                informer.push((i - t0) * 1000.0);
            }
            _ => lost += 1,
        }
        tokio::time::sleep(args.gap).await;
    }
    let mut deltas: Vec<f64> = informer.iter().zip(&direct).map(|(i, d)| i - d).collect();
    direct.sort_by(f64::total_cmp);
    informer.sort_by(f64::total_cmp);
    deltas.sort_by(f64::total_cmp);
    let (d50, d99, i50, i99) = (
        pct(&direct, 0.5),
        pct(&direct, 0.99),
        pct(&informer, 0.5),
        pct(&informer, 0.99),
    );
    // The target: the informer within 1.2 × the direct watch plus 5 ms.
    let allowed = |d: f64| 1.2 * d + 5.0;
    println!(
        "pod key put → seen, {} rounds over {} agents ({} not measured):",
        direct.len(),
        args.targets.len(),
        lost
    );
    println!("  direct etcd watch:      p50 {d50:7.2} ms, p99 {d99:7.2} ms");
    println!(
        "  agent's pod informer:   p50 {i50:7.2} ms, p99 {i99:7.2} ms   (ratio {:.2} p50, {:.2} p99; target ≤ 1.2 × direct + 5 ms: p50 {:.2}, p99 {:.2} of it)",
        i50 / d50,
        i99 / d99,
        i50 / allowed(d50),
        i99 / allowed(d99)
    );
    println!(
        "  informer − direct, per put: p50 {:.2} ms, p99 {:.2} ms",
        pct(&deltas, 0.5),
        pct(&deltas, 0.99)
    );
    let r = |x: f64| (x * 100.0).round() / 100.0;
    println!(
        "{}",
        serde_json::json!({
            "probe": "pod_put_to_informer",
            "rounds": direct.len(),
            "lost": lost,
            "direct_p50_ms": r(d50), "direct_p99_ms": r(d99),
            "informer_p50_ms": r(i50), "informer_p99_ms": r(i99),
            "delta_p50_ms": r(pct(&deltas, 0.5)), "delta_p99_ms": r(pct(&deltas, 0.99)),
            "p50_to_target": r(i50 / allowed(d50)), "p99_to_target": r(i99 / allowed(d99)),
        })
    );
    Ok(())
}
