//! Cluster reset: from the member's own data or from a snapshot; refusals touch nothing; data is moved,
//! never deleted.

mod member_support;

use std::path::PathBuf;
use std::time::Duration;

use member_support::{backups, db_entries, output_text as out, Node};

fn get(node: &Node, key: &str) -> String {
    let o = node.etcdctl(&["get", "--print-value-only", key]);
    assert!(o.status.success(), "{}", out(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn reset(node: &Node, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--cluster-reset".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    node.run_to_exit(&args, Duration::from_secs(90))
}

fn wal_marker(node: &Node) -> PathBuf {
    node.data_dir.join("db/etcd/member/wal")
}

#[test]
fn reset_from_own_data_serves_alone_and_a_second_reset_is_refused() {
    let mut node = Node::new("reset-own");
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert!(node.etcdctl(&["put", "/keep/me", "v1"]).status.success());
    let snap = take_snapshot(&node);
    node.terminate(Duration::from_secs(30));

    let o = reset(&node, &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("single-member cluster"), "{}", out(&o));
    assert!(node.data_dir.join("db/reset-flag").is_file());
    assert!(
        wal_marker(&node).is_dir(),
        "the member's data stays where it was"
    );

    let o = reset(&node, &[]);
    assert_eq!(o.status.code(), Some(4), "a refusal: {}", out(&o));
    assert!(out(&o).contains("reset-flag"), "{}", out(&o));
    // From a snapshot it is allowed again, and the flag records both resets.
    let o = reset(
        &node,
        &["--cluster-reset-restore-path", snap.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", out(&o));

    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert_eq!(get(&node, "/keep/me"), "v1");
    let (_, text) = node.get_metrics("/metrics").unwrap();
    assert_eq!(
        member_support::metric(&text, "hostlet_cluster_resets_total"),
        Some(2.0)
    );
    // The start that served retired the flag into the history: a later reset on purpose goes ahead.
    assert!(!node.data_dir.join("db/reset-flag").exists());
    let history = std::fs::read_to_string(node.data_dir.join("db/reset-history")).unwrap();
    assert_eq!(history.lines().count(), 2, "{history}");
    node.terminate(Duration::from_secs(30));
    let o = reset(&node, &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(node.data_dir.join("db/reset-flag").is_file());
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert_eq!(get(&node, "/keep/me"), "v1");
    let (_, text) = node.get_metrics("/metrics").unwrap();
    assert_eq!(
        member_support::metric(&text, "hostlet_cluster_resets_total"),
        Some(3.0)
    );
}

fn take_snapshot(node: &Node) -> PathBuf {
    let path = node.dir.join("snap.db");
    let o = node.etcdctl(&["snapshot", "save", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    path
}

#[test]
fn reset_from_a_snapshot_moves_the_old_dir_and_holds_the_snapshot_data() {
    let mut node = Node::new("reset-snap");
    // Not the loopback address the reset listens on: the next start must advertise this one again.
    node.advertise = "127.0.0.2".to_string();
    let advertised = format!("https://127.0.0.2:{}", node.peer_port);
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert!(node.etcdctl(&["put", "/k", "in-snapshot"]).status.success());
    let snap = take_snapshot(&node);
    assert!(node
        .etcdctl(&["put", "/k", "after-snapshot"])
        .status
        .success());
    node.terminate(Duration::from_secs(30));

    let o = reset(
        &node,
        &["--cluster-reset-restore-path", snap.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", out(&o));
    let old: Vec<String> = db_entries(&node)
        .into_iter()
        .filter(|e| e.starts_with("etcd-old-"))
        .collect();
    assert_eq!(old.len(), 1, "{:?}", db_entries(&node));
    assert!(
        node.data_dir
            .join("db")
            .join(&old[0])
            .join("member/wal")
            .is_dir(),
        "the old data is kept whole"
    );

    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert_eq!(get(&node, "/k"), "in-snapshot");
    member_support::eventually(
        "the member's peer URL to be the advertised one again",
        Duration::from_secs(30),
        || (peer_urls(&node) == vec![advertised.clone()]).then_some(()),
    );
}

#[test]
fn bad_restore_paths_are_refused_before_anything_moves() {
    let mut node = Node::new("reset-bad");
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    let snap = take_snapshot(&node);
    node.terminate(Duration::from_secs(30));
    let before = db_entries(&node);

    let corrupt = node.dir.join("corrupt.db");
    let mut bytes = std::fs::read(&snap).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&corrupt, bytes).unwrap();
    let missing = node.dir.join("missing.db");
    // As `hostlet etcd snapshot restore` answers: 3 for a path that is not there, 4 for one refused.
    for (path, needle, code) in [
        (missing.as_path(), "missing.db", 3),
        (node.dir.as_path(), "not a file", 4),
        (corrupt.as_path(), "sha256", 4),
    ] {
        let o = reset(
            &node,
            &["--cluster-reset-restore-path", path.to_str().unwrap()],
        );
        assert_eq!(o.status.code(), Some(code), "{needle}: {}", out(&o));
        assert!(out(&o).contains(needle), "{needle}: {}", out(&o));
        assert_eq!(db_entries(&node), before, "nothing moved");
        assert!(!node.data_dir.join("db/reset-flag").exists());
    }
}

#[test]
fn a_garbage_member_dir_is_refused_with_the_way_out() {
    let node = Node::new("garbage");
    let member = node.data_dir.join("db/etcd");
    std::fs::create_dir_all(&member).unwrap();
    std::fs::write(member.join("junk"), b"not etcd").unwrap();
    let o = node.run_to_exit(&[], Duration::from_secs(30));
    assert!(!o.status.success());
    let text = out(&o);
    assert!(
        text.contains(&member.display().to_string()) && text.contains("tombstone"),
        "{text}"
    );
    assert!(member.join("junk").exists(), "nothing deleted");
}

#[test]
fn a_tombstoned_member_with_no_other_node_to_join_refuses_to_start_and_keeps_its_data() {
    let mut node = Node::new("tombstoned-alone");
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert!(node.etcdctl(&["put", "/keep", "v"]).status.success());
    node.terminate(Duration::from_secs(30));
    std::fs::write(node.data_dir.join("db/etcd/tombstone"), "by hand\n").unwrap();
    let before = db_entries(&node);

    let o = node.run_to_exit(&[], Duration::from_secs(60));
    assert!(!o.status.success());
    let text = out(&o);
    assert!(
        text.contains("tombstone") && text.contains("--server") && text.contains("split"),
        "{text}"
    );
    assert_eq!(db_entries(&node), before, "nothing moved");
    assert!(wal_marker(&node).is_dir(), "the member dir stays whole");
    assert!(backups(&node).is_empty());
}

/// The peer URLs of the only member, asked through `node`.
fn peer_urls(node: &Node) -> Vec<String> {
    let o = node.etcdctl(&["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["members"][0]["peerURLs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_reset_or_a_second_agent_on_a_data_dir_in_use_is_refused_and_changes_nothing() {
    let mut node = Node::new("in-use");
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert!(node.etcdctl(&["put", "/keep/me", "v1"]).status.success());
    let snap = take_snapshot(&node);
    let before = db_entries(&node);
    let in_use = format!("in use by another hostlet (pid {}", node.pid());

    // A reset while the agent runs: refused before the restore file is even looked at.
    for extra in [
        vec![],
        vec!["--cluster-reset-restore-path", snap.to_str().unwrap()],
    ] {
        let o = reset(&node, &extra);
        assert!(!o.status.success(), "{}", out(&o));
        assert!(out(&o).contains(&in_use), "{}", out(&o));
        assert!(
            out(&o).contains(&node.data_dir.display().to_string()),
            "{}",
            out(&o)
        );
    }
    // A second agent on the same data dir, on ports of its own.
    let mut other = Node::new("in-use-2");
    other.data_dir = node.data_dir.clone();
    let o = other.run_to_exit(&[], Duration::from_secs(30));
    assert!(!o.status.success(), "{}", out(&o));
    assert!(out(&o).contains(&in_use), "{}", out(&o));

    // Nothing moved, the running agent never noticed.
    assert_eq!(db_entries(&node), before);
    assert!(!node.data_dir.join("db/reset-flag").exists());
    assert!(node.is_ready());
    assert_eq!(get(&node, "/keep/me"), "v1");
    assert!(node.exited().is_none());

    // The lock dies with its holder: after a SIGKILL the next start is not blocked by the file.
    let etcd = node.etcd_pid().expect("the agent's etcd");
    node.kill();
    member_support::eventually("etcd to follow its agent", Duration::from_secs(20), || {
        (!member_support::alive(etcd)).then_some(())
    });
    node.start(&[]);
    node.wait_ready(Duration::from_secs(60));
    assert_eq!(get(&node, "/keep/me"), "v1");
    node.terminate(Duration::from_secs(30));
    let o = reset(&node, &[]);
    assert!(o.status.success(), "{}", out(&o));
}
