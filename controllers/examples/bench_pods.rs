//! Benchmark: 50 one-container pods put into etcd at once, run by the pod controller, against the same 100
//! containers (infra + app, same images, same namespace sharing) created and started directly through the
//! Docker API (the floor). Then 60 s idle with the 50 pods: the Docker API calls the controller made
//! (counted by a proxy on the Docker socket), its RSS and CPU.
//!
//! The pod controller runs in a child process (this binary with `agent`), so that its RSS and CPU are its
//! own; its Docker socket is the counting proxy. Put → running is measured from the put to Docker's start
//! event of the pod's app container. Nothing is asserted; the last line of output is one JSON object.
//!
//! Run it with `hack/bench.sh pods` (environment: PODS (50), IDLE_SECS (60), CONCURRENCY (8)).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::query_parameters::{
    EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use hostlet_api::{parse_manifest, KeyLayout};
use hostlet_controllers::pods::controller::{start_pod_controller, PodControllerConfig};
use hostlet_controllers::pods::docker::DockerRuntime;
use hostlet_controllers::pods::metrics::DockerOpMetrics;
use hostlet_controllers::pods::runtime::ContainerRuntime;
use hostlet_controllers::pods::spec::{app_spec, infra_spec, SpecConfig};
use hostlet_runtime::testkit::TestEtcd;
use hostlet_runtime::{Etcd, EtcdConfig, Metrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

const DOCKER_SOCKET: &str = "/var/run/docker.sock";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn manifest(id: &str) -> String {
    format!(
        "version: v1beta1\nid: {id}\nterminationGracePeriodSeconds: 2\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n"
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("agent") {
        return agent(&args[2..]).await;
    }
    bench().await
}

/// The child: only the pod controller, until killed.
async fn agent(args: &[String]) -> anyhow::Result<()> {
    let [node, endpoint, docker_host, data_dir, workers] = args else {
        anyhow::bail!("usage: bench_pods agent NODE ETCD_ENDPOINT DOCKER_HOST DATA_DIR WORKERS");
    };
    let etcd = Etcd::connect(EtcdConfig::new([endpoint.as_str()])).await?;
    let metrics = Metrics::new();
    let mut cfg = PodControllerConfig::new(node, data_dir);
    cfg.docker_host = Some(docker_host.clone());
    cfg.workers = workers.parse()?;
    let informers = hostlet_runtime::InformerFactory::new(etcd, metrics, CancellationToken::new());
    let (_handle, task) = start_pod_controller(cfg, &informers)?;
    task.await?;
    Ok(())
}

/// Counts the HTTP requests a client sends through the proxy.
#[derive(Default)]
struct Calls {
    total: AtomicU64,
    log: Mutex<Vec<String>>,
}

enum Framing {
    Headers,
    Body(usize),
    /// Upgraded or chunked: not HTTP/1.1 requests any more.
    Raw,
}

/// Splits the client→engine byte stream into requests.
struct RequestCounter {
    buf: Vec<u8>,
    framing: Framing,
}

impl RequestCounter {
    fn feed(&mut self, bytes: &[u8], calls: &Calls) {
        self.buf.extend_from_slice(bytes);
        loop {
            match self.framing {
                Framing::Raw => {
                    self.buf.clear();
                    return;
                }
                Framing::Body(n) => {
                    let take = n.min(self.buf.len());
                    self.buf.drain(..take);
                    if take < n {
                        self.framing = Framing::Body(n - take);
                        return;
                    }
                    self.framing = Framing::Headers;
                }
                Framing::Headers => {
                    let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        return;
                    };
                    let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                    self.buf.drain(..end + 4);
                    let first = head.lines().next().unwrap_or_default();
                    calls.total.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut log) = calls.log.lock() {
                        log.push(first.split(' ').take(2).collect::<Vec<_>>().join(" "));
                    }
                    let lower = head.to_ascii_lowercase();
                    let length = lower
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    self.framing = if lower.contains("\nupgrade:")
                        || lower.contains("transfer-encoding: chunked")
                    {
                        Framing::Raw
                    } else {
                        Framing::Body(length)
                    };
                }
            }
        }
    }
}

