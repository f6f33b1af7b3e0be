//! The version gate on real members: a binary the cluster's version rules out is refused before anything
//! changes (the member is not started, `/readyz` and an `EtcdUpgradeRefused` event name both versions), and
//! a release under etcd's data-inconsistency advisory starts with one warning event.

mod member_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use member_support::*;

const READY: Duration = Duration::from_secs(90);

/// Three voters, every agent on `etcd`.
fn three_on(prefix: &str, etcd: &Path) -> (Node, Node, Node) {
    three_on_each(prefix, [etcd, etcd, etcd])
}

/// Three voters, each agent on its own etcd binary.
fn three_on_each(prefix: &str, etcd: [&Path; 3]) -> (Node, Node, Node) {
    let flag = |i: usize| format!("--etcd-binary={}", etcd[i].display());
    let mut n1 = Node::new(&format!("{prefix}-1"));
    n1.start(&[flag(0)]);
    n1.wait_ready(READY);
    let joiner = |i: usize| {
        let mut n = Node::new(&format!("{prefix}-{}", i + 1));
        let mut join = join_args(&n1);
        join.push(flag(i));
        n.start(&join);
        n.wait_ready(READY);
        n
    };
    let (n2, n3) = (joiner(1), joiner(2));
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    wait_for_nodes("three voters", READY, &[&n1, &n2, &n3], || {
        voters_named(&n1, &names)
    });
    (n1, n2, n3)
}

/// The `EtcdUpgradeRefused` events about `node` (through `via`) once there is one; each names `both`.
fn refused_events(via: &Node, node: &str, both: [&str; 2]) -> Vec<String> {
    let seen = eventually("the EtcdUpgradeRefused event", READY, || {
        Some(events(via, node, "EtcdUpgradeRefused")).filter(|e| !e.is_empty())
    });
    assert!(
        seen.iter()
            .all(|e| e.contains(both[0]) && e.contains(both[1])),
        "{seen:?}"
    );
    seen
}

/// Every file under `dir` with its size and modification time: what "nothing changed" compares.
fn tree(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), m.len(), m.modified().unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Waits until `n`'s `/readyz` names a refusal; returns its body.
fn refused_readyz(n: &mut Node) -> String {
    let name = n.name.clone();
    let body = eventually(&format!("{name} to report the refusal"), READY, || {
        if let Some(status) = n.exited() {
            panic!("{name} exited ({status}):\n{}", n.log());
        }
        n.get_metrics("/readyz")
            .filter(|(code, body)| *code != 200 && body.contains("member not started"))
            .map(|(_, body)| body)
    });
    assert!(n.etcd_pid().is_none(), "an etcd runs:\n{}", n.log());
    body
}

