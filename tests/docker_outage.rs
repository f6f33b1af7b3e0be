//! A Docker daemon that goes away and comes back: the agent reaches Docker through a proxy socket
//! (`socat`, as a package upgrade restarting dockerd looks from outside) that the test cuts for 60 s and
//! then restores. Pods are left alone: same container ids, same start times; `/readyz` names Docker while
//! it is away and is ready again soon after it answers. Each pod's status says Docker is unreachable,
//! written once per pod for the whole outage, and is plain again after.

mod member_support;

use std::process::Command;
use std::time::{Duration, Instant};

use member_support::*;

const READY: Duration = Duration::from_secs(60);
const CUT: Duration = Duration::from_secs(60);

/// Each container of `node`: id → start time, as Docker itself reports them.
fn started_at(node: &str) -> Vec<(String, String)> {
    let ids = docker_ids(node, None);
    if ids.is_empty() {
        return Vec::new();
    }
    let o = Command::new("docker")
        .args(["inspect", "--format", "{{.Id}} {{.State.StartedAt}}"])
        .args(&ids)
        .output()
        .unwrap();
    let mut out: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    out.sort();
    out
}

/// The etcd version of `pod`'s status key (how many times it was written since it was created).
fn status_writes(n: &Node, pod: &str) -> i64 {
    let key = format!("/hostlet/hosts/{}/status/{pod}", n.name);
    let o = n.etcdctl(&["get", &key, "-w", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["kvs"][0]["version"]
        .as_i64()
        .unwrap_or_else(|| panic!("no status key {key}: {v}"))
}

fn says_docker_unreachable(s: &serde_json::Value) -> bool {
    s["message"]
        .as_str()
        .is_some_and(|m| m.contains("Docker unreachable"))
}

fn readyz(n: &Node) -> Option<(u16, serde_json::Value)> {
    let (code, body) = n.get_metrics("/readyz")?;
    Some((code, serde_json::from_str(&body).ok()?))
}

#[test]
fn docker_away_for_a_minute_leaves_every_pod_as_it_was() {
    let node = "docker-outage";
    let _cleanup = Cleanup(node.to_string());
    let mut n = Node::new(node);
    let socket = n.dir.join("docker.sock");
    let mut proxy = DockerProxy::start(&socket);
    n.start(&[format!("--docker-host=unix://{}", socket.display())]);
    n.wait_ready(READY);

    for id in ["outage-a", "outage-b"] {
        let file = n.dir.join(format!("{id}.yaml"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {id}}}\nspec:\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sleep, \"86400\"]\n"
            ),
        )
        .unwrap();
        let o = cli(&n, &["pod", "apply", "-f", file.to_str().unwrap()]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    eventually("both pods running", READY, || {
        ["outage-a", "outage-b"]
            .iter()
            .all(|id| status(&n, id).is_some_and(|s| s["phase"] == "Running"))
            .then_some(())
    });
    let before = started_at(node);
    assert_eq!(before.len(), 4, "two pods of infra + app: {before:?}");
    let pods = ["outage-a", "outage-b"];
    let writes_before: Vec<i64> = pods.iter().map(|p| status_writes(&n, p)).collect();

    proxy.cut();
    let cut_at = Instant::now();
    let (_, report) = eventually("/readyz to name Docker", Duration::from_secs(30), || {
        readyz(&n).filter(|(code, r)| *code == 503 && r["components"]["docker"]["ready"] == false)
    });
    let detail = report["components"]["docker"].to_string();
    assert!(
        detail.to_lowercase().contains("docker"),
        "the reason should name Docker: {report}"
    );
    // Each pod's status says so, the pod as it was.
    for id in pods {
        let s = eventually("the status to name Docker", Duration::from_secs(30), || {
            status(&n, id).filter(says_docker_unreachable)
        });
        assert_eq!(s["phase"], "Running", "{s}");
    }
    // Held for the whole cut: the agent stays up and keeps saying so.
    while cut_at.elapsed() < CUT {
        assert!(
            n.exited().is_none(),
            "the agent exited while Docker was away"
        );
        let r = readyz(&n);
        assert!(
            r.as_ref().is_some_and(
                |(code, r)| *code == 503 && r["components"]["docker"]["ready"] == false
            ),
            "/readyz during the cut: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Once per pod for the whole outage, not once per retry.
    let writes_during: Vec<i64> = pods.iter().map(|p| status_writes(&n, p)).collect();
    for (i, id) in pods.iter().enumerate() {
        assert_eq!(
            writes_during[i],
            writes_before[i] + 1,
            "{id}: status writes during the outage"
        );
        let s = status(&n, id).unwrap();
        assert!(says_docker_unreachable(&s), "{s}");
    }

    proxy.restore();
    let back = Instant::now();
    eventually("/readyz ready again", Duration::from_secs(10), || {
        readyz(&n).filter(|(code, _)| *code == 200)
    });
    eprintln!(
        "ready {:.1} s after Docker answered again",
        back.elapsed().as_secs_f64()
    );
    // Nothing was recreated or restarted because of the outage.
    assert_eq!(
        started_at(node),
        before,
        "containers changed across the outage"
    );
    for id in ["outage-a", "outage-b"] {
        let s = eventually("the pod's status", Duration::from_secs(30), || {
            status(&n, id).filter(|s| s["phase"] == "Running")
        });
        assert_eq!(s["containers"][0]["restartCount"], 0, "{s}");
    }
    // The statuses are plain again, each written once more.
    for (i, id) in pods.iter().enumerate() {
        let s = eventually("the status plain again", Duration::from_secs(10), || {
            status(&n, id).filter(|s| !says_docker_unreachable(s))
        });
        assert_eq!(s["phase"], "Running", "{s}");
        assert_eq!(
            status_writes(&n, id),
            writes_before[i] + 2,
            "{id}: status writes after the outage"
        );
    }
    // The agent keeps working with Docker: a new pod starts.
    let file = n.dir.join("after.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: outage-c}\nspec:\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sleep, \"86400\"]\n",
    )
    .unwrap();
    let o = cli(&n, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("a new pod running after the outage", READY, || {
        status(&n, "outage-c").filter(|s| s["phase"] == "Running")
    });
    assert_eq!(started_at(node).len(), 6);
    n.terminate(Duration::from_secs(30));
}
