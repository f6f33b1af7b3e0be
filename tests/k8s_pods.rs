//! Kubernetes v1 Pods from the Kubernetes documentation (tests/manifests/k8s-*.yaml: busybox for the
//! images, commands adjusted) applied as written to a real agent on the real Docker engine, and what they
//! do checked there: the page the app serves, the shared emptyDir, init containers run first and in
//! order, a liveness probe restarting, the status and either form shown back; an unsupported field refused.

mod member_support;

use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use member_support::{cli, status, wait_for_nodes, Cleanup, Node};

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/manifests");

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn manifest(name: &str) -> String {
    format!("{MANIFESTS}/{name}")
}

/// `docker exec ID ARGS…`: its stdout when it succeeds.
fn exec(id: &str, args: &[&str]) -> Option<String> {
    let o = Command::new("docker")
        .arg("exec")
        .arg(id)
        .args(args)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// A page as the container's own httpd serves it, fetched from inside the pod's network namespace.
fn page(id: &str, port: u16, path: &str) -> Option<String> {
    exec(
        id,
        &["wget", "-qO-", &format!("http://127.0.0.1:{port}{path}")],
    )
}

/// (created, finished) of a container as the engine recorded them (finished: not while it runs).
fn times(id: &str) -> (SystemTime, Option<SystemTime>) {
    let o = Command::new("docker")
        .args(["inspect", "-f", "{{.Created}} {{.State.FinishedAt}}", id])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // The engine writes the zero time, year 1, for "not yet".
    let mut parts = out.split_whitespace().map(|t| {
        (!t.starts_with("0001-")).then(|| {
            humantime::parse_rfc3339(t).unwrap_or_else(|e| panic!("{t:?} in {out:?}: {e}"))
        })
    });
    (parts.next().flatten().unwrap(), parts.next().flatten())
}

/// The status of one container (`initContainers` or `containers`) of a pod, by name.
fn container(st: &serde_json::Value, list: &str, name: &str) -> Option<serde_json::Value> {
    st[list]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

fn id_of(c: &serde_json::Value) -> Option<String> {
    c["containerId"].as_str().map(str::to_string)
}

#[test]
fn the_documentation_pods_run_as_written() {
    // Declared first so that it drops last: after the agent has stopped, its containers are removed.
    let _cleanup = Cleanup("k8s-docs".to_string());
    let mut node = Node::new("k8s-docs").insecure();
    // Every source takes the v1 form: a manifest file here, the 2014 list key and POST below.
    let files = node.dir.join("manifests");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::copy(
        manifest("k8s-tcp-liveness-readiness.yaml"),
        files.join("goproxy.yaml"),
    )
    .unwrap();
    node.start(&[format!("--manifest-path={}", files.display())]);
    node.wait_ready(Duration::from_secs(60));
    let nodes = [&node];

    // An unsupported field is refused with its path, offline and on apply, and nothing is written.
    let affinity = manifest("k8s-node-affinity.yaml");
    let o = Command::new(member_support::BIN)
        .args(["pod", "validate", "-f", &affinity])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        text(&o).contains("spec.affinity: unknown field"),
        "{}",
        text(&o)
    );
    let o = cli(&node, &["pod", "apply", "-f", &affinity]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("spec.affinity"), "{}", text(&o));
    // Its pod (named nginx, as the simple pod applied next is) was not written.
    let o = cli(&node, &["pod", "get", "nginx", "-o", "json"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));

    for f in [
        "k8s-simple-pod.yaml",
        "k8s-two-containers.yaml",
        "k8s-init-containers.yaml",
        "k8s-liveness-exec.yaml",
    ] {
        let o = cli(&node, &["pod", "apply", "-f", &manifest(f)]);
        assert!(o.status.success(), "{f}: {}", text(&o));
    }
    let o = cli(&node, &["pod", "get", "nginx", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("affinity"), "{}", text(&o));

    let v1 = |id: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{id}"}},"spec":{{"containers":[{{"name":"main","image":"busybox:latest","command":["sleep","3600"]}}]}}}}"#
        )
    };
    let o = node.etcdctl(&[
        "put",
        "/registry/hosts/k8s-docs/kubelet",
        &format!("[{}]", v1("from-list")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["--data-binary", &v1("from-http")])
        .args(["-H", &format!("Authorization: Bearer {}", node.token())])
        .arg(format!("http://127.0.0.1:{}/pods", node.api_port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "200", "{}", text(&o));
    for (id, source) in [
        ("goproxy", "file"),
        ("from-list", "etcd-list"),
        ("from-http", "http"),
    ] {
        wait_for_nodes(
            &format!("{id} running from {source}"),
            Duration::from_secs(90),
            &nodes,
            || {
                let st = status(&node, id)?;
                (st["phase"] == "Running" && st["source"] == source).then_some(())
            },
        );
    }

    // goproxy's TCP probes pass once their initial delay is over.
    wait_for_nodes(
        "goproxy's TCP probes",
        Duration::from_secs(90),
        &nodes,
        || {
            let st = status(&node, "goproxy")?;
            let c = container(&st, "containers", "goproxy")?;
            (c["probes"]["readiness"] == "success"
                && c["probes"]["liveness"] == "success"
                && st["ready"] == true)
                .then_some(())
        },
    );

    // The single container serves its page.
    let nginx = wait_for_nodes(
        "nginx serving its page",
        Duration::from_secs(90),
        &nodes,
        || {
            let st = status(&node, "nginx")?;
            let id = id_of(&container(&st, "containers", "nginx")?)?;
            page(&id, 80, "/index.html")
        },
    );
    assert_eq!(nginx.trim(), "hello from nginx");

    // Two containers share an emptyDir: what the second (command + args) wrote, the first serves; the
    // second completed and, under restartPolicy Never, stays completed.
    let shared = wait_for_nodes(
        "two-containers serving the page the other wrote",
        Duration::from_secs(90),
        &nodes,
        || {
            let st = status(&node, "two-containers")?;
            let writer = container(&st, "containers", "debian-container")?;
            let done = writer["state"]["terminated"]["exitCode"] == 0
                && writer["state"]["terminated"]["reason"] == "Completed";
            let id = id_of(&container(&st, "containers", "nginx-container")?)?;
            done.then(|| page(&id, 80, "/index.html")).flatten()
        },
    );
    assert_eq!(shared.trim(), "Hello from the debian container");
    let st = status(&node, "two-containers").unwrap();
    assert_eq!(st["phase"], "Running", "{st}");
    assert_eq!(
        container(&st, "containers", "debian-container").unwrap()["restartCount"],
        0,
        "{st}"
    );

    // Init containers ran first, in order, each to completion; the app serves what they wrote and its
    // readiness probe (an HTTP GET of that page) passes.
    let st = wait_for_nodes("init-demo ready", Duration::from_secs(90), &nodes, || {
        let st = status(&node, "init-demo")?;
        (st["ready"] == true).then_some(st)
    });
    assert_eq!(st["phase"], "Running", "{st}");
    let inits: Vec<&str> = st["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(inits, ["install", "check"], "{st}");
    for name in ["install", "check"] {
        let c = container(&st, "initContainers", name).unwrap();
        assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{st}");
        assert_eq!(c["state"]["terminated"]["reason"], "Completed", "{st}");
        assert_eq!(c["restartCount"], 0, "{st}");
    }
    let app = id_of(&container(&st, "containers", "nginx").unwrap()).unwrap();
    let install = id_of(&container(&st, "initContainers", "install").unwrap()).unwrap();
    let check = id_of(&container(&st, "initContainers", "check").unwrap()).unwrap();
    assert_eq!(
        page(&app, 80, "/index.html").unwrap().trim(),
        "written by the init container"
    );
    assert_eq!(
        page(&app, 80, "/order.txt").unwrap().trim(),
        "checked by the second"
    );
    // Each container is created only after the one before it has exited. (Not its start time: the
    // engine stamps StartedAt after the process is running, which a short one may already have left.)
    let (install_created, install_end) = times(&install);
    let (check_created, check_end) = times(&check);
    let (app_created, _) = times(&app);
    let (install_end, check_end) = (install_end.unwrap(), check_end.unwrap());
    assert!(
        install_created <= install_end && install_end <= check_created,
        "install, then check: {st}"
    );
    assert!(
        check_end <= app_created,
        "the app after the init containers: {st}"
    );
    // The readiness probe ran against the page.
    let probes = &container(&st, "containers", "nginx").unwrap()["probes"];
    assert_eq!(probes["readiness"], "success", "{st}");

    // Either form shown back: as written (v1), or the 2014 form, each reading back as a valid pod.
    let o = cli(&node, &["pod", "get", "init-demo", "-o", "yaml"]);
    let shown: serde_json::Value = yaml_serde::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["manifest"]["apiVersion"], "v1", "{}", text(&o));
    assert_eq!(shown["manifest"]["metadata"]["labels"]["app"], "init-demo");
    assert_eq!(
        shown["manifest"]["spec"]["initContainers"][0]["name"],
        "install"
    );
    let o = cli(
        &node,
        &[
            "pod",
            "get",
            "init-demo",
            "-o",
            "yaml",
            "--format",
            "legacy",
        ],
    );
    let legacy: serde_json::Value = yaml_serde::from_slice(&o.stdout).unwrap();
    assert_eq!(legacy["manifest"]["version"], "v1beta2", "{}", text(&o));
    assert_eq!(legacy["manifest"]["id"], "init-demo");
    assert_eq!(legacy["manifest"]["initContainers"][1]["name"], "check");
    let back = hostlet_api::parse_manifest(legacy["manifest"].to_string().as_bytes()).unwrap();
    assert!(hostlet_api::validate(&back).is_empty());

    // The exec liveness probe: once /tmp/healthy is gone, the container is restarted.
    wait_for_nodes(
        "liveness-exec restarted by its liveness probe",
        Duration::from_secs(120),
        &nodes,
        || {
            let st = status(&node, "liveness-exec")?;
            let c = container(&st, "containers", "liveness")?;
            (c["restartCount"].as_u64()? >= 1).then_some(())
        },
    );
    let o = cli(&node, &["events", "--pod", "liveness-exec", "-o", "json"]);
    let events: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "Unhealthy"),
        "{events}"
    );
}

/// A local image with both an ENTRYPOINT and a CMD (built from busybox:latest; removed on drop).
struct EntrypointImage(String);

impl EntrypointImage {
    fn build(tag: &str) -> EntrypointImage {
        // The entrypoint records its own name ($0) and the arguments it was given (the image's CMD unless
        // the pod gives args), then stays up.
        EntrypointImage::build_from(
            tag,
            "FROM busybox:latest\n\
             ENTRYPOINT [\"/bin/sh\", \"-c\", \"echo \\\"$0 $*\\\" > /out.txt; exec sleep 3600\", \"image-entrypoint\"]\n\
             CMD [\"image-cmd\"]\n",
        )
    }

    /// An image from `dockerfile` (local images only: no registry is reached).
    fn build_from(tag: &str, dockerfile: &str) -> EntrypointImage {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), dockerfile).unwrap();
        let o = Command::new("docker")
            .args(["build", "-q", "-t", tag])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "docker build: {}", text(&o));
        EntrypointImage(tag.to_string())
    }
}

