//! Shared by the pods integration tests: a per-test node name whose containers are removed at the end,
//! waits with deadlines, and small Docker helpers through the `docker` CLI (the test's own view of the
//! engine, independent of the code under test).
#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

/// A node name unique to one test; every container labelled with it is removed on drop (even on panic).
pub struct TestNode {
    pub name: String,
}

impl TestNode {
    pub fn new(test: &str) -> TestNode {
        let name = format!("t-{test}-{:08x}", rand::random::<u32>()).replace('_', "-");
        TestNode { name }
    }

    /// Ids of this node's containers (`docker ps -a`), optionally only running ones.
    pub fn container_ids(&self, running_only: bool) -> Vec<String> {
        let filter = format!("label=io.hostlet.node={}", self.name);
        let mut args = vec!["ps", "-q", "--no-trunc", "--filter", filter.as_str()];
        if !running_only {
            args.push("-a");
        }
        docker_lines(&args)
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        for id in self.container_ids(false) {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v", &id])
                .output();
        }
    }
}

/// A container not created by hostlet (optionally labelled as another node's), removed on drop.
pub struct ForeignContainer {
    pub id: String,
}

impl ForeignContainer {
    pub fn start(name_hint: &str, labels: &[(&str, &str)]) -> ForeignContainer {
        let name = format!("{name_hint}-{:08x}", rand::random::<u32>());
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name];
        for (k, v) in labels {
            args.push("--label".into());
            args.push(format!("{k}={v}"));
        }
        args.extend(["busybox:latest", "sleep", "100000"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = docker_lines(&args)
            .pop()
            .expect("docker run printed the id");
        ForeignContainer { id }
    }

    /// `(id, running, restart count)` as Docker has it now.
    pub fn state(&self) -> (String, bool) {
        let out = docker_lines(&["inspect", "-f", "{{.Id}} {{.State.Running}}", &self.id]);
        let line = out.first().cloned().unwrap_or_default();
        let mut parts = line.split(' ');
        (
            parts.next().unwrap_or_default().to_string(),
            parts.next() == Some("true"),
        )
    }
}

impl Drop for ForeignContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.id]).output();
    }
}

