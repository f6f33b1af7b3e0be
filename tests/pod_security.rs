//! A pod cannot hurt its host: containers are created hardened under the default pod security level,
//! what the level refuses is refused by `pod validate` and by the agent with its field path, a fork loop
//! and a memory hog are stopped by their own limits while the etcd member keeps answering.

mod member_support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use member_support::{cli, docker_ids, events, eventually, status, Cleanup, Node, BIN};

const UP: Duration = Duration::from_secs(60);

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn v1_pod(id: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {id}}}\nspec:\n  terminationGracePeriodSeconds: 2\n{spec}")
}

fn apply(node: &Node, dir: &std::path::Path, id: &str, yaml: &str) -> Output {
    let f = dir.join(format!("{id}.yaml"));
    std::fs::write(&f, yaml).unwrap();
    cli(node, &["pod", "apply", "-f", &f.display().to_string()])
}

fn validate(dir: &std::path::Path, id: &str, yaml: &str, extra: &[&str]) -> Output {
    let f = dir.join(format!("{id}.yaml"));
    std::fs::write(&f, yaml).unwrap();
    Command::new(BIN)
        .args(["pod", "validate", "-f"])
        .arg(&f)
        .args(extra)
        .output()
        .unwrap()
}

fn running(node: &Node, id: &str) -> bool {
    status(node, id).is_some_and(|s| s["phase"] == "Running")
}

fn rejected_message(node: &Node, id: &str) -> Option<String> {
    let s = status(node, id)?;
    (s["phase"] == "Rejected").then(|| s["message"].as_str().unwrap_or("").to_string())
}

