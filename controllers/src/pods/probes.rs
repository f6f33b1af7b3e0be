//! Liveness, readiness and startup probes over httpGet, tcpSocket and exec, with Kubernetes' defaults
//! (period 10 s, timeout 1 s, success 1, failure 3, initial delay 0).
//!
//! One worker task per probed container, started when it runs and cancelled when it stops. Probes reach
//! the pod at its infra container's address (from the observed cache) from the host; exec probes go
//! through the runtime. A probe *error* (the check could not be made: connection refused, no address, the
//! engine failed) counts as a failure against the threshold, except that an error alone never fails a
//! probe: a streak of failures needs more than one lone error. Readiness and liveness start once the
//! startup probe (if any) has passed. Results land in [`ProbeResults`]; a change wakes the pod's reconcile.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hostlet_api::manifest::{Container, PodManifest, Probe, ProbeAction};
use hostlet_api::naming;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::PodMetrics;
use super::observed::{ObservedCache, PodChanged};
use super::planner::ObservedPod;
use super::probe_results::ProbeResults;
use super::runtime::{ContainerRuntime, RunState, RuntimeError};
use super::status::StatusWriter;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "liveness",
            ProbeKind::Readiness => "readiness",
            ProbeKind::Startup => "startup",
        }
    }
    fn title(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }
}

/// One attempt's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    /// The check ran and said no (HTTP status ≥ 400, connection refused on tcpSocket, non-zero exit).
    Failure(String),
    /// The check could not be made.
    Error(String),
}

impl ProbeOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            ProbeOutcome::Success => "success",
            ProbeOutcome::Failure(_) => "failure",
            ProbeOutcome::Error(_) => "error",
        }
    }
    fn message(&self) -> &str {
        match self {
            ProbeOutcome::Success => "",
            ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => m,
        }
    }
}

/// Consecutive results against a probe's thresholds. Pure, so the rules are unit-tested.
#[derive(Debug, Clone)]
pub struct ProbeTracker {
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    errors_in_streak: u32,
    passing: bool,
}

impl ProbeTracker {
    /// `initially_passing`: liveness starts out passing (nothing is killed before a probe failed),
    /// readiness and startup start out not passing.
    pub fn new(probe: &Probe, initially_passing: bool) -> Self {
        let clamp = |v: i64| u32::try_from(v).unwrap_or(u32::MAX).max(1);
        ProbeTracker {
            success_threshold: clamp(probe.success_threshold()),
            failure_threshold: clamp(probe.failure_threshold()),
            successes: 0,
            failures: 0,
            errors_in_streak: 0,
            passing: initially_passing,
        }
    }

    pub fn passing(&self) -> bool {
        self.passing
    }

    /// Counts one attempt; returns the new verdict when it changed.
    pub fn record(&mut self, outcome: &ProbeOutcome) -> Option<bool> {
        let before = self.passing;
        match outcome {
            ProbeOutcome::Success => {
                self.failures = 0;
                self.errors_in_streak = 0;
                self.successes = self.successes.saturating_add(1);
                if self.successes >= self.success_threshold {
                    self.passing = true;
                }
            }
            ProbeOutcome::Failure(_) | ProbeOutcome::Error(_) => {
                self.successes = 0;
                self.failures = self.failures.saturating_add(1);
                if matches!(outcome, ProbeOutcome::Error(_)) {
                    self.errors_in_streak += 1;
                }
                let lone_error = self.failures == 1 && self.errors_in_streak == 1;
                if self.failures >= self.failure_threshold && !lone_error {
                    self.passing = false;
                }
            }
        }
        (self.passing != before).then_some(self.passing)
    }
}

/// How a worker reaches the runtime, the pod's address, and the rest of hostlet.
struct ProbeContext<R> {
    rt: Arc<R>,
    http: reqwest::Client,
    cache: ObservedCache,
    results: ProbeResults,
    status: StatusWriter,
    changed: PodChanged,
    metrics: Option<PodMetrics>,
}

/// The httpGet probes' client. Probes run as root in the host's network: a redirect is followed only to
/// the host the probe named (any port), so a pod cannot point the agent at another host; a redirect
/// elsewhere is not followed and its 3xx answer is the probe's result.
pub fn probe_client() -> reqwest::Client {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().and_then(|u| u.host_str());
        let same_host = first.is_some() && first == attempt.url().host_str();
        if attempt.previous().len() > 10 {
            attempt.error("too many redirects")
        } else if same_host {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    reqwest::Client::builder()
        .no_proxy()
        // Like the kubelet: no connection reuse, so each probe tests that the server still accepts.
        .pool_max_idle_per_host(0)
        .redirect(policy)
        .build()
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot build the probe HTTP client; httpGet probes follow no redirect");
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default()
        })
}

