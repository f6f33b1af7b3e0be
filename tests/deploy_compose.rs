//! `deploy/compose.yaml` with the image `hack/images.sh hostlet` builds: three containerised agents on this
//! machine found and join one cluster without a manual step, a pod applied through the CLI inside the first
//! runs on the host's engine with its emptyDir bind-mounted from the host path, `docker-compose down`
//! leaves nothing behind but the data dirs the file declares, and `up` again brings the same cluster back.
//!
//! The image is built from the binary this test build produced (a debug build): the Dockerfile and the
//! layout are the ones users get from `make image`, without a release build in CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hostlet_runtime::testkit::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A name part no other run on this machine uses at the same time.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!("{}x{}", std::process::id(), nanos % 100_000)
}

/// The three services of the compose file.
const SERVICES: [&str; 3] = ["n1", "n2", "n3"];

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn docker(args: &[&str]) -> Output {
    run(Command::new("docker").args(args))
}

fn lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// One compose project: its name, environment (ports, paths, names) and image; torn down on drop, even when
/// the test failed.
struct Cluster {
    project: String,
    env: BTreeMap<String, String>,
    prefix: String,
    image: String,
    root: PathBuf,
    metrics_ports: Vec<u16>,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    fn new(image: &str) -> Cluster {
        let tag = unique();
        let tmp = tempfile::Builder::new()
            .prefix("hostlet-compose-")
            .tempdir()
            .unwrap();
        let root = tmp.path().join("data");
        let prefix = format!("compose{tag}-");
        let mut env = BTreeMap::new();
        env.insert("HOSTLET_IMAGE".into(), image.to_string());
        env.insert("HOSTLET_DATA_ROOT".into(), root.display().to_string());
        env.insert("HOSTLET_NODE_PREFIX".into(), prefix.clone());
        env.insert("RUST_LOG".into(), "info".into());
        let mut metrics_ports = Vec::new();
        for n in ["N1", "N2", "N3"] {
            for what in ["API", "METRICS", "CLIENT", "PEER"] {
                let port = free_port();
                if what == "METRICS" {
                    metrics_ports.push(port);
                }
                env.insert(format!("HOSTLET_{n}_{what}_PORT"), port.to_string());
            }
        }
        Cluster {
            project: format!("hostlet-test-{tag}"),
            env,
            prefix,
            image: image.to_string(),
            root,
            metrics_ports,
            _tmp: tmp,
        }
    }

    fn compose(&self, args: &[&str]) -> Output {
        run(Command::new("docker-compose")
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(Path::new(REPO).join("deploy/compose.yaml"))
            .args(args)
            .envs(&self.env))
    }

    fn node(&self, service: &str) -> String {
        format!("{}{service}", self.prefix)
    }

    fn data_dir(&self, service: &str) -> PathBuf {
        self.root.join(service)
    }

    /// The id of a service's container.
    fn container(&self, service: &str) -> String {
        let o = self.compose(&["ps", "-q", service]);
        lines(&o)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no container for {service}: {}", text(&o)))
    }

    /// `hostlet ARGS` inside the first agent's container, `stdin` piped in.
    fn cli(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.container("n1"), "hostlet"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// Containers of the pods of this cluster's nodes.
    fn pod_containers(&self) -> Vec<String> {
        SERVICES
            .iter()
            .flat_map(|s| {
                lines(&docker(&[
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=io.hostlet.node={}", self.node(s)),
                ]))
            })
            .collect()
    }

    fn project_objects(&self, kind: &str) -> Vec<String> {
        let filter = format!("label=com.docker.compose.project={}", self.project);
        let o = match kind {
            "container" => docker(&["ps", "-aq", "--filter", &filter]),
            _ => docker(&[kind, "ls", "-q", "--filter", &filter]),
        };
        assert!(o.status.success(), "docker {kind} ls: {}", text(&o));
        lines(&o)
    }

    /// Polls `f` every 200 ms until it returns `Some`; after `timeout` fails with the agents' logs.
    fn wait_for<T>(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f() {
                return v;
            }
            if Instant::now() >= deadline {
                let logs = self.compose(&["logs", "--no-color", "--tail", "40"]);
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    text(&logs)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "-v", "--remove-orphans", "-t", "30"]);
        let pods = self.pod_containers();
        if !pods.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(pods.iter().map(String::as_str));
            let _ = docker(&args);
        }
        let _ = docker(&["rmi", &self.image]);
    }
}