fn stand_in(dir: &Path, version: &str) -> PathBuf {
    let p = dir.join("etcd-stand-in");
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho 'etcd Version: {version}'\necho 'Git SHA: stand-in'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn a_binary_two_minors_ahead_is_refused_as_a_skipped_minor() {
    let (n1, _n2, mut n3) = three_on("vskip", &etcd34());
    n3.terminate(Duration::from_secs(30));
    let member_dir = n3.data_dir.join("db/etcd");
    let before = tree(&member_dir);
    let fake = stand_in(&n3.dir, "3.7.0");
    n3.start(&[format!("--etcd-binary={}", fake.display())]);
    let body = refused_readyz(&mut n3);
    assert!(
        body.contains("3.7.0") && body.contains("skips a minor") && body.contains("3.4"),
        "{body}"
    );
    refused_events(&n1, &n3.name, ["3.7.0", "3.4"]);
    assert_eq!(tree(&member_dir), before, "the member dir changed");
    // Given its etcd back, the node starts as before.
    n3.terminate(Duration::from_secs(30));
    n3.start(&[format!("--etcd-binary={}", etcd34().display())]);
    n3.wait_ready(READY);
}

#[test]
fn a_34_binary_after_the_cluster_moved_to_35_is_refused_and_changes_nothing() {
    let dir35 = etcd35();
    let (n1, _n2, mut n3) = three_on("vdown", &dir35.join("etcd"));
    // The cluster version follows once every member runs 3.5.
    wait_for_nodes("cluster version 3.5", READY, &[&n1], || {
        member_version(&n1).filter(|(_, cluster)| cluster.starts_with("3.5"))
    });
    n3.terminate(Duration::from_secs(30));
    let member_dir = n3.data_dir.join("db/etcd");
    let before = tree(&n3.data_dir.join("db"));
    n3.start(&[format!("--etcd-binary={}", etcd34().display())]);
    let body = refused_readyz(&mut n3);
    assert!(
        body.contains("3.4.23") && body.contains("below the cluster version 3.5"),
        "{body}"
    );
    let seen = refused_events(&n1, &n3.name, ["3.4.23", "3.5"]);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(member_dir.join("member/wal").is_dir());
    assert_eq!(
        tree(&n3.data_dir.join("db")),
        before,
        "the data dir changed"
    );
}

#[test]
fn a_release_under_the_data_inconsistency_advisory_starts_with_one_warning() {
    let dir35 = etcd35();
    let mut n = Node::new("vwarn");
    n.start(&[format!("--etcd-binary={}", dir35.join("etcd").display())]);
    n.wait_ready(READY);
    let seen = eventually("the EtcdVersionWarning event", READY, || {
        Some(events(&n, "vwarn", "EtcdVersionWarning")).filter(|e| !e.is_empty())
    });
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].contains("3.5.1") && seen[0].contains("data-inconsistency advisory"),
        "{seen:?}"
    );
    let (_, text) = n.get_metrics("/metrics").unwrap();
    assert!(
        text.lines().any(|l| l
            .starts_with("hostlet_etcd_version_warning{kind=\"data-inconsistency-advisory\"} 1")),
        "{text}"
    );
    assert!(
        text.lines().any(
            |l| l.starts_with("hostlet_etcd_version_warning{kind=\"past-upstream-support\"} 0")
        ),
        "{text}"
    );
    let info = format!(
        "hostlet_etcd_version_info{{cluster=\"3.5\",member=\"{}\",server=\"3.5.1\"}} 1",
        n.member_name()
    );
    assert!(text.lines().any(|l| l == info), "{info} in\n{text}");
    // `hostlet etcd status` says it too: the release marked, the advisory named once.
    let o = cli(&n, &["etcd", "status"]);
    let shown = output_text(&o);
    assert!(o.status.success(), "{shown}");
    let row = shown
        .lines()
        .find(|l| l.starts_with(&n.member_name()))
        .unwrap_or_default();
    assert!(
        row.contains("3.5.1 (!)") && row.contains(" 3.5 "),
        "{shown}"
    );
    assert_eq!(
        shown.matches("data-inconsistency advisory").count(),
        1,
        "{shown}"
    );
    let o = cli(&n, &["etcd", "status", "-o", "json"]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(rows[0]["server_version"], "3.5.1", "{rows}");
    assert_eq!(rows[0]["cluster_version"], "3.5", "{rows}");
    assert!(
        rows[0]["storage_version"].is_null(),
        "no storage version before 3.6: {rows}"
    );
    assert_eq!(
        rows[0]["version_warnings"].as_array().map(Vec::len),
        Some(1),
        "{rows}"
    );
}

#[test]
fn a_member_whose_binary_was_replaced_by_a_refused_one_is_not_restarted_on_it() {
    let dir35 = etcd35();
    // n3 runs a binary of its own, replaced below as a package upgrade replaces a file.
    let own = tempfile::tempdir().unwrap();
    let bin = own.path().join("etcd");
    std::fs::copy(dir35.join("etcd"), &bin).unwrap();
    let etcd = dir35.join("etcd");
    let (n1, n2, mut n3) = three_on_each("vrst", [&etcd, &etcd, &bin]);
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    wait_for_nodes("cluster version 3.5", READY, &[&n1], || {
        member_version(&n1).filter(|(_, cluster)| cluster.starts_with("3.5"))
    });
    let replace = |from: &Path| {
        let tmp = bin.with_extension("new");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, &bin).unwrap();
    };
    replace(&etcd34());
    // The member crashes: the agent's supervisor would restart it on the 3.4 binary now in place.
    let member = n3.etcd_pid().expect("n3's etcd");
    signal(member, "KILL");
    let body = refused_readyz(&mut n3);
    assert!(
        body.contains("3.4.23") && body.contains("below the cluster version 3.5"),
        "{body}"
    );
    refused_events(&n1, &n3.name, ["3.4.23", "3.5"]);
    // Nothing changes while refused: the gate looks again at each restart delay, and reports once.
    let db = n3.data_dir.join("db/etcd");
    let before = tree(&db);
    let restarts = |n: &Node| {
        n.get_metrics("/metrics")
            .and_then(|(_, t)| metric(&t, "hostlet_etcd_member_restarts_total"))
    };
    let counted = restarts(&n3);
    eventually("three looks of the gate", READY, || {
        (n3.log()
            .matches("etcd restart held by the version gate")
            .count()
            >= 3)
            .then_some(())
    });
    assert!(n3.etcd_pid().is_none(), "an etcd runs:\n{}", n3.log());
    assert_eq!(tree(&db), before, "the member dir changed");
    assert_eq!(
        restarts(&n3),
        counted,
        "a restart was counted while refused"
    );
    assert_eq!(
        events(&n1, &n3.name, "EtcdUpgradeRefused").len(),
        1,
        "the refusal was reported more than once"
    );
    // Given its 3.5 binary back, the member restarts on it.
    replace(&dir35.join("etcd"));
    n3.wait_ready(READY);
    wait_for_nodes("three voters again", READY, &[&n1, &n3], || {
        voters_named(&n1, &names)
    });
}
