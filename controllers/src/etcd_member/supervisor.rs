//! Keeps the etcd child running: waits until it serves, watches its status (metrics, readiness, the
//! agent's endpoint list), restarts it with backoff when it exits, and stops it on request.

use std::path::PathBuf;
use std::time::Duration;

use std::sync::{Arc, OnceLock};

use etcd_client::StatusResponse;
use hostlet_runtime::{ComponentHandle, Etcd, ExponentialBackoff, Members};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::bootstrap::write_endpoints;
use super::layout::MemberLayout;
use super::metrics::MemberMetrics;
use super::process::{ClusterStart, EtcdProcess, MemberSpec};

/// How long etcd gets to stop after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(15);
/// Status poll period while the member runs (once the agent's member cache exists, a read of it: no
/// request).
const POLL: Duration = Duration::from_secs(2);
/// Poll period while waiting for the member to serve.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// Restart delays: 1 s doubling to 30 s, back to 1 s once a run lasted [`RESTART_RESET_AFTER`].
pub fn restart_backoff() -> ExponentialBackoff {
    ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30))
}

/// A run of etcd this long before it exits starts the restart delays over.
pub const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

/// The wait before restarting a process that ran for `ran_for`.
pub fn restart_delay(backoff: &mut ExponentialBackoff, ran_for: Duration) -> Duration {
    if ran_for >= RESTART_RESET_AFTER {
        backoff.reset();
    }
    backoff.next_delay()
}

/// Why waiting for the member to serve ended without it serving.
#[derive(Debug)]
pub enum WaitError {
    Exited(std::io::Result<std::process::ExitStatus>),
    /// It exited because the cluster removed this member.
    Removed,
    Cancelled,
}

/// Polls the local member until it serves (answers status and knows a leader), the process exits, or
/// `cancel` fires.
pub async fn wait_serving(
    child: &mut EtcdProcess,
    etcd: &Etcd,
    local_url: &str,
    cancel: &CancellationToken,
) -> Result<StatusResponse, WaitError> {
    let started = Instant::now();
    let mut last_log = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(WaitError::Cancelled),
            status = child.wait() => return Err(WaitError::Exited(status)),
            result = etcd.status_of(local_url) => {
                match result {
                    Ok(s) if s.leader() != 0 => return Ok(s),
                    Ok(_) => {}
                    Err(e) if last_log.elapsed() >= Duration::from_secs(10) => {
                        tracing::info!(waited = ?started.elapsed(), error = %e, "waiting for the etcd member to serve");
                        last_log = Instant::now();
                    }
                    Err(_) => {}
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(WaitError::Cancelled),
            _ = tokio::time::sleep(WAIT_POLL) => {}
        }
    }
}

/// The version gate before a restart (the binary may have been replaced since the member started):
/// `Err(message)`, naming both versions, while it refuses.
pub type RestartGate = std::sync::Arc<
    dyn Fn() -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync,
>;

/// A request to restart the running member at once (its binary was replaced): answered `Ok(how long the
/// member did not serve)` once the new run serves, `Err(message)` when the version gate refused (the old run is left serving) or the new run
/// did not come up (the supervisor then goes on restarting it as after an exit).
pub type RestartRequest = tokio::sync::oneshot::Sender<Result<Duration, String>>;

/// How a restart ended.
enum Restarted {
    Serving(Box<EtcdProcess>),
    /// The new run was told that the cluster removed this member.
    Removed,
    Stopped,
    /// `once`: the one try did not serve (why).
    Failed(String),
}

/// The next restart request, if requests are taken at all.
async fn next_request(
    requests: &mut Option<tokio::sync::mpsc::Receiver<RestartRequest>>,
) -> Option<RestartRequest> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// What the supervision loop needs.
pub struct Supervisor {
    pub binary: PathBuf,
    pub layout: MemberLayout,
    pub spec: MemberSpec,
    /// Flags after hostlet's own (`--quota-backend-bytes`, `--etcd-arg`).
    pub extra_args: Vec<String>,
    /// The start mode of the first run; restarts use [`ClusterStart::Existing`] once the WAL exists.
    pub start: ClusterStart,
    pub etcd: Etcd,
    pub metrics: MemberMetrics,
    pub ready: ComponentHandle,
    /// The pid of the running child, for tests and diagnostics (0 while none runs).
    pub pid: std::sync::Arc<std::sync::atomic::AtomicI32>,
    /// Fired when etcd exits because the cluster removed this member: it is not restarted then (it would
    /// only be told again), and the agent rejoins instead.
    pub removed: CancellationToken,
    /// The agent's shared member cache, once it is built: from then on the local status and the
    /// endpoints are read from it rather than asked of etcd.
    pub members: Arc<OnceLock<Members>>,
    /// Free space under the data dir: while it is low, a member that exited waits for room rather than
    /// being restarted into the same failure.
    pub disk: Option<crate::disk::DiskPressure>,
    /// Passed before each restart; `None`: restarts are not gated (tests of the supervision alone).
    pub gate: Option<RestartGate>,
    /// Requests to restart the member now (the etcd upgrade's turn).
    pub restarts: Option<tokio::sync::mpsc::Receiver<RestartRequest>>,
}

