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

    let o = hostlet(&etcd, &["pod", "delete", "web"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(client
        .get("/hostlet/hosts/cli-node/pods/web")
        .await
        .unwrap()
        .is_none());
    // Exit codes (README): 4 refused, 3 not found.
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
