//! Broken and hostile input against a running agent: each input, while good pods run, leaves their
//! containers untouched and the agent alive, writes at most one new event key, and is answered with a
//! message that names it.

mod member_support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use member_support::{cli, docker_ids, eventually, free_port, status, Cleanup, Node, BIN};

const UP: Duration = Duration::from_secs(60);

fn pod(id: &str) -> String {
    format!("version: v1beta1\nid: {id}\ncontainers:\n- name: main\n  image: busybox:latest\n  command: [sleep, '3600']\n")
}

fn port_pod(id: &str, port: u16) -> String {
    format!("version: v1beta1\nid: {id}\nterminationGracePeriodSeconds: 2\ncontainers:\n- name: main\n  image: busybox:latest\n  command: [sleep, '3600']\n  ports: [{{containerPort: 80, hostPort: {port}, hostIP: 127.0.0.1}}]\n")
}

fn host_dir_pod(id: &str, path: &Path) -> String {
    format!(
        "version: v1beta1\nid: {id}\nvolumes: [{{name: h, source: {{hostDir: {{path: {}}}}}}}]\ncontainers:\n- name: main\n  image: busybox:latest\n  command: [sh, -c, 'echo hi > /h/written && exec sleep 3600']\n  volumeMounts: [{{name: h, mountPath: /h}}]\n",
        path.display()
    )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn running(node: &Node, id: &str) -> bool {
    status(node, id).is_some_and(|s| s["phase"] == "Running")
}

fn rejected_message(node: &Node, id: &str) -> Option<String> {
    let s = status(node, id)?;
    (s["phase"] == "Rejected").then(|| s["message"].as_str().unwrap_or("").to_string())
}

fn events(node: &Node) -> Vec<serde_json::Value> {
    let o = cli(node, &["events", "-o", "json"]);
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

fn event_with(node: &Node, reason: &str, needle: &str) -> Option<serde_json::Value> {
    events(node).into_iter().find(|e| {
        e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(needle))
    })
}

/// etcdctl put with the value on stdin (values of any size and any bytes).
fn put(node: &Node, key: &str, value: &[u8]) {
    let mut c = Command::new(hostlet_runtime::testkit::etcd_program("etcdctl"));
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", node.client_url()))
        .args(["put", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(value).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "put {key}: {}", text(&o));
}

/// A started agent with a good pod from an etcd key and one from the 2014 list key, both running.
struct Agent {
    node: Node,
    good: Vec<String>,
    listed: Vec<String>,
}

impl Agent {
    fn start(name: &str, extra: &[String]) -> Agent {
        let mut node = Node::new(name).insecure();
        node.start(extra);
        node.wait_ready(UP);
        put(
            &node,
            &format!("/hostlet/hosts/{name}/pods/good"),
            pod("good").as_bytes(),
        );
        let list = format!(
            "[{}]",
            serde_json::to_string(&yaml_value(&pod("listed"))).unwrap()
        );
        put(
            &node,
            &format!("/registry/hosts/{name}/kubelet"),
            list.as_bytes(),
        );
        eventually("good and listed running", UP, || {
            (running(&node, "good") && running(&node, "listed")).then_some(())
        });
        let good = docker_ids(name, Some("good"));
        let listed = docker_ids(name, Some("listed"));
        assert_eq!(good.len(), 2, "infra and app");
        Agent { node, good, listed }
    }

    /// The good pods' containers are the same ones and the agent is alive.
    fn unharmed(&mut self, after: &str) {
        let name = self.node.name.clone();
        assert!(self.node.exited().is_none(), "agent died after {after}");
        assert_eq!(
            docker_ids(&name, Some("good")),
            self.good,
            "good pod touched by {after}"
        );
        assert_eq!(
            docker_ids(&name, Some("listed")),
            self.listed,
            "the list's pod touched by {after}"
        );
    }
}

fn yaml_value(yaml: &str) -> serde_json::Value {
    yaml_serde::from_str(yaml).unwrap()
}

#[test]
fn hostile_values_cost_no_running_pod_and_write_at_most_one_event_key_each() {
    let _cleanup = Cleanup("hostile-kv".to_string());
    let closed = format!("http://127.0.0.1:{}/pods", free_port());
    let mut a = Agent::start("hostile-kv", &[format!("--manifest-url={closed}")]);
    let n = a.node.name.clone();
    // A URL nobody serves: the cause is named, not "error sending request".
    let url_event = eventually("the URL source's error", UP, || {
        event_with(&a.node, "ManifestUrlError", &closed)
    });
    let msg = url_event["message"].as_str().unwrap().to_lowercase();
    assert!(msg.contains("refused"), "{msg}");
    assert!(!msg.contains("error sending request"), "{msg}");

    let mut inputs = 0usize;
    let base = events(&a.node).len();
    let mut check = |a: &mut Agent, what: &str| {
        inputs += 1;
        a.unharmed(what);
        let now = events(&a.node).len();
        assert!(
            now <= base + inputs,
            "{now} event keys after {inputs} inputs (from {base}); the last was {what}"
        );
    };

    // 1. Garbage in the 2014 list key keeps its pods, with one event naming the key and the parser's word.
    let legacy = format!("/registry/hosts/{n}/kubelet");
    for (i, garbage) in [&b"hello"[..], b"garbage: [[[", b"\x01\x02\x03"]
        .into_iter()
        .enumerate()
    {
        put(&a.node, &legacy, garbage);
        let ev = eventually("an event for the broken list", UP, || {
            events(&a.node)
                .into_iter()
                .filter(|e| {
                    e["reason"] == "ManifestKeyError"
                        && e["message"].as_str().is_some_and(|m| {
                            m.contains(&legacy) && m.contains("keeping the 1 pod(s)")
                        })
                })
                .nth(i)
        });
        assert_eq!(ev["count"], 1, "{ev}");
        check(&mut a, &format!("list garbage {garbage:?}"));
    }

    // 2. Pod keys that cannot be read: the pod is rejected with the reason, the key named once.
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("str", b"just a string".to_vec(), "expected one manifest (a mapping), found a string"),
        (
            "wt",
            b"version: v1beta1\nid: wt\ncontainers: [{name: c, image: busybox, ports: [{containerPort: abc}]}]\n".to_vec(),
            "containerPort: invalid type: string \"abc\", expected a whole number",
        ),
        ("mm", pod("other").into_bytes(), "does not match its key's name"),
        (
            "uf",
            b"version: v1beta1\nid: uf\nbogus: 1\ncontainers: [{name: c, image: busybox}]\n".to_vec(),
            "bogus: unknown field",
        ),
        ("huge", vec![b'a'; 1024 * 1024], "found a string"),
        (
            "deep",
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            "recursion limit",
        ),
    ];
    for (id, value, expect) in cases {
        put(&a.node, &format!("/hostlet/hosts/{n}/pods/{id}"), &value);
        let msg = eventually(&format!("{id} rejected"), UP, || {
            rejected_message(&a.node, id)
        });
        assert!(msg.contains(expect), "{id}: {msg}");
        assert_eq!(
            msg.matches(&format!("/pods/{id}")).count(),
            1,
            "{id}: the key is named once: {msg}"
        );
        for rust in ["i64", "u16", "expected struct", "sequence"] {
            assert!(!msg.contains(rust), "{id}: {msg}");
        }
        check(&mut a, id);
    }

    // 3. Snapshot requests with names that are not names: answered in the key, with an event.
    let request = format!("/hostlet/hosts/{n}/requests/snapshot");
    let long = "x".repeat(300);
    for name in ["../../evil", "a/b", long.as_str()] {
        let body = serde_json::json!({ "name": name }).to_string();
        put(&a.node, &request, body.as_bytes());
        let answer = eventually("the request answered", UP, || {
            let o = a.node.etcdctl(&["get", "--print-value-only", &request]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            (v["state"] == "failed").then_some(v)
        });
        assert!(
            answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("snapshot name")),
            "{answer}"
        );
        eventually("an InvalidSnapshotRequest event", UP, || {
            event_with(&a.node, "InvalidSnapshotRequest", &format!("{name:?}"))
        });
        check(&mut a, &body);
    }
    let snapshots = a.node.data_dir.join("db/snapshots");
    let files: Vec<_> = std::fs::read_dir(&snapshots)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "no snapshot taken: {files:?}");

    // 4. Policy values that do not parse: the message names the field in crontab's and YAML's terms.
    let policy = "/hostlet/config/snapshots";
    for (body, expect) in [
        (
            r#"{"schedule":"61 * * * *"}"#,
            "minute 61 is out of range 0-59",
        ),
        (r#"{"retention":"many"}"#, "expected a whole number"),
    ] {
        put(&a.node, policy, body.as_bytes());
        let ev = eventually("an InvalidSnapshotPolicy event", UP, || {
            event_with(&a.node, "InvalidSnapshotPolicy", expect)
        });
        let m = ev["message"].as_str().unwrap_or("");
        assert!(!m.contains("u32") && !m.contains("struct"), "{m}");
        check(&mut a, body);
    }

    // 5. A cluster policy, a node record and a member request that do not parse: one event each, with
    // the key and the parser's position, from the leader (this node's own member leads).
    let bad_values = [
        (
            "/hostlet/config/cluster",
            "voters: [3",
            "InvalidClusterPolicy",
        ),
        ("/hostlet/nodes/ghost", "{\"name\": 7", "InvalidNodeRecord"),
        (
            "/hostlet/etcd/member-request",
            "{\"node\": ",
            "InvalidMemberRequest",
        ),
    ];
    for (key, body, reason) in bad_values {
        put(&a.node, key, body.as_bytes());
        let ev = eventually(&format!("a {reason} event"), UP, || {
            event_with(&a.node, reason, key)
        });
        let m = ev["message"].as_str().unwrap_or("");
        assert!(m.contains("line ") && m.contains("column "), "{m}");
        check(&mut a, key);
    }

    // The list key readable again: applied at once, its pod still the same containers.
    let list = format!(
        "[{}]",
        serde_json::to_string(&yaml_value(&pod("listed"))).unwrap()
    );
    put(&a.node, &legacy, list.as_bytes());
    // A barrier: a pod applied after every input runs, so the agent has seen them all.
    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/marker"),
        pod("marker").as_bytes(),
    );
    eventually("marker running", UP, || {
        running(&a.node, "marker").then_some(())
    });
    a.unharmed("all inputs");
    let not_marker = events(&a.node)
        .into_iter()
        .filter(|e| e["pod"] != "marker")
        .count();
    assert!(
        not_marker <= base + inputs,
        "{not_marker} event keys after {inputs} inputs (from {base})"
    );
    for (_, _, reason) in bad_values {
        let said = events(&a.node)
            .iter()
            .filter(|e| e["reason"] == reason)
            .count();
        assert_eq!(said, 1, "{reason}: one event for one bad value");
    }
}

