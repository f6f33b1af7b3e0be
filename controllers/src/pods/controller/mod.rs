//! The pod controller: keyed by pod id, desired = the informer's store of `/hostlet/hosts/<node>/pods/`,
//! observed = the Docker-event-fed cache. Each reconcile plans ([`super::planner::plan`]) and executes
//! the steps, then syncs the pod's probe workers and writes its status.
//!
//! Triggers: changes of the desired store, container events (through the observed cache), probe verdicts,
//! and the plan's own requeue (a backoff or a grace period ending). No reconcile runs before both the
//! desired store and the observed cache have synced, so orphans are removed only once every source was
//! read, and an etcd outage at start never empties the host.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hostlet_api::manifest::{Form, PodManifest, PullPolicy};
use hostlet_api::naming::INFRA_CONTAINER_NAME;
use hostlet_api::objects::{ContainerState, Timestamp};
use hostlet_api::security::{self, PodSecurityLevel};
use hostlet_api::validation::SourceKind;
use hostlet_api::validation::{describe, FieldError};
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::controller::{backoff, Action, Controller};
use hostlet_runtime::{ComponentHandle, ExponentialBackoff, InformerFactory, Store};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;
use crate::sources::http::HttpSource;
use crate::sources::url::UrlSourceConfig;
use crate::sources::{self, DesiredPod as SourcedDesired, Merged, Merger};

mod admission;
mod config_change;
mod execute;
#[cfg(test)]
mod fake_tests;
mod handle;
mod hooks;

use super::backoff::pull_backoff;
use super::configs::ConfigStores;
use super::docker::DockerRuntime;
use super::metrics::{DockerOpMetrics, PodMetrics};
use super::observed::{run_observer, ObservedCache, PodChanged, RELIST_PERIOD};
use super::planner::{
    plan, CreateReason, DesiredPod, HandledExit, InfraRef, ObservedPod, PodRuntimeState,
    PullFailure, Step, Termination,
};
use super::probe_results::ProbeResults;
use super::probes::ProbeManager;
use super::runtime::{ContainerInfo, ContainerRuntime, RunState, RuntimeError};
use super::spec::{self, SpecConfig, DEFAULT_PAUSE_IMAGE};
use super::status::{build_status, rejected_status, StatusWriter};

/// What a pod's status says while Docker does not answer: its containers are shown as last seen.
pub const DOCKER_UNREACHABLE_MESSAGE: &str =
    "Docker unreachable: container states as last seen; running containers are left alone";

/// The controller's name in the runtime's metrics.
pub const CONTROLLER_NAME: &str = "pods";