impl Drop for EntrypointImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

/// Kubernetes' rule: `command` replaces the image's ENTRYPOINT (and drops its CMD), `args` replaces its
/// CMD; neither keeps both.
#[test]
fn command_replaces_the_entrypoint_and_args_the_cmd() {
    let _cleanup = Cleanup("k8s-cmd".to_string());
    let image = EntrypointImage::build("hostlet-test-entrypoint:k8s-cmd");
    let mut node = Node::new("k8s-cmd").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    // The pod's own command records its argument count ($# after $0), so a CMD that leaked in shows.
    let own = r#"["/bin/sh", "-c", "echo \"own $#\" > /out.txt; exec sleep 3600", "own-name"]"#;
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: entrypoints\nspec:\n  containers:\n\
         \x20 - name: neither\n    image: {img}\n\
         \x20 - name: args\n    image: {img}\n    args: [\"pod-args\"]\n\
         \x20 - name: command\n    image: {img}\n    command: {own}\n\
         \x20 - name: both\n    image: {img}\n    command: {own}\n    args: [\"x\", \"y\"]\n",
        img = image.0
    );
    let file = node.dir.join("entrypoints.yaml");
    std::fs::write(&file, pod).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", &file.display().to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    let want = [
        ("neither", "image-entrypoint image-cmd"),
        ("args", "image-entrypoint pod-args"),
        ("command", "own 0"),
        ("both", "own 2"),
    ];
    let got = wait_for_nodes(
        "every container wrote what it was started with",
        Duration::from_secs(90),
        &[&node],
        || {
            let st = status(&node, "entrypoints")?;
            want.iter()
                .map(|(name, _)| {
                    let id = id_of(&container(&st, "containers", name)?)?;
                    let out = exec(&id, &["cat", "/out.txt"])?;
                    Some((*name, out.trim().to_string()))
                })
                .collect::<Option<Vec<_>>>()
        },
    );
    let want: Vec<(&str, String)> = want.iter().map(|(n, w)| (*n, w.to_string())).collect();
    assert_eq!(got, want);
}

