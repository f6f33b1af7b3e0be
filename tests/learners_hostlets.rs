//! Several `hostlet run` processes on loopback ports, each with its own etcd: learners promoted without any
//! operator action, and a deleted node's member removed.

mod member_support;

use std::time::Duration;

use member_support::*;

const READY: Duration = Duration::from_secs(60);

/// The member id (hex, as etcd prints it) of member `name`, asked through `via`.
fn member_id(via: &Node, name: &str) -> String {
    let o = via.etcdctl(&["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .and_then(|m| m["ID"].as_u64())
        .map(|id| format!("{id:x}"))
        .unwrap_or_else(|| panic!("no member {name}: {v}"))
}

fn voters(via: &Node) -> usize {
    members(via).iter().filter(|(_, learner)| !learner).count()
}

/// Events with this reason, as (node, message), read through `via`.
fn events(via: &Node, reason: &str) -> Vec<(String, String)> {
    let o = via.etcdctl(&["get", "/hostlet/events/", "--prefix", "--print-value-only"]);
    stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            (
                e["node"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Writes about `mb` MiB in 100 KiB values through `via`'s member, with its client certificate.
fn fill(via: &Node, mb: usize) {
    use hostlet_runtime::{Etcd, EtcdConfig, TlsFiles};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = EtcdConfig::new([via.client_url()]).with_tls(TlsFiles {
            ca: via.tls_file("ca.crt"),
            cert: via.tls_file("client.crt"),
            key: via.tls_file("client.key"),
        });
        let etcd = Etcd::connect(cfg).await.unwrap();
        let value = vec![b'x'; 100 * 1024];
        let mut tasks = Vec::new();
        for w in 0..4 {
            let etcd = etcd.clone();
            let value = value.clone();
            tasks.push(tokio::spawn(async move {
                for i in (w..mb * 10).step_by(4) {
                    etcd.put(format!("/fill/{i:06}"), &value).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn three_hostlets_started_one_after_another_become_three_voters() {
    let (n1, n2, n3) = three_voters("n");
    let promoted = events(&n1, "LearnerPromoted");
    assert_eq!(promoted.len(), 2, "{promoted:?}");
    for n in [&n1, &n2, &n3] {
        eventually(
            &format!("{} to know it is a voter", n.name),
            Duration::from_secs(10),
            || {
                let (_, text) = n.get_metrics("/metrics")?;
                (metric(&text, "hostlet_etcd_is_learner") == Some(0.0)).then_some(())
            },
        );
    }
    // Whoever led counted both promotions.
    let counted: f64 = [&n1, &n2, &n3]
        .iter()
        .map(|n| {
            let (_, text) = n.get_metrics("/metrics").unwrap();
            metric(&text, "hostlet_learner_promotions_total").unwrap_or(0.0)
        })
        .sum();
    assert_eq!(counted, 2.0);
}

#[test]
fn with_60mb_a_fourth_joins_and_is_promoted_with_its_progress_recorded() {
    let (n1, n2, n3) = three_voters("n");
    // Room for a fourth voter (the default target is three).
    assert!(n1
        .etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 5}"#])
        .status
        .success());
    fill(&n1, 60);
    // Every write of the progress record, in order, while the fourth catches up.
    let mut watch = std::process::Command::new(hostlet_runtime::testkit::etcd_program("etcdctl"));
    watch
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", n1.client_url()))
        .arg(format!("--cacert={}", n1.tls_file("ca.crt").display()))
        .arg(format!("--cert={}", n1.tls_file("client.crt").display()))
        .arg(format!("--key={}", n1.tls_file("client.key").display()))
        .args(["watch", "/hostlet/etcd/learner-progress"])
        .stdout(std::process::Stdio::piped());
    let mut watcher = watch.spawn().unwrap();
    let out = watcher.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let mut n4 = Node::new("n-4");
    n4.start(&join_args(&n2));
    n4.wait_ready(READY);
    eventually("four voters", Duration::from_secs(60), || {
        (voters(&n1) == 4).then_some(())
    });
    let _ = watcher.kill();
    let _ = watcher.wait();
    let records: Vec<serde_json::Value> = lines
        .join()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let progress: Vec<(u64, u64)> = records
        .iter()
        .filter_map(|r| r["learners"].as_object()?.values().next().cloned())
        .map(|r| {
            (
                r["appliedIndex"].as_u64().unwrap_or(0),
                r["bytesSent"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let learner_lines = || {
        [&n1, &n2, &n3]
            .iter()
            .flat_map(|n| {
                n.log()
                    .lines()
                    .filter(|l| l.contains("learner"))
                    .map(|l| format!("{}: {l}", n.name))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // On loopback the catch-up is over in a fraction of a second, a look or two of the learner manager:
    // the record was kept, and its figures only ever grew. (How much it shows depends on where the looks
    // fell; `learners_etcd` in the controllers' tests watches a catch-up step by step.)
    let monotonic = progress
        .windows(2)
        .all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1);
    assert!(
        !progress.is_empty() && monotonic,
        "the record did not follow the fourth's catch-up: {progress:?}\n{}",
        learner_lines()
    );
    assert_eq!(events(&n1, "LearnerPromoted").len(), 3);
}

#[test]
fn a_deleted_nodes_member_is_removed_and_the_last_voter_never_is() {
    let (n1, mut n2, mut n3) = three_voters("n");
    let n3_member = n3.member_name();
    // A removed node rejoins by itself as a new member; this test is about removal alone, so each node's
    // agent is frozen before its record goes (its etcd, a child in a process group of its own, serves on).
    signal(n3.pid(), "STOP");
    // `hostlet node delete n3`.
    let o = n1.etcdctl(&["del", "/hostlet/nodes/n-3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    eventually("n3's member removed", Duration::from_secs(30), || {
        let m = members(&n1);
        (m.len() == 2 && !m.iter().any(|(name, _)| *name == n3_member)).then_some(())
    });
    n3.kill();
    // Down to n1 and n2; then n2 goes too, leaving n1 the last voter.
    signal(n2.pid(), "STOP");
    let o = n1.etcdctl(&["del", "/hostlet/nodes/n-2"]);
    assert!(o.status.success());
    eventually("n2's member removed", Duration::from_secs(30), || {
        (members(&n1).len() == 1).then_some(())
    });
    n2.kill();
    let o = n1.etcdctl(&["del", "/hostlet/nodes/n-1"]);
    assert!(o.status.success());
    eventually("the refusal", Duration::from_secs(30), || {
        (!events(&n1, "MemberNotRemoved").is_empty()).then_some(())
    });
    assert_eq!(members(&n1).len(), 1, "the last voter stays");
    let (_, text) = n1.get_metrics("/metrics").unwrap();
    assert!(text.contains("hostlet_member_removals_total{result=\"refused\"} 1"));
}

/// Whether `n`'s own member leads (from its status).
fn leads(n: &Node) -> bool {
    let o = n.etcdctl(&["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let s = &v[0]["Status"];
    let leader = s["leader"].as_u64().unwrap_or(0);
    leader != 0 && s["header"]["member_id"].as_u64() == Some(leader)
}

/// The learner progress record's entries, read through `via`.
fn progress_record(via: &Node) -> serde_json::Map<String, serde_json::Value> {
    let o = via.etcdctl(&[
        "get",
        "/hostlet/etcd/learner-progress",
        "--print-value-only",
    ]);
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .ok()
        .and_then(|v| v["learners"].as_object().cloned())
        .unwrap_or_default()
}

#[test]
fn when_the_leaders_hostlet_dies_while_a_learner_catches_up_the_new_leader_promotes_it_on_the_same_clock(
) {
    let (n1, n2, n3) = three_voters("n");
    // Room for a fourth voter (the default target is three).
    assert!(n1
        .etcdctl(&["put", "/hostlet/config/cluster", r#"{"voters": 5}"#])
        .status
        .success());
    fill(&n1, 20);
    let mut nodes = [n1, n2, n3];
    let leader = eventually("a leader", Duration::from_secs(10), || {
        nodes.iter().position(leads)
    });
    let server = (leader + 1) % 3;
    let mut n4 = Node::new("n-4");
    n4.start(&join_args(&nodes[server]));
    // Hold the learner still (a slow host) until the leader is gone, so that it cannot be promoted before.
    let etcd4 = eventually("n4's etcd", Duration::from_secs(30), || {
        member_support::etcd_member_of(n4.pid())
    });
    signal(etcd4, "STOP");
    let added = eventually("the leader's record of n4", Duration::from_secs(10), || {
        let r = progress_record(&nodes[server]);
        r.values()
            .next()
            .and_then(|e| e["added"].as_str().map(str::to_string))
    });
    let added = humantime::parse_rfc3339_weak(&added).unwrap();
    let dead = nodes[leader].name.clone();
    nodes[leader].kill();
    let before_takeover = added.elapsed().unwrap().as_secs_f64();
    signal(etcd4, "CONT");
    let alive: Vec<&Node> = nodes.iter().filter(|n| n.name != dead).collect();
    n4.wait_ready(READY);
    eventually("n4 promoted", Duration::from_secs(60), || {
        (voters(alive[0]) == 4).then_some(())
    });
    let n4_id = member_id(alive[0], &n4.member_name());
    let by_node = eventually("n4's promotion event", Duration::from_secs(10), || {
        events(alive[0], "LearnerPromoted")
            .into_iter()
            .find(|(_, message)| message.contains(&format!("({n4_id})")))
            .map(|(node, _)| node)
    });
    assert_ne!(by_node, dead, "promoted by the leader that was killed");
    let by = alive.iter().find(|n| n.name == by_node).unwrap();
    // Measured from the dead leader's record, not from the takeover.
    let (_, text) = by.get_metrics("/metrics").unwrap();
    let measured = metric(&text, "hostlet_learner_promotion_duration_seconds_sum").unwrap();
    let logs: Vec<String> = nodes
        .iter()
        .chain([&n4])
        .flat_map(|n| {
            n.log()
                .lines()
                .filter(|l| l.contains("learner") || l.contains("leads"))
                .map(|l| format!("{}: {l}", n.name))
                .collect::<Vec<_>>()
        })
        .collect();
    // A clock restarted at the takeover would not cover the time the dead leader had already counted.
    assert!(
        measured >= before_takeover,
        "measured {measured:.2}s, {before_takeover:.2}s had passed at the takeover: the clock restarted\n{}\n{:?}",
        logs.join("\n"),
        events(by, "LearnerPromoted")
    );
}
