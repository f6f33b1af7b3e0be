//! The rolling etcd upgrade on real agents: three voters and a worker on etcd 3.4.23, their binaries
//! replaced by 3.5.1 at the same moment, rolled in one member at a time (a snapshot first, the leader
//! last) while a writer writes and pods run; then a 3.4 binary put back under a 3.5 member is refused and
//! the member runs on.

mod member_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use member_support::*;

const READY: Duration = Duration::from_secs(120);
/// The bound for the whole roll.
const ROLL_WITHIN: Duration = Duration::from_secs(300);

/// Copies `etcd` (and the etcdctl/etcdutl beside it) into `<node dir>/etcd-bin/`: each host's own binary,
/// which the test replaces as a package upgrade would.
fn own_binary(n: &Node, from_dir: &Path) -> PathBuf {
    let dir = n.dir.join("etcd-bin");
    std::fs::create_dir_all(&dir).unwrap();
    install(from_dir, &dir);
    dir.join("etcd")
}

/// Puts `from_dir`'s etcd tools into `dir`, each by a rename over the old file (as dpkg does).
fn install(from_dir: &Path, dir: &Path) {
    for tool in ["etcd", "etcdctl", "etcdutl"] {
        let src = from_dir.join(tool);
        if !src.exists() {
            continue;
        }
        let tmp = dir.join(format!(".{tool}.new"));
        std::fs::copy(&src, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(tool)).unwrap();
    }
}

/// Samples every 200 ms how many of the voters serve: the lowest count, and when one first did not.
struct HealthSampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<(usize, Option<SystemTime>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthSampler {
    fn start(voters: Vec<MemberHttp>) -> HealthSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new((voters.len(), None)));
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let up = voters.iter().filter(|m| m.healthy()).count();
                    let mut s = seen.lock().unwrap();
                    s.0 = s.0.min(up);
                    if up < voters.len() && s.1.is_none() {
                        s.1 = Some(SystemTime::now());
                    }
                    drop(s);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        HealthSampler {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (usize, Option<SystemTime>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let s = *self.seen.lock().unwrap();
        s
    }
}

/// Every event about `node` with `reason`, read through `via`, as JSON, oldest first.
fn events_json(via: &Node, node: &str, reason: &str) -> Vec<serde_json::Value> {
    let o = via.etcdctl(&[
        "get",
        &format!("/hostlet/events/{node}/"),
        "--prefix",
        "--print-value-only",
    ]);
    let mut out: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["reason"] == reason)
        .collect();
    out.sort_by_key(|e| e["timestamp"].as_str().unwrap_or("").to_string());
    out
}

fn event_time(e: &serde_json::Value) -> SystemTime {
    let t = e["timestamp"].as_str().unwrap_or("");
    humantime::parse_rfc3339(t).unwrap_or_else(|err| panic!("{e}: {err}"))
}