async fn proxy(path: PathBuf, calls: Arc<Calls>) -> anyhow::Result<()> {
    let listener = UnixListener::bind(&path)?;
    loop {
        let (client, _) = listener.accept().await?;
        let calls = calls.clone();
        tokio::spawn(async move {
            let Ok(engine) = UnixStream::connect(DOCKER_SOCKET).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut er, mut ew) = engine.into_split();
            let up = async {
                let mut counter = RequestCounter {
                    buf: Vec::new(),
                    framing: Framing::Headers,
                };
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    counter.feed(&buf[..n], &calls);
                    if ew.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = ew.shutdown().await;
            };
            let down = async {
                let _ = tokio::io::copy(&mut er, &mut cw).await;
                let _ = cw.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}

/// Start times (unix nanos) of app containers by pod, for one node label, from Docker's events.
fn watch_starts(docker: &Docker, node: &str) -> Arc<Mutex<HashMap<String, u128>>> {
    let starts = Arc::new(Mutex::new(HashMap::new()));
    let filters: HashMap<&str, Vec<String>> = HashMap::from([
        ("type", vec!["container".to_string()]),
        ("event", vec!["start".to_string()]),
        (
            "label",
            vec![
                format!("io.hostlet.node={node}"),
                "io.hostlet.role=app".to_string(),
            ],
        ),
    ]);
    let mut events = docker.events(Some(EventsOptionsBuilder::new().filters(&filters).build()));
    let out = starts.clone();
    tokio::spawn(async move {
        while let Some(Ok(ev)) = events.next().await {
            let attrs = ev.actor.and_then(|a| a.attributes).unwrap_or_default();
            if let (Some(pod), Some(t)) = (attrs.get("io.hostlet.pod"), ev.time_nano) {
                if let Ok(mut m) = out.lock() {
                    m.entry(pod.clone()).or_insert(t as u128);
                }
            }
        }
    });
    starts
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

async fn wait_all(
    starts: &Mutex<HashMap<String, u128>>,
    n: usize,
    deadline: Duration,
) -> anyhow::Result<()> {
    let t = Instant::now();
    while starts.lock().map(|m| m.len()).unwrap_or(0) < n {
        if t.elapsed() > deadline {
            anyhow::bail!(
                "only {} of {n} pods running after {deadline:?}",
                starts.lock().map(|m| m.len()).unwrap_or(0)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `(utime + stime ticks, RSS bytes)` of a process.
fn proc_usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = fields
        .get(11)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    (ticks, rss_kb * 1024)
}

async fn remove_node_containers(docker: &Docker, node: &str) {
    let filters: HashMap<&str, Vec<String>> =
        HashMap::from([("label", vec![format!("io.hostlet.node={node}")])]);
    let opts = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let Ok(list) = docker.list_containers(Some(opts)).await else {
        return;
    };
    let removals = list.into_iter().filter_map(|c| c.id).map(|id| {
        let docker = docker.clone();
        async move {
            let opts = RemoveContainerOptionsBuilder::new()
                .force(true)
                .v(true)
                .build();
            let _ = docker.remove_container(&id, Some(opts)).await;
        }
    });
    futures::future::join_all(removals).await;
}

/// The floor: the same containers, created and started straight through the Docker API, `concurrency`
/// pods at a time. Returns seconds from the first call to the last app container running.
async fn direct(
    docker: &Docker,
    node: &str,
    pods: usize,
    concurrency: usize,
    data: &Path,
) -> anyhow::Result<f64> {
    let rt = Arc::new(DockerRuntime::new(
        Some(&format!("unix://{DOCKER_SOCKET}")),
        node,
        DockerOpMetrics::unregistered(),
    )?);
    let cfg = SpecConfig::new(node, data);
    rt.ping().await?;
    let starts = watch_starts(docker, node);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let manifests: Vec<_> = (0..pods)
        .map(|i| parse_manifest(manifest(&format!("d{i}")).as_bytes()))
        .collect::<Result<_, _>>()?;
    futures::stream::iter(manifests)
        .for_each_concurrent(concurrency, |m| {
            let (rt, cfg) = (rt.clone(), cfg.clone());
            async move {
                let infra = infra_spec(&cfg, &m, 0);
                let Ok(infra_id) = rt.create(&infra).await else {
                    return;
                };
                if rt.start(&infra_id).await.is_err() {
                    return;
                }
                let app = app_spec(
                    &cfg,
                    &m,
                    &Default::default(),
                    &m.containers[0],
                    &infra_id,
                    0,
                );
                if let Ok(id) = rt.create(&app).await {
                    let _ = rt.start(&id).await;
                }
            }
        })
        .await;
    wait_all(&starts, pods, Duration::from_secs(120)).await?;
    Ok(t0.elapsed().as_secs_f64())
}

async fn bench() -> anyhow::Result<()> {
    let pods = env("PODS", 50) as usize;
    let idle = Duration::from_secs(env("IDLE_SECS", 60));
    let concurrency = env("CONCURRENCY", 8) as usize;
    let docker = Docker::connect_with_unix(DOCKER_SOCKET, 120, bollard::API_DEFAULT_VERSION)?
        .negotiate_version()
        .await?;
    let tmp = tempfile::tempdir()?;
    let tag = format!("{:08x}", rand::random::<u32>());
    let node = format!("bench-pods-{tag}");
    let direct_node = format!("bench-direct-{tag}");

    // The floor first, then cleaned away, so both start from the same engine state.
    let direct_s = direct(&docker, &direct_node, pods, concurrency, tmp.path()).await;
    remove_node_containers(&docker, &direct_node).await;
    let direct_s = direct_s?;
    println!("direct Docker API: {pods} pods (infra + app) running in {direct_s:.2} s");

    let etcd_server = TestEtcd::start().await;
    let etcd = etcd_server.connect().await;
    let calls = Arc::new(Calls::default());
    let sock = tmp.path().join("docker-proxy.sock");
    tokio::spawn(proxy(sock.clone(), calls.clone()));
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data)?;
    let exe = std::env::current_exe()?;
    let mut child: Child = Command::new(exe)
        .args([
            "agent",
            &node,
            &etcd_server.endpoint(),
            &format!("unix://{}", sock.display()),
            &data.display().to_string(),
            &concurrency.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let result = run_hostlet(
        &docker,
        &etcd,
        &node,
        pods,
        idle,
        &calls,
        child.id(),
        direct_s,
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    remove_node_containers(&docker, &node).await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_hostlet(
    docker: &Docker,
    etcd: &Etcd,
    node: &str,
    pods: usize,
    idle: Duration,
    calls: &Calls,
    pid: u32,
    direct_s: f64,
) -> anyhow::Result<()> {
    // Let the agent sync (its first list and the empty etcd prefix) before the clock starts.
    let t = Instant::now();
    while calls.total.load(Ordering::Relaxed) < 2 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let starts = watch_starts(docker, node);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let layout = KeyLayout::default();
    let puts = (0..pods).map(|i| {
        let id = format!("p{i}");
        let key = layout.pod(node, &id);
        async move {
            etcd.put(key, manifest(&id)).await?;
            Ok::<_, anyhow::Error>((id, unix_nanos()))
        }
    });
    let t0_nanos = unix_nanos();
    let t0 = Instant::now();
    let put_at: HashMap<String, u128> = futures::future::try_join_all(puts)
        .await?
        .into_iter()
        .collect();
    wait_all(&starts, pods, Duration::from_secs(120)).await?;
    let all_running = t0.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = {
        let starts = starts.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        put_at
            .iter()
            .filter_map(|(id, put)| {
                let started = starts.get(id)?;
                Some(started.saturating_sub(*put.max(&t0_nanos)) as f64 / 1e9)
            })
            .collect()
    };
    latencies.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    println!("hostlet: {pods} pods put at once: put → running p50 {p50:.2} s, p99 {p99:.2} s, all running in {all_running:.2} s");
    println!(
        "  ratio to the direct floor ({direct_s:.2} s): {:.2}",
        all_running / direct_s
    );

    // Settle (status writes, the last events), then the idle window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls_before = calls.total.load(Ordering::Relaxed);
    let log_before = calls.log.lock().map(|l| l.len()).unwrap_or(0);
    let (ticks_before, _) = proc_usage(pid);
    let idle_start = Instant::now();
    tokio::time::sleep(idle).await;
    let idle_secs = idle_start.elapsed().as_secs_f64();
    let (ticks_after, rss) = proc_usage(pid);
    let idle_calls = calls.total.load(Ordering::Relaxed) - calls_before;
    let idle_log: Vec<String> = calls
        .log
        .lock()
        .map(|l| l[log_before..].to_vec())
        .unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let clk_tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu_pct = (ticks_after - ticks_before) as f64 / clk_tck / idle_secs * 100.0;
    let calls_per_min = idle_calls as f64 * 60.0 / idle_secs;
    let rss_mb = rss as f64 / (1024.0 * 1024.0);
    println!(
        "idle {idle_secs:.0} s with {pods} pods: {idle_calls} Docker API calls ({calls_per_min:.1}/min: {idle_log:?}), RSS {rss_mb:.1} MB, CPU {cpu_pct:.2} % of a core"
    );
    println!("targets: ratio ≤ 1.2, idle calls ≤ 2/min, RSS ≤ 40 MB, idle CPU ≤ 1 %");
    let json = serde_json::json!({
        "bench": "pods",
        "pods": pods,
        "p50_s": round3(p50),
        "p99_s": round3(p99),
        "all_running_s": round3(all_running),
        "direct_all_running_s": round3(direct_s),
        "ratio": round3(all_running / direct_s),
        "idle_docker_calls_per_min": round3(calls_per_min),
        "rss_mb": round3(rss_mb),
        "idle_cpu_pct": round3(cpu_pct),
    });
    println!("{json}");
    Ok(())
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