#[test]
fn env_references_expand_in_command_args_and_env_as_in_kubernetes() {
    let _cleanup = Cleanup("k8s-expand".to_string());
    let mut node = Node::new("k8s-expand").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    for f in ["k8s-command-env.yaml", "k8s-dependent-envars.yaml"] {
        let o = cli(&node, &["pod", "apply", "-f", &manifest(f)]);
        assert!(o.status.success(), "{f}: {}", text(&o));
    }
    let logs = |pod: &str, want_lines: usize| {
        wait_for_nodes(
            &format!("{pod}'s output"),
            Duration::from_secs(90),
            &[&node],
            || {
                let o = cli(&node, &["pod", "logs", pod]);
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                (o.status.success() && out.lines().filter(|l| !l.is_empty()).count() >= want_lines)
                    .then_some(out)
            },
        )
    };
    assert_eq!(logs("command-env-demo", 1), "hello world\n");
    // What the documentation shows the pod printing.
    let out = logs("dependent-envars-demo", 3);
    let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).take(3).collect();
    assert_eq!(
        lines,
        [
            "UNCHANGED_REFERENCE=$(PROTOCOL)://172.17.0.1:80",
            "SERVICE_ADDRESS=https://172.17.0.1:80",
            "ESCAPED_REFERENCE=$(PROTOCOL)://172.17.0.1:80",
        ]
    );
}

#[test]
fn dns_policy_dns_config_and_host_aliases_as_in_kubernetes() {
    let _cleanup = Cleanup("k8s-dns".to_string());
    let mut node = Node::new("k8s-dns").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    for f in ["k8s-dns-config.yaml", "k8s-hostaliases.yaml"] {
        let o = cli(&node, &["pod", "apply", "-f", &manifest(f)]);
        assert!(o.status.success(), "{f}: {}", text(&o));
    }
    // dnsPolicy None: the resolver configuration is exactly the pod's.
    let resolv = wait_for_nodes(
        "dns-example's /etc/resolv.conf",
        Duration::from_secs(90),
        &[&node],
        || {
            let st = status(&node, "dns-example")?;
            let id = id_of(&container(&st, "containers", "test")?)?;
            exec(&id, &["cat", "/etc/resolv.conf"])
        },
    );
    // In any order (the engine writes search first).
    let mut lines: Vec<&str> = resolv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "nameserver 192.0.2.1",
            "options ndots:2 edns0",
            "search ns1.svc.cluster-domain.example my.dns.search.suffix",
        ],
        "{resolv}"
    );
    // hostAliases: the pod's /etc/hosts has them, as the container printed it.
    let hosts = wait_for_nodes(
        "hostaliases-pod's output",
        Duration::from_secs(90),
        &[&node],
        || {
            let o = cli(&node, &["pod", "logs", "hostaliases-pod"]);
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            out.contains("foo.remote").then_some(out)
        },
    );
    for (ip, name) in [
        ("127.0.0.1", "foo.local"),
        ("127.0.0.1", "bar.local"),
        ("10.1.2.3", "foo.remote"),
        ("10.1.2.3", "bar.remote"),
    ] {
        assert!(
            hosts.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.next() == Some(ip) && w.any(|h| h == name)
            }),
            "{ip} {name} in {hosts}"
        );
    }
}

/// A container's environment variable as the engine holds it (what the container started with).
fn env_of(id: &str, name: &str) -> Option<String> {
    let env = exec(id, &["env"])?;
    env.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_string)
}

/// The output of a pod's first container, once it holds `want`.
fn logs_with(node: &Node, pod: &str, want: &str) -> String {
    wait_for_nodes(
        &format!("{pod}'s output to hold {want:?}"),
        Duration::from_secs(90),
        &[node],
        || {
            let o = cli(node, &["pod", "logs", pod]);
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            out.contains(want).then_some(out)
        },
    )
}

/// The running container of a pod's first app container.
fn running_id(node: &Node, pod: &str) -> String {
    wait_for_nodes(
        &format!("{pod} running"),
        Duration::from_secs(90),
        &[node],
        || {
            let st = status(node, pod)?;
            let c = st["containers"].as_array()?.first()?.clone();
            c["state"]["running"].is_object().then(|| id_of(&c))?
        },
    )
}