/// What the supervisor shows of the local member's status.
struct Seen {
    id: u64,
    leader: u64,
    is_learner: bool,
    db_size: i64,
}

impl From<&StatusResponse> for Seen {
    fn from(s: &StatusResponse) -> Self {
        Seen {
            id: s.header().map(|h| h.member_id()).unwrap_or(0),
            leader: s.leader(),
            is_learner: s.is_learner(),
            db_size: s.db_size(),
        }
    }
}

impl Supervisor {
    fn local_url(&self) -> String {
        self.spec.local_client_url()
    }

    /// The revocation list etcd refuses client and peer certificates by, written empty first if there is none yet
    /// (the agent keeps it current while it runs). `None` without TLS or without the CA key to sign it.
    fn revocation_list(&self) -> Option<PathBuf> {
        let tls = self.spec.tls.as_ref()?;
        let path = tls.crl();
        if path.exists() {
            return Some(path);
        }
        let written = tls
            .load_ca()
            .and_then(|ca| crate::pki::write_crl(&path, &ca, &[]));
        match written {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "etcd starts without a revocation list");
                None
            }
        }
    }

    fn spawn(&self) -> std::io::Result<EtcdProcess> {
        let start = if self.layout.is_initialized() {
            ClusterStart::Existing
        } else {
            self.start.clone()
        };
        let mut args = self.spec.args(&start);
        if let Some(crl) = self.revocation_list() {
            args.push(format!("--client-crl-file={}", crl.display()));
            // A revoked or superseded certificate of a member's (server and peer ones sign as clients too)
            // must not reach the peer port either.
            args.push(format!("--peer-crl-file={}", crl.display()));
        }
        args.extend(self.extra_args.iter().cloned());
        let p = EtcdProcess::spawn(&self.binary, &args, &self.layout.etcd_log())?;
        self.pid.store(p.pid(), std::sync::atomic::Ordering::SeqCst);
        Ok(p)
    }

    /// Starts the first run and waits until it serves.
    pub async fn start_first(
        &self,
        cancel: &CancellationToken,
    ) -> Result<(EtcdProcess, StatusResponse), (std::io::Error, Option<WaitError>)> {
        let mut child = self.spawn().map_err(|e| (e, None))?;
        match wait_serving(&mut child, &self.etcd, &self.local_url(), cancel).await {
            Ok(s) => {
                self.observe(&s);
                Ok((child, s))
            }
            Err(w) => {
                let w = match w {
                    WaitError::Exited(_) if child.said_removed() => WaitError::Removed,
                    w => w,
                };
                let _ = child.stop(STOP_GRACE).await;
                self.pid.store(0, std::sync::atomic::Ordering::SeqCst);
                Err((std::io::Error::other("etcd did not come up"), Some(w)))
            }
        }
    }

    fn observe(&self, s: &StatusResponse) {
        self.show(&Seen::from(s));
    }

    fn show(&self, s: &Seen) {
        let leader = s.leader != 0 && s.leader == s.id;
        self.metrics.up.set(1);
        self.metrics.is_leader.set(leader as i64);
        self.metrics.is_learner.set(s.is_learner as i64);
        self.metrics
            .db_size_bytes
            .with_label_values(&[&self.spec.name])
            .set(s.db_size);
        let role = if s.is_learner {
            "learner"
        } else if leader {
            "leader"
        } else {
            "follower"
        };
        self.ready.set_ready(format!("serving as {role}"));
    }

    /// From the member cache: the local member's last status and the voters' client URLs.
    fn poll_cache(&self, members: &Members, last_endpoints: &mut Vec<String>) {
        let statuses = members.statuses();
        match statuses.local() {
            Some(s) if s.leader != 0 => self.show(&Seen {
                id: statuses.local_id.unwrap_or(0),
                leader: s.leader,
                is_learner: s.is_learner,
                db_size: s.db_size,
            }),
            Some(_) => {
                self.metrics.set_down();
                self.ready.set_not_ready("the etcd member has no leader");
            }
            None => {
                self.metrics.set_down();
                self.ready
                    .set_not_ready("the etcd member did not answer the last look");
            }
        }
        let voters: Vec<String> = members
            .list()
            .iter()
            .filter(|m| m.is_voter())
            .filter_map(|m| m.client_urls.first().cloned())
            .collect();
        self.record_endpoints(voters, last_endpoints);
    }

    async fn poll(&self, last_endpoints: &mut Vec<String>) {
        // Until the cache's first look is in, it knows nothing: ask etcd as before.
        if let Some(members) = self.members.get().filter(|m| m.store().is_ready()) {
            self.poll_cache(members, last_endpoints);
            return;
        }
        match self.etcd.status_of(&self.local_url()).await {
            Ok(s) if s.leader() != 0 => self.observe(&s),
            Ok(_) => {
                self.metrics.set_down();
                self.ready.set_not_ready("the etcd member has no leader");
            }
            Err(e) => {
                self.metrics.set_down();
                self.ready
                    .set_not_ready(format!("the etcd member does not answer: {e}"));
            }
        }
        // Every poll: a cluster reset judges by the members `db/endpoints` names, so a member that joined
        // must be in it within a poll.
        self.sync_endpoints(last_endpoints).await;
    }

    /// Points the agent's client at the voting members and records the cluster's endpoints.
    pub async fn sync_endpoints(&self, last: &mut Vec<String>) {
        match self.etcd.sync_endpoints().await {
            Ok(voters) => self.record_endpoints(voters, last),
            Err(e) => tracing::debug!(error = %e, "cannot refresh the etcd endpoints"),
        }
    }

    /// Writes `db/endpoints` (the local member first) when the voters changed.
    fn record_endpoints(&self, voters: Vec<String>, last: &mut Vec<String>) {
        if voters.is_empty() {
            return;
        }
        let mut all = vec![self.local_url()];
        all.extend(voters.into_iter().filter(|v| *v != self.local_url()));
        if *last != all {
            tracing::debug!(endpoints = ?all, "etcd endpoints");
            write_endpoints(&self.layout, &all);
            *last = all;
        }
    }

    /// Runs until `stop` fires: restarts the child with backoff when it exits, then stops it (SIGTERM,
    /// [`STOP_GRACE`], SIGKILL).
    pub async fn run(mut self, mut child: EtcdProcess, stop: CancellationToken) {
        let mut requests = self.restarts.take();
        let mut backoff = restart_backoff();
        let mut started_at = Instant::now();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut endpoints = Vec::new();
        self.sync_endpoints(&mut endpoints).await;
        loop {
            let restarted = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                status = child.wait() => {
                    self.metrics.set_down();
                    let how = match &status {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    };
                    if child.said_removed() {
                        self.removed_from_cluster(&stop).await;
                        return;
                    }
                    tracing::warn!(status = %how, "etcd exited; restarting it");
                    self.ready.set_not_ready(format!("etcd exited ({how}); restarting"));
                    self.restart(&mut backoff, started_at.elapsed(), &stop, false).await
                }
                Some(reply) = next_request(&mut requests) => {
                    // The gate first, while the old run still serves: a refused binary changes nothing.
                    if let Some(gate) = &self.gate {
                        if let Err(message) = gate().await {
                            let _ = reply.send(Err(message));
                            continue;
                        }
                    }
                    tracing::info!("restarting etcd on request (its binary changed)");
                    self.metrics.set_down();
                    self.ready.set_not_ready("restarting etcd on its new binary");
                    let down = Instant::now();
                    if let Err(e) = child.stop(STOP_GRACE).await {
                        tracing::warn!(error = %e, "stopping etcd for its restart");
                    }
                    self.pid.store(0, std::sync::atomic::Ordering::SeqCst);
                    let mut now = restart_backoff();
                    match self.restart(&mut now, Duration::ZERO, &stop, true).await {
                        Restarted::Failed(message) => {
                            let _ = reply.send(Err(message));
                            // As after an exit: with the backoff, until a run serves.
                            self.restart(&mut backoff, Duration::ZERO, &stop, false).await
                        }
                        Restarted::Serving(c) => {
                            let _ = reply.send(Ok(down.elapsed()));
                            backoff.reset();
                            Restarted::Serving(c)
                        }
                        other => {
                            let _ = reply.send(Err("etcd was not restarted".into()));
                            other
                        }
                    }
                }
                _ = tick.tick() => {
                    self.poll(&mut endpoints).await;
                    continue;
                }
            };
            match restarted {
                Restarted::Serving(c) => {
                    child = *c;
                    started_at = Instant::now();
                }
                Restarted::Removed => {
                    self.removed_from_cluster(&stop).await;
                    return;
                }
                Restarted::Stopped | Restarted::Failed(_) => {
                    self.pid.store(0, std::sync::atomic::Ordering::SeqCst);
                    self.metrics.set_down();
                    return;
                }
            }
        }
        self.ready.set_not_ready("stopping");
        tracing::info!("stopping etcd");
        match child.stop(STOP_GRACE).await {
            Ok(s) => tracing::info!(status = %s, "etcd stopped"),
            Err(e) => tracing::warn!(error = %e, "stopping etcd"),
        }
        self.pid.store(0, std::sync::atomic::Ordering::SeqCst);
        self.metrics.set_down();
    }

    /// etcd exited because the cluster removed this member: say so, fire [`Supervisor::removed`] and wait
    /// for the stop without restarting it.
    async fn removed_from_cluster(&self, stop: &CancellationToken) {
        tracing::warn!("etcd exited: the cluster removed this member; it is not restarted");
        self.pid.store(0, std::sync::atomic::Ordering::SeqCst);
        self.metrics.set_down();
        self.ready
            .set_not_ready("the cluster removed this member; rejoining");
        self.removed.cancel();
        stop.cancelled().await;
    }

    /// While the filesystem under the data dir is low on space, says so and waits for room (or `stop`);
    /// `true` when it waited.
    async fn wait_room(&self, stop: &CancellationToken) -> bool {
        let Some(disk) = &self.disk else {
            return false;
        };
        disk.check_now().await;
        let Some(low) = disk.low(&self.layout.member_dir()) else {
            return false;
        };
        tracing::warn!("{low}: the etcd member waits for room before it restarts");
        self.ready.set_not_ready(format!(
            "etcd exited; {low} (below --disk-min-free): waiting for room before restarting it"
        ));
        disk.wait_room(&self.layout.member_dir(), stop).await;
        if !stop.is_cancelled() {
            tracing::info!("room again under the data dir: restarting the etcd member");
        }
        true
    }

    /// Restarts after the backoff until a run serves, the cluster says this member was removed, or `stop`
    /// fires; `once`: one try, at once ([`Restarted::Failed`] when it does not serve).
    async fn restart(
        &self,
        backoff: &mut ExponentialBackoff,
        ran_for: Duration,
        stop: &CancellationToken,
        once: bool,
    ) -> Restarted {
        let mut ran_for = ran_for;
        let mut tries = 0u32;
        loop {
            if once && tries > 0 {
                return Restarted::Failed("etcd did not serve on its new binary".into());
            }
            tries += 1;
            if self.wait_room(stop).await {
                // The member comes back as soon as there is room: the backoff was for this failure.
                backoff.reset();
                ran_for = Duration::ZERO;
            }
            let delay = if once {
                Duration::ZERO
            } else {
                restart_delay(backoff, ran_for)
            };
            tokio::select! {
                _ = stop.cancelled() => return Restarted::Stopped,
                _ = tokio::time::sleep(delay) => {}
            }
            if let Some(gate) = &self.gate {
                if let Err(message) = gate().await {
                    if once {
                        self.ready.set_not_ready(message.clone());
                        return Restarted::Failed(message);
                    }
                    // The member stays down and its data as it is; the gate looks again after the next
                    // delay (the binary put back, or the cluster moved).
                    tracing::warn!(
                        "etcd restart held by the version gate; looking again after the next delay"
                    );
                    self.ready.set_not_ready(message);
                    ran_for = Duration::ZERO;
                    continue;
                }
            }
            self.metrics.restarts.inc();
            let run_started = Instant::now();
            let mut child = match self.spawn() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start etcd");
                    self.ready.set_not_ready(format!("cannot start etcd: {e}"));
                    ran_for = Duration::ZERO;
                    continue;
                }
            };
            match wait_serving(&mut child, &self.etcd, &self.local_url(), stop).await {
                Ok(s) => {
                    tracing::info!(pid = child.pid(), "etcd restarted and serving");
                    self.observe(&s);
                    return Restarted::Serving(Box::new(child));
                }
                Err(WaitError::Cancelled) => {
                    let _ = child.stop(STOP_GRACE).await;
                    return Restarted::Stopped;
                }
                Err(WaitError::Removed) => return Restarted::Removed,
                Err(WaitError::Exited(_)) if child.said_removed() => return Restarted::Removed,
                Err(WaitError::Exited(status)) => {
                    tracing::warn!(?status, "etcd exited before serving");
                    self.ready
                        .set_not_ready(format!("etcd exited before serving ({status:?})"));
                    ran_for = run_started.elapsed();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delays_double_to_the_cap_and_reset_after_a_long_run() {
        let mut b = restart_backoff();
        let short = Duration::from_secs(1);
        let got: Vec<u64> = (0..7)
            .map(|_| restart_delay(&mut b, short).as_secs())
            .collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(
            restart_delay(&mut b, Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(restart_delay(&mut b, short), Duration::from_secs(2));
    }
}
