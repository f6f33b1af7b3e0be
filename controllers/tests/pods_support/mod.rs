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
            let _ = Command::new("docker").args(["rm", "-f", "-v", &id]).output();
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
        let id = docker_lines(&args).pop().expect("docker run printed the id");
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
    let out = Command::new("docker").args(args).output().expect("docker CLI runs");
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
    assert!(out.status.success(), "images.sh: {}", String::from_utf8_lossy(&out.stderr));
}

/// Polls `f` until it returns `Some`, failing the test with `what` after `deadline`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