#[test]
fn config_maps_and_secrets_from_the_documentation_reach_pods_and_follow_changes() {
    let _cleanup = Cleanup("k8s-config".to_string());
    let mut node = Node::new("k8s-config").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    let ok = |args: &[&str]| {
        let o = cli(&node, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        text(&o)
    };
    // As the documentation creates them (`kubectl create configmap … --from-literal`); one ConfigMap holds
    // the keys of both of its special-config examples.
    ok(&[
        "config",
        "create",
        "special-config",
        "--from-literal",
        "special.how=very",
        "--from-literal",
        "SPECIAL_LEVEL=very",
        "--from-literal",
        "SPECIAL_TYPE=charm",
    ]);
    ok(&[
        "config",
        "create",
        "env-config",
        "--from-literal",
        "log_level=INFO",
    ]);
    ok(&["secret", "apply", "-f", &manifest("k8s-secret.yaml")]);
    ok(&[
        "secret",
        "create",
        "backend-user",
        "--from-literal",
        "backend-username=backend-admin",
    ]);
    assert!(ok(&["secret", "apply", "-f", &manifest("k8s-secret.yaml")]).contains("unchanged"));

    // In etcd and in a snapshot the values are sealed: neither the text nor its base64 appears.
    let stored = node.etcdctl(&["get", "/hostlet/secrets/test-secret", "--print-value-only"]);
    let stored = String::from_utf8_lossy(&stored.stdout).into_owned();
    assert!(stored.contains("\"keyId\":\"k1\""), "{stored}");
    for plain in ["my-app", "bXktYXBw", "39528$vdg7Jb", "backend-admin"] {
        assert!(!stored.contains(plain), "{plain} in {stored}");
    }
    let snap = node.dir.join("at-rest.db");
    let o = node.etcdctl(&["snapshot", "save", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&snap).unwrap();
    for plain in ["my-app", "bXktYXBw", "39528$vdg7Jb", "backend-admin"] {
        assert!(
            !bytes.windows(plain.len()).any(|w| w == plain.as_bytes()),
            "{plain} in the snapshot"
        );
    }
    // A secret's value is shown only when asked for.
    let shown = ok(&["secret", "get", "test-secret"]);
    assert!(
        !shown.contains("bXktYXBw") && shown.contains("<6 bytes>"),
        "{shown}"
    );
    assert!(ok(&["secret", "get", "test-secret", "--show-values"]).contains("bXktYXBw"));
    let listed = ok(&["secret", "ls"]);
    assert!(
        listed.contains("test-secret") && listed.contains("Opaque") && !listed.contains("bXktYXBw"),
        "{listed}"
    );
    assert!(ok(&["config", "ls"]).contains("special-config"));

    for f in [
        "k8s-configmap-env.yaml",
        "k8s-configmap-envfrom.yaml",
        "k8s-configmap-command.yaml",
        "k8s-configmap-volume.yaml",
        "k8s-secret-pod.yaml",
        "k8s-secret-env.yaml",
    ] {
        ok(&["pod", "apply", "-f", &manifest(f)]);
    }
    let env = logs_with(&node, "dapi-test-pod", "LOG_LEVEL=");
    assert!(
        env.contains("SPECIAL_LEVEL_KEY=very\n") && env.contains("LOG_LEVEL=INFO\n"),
        "{env}"
    );
    let env = logs_with(&node, "dapi-test-pod-envfrom", "SPECIAL_TYPE=");
    assert!(
        env.contains("SPECIAL_LEVEL=very\n") && env.contains("SPECIAL_TYPE=charm\n"),
        "{env}"
    );
    assert_eq!(
        logs_with(&node, "dapi-test-pod-command", "\n"),
        "very charm\n"
    );
    let listing = logs_with(&node, "dapi-test-pod-volume", "special.how");
    assert!(
        listing.starts_with("SPECIAL_LEVEL\nSPECIAL_TYPE\nspecial.how\n"),
        "{listing}"
    );

    // The secret: files of mode 0644 on a tmpfs of their own, read-only in the container; env from another.
    let id = running_id(&node, "secret-test-pod");
    assert_eq!(
        exec(&id, &["cat", "/etc/secret-volume/username"]).as_deref(),
        Some("my-app")
    );
    assert_eq!(
        exec(&id, &["cat", "/etc/secret-volume/password"]).as_deref(),
        Some("39528$vdg7Jb")
    );
    let mode = exec(
        &id,
        &["stat", "-L", "-c", "%a", "/etc/secret-volume/password"],
    );
    assert_eq!(mode.as_deref().map(str::trim), Some("644"));
    assert!(
        exec(&id, &["touch", "/etc/secret-volume/x"]).is_none(),
        "the volume is read-only"
    );
    let dir = node
        .data_dir
        .join("pods/secret-test-pod/volumes/secret-volume");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.starts_with("tmpfs ") && l.split(' ').nth(1) == Some(dir.to_str().unwrap())),
        "{} is not a tmpfs mount",
        dir.display()
    );
    let id = running_id(&node, "env-single-secret");
    assert_eq!(
        env_of(&id, "SECRET_USERNAME").as_deref(),
        Some("backend-admin")
    );

    // A change reaches the mounted file; the environment stays as it was when the container started.
    let reader = running_id(&node, "dapi-test-pod-volume");
    ok(&[
        "config",
        "create",
        "special-config",
        "--from-literal",
        "special.how=very",
        "--from-literal",
        "SPECIAL_LEVEL=extremely",
        "--from-literal",
        "SPECIAL_TYPE=charm",
    ]);
    wait_for_nodes(
        "the mounted file to change",
        Duration::from_secs(10),
        &[&node],
        || {
            (exec(&reader, &["cat", "/etc/config/SPECIAL_LEVEL"]).as_deref() == Some("extremely"))
                .then_some(())
        },
    );
    let restarted = cli(&node, &["pod", "get", "dapi-test-pod-volume", "-o", "json"]);
    let st: serde_json::Value = serde_json::from_slice(&restarted.stdout).unwrap();
    assert_eq!(st["status"]["containers"][0]["restartCount"], 0, "{st}");
    assert_eq!(
        running_id(&node, "dapi-test-pod-volume"),
        reader,
        "the container is the same"
    );
    let out = String::from_utf8_lossy(&cli(&node, &["pod", "logs", "dapi-test-pod-volume"]).stdout)
        .into_owned();
    assert!(
        !out.contains("PARTIAL"),
        "a reader saw a partial file: {out}"
    );
    // The secret's env stays too after the secret changes.
    ok(&[
        "secret",
        "create",
        "backend-user",
        "--from-literal",
        "backend-username=someone-else",
    ]);
    assert_eq!(
        env_of(&id, "SECRET_USERNAME").as_deref(),
        Some("backend-admin")
    );

    // Rotation reseals every secret under the next key; the pods that use them go on, and a new one
    // reads them.
    assert!(ok(&["secret", "rotate-key"]).contains("key k2 in force (was k1); 2 secrets resealed"));
    let stored = node.etcdctl(&["get", "/hostlet/secrets/test-secret", "--print-value-only"]);
    assert!(String::from_utf8_lossy(&stored.stdout).contains("\"keyId\":\"k2\""));
    assert!(ok(&["secret", "get", "test-secret", "--show-values"]).contains("bXktYXBw"));
    let o = cli(&node, &["pod", "delete", "env-single-secret"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_for_nodes(
        "env-single-secret to go",
        Duration::from_secs(60),
        &[&node],
        || status(&node, "env-single-secret").is_none().then_some(()),
    );
    ok(&["pod", "apply", "-f", &manifest("k8s-secret-env.yaml")]);
    let id = running_id(&node, "env-single-secret");
    assert_eq!(
        env_of(&id, "SECRET_USERNAME").as_deref(),
        Some("someone-else")
    );

    // A pod whose ConfigMap does not exist yet waits, saying which, and starts when it appears.
    let late = node.dir.join("late.yaml");
    std::fs::write(
        &late,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: late}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox:latest\n    command: [/bin/sh, -c, 'echo got $V']\n    env: [{name: V, valueFrom: {configMapKeyRef: {name: late-config, key: v}}}]\n",
    )
    .unwrap();
    ok(&["pod", "apply", "-f", late.to_str().unwrap()]);
    let waiting = wait_for_nodes(
        "late to wait for its ConfigMap",
        Duration::from_secs(60),
        &[&node],
        || {
            let st = status(&node, "late")?;
            let w = st["containers"][0]["state"]["waiting"].clone();
            (w["reason"] == "CreateContainerConfigError").then_some(w)
        },
    );
    assert_eq!(
        waiting["message"], "configmap \"late-config\" not found",
        "{waiting}"
    );
    ok(&[
        "config",
        "create",
        "late-config",
        "--from-literal",
        "v=at-last",
    ]);
    assert_eq!(logs_with(&node, "late", "got"), "got at-last\n");

    // A deleted pod's secret tmpfs is unmounted and its files go with the pod's directory.
    ok(&["pod", "delete", "secret-test-pod"]);
    wait_for_nodes(
        "the secret volume to go",
        Duration::from_secs(60),
        &[&node],
        || {
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
            (!dir.exists() && !mounts.contains(dir.to_str().unwrap())).then_some(())
        },
    );
}

#[test]
fn a_non_root_container_reads_its_secret_and_an_upgraded_pod_keeps_its_modes() {
    let _cleanup = Cleanup("k8s-secret-mode".to_string());
    let mut node = Node::new("k8s-secret-mode").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    let ok = |node: &Node, args: &[&str]| {
        let o = cli(node, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        text(&o)
    };
    ok(
        &node,
        &["secret", "apply", "-f", &manifest("k8s-secret.yaml")],
    );
    let pod = node.dir.join("non-root.yaml");
    std::fs::write(
        &pod,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: non-root}\nspec:\n  containers:\n  - name: c\n    image: busybox:latest\n    command: [sleep, '3600']\n    securityContext: {runAsUser: 1000}\n    volumeMounts: [{name: s, mountPath: /etc/secret-volume, readOnly: true}]\n  volumes: [{name: s, secret: {secretName: test-secret}}]\n",
    )
    .unwrap();
    ok(&node, &["pod", "apply", "-f", pod.to_str().unwrap()]);

    // No defaultMode: 0644 as in Kubernetes, so the container's own user reads its secret.
    let id = running_id(&node, "non-root");
    assert_eq!(
        exec(&id, &["id", "-u"]).as_deref().map(str::trim),
        Some("1000")
    );
    assert_eq!(
        exec(&id, &["cat", "/etc/secret-volume/username"]).as_deref(),
        Some("my-app"),
        "uid 1000 reads the secret"
    );
    let mode = |id: &str| {
        exec(
            id,
            &["stat", "-L", "-c", "%a", "/etc/secret-volume/username"],
        )
        .map(|m| m.trim().to_string())
    };
    assert_eq!(mode(&id).as_deref(), Some("644"));
    // On the host only root goes through the pod's directory to those files.
    let pod_dir = node.data_dir.join("pods/non-root");
    let dir_mode = |d: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d).unwrap().permissions())
            & 0o777
    };
    assert_eq!(dir_mode(&pod_dir), 0o700);

    // A pod made by an earlier version (0400 files, no record of its default) keeps 0400 when the
    // upgraded agent refreshes its files.
    node.stop(Duration::from_secs(30));
    std::fs::remove_file(pod_dir.join("secret-default-mode")).unwrap();
    for f in ["username", "password"] {
        let p = pod_dir.join("volumes/s").join(f);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o400)).unwrap();
    }
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    ok(
        &node,
        &[
            "secret",
            "create",
            "test-secret",
            "--from-literal",
            "username=changed",
            "--from-literal",
            "password=changed",
        ],
    );
    let file = pod_dir.join("volumes/s/username");
    wait_for_nodes(
        "the old pod's file to change",
        Duration::from_secs(30),
        &[&node],
        || (std::fs::read_to_string(&file).ok()? == "changed").then_some(()),
    );
    assert_eq!(
        running_id(&node, "non-root"),
        id,
        "the container is the same"
    );
    assert_eq!(
        mode(&id).as_deref(),
        Some("400"),
        "the old pod keeps its modes"
    );

    // Recreated, the pod takes the new default.
    ok(&node, &["pod", "delete", "non-root"]);
    wait_for_nodes("non-root to go", Duration::from_secs(60), &[&node], || {
        (status(&node, "non-root").is_none() && !pod_dir.exists()).then_some(())
    });
    ok(&node, &["pod", "apply", "-f", pod.to_str().unwrap()]);
    let id = running_id(&node, "non-root");
    assert_eq!(
        exec(&id, &["cat", "/etc/secret-volume/username"]).as_deref(),
        Some("changed")
    );
    assert_eq!(mode(&id).as_deref(), Some("644"));
    assert_eq!(dir_mode(&pod_dir), 0o700);
}

