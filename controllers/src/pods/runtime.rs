//! The container-runtime seam: everything the pod controller asks of a container engine.
//!
//! The controller only ever names containers by the ids this runtime listed or reported for this node, so
//! a container without this node's `io.hostlet.node` label can never be the object of an operation.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use hostlet_api::naming::{self, Role};

pub use hostlet_api::naming::LABEL_RESTART_COUNT;

/// Why a runtime operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The engine could not be reached (socket missing, connection refused, timeout).
    #[error("container engine unreachable: {0}")]
    Unreachable(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// The operation conflicts with the object's state (e.g. killing a container that is not running).
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Any other answer of the engine.
    #[error("container engine error {status}: {message}")]
    Api { status: u16, message: String },
    #[error("{0}")]
    Other(String),
}

impl RuntimeError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, RuntimeError::NotFound(_))
    }
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            RuntimeError::Unreachable(_) | RuntimeError::Timeout(_)
        )
    }
}

/// hostlet's identity labels of a container, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLabels {
    pub node: String,
    pub pod: String,
    pub container: String,
    pub role: Role,
    pub spec_hash: String,
    pub restart_count: u32,
    /// A sidecar's place among the pod's init containers.
    pub sidecar: Option<u32>,
}

impl ContainerLabels {
    /// Reads the labels; `None` when the container is not a hostlet container (any identity label missing).
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<ContainerLabels> {
        Some(ContainerLabels {
            node: get(naming::LABEL_NODE)?.to_string(),
            pod: get(naming::LABEL_POD)?.to_string(),
            container: get(naming::LABEL_CONTAINER)?.to_string(),
            role: Role::parse(get(naming::LABEL_ROLE)?)?,
            spec_hash: get(naming::LABEL_SPEC_HASH).unwrap_or_default().to_string(),
            restart_count: get(LABEL_RESTART_COUNT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            sidecar: get(naming::LABEL_SIDECAR).and_then(|v| v.parse().ok()),
        })
    }

    pub fn from_map(map: &HashMap<String, String>) -> Option<ContainerLabels> {
        ContainerLabels::parse(|k| map.get(k).map(String::as_str))
    }

    /// The labels to create a container with.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = naming::labels(
            &self.node,
            &self.pod,
            &self.container,
            self.role,
            &self.spec_hash,
        );
        m.insert(
            LABEL_RESTART_COUNT.to_string(),
            self.restart_count.to_string(),
        );
        if let Some(i) = self.sidecar {
            m.insert(naming::LABEL_SIDECAR.to_string(), i.to_string());
        }
        m
    }
}

/// Where a container is in its life. hostlet starts every container once and never restarts one in place
/// (a restart is a new container), so for hostlet's own containers the states only move forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Created but not (yet, or not successfully) started.
    Created,
    Running {
        started_at: SystemTime,
    },
    Exited {
        exit_code: i64,
        started_at: Option<SystemTime>,
        finished_at: Option<SystemTime>,
        oom_killed: bool,
        /// The engine's error, e.g. when the process could not be started at all.
        error: Option<String>,
    },
}

impl RunState {
    pub fn is_running(&self) -> bool {
        matches!(self, RunState::Running { .. })
    }
    pub fn is_exited(&self) -> bool {
        matches!(self, RunState::Exited { .. })
    }
}

/// One of this node's containers as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub labels: ContainerLabels,
    pub image: String,
    pub created: SystemTime,
    pub state: RunState,
    /// The address of the container's network namespace (infra containers only; apps share it).
    pub ip: Option<IpAddr>,
    /// The container whose network namespace this one joined (app containers), when known.
    pub joined_to: Option<String>,
}

