//! `--cluster-reset` fails closed: while the other members may still form a quorum — right after this
//! node's agent stopped, while they elect a new leader, or while they are silent — it is refused, says why
//! and touches nothing. Only members shown down (their hosts refusing connections) or named lost on
//! purpose let it go ahead.
//!
//! `HOSTLET_RESET_TRIES=N` repeats the stop-then-reset case N times per role (default 2).

mod member_support;

use std::collections::BTreeMap;
use std::time::Duration;

use member_support::{
    db_entries, eventually, output_text, signal, three_voters, voters_named, Node,
};

/// Whether `n`'s own member is the leader, as its etcd says.
fn is_leader(n: &Node) -> Option<bool> {
    let o = n.etcdctl(&["endpoint", "status", "-w", "json"]);
    if !o.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let s = &v.get(0)?["Status"];
    let leader = s["leader"].as_u64()?;
    (leader != 0).then(|| s["header"]["member_id"].as_u64() == Some(leader))
}

/// The reason a refusal gives, in a word.
fn reason(text: &str) -> &'static str {
    if text.contains("still serves at") {
        "a leader lists this member"
    } else if text.contains("with no leader yet") {
        "a member in an election lists this member"
    } else if text.contains("answers but has no leader") {
        "a member answers without a leader"
    } else if text.contains("could not establish") {
        "members could not be shown down"
    } else {
        "other"
    }
}

/// Waits until every node records the three members' client URLs in `db/endpoints`: the members a reset
/// asks are the ones its node knows.
fn knows_all(nodes: &[&Node]) {
    eventually(
        "every node to know the three members",
        Duration::from_secs(30),
        || {
            nodes
                .iter()
                .all(|n| {
                    let known = std::fs::read_to_string(n.data_dir.join("db/endpoints"))
                        .unwrap_or_default();
                    nodes
                        .iter()
                        .all(|m| known.lines().any(|l| l.trim() == m.client_url()))
                })
                .then_some(())
        },
    );
}

fn tries() -> usize {
    std::env::var("HOSTLET_RESET_TRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

#[test]
fn a_reset_right_after_stopping_the_leader_or_a_follower_is_refused_every_time() {
    let (n1, n2, n3) = three_voters("refuse");
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    let mut nodes = [n1, n2, n3];
    knows_all(&[&nodes[0], &nodes[1], &nodes[2]]);
    let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for round in 0..tries() {
        for want_leader in [true, false] {
            let role = if want_leader { "leader" } else { "follower" };
            let i = eventually("a leader among the three", Duration::from_secs(60), || {
                nodes.iter().position(|n| is_leader(n) == Some(want_leader))
            });
            let n = &mut nodes[i];
            n.terminate(Duration::from_secs(60));
            let before = db_entries(n);
            let o = n.run_to_exit(&["--cluster-reset".to_string()], Duration::from_secs(90));
            let text = output_text(&o);
            assert_eq!(
                o.status.code(),
                Some(4),
                "round {round}: a reset of the {role} must be refused while two members hold a quorum: {text}"
            );
            let why = reason(&text);
            assert!(
                matches!(
                    why,
                    "a leader lists this member"
                        | "a member in an election lists this member"
                        | "a member answers without a leader"
                ),
                "round {round}, {role}: {text}"
            );
            assert_eq!(db_entries(n), before, "a refusal moved nothing");
            *seen.entry((role, why)).or_default() += 1;
            n.start(&[]);
            n.wait_ready(Duration::from_secs(90));
        }
    }
    eprintln!("refusals by role and reason: {seen:?}");
    eventually("the same three voters", Duration::from_secs(60), || {
        voters_named(&nodes[0], &names)
    });
}

#[test]
fn silent_members_refuse_a_reset_unless_named_lost() {
    let (mut n1, mut n2, mut n3) = three_voters("silent");
    knows_all(&[&n1, &n2, &n3]);
    let etcd2 = n2.etcd_pid().expect("n2's etcd");
    let etcd3 = n3.etcd_pid().expect("n3's etcd");
    n1.terminate(Duration::from_secs(60));
    // Paused: their sockets still accept connections, and nothing answers.
    signal(etcd2, "STOP");
    signal(etcd3, "STOP");
    let before = db_entries(&n1);
    let reset = |extra: &[String]| {
        let mut args = vec!["--cluster-reset".to_string()];
        args.extend_from_slice(extra);
        n1.run_to_exit(&args, Duration::from_secs(120))
    };
    let o = reset(&[]);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(4), "a refusal: {text}");
    assert!(
        text.contains("could not establish")
            && text.contains(&n2.client_url())
            && text.contains(&n3.client_url())
            && text.contains("--cluster-reset-lost"),
        "the refusal names both silent members and the way on: {text}"
    );
    // One named lost, the other still silent: still refused, naming only the other.
    let o = reset(&[format!("--cluster-reset-lost={}", n2.client_url())]);
    let text = output_text(&o);
    assert!(!o.status.success(), "{text}");
    let names_unsettled = text.split("could not establish").nth(1).unwrap_or("");
    let listed = names_unsettled
        .split(": a reset needs")
        .next()
        .unwrap_or("");
    assert!(
        listed.contains(&n3.client_url()) && !listed.contains(&n2.client_url()),
        "{text}"
    );
    assert_eq!(db_entries(&n1), before, "refusals moved nothing");

    // Both named lost on purpose: the reset goes ahead. The paused members are then put down for good,
    // as an operator would, so that they never serve beside the new cluster.
    let lost = format!(
        "--cluster-reset-lost={},{}",
        n2.client_url(),
        n3.client_url()
    );
    let o = reset(&[lost]);
    let text = output_text(&o);
    for (n, pid) in [(&mut n2, etcd2), (&mut n3, etcd3)] {
        n.kill();
        signal(pid, "KILL");
        signal(pid, "CONT");
    }
    assert!(o.status.success(), "{text}");
    assert!(text.contains("single-member cluster"), "{text}");
    n1.start(&[]);
    n1.wait_ready(Duration::from_secs(90));
}