/// `lifecycle.stopSignal` stops a container with that signal, an image's `STOPSIGNAL` is used when the pod
/// gives none, and SIGTERM otherwise; a name that is no signal is refused with its path.
#[test]
fn containers_stop_with_their_stop_signal_or_their_images() {
    let _cleanup = Cleanup("k8s-stopsig".to_string());
    let image = EntrypointImage::build_from(
        "hostlet-test-stopsig:latest",
        "FROM busybox:latest\nSTOPSIGNAL SIGUSR2\n",
    );
    let mut node = Node::new("k8s-stopsig");
    let out = node.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    node.start(&[format!("--allowed-host-paths={}", out.display())]);
    node.wait_ready(Duration::from_secs(60));
    // Each container writes which signal reached it, then exits.
    let body = |name: &str| {
        format!(
            "for s in TERM USR1 USR2; do trap \"echo $s > /out/{name}; exit 0\" $s; done; while :; do sleep 0.1; done"
        )
    };
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sig"},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string()}}],
            "containers": [
                {"name": "own", "image": "busybox:latest", "command": ["sh", "-c", body("own")],
                 "lifecycle": {"stopSignal": "SIGUSR1"},
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]},
                {"name": "img", "image": image.0, "command": ["sh", "-c", body("img")],
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]},
                {"name": "plain", "image": "busybox:latest", "command": ["sh", "-c", body("plain")],
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]}
            ]
        }
    });
    let file = node.dir.join("sig.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let validate = || {
        Command::new(member_support::BIN)
            .args(["pod", "validate", "-f"])
            .arg(&file)
            .output()
            .unwrap()
    };
    let o = validate();
    assert!(o.status.success(), "{}", text(&o));
    let o = cli(&node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    eventually_running(&node, "sig");
    let st = status(&node, "sig").unwrap();
    let own = id_of(&container(&st, "containers", "own").unwrap()).unwrap();
    let o = Command::new("docker")
        .args(["inspect", "-f", "{{.Config.StopSignal}}", &own])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "SIGUSR1");

    let o = cli(&node, &["pod", "delete", "sig"]);
    assert!(o.status.success(), "{}", text(&o));
    let got = |name: &str| std::fs::read_to_string(out.join(name)).ok();
    member_support::eventually("each container's signal", Duration::from_secs(60), || {
        Some((got("own")?, got("img")?, got("plain")?))
    });
    assert_eq!(got("own").as_deref(), Some("USR1\n"));
    assert_eq!(got("img").as_deref(), Some("USR2\n"));
    assert_eq!(got("plain").as_deref(), Some("TERM\n"));

    // Not a signal: refused offline with its path.
    let bad = pod.to_string().replace("SIGUSR1", "SIGFOO");
    std::fs::write(&file, bad).unwrap();
    let o = validate();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o)
            .contains("spec.containers[0].lifecycle.stopSignal: \"SIGFOO\" is not a signal name"),
        "{}",
        text(&o)
    );
}

