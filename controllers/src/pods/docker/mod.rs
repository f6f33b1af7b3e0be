//! The Docker implementation of [`ContainerRuntime`], with bollard.
//!
//! The client is built without touching the engine and negotiates the API version on first use, so hostlet
//! starts (and keeps its pods) while Docker is down; each call retries the negotiation until it succeeds.
//! Every call is counted in `hostlet_docker_operations_total{op,result}` and timed.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::errors::Error as BollardError;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, ContainerSummaryStateEnum,
    EventMessage, ExecConfig, HostConfig, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder,
    InspectContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures::future::{BoxFuture, Shared};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use hostlet_api::image::ImageRef;
use hostlet_api::naming::LABEL_NODE;

mod exec;
mod images;
mod logs;

pub use exec::{ExecOutput, ExecSession};
pub use logs::LogQuery;

use super::metrics::DockerOpMetrics;
use super::runtime::{
    ContainerInfo, ContainerLabels, ContainerRuntime, ContainerSpec, ContainerStats, NetworkMode,
    RunState, RuntimeError, RuntimeEvent, RuntimeEventKind,
};

/// Requests that take longer than this are abandoned (`stop` waits the grace period on top).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

type SharedPull = Shared<BoxFuture<'static, Result<(), RuntimeError>>>;

/// Docker, scoped to one node's containers. Cheap to clone.
#[derive(Clone)]
pub struct DockerRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    /// The client as configured, before version negotiation.
    base: Docker,
    negotiated: tokio::sync::OnceCell<Docker>,
    node: String,
    metrics: DockerOpMetrics,
    pulls: Mutex<HashMap<String, SharedPull>>,
    logs: LogLimits,
    /// Where the engine keeps its images, once it has said.
    root: tokio::sync::OnceCell<std::path::PathBuf>,
}

/// The log caps every container is created with (`--container-log-max-size`, `--container-log-max-files`).
/// They are not part of a container's spec hash: a changed setting applies to containers created from then
/// on and never replaces a running one (a log flag is no reason to restart every pod of a host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Rotate a container's log file when it reaches this size.
    pub max_size_bytes: u64,
    /// Keep this many files per container, the live one included.
    pub max_files: u32,
}

impl Default for LogLimits {
    /// The kubelet's defaults: 10 MiB × 5.
    fn default() -> Self {
        LogLimits {
            max_size_bytes: 10 * 1024 * 1024,
            max_files: 5,
        }
    }
}

impl LogLimits {
    /// Docker's json-file driver rotates and keeps `max-file` files; `docker logs` (and so `pod logs`)
    /// reads across them. Named explicitly so that the daemon's own default driver does not matter.
    fn log_config(&self) -> bollard::models::HostConfigLogConfig {
        bollard::models::HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                ("max-size".to_string(), self.max_size_bytes.to_string()),
                ("max-file".to_string(), self.max_files.max(1).to_string()),
            ])),
        }
    }
}

/// A client of the engine at `docker_host` (`unix:///path`, `tcp://host:port`, `http://host:port`;
/// `None` = `DOCKER_HOST` or the local socket). Does not contact the engine.
pub fn connect_docker(docker_host: Option<&str>) -> Result<Docker, RuntimeError> {
    let timeout = REQUEST_TIMEOUT.as_secs();
    let version = bollard::API_DEFAULT_VERSION;
    match docker_host {
        None | Some("") => Docker::connect_with_local_defaults(),
        Some(h) if h.starts_with("unix://") => Docker::connect_with_unix(h, timeout, version),
        Some(h) if h.starts_with("tcp://") || h.starts_with("http://") => {
            Docker::connect_with_http(h, timeout, version)
        }
        Some(h) if h.starts_with('/') => Docker::connect_with_unix(h, timeout, version),
        Some(h) => {
            return Err(RuntimeError::Other(format!(
                "docker host {h:?}: expected unix:///path, tcp://host:port or http://host:port"
            )))
        }
    }
    .map_err(map_err)
}

