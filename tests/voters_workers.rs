//! Voters and workers with real agents and etcd on loopback ports: hosts beyond the voter target join as
//! workers (no etcd member) that run pods like any host; a dead voter is replaced by a worker that joins
//! as a learner first; a deleted voter's node is replaced; the target follows the cluster policy key live
//! (3 → 5 → 3) one change at a time with a writer that never waits long; an old voter that comes back
//! after its replacement is a worker, its member dir kept as a backup.

mod member_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use member_support::{
    backups, ca_keys_under, cli, docker_ids, join_args, members, metric, run_pod, status, stdout,
    wait_for_nodes, Cleanup, Node, OutageWriter,
};

const READY: Duration = Duration::from_secs(120);

/// A cluster of `n` hosts named `<prefix>-1..n`, started one after another, each ready before the next;
/// `extra` flags go to every host.
fn cluster(prefix: &str, n: usize, extra: &[String]) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    for i in 1..=n {
        let mut node = Node::new(&format!("{prefix}-{i}"));
        let mut args = extra.to_vec();
        if let Some(first) = nodes.first() {
            args.extend(join_args(first));
        }
        node.start(&args);
        node.wait_ready(READY);
        nodes.push(node);
    }
    nodes
}

fn is_worker(n: &Node) -> bool {
    n.data_dir.join("db/worker").exists() && n.etcd_pid().is_none()
}