fn eventually_running(node: &Node, id: &str) {
    member_support::wait_running(node, id, Duration::from_secs(60));
}

/// Lifecycle hooks as in the Kubernetes documentation: postStart runs right after the start (and the
/// container is not Running before it returns), preStop before the stop signal, the sleep action delays
/// the signal; a failing postStart kills the container, a failing preStop is an event and the stop goes on.
#[test]
fn lifecycle_hooks_run_as_the_kubelet_runs_them() {
    let _cleanup = Cleanup("k8s-hooks".to_string());
    let mut node = Node::new("k8s-hooks");
    let out = node.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    node.start(&[format!("--allowed-host-paths={}", out.display())]);
    node.wait_ready(Duration::from_secs(60));
    let order = || std::fs::read_to_string(out.join("order")).unwrap_or_default();

    // The documentation's example, the handlers' path made the test's own.
    let text_of = std::fs::read_to_string(manifest("k8s-lifecycle.yaml"))
        .unwrap()
        .replace("/tmp/hostlet-lifecycle-out", &out.display().to_string());
    let file = node.dir.join("lifecycle.yaml");
    std::fs::write(&file, text_of).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    eventually_running(&node, "lifecycle-demo");
    assert_eq!(
        order(),
        "postStart\n",
        "postStart ran before the pod was Running"
    );
    let st = status(&node, "lifecycle-demo").unwrap();
    let id = id_of(&container(&st, "containers", "lifecycle-demo-container").unwrap()).unwrap();
    assert_eq!(
        exec(&id, &["cat", "/usr/share/message"]).as_deref(),
        Some("Hello from the postStart handler\n")
    );
    let o = cli(&node, &["pod", "delete", "lifecycle-demo"]);
    assert!(o.status.success(), "{}", text(&o));
    member_support::eventually(
        "the stop signal after preStop",
        Duration::from_secs(60),
        || order().contains("TERM").then_some(()),
    );
    assert_eq!(order(), "postStart\npreStop\nTERM\n");

    // The sleep action holds the signal back; failing hooks.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hooks"},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string()}}],
            "containers": [
                {"name": "sleepy", "image": "busybox:latest",
                 "command": ["sh", "-c", "trap 'echo TERM > /out/sleepy; exit 0' TERM; while :; do sleep 0.1; done"],
                 "lifecycle": {"preStop": {"sleep": {"seconds": 3}}},
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]},
                {"name": "badstop", "image": "busybox:latest",
                 "command": ["sh", "-c", "trap 'echo TERM > /out/badstop; exit 0' TERM; while :; do sleep 0.1; done"],
                 "lifecycle": {"preStop": {"exec": {"command": ["false"]}}},
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]},
                {"name": "badstart", "image": "busybox:latest", "command": ["sleep", "3600"],
                 "lifecycle": {"postStart": {"httpGet": {"port": 9, "path": "/nothing"}}}}
            ]
        }
    });
    let file = node.dir.join("hooks.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let failed_start = member_support::eventually(
        "a FailedPostStartHook and a restart",
        Duration::from_secs(60),
        || {
            let st = status(&node, "hooks")?;
            let c = container(&st, "containers", "badstart")?;
            let events = member_support::events(&node, &node.name, "FailedPostStartHook");
            (c["restartCount"].as_u64()? >= 1 && !events.is_empty()).then_some(events)
        },
    );
    assert!(failed_start[0].contains("GET http://"), "{failed_start:?}");
    member_support::eventually(
        "sleepy and badstop running",
        Duration::from_secs(60),
        || {
            let st = status(&node, "hooks")?;
            ["sleepy", "badstop"]
                .iter()
                .all(|n| {
                    container(&st, "containers", n)
                        .is_some_and(|c| c["state"]["running"].is_object())
                })
                .then_some(())
        },
    );
    let asked = std::time::Instant::now();
    let o = cli(&node, &["pod", "delete", "hooks"]);
    assert!(o.status.success(), "{}", text(&o));
    let got = |name: &str| std::fs::read_to_string(out.join(name)).ok();
    member_support::eventually("both stop signals", Duration::from_secs(60), || {
        Some((got("sleepy")?, got("badstop")?))
    });
    let sleepy_at = std::fs::metadata(out.join("sleepy"))
        .unwrap()
        .modified()
        .unwrap();
    let badstop_at = std::fs::metadata(out.join("badstop"))
        .unwrap()
        .modified()
        .unwrap();
    // The delete was asked no later than `asked`: a signal 3 s after it came after the sleep.
    let since_asked = SystemTime::now() - asked.elapsed();
    assert!(
        sleepy_at.duration_since(since_asked).unwrap_or_default() >= Duration::from_secs(3),
        "the sleep action did not hold the signal back"
    );
    // Each container's signal waits for its own hook only: badstop's failed at once.
    assert!(badstop_at < sleepy_at, "{badstop_at:?} {sleepy_at:?}");
    let failed_stop = member_support::events(&node, &node.name, "FailedPreStopHook");
    assert!(
        failed_stop.iter().any(|m| m.contains("exited with 1")),
        "{failed_stop:?}"
    );
}