/// What the pod controller needs to know.
#[derive(Debug, Clone)]
pub struct PodControllerConfig {
    pub node: String,
    /// `--key-prefix`.
    pub key_prefix: String,
    /// `--docker-host` (`None`: `DOCKER_HOST` or the local socket).
    pub docker_host: Option<String>,
    /// `--pause-image`.
    pub pause_image: String,
    /// `--container-log-max-size`, `--container-log-max-files`.
    pub log_limits: super::docker::LogLimits,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--allowed-host-paths`.
    pub allowed_host_paths: Vec<PathBuf>,
    /// `--allowed-devices`.
    pub allowed_devices: Vec<String>,
    /// Pods reconciled at once.
    pub workers: usize,
    /// The observed cache's safety relist.
    pub relist_period: Duration,
    /// Readiness of the Docker connection (`/readyz`).
    pub docker_readiness: Option<ComponentHandle>,
    /// Readiness of the caches: the desired store and the observed cache have synced.
    pub caches_readiness: Option<ComponentHandle>,
    /// `--manifest-path`: a file or directory of manifests.
    pub manifest_path: Option<PathBuf>,
    /// `--manifest-url` (with its headers).
    pub manifest_url: Option<UrlSourceConfig>,
    /// The agent's event recorder (`None`: one of its own).
    pub events: Option<EventRecorder>,
    /// `--pod-security`.
    pub pod_security: PodSecurityLevel,
    /// `--pod-pids-limit` (`None`: no limit).
    pub pids_limit: Option<i64>,
    /// `--pods-cgroup-parent` (`None`: chosen by Docker's cgroup driver; see [`super::cgroups`]).
    pub cgroup_parent: Option<String>,
    /// Where the cgroup file system is mounted (the controller's tests on a fake engine point it elsewhere).
    pub cgroup_root: PathBuf,
    /// `--pods-reserved-cpu`, in thousandths of a core.
    pub reserved_cpu_millis: Option<i64>,
    /// `--pods-reserved-memory`, in bytes.
    pub reserved_memory_bytes: Option<i64>,
    /// Host ports no pod may publish, each with what holds it (the agent's own, `--reserved-host-ports`).
    pub reserved_host_ports: Vec<(u16, String)>,
    /// `--image-gc-*` (`None`: no image collection).
    pub image_gc: Option<super::images::ImageGcPolicy>,
    /// The images directories (`<data-dir>/images`, `--images-dir`); none: no directory is watched.
    pub images_dirs: Vec<PathBuf>,
    /// What opens the secrets pods use (`None`: sealed secrets stay unreadable on this node).
    pub secret_keys: Option<crate::secrets::SecretKeys>,
}

impl PodControllerConfig {
    /// Defaults for `node` with its data under `data_dir`.
    pub fn new(node: &str, data_dir: impl Into<PathBuf>) -> Self {
        PodControllerConfig {
            node: node.to_string(),
            key_prefix: hostlet_api::keys::DEFAULT_PREFIX.to_string(),
            docker_host: None,
            pause_image: DEFAULT_PAUSE_IMAGE.to_string(),
            log_limits: super::docker::LogLimits::default(),
            data_dir: data_dir.into(),
            allowed_host_paths: Vec::new(),
            allowed_devices: Vec::new(),
            workers: 8,
            relist_period: RELIST_PERIOD,
            docker_readiness: None,
            caches_readiness: None,
            manifest_path: None,
            manifest_url: None,
            events: None,
            pod_security: PodSecurityLevel::default(),
            pids_limit: Some(spec::DEFAULT_PIDS_LIMIT),
            cgroup_parent: None,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            reserved_cpu_millis: None,
            reserved_memory_bytes: None,
            reserved_host_ports: Vec::new(),
            image_gc: None,
            images_dirs: Vec::new(),
            secret_keys: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PodControllerError {
    #[error("docker: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Why one reconcile failed (it is retried with the queue's backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{op} {target}: {source}")]
    Runtime {
        op: &'static str,
        target: String,
        #[source]
        source: RuntimeError,
    },
    #[error("pod {pod}: {message}")]
    HostPathChanged { pod: String, message: String },
    #[error("preparing volumes of pod {pod}: {source}")]
    Volumes {
        pod: String,
        #[source]
        source: std::io::Error,
    },
}

/// Whether a container the engine was asked to start runs.
enum Started {
    Yes,
    /// The engine refused, with its message.
    No(String),
}

/// Why an image could not be made present.
enum ImageError {
    /// The image is missing and cannot be had (pull failed, or policy Never): the pull backoff applies.
    Unavailable(String),
    /// Docker did not answer: retried like any failed reconcile.
    Runtime(RuntimeError),
}

/// What a pod should be, after parsing and validation.
#[derive(Debug, Clone)]
enum Desired {
    Absent,
    /// Why, and the source the refused manifest came from (its status says so, as a running pod's does).
    Rejected(String, SourceKind),
    Run(Box<DesiredPod>),
}

/// Readiness of the pod side of hostlet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodsReadiness {
    pub docker_reachable: bool,
    pub observed_synced: bool,
    pub desired_synced: bool,
}

/// One pod as the HTTP API shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest: Option<PodManifest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<hostlet_api::objects::PodStatus>,
}

/// Why `/stats/<pod>/<container>` has no answer.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("no running container {container:?} in pod {pod:?}")]
    NotFound { pod: String, container: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

type HostDirs = HashMap<String, (Vec<(String, String)>, BTreeMap<String, PathBuf>)>;

struct Shared<R> {
    cfg: PodControllerConfig,
    layout: KeyLayout,
    spec: SpecConfig,
    rt: Arc<R>,
    cache: ObservedCache,
    /// The merged pods of every source, by pod id.
    desired: Store<String, SourcedDesired>,
    merged: Merged,
    http_source: HttpSource,
    /// Duplicate-id rejections and pod security warnings already reported (origin or pod, message).
    reported_duplicates: Mutex<HashSet<(String, String)>>,
    /// By pod with `hostlet.io/on-config-change`: by app container, the ConfigMaps and Secrets it uses and
    /// the revision each was at when last looked at.
    #[allow(clippy::type_complexity)]
    config_seen: Mutex<
        HashMap<
            String,
            BTreeMap<String, BTreeMap<(hostlet_api::manifest::ConfigKind, String), i64>>,
        >,
    >,
    status: StatusWriter,
    probes: ProbeManager<R>,
    probe_results: ProbeResults,
    memory: Mutex<HashMap<String, PodRuntimeState>>,
    /// Pods seen in etcd and not yet running, with when they were seen (pod start duration).
    starting: Mutex<HashMap<String, Instant>>,
    /// Pods rejected last time, re-checked whenever the desired set changes (a conflict may be gone).
    rejected: Mutex<HashSet<String>>,
    /// Pod → (its hostDir volumes as declared, as resolved at admission).
    host_dirs: Mutex<HostDirs>,
    /// The pods' parent cgroup, once Docker's cgroup driver is known and the limits are written.
    cgroup_parent: tokio::sync::OnceCell<Option<String>>,
    metrics: PodMetrics,
    /// When a container was last created from each image (the image collector's "last used").
    image_uses: super::images::ImageUses,
    /// Every ConfigMap and Secret, for the pods' environments and volumes.
    configs: ConfigStores,
    /// Puts a pod on the controller's queue.
    wake: PodChanged,
    /// Fetches an image from another node that has it (set once the agent knows the nodes).
    peer: std::sync::OnceLock<PeerFetch>,
}

/// Fetches an image from another node: the node it came from, or why none gave it.
pub type PeerFetch = Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, Result<String, String>> + Send + Sync,
>;

/// A handle on a running pod controller: readiness and the data of the HTTP API. Cheap to clone.
pub struct PodsHandle<R> {
    shared: Arc<Shared<R>>,
}

impl<R> Clone for PodsHandle<R> {
    fn clone(&self) -> Self {
        PodsHandle {
            shared: self.shared.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the pod controller on Docker, its manifest stores from `informers`; returns its handle and the
/// task that runs until the factory's shutdown.
pub fn start_pod_controller(
    cfg: PodControllerConfig,
    informers: &InformerFactory,
) -> Result<(PodsHandle<DockerRuntime>, JoinHandle<()>), PodControllerError> {
    let metrics = informers.metrics();
    let shutdown = informers.shutdown().clone();
    let docker_metrics = DockerOpMetrics::register(metrics.registry())?;
    let rt = Arc::new(
        DockerRuntime::new(cfg.docker_host.as_deref(), &cfg.node, docker_metrics)?
            .with_log_limits(cfg.log_limits),
    );
    let gc_policy = cfg.image_gc.filter(|p| p.enabled());
    let gc_metrics = super::images::ImageGcMetrics::register(metrics.registry())?;
    let dir_metrics = super::image_dir::ImagesDirMetrics::register(metrics.registry())?;
    let (handle, task) = start_with_runtime(cfg, rt.clone(), informers)?;
    let pinned = super::image_dir::PinnedImages::default();
    if !handle.shared.cfg.images_dirs.is_empty() {
        let dir = super::image_dir::ImagesDir::new(
            rt.clone(),
            handle.shared.cfg.images_dirs.clone(),
            &handle.shared.cfg.data_dir,
            pinned.clone(),
            handle.shared.cfg.events.clone(),
            dir_metrics,
            {
                let handle = handle.clone();
                Arc::new(move || handle.images_arrived())
            },
        );
        tokio::spawn(dir.run(shutdown.clone()));
    }
    if let Some(policy) = gc_policy {
        let gc = super::images::ImageGc::new(
            rt,
            policy,
            handle.shared.image_uses.clone(),
            handle.desired_images(),
            &handle.shared.cfg.pause_image,
            handle.shared.cfg.events.clone(),
            gc_metrics,
        )
        .with_pinned(pinned);
        tokio::spawn(gc.run(shutdown));
    }
    Ok((handle, task))
}

/// Runs the pod controller on Docker until the factory's shutdown.
pub async fn run_pod_controller(
    cfg: PodControllerConfig,
    informers: &InformerFactory,
) -> Result<(), PodControllerError> {
    let (_, task) = start_pod_controller(cfg, informers)?;
    let _ = task.await;
    Ok(())
}

/// Starts the pod controller on any runtime.
pub fn start_with_runtime<R: ContainerRuntime>(
    cfg: PodControllerConfig,
    rt: Arc<R>,
    informers: &InformerFactory,
) -> Result<(PodsHandle<R>, JoinHandle<()>), PodControllerError> {
    let etcd = informers.client().clone();
    let metrics = informers.metrics();
    let shutdown = informers.shutdown().clone();
    let pod_metrics = PodMetrics::register(metrics.registry())?;
    let layout = KeyLayout::new(&cfg.key_prefix);
    // Every manifest source feeds one merger; the controller reads the merged pods by id.
    let mut kinds = vec![SourceKind::EtcdKey, SourceKind::EtcdList, SourceKind::Http];
    if cfg.manifest_path.is_some() {
        kinds.push(SourceKind::File);
    }
    if cfg.manifest_url.is_some() {
        kinds.push(SourceKind::Url);
    }
    let cache = ObservedCache::default();
    let (merger, sink) = Merger::new(kinds);
    // A pod with containers on the host was admitted before any pod that arrives now: read which (and
    // since when) from Docker before the first merge, so a restart keeps who holds a host port.
    let merger = merger.with_admitted({
        let cache = cache.clone();
        async move {
            cache.wait_synced().await;
            cache.admission_times()
        }
    });
    let merged = merger.merged();
    let desired = merged.store.clone();
    let http_source = HttpSource::new(sink.clone());
    let events = cfg
        .events
        .clone()
        .unwrap_or_else(|| EventRecorder::new(etcd.clone(), layout.clone(), cfg.node.clone()));
    let mut source_tasks = vec![
        tokio::spawn(merger.run(shutdown.clone())),
        tokio::spawn(sources::etcd::run_pod_keys(
            sources::etcd::pod_keys_store(informers, &layout, &cfg.node),
            layout.clone(),
            sink.clone(),
            Some(events.clone()),
            shutdown.clone(),
        )),
        tokio::spawn(sources::etcd::run_legacy_list(
            sources::etcd::legacy_list_store(informers, &layout, &cfg.node),
            layout.clone(),
            cfg.node.clone(),
            sink.clone(),
            Some(events.clone()),
            shutdown.clone(),
        )),
    ];
    if let Some(path) = cfg.manifest_path.clone() {
        source_tasks.push(tokio::spawn(sources::file::run(
            path,
            sink.clone(),
            Some(events.clone()),
            shutdown.clone(),
        )));
    }
    if let Some(url) = cfg.manifest_url.clone() {
        source_tasks.push(tokio::spawn(sources::url::run(
            url,
            sink.clone(),
            Some(events.clone()),
            shutdown.clone(),
        )));
    }
    drop(sink);
    // Container events and probe verdicts name pods; they reach the controller's queue through this.
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded::<String>();
    let stale_status_tx = wake_tx.clone();
    let status = StatusWriter::new(&cfg.node, layout.clone()).with_events(events.clone());
    let probe_results = ProbeResults::default();
    let enqueue: PodChanged = Arc::new(move |pod: &str| {
        let _ = wake_tx.unbounded_send(pod.to_string());
    });
    let probes = ProbeManager::new(
        rt.clone(),
        cache.clone(),
        probe_results.clone(),
        status.clone(),
        enqueue.clone(),
        Some(pod_metrics.clone()),
        shutdown.clone(),
    );
    let configs = ConfigStores::start(informers, &layout, cfg.secret_keys.clone());
    let follow_references = tokio::spawn(
        configs
            .clone()
            .follow_references(desired.clone(), shutdown.clone()),
    );
    let spec = SpecConfig {
        node: cfg.node.clone(),
        pause_image: cfg.pause_image.clone(),
        data_dir: cfg.data_dir.clone(),
        allowed_host_paths: cfg.allowed_host_paths.clone(),
        allowed_devices: cfg.allowed_devices.clone(),
        pod_security: cfg.pod_security,
        pids_limit: cfg.pids_limit,
        // Set on each create once known (see `Shared::cgroup_parent`).
        cgroup_parent: None,
        host_resolver: spec::host_resolver(),
    };
    let shared = Arc::new(Shared {
        layout,
        spec,
        rt: rt.clone(),
        cache: cache.clone(),
        desired,
        merged: merged.clone(),
        http_source,
        reported_duplicates: Mutex::default(),
        config_seen: Mutex::default(),
        status: status.clone(),
        probes,
        probe_results,
        memory: Mutex::default(),
        starting: Mutex::default(),
        rejected: Mutex::default(),
        host_dirs: Mutex::default(),
        cgroup_parent: tokio::sync::OnceCell::new(),
        metrics: pod_metrics.clone(),
        image_uses: super::images::ImageUses::default(),
        configs,
        wake: enqueue.clone(),
        peer: std::sync::OnceLock::new(),
        cfg,
    });

    let mut tasks = vec![
        tokio::spawn(run_observer(
            rt,
            cache,
            enqueue,
            Some(pod_metrics),
            shared.cfg.relist_period,
            shutdown.clone(),
        )),
        tokio::spawn(status.run(etcd.clone(), shutdown.clone())),
        tokio::spawn(wake_status_owners(
            etcd,
            shared.layout.clone(),
            shared.cfg.node.clone(),
            stale_status_tx,
            shutdown.clone(),
        )),
        tokio::spawn(report_readiness(shared.clone(), shutdown.clone())),
        follow_references,
    ];
    tasks.extend(source_tasks);
    let on_change = shared.clone();
    let controller = Controller::new(CONTROLLER_NAME, shared.clone(), metrics)
        .watches(&shared.desired, move |key: &String| {
            on_change.desired_changed(key)
        })
        .watches(&shared.configs.config_maps, {
            let s = shared.clone();
            move |key: &String| s.pods_using(key)
        })
        .watches(&shared.configs.secrets, {
            let s = shared.clone();
            move |key: &String| s.pods_using(key)
        })
        .ready_when({
            // Orphans go only once every source has answered: wait for all of them. No container is made
            // before the pods' cgroup is ready.
            let cache = shared.cache.clone();
            let merged = merged.clone();
            let s = shared.clone();
            let stop = shutdown.clone();
            async move {
                cache.wait_synced().await;
                merged.wait_all_synced().await;
                s.prepare_cgroup(&stop).await;
            }
        })
        .triggers(rejections_changed(shared.clone()))
        .triggers(wake_rx)
        .triggers(docker_reachability_changes(shared.clone()))
        .concurrency(shared.cfg.workers);
    let main = tokio::spawn(controller.run(
        |pod: String, s: Arc<Shared<R>>| async move {
            let requeue = s.reconcile(&pod).await?;
            Ok::<_, ReconcileError>(requeue.map_or(Action::AwaitChange, Action::Requeue))
        },
        backoff,
        shutdown.clone(),
    ));
    let joined = tokio::spawn(async move {
        let _ = main.await;
        for t in tasks {
            let _ = t.await;
        }
    });
    Ok((PodsHandle { shared }, joined))
}

/// Every desired pod, each time Docker's reachability changes: when it goes away, so that each pod's status
/// says so (once); when it is back, so that what failed meanwhile is retried at once instead of after its
/// grown backoff and the statuses are plain again.
fn docker_reachability_changes<R: ContainerRuntime>(
    s: Arc<Shared<R>>,
) -> impl futures::Stream<Item = String> {
    let rx = s.cache.reachability();
    use futures::StreamExt;
    // The cache starts unreachable until its first list: the first edge that counts is the way up.
    futures::stream::unfold((rx, s, false), |(mut rx, s, up)| async move {
        rx.wait_for(|r| *r != up).await.ok()?;
        let pods: Vec<String> = s.desired.keys();
        Some((futures::stream::iter(pods), (rx, s, !up)))
    })
    .flatten()
}

/// The pods named by rejections, each time the set of rejections changes (their status must say so).
fn rejections_changed<R: ContainerRuntime>(
    s: Arc<Shared<R>>,
) -> impl futures::Stream<Item = String> {
    let rx = s.merged.rejections_changed();
    use futures::StreamExt;
    futures::stream::unfold((rx, s), |(mut rx, s)| async move {
        rx.changed().await.ok()?;
        let pods: Vec<String> = s.report_duplicates().await;
        Some((futures::stream::iter(pods), (rx, s)))
    })
    .flatten()
}

/// Queues every pod that has a status in etcd, once: a pod deleted while hostlet was down has neither a
/// manifest nor containers left to trigger its reconcile, and its status must go too.
async fn wake_status_owners(
    etcd: hostlet_runtime::ClusterClient,
    layout: KeyLayout,
    node: String,
    wake: futures::channel::mpsc::UnboundedSender<String>,
    shutdown: CancellationToken,
) {
    let mut backoff = ExponentialBackoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let prefix = layout.statuses_prefix(&node);
    loop {
        let listed = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = etcd.get_prefix(&prefix) => r,
        };
        match listed {
            Ok(kvs) => {
                for (key, _) in kvs {
                    if let Some(Key::PodStatus { pod, .. }) = layout.parse(&key) {
                        let _ = wake.unbounded_send(pod);
                    }
                }
                return;
            }
            Err(e) => {
                let retry = backoff.next_delay();
                tracing::debug!(error = %e, retry_in = ?retry, "listing pod statuses failed");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
            }
        }
    }
}

async fn report_readiness<R: ContainerRuntime>(s: Arc<Shared<R>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let r = PodsHandle { shared: s.clone() }.readiness();
        if let Some(h) = &s.cfg.docker_readiness {
            if r.docker_reachable {
                h.set_ready("reachable");
            } else {
                h.set_not_ready("Docker unreachable; retrying (running pods are left alone)");
            }
        }
        if let Some(h) = &s.cfg.caches_readiness {
            match (r.desired_synced, r.observed_synced) {
                (true, true) => h.set_ready("synced"),
                (false, _) => h.set_not_ready("waiting for the pods in etcd"),
                (true, false) => h.set_not_ready("waiting for the first list of containers"),
            }
        }
    }
}

impl<R: ContainerRuntime> Shared<R> {
    /// Picks the pods' parent cgroup by Docker's cgroup driver and writes its limits; retried until it
    /// works, since a pod must not run outside the share kept for the etcd member.
    async fn prepare_cgroup(&self, shutdown: &CancellationToken) {
        let mut backoff =
            ExponentialBackoff::new(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            match self.try_prepare_cgroup().await {
                Ok(parent) => {
                    tracing::info!(
                        parent = parent.as_deref().unwrap_or("(engine default)"),
                        "pods' cgroup ready"
                    );
                    let _ = self.cgroup_parent.set(parent);
                    return;
                }
                Err(e) => {
                    let retry = backoff.next_delay();
                    tracing::error!(error = %e, retry_in = ?retry, "preparing the pods' cgroup failed; no pod starts until it works");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
            }
        }
    }

    async fn try_prepare_cgroup(&self) -> Result<Option<String>, String> {
        let (driver, version) = self
            .rt
            .cgroup_driver()
            .await
            .map_err(|e| format!("asking Docker for its cgroup driver: {e}"))?;
        let parent = self
            .cfg
            .cgroup_parent
            .clone()
            .unwrap_or_else(|| super::cgroups::default_parent(&driver).to_string());
        let limits = super::cgroups::allocatable(
            super::cgroups::host_cpu_millis(),
            super::cgroups::host_memory_bytes()?,
            self.cfg.reserved_cpu_millis,
            self.cfg.reserved_memory_bytes,
        )?;
        let reserving =
            self.cfg.reserved_cpu_millis.is_some() || self.cfg.reserved_memory_bytes.is_some();
        let applied = match driver.as_str() {
            "systemd" => super::cgroups::apply_systemd(&parent, limits),
            _ => super::cgroups::apply_cgroupfs(&self.cfg.cgroup_root, &version, &parent, limits),
        };
        match applied {
            Ok(()) => Ok(Some(parent)),
            Err(e) if reserving => Err(e),
            // Nothing to keep back: the parent only groups the pods, and the engine makes it.
            Err(e) => {
                tracing::debug!(error = %e, "writing the pods' cgroup limits");
                Ok(Some(parent))
            }
        }
    }

    /// The pods to reconcile when an etcd key changed: its own, and every rejected pod (a conflict that
    /// rejected it may be gone). Also starts the pod's start-duration clock.
    fn desired_changed(&self, pod: &String) -> Vec<String> {
        let mut pods: Vec<String> = lock(&self.rejected).iter().cloned().collect();
        if self.desired.get(pod).is_some() && self.cache.pod(pod).infra().is_none() {
            lock(&self.starting)
                .entry(pod.clone())
                .or_insert_with(Instant::now);
        }
        pods.push(pod.clone());
        pods
    }

    /// The desired pods that refer to the ConfigMap or Secret of an etcd key: their environments wait on it
    /// and their volumes show it.
    fn pods_using(&self, key: &str) -> Vec<String> {
        let Some(named) = self.configs.named_by(key) else {
            return Vec::new();
        };
        self.desired
            .entries()
            .into_iter()
            .filter(|(_, d)| d.manifest.config_refs().contains(&named))
            .map(|(id, _)| id)
            .collect()
    }

    /// Reports rejections that lost to a pod of the same id (the winner keeps the status key, so the
    /// loser is told through an event), once each; returns the ids whose status must say Rejected.
    async fn report_duplicates(&self) -> Vec<String> {
        let mut ids = Vec::new();
        for r in self.merged.rejected() {
            if r.duplicate_id {
                let fresh =
                    lock(&self.reported_duplicates).insert((r.origin.clone(), r.reason.clone()));
                if fresh {
                    let message = format!("{} ({}): {}", r.origin, r.source, r.reason);
                    self.status.event(
                        r.id.as_deref().unwrap_or(""),
                        None,
                        "Rejected",
                        &message,
                        true,
                    );
                }
            } else if let Some(id) = r.id {
                ids.push(id);
            }
        }
        ids
    }

    /// One reconcile of one pod; returns when to look again, if a deadline needs it.
    async fn reconcile(&self, pod: &str) -> Result<Option<Duration>, ReconcileError> {
        let mut desired = self.desired(pod);
        if let Desired::Run(d) = &desired {
            let refusal = match self.root_image_refusal(&d.manifest).await {
                Some(why) => Some(why),
                None => self.gpu_refusal(&d.manifest).await,
            };
            if let Some(why) = refusal {
                let source = self
                    .desired
                    .get(pod)
                    .map_or(SourceKind::EtcdKey, |s| s.source);
                desired = Desired::Rejected(why, source);
            }
        }
        if let Desired::Run(d) = &desired {
            // Its hashes cover the revisions of what it uses: judged before the stores are filled, every
            // container would look changed (an agent's start would restart them all).
            if d.manifest.on_config_change().is_some() && !self.configs.is_ready() {
                return Ok(Some(Duration::from_millis(200)));
            }
        }
        let to_signal = match &mut desired {
            Desired::Run(d) => self.follow_configs(pod, d),
            _ => Vec::new(),
        };
        let observed = self.cache.pod(pod);
        let mut memory = lock(&self.memory).get(pod).cloned().unwrap_or_default();
        let ids: HashSet<&str> = observed.containers.iter().map(|c| c.id.as_str()).collect();
        memory.terminating.retain(|id, _| ids.contains(id.as_str()));
        memory.unhealthy = self.probe_results.unhealthy(&ids);
        memory.not_ready = match &desired {
            Desired::Run(d) => d
                .manifest
                .init_containers
                .iter()
                .filter(|c| c.is_sidecar())
                .filter_map(|c| observed.current_init(&c.name).map(|cur| (c, cur)))
                .filter(|(c, cur)| {
                    !self.probe_results.started_and_ready(
                        &cur.id,
                        c.readiness_probe.is_some(),
                        c.startup_probe.is_some(),
                    )
                })
                .map(|(_, cur)| cur.id.clone())
                .collect(),
            _ => BTreeSet::new(),
        };
        let run = match &desired {
            Desired::Run(d) => {
                memory.grace = Some(d.grace());
                Some(d.as_ref())
            }
            _ => None,
        };
        let now = Instant::now();
        let p = plan(run, &observed, &memory, now);
        let mut cleaned = false;
        let result = self
            .execute(pod, run, &observed, &p.steps, &mut memory, &mut cleaned)
            .await;

        let observed = self.cache.pod(pod);
        if let Some(d) = run {
            // A running pod's configMap and secret volumes follow their objects.
            self.write_config_volumes(pod, &d.manifest, false);
            self.signal_changed(pod, &observed, &to_signal).await;
            // After the plan ran: a container replaced now stopped with the hook it was made with.
            memory.pre_stop = d
                .manifest
                .all_containers()
                .filter(|c| c.pre_stop().is_some())
                .map(|c| (c.name.clone(), c.clone()))
                .collect();
        }
        self.probes
            .sync_pod(pod, run.map(|d| &d.manifest), &observed);
        match &desired {
            Desired::Run(d) => {
                lock(&self.rejected).remove(pod);
                let mut st = build_status(
                    &self.cfg.node,
                    &d.manifest,
                    &observed,
                    &memory,
                    &self.probe_results,
                    now,
                );
                if !self.cache.docker_reachable() {
                    // Constant text, so that the status is written once per outage, not per retry.
                    let note = DOCKER_UNREACHABLE_MESSAGE;
                    st.message = if st.message.is_empty() {
                        note.to_string()
                    } else {
                        format!("{note}; {}", st.message)
                    };
                }
                if let Some(src) = self.desired.get(pod) {
                    st.source = Some(source_name(src.source).to_string());
                    if src.source != SourceKind::EtcdKey {
                        st.manifest =
                            Some(hostlet_api::parse::to_value(&d.manifest, d.manifest.form));
                    }
                }
                let all_running = st
                    .containers
                    .iter()
                    .all(|c| matches!(c.state, ContainerState::Running { .. }));
                if all_running {
                    if let Some(seen) = lock(&self.starting).remove(pod) {
                        self.metrics
                            .pod_start_duration
                            .observe(seen.elapsed().as_secs_f64());
                    }
                }
                self.status.set(st);
            }
            Desired::Rejected(message, source) => {
                lock(&self.rejected).insert(pod.to_string());
                lock(&self.starting).remove(pod);
                let mut st = rejected_status(&self.cfg.node, pod, message);
                st.source = Some(source_name(*source).to_string());
                if self.status.set(st) {
                    self.status.event(pod, None, "Rejected", message, true);
                }
            }
            Desired::Absent => {
                lock(&self.rejected).remove(pod);
                lock(&self.starting).remove(pod);
                if cleaned {
                    self.status.delete(pod);
                }
            }
        }
        if cleaned {
            lock(&self.memory).remove(pod);
            lock(&self.config_seen).remove(pod);
            lock(&self.host_dirs).remove(pod);
            self.probes.forget_pod(pod);
        } else {
            lock(&self.memory).insert(pod.to_string(), memory);
        }
        let (pods, containers) = self.cache.running_counts();
        self.metrics.running_pods.set(pods as i64);
        self.metrics.running_containers.set(containers as i64);
        result.map(|()| p.requeue_after)
    }
}

fn termination_of(c: &ContainerInfo) -> Option<ContainerState> {
    match &c.state {
        RunState::Exited {
            exit_code,
            finished_at,
            ..
        } => Some(ContainerState::Terminated {
            exit_code: *exit_code,
            reason: super::status::termination_reason(&c.state).to_string(),
            finished_at: finished_at.map(Timestamp),
        }),
        _ => None,
    }
}

/// The source's name as statuses carry it.
fn source_name(k: SourceKind) -> &'static str {
    match k {
        SourceKind::EtcdKey => "etcd-key",
        SourceKind::EtcdList => "etcd-list",
        SourceKind::File => "file",
        SourceKind::Url => "url",
        SourceKind::Http => "http",
    }
}