impl ContainerInfo {
    /// A container just made from `spec` under `id`, not started yet.
    pub fn created(id: &str, spec: &ContainerSpec, labels: ContainerLabels) -> ContainerInfo {
        ContainerInfo {
            id: id.to_string(),
            name: spec.name.clone(),
            labels,
            image: spec.image.clone(),
            created: SystemTime::now(),
            state: RunState::Created,
            ip: None,
            joined_to: match &spec.network {
                NetworkMode::JoinContainer(infra) => Some(infra.clone()),
                NetworkMode::Own { .. } => None,
            },
        }
    }
}

/// A port the infra container publishes on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPort {
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    pub host_ip: String,
    pub host_port: u16,
}

/// Which network namespace a container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkMode {
    /// Its own (the infra container), publishing these ports.
    Own { ports: Vec<PublishedPort> },
    /// The namespace of the container with this id; the engine refuses ports and hostname here.
    JoinContainer(String),
}

/// A host directory bound into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host_path: String,
    pub container_path: String,
    pub read_only: bool,
}

/// Everything needed to create one container, independent of the engine's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    /// Replaces the image's entrypoint (and its default arguments) when not empty.
    pub command: Vec<String>,
    /// Replaces the image's default arguments (its cmd) when not empty.
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    pub env: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
    pub hostname: Option<String>,
    pub network: NetworkMode,
    /// The resolver configuration (infra containers; the others share the infra's): `None` is the engine's
    /// default, the host's.
    pub dns: Option<hostlet_api::dns::Resolver>,
    /// `/etc/hosts` lines, `HOST:IP` (infra containers).
    pub extra_hosts: Vec<String>,
    pub binds: Vec<Bind>,
    pub cpu_shares: Option<i64>,
    pub cpu_period: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub memory_bytes: Option<i64>,
    /// A soft limit: what the container is guaranteed (Kubernetes' memory request).
    pub memory_reservation_bytes: Option<i64>,
    /// What the container may do to its host.
    pub security: Hardening,
    /// `lifecycle.stopSignal`; `None` keeps the image's `STOPSIGNAL` (else SIGTERM).
    pub stop_signal: Option<String>,
    /// Host devices the container gets (hostPath volumes of type `CharDevice` or `BlockDevice`).
    pub devices: Vec<DeviceMapping>,
    /// NVIDIA GPUs the container asks for (`nvidia.com/gpu`): a device request to the engine.
    pub gpus: Option<i64>,
}

/// A host device in a container, with the cgroup permissions the engine grants on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMapping {
    pub host: String,
    pub container: String,
    /// `rwm`, or `r` for a read-only mount.
    pub permissions: String,
}

/// The security settings a container is created with (see `hostlet_api::security`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hardening {
    /// `uid` or `uid:gid`; `None` keeps the image's user.
    pub user: Option<String>,
    pub privileged: bool,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub seccomp_unconfined: bool,
    /// Processes (and threads) the container may hold at once.
    pub pids_limit: Option<i64>,
    /// The cgroup the container's own cgroup is made under (`--pods-cgroup-parent`).
    pub cgroup_parent: Option<String>,
}

/// What happened to a container, from the engine's event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEventKind {
    Create,
    Start,
    Die {
        exit_code: Option<i64>,
    },
    Oom,
    Destroy,
    /// Anything else (kill, stop, health_status, …): counted, otherwise ignored.
    Other(String),
}

