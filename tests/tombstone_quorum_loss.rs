//! Two of three nodes lost: `--cluster-reset` on the survivor makes a single member with all the data (its
//! own, or a snapshot's); the other two, started again on their old data, find that the cluster moved on
//! without them, back their member dirs up and rejoin the survivor — nobody deletes a file.
//!
//! One of them comes back before the survivor does, so nothing can stop its etcd from starting on the old
//! data: the agent finds out by asking the survivor while its etcd waits for a quorum; after a reset from
//! the member's own data the survivor may turn that etcd away first, and etcd exits saying it was removed. The other comes back after the survivor and is told before
//! its etcd starts.

mod member_support;

use std::time::{Duration, Instant};

use member_support::{
    backup_of, backups, db_entries, join_args, members, output_text, three_voters, voters_named,
    wait_for_nodes, Node,
};

/// The values under `/data/`, read through `n`'s own member.
fn data(n: &Node) -> Vec<String> {
    let o = n.etcdctl(&["get", "--prefix", "/data/", "--print-value-only"]);
    assert!(o.status.success(), "{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn member_name_of(n: &Node) -> Option<String> {
    std::fs::read_to_string(n.data_dir.join("db/etcd/name"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether an event of `reason` about node `about` mentions `needle`, read through `via`.
fn has_event(via: &Node, about: &str, reason: &str, needle: &str) -> bool {
    let o = via.etcdctl(&[
        "get",
        &format!("/hostlet/events/{about}/"),
        "--prefix",
        "--print-value-only",
    ]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|e| e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(needle)))
}

/// Waits until n2 and n3 are voters of n1's cluster again as new members (not `old`), serve, and hold
/// `want` (the survivor's data, or the snapshot's), read through each node's own member.
fn rejoined(n1: &Node, n2: &mut Node, n3: &mut Node, old: [&String; 3], want: &[String]) {
    let (new2, new3) = wait_for_nodes(
        "n2 and n3 to rejoin the survivor as new voters",
        Duration::from_secs(150),
        &[n1, n2, n3],
        || {
            let (a, b) = (member_name_of(n2)?, member_name_of(n3)?);
            (a != *old[1]
                && b != *old[2]
                && voters_named(n1, &[old[0].clone(), a.clone(), b.clone()]).is_some())
            .then_some((a, b))
        },
    );
    assert_ne!(new2, new3);
    n2.wait_ready(Duration::from_secs(60));
    n3.wait_ready(Duration::from_secs(60));
    for n in [n1, &*n2, &*n3] {
        assert_eq!(data(n), want, "{}", n.name);
    }
}

/// The whole scenario; `from_snapshot` resets from a snapshot taken before the loss (a key written after
/// it must then be gone) instead of from the survivor's own data.
fn lose_two_reset_and_rejoin(prefix: &str, from_snapshot: bool) {
    let (mut n1, mut n2, mut n3) = three_voters(prefix);
    for i in 0..20 {
        let o = n1.etcdctl(&["put", &format!("/data/{i:02}"), &format!("v{i}")]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    let mut want: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    let mut reset = vec!["--cluster-reset".to_string()];
    if from_snapshot {
        let snap = n1.dir.join("before-the-loss.db");
        let o = n1.etcdctl(&["snapshot", "save", snap.to_str().unwrap()]);
        assert!(o.status.success(), "{}", output_text(&o));
        reset.push(format!("--cluster-reset-restore-path={}", snap.display()));
    }
    let o = n1.etcdctl(&["put", "/data/zz", "after-the-snapshot"]);
    assert!(o.status.success(), "{}", output_text(&o));
    if !from_snapshot {
        want.push("after-the-snapshot".to_string());
    }
    let (old1, old2, old3) = (n1.member_name(), n2.member_name(), n3.member_name());
    let join_n1 = join_args(&n1);

    if from_snapshot {
        // While n2 and n3 still hold a quorum, a reset of n1 would split the cluster: refused, nothing
        // moved, and n1 serves again as the member it was.
        n1.terminate(Duration::from_secs(60));
        let before = db_entries(&n1);
        let o = n1.run_to_exit(&reset, Duration::from_secs(90));
        assert!(!o.status.success(), "{}", output_text(&o));
        let text = output_text(&o);
        assert!(
            text.contains("still serves at") && text.contains("split it in two"),
            "{text}"
        );
        assert_eq!(db_entries(&n1), before);
        n1.start(&[]);
        n1.wait_ready(Duration::from_secs(60));
        assert_eq!(n1.member_name(), old1);
        voters_named(&n1, &[old1.clone(), old2.clone(), old3.clone()])
            .expect("n1 is a voter of the same three");
    }

    // n2 and n3 are gone (their etcd dies with their agent); n1 has no quorum any more.
    n2.kill();
    n3.kill();
    n1.terminate(Duration::from_secs(60));
    let o = n1.run_to_exit(&reset, Duration::from_secs(90));
    assert!(o.status.success(), "{}", output_text(&o));

    // n3 comes back first, with no flags, while the survivor is still down: its etcd starts on the old
    // data and waits for a quorum.
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
    // n2 comes back after the survivor, with the flags it was first started with.
    n2.start(&join_n1);
    let restarted = Instant::now();
    rejoined(&n1, &mut n2, &mut n3, [&old1, &old2, &old3], &want);
    eprintln!(
        "from_snapshot={from_snapshot}: both lost nodes voters again {:?} after the second came back",
        restarted.elapsed()
    );
    // Nothing deleted: the survivor's member dir is in place (or moved aside whole, for a restore), and
    // each lost node's old member dir is kept whole in a backup.
    if from_snapshot {
        let old: Vec<_> = std::fs::read_dir(n1.data_dir.join("db"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("etcd-old-"))
            .collect();
        assert_eq!(old.len(), 1);
        assert!(old[0].path().join("member/wal").is_dir());
    }
    assert!(n1.data_dir.join("db/etcd/member/wal").is_dir());
    for (n, old) in [(&n2, &old2), (&n3, &old3)] {
        assert_eq!(backups(n).len(), 1, "{}", n.name);
        assert!(
            backup_of(n, old).is_some(),
            "{}: no backup holds member {old}",
            n.name
        );
    }
    let log3 = n3.log();
    // Asked while its etcd waited (not before it started: the survivor was down then). After a reset
    // from its own data the survivor may also turn n3's etcd away first, which then exits saying so;
    // whichever comes first starts the rejoin.
    let asked = "no longer has member";
    let exited = "etcd exited saying the cluster removed this member";
    let hows: &[&str] = if from_snapshot {
        &[asked]
    } else {
        &[asked, exited]
    };
    assert!(
        log3.lines()
            .any(|l| l.contains("tombstoning the member and rejoining")
                && hows.iter().any(|h| l.contains(h))),
        "n3 should have learnt it by one of {hows:?}"
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
    // Each rejoin is told as an event naming the old member.
    for (n, old) in [(&n2, &old2), (&n3, &old3)] {
        wait_for_nodes("the Rejoined event", Duration::from_secs(30), &[n], || {
            has_event(&n1, &n.name, "Rejoined", old).then_some(())
        });
    }
}

#[test]
fn two_lost_nodes_rejoin_the_survivor_reset_from_its_own_data_without_anyone_deleting_files() {
    lose_two_reset_and_rejoin("lost", false);
}

#[test]
fn two_lost_nodes_rejoin_the_survivor_reset_from_a_snapshot_without_anyone_deleting_files() {
    lose_two_reset_and_rejoin("restored", true);
}

/// Both lost nodes come back before the survivor: nothing can tell them yet that the cluster moved on,
/// so they form a quorum of the old cluster and serve. Once the survivor is back they learn it — reset
/// from a snapshot, it serves another cluster id; reset from its own data, it turns their messages away
/// and their etcd exits saying it was removed — back up and rejoin it; what they served meanwhile stays
/// in their backups.
fn back_before_the_survivor(prefix: &str, from_snapshot: bool) {
    let (mut n1, mut n2, mut n3) = three_voters(prefix);
    for i in 0..10 {
        let o = n1.etcdctl(&["put", &format!("/data/{i:02}"), &format!("v{i}")]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    let want: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let snap = n1.dir.join("before-the-loss.db");
    let o = n1.etcdctl(&["snapshot", "save", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
    let (old1, old2, old3) = (n1.member_name(), n2.member_name(), n3.member_name());

    n2.kill();
    n3.kill();
    n1.terminate(Duration::from_secs(60));
    let mut args = vec!["--cluster-reset".to_string()];
    if from_snapshot {
        args.push(format!("--cluster-reset-restore-path={}", snap.display()));
    }
    let o = n1.run_to_exit(&args, Duration::from_secs(90));
    assert!(o.status.success(), "{}", output_text(&o));

    // n2 and n3 return first and serve the old cluster between them.
    n3.start(&[]);
    n2.start(&[]);
    n2.wait_ready(Duration::from_secs(60));
    n3.wait_ready(Duration::from_secs(60));
    let o = n2.etcdctl(&["put", "/data/zz-stale", "written-while-split"]);
    assert!(o.status.success(), "{}", output_text(&o));

    n1.start(&[]);
    n1.wait_ready(Duration::from_secs(60));
    let back = Instant::now();
    rejoined(&n1, &mut n2, &mut n3, [&old1, &old2, &old3], &want);
    eprintln!(
        "both nodes left behind voters of the survivor's cluster {:?} after it came back",
        back.elapsed()
    );
    for (n, old) in [(&n2, &old2), (&n3, &old3)] {
        assert!(
            backup_of(n, old).is_some(),
            "{}: no backup holds member {old}",
            n.name
        );
    }
    let told = if from_snapshot {
        "serves a cluster made anew"
    } else {
        "etcd exited saying the cluster removed this member"
    };
    assert!(
        n2.log().contains(told) || n3.log().contains(told),
        "one of them learnt it by: {told}"
    );
}

#[test]
fn lost_nodes_back_before_the_survivor_reset_from_a_snapshot_rejoin_it_once_it_serves() {
    back_before_the_survivor("early-snap", true);
}

#[test]
fn lost_nodes_back_before_the_survivor_reset_from_its_own_data_rejoin_it_once_it_serves() {
    back_before_the_survivor("early-own", false);
}
