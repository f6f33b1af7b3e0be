//! One node with its own etcd member: fresh start, restart, supervision, stop, TLS, the listeners.

mod member_support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use member_support::*;

const READY: Duration = Duration::from_secs(30);

fn member_id(node: &Node) -> String {
    let o = node.etcdctl(&["endpoint", "status", "-w", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0]["Status"]["header"]["member_id"].to_string()
}

#[test]
fn fresh_node_serves_and_a_restart_keeps_member_name_and_data() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);

    let name = n.member_name();
    let (host, suffix) = name.rsplit_once('-').unwrap();
    assert!(!host.is_empty());
    assert_eq!(suffix.len(), 8, "{name}");
    assert!(n.data_dir.join("db/etcd/member/wal").is_dir());
    let id = member_id(&n);
    let put = n.etcdctl(&["put", "/test/kept", "v1"]);
    assert!(put.status.success(), "{}", stderr(&put));

    // The node registered itself and keeps a heartbeat.
    let o = n.etcdctl(&["get", "/hostlet/nodes/n1", "--print-value-only"]);
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["name"], "n1");
    assert_eq!(info["memberName"], name.as_str());
    assert_eq!(info["address"], "127.0.0.1");
    let o = n.etcdctl(&["get", "/hostlet/leases/n1", "-w", "json"]);
    let lease: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        lease["kvs"][0]["lease"].as_i64().unwrap_or(0) != 0,
        "{lease}"
    );

    let status = n.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}\n{}", n.log());

    n.start(&[]);
    n.wait_ready(READY);
    assert_eq!(
        n.member_name(),
        name,
        "member name changed across a restart"
    );
    assert_eq!(member_id(&n), id, "member id changed across a restart");
    let o = n.etcdctl(&["get", "/test/kept", "--print-value-only"]);
    assert_eq!(stdout(&o).trim(), "v1");
    assert!(n.log().contains("Restart"), "{}", n.log());
}

#[test]
fn sigterm_stops_hostlet_and_its_etcd_within_20s() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);
    let etcd = n.etcd_pid().expect("etcd child");
    let started = Instant::now();
    let status = n.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    eventually(
        "etcd to be gone",
        Duration::from_secs(20).saturating_sub(started.elapsed()),
        || (!alive(etcd)).then_some(()),
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    // The clean stop revoked the heartbeat lease, so nothing waits for its 40 s TTL.
}

#[test]
fn sigkill_of_hostlet_takes_its_etcd_along() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);
    let etcd = n.etcd_pid().expect("etcd child");
    n.kill();
    eventually("etcd to die with hostlet", Duration::from_secs(10), || {
        (!alive(etcd)).then_some(())
    });
}