#[test]
fn a_bad_single_manifest_file_is_reported_once_however_often_it_is_read() {
    let _cleanup = Cleanup("hostile-file".to_string());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, "garbage: [[[").unwrap();
    let mut a = Agent::start(
        "hostile-file",
        &[format!("--manifest-path={}", file.display())],
    );
    eventually("the file's error", UP, || {
        event_with(&a.node, "ManifestFileError", "pod.yaml")
    });
    // Its directory stays busy and the file itself is written again, unchanged: every read finds the
    // same problem, which was reported already.
    for i in 0..30 {
        std::fs::write(dir.path().join(format!("other-{i}")), "x").unwrap();
        // Renamed into place, as editors do: a truncating write could be read half-way, empty.
        let fresh = dir.path().join(format!("fresh-{i}"));
        std::fs::write(&fresh, "garbage: [[[").unwrap();
        std::fs::rename(&fresh, &file).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    // A new problem is reported: proof that the reads above happened and were heard.
    std::fs::write(&file, b"\x01\x02\x03").unwrap();
    eventually("the new problem reported", UP, || {
        let n = events(&a.node)
            .into_iter()
            .filter(|e| e["reason"] == "ManifestFileError")
            .count();
        (n >= 2).then_some(())
    });
    a.unharmed("a busy bad file");
    let file_events: Vec<_> = events(&a.node)
        .into_iter()
        .filter(|e| e["reason"] == "ManifestFileError")
        .collect();
    assert_eq!(file_events.len(), 2, "{file_events:?}");
    assert!(
        file_events.iter().all(|e| e["count"] == 1),
        "{file_events:?}"
    );
}

