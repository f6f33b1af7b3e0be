//! A node whose member is removed (`hostlet node delete`), who is asked to rejoin (the tombstone request
//! key), or who finds a tombstone at start backs its member dir up and rejoins by itself, as a new member
//! that gets promoted; data intact. Six rounds leave the five newest backups, each a whole member dir.

mod member_support;

use std::process::Command;
use std::time::Duration;

use member_support::{
    backup_of, backups, output_text, three_voters, voters_named, wait_for_nodes, Node, BIN,
};

/// How a round makes n3 rejoin.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// `hostlet node delete`: the leader removes n3's member; n3 notices.
    NodeDelete,
    /// `/hostlet/hosts/<node>/requests/tombstone`: n3 leaves the cluster and rejoins.
    RequestKey,
    /// n3 stopped, a `tombstone` file written by hand, n3 started without `--server`: it finds a node to
    /// rejoin through in the node records and replaces its old member.
    FileAtStart,
}

fn rejoin_round(n1: &Node, n2: &Node, n3: &mut Node, trigger: Trigger) {
    let old_name = n3.member_name();
    let before = backups(n3);
    let started = std::time::Instant::now();
    match trigger {
        Trigger::NodeDelete => {
            let o = Command::new(BIN)
                .args(["node", "delete", &n3.name, "--data-dir"])
                .arg(&n1.data_dir)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", output_text(&o));
        }
        Trigger::RequestKey => {
            let key = format!("/hostlet/hosts/{}/requests/tombstone", n3.name);
            assert!(n1.etcdctl(&["put", &key, "please"]).status.success());
        }
        Trigger::FileAtStart => {
            n3.terminate(Duration::from_secs(40));
            std::fs::write(n3.data_dir.join("db/etcd/tombstone"), "by hand\n").unwrap();
            n3.start(&[]);
        }
    }
    let what = format!("{trigger:?}: n3 to rejoin as a new voter");
    wait_for_nodes(&what, Duration::from_secs(120), &[n1, n3], || {
        let name = std::fs::read_to_string(n3.data_dir.join("db/etcd/name"))
            .unwrap_or_default()
            .trim()
            .to_string();
        (name != old_name).then_some(())?;
        voters_named(n1, &[n1.member_name(), n2.member_name(), name])
    });
    eprintln!(
        "{trigger:?}: a voter again as a new member after {:?}",
        started.elapsed()
    );
    let after = backups(n3);
    assert_eq!(
        after.len(),
        (before.len() + 1).min(5),
        "{trigger:?}: {before:?} → {after:?}"
    );
    let newest = after.last().unwrap();
    assert_eq!(
        backup_of(n3, &old_name).as_ref(),
        Some(newest),
        "{trigger:?}: the old member dir is kept whole in the newest backup"
    );
}

#[test]
fn six_rejoins_by_node_delete_request_key_and_tombstone_file_keep_the_data_and_five_backups() {
    let (n1, n2, mut n3) = three_voters("tomb");
    assert!(n1.etcdctl(&["put", "/data/k", "v"]).status.success());

    // `hostlet etcd members` shows the three voters, one leader, each with its node.
    let o = Command::new(BIN)
        .args(["etcd", "members", "-o", "json", "--data-dir"])
        .arg(&n1.data_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
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

    let mut names = Vec::new();
    for trigger in [
        Trigger::NodeDelete,
        Trigger::RequestKey,
        Trigger::FileAtStart,
        Trigger::NodeDelete,
        Trigger::RequestKey,
        Trigger::FileAtStart,
    ] {
        names.push(n3.member_name());
        rejoin_round(&n1, &n2, &mut n3, trigger);
        let o = n3.etcdctl(&["put", &format!("/data/round-{}", names.len()), "x"]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    // Six rounds, five backups: the five newest members' dirs, each whole.
    assert_eq!(backups(&n3).len(), 5);
    for name in &names[1..] {
        assert!(backup_of(&n3, name).is_some(), "no backup of {name}");
    }
    // Data intact everywhere, read through each node's own member.
    for n in [&n1, &n2, &n3] {
        let o = n.etcdctl(&["get", "--print-value-only", "/data/k"]);
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "v", "{}", n.name);
        let o = n.etcdctl(&["get", "--prefix", "--keys-only", "/data/round-"]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .count(),
            6,
            "{}",
            n.name
        );
    }
    // The tombstone metric counts this process's own start-time tombstone (the last round's).
    let (_, text) = n3.get_metrics("/metrics").unwrap();
    assert_eq!(
        member_support::metric(&text, "hostlet_tombstones_total"),
        Some(1.0)
    );
    assert_eq!(
        member_support::metric(&text, "hostlet_data_dir_backups"),
        Some(5.0)
    );
}
