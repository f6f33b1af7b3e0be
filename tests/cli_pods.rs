//! The operator's CLI against a real etcd: pods applied, listed, shown and deleted through their keys;
//! nodes and events read back.

use std::process::{Command, Output};

use hostlet_runtime::testkit::TestEtcd;

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/manifests");

fn hostlet(etcd: &TestEtcd, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args([
            "--etcd-endpoints",
            &etcd.endpoint(),
            "--node",
            "cli-node",
            "--data-dir",
            "/nonexistent",
        ])
        .env_remove("HOSTLET_DATA_DIR")
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

#[tokio::test]
async fn apply_ls_get_delete_round_trip() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let design = format!("{MANIFESTS}/design-example.yaml");

    let o = hostlet(&etcd, &["pod", "apply", "-f", &design]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("pod/web created"), "{}", text(&o));
    let stored = client
        .get("/hostlet/hosts/cli-node/pods/web")
        .await
        .unwrap()
        .unwrap();
    let m = hostlet_api::parse_manifest(stored.value()).unwrap();
    assert_eq!(m.id, "web");

    let o = hostlet(&etcd, &["pod", "apply", "-f", &design]);
    assert!(text(&o).contains("pod/web unchanged"), "{}", text(&o));

    // A status as the agent writes it shows in ls.
    let status = serde_json::json!({
        "id": "web", "node": "cli-node", "phase": "Running", "ready": true, "source": "etcd-key",
        "containers": [{"name": "app", "state": {"running": {"startedAt": "2026-11-30T00:00:00Z"}},
                        "restartCount": 2, "ready": true, "image": "busybox:latest"}],
        "updatedAt": "2026-11-30T00:00:00Z"
    });
    client
        .put("/hostlet/hosts/cli-node/status/web", status.to_string())
        .await
        .unwrap();
    let o = hostlet(&etcd, &["pod", "ls"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.lines().next().unwrap().starts_with("ID"), "{out}");
    let row = out.lines().find(|l| l.starts_with("web")).unwrap();
    for cell in ["cli-node", "Running", "1/1", "2", "etcd-key"] {
        assert!(row.contains(cell), "{row}");
    }

    let o = hostlet(&etcd, &["pod", "ls", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(parsed[0]["id"], "web");
    assert_eq!(parsed[0]["status"]["phase"], "Running");

    let o = hostlet(&etcd, &["pod", "get", "web", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        parsed["manifest"]["containers"][0]["image"],
        "busybox:latest"
    );
    // The 2014 manifest shown as a Kubernetes Pod, which reads back as the same pod.
    let o = hostlet(
        &etcd,
        &["pod", "get", "web", "-o", "json", "--format", "v1"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let parsed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shown = &parsed["manifest"];
    assert_eq!(shown["apiVersion"], "v1", "{shown}");
    assert_eq!(shown["kind"], "Pod", "{shown}");
    assert_eq!(shown["metadata"]["name"], "web", "{shown}");
    assert!(shown.get("containers").is_none(), "{shown}");
    let back = hostlet_api::parse_manifest(shown.to_string().as_bytes()).unwrap();
    assert!(hostlet_api::validate(&back).is_empty(), "{shown}");
    // Only the form and its version string differ.
    let back = hostlet_api::PodManifest {
        form: m.form,
        version: m.version.clone(),
        ..back
    };
    assert_eq!(back, m, "v1 form of {shown}");

    let o = hostlet(&etcd, &["pod", "delete", "web"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(client
        .get("/hostlet/hosts/cli-node/pods/web")
        .await
        .unwrap()
        .is_none());
    // Exit codes (docs/reference.md): 4 refused, 3 not found.
    let o = hostlet(&etcd, &["pod", "delete", "web"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("other source"), "{}", text(&o));
    let o = hostlet(&etcd, &["pod", "delete", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("no pod \"nosuch\""), "{}", text(&o));
    let o = hostlet(&etcd, &["pod", "get", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = hostlet(&etcd, &["node", "delete", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
}

#[test]
fn an_etcd_that_does_not_answer_exits_5() {
    // A free port: nothing listens there.
    let endpoint = format!("http://127.0.0.1:{}", hostlet_runtime::testkit::free_port());
    for args in [
        &["pod", "ls"][..],
        &["pod", "get", "web"],
        &["etcd", "members"],
        &["etcd", "snapshot", "ls"],
    ] {
        let o = Command::new(BIN)
            .args(args)
            .args(["--etcd-endpoints", &endpoint, "--node", "cli-node"])
            .env_remove("HOSTLET_DATA_DIR")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(5), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("unavailable"), "{args:?}: {}", text(&o));
    }
}

#[tokio::test]
async fn apply_refuses_an_invalid_manifest_and_writes_nothing() {
    let etcd = TestEtcd::start().await;
    let o = hostlet(
        &etcd,
        &[
            "pod",
            "apply",
            "-f",
            &format!("{MANIFESTS}/list-one-bad.yaml"),
        ],
    );
    assert_eq!(o.status.code(), Some(4), "refused: {}", text(&o));
    assert!(text(&o).contains("bad-one: invalid"), "{}", text(&o));
    let (kvs, _) = etcd.connect().await.get_prefix("/hostlet/").await.unwrap();
    assert!(kvs.is_empty(), "nothing may be written");
}

#[tokio::test]
async fn nodes_and_events_are_listed() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let node = serde_json::json!({"name": "cli-node", "address": "127.0.0.1", "version": "0.1.0",
                                  "started": "2026-11-30T00:00:00Z"});
    client
        .put("/hostlet/nodes/cli-node", node.to_string())
        .await
        .unwrap();
    let o = hostlet(&etcd, &["node", "ls"]);
    let row = text(&o)
        .lines()
        .find(|l| l.starts_with("cli-node"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        row.contains("NotReady"),
        "no heartbeat → NotReady: {}",
        text(&o)
    );

    let ev = serde_json::json!({"node": "cli-node", "pod": "web", "reason": "Started", "message": "started app",
                                "type": "Normal", "timestamp": "2026-11-30T00:00:01Z"});
    client
        .put(
            "/hostlet/events/cli-node/00000000000000000001-000000",
            ev.to_string(),
        )
        .await
        .unwrap();
    let o = hostlet(&etcd, &["events", "--pod", "web", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(parsed[0]["reason"], "Started");
    let o = hostlet(&etcd, &["events", "--pod", "other", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(parsed.as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn without_an_agent_or_endpoints_the_error_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["pod", "ls", "--data-dir"])
        .arg(dir.path())
        .env_remove("HOSTLET_ETCD_ENDPOINTS")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "nothing to reach: {}", text(&o));
    assert!(text(&o).contains("--etcd-endpoints"), "{}", text(&o));
}

/// `hostlet pod ls --watch` (or another command that keeps running) against `etcd`, its stdout lines on
/// a channel.
struct Watch {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Watch {
    fn start(etcd: &TestEtcd, extra: &[&str]) -> Watch {
        Watch::spawn(etcd, &[&["pod", "ls", "--watch"][..], extra].concat())
    }

    fn spawn(etcd: &TestEtcd, args: &[&str]) -> Watch {
        use std::io::BufRead;
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--etcd-endpoints", &etcd.endpoint(), "--node", "cli-node"])
            .args(["--data-dir", "/nonexistent"])
            .env_remove("HOSTLET_DATA_DIR")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    /// SIGINT (^C), then its exit code once it has exited.
    fn interrupt(&mut self, what: &str) -> Option<i32> {
        let pid = self.child.id().to_string();
        let o = Command::new("kill").args(["-INT", &pid]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} did not end on SIGINT"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The next line that `want` accepts (lines before it are returned too, for the message).
    fn until(&self, what: &str, want: impl Fn(&str) -> bool) -> (String, Vec<String>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if want(&l) => return (l, skipped),
                Ok(l) => skipped.push(l),
                Err(e) => panic!("no line {what} ({e}); lines seen: {skipped:#?}"),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cells(line: &str) -> Vec<&str> {
    line.split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test]
async fn ls_watch_prints_the_table_then_a_line_per_change_until_interrupted() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let design = format!("{MANIFESTS}/design-example.yaml");
    let o = hostlet(&etcd, &["pod", "apply", "-f", &design]);
    assert!(o.status.success(), "{}", text(&o));

    let w = Watch::start(&etcd, &[]);
    let (header, _) = w.until("with the header", |l| l.starts_with("ID"));
    assert_eq!(
        cells(&header),
        ["ID", "NODE", "PHASE", "READY", "RESTARTS", "AGE", "SOURCE"]
    );
    let (row, _) = w.until("for web as listed", |l| l.starts_with("web "));
    assert_eq!(cells(&row)[2], "Pending", "{row}");

    // The agent's status write: one line with the new phase and counts.
    let status = |phase: &str, restarts: u32| {
        serde_json::json!({
            "id": "web", "node": "cli-node", "phase": phase, "ready": true, "source": "etcd-key",
            "containers": [{"name": "app", "state": {"running": {"startedAt": "2026-11-30T00:00:00Z"}},
                            "restartCount": restarts, "ready": true, "image": "busybox:latest"}],
            "updatedAt": "2026-11-30T00:00:00Z"
        })
        .to_string()
    };
    client
        .put("/hostlet/hosts/cli-node/status/web", status("Running", 0))
        .await
        .unwrap();
    let (row, skipped) = w.until("for web running", |l| l.starts_with("web "));
    assert!(skipped.is_empty(), "{skipped:?}");
    let c = cells(&row);
    assert_eq!((c[2], c[3], c[4]), ("Running", "1/1", "0"), "{row}");
    // The same status written again shows nothing new; a restart does.
    client
        .put("/hostlet/hosts/cli-node/status/web", status("Running", 0))
        .await
        .unwrap();
    client
        .put("/hostlet/hosts/cli-node/status/web", status("Running", 1))
        .await
        .unwrap();
    let (row, skipped) = w.until("for web restarted", |l| l.starts_with("web "));
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(cells(&row)[4], "1", "{row}");

    // Another node's pod is not this node's list; a pod of this node appearing is.
    client
        .put(
            "/hostlet/hosts/other/pods/far",
            "{\"version\":\"v1beta1\",\"id\":\"far\",\"containers\":[]}",
        )
        .await
        .unwrap();
    client
        .put(
            "/hostlet/hosts/cli-node/pods/db",
            "{\"version\":\"v1beta1\",\"id\":\"db\",\"containers\":[]}",
        )
        .await
        .unwrap();
    let (row, skipped) = w.until("for db", |l| l.starts_with("db "));
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(cells(&row)[2], "Pending", "{row}");

    // Gone: the pod key, then the status the agent deletes once the containers are.
    client
        .delete("/hostlet/hosts/cli-node/pods/web")
        .await
        .unwrap();
    client
        .delete("/hostlet/hosts/cli-node/status/web")
        .await
        .unwrap();
    let (row, _) = w.until("for web deleted", |l| {
        l.starts_with("web ") && cells(l)[2] == "Deleted"
    });
    assert_eq!(cells(&row)[1], "cli-node", "{row}");

    // ^C ends it with success.
    let mut w = w;
    assert_eq!(w.interrupt("--watch"), Some(0));
}

#[tokio::test]
async fn events_follow_prints_the_backlog_then_new_events_until_interrupted() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let event = |node: &str, seq: u32, message: &str| {
        let ev = serde_json::json!({"node": node, "pod": "web", "reason": "Started", "message": message,
                                    "type": "Normal", "timestamp": format!("2026-11-30T00:00:{seq:02}Z")});
        (
            format!("/hostlet/events/{node}/{seq:020}-000000"),
            ev.to_string(),
        )
    };
    let (k, v) = event("cli-node", 1, "before the follow");
    client.put(k, v).await.unwrap();

    let mut w = Watch::spawn(&etcd, &["events", "--follow"]);
    let (header, _) = w.until("with the header", |l| l.starts_with("LAST SEEN"));
    assert!(header.contains("REASON"), "{header}");
    w.until("with the backlog", |l| l.contains("before the follow"));
    // Another node's event is not this node's; the next of this node's is printed as it comes.
    for (node, seq, message) in [
        ("other", 2, "elsewhere"),
        ("cli-node", 3, "while following"),
    ] {
        let (k, v) = event(node, seq, message);
        client.put(k, v).await.unwrap();
    }
    let (_, skipped) = w.until("with the new event", |l| l.contains("while following"));
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(w.interrupt("events --follow"), Some(0));

    // ^C as soon as the header shows (before any event came) ends it with success too: the listener is
    // there from before the first line.
    let mut w = Watch::spawn(&etcd, &["events", "--follow"]);
    w.until("with the header", |l| l.starts_with("LAST SEEN"));
    assert_eq!(w.interrupt("events --follow"), Some(0));
}

#[tokio::test]
async fn ls_watch_json_prints_one_object_per_change() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let w = Watch::start(&etcd, &["-o", "json"]);
    // Nothing listed yet: the first line is the first change.
    client
        .put(
            "/hostlet/hosts/cli-node/pods/db",
            "{\"version\":\"v1beta1\",\"id\":\"db\",\"containers\":[]}",
        )
        .await
        .unwrap();
    let (line, _) = w.until("for db", |l| l.contains("\"db\""));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["node"].as_str()),
        (Some("db"), Some("cli-node"))
    );
    assert!(v.get("deleted").is_none(), "{v}");
    client
        .delete("/hostlet/hosts/cli-node/pods/db")
        .await
        .unwrap();
    let (line, _) = w.until("for db deleted", |l| l.contains("\"deleted\""));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["deleted"].as_bool()),
        (Some("db"), Some(true))
    );
}

#[tokio::test]
async fn wide_output_adds_columns_to_pod_ls_and_node_ls() {
    let etcd = TestEtcd::start().await;
    let client = etcd.connect().await;
    let design = format!("{MANIFESTS}/design-example.yaml");
    let o = hostlet(&etcd, &["pod", "apply", "-f", &design]);
    assert!(o.status.success(), "{}", text(&o));
    let node = serde_json::json!({
        "name": "cli-node", "address": "10.0.0.7", "memberName": "cli-node-1a2b3c4d",
        "memberId": "8e9e05c52164694d", "peerUrl": "https://10.0.0.7:2380",
        "clientUrl": "https://10.0.0.7:2379", "apiUrl": "https://10.0.0.7:10250",
        "version": "0.1.0", "started": "2026-11-30T00:00:00Z"
    });
    client
        .put("/hostlet/nodes/cli-node", node.to_string())
        .await
        .unwrap();
    let status = serde_json::json!({
        "id": "web", "node": "cli-node", "phase": "Running", "ready": true,
        "containers": [{"name": "app", "state": {"running": {"startedAt": "2026-11-30T00:00:00Z"}},
                        "restartCount": 0, "ready": true, "image": "busybox:latest"}],
        "updatedAt": "2026-11-30T00:00:00Z"
    });
    client
        .put("/hostlet/hosts/cli-node/status/web", status.to_string())
        .await
        .unwrap();

    let o = hostlet(&etcd, &["pod", "ls", "-o", "wide"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let mut lines = out.lines();
    assert_eq!(
        cells(lines.next().unwrap()),
        [
            "ID",
            "NODE",
            "PHASE",
            "READY",
            "RESTARTS",
            "AGE",
            "SOURCE",
            "NODE ADDRESS",
            "PORTS",
            "CONTAINERS",
            "IMAGES"
        ],
        "{out}"
    );
    let row = cells(lines.next().unwrap());
    assert_eq!(
        row[7..],
        [
            "10.0.0.7",
            "127.0.0.1:18080->8080/tcp",
            "app",
            "busybox:latest"
        ],
        "{out}"
    );
    // The plain table stays as it was.
    let o = hostlet(&etcd, &["pod", "ls"]);
    assert_eq!(
        cells(text(&o).lines().next().unwrap()).len(),
        7,
        "{}",
        text(&o)
    );

    let o = hostlet(&etcd, &["node", "ls", "-o", "wide"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let mut lines = out.lines();
    let header = cells(lines.next().unwrap());
    assert_eq!(header[2], "ROLE", "{out}");
    assert_eq!(
        header[8..],
        [
            "CERT EXPIRES",
            "MEMBER ID",
            "CLIENT URL",
            "API URL",
            "PODS",
            "AGE"
        ],
        "{out}"
    );
    let row = cells(lines.next().unwrap());
    assert_eq!(row[0], "cli-node", "{out}");
    // Its record names a member this cluster does not have: no member, so a worker.
    assert_eq!(row[2], "worker", "{out}");
    assert_eq!(
        row[8..13],
        [
            "-",
            "8e9e05c52164694d",
            "https://10.0.0.7:2379",
            "https://10.0.0.7:10250",
            "1/1"
        ],
        "{out}"
    );
    // Commands without wide columns print their usual table.
    let o = hostlet(&etcd, &["events", "-o", "wide"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).starts_with("LAST SEEN"), "{}", text(&o));
}
