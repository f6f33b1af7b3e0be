//! `hostlet pod logs` and `hostlet pod exec` against a real agent (HTTPS with the cluster CA and the node's
//! client certificate from its data dir; a worker's pod from a voter, an admin and the worker itself) on
//! the real Docker engine: log caps on disk, following across rotations without a gap or a repeat,
//! `--tail`, `--since`, `--timestamps`, `--previous` after a liveness restart, exit codes passed through,
//! stdin, an interactive shell under a pseudo-terminal, errors that name what is missing, and the routes
//! refused without a credential.

mod member_support;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use member_support::{docker_ids, eventually, status, Cleanup, Node, BIN};

/// The CLI beside `node`'s agent; `--data-dir` goes before a `--` (after it, the command's own arguments).
fn cli(node: &Node, args: &[&str]) -> Output {
    let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    Command::new(BIN)
        .args(&args[..at])
        .arg("--data-dir")
        .arg(&node.data_dir)
        .args(&args[at..])
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Applies a v1 pod from its JSON.
fn apply(node: &Node, pod: &serde_json::Value) {
    let file = node.dir.join(format!(
        "{}.json",
        pod["metadata"]["name"].as_str().unwrap()
    ));
    std::fs::write(&file, pod.to_string()).unwrap();
    let o = cli(node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
}

/// Waits until every container of the pod runs.
fn wait_running(node: &Node, id: &str) {
    member_support::wait_running(node, id, Duration::from_secs(120));
}

/// The id of a pod's running container by name.
fn container_id(node: &Node, pod: &str, name: &str) -> String {
    let st = status(node, pod).unwrap();
    let c = st["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap();
    c["containerId"].as_str().unwrap().to_string()
}

fn inspect(id: &str, format: &str) -> String {
    let o = Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn logs_are_capped_and_followed_across_rotations() {
    let _cleanup = Cleanup("pa-flood".to_string());
    let mut node = Node::new("pa-flood");
    // The default caps (10Mi × 5), given explicitly so that the test says what it checks.
    node.start(&[
        "--container-log-max-size=10Mi".to_string(),
        "--container-log-max-files=5".to_string(),
    ]);
    node.wait_ready(Duration::from_secs(60));
    // About 1 MiB/s for two minutes once told to go: 120 bursts of 10,000 numbered lines of 100 bytes, one
    // a second (1.4 MiB/s as json-file writes it, some 17 rotations). The caps leave a follower ~35 s of lag.
    let flood = r#"while [ ! -f /tmp/go ]; do sleep 0.1; done
awk 'BEGIN { pad = sprintf("%090d", 0); for (b = 0; b < 120; b++) { for (i = 1; i <= 10000; i++) printf "%08d %s\n", b * 10000 + i, pad; fflush(); system("sleep 1") } print "DONE" }'
sleep 3600"#;
    apply(
        &node,
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "flood"},
            "spec": {"containers": [{"name": "flood", "image": "busybox:latest",
                                     "command": ["sh", "-c", flood]}]}
        }),
    );
    wait_running(&node, "flood");
    let id = container_id(&node, "flood", "flood");
    // The caps are on the container, whatever the daemon's default.
    assert_eq!(inspect(&id, "{{.HostConfig.LogConfig.Type}}"), "json-file");
    let caps = inspect(&id, "{{json .HostConfig.LogConfig.Config}}");
    assert!(caps.contains(r#""max-file":"5""#), "{caps}");
    assert!(caps.contains(r#""max-size":"10485760""#), "{caps}");

    // The follower starts before the flood.
    let out_file = node.dir.join("follow.out");
    let mut follower = Command::new(BIN)
        .args(["pod", "logs", "-f", "flood", "--data-dir"])
        .arg(&node.data_dir)
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = cli(&node, &["pod", "exec", "flood", "--", "touch", "/tmp/go"]);
    assert!(o.status.success(), "{}", text(&o));
    eventually("the follower to see DONE", Duration::from_secs(300), || {
        let out = std::fs::read_to_string(&out_file).ok()?;
        out.contains("DONE\n").then_some(())
    });
    let _ = follower.kill();
    let _ = follower.wait();
    let out = std::fs::read_to_string(&out_file).unwrap();
    let numbers: Vec<u64> = out
        .lines()
        .filter(|l| *l != "DONE")
        .map(|l| l[..8].parse().unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    // Where lines are missing, if any: a follower that fell behind the caps loses whole rotated files.
    let mut gaps = Vec::new();
    let mut expected = 1u64;
    for n in &numbers {
        if *n != expected {
            gaps.push(format!("{expected}..{n}"));
        }
        expected = n + 1;
    }
    assert_eq!(
        numbers.len(),
        1_200_000,
        "lines followed; missing (first 20 ranges): {:?}",
        &gaps[..gaps.len().min(20)]
    );
    for (i, n) in numbers.iter().enumerate() {
        assert_eq!(*n, i as u64 + 1, "line {i} of the followed output");
    }

    // On disk: at most max-size × max-files, plus one file's worth of slack for a rotation under way.
    let log_path = inspect(&id, "{{.LogPath}}");
    let dir = std::path::Path::new(&log_path).parent().unwrap();
    let name = std::path::Path::new(&log_path).file_name().unwrap();
    let on_disk: u64 = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&*name.to_string_lossy())
        })
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        on_disk <= 6 * 10 * 1024 * 1024,
        "{on_disk} bytes of logs on disk"
    );
    // More was written than the caps keep: the log did rotate under the follower.
    assert!(
        out.len() > 100 * 1024 * 1024,
        "{} bytes followed",
        out.len()
    );
    assert!(
        std::path::Path::new(&format!("{log_path}.1")).exists(),
        "no rotated file beside {log_path}"
    );
}

#[test]
fn logs_and_exec_reach_a_pod_through_its_agent() {
    let _cleanup = Cleanup("pa-exec".to_string());
    let mut node = Node::new("pa-exec");
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    apply(
        &node,
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
            "spec": {"containers": [
                {"name": "web", "image": "busybox:latest",
                 "command": ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo n$i; done; echo early; sleep 15; echo late; sleep 3600"]},
                {"name": "sidecar", "image": "busybox:latest", "command": ["sleep", "3600"]}
            ]}
        }),
    );
    // Restarted by its liveness probe: each instance says who it is, then its last words.
    apply(
        &node,
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probed"},
            "spec": {"containers": [
                {"name": "app", "image": "busybox:latest",
                 "command": ["sh", "-c", "echo boot $(cat /proc/sys/kernel/random/uuid); echo last-words; sleep 3600"],
                 "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/never"]},
                                   "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 1}}
            ]}
        }),
    );
    wait_running(&node, "web");

    // Exit codes and output pass through.
    let o = cli(
        &node,
        &[
            "pod",
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo hi; echo oops >&2; exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "oops\n");
    let o = cli(
        &node,
        &["pod", "exec", "web", "-c", "sidecar", "--", "hostname"],
    );
    assert!(o.status.success(), "{}", text(&o));

    // stdin with -i, to its end.
    let mut child = Command::new(BIN)
        .args(["pod", "exec", "-i", "web", "--data-dir"])
        .arg(&node.data_dir)
        .args(["--", "sh", "-c", "tr a-z A-Z; echo end"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped input\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "PIPED INPUT\nend\n");

    // An interactive shell under a pseudo-terminal (util-linux `script` gives the CLI one), sized as the
    // local terminal is.
    let cmd = format!(
        "stty cols 91 rows 37; {BIN} pod exec -it web --data-dir {} -- sh",
        node.data_dir.display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"tty; stty size; echo in-$((40+2))\nexit 7\n")
        .unwrap();
    eventually(
        "the interactive shell to end",
        Duration::from_secs(60),
        || child.try_wait().unwrap().map(|_| ()),
    );
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(7), "{out}");
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("37 91"), "{out}");
    assert!(out.contains("in-42"), "{out}");

    // What is missing is named.
    let o = cli(&node, &["pod", "exec", "web", "-c", "api", "--", "true"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("pod web has no container api; it has: web, sidecar"),
        "{}",
        text(&o)
    );
    let o = cli(&node, &["pod", "logs", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("no pod nosuch"), "{}", text(&o));
    let o = cli(&node, &["pod", "logs", "web", "--previous"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("has no previous instance"),
        "{}",
        text(&o)
    );

    // --tail, --timestamps, --since.
    let o = cli(&node, &["pod", "logs", "web", "--tail", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    let shown = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        shown == "n9\nn10\nearly\n" || shown == "n10\nearly\nlate\n",
        "{shown:?}"
    );
    let o = cli(
        &node,
        &["pod", "logs", "web", "--tail", "1", "--timestamps"],
    );
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    let stamp = line.split(' ').next().unwrap();
    assert!(humantime::parse_rfc3339_weak(stamp).is_ok(), "{line:?}");
    eventually("late", Duration::from_secs(60), || {
        let o = cli(&node, &["pod", "logs", "web"]);
        String::from_utf8_lossy(&o.stdout)
            .contains("late")
            .then_some(())
    });
    // `early` was written 15 s before `late`; `late` was seen just now.
    let o = cli(&node, &["pod", "logs", "web", "--since", "8s"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "late\n");

    // Without the token (or with a wrong one) the agent refuses; nothing is served.
    let ca = node.tls_file("ca.crt");
    let client = member_support::api_client(Some(&ca));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for path in ["/pods/web/logs", "/pods/web/exec?command=%5B%22true%22%5D"] {
        let url = format!("{}{path}", node.api_url());
        let code = rt.block_on(async { client.get(&url).send().await.unwrap().status() });
        assert_eq!(code.as_u16(), 401, "{url}");
        let code = rt.block_on(async {
            client
                .get(&url)
                .bearer_auth("wrong")
                .send()
                .await
                .unwrap()
                .status()
        });
        assert_eq!(code.as_u16(), 401, "{url}");
    }

    // --previous after a liveness restart: the earlier instance's lines, not the current one's.
    eventually("a liveness restart", Duration::from_secs(120), || {
        let st = status(&node, "probed")?;
        (st["containers"][0]["restartCount"].as_u64()? >= 1).then_some(())
    });
    let boot = |args: &[&str]| -> Option<String> {
        let o = cli(&node, args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines()
            .find(|l| l.starts_with("boot "))
            .map(str::to_string)
    };
    let (current, previous, previous_all) = eventually(
        "a stable current and previous",
        Duration::from_secs(120),
        || {
            let before = boot(&["pod", "logs", "probed"])?;
            let o = cli(&node, &["pod", "logs", "probed", "--previous"]);
            let previous_all = String::from_utf8_lossy(&o.stdout).into_owned();
            let previous = boot(&["pod", "logs", "probed", "--previous"])?;
            let after = boot(&["pod", "logs", "probed"])?;
            (before == after).then_some((after, previous, previous_all))
        },
    );
    assert_ne!(current, previous);
    assert!(previous_all.ends_with("last-words\n"), "{previous_all:?}");
    let o = cli(
        &node,
        &["pod", "logs", "probed", "--previous", "--tail", "1"],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "last-words\n");
    assert!(!docker_ids("pa-exec", Some("probed")).is_empty());

    // The log caps are not part of a container's spec: an agent restarted with other caps (as after an
    // upgrade) adopts the running containers as they are, none restarted.
    let before = container_id(&node, "web", "web");
    node.terminate(Duration::from_secs(30));
    node.start(&["--container-log-max-size=2Mi".to_string()]);
    node.wait_ready(Duration::from_secs(60));
    wait_running(&node, "web");
    let st = status(&node, "web").unwrap();
    for c in st["containers"].as_array().unwrap() {
        assert_eq!(c["restartCount"], 0, "{c}");
    }
    assert_eq!(container_id(&node, "web", "web"), before);
    assert_eq!(
        inspect(
            &before,
            "{{index .HostConfig.LogConfig.Config \"max-size\"}}"
        ),
        "10485760"
    );
}

/// A pod on a worker: `pod logs` (with `-f` and `--previous`) and `pod exec` reach it from a voter's host
/// (the voter's certificate), from anywhere with an admin certificate, and beside the worker for its own
/// pods (the worker's certificate); no cluster token goes to the worker's agent.
#[test]
fn logs_and_exec_reach_a_pod_on_a_worker_from_a_voter_an_admin_and_beside_it() {
    let _cleanup = Cleanup("pa-wk-2".to_string());
    let (voter, worker) = member_support::voter_and_worker("pa-wk", Duration::from_secs(60));
    let file = voter.dir.join("wpod.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wpod"},
            "spec": {"containers": [
                {"name": "app", "image": "busybox:latest",
                 "command": ["sh", "-c", "echo boot $(cat /proc/sys/kernel/random/uuid); echo ready; sleep 3600"],
                 "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/never"]},
                                   "initialDelaySeconds": 2, "periodSeconds": 1, "failureThreshold": 1}}
            ]}
        })
        .to_string(),
    )
    .unwrap();
    let o = cli(
        &voter,
        &[
            "pod",
            "apply",
            "--node",
            &worker.name,
            "-f",
            file.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    // Restarted by its liveness probe at least once: a previous instance to read.
    eventually("a restart of wpod", Duration::from_secs(120), || {
        let o = cli(
            &voter,
            &["pod", "get", "wpod", "--node", &worker.name, "-o", "json"],
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        let st = &v["status"];
        (st["containers"][0]["restartCount"].as_u64()? >= 1
            && st["containers"][0]["state"]["running"].is_object())
        .then_some(())
    });

    // From the voter's host: its data dir, its certificate.
    let o = cli(&voter, &["pod", "logs", "wpod"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ready"),
        "{}",
        text(&o)
    );
    let o = cli(&voter, &["pod", "logs", "wpod", "--previous"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("boot "),
        "{}",
        text(&o)
    );
    let o = cli(
        &voter,
        &["pod", "exec", "wpod", "--", "sh", "-c", "hostname; exit 5"],
    );
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    // -f goes on until stopped: its first lines arrive through the worker's agent.
    let mut follow = Command::new(BIN)
        .args(["pod", "logs", "-f", "wpod", "--data-dir"])
        .arg(&voter.data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("ready") {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(b) => seen.extend(b),
            Err(e) => panic!(
                "no more of the followed log ({e}): {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    assert!(follow.try_wait().unwrap().is_none(), "-f ended by itself");
    let _ = follow.kill();
    let _ = follow.wait();

    // An admin's certificate, with no data dir at all.
    let admin = voter.run_dir().join("admin");
    let o = cli(
        &voter,
        &[
            "cert",
            "admin",
            "--out",
            admin.to_str().unwrap(),
            "--name",
            "ops",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(BIN)
        .args([
            "pod",
            "exec",
            "wpod",
            "--etcd-endpoints",
            &voter.client_url(),
        ])
        .arg("--etcd-ca-file")
        .arg(admin.join("ca.crt"))
        .arg("--etcd-cert-file")
        .arg(admin.join("admin.crt"))
        .arg("--etcd-key-file")
        .arg(admin.join("admin.key"))
        .args(["--data-dir", "/nonexistent", "--", "echo", "as-admin"])
        .env_remove("HOSTLET_DATA_DIR")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "as-admin\n");

    // Beside the worker: its own pods, with its own certificate.
    let o = cli(&worker, &["pod", "logs", "wpod", "--tail", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ready\n");
    let o = cli(&worker, &["pod", "exec", "wpod", "--", "echo", "beside"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "beside\n");
    let o = cli(&worker, &["pod", "logs", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
}