/// The node names `hostlet node ls -o json` gives each role, asked through `via`.
fn roles(via: &Node) -> Vec<(String, String)> {
    let o = cli(via, &["node", "ls", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let mut out: Vec<(String, String)> = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    (
                        n["name"].as_str().unwrap_or("").to_string(),
                        n["currentRole"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Every line of the node's log (its re-executions write to the same file) that names the pod: what
/// was done to it, and when.
/// The lines of `node`'s log about pod `id`, with its informers' and every warning beside them: what a
/// failed "no pod restarted" needs to be told apart.
fn pod_story(node: &Node, id: &str) -> String {
    let log = node.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(id)
                || l.contains("informer")
                || l.contains(" WARN ")
                || l.contains(" ERROR ")
                || l.contains("etcd endpoints")
        })
        .collect();
    lines.join("\n")
}

fn running(node: &Node, id: &str) -> Option<()> {
    let s = status(node, id)?;
    (s["phase"] == "Running").then_some(())
}

fn restarts(node: &Node, id: &str) -> u64 {
    status(node, id)
        .and_then(|s| s["containers"][0]["restartCount"].as_u64())
        .unwrap_or(u64::MAX)
}

/// The voters' names (`None` while a learner exists or the member list cannot be read).
fn voter_names(via: &Node) -> Option<Vec<String>> {
    let m = members(via);
    if m.is_empty() || m.iter().any(|(_, learner)| *learner) {
        return None;
    }
    let mut v: Vec<String> = m.into_iter().map(|(n, _)| n).collect();
    v.sort();
    Some(v)
}

#[test]
fn seven_hosts_make_three_voters_and_four_workers_and_a_pod_runs_on_a_worker() {
    let _cleanup: Vec<Cleanup> = (1..=7).map(|i| Cleanup(format!("vw7-{i}"))).collect();
    let nodes = cluster("vw7", 7, &[]);
    let refs: Vec<&Node> = nodes.iter().collect();
    let voters = wait_for_nodes("3 voters", Duration::from_secs(60), &refs, || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    // The first three are the voters; the other four run no member.
    for (i, n) in nodes.iter().enumerate() {
        if i < 3 {
            assert!(voters.contains(&n.member_name()), "{} is a voter", n.name);
        } else {
            assert!(is_worker(n), "{} is a worker:\n{}", n.name, n.log_tail(40));
        }
    }
    let want: Vec<(String, String)> = (1..=7)
        .map(|i| {
            let role = if i <= 3 { "voter" } else { "worker" };
            (format!("vw7-{i}"), role.to_string())
        })
        .collect();
    // The CLI beside a worker finds the cluster through its data dir, and sees the same roles.
    assert_eq!(roles(&nodes[0]), want);
    assert_eq!(roles(&nodes[5]), want);
    let table = stdout(&cli(&nodes[5], &["node", "ls"]));
    assert!(table.contains("ROLE"), "{table}");

    // The leader's gauges: the target and the roles.
    wait_for_nodes(
        "the leader's role gauges",
        Duration::from_secs(30),
        &refs,
        || {
            nodes.iter().find_map(|n| {
                let (_, text) = n.get_metrics("/metrics")?;
                (metric(&text, "hostlet_etcd_is_leader") == Some(1.0)
                    && metric(&text, "hostlet_cluster_voters_target") == Some(3.0)
                    && metric(&text, "hostlet_nodes{role=\"worker\"}") == Some(4.0)
                    && metric(&text, "hostlet_nodes{role=\"voter\"}") == Some(3.0))
                .then_some(())
            })
        },
    );

    // A pod on a worker runs and reports its status like on any host.
    run_pod(&nodes[4], "vw7-web");
    wait_for_nodes(
        "the worker's pod running",
        Duration::from_secs(60),
        &refs,
        || running(&nodes[4], "vw7-web"),
    );
    assert_eq!(docker_ids("vw7-5", Some("vw7-web")).len(), 2);
    let events = stdout(&cli(&nodes[4], &["events", "-o", "json"]));
    assert!(events.contains("JoinedAsWorker"), "{events}");

    // The voter whose node API the worker uses dies: the worker's watches go on at another voter from
    // their revision (no relist), and a pod put afterwards reaches it.
    let voter_ports: Vec<u16> = nodes[..3].iter().map(|n| n.api_port).collect();
    let on_voter = |w: &Node| {
        let ports = w.connected_ports();
        (0..3).find(|i| ports.contains(&voter_ports[*i]))
    };
    let via = wait_for_nodes("the worker on a voter's node API", READY, &refs, || {
        on_voter(&nodes[4])
    });
    let relists = |w: &Node| {
        let (_, text) = w.get_metrics("/metrics")?;
        metric(&text, "hostlet_informer_relists_total{informer=\"pods\"}")
    };
    let before = relists(&nodes[4]);
    assert!(
        before.is_some(),
        "the worker's pods informer reports relists"
    );
    let mut nodes = nodes;
    nodes[via].kill();
    let living: Vec<&Node> = nodes.iter().filter(|n| n.child.is_some()).collect();
    run_pod(&nodes[4], "vw7-after");
    wait_for_nodes(
        "the worker's second pod running",
        Duration::from_secs(60),
        &living,
        || running(&nodes[4], "vw7-after"),
    );
    let now = wait_for_nodes("the worker on another voter", READY, &living, || {
        on_voter(&nodes[4]).filter(|i| *i != via)
    });
    assert_ne!(now, via);
    assert_eq!(
        relists(&nodes[4]),
        before,
        "the worker's pods informer relisted after its voter died:\n{}",
        pod_story(&nodes[4], "vw7-after")
    );
}

#[test]
fn a_killed_voter_is_replaced_by_a_worker_and_comes_back_as_a_worker() {
    let _cleanup: Vec<Cleanup> = (1..=4).map(|i| Cleanup(format!("vwk-{i}"))).collect();
    let flags = vec!["--voter-replace-after=20s".to_string()];
    let mut nodes = cluster("vwk", 4, &flags);
    wait_for_nodes("3 voters", Duration::from_secs(60), &[&nodes[0]], || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    assert!(is_worker(&nodes[3]));
    let ca = nodes[0].tls_file("ca.crt");
    assert_eq!(
        ca_keys_under(&nodes[3].data_dir, &ca),
        Vec::<PathBuf>::new()
    );
    for voter in &nodes[..3] {
        member_support::assert_no_pair_opens_etcd(&nodes[3], voter);
    }
    // It joined with the server token but keeps a worker token of its own: the server token, which makes
    // voters, stays on the voters.
    let kept = nodes[3].token();
    assert_ne!(kept, nodes[0].token());
    assert!(
        kept.split("::")
            .last()
            .is_some_and(|s| s.starts_with("wt.")),
        "{kept}"
    );
    // Pods on a voter that stays and on the worker that will become a voter.
    run_pod(&nodes[0], "vwk-a");
    run_pod(&nodes[3], "vwk-b");
    wait_for_nodes(
        "both pods running",
        Duration::from_secs(60),
        &[&nodes[0], &nodes[3]],
        || running(&nodes[0], "vwk-a").and(running(&nodes[3], "vwk-b")),
    );
    let containers_a = docker_ids("vwk-1", Some("vwk-a"));
    let containers_b = docker_ids("vwk-4", Some("vwk-b"));
    for i in 0..20 {
        let o = nodes[0].etcdctl(&["put", &format!("/vwk/k{i}"), &format!("v{i}")]);
        assert!(o.status.success());
    }

    let old_name = nodes[2].member_name();
    let etcd3 = nodes[2].etcd_pid().expect("the voter's etcd");
    nodes[2].kill();
    wait_for_nodes(
        "the killed voter's etcd gone",
        Duration::from_secs(10),
        &[],
        || (!member_support::alive(etcd3)).then_some(()),
    );
    let killed = Instant::now();
    // The lease lapses after 40 s; 20 s later the replacement starts; it must be done within 60 s of that.
    let replaced = wait_for_nodes(
        "3 voters without the dead one",
        Duration::from_secs(40 + 20 + 60),
        &[&nodes[0], &nodes[1], &nodes[3]],
        || {
            let v = voter_names(&nodes[0])?;
            (v.len() == 3
                && !v.contains(&old_name)
                && nodes[3].data_dir.join("db/etcd/name").exists())
            .then_some(v)
        },
    );
    eprintln!("replaced {:?} after the kill", killed.elapsed());
    assert!(replaced.contains(&nodes[3].member_name()));
    // A member admits joiners: it got the CA key with its member request.
    assert_eq!(
        ca_keys_under(&nodes[3].data_dir, &ca),
        vec![nodes[3].tls_file("ca.key")]
    );
    for i in 0..20 {
        let o = nodes[3].etcdctl(&["get", "--print-value-only", &format!("/vwk/k{i}")]);
        assert_eq!(stdout(&o).trim(), format!("v{i}"));
    }
    // No pod restarted: the voter's pod untouched, the new voter's pod adopted across its restart.
    wait_for_nodes("the new voter ready", READY, &[&nodes[3]], || {
        nodes[3].is_ready().then_some(())
    });
    assert_eq!(
        docker_ids("vwk-1", Some("vwk-a")),
        containers_a,
        "{}",
        pod_story(&nodes[0], "vwk-a")
    );
    assert_eq!(
        docker_ids("vwk-4", Some("vwk-b")),
        containers_b,
        "{}",
        pod_story(&nodes[3], "vwk-b")
    );
    assert_eq!(restarts(&nodes[0], "vwk-a"), 0);
    wait_for_nodes(
        "the adopted pod's status",
        Duration::from_secs(30),
        &[&nodes[3]],
        || running(&nodes[3], "vwk-b"),
    );
    assert_eq!(restarts(&nodes[3], "vwk-b"), 0);
    let leader_metrics: f64 = nodes
        .iter()
        .filter_map(|n| n.get_metrics("/metrics"))
        .filter_map(|(_, t)| metric(&t, "hostlet_voter_replacements_total{result=\"success\"}"))
        .sum();
    assert_eq!(leader_metrics, 1.0);

    // The old voter starts again: the cluster moved on, so it backs its member up and is a worker.
    let args = join_args(&nodes[0]);
    let mut all = flags.clone();
    all.extend(args);
    nodes[2].start(&all);
    nodes[2].wait_ready(READY);
    assert!(is_worker(&nodes[2]), "{}", nodes[2].log_tail(60));
    // Back as a worker, it holds the CA key no more.
    assert_eq!(
        ca_keys_under(&nodes[2].data_dir, &ca),
        Vec::<PathBuf>::new()
    );
    let kept = backups(&nodes[2]);
    assert!(
        kept.iter()
            .any(|b| std::fs::read_to_string(b.join("name")).is_ok_and(|n| n.trim() == old_name)),
        "{kept:?}"
    );
    assert_eq!(voter_names(&nodes[0]).map(|v| v.len()), Some(3));
}

#[test]
fn deleting_a_voters_node_replaces_it_and_deleting_a_workers_moves_no_member() {
    let _cleanup: Vec<Cleanup> = (1..=5).map(|i| Cleanup(format!("vwd-{i}"))).collect();
    let nodes = cluster("vwd", 5, &[]);
    let refs: Vec<&Node> = nodes.iter().collect();
    let before = wait_for_nodes("3 voters", Duration::from_secs(60), &refs, || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    // A worker's node record deleted: member removal looks, and the membership stays.
    let removals = |n: &Node| {
        n.get_metrics("/metrics")
            .and_then(|(_, t)| {
                metric(
                    &t,
                    "hostlet_reconcile_total{controller=\"member-removal\",result=\"success\"}",
                )
            })
            .unwrap_or(0.0)
    };
    let seen: f64 = nodes[..3].iter().map(removals).sum();
    let o = cli(&nodes[0], &["node", "delete", "vwd-5"]);
    let said = member_support::output_text(&o);
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("no etcd member (a worker)") && !said.contains("member is being removed"),
        "a worker's deletion says what it does: {said}"
    );
    wait_for_nodes(
        "member removal to look at the deleted worker",
        Duration::from_secs(30),
        &refs,
        || (nodes[..3].iter().map(removals).sum::<f64>() > seen).then_some(()),
    );
    assert_eq!(voter_names(&nodes[0]), Some(before.clone()));

    // A voter's node record deleted: replaced as a dead voter is. A worker joins as a learner and
    // catches up, then the voter is removed (by voter placement, not member removal) and the learner
    // promoted.
    let gone = nodes[2].member_name();
    let o = cli(&nodes[0], &["node", "delete", "vwd-3"]);
    let said = member_support::output_text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("removes its voter"), "{said}");
    let after = wait_for_nodes("3 voters again", Duration::from_secs(120), &refs, || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3 && !v.contains(&gone))
    });
    assert_ne!(after, before);
    let events = stdout(&cli(&nodes[0], &["events", "-o", "json"]));
    let reasons: Vec<String> = serde_json::from_str::<serde_json::Value>(&events)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            Some(format!(
                "{} {}",
                e["reason"].as_str()?,
                e["message"].as_str()?
            ))
        })
        .collect();
    let pos = |what: &str| {
        reasons
            .iter()
            .position(|r| r.starts_with(what) && r.contains(&gone))
    };
    let requested = reasons
        .iter()
        .position(|r| r.starts_with("VoterRequested") && r.contains("node record was deleted"));
    let (Some(requested), Some(replaced)) = (requested, pos("VoterReplaced")) else {
        panic!(
            "no VoterRequested for the deleted node, or no VoterReplaced of {gone}: {reasons:#?}"
        );
    };
    assert!(pos("MemberRemoved").is_none(), "{reasons:#?}");
    // Events are listed oldest first.
    assert!(requested < replaced, "{reasons:#?}");
}