/// The node whose member leads, as `via` sees it.
fn leader_node(via: &Node, nodes: &[&Node]) -> Option<String> {
    let o = cli(via, &["etcd", "status", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let member = v.as_array()?.iter().find(|m| m["leader"] == true)?["member"]
        .as_str()?
        .to_string();
    nodes
        .iter()
        .find(|n| n.member_name() == member)
        .map(|n| n.name.clone())
}

fn pod_running(node: &Node, id: &str) -> Option<()> {
    let s = status(node, id)?;
    (s["phase"] == "Running").then_some(())
}

#[test]
fn a_new_etcd_binary_on_every_host_is_rolled_in_one_member_at_a_time_leader_last() {
    let dir35 = etcd35();
    let dir34 = etcd34().parent().unwrap().to_path_buf();
    // Declared before the nodes so that it drops after them: once the agents have stopped, their
    // containers are removed (an agent still running would start them again, and the next run adopt them).
    let _cleanup: Vec<Cleanup> = (1..=4).map(|i| Cleanup(format!("upg-{i}"))).collect();
    // Three voters, then a worker.
    let mut nodes: Vec<Node> = Vec::new();
    for i in 1..=4 {
        let mut n = Node::new(&format!("upg-{i}"));
        let bin = own_binary(&n, &dir34);
        let mut args = vec![format!("--etcd-binary={}", bin.display())];
        if let Some(first) = nodes.first() {
            args.extend(join_args(first));
        }
        n.start(&args);
        n.wait_ready(READY);
        nodes.push(n);
    }
    let voters: Vec<&Node> = nodes[..3].iter().collect();
    let names: Vec<String> = voters.iter().map(|n| n.member_name()).collect();
    wait_for_nodes("three voters", READY, &voters, || {
        voters_named(&nodes[0], &names)
    });
    assert!(
        nodes[3].data_dir.join("db/worker").exists(),
        "the fourth host is not a worker"
    );
    // Pods on a voter and on the worker.
    run_pod(&nodes[0], "upg-a");
    run_pod(&nodes[3], "upg-b");
    wait_for_nodes("the pods running", READY, &voters, || {
        pod_running(&nodes[0], "upg-a")?;
        pod_running(&nodes[3], "upg-b")
    });
    let containers = (docker_ids("upg-1", None), docker_ids("upg-4", None));
    let leader_before = eventually("a leader", READY, || leader_node(&nodes[0], &voters));

    let endpoints: Vec<String> = voters.iter().map(|n| n.client_url()).collect();
    let writer = OutageWriter::start(&nodes[0], &endpoints, "/upgw/");
    let sampler = HealthSampler::start(voters.iter().map(|n| MemberHttp::of(n)).collect());
    // The package upgrade: every host's binary replaced at the same moment.
    let swapped = SystemTime::now();
    let started = Instant::now();
    for n in &voters {
        install(&dir35, &n.dir.join("etcd-bin"));
    }
    // Every member on 3.5.1, the cluster version 3.5.
    wait_for_nodes(
        "every member on 3.5.1 and the cluster on 3.5",
        ROLL_WITHIN,
        &voters,
        || {
            voters
                .iter()
                .map(|n| member_version(n).filter(|(s, c)| s == "3.5.1" && c.starts_with("3.5")))
                .collect::<Option<Vec<_>>>()
        },
    );
    let took = started.elapsed();
    let (worst, acked) = writer.finish_with_keys();
    let (fewest, first_down) = sampler.finish();
    let story = || {
        voters
            .iter()
            .map(|n| format!("--- {}:\n{}", n.name, n.log_tail(60)))
            .collect::<Vec<_>>()
            .join("\n")
    };

    assert!(took <= ROLL_WITHIN, "the roll took {took:?}");
    assert!(
        fewest >= 2,
        "only {fewest} voter(s) served at one sample\n{}",
        story()
    );
    assert!(
        worst < Duration::from_secs(5),
        "the writer failed for {worst:?}"
    );
    // Every acknowledged write is there.
    let o = nodes[0].etcdctl(&["get", "/upgw/", "--prefix", "--keys-only"]);
    let have: std::collections::BTreeSet<String> = stdout(&o)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|k| !have.contains(*k)).collect();
    assert!(lost.is_empty(), "lost acknowledged writes: {lost:?}");
    assert!(
        acked.len() > 10,
        "the writer wrote only {} keys",
        acked.len()
    );

    // One EtcdUpgraded per voter, the leader's last, each after the swap.
    let upgraded: Vec<(String, SystemTime)> = voters
        .iter()
        .map(|n| {
            let e = eventually(&format!("{}'s EtcdUpgraded", n.name), READY, || {
                events_json(&nodes[0], &n.name, "EtcdUpgraded")
                    .into_iter()
                    .next()
            });
            assert!(e["message"].as_str().unwrap_or("").contains("3.5.1"), "{e}");
            (n.name.clone(), event_time(&e))
        })
        .collect();
    let last = upgraded.iter().max_by_key(|(_, t)| *t).unwrap();
    assert_eq!(
        last.0, leader_before,
        "the leader did not go last: {upgraded:?}"
    );
    assert!(upgraded.iter().all(|(_, t)| *t >= swapped));
    let leader = voters.iter().find(|n| n.name == leader_before).unwrap();
    assert!(
        leader
            .log()
            .contains("leadership moved away before the etcd restart"),
        "{}",
        leader.log_tail(80)
    );
    // A verified snapshot from before the first restart.
    let first_down = first_down.expect("no sample saw a member restart");
    let o = cli(&nodes[0], &["etcd", "snapshot", "ls", "-o", "json"]);
    let snaps: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let before_restart = snaps.as_array().into_iter().flatten().any(|s| {
        s["status"] == "successful"
            && s["name"] == "pre-etcd-upgrade"
            && s["created"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .is_some_and(|t| t >= swapped && t <= first_down)
    });
    assert!(
        before_restart,
        "no verified snapshot before {first_down:?}: {snaps}"
    );
    // No pod restarted: the same containers, restart counts 0.
    assert_eq!(
        (docker_ids("upg-1", None), docker_ids("upg-4", None)),
        containers
    );
    for (n, id) in [(&nodes[0], "upg-a"), (&nodes[3], "upg-b")] {
        let s = status(n, id).unwrap();
        assert_eq!(s["containers"][0]["restartCount"], 0, "{s}");
    }
    // `hostlet etcd upgrade status` shows every member current on 3.5.1.
    let o = cli(&nodes[0], &["etcd", "upgrade", "status", "-o", "json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(&o)));
    for m in report["members"].as_array().unwrap() {
        assert_eq!(m["running"], "3.5.1", "{report}");
        assert_eq!(m["on_disk"], "3.5.1", "{report}");
        assert_eq!(m["phase"], "current", "{report}");
    }
    eprintln!(
        "roll: {took:?}; writer's longest outage {worst:?}; fewest serving {fewest}; order {upgraded:?}"
    );

    // A 3.4 binary put back under a 3.5 member: refused, the member runs on.
    let n3 = voters[2];
    let pid = n3.etcd_pid().unwrap();
    install(&dir34, &n3.dir.join("etcd-bin"));
    let refused = eventually("the EtcdUpgradeRefused event", READY, || {
        Some(events(&nodes[0], &n3.name, "EtcdUpgradeRefused")).filter(|e| !e.is_empty())
    });
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("3.4.23") && refused[0].contains("below the cluster version 3.5"),
        "{refused:?}"
    );
    assert_eq!(n3.etcd_pid(), Some(pid), "the member was restarted");
    assert!(MemberHttp::of(n3).healthy());
    let o = cli(&nodes[0], &["etcd", "upgrade", "status"]);
    let text = output_text(&o);
    let row = text
        .lines()
        .find(|l| l.starts_with(&n3.member_name()))
        .unwrap_or_default();
    assert!(row.contains("refused") && row.contains("3.4.23"), "{text}");
}