/// `docker inspect -f FORMAT ID`.
fn inspect(id: &str, format: &str) -> String {
    let o = Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The running container of `name` in `pod` on `node`.
fn container(node: &str, pod: &str, name: &str) -> Option<String> {
    let o = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=io.hostlet.node={node}"),
            "--filter",
            &format!("label=io.hostlet.pod={pod}"),
            "--filter",
            &format!("label=io.hostlet.container={name}"),
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .map(str::to_string)
}

fn docker_exec(id: &str, args: &[&str]) -> Output {
    Command::new("docker")
        .arg("exec")
        .arg(id)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_default_level_hardens_every_container_and_refuses_what_it_must_by_path() {
    let _cleanup = Cleanup("podsec-default".to_string());
    let mut node = Node::new("podsec-default").insecure();
    let dir = node.dir.clone();
    node.start(&[]);
    node.wait_ready(UP);
    let n = node.name.clone();

    let spec = "  containers:\n  - {name: plain, image: busybox:latest, command: [sleep, '3600']}\n  - {name: uid, image: busybox:latest, command: [sleep, '3600'], securityContext: {runAsUser: 1000}}\n  - {name: ro, image: busybox:latest, command: [sleep, '3600'], securityContext: {readOnlyRootFilesystem: true}}\n";
    let o = apply(&node, &dir, "hard", &v1_pod("hard", spec));
    assert!(o.status.success(), "{}", text(&o));
    eventually("hard running", UP, || running(&node, "hard").then_some(()));
    let kept = docker_ids(&n, Some("hard"));

    let plain = container(&n, "hard", "plain").expect("plain runs");
    assert!(
        inspect(&plain, "{{json .HostConfig.SecurityOpt}}").contains("no-new-privileges"),
        "{}",
        inspect(&plain, "{{json .HostConfig}}")
    );
    assert!(inspect(&plain, "{{json .HostConfig.CapDrop}}").contains("NET_RAW"));
    assert_eq!(inspect(&plain, "{{.HostConfig.PidsLimit}}"), "4096");
    assert_eq!(inspect(&plain, "{{.HostConfig.Privileged}}"), "false");
    // The infra container runs with every capability dropped, and still holds the pod's namespace.
    let infra = container(&n, "hard", "net").expect("infra runs");
    assert!(inspect(&infra, "{{json .HostConfig.CapDrop}}").contains("ALL"));
    assert!(inspect(&infra, "{{json .HostConfig.SecurityOpt}}").contains("no-new-privileges"));

    let uid = container(&n, "hard", "uid").expect("uid runs");
    let o = docker_exec(&uid, &["id", "-u"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "1000",
        "{}",
        text(&o)
    );
    let ro = container(&n, "hard", "ro").expect("ro runs");
    let o = docker_exec(&ro, &["touch", "/written"]);
    assert!(!o.status.success(), "a write to / succeeded: {}", text(&o));
    assert!(text(&o).contains("Read-only file system"), "{}", text(&o));

    // Refused offline and by the agent, each with its field path.
    let privileged = v1_pod(
        "priv",
        "  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600'], securityContext: {privileged: true}}\n",
    );
    let sys_admin = v1_pod(
        "caps",
        "  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600'], securityContext: {capabilities: {add: [SYS_ADMIN]}}}\n",
    );
    for (id, yaml, path) in [
        (
            "priv",
            &privileged,
            "spec.containers[0].securityContext.privileged",
        ),
        (
            "caps",
            &sys_admin,
            "spec.containers[0].securityContext.capabilities.add[0]",
        ),
    ] {
        let o = validate(&dir, id, yaml, &[]);
        assert_eq!(o.status.code(), Some(4), "{}", text(&o));
        assert!(text(&o).contains(path), "{}", text(&o));
        let o = validate(&dir, id, yaml, &["--pod-security", "privileged"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        // `pod apply` cannot know the host's level: the agent decides.
        let o = apply(&node, &dir, id, yaml);
        assert!(o.status.success(), "{}", text(&o));
        let msg = eventually(&format!("{id} rejected"), UP, || {
            rejected_message(&node, id)
        });
        assert!(msg.contains(path) && msg.contains("baseline"), "{msg}");
        assert!(docker_ids(&n, Some(id)).is_empty(), "{id} never ran");
    }

    // runAsNonRoot on an image that runs as root: Rejected, with the reason.
    let root_image = v1_pod(
        "nonroot",
        "  securityContext: {runAsNonRoot: true}\n  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600']}\n",
    );
    let o = apply(&node, &dir, "nonroot", &root_image);
    assert!(o.status.success(), "{}", text(&o));
    let msg = eventually("nonroot rejected", UP, || {
        rejected_message(&node, "nonroot")
    });
    assert!(
        msg.contains("spec.containers[0].securityContext.runAsNonRoot") && msg.contains("root"),
        "{msg}"
    );
    assert!(docker_ids(&n, Some("nonroot")).is_empty(), "never ran");

    // The agent's own ports are no pod's.
    let on_etcd = format!(
        "version: v1beta1\nid: onetcd\ncontainers:\n- name: a\n  image: busybox:latest\n  command: [sleep, '3600']\n  ports: [{{containerPort: 80, hostPort: {}}}]\n",
        node.client_port
    );
    let o = apply(&node, &dir, "onetcd", &on_etcd);
    assert!(o.status.success(), "{}", text(&o));
    let msg = eventually("onetcd rejected", UP, || rejected_message(&node, "onetcd"));
    assert!(
        msg.contains("containers[0].ports[0].hostPort") && msg.contains("etcd client port"),
        "{msg}"
    );

    assert_eq!(docker_ids(&n, Some("hard")), kept, "no other pod disturbed");
    assert!(node.exited().is_none(), "agent alive");
}

/// A cgroup parent of the test's own, removed (in every hierarchy) once its containers are gone.
struct CgroupCleanup(String);
impl Drop for CgroupCleanup {
    fn drop(&mut self) {
        for h in [
            "memory", "cpu", "pids", "cpuacct", "cpuset", "blkio", "devices", "freezer", "systemd",
            "unified",
        ] {
            let _ = std::fs::remove_dir(PathBuf::from("/sys/fs/cgroup").join(h).join(&self.0));
        }
    }
}

/// Writes to the node's etcd every 100 ms for 2 s; every write must succeed within its deadline.
fn etcd_keeps_answering(node: &Node, phase: &str) {
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let at = Instant::now();
        let o = node.etcdctl(&["put", &format!("/podsec/{phase}"), &i.to_string()]);
        assert!(
            o.status.success(),
            "{phase}: write {i} failed: {}",
            text(&o)
        );
        i += 1;
        // Paces the writer; not a wait for a condition.
        if let Some(rest) = Duration::from_millis(100).checked_sub(at.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

#[test]
fn a_fork_loop_and_a_memory_hog_are_stopped_by_their_limits_while_etcd_keeps_answering() {
    let parent = format!("hostlet-test-{:08x}", rand::random::<u32>());
    let _cgroup = CgroupCleanup(parent.clone());
    let _cleanup = Cleanup("podsec-limits".to_string());
    let mut node = Node::new("podsec-limits").insecure();
    let dir = node.dir.clone();
    let host_memory: i64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .expect("MemTotal")
        * 1024;
    // The pods get 96 MiB between them: everything else is kept for the member and the agent.
    let pods_share: i64 = 96 << 20;
    node.start(&[
        format!("--pods-cgroup-parent=/{parent}"),
        format!("--pods-reserved-memory={}", host_memory - pods_share),
        "--pod-pids-limit=128".to_string(),
    ]);
    node.wait_ready(UP);
    let n = node.name.clone();

    let o = apply(
        &node,
        &dir,
        "bystander",
        &v1_pod(
            "bystander",
            "  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600']}\n",
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    eventually("bystander running", UP, || {
        running(&node, "bystander").then_some(())
    });
    let bystander = docker_ids(&n, Some("bystander"));
    let limit_file = PathBuf::from("/sys/fs/cgroup/memory")
        .join(&parent)
        .join("memory.limit_in_bytes");
    let limit: i64 = std::fs::read_to_string(&limit_file)
        .unwrap_or_else(|e| panic!("{}: {e}", limit_file.display()))
        .trim()
        .parse()
        .unwrap();
    // The kernel rounds the limit down to whole pages.
    assert!((pods_share - limit).abs() < 1 << 16, "limit {limit}");

    // A fork loop: its processes stop at the pids limit (busybox's shell dies of the failed fork).
    let o = apply(
        &node,
        &dir,
        "forker",
        &v1_pod(
            "forker",
            "  restartPolicy: Never\n  containers:\n  - {name: a, image: busybox:latest, command: [sh, -c, 'while true; do sleep 600 & done']}\n",
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    etcd_keeps_answering(&node, "fork");
    let forker = eventually("the fork loop ended", UP, || {
        let st = status(&node, "forker")?;
        let c = st["containers"].as_array()?.first()?.clone();
        c["state"]["terminated"].as_object()?;
        c["containerId"].as_str().map(str::to_string)
    });
    let o = Command::new("docker")
        .args(["logs", &forker])
        .output()
        .unwrap();
    assert!(text(&o).contains("can't fork"), "{}", text(&o));
    let o = cli(&node, &["pod", "delete", "forker"]);
    assert!(o.status.success(), "{}", text(&o));

    // A memory hog with no limit of its own: the pods' share stops it.
    let o = apply(
        &node,
        &dir,
        "hog",
        &v1_pod(
            "hog",
            "  restartPolicy: Never\n  containers:\n  - {name: a, image: busybox:latest, command: [sh, -c, 'x=0123456789abcdef; while true; do x=$x$x; done']}\n",
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let ended = eventually("the hog was killed", UP, || {
        let st = status(&node, "hog")?;
        let c = st["containers"].as_array()?.first()?.clone();
        c["state"]["terminated"]["exitCode"].as_i64()
    });
    assert_eq!(ended, 137, "killed by the OOM killer");
    etcd_keeps_answering(&node, "hog");

    assert_eq!(
        docker_ids(&n, Some("bystander")),
        bystander,
        "bystander untouched"
    );
    assert!(running(&node, "bystander"));
    assert!(node.exited().is_none(), "agent alive");
    let o = cli(&node, &["pod", "delete", "hog"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `restricted` refuses what Kubernetes' restricted level refuses, each field by its path, written or not
/// (hostlet used to add what was missing); a pod admitted before the host moved to `restricted` keeps
/// running as it was, with a warning, until it is changed.
#[test]
fn restricted_refuses_what_kubernetes_refuses_and_keeps_a_pod_running_from_before() {
    let _cleanup = Cleanup("podsec-restricted".to_string());
    let mut node = Node::new("podsec-restricted").insecure();
    let dir = node.dir.clone();
    let n = node.name.clone();
    // Non-root and no escalation asked, but not written as Kubernetes' restricted level requires.
    let unwritten = |cmd: &str| {
        v1_pod(
            "before",
            &format!("  securityContext: {{runAsNonRoot: true, runAsUser: 1000}}\n  containers:\n  - {{name: a, image: busybox:latest, command: [sleep, '{cmd}']}}\n"),
        )
    };
    node.start(&[]);
    node.wait_ready(UP);
    let o = apply(&node, &dir, "before", &unwritten("3600"));
    assert!(o.status.success(), "{}", text(&o));
    eventually("before running at baseline", UP, || {
        running(&node, "before").then_some(())
    });
    let kept = container(&n, "before", "a").expect("a runs");
    node.stop(UP);

    node.start(&["--pod-security=restricted".to_string()]);
    node.wait_ready(UP);
    let warned = eventually("the warning about the pod from before", UP, || {
        events(&node, &n, "PodSecurityWarning").into_iter().next()
    });
    for field in [
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "spec.containers[0].securityContext.capabilities.drop",
        "spec.containers[0].securityContext.seccompProfile.type",
    ] {
        assert!(warned.contains(field), "{field} in {warned}");
    }
    assert!(running(&node, "before"), "{:?}", status(&node, "before"));
    assert_eq!(
        container(&n, "before", "a").as_deref(),
        Some(kept.as_str()),
        "the container from before is kept"
    );

    // A new pod written the same way is refused, and so is the old one once it changes.
    let o = apply(&node, &dir, "before", &unwritten("3601"));
    assert!(o.status.success(), "{}", text(&o));
    let refused = eventually("the changed pod refused", UP, || {
        rejected_message(&node, "before")
    });
    assert!(
        refused.contains("spec.containers[0].securityContext.capabilities.drop")
            && refused.contains("restricted"),
        "{refused}"
    );
    eventually("its container gone", UP, || {
        container(&n, "before", "a").is_none().then_some(())
    });

    // Written as Kubernetes' restricted level asks: it runs, every capability dropped.
    let ok = v1_pod(
        "ok",
        "  securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600'], securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}\n",
    );
    let o = apply(&node, &dir, "ok", &ok);
    assert!(o.status.success(), "{}", text(&o));
    eventually("ok running", UP, || running(&node, "ok").then_some(()));
    let a = container(&n, "ok", "a").expect("ok runs");
    assert!(inspect(&a, "{{json .HostConfig.CapDrop}}").contains("ALL"));
    let o = validate(&dir, "ok", &ok, &["--pod-security", "restricted"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = validate(
        &dir,
        "before",
        &unwritten("1"),
        &["--pod-security", "restricted"],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("spec.containers[0].securityContext.seccompProfile.type"),
        "{}",
        text(&o)
    );
}

/// Devices without privileged: a hostPath of type CharDevice on a path `--allowed-devices` allows (here
/// a test device made with mknod, reached through a by-id style link) is the container's device and can
/// be opened; a path outside the list, or one that is no character device, is refused with its field
/// path, by `pod validate` and by the agent; a pod that does not ask has no such device.
#[test]
fn an_allowed_device_reaches_the_pod_that_asks_and_nothing_else_does() {
    let _cleanup = Cleanup("podsec-dev".to_string());
    let mut node = Node::new("podsec-dev").insecure();
    let dir = node.dir.clone();
    let devs = dir.join("dev");
    std::fs::create_dir_all(devs.join("by-id")).unwrap();
    std::fs::create_dir_all(dir.join("other")).unwrap();
    let mknod = |path: &std::path::Path| {
        // The null device's numbers: writes are taken, nothing is harmed.
        let o = Command::new("mknod")
            .arg(path)
            .args(["c", "1", "3"])
            .output()
            .unwrap();
        assert!(o.status.success(), "mknod: {}", text(&o));
    };
    mknod(&devs.join("ttyFAKE0"));
    mknod(&dir.join("other/sda"));
    std::os::unix::fs::symlink(devs.join("ttyFAKE0"), devs.join("by-id/usb-stick")).unwrap();
    std::fs::write(devs.join("ttyPLAIN"), "not a device").unwrap();
    let allowed = format!("{0}/tty*,{0}/by-id/*", devs.display());
    node.start(&[format!("--allowed-devices={allowed}")]);
    node.wait_ready(UP);
    let n = node.name.clone();
    let with_device = |id: &str, path: &std::path::Path| {
        v1_pod(
            id,
            &format!(
                "  volumes:\n  - name: stick\n    hostPath: {{path: {}, type: CharDevice}}\n  containers:\n  - name: a\n    image: busybox:latest\n    command: [sleep, '3600']\n    volumeMounts: [{{name: stick, mountPath: /dev/ttyUSB0}}]\n",
                path.display()
            ),
        )
    };

    let yaml = with_device("stick", &devs.join("by-id/usb-stick"));
    let o = validate(&dir, "stick", &yaml, &["--allowed-devices", &allowed]);
    assert!(o.status.success(), "{}", text(&o));
    let o = apply(&node, &dir, "stick", &yaml);
    assert!(o.status.success(), "{}", text(&o));
    let plain = v1_pod(
        "nodev",
        "  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600']}\n",
    );
    let o = apply(&node, &dir, "nodev", &plain);
    assert!(o.status.success(), "{}", text(&o));
    eventually("stick running", UP, || {
        running(&node, "stick").then_some(())
    });
    eventually("nodev running", UP, || {
        running(&node, "nodev").then_some(())
    });
    let a = container(&n, "stick", "a").expect("stick runs");
    let o = docker_exec(
        &a,
        &[
            "sh",
            "-c",
            "test -c /dev/ttyUSB0 && echo hi > /dev/ttyUSB0 && echo written",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "written",
        "{}",
        text(&o)
    );
    assert_eq!(inspect(&a, "{{.HostConfig.Privileged}}"), "false");
    assert!(
        inspect(&a, "{{json .HostConfig.Devices}}").contains("/dev/ttyUSB0"),
        "{}",
        inspect(&a, "{{json .HostConfig.Devices}}")
    );
    let other = container(&n, "nodev", "a").expect("nodev runs");
    let o = docker_exec(&other, &["test", "-e", "/dev/ttyUSB0"]);
    assert!(!o.status.success(), "a pod that did not ask has the device");

    // Outside the list: refused offline and by the agent, with the field path.
    let outside = with_device("outside", &dir.join("other/sda"));
    let o = validate(&dir, "outside", &outside, &["--allowed-devices", &allowed]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("spec.volumes[0].hostPath.path: device"),
        "{}",
        text(&o)
    );
    let o = apply(&node, &dir, "outside", &outside);
    assert!(o.status.success(), "{}", text(&o));
    let why = eventually("outside refused", UP, || rejected_message(&node, "outside"));
    assert!(
        why.contains("spec.volumes[0].hostPath.path")
            && why.contains("is not allowed on this host"),
        "{why}"
    );
    // Allowed by the glob, but no device.
    let o = apply(
        &node,
        &dir,
        "notdev",
        &with_device("notdev", &devs.join("ttyPLAIN")),
    );
    assert!(o.status.success(), "{}", text(&o));
    let why = eventually("notdev refused", UP, || rejected_message(&node, "notdev"));
    assert!(why.contains("is not a character device"), "{why}");

    // GPUs: this engine has no nvidia runtime, so a pod that asks is refused with the field that asks,
    // and nothing of it is made.
    let gpu = v1_pod(
        "gpu",
        "  containers:\n  - {name: a, image: busybox:latest, command: [sleep, '3600']}\n  - {name: cuda, image: busybox:latest, command: [sleep, '3600'], resources: {limits: {nvidia.com/gpu: 1}}}\n",
    );
    let o = validate(&dir, "gpu", &gpu, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = apply(&node, &dir, "gpu", &gpu);
    assert!(o.status.success(), "{}", text(&o));
    let why = eventually("gpu refused", UP, || rejected_message(&node, "gpu"));
    assert!(
        why.contains("spec.containers[1].resources.limits.nvidia.com/gpu")
            && why.contains("has no nvidia runtime"),
        "{why}"
    );
    let made = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=io.hostlet.node={n}"))
        .args(["--filter", "label=io.hostlet.pod=gpu"])
        .output()
        .unwrap();
    assert!(
        made.status.success() && made.stdout.is_empty(),
        "{why}: {}",
        text(&made)
    );
    assert!(running(&node, "stick"), "the others are not disturbed");
}