/// `hostlet.io/on-config-change`: `restart` makes a container that uses a changed ConfigMap again (its
/// environment read afresh), `signal:SIGHUP` signals it once its files are updated, and without the
/// annotation nothing restarts.
#[test]
fn a_config_change_restarts_or_signals_only_the_annotated_pods() {
    let _cleanup = Cleanup("k8s-onchange".to_string());
    let mut node = Node::new("k8s-onchange").insecure();
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    let ok = |args: &[&str]| {
        let o = cli(&node, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        text(&o)
    };
    let level = |v: &str| {
        ok(&[
            "config",
            "create",
            "app-config",
            "--from-literal",
            &format!("LEVEL={v}"),
        ]);
    };
    level("1");
    let pod = |name: &str, annotation: Option<&str>, script: &str| {
        let mut metadata = serde_json::json!({"name": name});
        if let Some(a) = annotation {
            metadata["annotations"] = serde_json::json!({"hostlet.io/on-config-change": a});
        }
        let p = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {
                "volumes": [{"name": "cfg", "configMap": {"name": "app-config"}}],
                "containers": [{
                    "name": "app", "image": "busybox:latest",
                    "command": ["sh", "-c", format!("trap 'exit 0' TERM; {script} while :; do sleep 0.1; done")],
                    "env": [{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "LEVEL"}}}],
                    "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}]
                }]
            }
        });
        let file = node.dir.join(format!("{name}.json"));
        std::fs::write(&file, p.to_string()).unwrap();
        ok(&["pod", "apply", "-f", file.to_str().unwrap()]);
    };
    pod("restart-me", Some("restart"), "");
    pod(
        "signal-me",
        Some("signal:SIGHUP"),
        "trap 'echo hup $(cat /etc/cfg/LEVEL)' HUP;",
    );
    pod("plain", None, "");
    for p in ["restart-me", "signal-me", "plain"] {
        eventually_running(&node, p);
    }
    let (restart_id, signal_id, plain_id) = (
        running_id(&node, "restart-me"),
        running_id(&node, "signal-me"),
        running_id(&node, "plain"),
    );
    assert_eq!(env_of(&restart_id, "LEVEL").as_deref(), Some("1"));

    let changed = std::time::Instant::now();
    level("2");
    let new_id =
        member_support::eventually("restart-me made again", Duration::from_secs(60), || {
            let id = running_id(&node, "restart-me");
            (id != restart_id).then_some(id)
        });
    eprintln!(
        "restart-me running again {:?} after the change",
        changed.elapsed()
    );
    assert_eq!(env_of(&new_id, "LEVEL").as_deref(), Some("2"));
    logs_with(&node, "signal-me", "hup 2");
    assert_eq!(
        running_id(&node, "signal-me"),
        signal_id,
        "signalled, not made again"
    );
    let events = member_support::events(&node, &node.name, "ConfigChanged");
    assert!(
        events
            .iter()
            .any(|m| m.contains("configmap app-config changed: container app is restarted")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|m| m.contains("sent SIGHUP")),
        "{events:?}"
    );
    // Without the annotation: the same container, its environment as it was.
    assert_eq!(running_id(&node, "plain"), plain_id);
    assert_eq!(env_of(&plain_id, "LEVEL").as_deref(), Some("1"));
    // Nothing changed, nothing more happens: restart-me stays as it is, across the agent's restart too.
    level("2");
    let stops = |node: &Node| {
        let o = cli(node, &["events", "--pod", "restart-me", "-o", "json"]);
        let events: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        events
            .as_array()
            .map_or(0, |a| a.iter().filter(|e| e["reason"] == "Killing").count())
    };
    let before = stops(&node);
    assert_eq!(before, 1, "stopped once for the change to 2");
    let mut node = node;
    node.stop(Duration::from_secs(20));
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    // A change after the start is the barrier: restart-me is stopped for it, and for nothing else.
    let o = cli(
        &node,
        &[
            "config",
            "create",
            "app-config",
            "--from-literal",
            "LEVEL=3",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let third =
        member_support::eventually("restart-me made again", Duration::from_secs(60), || {
            let id = running_id(&node, "restart-me");
            (id != new_id && env_of(&id, "LEVEL").as_deref() == Some("3")).then_some(id)
        });
    assert_eq!(
        stops(&node),
        before + 1,
        "stopped once, for the change, not for the agent's restart"
    );
    assert_eq!(running_id(&node, "restart-me"), third);
}

/// Sidecars (init containers with `restartPolicy: Always`) as in the Kubernetes documentation: the log
/// shipper reads what the app writes and comes back alone when it dies; in a job it does not hold up the
/// pod's completion. Sidecars start in order with the other init containers (ready first, when probed),
/// and stop after the app containers, the last first.
#[test]
fn sidecars_start_in_order_run_beside_the_apps_and_stop_after_them() {
    let _cleanup = Cleanup("k8s-sidecar".to_string());
    let mut node = Node::new("k8s-sidecar");
    let out = node.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    node.start(&[format!("--allowed-host-paths={}", out.display())]);
    node.wait_ready(Duration::from_secs(60));

    // The documentation's log shipper.
    let o = cli(
        &node,
        &["pod", "apply", "-f", &manifest("k8s-sidecar.yaml")],
    );
    assert!(o.status.success(), "{}", text(&o));
    let long = Duration::from_secs(90);
    wait_for_nodes("the log shipper's output", long, &[&node], || {
        let o = cli(&node, &["pod", "logs", "myapp", "-c", "logshipper"]);
        String::from_utf8_lossy(&o.stdout)
            .contains("logging")
            .then_some(())
    });
    let st = wait_for_nodes("myapp ready", long, &[&node], || {
        let st = status(&node, "myapp")?;
        (st["ready"] == true).then_some(st)
    });
    let shipper = container(&st, "initContainers", "logshipper").unwrap();
    assert!(shipper["state"]["running"].is_object(), "{st}");
    assert_eq!(shipper["ready"], true, "{st}");
    let app = id_of(&container(&st, "containers", "myapp").unwrap()).unwrap();
    let first = id_of(&shipper).unwrap();
    // Without -c, logs reach the app container (which writes to its file only), not the sidecar.
    let o = cli(&node, &["pod", "logs", "myapp"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    // The sidecar dies: it comes back, whatever the pod's policy, and the app is left alone.
    let o = Command::new("docker")
        .args(["kill", &first])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let st = wait_for_nodes("the log shipper back", long, &[&node], || {
        let st = status(&node, "myapp")?;
        let c = container(&st, "initContainers", "logshipper")?;
        (c["restartCount"].as_u64()? >= 1
            && c["state"]["running"].is_object()
            && id_of(&c)? != first)
            .then_some(st)
    });
    assert_eq!(
        id_of(&container(&st, "containers", "myapp").unwrap()).as_deref(),
        Some(app.as_str()),
        "{st}"
    );
    assert_eq!(
        container(&st, "containers", "myapp").unwrap()["restartCount"],
        0
    );

    // The documentation's job: done when its app container is, the sidecar stopped after it.
    let o = cli(
        &node,
        &["pod", "apply", "-f", &manifest("k8s-sidecar-job.yaml")],
    );
    assert!(o.status.success(), "{}", text(&o));
    let st = wait_for_nodes("myjob succeeded", long, &[&node], || {
        let st = status(&node, "myjob")?;
        let c = container(&st, "initContainers", "logshipper")?;
        (st["phase"] == "Succeeded" && c["state"]["terminated"].is_object()).then_some(st)
    });
    // Nothing of it runs any more, its infra container included.
    wait_for_nodes(
        &format!("myjob's containers stopped: {st}"),
        long,
        &[&node],
        || {
            let o = Command::new("docker")
                .args(["ps", "-q", "--filter"])
                .arg(format!("label=io.hostlet.node={}", node.name))
                .args(["--filter", "label=io.hostlet.pod=myjob"])
                .output()
                .ok()?;
            (o.status.success() && o.stdout.is_empty()).then_some(())
        },
    );

    // Order: s1 (a sidecar), i2 (runs to completion), s3 (a sidecar, ready 2 s after its start), a.
    let mount = serde_json::json!([{"name": "out", "mountPath": "/out"}]);
    let looping = |name: &str, before: &str| {
        format!(
            "echo {name} >> /out/order; {before}trap 'echo {name} TERM >> /out/order; exit 0' TERM; while :; do sleep 0.1; done"
        )
    };
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ordered"},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string()}}],
            "initContainers": [
                {"name": "s1", "image": "busybox:latest", "restartPolicy": "Always",
                 "command": ["sh", "-c", looping("s1", "")], "volumeMounts": mount},
                {"name": "i2", "image": "busybox:latest",
                 "command": ["sh", "-c", "echo i2 >> /out/order"], "volumeMounts": mount},
                {"name": "s3", "image": "busybox:latest", "restartPolicy": "Always",
                 "command": ["sh", "-c", looping("s3", "sleep 2; echo s3 ready >> /out/order; touch /tmp/ready; ")],
                 "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
                 "volumeMounts": mount}
            ],
            "containers": [
                {"name": "a", "image": "busybox:latest",
                 "command": ["sh", "-c", looping("a", "")], "volumeMounts": mount}
            ]
        }
    });
    let file = node.dir.join("ordered.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let o = cli(&node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let st = wait_for_nodes("ordered ready", long, &[&node], || {
        let st = status(&node, "ordered")?;
        (st["ready"] == true).then_some(st)
    });
    let order = || std::fs::read_to_string(out.join("order")).unwrap_or_default();
    assert_eq!(order(), "s1\ni2\ns3\ns3 ready\na\n", "{st}");
    let s3 = container(&st, "initContainers", "s3").unwrap();
    assert_eq!(s3["probes"]["readiness"], "success", "{st}");
    // Docker's records agree: each made after the one before.
    let made: Vec<SystemTime> = [
        ("initContainers", "s1"),
        ("initContainers", "i2"),
        ("initContainers", "s3"),
        ("containers", "a"),
    ]
    .iter()
    .map(|(list, name)| times(&id_of(&container(&st, list, name).unwrap()).unwrap()).0)
    .collect();
    assert!(made.windows(2).all(|w| w[0] <= w[1]), "{made:?}");

    let o = cli(&node, &["pod", "delete", "ordered"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_for_nodes("every stop signal", long, &[&node], || {
        order().contains("s1 TERM").then_some(())
    });
    assert_eq!(
        order(),
        "s1\ni2\ns3\ns3 ready\na\na TERM\ns3 TERM\ns1 TERM\n"
    );
}