#[test]
fn the_target_goes_3_5_3_live_one_change_at_a_time_without_losing_quorum() {
    let _cleanup: Vec<Cleanup> = (1..=5).map(|i| Cleanup(format!("vwt-{i}"))).collect();
    let nodes = cluster("vwt", 5, &[]);
    let refs: Vec<&Node> = nodes.iter().collect();
    wait_for_nodes("3 voters", Duration::from_secs(60), &refs, || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    // A writer putting a key every 100 ms through the first three voters; the longest run of failures.
    let endpoints: Vec<String> = nodes[..3].iter().map(|n| n.client_url()).collect();
    let writer = OutageWriter::start(&nodes[0], &endpoints, "/vwt/");
    let most_learners = |n: &Node| members(n).iter().filter(|(_, l)| *l).count();
    let mut learners_seen = 0;

    let o = nodes[0].etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 5}"#]);
    assert!(o.status.success());
    wait_for_nodes("5 voters", Duration::from_secs(180), &refs, || {
        learners_seen = learners_seen.max(most_learners(&nodes[0]));
        voter_names(&nodes[0]).filter(|v| v.len() == 5)
    });
    assert!(nodes.iter().all(|n| !is_worker(n)));

    let o = nodes[0].etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 3}"#]);
    assert!(o.status.success());
    let three = wait_for_nodes("3 voters again", Duration::from_secs(180), &refs, || {
        learners_seen = learners_seen.max(most_learners(&nodes[0]));
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    // The newest two left (the first three remain) and carry on as workers, their member dirs backed up.
    for n in &nodes[..3] {
        assert!(three.contains(&n.member_name()), "{} stays a voter", n.name);
    }
    for n in &nodes[3..] {
        wait_for_nodes("the leaver is a worker", READY, &[n], || {
            (is_worker(n) && n.is_ready()).then_some(())
        });
        assert!(!backups(n).is_empty(), "{} backed up its member", n.name);
    }
    let worst = writer.finish();
    eprintln!("longest write outage {worst:?}; most learners at once {learners_seen}");
    assert!(learners_seen <= 1);
    assert!(
        worst < Duration::from_secs(5),
        "writes failed for {worst:?}"
    );
}

#[test]
fn the_first_node_sets_the_target_and_roles_can_be_pinned() {
    let _cleanup: Vec<Cleanup> = (1..=3).map(|i| Cleanup(format!("vwp-{i}"))).collect();
    // A target that is not 1, 3, 5 or 7 is refused before anything starts, naming the flag.
    let n0 = Node::new("vwp-0");
    let o = n0.run_to_exit(&["--etcd-voters=4".to_string()], Duration::from_secs(30));
    assert!(!o.status.success());
    let said = member_support::output_text(&o);
    assert!(
        said.contains("--etcd-voters") && said.contains("1, 3, 5, 7"),
        "{said}"
    );
    // A worker cannot found a cluster.
    let o = n0.run_to_exit(&["--role=worker".to_string()], Duration::from_secs(30));
    assert!(!o.status.success());
    assert!(member_support::output_text(&o).contains("--role worker"));
    assert!(!n0.data_dir.join("db/etcd").exists());

    let mut n1 = Node::new("vwp-1");
    n1.start(&["--etcd-voters=1".to_string()]);
    n1.wait_ready(READY);
    let policy = n1.etcdctl(&["get", "--print-value-only", "/hostlet/config/cluster"]);
    assert_eq!(stdout(&policy).trim(), r#"{"voters":1}"#);
    // Auto beyond a target of one: a worker.
    let mut n2 = Node::new("vwp-2");
    n2.start(&join_args(&n1));
    n2.wait_ready(READY);
    assert!(is_worker(&n2));
    // Pinned as a voter: it joins although the target is met, and counts towards it, so the founding
    // voter (not pinned) is the one to leave: it goes on as a worker, its member dir backed up.
    let mut n3 = Node::new("vwp-3");
    let mut args = join_args(&n1);
    args.push("--role=voter".to_string());
    n3.start(&args);
    n3.wait_ready(READY);
    let one = wait_for_nodes(
        "the pinned voter alone",
        Duration::from_secs(60),
        &[&n1, &n3],
        || voter_names(&n3).filter(|v| v.len() == 1),
    );
    assert_eq!(one, [n3.member_name()]);
    wait_for_nodes("the founder a worker", READY, &[&n1], || {
        (is_worker(&n1) && n1.is_ready()).then_some(())
    });
    assert!(!backups(&n1).is_empty(), "vwp-1 backed up its member");

    // A policy that does not parse stops every change: no worker is asked, nobody leaves.
    let o = n3.etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 4}"#]);
    assert!(o.status.success());
    wait_for_nodes(
        "the invalid policy seen",
        Duration::from_secs(30),
        &[&n3],
        || {
            let (_, text) = n3.get_metrics("/metrics")?;
            (metric(
                &text,
                "hostlet_informer_events_total{informer=\"cluster-policy\",type=\"invalid\"}",
            )? >= 1.0)
                .then_some(())
        },
    );
    assert_eq!(voter_names(&n3), Some(one));
    assert!(is_worker(&n1) && is_worker(&n2));
    let o = n3.etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 3}"#]);
    assert!(o.status.success());
    // With a valid target of three again, both workers become members.
    wait_for_nodes(
        "three voters",
        Duration::from_secs(120),
        &[&n1, &n2, &n3],
        || voter_names(&n3).filter(|v| v.len() == 3),
    );
    assert!(!is_worker(&n1) && !is_worker(&n2));
    let events = stdout(&cli(&n2, &["events", "-o", "json"]));
    assert!(events.contains("BecameMember"), "{events}");
}