#[test]
fn a_host_dir_symlink_out_of_the_allowed_paths_or_swapped_in_after_admission_is_refused() {
    let _cleanup = Cleanup("hostile-hostdir".to_string());
    let root = tempfile::tempdir().unwrap();
    let ok = root.path().join("ok");
    let secret = root.path().join("secret");
    std::fs::create_dir_all(ok.join("real")).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::os::unix::fs::symlink(&secret, ok.join("link")).unwrap();
    std::os::unix::fs::symlink(ok.join("real"), ok.join("inner")).unwrap();
    let mut a = Agent::start(
        "hostile-hostdir",
        &[format!("--allowed-host-paths={}", ok.display())],
    );
    let n = a.node.name.clone();

    // Offline, the same rule.
    let esc = root.path().join("esc.yaml");
    std::fs::write(&esc, host_dir_pod("esc", &ok.join("link"))).unwrap();
    let o = Command::new(BIN)
        .args(["pod", "validate", "-f"])
        .arg(&esc)
        .arg("--allowed-host-paths")
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("resolves to"), "{}", text(&o));

    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/esc"),
        host_dir_pod("esc", &ok.join("link")).as_bytes(),
    );
    let msg = eventually("esc rejected", UP, || rejected_message(&a.node, "esc"));
    assert!(
        msg.contains("resolves to") && msg.contains("secret"),
        "{msg}"
    );
    assert!(docker_ids(&n, Some("esc")).is_empty(), "never run");

    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/inside"),
        host_dir_pod("inside", &ok.join("inner")).as_bytes(),
    );
    eventually("inside running", UP, || {
        running(&a.node, "inside").then_some(())
    });
    let real = std::fs::canonicalize(ok.join("real")).unwrap();
    eventually("the pod wrote through its mount", UP, || {
        real.join("written").exists().then_some(())
    });
    let mounted = |id: &str| {
        let o = Command::new("docker")
            .args(["inspect", "-f", "{{range .Mounts}}{{.Source}}{{end}}", id])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let app = |n: &str| -> Option<String> {
        let o = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--no-trunc",
                "--filter",
                &format!("label=io.hostlet.node={n}"),
                "--filter",
                "label=io.hostlet.pod=inside",
                "--filter",
                "label=io.hostlet.role=app",
            ])
            .output()
            .ok()?;
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .map(str::to_string)
    };
    let first = app(&n).expect("app container");
    assert_eq!(mounted(&first), real.display().to_string());

    // The symlink is swapped to point outside after admission; the container dies: its next create is
    // refused (the path no longer resolves to what was admitted) and the pod is Rejected.
    std::fs::remove_file(ok.join("inner")).unwrap();
    std::os::unix::fs::symlink(&secret, ok.join("inner")).unwrap();
    let o = Command::new("docker")
        .args(["kill", &first])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let msg = eventually("inside rejected", UP, || {
        rejected_message(&a.node, "inside")
    });
    assert!(msg.contains("secret"), "{msg}");
    assert!(
        app(&n).is_none_or(|id| id == first),
        "no container made on the swapped path"
    );
    assert!(!secret.join("written").exists(), "nothing written outside");
    a.unharmed("hostDir pods");
}