#[test]
fn killed_etcd_is_restarted_and_readyz_goes_not_ready_then_ready() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);
    let (_, body) = n.get_metrics("/metrics").unwrap();
    assert_eq!(
        metric(&body, "hostlet_etcd_member_restarts_total"),
        Some(0.0)
    );
    assert_eq!(metric(&body, "hostlet_etcd_up"), Some(1.0));

    let old = n.etcd_pid().expect("etcd child");
    signal(old, "KILL");
    let (code, body) = eventually("/readyz to say not ready", Duration::from_secs(10), || {
        n.get_metrics("/readyz").filter(|(c, _)| *c == 503)
    });
    assert_eq!(code, 503);
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["ready"], false);
    assert_eq!(report["components"]["etcd"]["ready"], false, "{report}");

    n.wait_ready(READY);
    let new = n.etcd_pid().expect("a new etcd child");
    assert_ne!(new, old);
    let (_, body) = n.get_metrics("/metrics").unwrap();
    assert_eq!(
        metric(&body, "hostlet_etcd_member_restarts_total"),
        Some(1.0)
    );
    let o = n.etcdctl(&["put", "/after/restart", "x"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn etcd_refuses_plain_http_and_accepts_the_generated_client_certificate() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);

    // Plain HTTP on the TLS port: refused.
    let plain = n.etcdctl_at(
        &format!("http://127.0.0.1:{}", n.client_port),
        &["get", "x"],
    );
    assert!(!plain.status.success());
    // TLS without a client certificate: refused.
    let o = std::process::Command::new(hostlet_runtime::testkit::etcd_program("etcdctl"))
        .env("ETCDCTL_API", "3")
        .args([
            &format!("--endpoints={}", n.client_url()),
            &format!("--cacert={}", n.tls_file("ca.crt").display()),
            "--dial-timeout=3s",
            "--command-timeout=5s",
            "get",
            "x",
        ])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "etcd served a client without a certificate"
    );
    // With the client certificate: works.
    let ok = n.etcdctl(&["put", "k", "v"]);
    assert!(ok.status.success(), "{}", stderr(&ok));

    // Keys are private, the token carries the CA fingerprint.
    for f in ["ca.key", "server.key", "peer.key", "client.key"] {
        let mode = std::fs::metadata(n.tls_file(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let token = n.token();
    let parts: Vec<&str> = token.split("::").collect();
    assert_eq!(parts.len(), 3, "{token}");
    assert_eq!(parts[0], "H10");
    assert_eq!(parts[1].len(), 64);
    let mode = std::fs::metadata(n.data_dir.join("token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[tokio::test(flavor = "multi_thread")]
async fn listeners_serve_metrics_health_and_a_token_guarded_db_info() {
    let mut n = Node::new("n1");
    // Run from a directory of its own with `--data-dir data`, a relative path that does not exist yet.
    let cwd = n.dir.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    n.data_dir = cwd.join("data");
    n.cwd = Some(cwd);
    assert!(n.args().contains(&"--data-dir=data".to_string()));
    n.start(&[]);
    n.wait_ready(READY);

    let (code, body) = n.get_metrics("/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body) = n.get_metrics("/readyz").unwrap();
    assert_eq!(code, 200);
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    // Every component is listed from the start, so the first ready answer already covers them all.
    let names: Vec<&str> = report["components"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        names,
        ["caches", "disk", "docker", "etcd", "node"],
        "{report}"
    );
    for name in names {
        assert_eq!(report["components"][name]["ready"], true, "{report}");
    }
    let (_, text) = n.get_metrics("/metrics").unwrap();
    for m in [
        "hostlet_etcd_member_restarts_total",
        "hostlet_etcd_is_leader",
        "hostlet_etcd_is_learner",
        "hostlet_etcd_up",
    ] {
        assert!(metric(&text, m).is_some(), "{m} missing");
    }
    assert_eq!(metric(&text, "hostlet_etcd_is_leader"), Some(1.0));
    assert_eq!(metric(&text, "hostlet_etcd_is_learner"), Some(0.0));
    let member = n.member_name();
    let size = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "hostlet_etcd_db_size_bytes{{member=\"{member}\"}} "
            ))
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(size.unwrap_or(0.0) > 0.0, "no db size for {member}");
    // The process collector reads the agent's own /proc entry.
    assert!(metric(&text, "process_resident_memory_bytes").unwrap() > 0.0);
    assert!(metric(&text, "process_open_fds").unwrap() > 0.0);
    assert!(metric(&text, "process_cpu_seconds_total").is_some());
    assert!(metric(&text, "process_start_time_seconds").unwrap() > 0.0);
    // The build this agent runs: the package version and the commit of this checkout.
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let build_info = format!(
        r#"hostlet_build_info{{commit="{commit}",version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        text.lines().any(|l| l == build_info),
        "{build_info} missing:\n{}",
        text.lines()
            .filter(|l| l.starts_with("hostlet_build_info"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The API is HTTPS with a certificate from the cluster CA.
    let client = api_client(Some(&n.tls_file("ca.crt")));
    let url = format!("{}/db/info", n.api_url());
    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client.get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .post(format!("{}/db/join", n.api_url()))
        .bearer_auth("wrong")
        .body(r#"{"node":"x","sans":["127.0.0.1"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "a join without the token");
    // Denied by default: the pods and stats need the token too; health and the CA are open.
    for path in ["/pods", "/pods/x", "/stats/x/y"] {
        let r = client
            .get(format!("{}{path}", n.api_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    for path in ["/healthz", "/cacerts"] {
        let r = client
            .get(format!("{}{path}", n.api_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let r = client
        .get(format!("{}/pods", n.api_url()))
        .bearer_auth(n.token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the pod list with the token");
    let r = client
        .get(&url)
        .bearer_auth(n.token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let info: serde_json::Value = r.json().await.unwrap();
    assert_eq!(info["members"].as_array().unwrap().len(), 1, "{info}");
    assert_eq!(info["members"][0]["name"], n.member_name().as_str());
    // The member and the TLS material are in the relative data dir, taken against the agent's cwd.
    assert!(n.data_dir.join("db").is_dir());
    // The refused requests changed nothing.
    let o = n.etcdctl(&["member", "list"]);
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
}

#[test]
fn insecure_node_uses_plain_http() {
    let mut n = Node::new("n1").insecure();
    n.start(&[]);
    n.wait_ready(READY);
    assert!(!n.data_dir.join("tls").exists());
    let o = n.etcdctl(&["put", "k", "v"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!n.token().starts_with("H10::"));
}

#[test]
fn a_restart_on_a_new_advertise_address_issues_new_certificates_and_moves_the_peer_url() {
    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(READY);
    assert!(n.etcdctl(&["put", "/moved/k", "v"]).status.success());
    let read = |n: &Node, f: &str| std::fs::read_to_string(n.tls_file(f)).unwrap();
    let (ca, server) = (read(&n, "ca.crt"), read(&n, "server.crt"));
    n.terminate(Duration::from_secs(20));

    // The host's address changed: etcd now also listens on the new one, with a certificate naming it.
    n.advertise = "127.0.0.2".to_string();
    n.start(&[]);
    n.wait_ready(READY);
    assert_ne!(read(&n, "server.crt"), server, "certificates issued again");
    assert_eq!(read(&n, "ca.crt"), ca, "by the same CA");
    assert!(
        n.log().contains("issued new ones") && n.log().contains("127.0.0.2"),
        "{}",
        n.log_tail(30)
    );
    // etcdctl checks the server certificate against the address it dials.
    let o = n.etcdctl_at(
        &format!("https://127.0.0.2:{}", n.client_port),
        &["get", "--print-value-only", "/moved/k"],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(stdout(&o).trim(), "v");
    let peer_url = format!("https://127.0.0.2:{}", n.peer_port);
    eventually("the member's peer URL to move", READY, || {
        stdout(&n.etcdctl(&["member", "list"]))
            .contains(&peer_url)
            .then_some(())
    });

    // The same addresses again: the certificates stay as they are.
    let now = read(&n, "server.crt");
    n.terminate(Duration::from_secs(20));
    n.start(&[]);
    n.wait_ready(READY);
    assert_eq!(read(&n, "server.crt"), now);
}

#[test]
fn the_cli_finds_an_agent_started_with_a_relative_data_dir_and_no_flags() {
    let mut n = Node::new("n1");
    let cwd = n.dir.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    n.data_dir = cwd.join("x");
    n.cwd = Some(cwd);
    assert!(n.args().contains(&"--data-dir=x".to_string()));
    n.start(&[]);
    n.wait_ready(READY);
    let pointer = n.run_dir().join("agent.json");
    assert!(pointer.exists(), "no run pointer at {}", pointer.display());

    // Another shell: elsewhere, no --data-dir, no endpoints.
    let run_dir = n.run_dir();
    let cli = |args: &[&str]| {
        std::process::Command::new(member_support::BIN)
            .args(args)
            .current_dir("/")
            .env_remove("HOSTLET_DATA_DIR")
            .env_remove("HOSTLET_ETCD_ENDPOINTS")
            .env("HOSTLET_RUN_DIR", &run_dir)
            .output()
            .unwrap()
    };
    let o = cli(&["node", "ls"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(output_text(&o).contains("n1"), "{}", output_text(&o));
    let o = cli(&["pod", "ls"]);
    assert!(o.status.success(), "{}", output_text(&o));

    let status = n.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(!pointer.exists(), "the stopped agent left its pointer");
    let o = cli(&["pod", "ls"]);
    assert!(!o.status.success(), "{}", output_text(&o));
    let text = output_text(&o);
    assert!(
        text.contains("/var/lib/hostlet") && text.contains(&pointer.display().to_string()),
        "the message should say where it looked: {text}"
    );
}

/// Two agents on one host (a second data dir): the CLI with no `--data-dir` says which one it writes to
/// and how to pick the other; with `--data-dir` it says nothing of the kind.
#[test]
fn with_two_agents_on_the_host_the_cli_says_which_it_uses() {
    let _cleanup = Cleanup("two-b".to_string());
    let mut a = Node::new("two-a");
    let mut b = Node::new("two-b");
    let run_dir = a.run_dir();
    b.env
        .push(("HOSTLET_RUN_DIR".into(), run_dir.display().to_string()));
    a.start(&[]);
    a.wait_ready(READY);
    b.start(&[]);
    b.wait_ready(READY);
    assert_eq!(
        std::fs::read_dir(run_dir.join("agents")).unwrap().count(),
        2,
        "each agent leaves its own entry"
    );
    let manifest = a.dir.join("p.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: c, image: busybox:latest, command: [sleep, '3600']}\n",
    )
    .unwrap();
    let bare = |args: &[&str]| {
        std::process::Command::new(member_support::BIN)
            .args(args)
            .env_remove("HOSTLET_DATA_DIR")
            .env_remove("HOSTLET_ETCD_ENDPOINTS")
            .env("HOSTLET_RUN_DIR", &run_dir)
            .output()
            .unwrap()
    };
    let o = bare(&["pod", "apply", "-f", &manifest.display().to_string()]);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("pod/p created (node two-b)"), "{text}");
    let warning = String::from_utf8_lossy(&o.stderr).to_string();
    // b started last: the pointer is its.
    assert!(
        warning.contains("2 hostlet agents run on this host")
            && warning.contains(&format!("uses {} (node two-b)", b.data_dir.display()))
            && warning.contains(&format!("not {} (node two-a)", a.data_dir.display()))
            && warning.contains("--data-dir"),
        "{warning}"
    );
    assert_eq!(
        warning.matches("warning:").count(),
        1,
        "said once: {warning}"
    );
    let o = bare(&[
        "node",
        "ls",
        "--data-dir",
        &a.data_dir.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("agents run on this host"),
        "{}",
        output_text(&o)
    );

    // The one started last stopped: its entries go, and the other is found and used without a word.
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert_eq!(
        std::fs::read_dir(run_dir.join("agents")).unwrap().count(),
        1
    );
    let o = bare(&["pod", "ls", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("warning"),
        "{}",
        output_text(&o)
    );
    let o = bare(&["node", "ls"]);
    assert!(output_text(&o).contains("two-a"), "{}", output_text(&o));
}

/// SIGTERM while a pod's containers are being created: the agent still exits within 15 s (the reconcile
/// under way finishes first), and after the next start the pod is whole: one container per name, and every
/// container made before the stop kept (adopted), none made twice.
#[test]
fn sigterm_while_a_pod_is_created_leaves_it_whole_after_the_next_start() {
    let _cleanup = Cleanup("stop-pod".to_string());
    let mut n = Node::new("stop-pod");
    n.start(&[]);
    n.wait_ready(READY);
    let containers: String = (1..=5)
        .map(|i| format!("  - {{name: c{i}, image: busybox:latest, command: [sleep, '3600']}}\n"))
        .collect();
    let manifest = n.dir.join("five.yaml");
    std::fs::write(
        &manifest,
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: five}}\nspec:\n  containers:\n{containers}"),
    )
    .unwrap();
    let o = cli(&n, &["pod", "apply", "-f", &manifest.display().to_string()]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("the pod's first container", Duration::from_secs(60), || {
        (!docker_ids(&n.name, Some("five")).is_empty()).then_some(())
    });
    let exit = n.terminate(Duration::from_secs(15));
    assert!(exit.success(), "{exit}\n{}", n.log_tail(30));
    let at_stop = docker_ids(&n.name, Some("five"));
    eprintln!("{} of 6 containers were there at the stop", at_stop.len());

    n.start(&[]);
    n.wait_ready(READY);
    eventually("the pod to run again", Duration::from_secs(60), || {
        status(&n, "five")
            .filter(|s| s["phase"] == "Running")
            .map(|_| ())
    });
    let after = docker_ids(&n.name, Some("five"));
    let names = std::process::Command::new("docker")
        .args(["ps", "-a", "--filter"])
        .arg("label=io.hostlet.pod=five")
        .args(["--filter"])
        .arg(format!("label=io.hostlet.node={}", n.name))
        .args(["--format", "{{.Label \"io.hostlet.container\"}}"])
        .output()
        .unwrap();
    let mut names: Vec<String> = String::from_utf8_lossy(&names.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    names.sort();
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(names, unique, "a container made twice: {names:?}");
    assert_eq!(after.len(), 6, "infra and five: {names:?}");
    let lost: Vec<&String> = at_stop.iter().filter(|id| !after.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "made before the stop and replaced after it: {lost:?}"
    );
}