/// The serial of the certificate at `path`.
fn serial(path: &std::path::Path) -> String {
    hostlet_controllers::pki::serial_of(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn voters_renew_their_certificates_without_a_restart_and_their_etcd_keeps_its_peers() {
    use hostlet_controllers::pki::not_after;
    let _cleanup = Cleanup("vrn-1".to_string());
    let flags = vec!["--cert-lifetime=2m".to_string()];
    let nodes = cluster("vrn", 3, &flags);
    wait_for_nodes("3 voters", READY, &[&nodes[0]], || {
        voter_names(&nodes[0]).filter(|v| v.len() == 3)
    });
    run_pod(&nodes[0], "vrn-a");
    wait_for_nodes("the pod running", READY, &[&nodes[0]], || {
        (status(&nodes[0], "vrn-a")?["phase"] == "Running").then_some(())
    });
    let containers = docker_ids("vrn-1", Some("vrn-a"));
    let pids: Vec<u32> = nodes.iter().map(|n| n.pid()).collect();
    let etcd_pids: Vec<Option<u32>> = nodes.iter().map(|n| n.etcd_pid()).collect();
    let first: Vec<String> = nodes
        .iter()
        .map(|n| serial(&n.tls_file("client.crt")))
        .collect();
    // The latest first expiry of the three: past it, no certificate issued at the start is valid.
    let expiry = nodes
        .iter()
        .flat_map(|n| ["server.crt", "peer.crt", "client.crt"].map(|f| n.tls_file(f)))
        .map(|p| not_after(&std::fs::read(p).unwrap()).unwrap())
        .max()
        .unwrap();
    let left = expiry
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    wait_for_nodes(
        "every voter's certificates renewed and the first ones expired",
        left + Duration::from_secs(30),
        &nodes.iter().collect::<Vec<_>>(),
        || {
            let renewed = nodes
                .iter()
                .zip(&first)
                .all(|(n, s)| serial(&n.tls_file("client.crt")) != *s);
            (renewed && std::time::SystemTime::now() > expiry + Duration::from_secs(2))
                .then_some(())
        },
    );
    // Each etcd takes new connections with the renewed certificates, and each agent still reads and
    // writes: a key put through every voter's agent-side files, the CLI through every agent's data dir.
    for (i, n) in nodes.iter().enumerate() {
        let key = format!("/vrn/{i}");
        let o = n.etcdctl(&["put", &key, "x"]);
        assert!(o.status.success(), "{}", member_support::output_text(&o));
        let o = cli(n, &["node", "ls"]);
        assert!(o.status.success(), "{}", member_support::output_text(&o));
    }
    // A killed etcd comes back and meets its peers again over new peer connections.
    let killed = nodes[2].etcd_pid().unwrap();
    member_support::signal(killed, "KILL");
    wait_for_nodes(
        "the third voter's etcd back and a voter",
        READY,
        &nodes.iter().collect::<Vec<_>>(),
        || {
            let back = nodes[2].etcd_pid().filter(|p| *p != killed)?;
            let o = nodes[2].etcdctl(&["endpoint", "health", "--cluster"]);
            // etcdctl 3.4 writes the answers to stderr, 3.5 to stdout.
            let text = member_support::output_text(&o);
            (o.status.success() && text.matches("is healthy").count() == 3).then_some(back)
        },
    );
    wait_for_nodes(
        "every voter ready",
        READY,
        &nodes.iter().collect::<Vec<_>>(),
        || nodes.iter().all(|n| n.is_ready()).then_some(()),
    );
    assert_eq!(
        nodes.iter().map(|n| n.pid()).collect::<Vec<_>>(),
        pids,
        "no agent restarted"
    );
    assert_eq!(
        nodes[..2].iter().map(|n| n.etcd_pid()).collect::<Vec<_>>(),
        etcd_pids[..2].to_vec(),
        "no etcd restarted but the one killed"
    );
    assert_eq!(docker_ids("vrn-1", Some("vrn-a")), containers);
    run_pod(&nodes[0], "vrn-b");
    wait_for_nodes("a later pod running", READY, &[&nodes[0]], || {
        (status(&nodes[0], "vrn-b")?["phase"] == "Running").then_some(())
    });
}
