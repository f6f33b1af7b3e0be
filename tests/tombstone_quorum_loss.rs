//! Two of three nodes lost: `--cluster-reset` on the survivor makes a single member with all the data; the
//! other two, started again on their old data, find that the cluster moved on without them (one from the
//! survivor before its etcd starts, one from etcd's own exit when the survivor turns it away), back their
//! member dirs up and rejoin the survivor — nobody deletes a file.

mod member_support;

use std::time::Duration;

use member_support::{
    backup_of, backups, join_args, members, output_text, three_voters, voters_named, wait_for_nodes,
};

#[test]
fn two_lost_nodes_rejoin_the_reset_survivor_without_anyone_deleting_files() {
    let (mut n1, mut n2, mut n3) = three_voters("lost");
    for i in 0..20 {
        let o = n1.etcdctl(&["put", &format!("/data/{i:02}"), &format!("v{i}")]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    let (old1, old2, old3) = (n1.member_name(), n2.member_name(), n3.member_name());
    let join_n1 = join_args(&n1);

    // n2 and n3 are gone (their etcd dies with their agent); n1 has no quorum any more.
    n2.kill();
    n3.kill();
    n1.terminate(Duration::from_secs(60));
    let o = n1.run_to_exit(&["--cluster-reset".to_string()], Duration::from_secs(90));
    assert!(o.status.success(), "{}", output_text(&o));

    // n3 comes back first, with no flags, while the survivor is still down: nobody can tell it that the
    // cluster moved on, so its etcd starts on the old data and waits.
    n3.start(&[]);
    wait_for_nodes(
        "n3's etcd to start",
        Duration::from_secs(30),
        &[&n3],
        || n3.log().contains("how=Restart").then_some(()),
    );
    n1.start(&[]);
    n1.wait_ready(Duration::from_secs(60));
    assert!(members(&n1).contains(&(old1.clone(), false)));
    assert!(
        n1.data_dir.join("db/etcd/member/wal").is_dir(),
        "the survivor keeps its own member dir"
    );
    // n2 comes back with the flags it was first started with, after the survivor: it is told before
    // its etcd starts. Both rejoin by themselves.
    n2.start(&join_n1);
    let new_names = wait_for_nodes(
        "n2 and n3 to rejoin as new voters",
        Duration::from_secs(150),
        &[&n1, &n2, &n3],
        || {
            let name = |n: &member_support::Node| {
                std::fs::read_to_string(n.data_dir.join("db/etcd/name"))
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            };
            let (a, b) = (name(&n2)?, name(&n3)?);
            (a != old2
                && b != old3
                && voters_named(&n1, &[old1.clone(), a.clone(), b.clone()]).is_some())
            .then_some((a, b))
        },
    );
    n2.wait_ready(Duration::from_secs(60));
    n3.wait_ready(Duration::from_secs(60));

    // All the data, read through each node's own member.
    for n in [&n1, &n2, &n3] {
        let o = n.etcdctl(&["get", "--prefix", "/data/", "--print-value-only"]);
        assert!(o.status.success(), "{}", output_text(&o));
        let values: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        let want: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
        assert_eq!(values, want, "{}", n.name);
    }
    // Nothing deleted: each old member dir is kept whole in a backup.
    for (n, old) in [(&n2, &old2), (&n3, &old3)] {
        assert_eq!(backups(n).len(), 1, "{}", n.name);
        assert!(
            backup_of(n, old).is_some(),
            "{}: no backup holds member {old}",
            n.name
        );
    }
    let log3 = n3.log();
    assert!(
        log3.contains("etcd exited saying the cluster removed this member"),
        "n3 learnt it from etcd's exit"
    );
    assert!(
        log3.contains("rejoining through a node found in the node records"),
        "n3 had no --server: it found one itself"
    );
    assert!(
        n2.log()
            .contains("this member's cluster moved on without it"),
        "n2 learnt it from the survivor before its etcd started"
    );
    assert_ne!(new_names.0, new_names.1);
    // Each rejoin is told as an event naming the old member and its backup.
    for (n, old) in [(&n2, &old2), (&n3, &old3)] {
        wait_for_nodes("the Rejoined event", Duration::from_secs(30), &[n], || {
            let o = n1.etcdctl(&[
                "get",
                &format!("/hostlet/events/{}/", n.name),
                "--prefix",
                "--print-value-only",
            ]);
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|e| {
                    e["reason"] == "Rejoined"
                        && e["message"]
                            .as_str()
                            .is_some_and(|m| m.contains(old.as_str()))
                })
                .then_some(())
        });
    }
}