impl RuntimeEventKind {
    /// The metric label of this kind.
    pub fn label(&self) -> &str {
        match self {
            RuntimeEventKind::Create => "create",
            RuntimeEventKind::Start => "start",
            RuntimeEventKind::Die { .. } => "die",
            RuntimeEventKind::Oom => "oom",
            RuntimeEventKind::Destroy => "destroy",
            RuntimeEventKind::Other(_) => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEvent {
    pub kind: RuntimeEventKind,
    pub id: String,
    /// The container's labels (engines attach them to container events); `None` when not hostlet's.
    pub labels: Option<ContainerLabels>,
    pub image: Option<String>,
    pub name: Option<String>,
    /// When the engine says it happened.
    pub time: SystemTime,
}

/// CPU and memory of one container.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// Share of one core used over the engine's sample interval, in percent (200 = two cores).
    pub cpu_percent: f64,
    pub cpu_total_nanos: u64,
    pub memory_usage_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
}

/// The container engine, scoped to one node's containers.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// The node whose label this runtime lists and watches.
    fn node(&self) -> &str;
    /// Whether the engine answers.
    fn ping(&self) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// Every container carrying this node's label, running or not.
    fn list(&self) -> impl Future<Output = Result<Vec<ContainerInfo>, RuntimeError>> + Send;
    fn inspect(&self, id: &str)
        -> impl Future<Output = Result<ContainerInfo, RuntimeError>> + Send;
    /// Keeps the end of an exited container's output in `path` before the container is removed, for
    /// `pod logs --previous` (an engine that keeps nothing keeps nothing).
    fn save_log(
        &self,
        _id: &str,
        _path: &std::path::Path,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Ok(()) }
    }
    /// Creates the container and returns its id. The spec's labels must carry this node's label.
    fn create(
        &self,
        spec: &ContainerSpec,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;
    fn start(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// SIGTERM, up to `grace` for the process to exit, then SIGKILL; returns when it has stopped.
    fn stop(
        &self,
        id: &str,
        grace: Duration,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// The signal that stops the container: its own (`lifecycle.stopSignal`, else its image's
    /// `STOPSIGNAL`), SIGTERM when it has none.
    fn stop_signal(&self, id: &str) -> impl Future<Output = Result<String, RuntimeError>> + Send {
        let _ = id;
        async { Ok("SIGTERM".to_string()) }
    }
    /// Sends a signal (`SIGTERM`, `SIGKILL`, …) without waiting.
    fn signal(
        &self,
        id: &str,
        signal: &str,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// SIGKILL.
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        self.signal(id, "SIGKILL")
    }
    /// Removes a stopped container (and forces a running one).
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// This node's container events since `since` (the engine replays those already past), so a list
    /// taken after `since` misses nothing. The stream ends or errors when the connection drops.
    fn events(&self, since: SystemTime) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>>;
    /// Pulls an image; concurrent pulls of one image run once and share the outcome.
    fn pull(&self, image: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    fn image_present(&self, image: &str)
        -> impl Future<Output = Result<bool, RuntimeError>> + Send;
    /// The engine's cgroup driver (`cgroupfs`, `systemd`) and cgroup version (`1`, `2`).
    fn cgroup_driver(&self) -> impl Future<Output = Result<(String, String), RuntimeError>> + Send;
    /// The user a present image runs as (its `USER`; empty when it sets none, which is root).
    fn image_user(&self, image: &str) -> impl Future<Output = Result<String, RuntimeError>> + Send;
    /// The OCI runtimes the engine knows (`runc`, and `nvidia` where the NVIDIA toolkit set it up).
    fn runtimes(&self) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send;
    /// Runs a command in a running container and returns its exit code.
    fn exec(
        &self,
        id: &str,
        command: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<i64, RuntimeError>> + Send;
    fn stats(&self, id: &str) -> impl Future<Output = Result<ContainerStats, RuntimeError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_foreign_containers_are_not_read() {
        let l = ContainerLabels {
            node: "n1".into(),
            pod: "web".into(),
            container: "app".into(),
            role: Role::App,
            spec_hash: "0123456789abcdef".into(),
            restart_count: 3,
            sidecar: Some(1),
        };
        let map: HashMap<String, String> = l.to_map().into_iter().collect();
        assert_eq!(ContainerLabels::from_map(&map), Some(l));
        let mut foreign = map.clone();
        foreign.remove(naming::LABEL_NODE);
        assert_eq!(ContainerLabels::from_map(&foreign), None);
        let mut bad_role = map;
        bad_role.insert(naming::LABEL_ROLE.into(), "sidecar".into());
        assert_eq!(ContainerLabels::from_map(&bad_role), None);
    }
}