/// Starts and stops probe workers as containers come and go.
pub struct ProbeManager<R> {
    ctx: Arc<ProbeContext<R>>,
    /// Container id → (pod id, the worker's token).
    workers: Mutex<HashMap<String, (String, CancellationToken)>>,
    shutdown: CancellationToken,
}

impl<R: ContainerRuntime> ProbeManager<R> {
    pub fn new(
        rt: Arc<R>,
        cache: ObservedCache,
        results: ProbeResults,
        status: StatusWriter,
        changed: PodChanged,
        metrics: Option<PodMetrics>,
        shutdown: CancellationToken,
    ) -> Self {
        let http = probe_client();
        ProbeManager {
            ctx: Arc::new(ProbeContext {
                rt,
                http,
                cache,
                results,
                status,
                changed,
                metrics,
            }),
            workers: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn workers(&self) -> MutexGuard<'_, HashMap<String, (String, CancellationToken)>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the pod's workers match its running containers: one per running container that has probes
    /// (and the spec of the manifest), none for anything else.
    pub fn sync_pod(&self, pod: &str, manifest: Option<&PodManifest>, observed: &ObservedPod) {
        let mut wanted: HashMap<String, (Container, SystemTime)> = HashMap::new();
        if let Some(m) = manifest {
            let sidecars = m.init_containers.iter().filter(|c| c.is_sidecar());
            for (c, sidecar) in sidecars
                .map(|c| (c, true))
                .chain(m.containers.iter().map(|c| (c, false)))
            {
                let probed = c.liveness_probe.is_some()
                    || c.readiness_probe.is_some()
                    || c.startup_probe.is_some();
                let cur = if sidecar {
                    observed.current_init(&c.name)
                } else {
                    observed.current(&c.name)
                };
                let Some(cur) = cur else {
                    continue;
                };
                let RunState::Running { started_at } = cur.state else {
                    continue;
                };
                if probed && cur.labels.spec_hash == naming::container_spec_hash(m, c) {
                    wanted.insert(cur.id.clone(), (c.clone(), started_at));
                }
            }
        }
        let mut workers = self.workers();
        let stale: Vec<String> = workers
            .iter()
            .filter(|(id, (p, _))| p == pod && !wanted.contains_key(*id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some((_, token)) = workers.remove(&id) {
                token.cancel();
            }
            self.ctx.results.remove(&id);
        }
        for (id, (container, started_at)) in wanted {
            if workers.contains_key(&id) {
                continue;
            }
            let token = self.shutdown.child_token();
            workers.insert(id.clone(), (pod.to_string(), token.clone()));
            if container.startup_probe.is_some() {
                self.ctx.results.update(&id, |s| s.started = false);
            }
            let ctx = self.ctx.clone();
            let target = Target {
                pod: pod.to_string(),
                id,
                container,
                started_at,
            };
            tokio::spawn(async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = run_worker(ctx, target) => {}
                }
            });
        }
    }

    /// Stops every worker of a pod.
    pub fn forget_pod(&self, pod: &str) {
        self.sync_pod(pod, None, &ObservedPod::default());
    }
}

struct Target {
    pod: String,
    id: String,
    container: Container,
    started_at: SystemTime,
}

async fn run_worker<R: ContainerRuntime>(ctx: Arc<ProbeContext<R>>, t: Target) {
    let (started_tx, started_rx) = watch::channel(t.container.startup_probe.is_none());
    let started_tx = &started_tx;
    let startup = async {
        if let Some(p) = &t.container.startup_probe {
            run_probe(&ctx, &t, ProbeKind::Startup, p, started_tx).await;
        }
    };
    let gated = |kind: ProbeKind, probe: Option<Probe>| {
        let mut rx = started_rx.clone();
        let (ctx, t) = (&ctx, &t);
        async move {
            let Some(p) = probe else { return };
            if rx.wait_for(|s| *s).await.is_err() {
                return;
            }
            run_probe(ctx, t, kind, &p, started_tx).await;
        }
    };
    tokio::join!(
        startup,
        gated(ProbeKind::Liveness, t.container.liveness_probe.clone()),
        gated(ProbeKind::Readiness, t.container.readiness_probe.clone()),
    );
}

async fn run_probe<R: ContainerRuntime>(
    ctx: &ProbeContext<R>,
    t: &Target,
    kind: ProbeKind,
    probe: &Probe,
    started: &watch::Sender<bool>,
) {
    let period = Duration::from_secs(probe.period().unsigned_abs());
    let timeout = Duration::from_secs(probe.timeout().unsigned_abs());
    let first = t.started_at + Duration::from_secs(probe.initial_delay().unsigned_abs());
    if let Ok(wait) = first.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    let mut tracker = ProbeTracker::new(probe, kind == ProbeKind::Liveness);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let outcome = execute(ctx, t, probe, timeout).await;
        if let Some(m) = &ctx.metrics {
            m.probe_results
                .with_label_values(&[kind.as_str(), outcome.label()])
                .inc();
        }
        let verdict = tracker.record(&outcome);
        let label = outcome.label().to_string();
        let mut notify = false;
        ctx.results.update(&t.id, |s| {
            notify |= s.last.insert(kind.as_str().to_string(), label.clone()) != Some(label);
        });
        if !matches!(outcome, ProbeOutcome::Success) && kind != ProbeKind::Readiness {
            ctx.status.event(
                &t.pod,
                Some(&t.container.name),
                "Unhealthy",
                &format!(
                    "{} probe {}: {}",
                    kind.title(),
                    outcome.label(),
                    outcome.message()
                ),
                true,
            );
        }
        match (kind, verdict) {
            (ProbeKind::Startup, Some(true)) => {
                started.send_replace(true);
                ctx.results.update(&t.id, |s| s.started = true);
                notify = true;
            }
            (ProbeKind::Liveness | ProbeKind::Startup, Some(false)) => {
                let message = format!("{} probe failed: {}", kind.title(), outcome.message());
                ctx.results.update(&t.id, |s| s.unhealthy = Some(message));
                notify = true;
            }
            (ProbeKind::Readiness, Some(ready)) => {
                ctx.results.update(&t.id, |s| s.ready = ready);
                notify = true;
            }
            _ => {}
        }
        if notify {
            (ctx.changed)(&t.pod);
        }
        if kind == ProbeKind::Startup && verdict.is_some() {
            // Passed (the others take over) or failed (the container is restarted): either way, done.
            return;
        }
    }
}

