//! `--etcd-endpoints`: an external cluster, and no member management.

mod member_support;

use std::time::Duration;

use member_support::*;

#[test]
fn external_endpoints_turn_member_management_off() {
    let mut cluster = Node::new("n1");
    cluster.start(&[]);
    cluster.wait_ready(Duration::from_secs(30));

    let mut agent = Node::new("n2");
    let flags = vec![
        format!("--etcd-endpoints={}", cluster.client_url()),
        format!("--etcd-ca-file={}", cluster.tls_file("ca.crt").display()),
        format!(
            "--etcd-cert-file={}",
            cluster.tls_file("client.crt").display()
        ),
        format!(
            "--etcd-key-file={}",
            cluster.tls_file("client.key").display()
        ),
    ];
    agent.start(&flags);
    agent.wait_ready(Duration::from_secs(30));

    assert!(
        agent.etcd_pid().is_none(),
        "an external cluster needs no etcd child"
    );
    assert!(!agent.data_dir.join("db/etcd").exists());
    // The agent registered itself in the external cluster.
    let o = cluster.etcdctl(&["get", "/hostlet/nodes/n2", "--print-value-only"]);
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["name"], "n2");
    assert!(info.get("memberName").is_none(), "{info}");
    let o = cluster.etcdctl(&["member", "list"]);
    assert_eq!(stdout(&o).lines().count(), 1, "no member was added");

    assert!(agent.terminate(Duration::from_secs(20)).success());
    // A clean stop revokes the heartbeat at once.
    let o = cluster.etcdctl(&["get", "/hostlet/leases/n2", "--print-value-only"]);
    assert_eq!(stdout(&o).trim(), "");
}

#[test]
fn half_given_certificate_flags_are_refused() {
    let n = Node::new("n1");
    let o = n.run_to_exit(
        &[
            "--etcd-endpoints=https://127.0.0.1:1".to_string(),
            "--etcd-ca-file=/tmp/ca.crt".to_string(),
        ],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("go together"), "{}", stderr(&o));
}
