//! A node whose member is removed (`hostlet node delete`) or who is asked to rejoin (the tombstone request
//! key) backs its member dir up and rejoins by itself, as a new member that gets promoted; data intact.

mod member_support;

use std::process::{Command, Output};
use std::time::Duration;

use member_support::{wait_for, Node, BIN};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// (name, is_learner) of every member, as the first node's etcd reports them.
fn members(n: &Node) -> Option<Vec<(String, bool)>> {
    let o = n.etcdctl(&["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    Some(
        v["members"]
            .as_array()?
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or("").to_string(),
                    m["isLearner"].as_bool().unwrap_or(false),
                )
            })
            .collect(),
    )
}

fn voters_named(n: &Node, names: &[String]) -> Option<()> {
    let m = members(n)?;
    (m.len() == names.len()
        && names
            .iter()
            .all(|want| m.iter().any(|(name, learner)| name == want && !learner)))
    .then_some(())
}

fn backups(n: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(n.data_dir.join("db"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.retain(|f| f.starts_with("etcd-backup-"));
    v.sort();
    v
}

fn three_voters() -> (Node, Node, Node) {
    let mut n1 = Node::new("tomb-1");
    n1.start(&[]);
    n1.wait_ready(Duration::from_secs(60));
    let join = |n: &Node| {
        vec![
            format!("--server={}", n.api_url()),
            format!("--token={}", n.token()),
        ]
    };
    let mut n2 = Node::new("tomb-2");
    n2.start(&join(&n1));
    n2.wait_ready(Duration::from_secs(90));
    let mut n3 = Node::new("tomb-3");
    n3.start(&join(&n1));
    n3.wait_ready(Duration::from_secs(90));
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    wait_for("three voters", Duration::from_secs(60), || {
        voters_named(&n1, &names)
    });
    (n1, n2, n3)
}

fn rejoin_round(n1: &Node, n2: &Node, n3: &Node, trigger: impl Fn()) {
    let old_name = n3.member_name();
    let before = backups(n3);
    trigger();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let name = std::fs::read_to_string(n3.data_dir.join("db/etcd/name"))
            .unwrap_or_default()
            .trim()
            .to_string();
        if name != old_name
            && voters_named(n1, &[n1.member_name(), n2.member_name(), name]).is_some()
        {
            break;
        }
        if std::time::Instant::now() > deadline {
            let log = n3.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "n3 did not rejoin; members {:?}; n3 log tail:\n{}",
                members(n1),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = backups(n3);
    assert_eq!(
        after.len(),
        (before.len() + 1).min(5),
        "{before:?} → {after:?}"
    );
    let newest = n3.data_dir.join("db").join(after.last().unwrap());
    assert!(
        newest.join("member/wal").is_dir(),
        "the old member dir is kept whole under {}",
        newest.display()
    );
}

#[test]
fn node_delete_and_the_tombstone_request_make_a_node_rejoin_by_itself() {
    let (n1, n2, n3) = three_voters();
    assert!(n1.etcdctl(&["put", "/data/k", "v"]).status.success());

    // `hostlet etcd members` shows the three voters, one leader, each with its node.
    let o = Command::new(BIN)
        .args(["etcd", "members", "-o", "json", "--data-dir"])
        .arg(&n1.data_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows.iter().all(|r| r["role"] == "voter"), "{rows:?}");
    assert_eq!(
        rows.iter().filter(|r| r["leader"] == true).count(),
        1,
        "{rows:?}"
    );
    for node in ["tomb-1", "tomb-2", "tomb-3"] {
        assert!(rows.iter().any(|r| r["node"] == node), "{node}: {rows:?}");
    }

    // Round 1: the node record deleted through the CLI.
    rejoin_round(&n1, &n2, &n3, || {
        let o = Command::new(BIN)
            .args(["node", "delete", "tomb-3", "--data-dir"])
            .arg(&n1.data_dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    });
    // Round 2: the tombstone request key, for a node that was not deleted.
    rejoin_round(&n1, &n2, &n3, || {
        assert!(n1
            .etcdctl(&["put", "/hostlet/hosts/tomb-3/requests/tombstone", "please"])
            .status
            .success());
    });
    // Data intact everywhere, read through each node's own member.
    for n in [&n1, &n2, &n3] {
        let o = n.etcdctl(&["get", "--print-value-only", "/data/k"]);
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "v", "{}", n.name);
    }
}