#[test]
fn a_symlink_planted_by_an_init_container_is_refused_before_the_app_container_mounts_it() {
    let _cleanup = Cleanup("hostile-plant".to_string());
    let root = tempfile::tempdir().unwrap();
    let allowed = root.path().join("allowed");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    let mut a = Agent::start(
        "hostile-plant",
        &[format!("--allowed-host-paths={}", allowed.display())],
    );
    let n = a.node.name.clone();
    // What the app would write at its mount's root: with the link followed, at the host's `/`.
    let marker = format!("hostlet-planted-{:08x}", rand::random::<u32>());
    let landed = Path::new("/").join(&marker);
    let pod = format!(
        "version: v1beta1\nid: plant\nrestartPolicy: Never\nvolumes:\n- {{name: sub, source: {{hostDir: {{path: {sub}}}}}}}\n- {{name: x, source: {{hostDir: {{path: {sub}/x}}}}}}\ninitContainers:\n- name: plant\n  image: busybox:latest\n  command: [sh, -c, 'rmdir /mnt/x 2>/dev/null; ln -s / /mnt/x']\n  volumeMounts: [{{name: sub, mountPath: /mnt}}]\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sh, -c, 'touch /h/{marker}; exec sleep 3600']\n  volumeMounts: [{{name: x, mountPath: /h}}]\n",
        sub = allowed.join("sub").display(),
    );
    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/plant"),
        pod.as_bytes(),
    );
    let verdict = eventually("plant rejected (or the write landed)", UP, || {
        if landed.exists() {
            return Some(None);
        }
        rejected_message(&a.node, "plant").map(Some)
    });
    let wrote = landed.exists();
    let _ = std::fs::remove_file(&landed);
    assert!(!wrote, "the app wrote {} on the host", landed.display());
    let msg = verdict.expect("rejected");
    assert!(msg.contains("resolves to /"), "{msg}");
    assert!(
        !events(&a.node)
            .iter()
            .any(|e| e["pod"] == "plant" && e["container"] == "app" && e["reason"] == "Started"),
        "the app container never started"
    );
    a.unharmed("a planted symlink");
}