impl DockerRuntime {
    /// A runtime for `node` on the engine at `docker_host` (`unix:///path`, `tcp://host:port`,
    /// `http://host:port`; `None` = `DOCKER_HOST` or the local socket). Does not contact the engine.
    pub fn new(
        docker_host: Option<&str>,
        node: &str,
        metrics: DockerOpMetrics,
    ) -> Result<Self, RuntimeError> {
        let base = connect_docker(docker_host)?.with_timeout(REQUEST_TIMEOUT);
        Ok(DockerRuntime {
            inner: Arc::new(Inner {
                base,
                negotiated: tokio::sync::OnceCell::new(),
                node: node.to_string(),
                metrics,
                pulls: Mutex::new(HashMap::new()),
                logs: LogLimits::default(),
                root: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The same runtime creating containers with these log caps (before it is shared).
    pub fn with_log_limits(mut self, logs: LogLimits) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.logs = logs;
        }
        self
    }

    /// The client at the negotiated API version (negotiating now when that has not succeeded yet).
    async fn client(&self) -> Result<&Docker, RuntimeError> {
        self.inner
            .negotiated
            .get_or_try_init(|| async {
                let start = Instant::now();
                let r = self.inner.base.clone().negotiate_version().await;
                self.inner
                    .metrics
                    .observe("version", r.is_ok(), start.elapsed().as_secs_f64());
                r.map_err(map_err)
            })
            .await
    }

    /// Runs one Docker call, counting and timing it.
    async fn call<T, F>(&self, op: &str, f: impl FnOnce(Docker) -> F) -> Result<T, RuntimeError>
    where
        F: Future<Output = Result<T, BollardError>>,
    {
        let docker = self.client().await?.clone();
        let start = Instant::now();
        let r = f(docker).await;
        self.inner
            .metrics
            .observe(op, r.is_ok(), start.elapsed().as_secs_f64());
        r.map_err(map_err)
    }

    fn node_filter(&self) -> HashMap<&'static str, Vec<String>> {
        HashMap::from([("label", vec![format!("{LABEL_NODE}={}", self.inner.node)])])
    }

    async fn pull_uncoalesced(&self, image: String) -> Result<(), RuntimeError> {
        let reference = match ImageRef::parse(&image) {
            Ok(r) if r.tag.is_none() && r.digest.is_none() => format!("{image}:latest"),
            Ok(_) => image.clone(),
            Err(e) => return Err(RuntimeError::Other(e.to_string())),
        };
        self.call("pull", |d| async move {
            let opts = CreateImageOptionsBuilder::new()
                .from_image(&reference)
                .build();
            d.create_image(Some(opts), None, None)
                .try_for_each(|_| async { Ok(()) })
                .await
        })
        .await
    }
}

/// How much of an exited container's output is kept for `pod logs --previous` (and at most one log file's
/// worth of bytes, `--container-log-max-size`).
pub const PREVIOUS_LOG_LINES: u64 = 10_000;

/// Writes `data` to `path` (mode 0600, its directory 0700) through a temporary file and a rename.
fn write_private(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl DockerRuntime {
    /// The engine's whole answer about a container.
    async fn inspect_raw(
        &self,
        id: &str,
    ) -> Result<bollard::models::ContainerInspectResponse, RuntimeError> {
        self.call("inspect", |d| async move {
            let opts = InspectContainerOptionsBuilder::new().build();
            d.inspect_container(id, Some(opts)).await
        })
        .await
    }
}

impl ContainerRuntime for DockerRuntime {
    fn node(&self) -> &str {
        &self.inner.node
    }

    async fn ping(&self) -> Result<(), RuntimeError> {
        self.call("ping", |d| async move { d.ping().await.map(|_| ()) })
            .await
    }

    async fn list(&self) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let filters = self.node_filter();
        let summaries = self
            .call("list", |d| async move {
                let opts = ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build();
                d.list_containers(Some(opts)).await
            })
            .await?;
        Ok(summaries
            .into_iter()
            .filter_map(|s| from_summary(s, &self.inner.node))
            .collect())
    }

    async fn inspect(&self, id: &str) -> Result<ContainerInfo, RuntimeError> {
        let resp = self.inspect_raw(id).await?;
        from_inspect(resp, &self.inner.node).ok_or_else(|| {
            RuntimeError::NotFound(format!("container {id} is not one of this node's"))
        })
    }

    async fn save_log(&self, id: &str, path: &std::path::Path) -> Result<(), RuntimeError> {
        let cap = usize::try_from(self.inner.logs.max_size_bytes).unwrap_or(usize::MAX);
        let opts = LogQuery {
            tail: Some(PREVIOUS_LOG_LINES),
            timestamps: true,
            ..LogQuery::default()
        };
        let mut out: Vec<u8> = Vec::new();
        let mut stream = self.logs(id, &opts);
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        if out.len() > cap {
            // Keep whole lines: cut after the first newline of the part kept.
            let from = out.len() - cap;
            let start = out[from..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(out.len(), |p| from + p + 1);
            out.drain(..start);
        }
        write_private(path, &out)
            .map_err(|e| RuntimeError::Other(format!("keeping the log in {}: {e}", path.display())))
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        if spec.labels.get(LABEL_NODE) != Some(&self.inner.node) {
            return Err(RuntimeError::Other(format!(
                "refusing to create {} without this node's label",
                spec.name
            )));
        }
        let body = create_body(spec, &self.inner.logs);
        let name = spec.name.clone();
        let resp = self
            .call("create", |d| async move {
                let opts = CreateContainerOptionsBuilder::new().name(&name).build();
                d.create_container(Some(opts), body).await
            })
            .await?;
        Ok(resp.id)
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        match self
            .call("start", |d| async move {
                d.start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
                    .await
            })
            .await
        {
            Err(RuntimeError::Api { status: 304, .. }) => Ok(()),
            r => r,
        }
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let secs = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        match self
            .call("stop", |d| async move {
                let opts = StopContainerOptionsBuilder::new().t(secs).build();
                d.with_timeout(REQUEST_TIMEOUT + grace)
                    .stop_container(id, Some(opts))
                    .await
            })
            .await
        {
            Err(RuntimeError::Api { status: 304, .. }) => Ok(()),
            r => r,
        }
    }

    async fn stop_signal(&self, id: &str) -> Result<String, RuntimeError> {
        let c = self.inspect_raw(id).await?;
        Ok(c.config
            .and_then(|c| c.stop_signal)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "SIGTERM".to_string()))
    }

    async fn signal(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        self.call("signal", |d| async move {
            let opts = KillContainerOptionsBuilder::new().signal(signal).build();
            d.kill_container(id, Some(opts)).await
        })
        .await
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.call("remove", |d| async move {
            let opts = RemoveContainerOptionsBuilder::new()
                .force(true)
                .v(true)
                .build();
            d.remove_container(id, Some(opts)).await
        })
        .await
    }

    fn events(&self, since: SystemTime) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        let this = self.clone();
        let node = self.inner.node.clone();
        let filters: HashMap<&str, Vec<String>> = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("label", vec![format!("{LABEL_NODE}={node}")]),
            (
                "event",
                ["create", "start", "die", "oom", "destroy"]
                    .map(String::from)
                    .to_vec(),
            ),
        ]);
        futures::stream::once(async move {
            let docker = this.client().await?.clone();
            this.inner.metrics.observe("events", true, 0.0);
            let since = since.duration_since(UNIX_EPOCH).unwrap_or_default();
            let since = format!("{}.{:09}", since.as_secs(), since.subsec_nanos());
            let opts = EventsOptionsBuilder::new()
                .since(&since)
                .filters(&filters)
                .build();
            Ok::<_, RuntimeError>(
                docker
                    .events(Some(opts))
                    .map(move |r| r.map(|m| from_event(m, &node)).map_err(map_err)),
            )
        })
        .map(|r| match r {
            Ok(s) => s.boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .boxed()
    }

    fn pull(&self, image: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let shared = {
            let mut pulls = self.inner.pulls.lock().unwrap_or_else(|p| p.into_inner());
            match pulls.get(image) {
                Some(f) => f.clone(),
                None => {
                    let this = self.clone();
                    let key = image.to_string();
                    let f = async move {
                        let r = this.pull_uncoalesced(key.clone()).await;
                        this.inner
                            .pulls
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&key);
                        r
                    }
                    .boxed()
                    .shared();
                    pulls.insert(image.to_string(), f.clone());
                    f
                }
            }
        };
        shared
    }