/// `hostlet_etcd_members{role="…"}` as an agent's /metrics gives it.
fn members(metrics_port: u16, role: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let name = format!("hostlet_etcd_members{{role=\"{role}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// The files (not directories) of the image, as a container created from it holds them.
fn image_files(image: &str) -> std::collections::BTreeSet<String> {
    let created = docker(&["create", image]);
    assert!(created.status.success(), "{}", text(&created));
    let id = String::from_utf8_lossy(&created.stdout).trim().to_string();
    let listing = run(Command::new("sh")
        .arg("-c")
        .arg(format!("docker export {id} | tar -t")));
    let _ = docker(&["rm", &id]);
    assert!(listing.status.success(), "{}", text(&listing));
    lines(&listing)
        .into_iter()
        .filter(|l| !l.ends_with('/'))
        .collect()
}

/// What the agent needs and nothing more: hostlet, etcd and etcdctl, the libraries ldd lists for them,
/// the users and name lookup files, and what Docker itself puts in every container.
fn expected_image_files() -> std::collections::BTreeSet<String> {
    let mut want: std::collections::BTreeSet<String> = [
        "usr/local/bin/hostlet",
        "usr/local/bin/etcd",
        "usr/local/bin/etcdctl",
        "etc/passwd",
        "etc/group",
        "etc/nsswitch.conf",
        // Docker's own.
        ".dockerenv",
        "dev/console",
        "etc/hostname",
        "etc/hosts",
        "etc/mtab",
        "etc/resolv.conf",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    for bin in [BIN, "etcd", "etcdctl"] {
        let path = run(Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {bin}")));
        let path = String::from_utf8_lossy(&path.stdout).trim().to_string();
        let ldd = run(Command::new("ldd").arg(&path));
        for l in String::from_utf8_lossy(&ldd.stdout).lines() {
            let lib = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => l.split_whitespace().next(),
            };
            if let Some(lib) = lib.filter(|p| p.starts_with('/')) {
                want.insert(lib.trim_start_matches('/').to_string());
            }
        }
    }
    want
}

const POD: &str = "\
version: v1beta1
id: compose-web
terminationGracePeriodSeconds: 2
volumes:
  - name: data
    source: { emptyDir: {} }
containers:
  - name: app
    image: busybox:latest
    command: [sh, -c, \"trap 'exit 0' TERM; echo written-in-the-pod > /data/hello; while true; do sleep 1; done\"]
    volumeMounts: [{ name: data, mountPath: /data }]
";

#[test]
fn compose_cluster_of_three_runs_a_pod_and_leaves_only_its_data() {
    let tag = format!("hostlet:test-{}", unique());
    let built = run(Command::new("bash")
        .arg(Path::new(REPO).join("hack/images.sh"))
        .args(["hostlet", BIN, &tag]));
    assert!(built.status.success(), "image build: {}", text(&built));
    let cluster = Cluster::new(&tag);

    // The image runs as a plain command too, and declares no volume that a run could leave behind.
    let v = docker(&["run", "--rm", &tag, "--version"]);
    assert!(v.status.success(), "{}", text(&v));
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        format!("hostlet {}", env!("CARGO_PKG_VERSION"))
    );
    let vols = docker(&["image", "inspect", "-f", "{{json .Config.Volumes}}", &tag]);
    assert_eq!(String::from_utf8_lossy(&vols.stdout).trim(), "null");
    assert_eq!(image_files(&tag), expected_image_files());

    let up = cluster.compose(&["up", "-d"]);
    assert!(up.status.success(), "compose up: {}", text(&up));

    // Every agent sees the same three voters and no learner.
    cluster.wait_for(
        "three agents reporting three voters",
        Duration::from_secs(180),
        || {
            cluster
                .metrics_ports
                .iter()
                .all(|&p| members(p, "voter") == Some(3.0) && members(p, "learner") == Some(0.0))
                .then_some(())
        },
    );
    for s in SERVICES {
        assert!(
            cluster.data_dir(s).join("token").is_file(),
            "{s} keeps the cluster token in its data dir on the host"
        );
    }

    let applied = cluster.cli(&["pod", "apply", "-f", "-"], POD);
    assert!(applied.status.success(), "pod apply: {}", text(&applied));
    assert!(
        text(&applied).contains(&format!(
            "pod/compose-web created (node {})",
            cluster.node("n1")
        )),
        "{}",
        text(&applied)
    );

    // The pod's container runs on the host's engine, its emptyDir bind-mounted from the host path that
    // the agent inside the container created: the same path on both sides.
    let volume = cluster.data_dir("n1").join("pods/compose-web/volumes/data");
    let app = cluster.wait_for(
        "the pod's app container running",
        Duration::from_secs(120),
        || {
            let o = docker(&[
                "ps",
                "-q",
                "--filter",
                &format!("label=io.hostlet.node={}", cluster.node("n1")),
                "--filter",
                "label=io.hostlet.pod=compose-web",
                "--filter",
                "label=io.hostlet.container=app",
                "--filter",
                "status=running",
            ]);
            lines(&o).into_iter().next()
        },
    );
    let mounts = docker(&["inspect", "-f", "{{json .Mounts}}", &app]);
    let mounts: serde_json::Value = serde_json::from_slice(&mounts.stdout).unwrap();
    let data = mounts
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["Destination"] == "/data"))
        .unwrap_or_else(|| panic!("no /data mount: {mounts}"));
    assert_eq!(data["Type"], "bind", "{data}");
    assert_eq!(data["Source"], volume.display().to_string(), "{data}");
    let written = cluster.wait_for(
        "the pod's file on the host",
        Duration::from_secs(30),
        || std::fs::read_to_string(volume.join("hello")).ok(),
    );
    assert_eq!(written.trim(), "written-in-the-pod");

    let ls = cluster.cli(&["pod", "ls", "-o", "json"], "");
    assert!(ls.status.success(), "pod ls: {}", text(&ls));
    let pods: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(pods[0]["id"], "compose-web", "{pods}");

    // Pods are not the project's: an agent that stops leaves them running. Deleted, they go.
    let deleted = cluster.cli(&["pod", "delete", "compose-web"], "");
    assert!(deleted.status.success(), "pod delete: {}", text(&deleted));
    cluster.wait_for(
        "the pod's containers removed",
        Duration::from_secs(60),
        || cluster.pod_containers().is_empty().then_some(()),
    );

    let down = cluster.compose(&["down"]);
    assert!(down.status.success(), "compose down: {}", text(&down));
    for kind in ["container", "network", "volume"] {
        let left = cluster.project_objects(kind);
        assert!(left.is_empty(), "{kind}s left after down: {left:?}");
    }
    assert!(cluster.pod_containers().is_empty());
    // What stays is the data the file declares: each node's data dir with its etcd member.
    let mut names = Vec::new();
    for s in SERVICES {
        let member = cluster.data_dir(s).join("db/etcd/member");
        assert!(member.is_dir(), "{} kept after down", member.display());
        names.push(std::fs::read_to_string(cluster.data_dir(s).join("db/etcd/name")).unwrap());
    }

    // And `up` again brings the same cluster back: the same members, three voters again.
    let up = cluster.compose(&["up", "-d"]);
    assert!(up.status.success(), "compose up again: {}", text(&up));
    cluster.wait_for("three voters again", Duration::from_secs(180), || {
        cluster
            .metrics_ports
            .iter()
            .all(|&p| members(p, "voter") == Some(3.0) && members(p, "learner") == Some(0.0))
            .then_some(())
    });
    for (s, name) in SERVICES.iter().zip(&names) {
        let now = std::fs::read_to_string(cluster.data_dir(s).join("db/etcd/name")).unwrap();
        assert_eq!(&now, name, "{s} came back as the member it was");
    }
}