#[test]
fn a_newcomer_never_takes_the_host_port_of_a_running_pod_not_even_after_a_restart() {
    let _cleanup = Cleanup("hostile-port".to_string());
    let mut a = Agent::start("hostile-port", &[]);
    let n = a.node.name.clone();
    let port = free_port();
    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/zz-port"),
        port_pod("zz-port", port).as_bytes(),
    );
    eventually("zz-port running", UP, || {
        running(&a.node, "zz-port").then_some(())
    });
    let holder = docker_ids(&n, Some("zz-port"));
    // aa sorts first and comes from the same source: it still waits its turn.
    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/aa-port"),
        port_pod("aa-port", port).as_bytes(),
    );
    let msg = eventually("aa-port rejected", UP, || {
        rejected_message(&a.node, "aa-port")
    });
    assert!(
        msg.contains("zz-port") && msg.contains("admitted first") && msg.contains("rejected"),
        "{msg}"
    );
    eventually("a Rejected event naming the holder", UP, || {
        event_with(&a.node, "Rejected", "zz-port")
    });
    assert_eq!(
        docker_ids(&n, Some("zz-port")),
        holder,
        "the running pod kept"
    );
    assert!(
        docker_ids(&n, Some("aa-port")).is_empty(),
        "the newcomer never ran"
    );
    assert!(
        !events(&a.node)
            .iter()
            .any(|e| e["pod"] == "zz-port" && e["reason"] == "Killing"),
        "zz-port was not stopped"
    );

    // Admission order comes from what runs, not from memory: a restart keeps it.
    a.node.terminate(Duration::from_secs(30));
    a.node.start(&[]);
    a.node.wait_ready(UP);
    put(
        &a.node,
        &format!("/hostlet/hosts/{n}/pods/marker"),
        pod("marker").as_bytes(),
    );
    eventually("marker running", UP, || {
        running(&a.node, "marker").then_some(())
    });
    assert_eq!(
        docker_ids(&n, Some("zz-port")),
        holder,
        "adopted, not replaced"
    );
    assert!(docker_ids(&n, Some("aa-port")).is_empty());
    assert!(rejected_message(&a.node, "aa-port").is_some());
    a.unharmed("the restart");

    // The holder goes: the newcomer gets the port.
    let o = cli(&a.node, &["pod", "delete", "zz-port"]);
    assert!(o.status.success(), "{}", text(&o));
    eventually("aa-port running once the port is free", UP, || {
        running(&a.node, "aa-port").then_some(())
    });
}