    async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
        match self
            .call(
                "image_inspect",
                |d| async move { d.inspect_image(image).await },
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(RuntimeError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn cgroup_driver(&self) -> Result<(String, String), RuntimeError> {
        let info = self.call("info", |d| async move { d.info().await }).await?;
        Ok((
            info.cgroup_driver
                .map(|d| d.to_string())
                .unwrap_or_default(),
            info.cgroup_version
                .map(|v| v.to_string())
                .unwrap_or_default(),
        ))
    }

    async fn runtimes(&self) -> Result<Vec<String>, RuntimeError> {
        let info = self.call("info", |d| async move { d.info().await }).await?;
        Ok(info.runtimes.unwrap_or_default().into_keys().collect())
    }

    async fn image_user(&self, image: &str) -> Result<String, RuntimeError> {
        let resp = self
            .call(
                "image_inspect",
                |d| async move { d.inspect_image(image).await },
            )
            .await?;
        Ok(resp.config.and_then(|c| c.user).unwrap_or_default())
    }

    async fn exec(
        &self,
        id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<i64, RuntimeError> {
        let cmd = command.to_vec();
        let run = async {
            let created = self
                .call("exec", |d| async move {
                    let config = ExecConfig {
                        cmd: Some(cmd),
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        ..Default::default()
                    };
                    d.create_exec(id, config).await
                })
                .await?;
            let exec_id = created.id;
            let eid = exec_id.clone();
            self.call("exec", |d| async move {
                // The probe only needs the exit code; the output is read (≤ a few KB kept by Docker) and dropped.
                match d
                    .start_exec(&eid, Some(StartExecOptions::default()))
                    .await?
                {
                    StartExecResults::Attached { output, .. } => {
                        output.try_for_each(|_| async { Ok(()) }).await
                    }
                    StartExecResults::Detached => Ok(()),
                }
            })
            .await?;
            let inspected = self
                .call("exec", |d| async move { d.inspect_exec(&exec_id).await })
                .await?;
            Ok(inspected.exit_code.unwrap_or(-1))
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or(Err(RuntimeError::Timeout(timeout)))
    }

    async fn stats(&self, id: &str) -> Result<ContainerStats, RuntimeError> {
        let s = self
            .call("stats", |d| async move {
                // Not one-shot: Docker then samples twice, which the CPU percentage needs.
                let opts = StatsOptionsBuilder::new().stream(false).build();
                let mut stream = d.stats(id, Some(opts)).boxed();
                match stream.next().await {
                    Some(r) => r,
                    None => Err(BollardError::DockerStreamError {
                        error: "no stats returned".into(),
                    }),
                }
            })
            .await?;
        let total = |c: &Option<bollard::models::ContainerCpuStats>| {
            c.as_ref()
                .and_then(|c| c.cpu_usage.as_ref())
                .and_then(|u| u.total_usage)
                .unwrap_or(0)
        };
        let system = |c: &Option<bollard::models::ContainerCpuStats>| {
            c.as_ref().and_then(|c| c.system_cpu_usage).unwrap_or(0)
        };
        let cpu_delta = total(&s.cpu_stats).saturating_sub(total(&s.precpu_stats));
        let sys_delta = system(&s.cpu_stats).saturating_sub(system(&s.precpu_stats));
        let cpus = s
            .cpu_stats
            .as_ref()
            .and_then(|c| c.online_cpus)
            .unwrap_or(1)
            .max(1);
        let cpu_percent = if sys_delta > 0 {
            cpu_delta as f64 / sys_delta as f64 * f64::from(cpus) * 100.0
        } else {
            0.0
        };
        let mem = s.memory_stats.as_ref();
        // Like `docker stats`: page cache is not counted as use.
        let cache = mem
            .and_then(|m| m.stats.as_ref())
            .and_then(|st| {
                st.get("inactive_file")
                    .or_else(|| st.get("total_inactive_file"))
                    .copied()
            })
            .unwrap_or(0);
        let usage = mem.and_then(|m| m.usage).unwrap_or(0).saturating_sub(cache);
        Ok(ContainerStats {
            cpu_percent,
            cpu_total_nanos: total(&s.cpu_stats),
            memory_usage_bytes: usage,
            memory_limit_bytes: mem.and_then(|m| m.limit),
        })
    }
}

fn map_err(e: BollardError) -> RuntimeError {
    match e {
        BollardError::DockerResponseServerError {
            status_code: 404,
            message,
        } => RuntimeError::NotFound(message),
        BollardError::DockerResponseServerError {
            status_code: 409,
            message,
        } => RuntimeError::Conflict(message),
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => RuntimeError::Api {
            status: status_code,
            message,
        },
        BollardError::RequestTimeoutError => RuntimeError::Timeout(REQUEST_TIMEOUT),
        e @ (BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::HyperLegacyError { .. }
        | BollardError::SocketNotFoundError(_)) => RuntimeError::Unreachable(e.to_string()),
        e => RuntimeError::Other(e.to_string()),
    }
}

fn create_body(spec: &ContainerSpec, logs: &LogLimits) -> ContainerCreateBody {
    let (network_mode, exposed_ports, port_bindings) = match &spec.network {
        NetworkMode::Own { ports } => {
            let mut exposed = HashMap::new();
            let mut bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
            for p in ports {
                let key = format!("{}/{}", p.container_port, p.protocol.to_ascii_lowercase());
                exposed.insert(key.clone(), HashMap::new());
                bindings
                    .entry(key)
                    .or_default()
                    .get_or_insert_with(Vec::new)
                    .push(PortBinding {
                        host_ip: Some(p.host_ip.clone()),
                        host_port: Some(p.host_port.to_string()),
                    });
            }
            (None, Some(exposed), Some(bindings))
        }
        NetworkMode::JoinContainer(id) => (Some(format!("container:{id}")), None, None),
    };
    let binds: Vec<String> = spec
        .binds
        .iter()
        .map(|b| {
            let mode = if b.read_only { ":ro" } else { "" };
            format!("{}:{}{mode}", b.host_path, b.container_path)
        })
        .collect();
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: (!spec.command.is_empty()).then(|| spec.command.clone()),
        // Given an entrypoint and no cmd, Docker drops the image's cmd too: Kubernetes' `command` alone.
        cmd: (!spec.args.is_empty()).then(|| spec.args.clone()),
        working_dir: spec.working_dir.clone().filter(|w| !w.is_empty()),
        // Unset keeps the image's STOPSIGNAL, which the engine copies into the container's config.
        stop_signal: spec.stop_signal.clone(),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(
            spec.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        hostname: spec.hostname.clone(),
        exposed_ports,
        host_config: Some(HostConfig {
            // The engine adds each device's cgroup rule with its permissions.
            devices: (!spec.devices.is_empty()).then(|| {
                spec.devices
                    .iter()
                    .map(|d| bollard::models::DeviceMapping {
                        path_on_host: Some(d.host.clone()),
                        path_in_container: Some(d.container.clone()),
                        cgroup_permissions: Some(d.permissions.clone()),
                    })
                    .collect()
            }),
            // As `docker run --gpus N`: the engine's nvidia driver hands the container N GPUs.
            device_requests: spec.gpus.map(|n| {
                vec![bollard::models::DeviceRequest {
                    driver: Some("nvidia".into()),
                    count: Some(n),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                }]
            }),
            network_mode,
            port_bindings,
            dns: spec.dns.as_ref().map(|d| d.nameservers.clone()),
            dns_search: spec.dns.as_ref().map(|d| d.searches.clone()),
            dns_options: spec.dns.as_ref().map(|d| d.options.clone()),
            extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
            binds: (!binds.is_empty()).then_some(binds),
            cpu_shares: spec.cpu_shares,
            cpu_period: spec.cpu_period,
            cpu_quota: spec.cpu_quota,
            memory: spec.memory_bytes,
            memory_reservation: spec.memory_reservation_bytes,
            privileged: Some(spec.security.privileged),
            readonly_rootfs: Some(spec.security.read_only_root),
            cap_add: (!spec.security.cap_add.is_empty()).then(|| spec.security.cap_add.clone()),
            cap_drop: (!spec.security.cap_drop.is_empty()).then(|| spec.security.cap_drop.clone()),
            security_opt: {
                let mut opts = Vec::new();
                if spec.security.no_new_privileges {
                    opts.push("no-new-privileges".to_string());
                }
                if spec.security.seccomp_unconfined {
                    opts.push("seccomp=unconfined".to_string());
                }
                (!opts.is_empty()).then_some(opts)
            },
            pids_limit: spec.security.pids_limit,
            cgroup_parent: spec.security.cgroup_parent.clone(),
            log_config: Some(logs.log_config()),
            ..Default::default()
        }),
        user: spec.security.user.clone(),
        ..Default::default()
    }
}

fn parse_time(s: &str) -> Option<SystemTime> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    // Docker writes year 1 for "never"; anything before 1970 means the same.
    (t > UNIX_EPOCH).then_some(t)
}

fn first_ip(
    networks: Option<&HashMap<String, bollard::models::EndpointSettings>>,
) -> Option<IpAddr> {
    let mut names: Vec<_> = networks?.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    names.into_iter().find_map(|(_, e)| {
        e.ip_address
            .as_deref()
            .filter(|ip| !ip.is_empty())?
            .parse()
            .ok()
    })
}

/// A listed container. The list does not carry start/finish times or the OOM flag: running containers take
/// their creation time as the start (hostlet starts what it creates at once) and exited ones their exit
/// code from the status line; the observed cache inspects exited containers it does not know yet.
fn from_summary(s: ContainerSummary, node: &str) -> Option<ContainerInfo> {
    let labels = ContainerLabels::from_map(s.labels.as_ref()?)?;
    if labels.node != node {
        return None;
    }
    let created =
        UNIX_EPOCH + Duration::from_secs(u64::try_from(s.created.unwrap_or(0)).unwrap_or(0));
    let state = match s.state {
        Some(ContainerSummaryStateEnum::RUNNING)
        | Some(ContainerSummaryStateEnum::RESTARTING)
        | Some(ContainerSummaryStateEnum::PAUSED) => RunState::Running {
            started_at: created,
        },
        Some(ContainerSummaryStateEnum::CREATED)
        | Some(ContainerSummaryStateEnum::EMPTY)
        | None => RunState::Created,
        Some(ContainerSummaryStateEnum::EXITED)
        | Some(ContainerSummaryStateEnum::DEAD)
        | Some(ContainerSummaryStateEnum::REMOVING) => RunState::Exited {
            exit_code: s
                .status
                .as_deref()
                .and_then(exit_code_of_status)
                .unwrap_or(-1),
            started_at: None,
            finished_at: None,
            oom_killed: false,
            error: None,
        },
    };
    let ip = s
        .network_settings
        .as_ref()
        .and_then(|n| first_ip(n.networks.as_ref()));
    let joined_to = s
        .host_config
        .as_ref()
        .and_then(|h| joined_container(h.network_mode.as_deref()));
    Some(ContainerInfo {
        id: s.id?,
        name: s
            .names
            .and_then(|n| n.into_iter().next())
            .map(|n| n.trim_start_matches('/').to_string())
            .unwrap_or_default(),
        labels,
        image: s.image.unwrap_or_default(),
        created,
        state,
        ip,
        joined_to,
    })
}

/// `container:<id>` → the id.
fn joined_container(network_mode: Option<&str>) -> Option<String> {
    network_mode?.strip_prefix("container:").map(str::to_string)
}

/// `Exited (137) 5 seconds ago` → 137.
fn exit_code_of_status(status: &str) -> Option<i64> {
    let rest = status.strip_prefix("Exited (")?;
    rest.split(')').next()?.parse().ok()
}

fn from_inspect(r: ContainerInspectResponse, node: &str) -> Option<ContainerInfo> {
    let config = r.config.as_ref()?;
    let labels = ContainerLabels::from_map(config.labels.as_ref()?)?;
    if labels.node != node {
        return None;
    }
    let st = r.state.clone().unwrap_or_default();
    let started_at = st.started_at.as_deref().and_then(parse_time);
    let finished_at = st.finished_at.as_deref().and_then(parse_time);
    let error = st.error.clone().filter(|e| !e.is_empty());
    use bollard::models::ContainerStateStatusEnum as S;
    let state = match st.status {
        Some(S::RUNNING) | Some(S::RESTARTING) | Some(S::PAUSED) => RunState::Running {
            started_at: started_at.unwrap_or_else(SystemTime::now),
        },
        // A container whose start failed stays "created" with the engine's error: it ran and failed.
        Some(S::CREATED) | Some(S::EMPTY) | None if error.is_none() => RunState::Created,
        _ => RunState::Exited {
            exit_code: st.exit_code.unwrap_or(-1),
            started_at,
            finished_at,
            oom_killed: st.oom_killed.unwrap_or(false),
            error,
        },
    };
    let ip = r
        .network_settings
        .as_ref()
        .and_then(|n| first_ip(n.networks.as_ref()));
    let joined_to = r
        .host_config
        .as_ref()
        .and_then(|h| joined_container(h.network_mode.as_deref()));
    Some(ContainerInfo {
        id: r.id?,
        name: r
            .name
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        labels,
        image: config.image.clone().unwrap_or_default(),
        created: r
            .created
            .as_deref()
            .and_then(parse_time)
            .unwrap_or(UNIX_EPOCH),
        state,
        ip,
        joined_to,
    })
}

fn from_event(m: EventMessage, node: &str) -> RuntimeEvent {
    let actor = m.actor.unwrap_or_default();
    let attrs = actor.attributes.unwrap_or_default();
    let kind = match m.action.as_deref().unwrap_or("") {
        "create" => RuntimeEventKind::Create,
        "start" => RuntimeEventKind::Start,
        "die" => RuntimeEventKind::Die {
            exit_code: attrs.get("exitCode").and_then(|c| c.parse().ok()),
        },
        "oom" => RuntimeEventKind::Oom,
        "destroy" => RuntimeEventKind::Destroy,
        other => RuntimeEventKind::Other(other.to_string()),
    };
    let time = match (m.time_nano, m.time) {
        (Some(n), _) if n > 0 => UNIX_EPOCH + Duration::from_nanos(n as u64),
        (_, Some(s)) if s > 0 => UNIX_EPOCH + Duration::from_secs(s as u64),
        _ => SystemTime::now(),
    };
    let labels = ContainerLabels::from_map(&attrs).filter(|l| l.node == node);
    RuntimeEvent {
        kind,
        id: actor.id.unwrap_or_default(),
        labels,
        image: attrs.get("image").cloned(),
        name: attrs.get("name").cloned(),
        time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_that_asks_for_gpus_is_made_as_docker_run_gpus_makes_it() {
        let pod = hostlet_api::parse_manifest(
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: a, image: busybox, resources: {limits: {nvidia.com/gpu: 2}}}\n  - {name: b, image: busybox}\n",
        )
        .unwrap();
        let cfg = crate::pods::spec::SpecConfig::new("n1", "/var/lib/hostlet");
        let body = |c: usize| {
            let spec = crate::pods::spec::app_spec(
                &cfg,
                &pod,
                &Default::default(),
                &pod.containers[c],
                "infra",
                0,
            );
            create_body(&spec, &LogLimits::default())
                .host_config
                .and_then(|h| h.device_requests)
        };
        let asked = body(0).expect("a device request");
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].driver.as_deref(), Some("nvidia"));
        assert_eq!(asked[0].count, Some(2));
        assert_eq!(asked[0].capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(body(1), None, "no GPU for a container that does not ask");
    }

    #[test]
    fn exit_codes_are_read_from_the_status_line() {
        assert_eq!(exit_code_of_status("Exited (137) 5 seconds ago"), Some(137));
        assert_eq!(
            exit_code_of_status("Exited (0) About a minute ago"),
            Some(0)
        );
        assert_eq!(exit_code_of_status("Up 3 minutes"), None);
    }

    #[test]
    fn never_is_not_a_time() {
        assert_eq!(parse_time("0001-01-01T00:00:00Z"), None);
        assert!(parse_time("2024-05-01T10:00:00.123456789Z").is_some());
    }
}