pub fn docker_lines(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Makes sure busybox:latest exists (built by hack/images.sh).
pub fn ensure_images() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash")
        .arg(format!("{root}/hack/images.sh"))
        .output()
        .expect("hack/images.sh runs");
    assert!(
        out.status.success(),
        "images.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The suite's one wait: asks a condition until it holds, fails naming what it waited for.
#[allow(unused_imports)]
pub use hostlet_runtime::testkit::eventually;

/// A free TCP port on 127.0.0.1.
#[allow(unused_imports)]
pub use hostlet_runtime::testkit::free_port;

use hostlet_api::objects::{Event, PodStatus};
use hostlet_api::KeyLayout;
use hostlet_controllers::pods::controller::{
    start_pod_controller, PodControllerConfig, PodsHandle,
};
use hostlet_controllers::pods::docker::DockerRuntime;
use hostlet_runtime::testkit::TestEtcd;
use hostlet_runtime::{Etcd, Metrics};
use tokio_util::sync::CancellationToken;

/// A real etcd, this test's node, a data dir, and a pod controller that can be stopped and started again
/// (as hostlet restarts).
pub struct Harness {
    pub etcd: TestEtcd,
    pub client: Etcd,
    pub node: TestNode,
    pub data: tempfile::TempDir,
    pub layout: KeyLayout,
    pub metrics: Metrics,
    pub allowed_host_paths: Vec<std::path::PathBuf>,
    pub docker_host: Option<String>,
    running: Option<(
        CancellationToken,
        tokio::task::JoinHandle<()>,
        PodsHandle<DockerRuntime>,
    )>,
}

impl Harness {
    pub async fn start(test: &str) -> Harness {
        let mut h = Harness::without_controller(test).await;
        h.start_controller();
        h
    }

    /// Everything but the controller (start it with [`Harness::start_controller`]).
    pub async fn without_controller(test: &str) -> Harness {
        ensure_images();
        let etcd = TestEtcd::start().await;
        let client = etcd.connect().await;
        Harness {
            etcd,
            client,
            node: TestNode::new(test),
            data: tempfile::tempdir().unwrap(),
            layout: KeyLayout::default(),
            metrics: Metrics::new(),
            allowed_host_paths: Vec::new(),
            docker_host: None,
            running: None,
        }
    }

    pub fn config(&self) -> PodControllerConfig {
        let mut cfg = PodControllerConfig::new(&self.node.name, self.data.path());
        cfg.allowed_host_paths = self.allowed_host_paths.clone();
        cfg.docker_host = self.docker_host.clone();
        cfg
    }

    /// Starts the controller (with fresh metrics, as a new process would have).
    pub fn start_controller(&mut self) {
        assert!(self.running.is_none());
        self.metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        let informers = hostlet_runtime::InformerFactory::new(
            self.client.clone(),
            self.metrics.clone(),
            shutdown.clone(),
        );
        let (handle, task) = start_pod_controller(self.config(), &informers).unwrap();
        self.running = Some((shutdown, task, handle));
    }

    pub async fn stop_controller(&mut self) {
        if let Some((shutdown, task, _)) = self.running.take() {
            shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the controller stops within 10 s")
                .unwrap();
        }
    }

    pub fn handle(&self) -> &PodsHandle<DockerRuntime> {
        &self.running.as_ref().expect("controller running").2
    }

    pub async fn put(&self, id: &str, manifest: &str) {
        self.client
            .put(self.layout.pod(&self.node.name, id), manifest)
            .await
            .unwrap();
    }

    pub async fn delete(&self, id: &str) {
        self.client
            .delete(self.layout.pod(&self.node.name, id))
            .await
            .unwrap();
    }

    pub async fn status(&self, id: &str) -> Option<PodStatus> {
        let kv = self
            .client
            .get(self.layout.pod_status(&self.node.name, id))
            .await
            .unwrap()?;
        Some(serde_json::from_slice(kv.value()).unwrap())
    }

    /// Waits until the pod's status in etcd satisfies `pred`.
    pub async fn wait_status(
        &self,
        id: &str,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> PodStatus {
        let mut last = None;
        let start = tokio::time::Instant::now();
        loop {
            if let Some(s) = self.status(id).await {
                if pred(&s) {
                    return s;
                }
                last = Some(s);
            }
            assert!(
                start.elapsed() < deadline,
                "timed out after {deadline:?} waiting for pod {id}: {what}; last status: {}",
                serde_json::to_string_pretty(&last).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// This node's events in etcd, oldest first.
    pub async fn events(&self) -> Vec<Event> {
        let (kvs, _) = self
            .client
            .get_prefix(self.layout.events_prefix(&self.node.name))
            .await
            .unwrap();
        kvs.iter()
            .map(|kv| serde_json::from_slice(kv.value()).unwrap())
            .collect()
    }

    /// Waits for an event of `pod` with `reason` (and the container, when given).
    pub async fn wait_event(
        &self,
        pod: &str,
        container: Option<&str>,
        reason: &str,
        deadline: Duration,
    ) -> Event {
        eventually(
            &format!("event {reason} of {pod}/{container:?}"),
            deadline,
            || async {
                self.events().await.into_iter().find(|e| {
                    e.pod.as_deref() == Some(pod)
                        && e.reason == reason
                        && (container.is_none() || e.container.as_deref() == container)
                })
            },
        )
        .await
    }

    /// `(container name, role, id, running)` of the pod's containers, from Docker.
    pub fn containers(&self, pod: &str) -> Vec<(String, String, String, bool)> {
        let filter_node = format!("label=io.hostlet.node={}", self.node.name);
        let filter_pod = format!("label=io.hostlet.pod={pod}");
        docker_lines(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &filter_node,
            "--filter",
            &filter_pod,
            "--format",
            "{{.Label \"io.hostlet.container\"}} {{.Label \"io.hostlet.role\"}} {{.ID}} {{.State}}",
        ])
        .into_iter()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            (
                p[0].to_string(),
                p[1].to_string(),
                p[2].to_string(),
                p[3] == "running",
            )
        })
        .collect()
    }

    /// The id of the pod's running container `name`.
    pub fn running_id(&self, pod: &str, name: &str) -> Option<String> {
        self.containers(pod)
            .into_iter()
            .find(|(n, _, _, running)| n == name && *running)
            .map(|(_, _, id, _)| id)
    }

    /// Docker operations the controller made so far, by operation (`create`, `remove`, …), success or not.
    pub fn docker_ops(&self, op: &str) -> u64 {
        let families = self.metrics.registry().gather();
        families
            .iter()
            .filter(|f| f.name() == "hostlet_docker_operations_total")
            .flat_map(|f| f.get_metric())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "op" && l.value() == op)
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some((shutdown, _, _)) = self.running.take() {
            shutdown.cancel();
        }
    }
}

/// A proxy in front of the Docker socket that a test can cut (Docker "unreachable") and restore.
pub struct DockerProxy {
    pub path: std::path::PathBuf,
    enabled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl DockerProxy {
    pub fn start() -> DockerProxy {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let enabled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> =
            Default::default();
        let (en, conns) = (enabled.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !en.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut engine) =
                        tokio::net::UnixStream::connect("/var/run/docker.sock").await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
                    }
                });
                conns.lock().unwrap().push(task.abort_handle());
            }
        });
        DockerProxy {
            path,
            enabled,
            connections,
            accept,
            _dir: dir,
        }
    }

    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.enabled
            .store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        self.enabled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