fn pod_ip(cache: &ObservedCache, pod: &str) -> Option<IpAddr> {
    cache.pod(pod).infra().and_then(|i| i.ip)
}

async fn execute<R: ContainerRuntime>(
    ctx: &ProbeContext<R>,
    t: &Target,
    probe: &Probe,
    timeout: Duration,
) -> ProbeOutcome {
    let host = |explicit: Option<&String>| -> Result<String, ProbeOutcome> {
        match explicit.filter(|h| !h.is_empty()) {
            Some(h) => Ok(h.clone()),
            None => pod_ip(&ctx.cache, &t.pod)
                .map(|ip| ip.to_string())
                .ok_or_else(|| ProbeOutcome::Error("the pod has no address yet".into())),
        }
    };
    match probe.action() {
        None => ProbeOutcome::Error("no probe handler".into()),
        Some(ProbeAction::Http(h)) => {
            let Some(port) = h.port.resolve(&t.container) else {
                return ProbeOutcome::Error("unknown port".into());
            };
            let host = match host(h.host.as_ref()) {
                Ok(h) => h,
                Err(e) => return e,
            };
            let path = h.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
            let url = format!("http://{host}:{port}{path}");
            match ctx.http.get(&url).timeout(timeout).send().await {
                Ok(resp) if (200..400).contains(&resp.status().as_u16()) => ProbeOutcome::Success,
                Ok(resp) => ProbeOutcome::Failure(format!(
                    "HTTP probe failed with statuscode: {}",
                    resp.status().as_u16()
                )),
                Err(e) => ProbeOutcome::Error(format!("GET {url}: {}", crate::http_failure(&e))),
            }
        }
        Some(ProbeAction::Tcp(tcp)) => {
            let Some(port) = tcp.port.resolve(&t.container) else {
                return ProbeOutcome::Error("unknown port".into());
            };
            let host = match host(None) {
                Ok(h) => h,
                Err(e) => return e,
            };
            match tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), port)),
            )
            .await
            {
                Ok(Ok(_)) => ProbeOutcome::Success,
                Ok(Err(e)) => ProbeOutcome::Failure(format!("dial tcp {host}:{port}: {e}")),
                Err(_) => ProbeOutcome::Failure(format!(
                    "dial tcp {host}:{port}: timed out after {timeout:?}"
                )),
            }
        }
        Some(ProbeAction::Exec(e)) => match ctx.rt.exec(&t.id, &e.command, timeout).await {
            Ok(0) => ProbeOutcome::Success,
            Ok(code) => ProbeOutcome::Failure(format!("command exited with {code}")),
            Err(RuntimeError::Timeout(d)) => {
                ProbeOutcome::Failure(format!("command timed out after {d:?}"))
            }
            Err(err) => ProbeOutcome::Error(err.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(failure: i64, success: i64) -> Probe {
        Probe {
            failure_threshold: Some(failure),
            success_threshold: Some(success),
            ..Default::default()
        }
    }

    fn run(tracker: &mut ProbeTracker, outcomes: &[ProbeOutcome]) -> Vec<Option<bool>> {
        outcomes.iter().map(|o| tracker.record(o)).collect()
    }

    #[test]
    fn thresholds_as_kubernetes_counts_them() {
        use ProbeOutcome::*;
        let f = || Failure("HTTP 500".into());
        let e = || Error("connection refused".into());
        type Case = (
            &'static str,
            Probe,
            bool,
            Vec<ProbeOutcome>,
            Vec<Option<bool>>,
        );
        let table: Vec<Case> = vec![
            (
                "liveness fails on the third failure in a row (defaults)",
                Probe::default(),
                true,
                vec![f(), f(), f()],
                vec![None, None, Some(false)],
            ),
            (
                "a success in between restarts the count",
                Probe::default(),
                true,
                vec![f(), f(), Success, f(), f()],
                vec![None, None, None, None, None],
            ),
            (
                "errors count as failures",
                Probe::default(),
                true,
                vec![e(), f(), e()],
                vec![None, None, Some(false)],
            ),
            (
                "one error never kills, even with failureThreshold 1",
                probe(1, 1),
                true,
                vec![e(), Success, e(), Success],
                vec![None, None, None, None],
            ),
            (
                "but two errors in a row do",
                probe(1, 1),
                true,
                vec![e(), e()],
                vec![None, Some(false)],
            ),
            (
                "a plain failure with threshold 1 fails at once",
                probe(1, 1),
                true,
                vec![f()],
                vec![Some(false)],
            ),
            (
                "readiness starts not ready and needs successThreshold successes",
                probe(3, 2),
                false,
                vec![Success, Success, f(), f(), f()],
                vec![None, Some(true), None, None, Some(false)],
            ),
        ];
        for (name, p, initial, outcomes, want) in table {
            let mut t = ProbeTracker::new(&p, initial);
            assert_eq!(run(&mut t, &outcomes), want, "{name}");
        }
    }

    #[test]
    fn defaults_are_kubernetes_defaults() {
        let p = Probe::default();
        assert_eq!(
            (
                p.period(),
                p.timeout(),
                p.failure_threshold(),
                p.success_threshold(),
                p.initial_delay()
            ),
            (10, 1, 3, 1, 0)
        );
    }

    /// A one-route HTTP server on `ip`: answers every request with `answer` and counts the requests.
    async fn serve(
        ip: &str,
        answer: impl Fn(u16) -> String + Send + Sync + 'static,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(answer(port).as_bytes()).await;
            }
        });
        (port, hits)
    }

    fn redirect_to(location: String) -> String {
        format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    }

    #[tokio::test]
    async fn redirects_are_followed_to_the_same_host_only() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string();
        let (other, other_hits) = serve("127.0.0.2", move |_| ok.clone()).await;
        let (away, _) = serve("127.0.0.1", move |_| {
            redirect_to(format!("http://127.0.0.2:{other}/"))
        })
        .await;
        let (same_target, same_hits) = serve("127.0.0.1", |_| {
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_string()
        })
        .await;
        let (same, _) = serve("127.0.0.1", move |_| {
            redirect_to(format!("http://127.0.0.1:{same_target}/healthz"))
        })
        .await;
        let client = probe_client();
        let r = client
            .get(format!("http://127.0.0.1:{away}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status().as_u16(),
            302,
            "the redirect answer is the result"
        );
        let r = client
            .get(format!("http://127.0.0.1:{same}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204, "a same-host redirect is followed");
        assert_eq!(same_hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(
            other_hits.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "another host was asked"
        );
    }
}
