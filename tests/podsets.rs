//! Pod sets on real agents, etcd and Docker: three voters and workers with labels. A set runs exactly on the
//! matching nodes, follows relabelling and a node that joins later, leaves a hand-written pod of its name
//! alone; a template change rolls node by node while a watcher of every host's pods and statuses counts
//! the matching nodes without an available pod; `rollout history` and `undo`; the leader's agent killed
//! mid-rollout; `node drain` of the voter that leads etcd and `uncordon`.

mod member_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlet_api::objects::PodStatus;
use hostlet_api::podset::HASH;
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::{Etcd, EtcdConfig, TlsFiles};
use member_support::*;

const READY: Duration = Duration::from_secs(120);
const SET: &str = "edge-agent";

/// Node `<prefix>-<i>` with `--node-label`s, joining through `first` when given.
fn start(prefix: &str, i: usize, labels: &str, first: Option<&Node>, worker: bool) -> Node {
    let mut n = Node::new(&format!("{prefix}-{i}"));
    let mut args = vec![format!("--node-label={labels}")];
    if let Some(f) = first {
        args.extend(join_args(f));
    }
    if worker {
        args.push("--role=worker".into());
    }
    n.start(&args);
    n
}

/// The set: every `tier=edge` node runs busybox sleeping `secs`, ready by an exec probe.
fn set_yaml(secs: u32, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {SET}
spec:
  selector:
    matchLabels: {{app: {SET}}}
  minReadySeconds: 1
{extra_spec}  template:
    metadata:
      labels: {{app: {SET}}}
    spec:
      nodeSelector: {{tier: edge}}
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox:latest
        imagePullPolicy: Never
        command: [sleep, "{secs}"]
        readinessProbe:
          exec: {{command: ["true"]}}
          periodSeconds: 1
          # A busy machine's slow exec is no failure: an old pod counted unavailable would be replaced
          # first, and a failing rollout would then reach two nodes.
          timeoutSeconds: 10
"#
    )
}

fn apply(n: &Node, yaml: &str) {
    let file = n.dir.join("set.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = cli(n, &["podset", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
}

fn get(via: &Node, key: &str) -> Option<Vec<u8>> {
    let o = via.etcdctl(&["get", key, "--print-value-only"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v = o.stdout.strip_suffix(b"\n").unwrap_or(&o.stdout).to_vec();
    (!v.is_empty()).then_some(v)
}

/// The set's pod on `node` and its status, as etcd holds them.
fn pod_of(via: &Node, node: &str) -> (Option<hostlet_api::PodManifest>, Option<PodStatus>) {
    let keys = KeyLayout::default();
    let m = get(via, &keys.pod(node, SET)).and_then(|v| hostlet_api::parse_manifest(&v).ok());
    let s = get(via, &keys.pod_status(node, SET)).and_then(|v| serde_json::from_slice(&v).ok());
    (m, s)
}

/// Whether `node` runs the set's pod of the current template, ready.
fn available_on(via: &Node, node: &str) -> bool {
    match pod_of(via, node) {
        (Some(m), Some(s)) => {
            m.annotations.contains_key(HASH)
                && m.annotations.get(HASH) == s.revision_hash.as_ref()
                && s.ready
        }
        _ => false,
    }
}

fn set_status(via: &Node) -> serde_json::Value {
    let o = cli(via, &["podset", "get", SET, "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["status"].clone()
}

/// Every matching node available and the set's status saying its rollout is complete.
fn wait_rolled_out(via: &Node, nodes: &[&str], within: Duration) {
    eventually("the rollout to complete", within, || {
        let st = set_status(via);
        (st["rollout"]["complete"] == true
            && st["desiredNumberScheduled"] == nodes.len()
            && nodes.iter().all(|n| available_on(via, n)))
        .then_some(())
    });
}

/// Counts, from an etcd watch of every host's pods and statuses, the most matching nodes seen at once
/// without an available pod of the set (its key and its status on the same template hash, ready).
struct Watcher {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    fn start(via: &Node, endpoints: Vec<String>, nodes: &[&str]) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicUsize::new(0));
        let tls = TlsFiles {
            ca: via.tls_file("ca.crt"),
            cert: via.tls_file("client.crt"),
            key: via.tls_file("client.key"),
        };
        let nodes: BTreeSet<String> = nodes.iter().map(|s| s.to_string()).collect();
        let (s, m) = (stop.clone(), most.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(watch(endpoints, tls, nodes, s, m, ready_tx));
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the watcher started");
        Watcher {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.most.load(Ordering::SeqCst)
    }
}

async fn watch(
    endpoints: Vec<String>,
    tls: TlsFiles,
    nodes: BTreeSet<String>,
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let keys = KeyLayout::default();
    let etcd = Etcd::connect(EtcdConfig::new(endpoints).with_tls(tls))
        .await
        .unwrap();
    let hosts = "/hostlet/hosts/";
    let (kvs, rev) = etcd.get_prefix(hosts).await.unwrap();
    let mut state: BTreeMap<String, Vec<u8>> = kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
            )
        })
        .collect();
    let (_w, mut stream) = etcd.watch_prefix(hosts, rev + 1).await.unwrap();
    let _ = ready.send(());
    let unavailable = |state: &BTreeMap<String, Vec<u8>>| {
        nodes
            .iter()
            .filter(|n| {
                let hash = state
                    .get(&keys.pod(n, SET))
                    .and_then(|v| hostlet_api::parse_manifest(v).ok())
                    .and_then(|m| m.annotations.get(HASH).cloned());
                let status = state
                    .get(&keys.pod_status(n, SET))
                    .and_then(|v| serde_json::from_slice::<PodStatus>(v).ok());
                !(hash.is_some() && status.is_some_and(|s| s.ready && s.revision_hash == hash))
            })
            .count()
    };
    while !stop.load(Ordering::SeqCst) {
        let msg = match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(m))) => m,
            // The test has failed and its nodes are going: nothing more to count.
            Ok(_) if stop.load(Ordering::SeqCst) => return,
            Ok(m) => panic!("the watch ended: {m:?}"),
        };
        for ev in msg.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if !matches!(
                keys.parse(&key),
                Some(Key::Pod { .. } | Key::PodStatus { .. })
            ) {
                continue;
            }
            if ev.event_type() == etcd_client::EventType::Delete {
                state.remove(&key);
            } else {
                state.insert(key, kv.value().to_vec());
            }
        }
        // Each watch response is one etcd revision's batch: the state after it is one a client could see.
        most.fetch_max(unavailable(&state), Ordering::SeqCst);
    }
}

fn events_text(via: &Node) -> String {
    let o = via.etcdctl(&["get", "--prefix", "/hostlet/events/", "--print-value-only"]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The name of the voter that leads etcd, asked through `via`.
fn leader(via: &Node, voters: &[&Node]) -> Option<String> {
    let endpoints: Vec<String> = voters.iter().map(|v| v.client_url()).collect();
    let o = via.etcdctl_at(&endpoints.join(","), &["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let arr = v.as_array()?;
    let leader_id = arr.first()?["Status"]["leader"].as_u64()?;
    let i = arr
        .iter()
        .position(|s| s["Status"]["header"]["member_id"].as_u64() == Some(leader_id))?;
    Some(voters[i].name.clone())
}

/// Hands etcd leadership to `to` (one of `voters`) and waits until it leads.
fn make_leader(to: &Node, voters: &[&Node]) {
    let o = to.etcdctl(&["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let name = to.member_name();
    let id = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name.as_str())
        .and_then(|m| m["ID"].as_u64())
        .unwrap();
    eventually(
        &format!("{} leads", to.name),
        Duration::from_secs(30),
        || {
            let current = leader(to, voters)?;
            if current == to.name {
                return Some(());
            }
            let at = voters.iter().find(|v| v.name == current)?;
            let _ = at.etcdctl(&["move-leader", &format!("{id:x}")]);
            None
        },
    );
}

#[test]
fn a_pod_set_runs_on_matching_nodes_and_rolls_out_node_by_node() {
    let p = "ps";
    let _c: Vec<Cleanup> = (1..=7).map(|i| Cleanup(format!("{p}-{i}"))).collect();
    // Voters 1 and 3 and workers 4 and 5 are edge nodes; voter 2 and worker 6 are core.
    let mut v1 = start(p, 1, "tier=edge", None, false);
    v1.wait_ready(READY);
    let mut v2 = start(p, 2, "tier=core", Some(&v1), false);
    v2.wait_ready(READY);
    let mut v3 = start(p, 3, "tier=edge", Some(&v1), false);
    v3.wait_ready(READY);
    let names = vec![v1.member_name(), v2.member_name(), v3.member_name()];
    eventually("three voters", Duration::from_secs(60), || {
        voters_named(&v1, &names)
    });
    let mut w4 = start(p, 4, "tier=edge", Some(&v1), true);
    let mut w5 = start(p, 5, "tier=edge", Some(&v1), true);
    let mut w6 = start(p, 6, "tier=core", Some(&v1), true);
    for w in [&mut w4, &mut w5, &mut w6] {
        w.wait_ready(READY);
    }
    // A pod of the set's name written by hand on worker 5 is the operator's: left alone and reported.
    apply_sleeper(&w5, SET, "busybox:latest", "Never");
    wait_running(&w5, SET, Duration::from_secs(60));

    // A set hostlet would refuse is refused at apply, naming the field, and nothing is written.
    let bad = set_yaml(86400, "").replace("image: busybox:latest", "image: \"\"");
    let file = v1.dir.join("bad.yaml");
    std::fs::write(&file, bad).unwrap();
    let o = cli(&v1, &["podset", "apply", "-f", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("spec.template.spec.containers[0].image"),
        "{}",
        output_text(&o)
    );
    assert!(get(&v1, &KeyLayout::default().podset(SET)).is_none());

    apply(&v1, &set_yaml(86400, ""));
    let edge = ["ps-1", "ps-3", "ps-4"];
    wait_rolled_out(&v1, &edge, Duration::from_secs(120));
    for n in ["ps-2", "ps-6"] {
        assert_eq!(pod_of(&v1, n).0, None, "{n} does not match");
    }
    let (hand, _) = pod_of(&v1, "ps-5");
    let hand = hand.expect("the hand-written pod");
    assert!(!hand.annotations.contains_key(HASH), "not overwritten");
    eventually(
        "the hand-written pod reported",
        Duration::from_secs(30),
        || {
            events_text(&v1)
                .contains("node ps-5 already has a pod edge-agent that the set did not write")
                .then_some(())
        },
    );
    let o = cli(&v1, &["podset", "ls"]);
    let text = stdout(&o);
    assert!(text.contains("NODE-SELECTOR"), "{text}");
    let row = text.lines().find(|l| l.starts_with(SET)).expect("a row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[1..7],
        &["3", "3", "3", "3", "3", "tier=edge"],
        "{text}"
    );

    // Relabelling: worker 6 becomes an edge node, voter 3 a core one.
    let o = cli(&v1, &["node", "label", "ps-6", "tier=edge"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let o = cli(&v1, &["node", "label", "ps-3", "tier=core"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let edge = ["ps-1", "ps-4", "ps-6"];
    wait_rolled_out(&v1, &edge, Duration::from_secs(60));
    eventually("voter 3's pod gone", Duration::from_secs(60), || {
        (pod_of(&v1, "ps-3") == (None, None)).then_some(())
    });

    // A worker that joins with the label later gets its pod.
    let mut w7 = start(p, 7, "tier=edge", Some(&v1), true);
    let joined = Instant::now();
    eventually("worker 7's node record", READY, || {
        get(&v1, &KeyLayout::default().node("ps-7")).map(|_| ())
    });
    let recorded = joined.elapsed();
    eventually(
        "worker 7 runs the set's pod",
        Duration::from_secs(60),
        || available_on(&v1, "ps-7").then_some(()),
    );
    eprintln!(
        "worker 7: record after {recorded:?}, pod available {:?} after that",
        joined.elapsed() - recorded
    );
    let edge = ["ps-1", "ps-4", "ps-6", "ps-7"];
    wait_rolled_out(&v1, &edge, Duration::from_secs(60));

    // A template change rolls node by node.
    let endpoints = vec![v1.client_url(), v2.client_url(), v3.client_url()];
    let watcher = Watcher::start(&v1, endpoints.clone(), &edge);
    apply(&v1, &set_yaml(86401, ""));
    let o = cli(
        &v1,
        &[
            "podset",
            "rollout",
            "status",
            SET,
            "--watch",
            "--timeout",
            "3m",
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        stdout(&o).contains("successfully rolled out"),
        "{}",
        output_text(&o)
    );
    wait_rolled_out(&v1, &edge, Duration::from_secs(30));
    assert_eq!(
        watcher.finish(),
        1,
        "never more than maxUnavailable=1 nodes without an available pod"
    );
    let st = set_status(&v1);
    assert_eq!(st["updateRevision"], 2, "{st}");

    // History lists both; undo goes back to the first template.
    let o = cli(&v1, &["podset", "rollout", "history", SET]);
    let text = stdout(&o);
    assert!(text.lines().any(|l| l.starts_with("1 ")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("2 ") && l.contains("current")),
        "{text}"
    );
    let o = cli(&v1, &["podset", "rollout", "undo", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    wait_rolled_out(&v1, &edge, Duration::from_secs(120));
    let (m, _) = pod_of(&v1, "ps-1");
    assert_eq!(
        m.unwrap().containers[0].command[1],
        "86400",
        "back to the first template"
    );

    // The leader's agent killed mid-rollout: the next leader finishes it, the bound held.
    make_leader(&v2, &[&v1, &v2, &v3]);
    let watcher = Watcher::start(&v1, endpoints, &edge);
    apply(
        &v1,
        &set_yaml(
            86402,
            "  updateStrategy: {rollingUpdate: {maxUnavailable: 1}}\n",
        ),
    );
    eventually("the rollout under way", Duration::from_secs(60), || {
        (set_status(&v1)["updatedNumberScheduled"].as_u64()? >= 1).then_some(())
    });
    v2.kill();
    wait_rolled_out(&v1, &edge, Duration::from_secs(180));
    assert_eq!(
        watcher.finish(),
        1,
        "the bound held across the change of leader"
    );
    assert_eq!(set_status(&v1)["rollout"]["complete"], true);

    // Drain the voter that leads etcd (voter 1, an edge node): leadership moves first, its pod goes, the
    // others stay.
    let voters = [&v1, &v3];
    make_leader(&v1, &voters);
    let (led, other) = ("ps-1".to_string(), &v3);
    assert!(available_on(other, &led));
    let before: Vec<Vec<String>> = ["ps-4", "ps-6", "ps-7"]
        .iter()
        .map(|n| docker_ids(n, Some(SET)))
        .collect();
    let o = cli(other, &["node", "drain", &led, "--timeout", "2m"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let text = stdout(&o);
    assert!(text.contains("etcd leadership moved from"), "{text}");
    assert!(text.contains("drained"), "{text}");
    assert_ne!(leader(other, &voters).as_deref(), Some(led.as_str()));
    assert_eq!(pod_of(other, &led), (None, None));
    let after: Vec<Vec<String>> = ["ps-4", "ps-6", "ps-7"]
        .iter()
        .map(|n| docker_ids(n, Some(SET)))
        .collect();
    assert_eq!(before, after, "the other nodes' pods were not touched");
    let o = cli(other, &["node", "ls"]);
    assert!(
        stdout(&o).contains("SchedulingDisabled"),
        "{}",
        output_text(&o)
    );
    let o = cli(other, &["node", "uncordon", &led]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually(
        "the drained node's pod back",
        Duration::from_secs(60),
        || available_on(other, &led).then_some(()),
    );
    for n in [&mut v1, &mut v3, &mut w4, &mut w5, &mut w6, &mut w7] {
        n.stop(Duration::from_secs(30));
    }
}

/// The nodes the set's last failed rollout names, as its status tells it.
fn failure(via: &Node) -> Option<Vec<String>> {
    let st = set_status(via);
    let nodes = st["lastFailure"]["nodes"].as_array()?;
    Some(
        nodes
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect(),
    )
}

#[test]
fn a_failed_rollout_stops_after_max_unavailable_nodes_and_reverts_when_asked() {
    let p = "pf";
    let _c: Vec<Cleanup> = (1..=3).map(|i| Cleanup(format!("{p}-{i}"))).collect();
    let mut v1 = start(p, 1, "tier=edge", None, false);
    v1.wait_ready(READY);
    let mut w2 = start(p, 2, "tier=edge", Some(&v1), true);
    let mut w3 = start(p, 3, "tier=edge", Some(&v1), true);
    w2.wait_ready(READY);
    w3.wait_ready(READY);
    let nodes = ["pf-1", "pf-2", "pf-3"];
    let fast = "  progressDeadlineSeconds: 8\n";
    let revert = |spec: &str| {
        spec.replace(
            &format!("  name: {SET}\n"),
            &format!("  name: {SET}\n  annotations: {{hostlet.io/auto-revert: \"true\"}}\n"),
        )
    };
    apply(&v1, &revert(&set_yaml(86400, fast)));
    wait_rolled_out(&v1, &nodes, Duration::from_secs(120));

    // An image that is not there: one node gets it, the deadline passes, the set goes back on its own.
    let endpoints = vec![v1.client_url()];
    let watcher = Watcher::start(&v1, endpoints.clone(), &nodes);
    let missing =
        revert(&set_yaml(86400, fast)).replace("image: busybox:latest", "image: pf-absent:1");
    apply(&v1, &missing);
    let failed = eventually("the rollout failed", Duration::from_secs(90), || {
        failure(&v1)
    });
    assert_eq!(
        failed.len(),
        1,
        "stopped after maxUnavailable nodes: {failed:?}"
    );
    eventually("reverted", Duration::from_secs(30), || {
        (set_status(&v1)["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Reverted" && c["status"] == "True"))
        .then_some(())
    });
    wait_rolled_out(&v1, &nodes, Duration::from_secs(120));
    assert_eq!(
        watcher.finish(),
        1,
        "never more than one node without an available pod"
    );
    let (m, _) = pod_of(&v1, &failed[0]);
    assert_eq!(
        m.unwrap().containers[0].image,
        "busybox:latest",
        "back on the good template"
    );
    let text = events_text(&v1);
    assert!(
        text.contains("RolloutFailed") && text.contains("RolloutReverted"),
        "{text}"
    );
    let o = cli(&v1, &["podset", "rollout", "history", SET]);
    assert!(
        stdout(&o).contains("pf-absent:1"),
        "the failed revision stays in the history: {}",
        output_text(&o)
    );

    // Without auto-revert, a readiness probe that never passes stops the rollout, and it stays stopped;
    // `rollout undo` brings the good template back.
    let watcher = Watcher::start(&v1, endpoints, &nodes);
    let unready = set_yaml(86400, fast).replace("command: [\"true\"]", "command: [\"false\"]");
    apply(&v1, &unready);
    let failed = eventually("the rollout failed", Duration::from_secs(90), || {
        failure(&v1)
    });
    assert_eq!(failed.len(), 1, "{failed:?}");
    let st = set_status(&v1);
    assert_eq!(st["numberAvailable"], 2, "{st}");
    let failed_cond = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RolloutFailed")
        .cloned()
        .unwrap();
    assert_eq!(failed_cond["status"], "True", "{st}");
    assert!(
        failed_cond["message"]
            .as_str()
            .unwrap()
            .contains(&failed[0]),
        "{failed_cond}"
    );
    // The good template came back as revision 3 (an old template applied again gets a new number).
    let o = cli(&v1, &["podset", "rollout", "undo", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    wait_rolled_out(&v1, &nodes, Duration::from_secs(120));
    assert_eq!(watcher.finish(), 1);

    // Paused, a new template replaces nothing; resumed, it rolls out; a restart rolls every pod again.
    let o = cli(&v1, &["podset", "rollout", "pause", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    let file = v1.dir.join("paused.yaml");
    std::fs::write(&file, set_yaml(86403, "  paused: true\n")).unwrap();
    let o = cli(&v1, &["podset", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
    let generation = {
        let o = v1.etcdctl(&["get", &KeyLayout::default().podset(SET), "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["kvs"][0]["mod_revision"].as_i64().unwrap()
    };
    let st = eventually("the paused set seen", Duration::from_secs(30), || {
        let st = set_status(&v1);
        (st["observedGeneration"].as_i64()? >= generation).then_some(st)
    });
    assert_eq!(
        st["updatedNumberScheduled"], 0,
        "paused: nothing replaced: {st}"
    );
    let paused = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Paused" && c["status"] == "True");
    assert!(paused, "{st}");
    let o = cli(&v1, &["podset", "rollout", "resume", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    wait_rolled_out(&v1, &nodes, Duration::from_secs(120));
    let o = cli(&v1, &["podset", "rollout", "restart", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("restarted everywhere", Duration::from_secs(120), || {
        (nodes.iter().all(|n| {
            available_on(&v1, n)
                && pod_of(&v1, n)
                    .0
                    .is_some_and(|m| m.annotations.contains_key("hostlet.io/restartedAt"))
        }) && set_status(&v1)["rollout"]["complete"] == true)
            .then_some(())
    });

    // A set written by hand that hostlet would refuse changes no pod and says why.
    let before: Vec<Vec<String>> = nodes.iter().map(|n| docker_ids(n, Some(SET))).collect();
    let o = v1.etcdctl(&[
        "put",
        &KeyLayout::default().podset(SET),
        &set_yaml(86400, "").replace("image: busybox:latest", "image: \"\""),
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("the set reported invalid", Duration::from_secs(30), || {
        events_text(&v1).contains("InvalidPodSet").then_some(())
    });
    let o = cli(&v1, &["podset", "ls"]);
    assert!(stdout(&o).contains("<invalid>"), "{}", output_text(&o));
    let after: Vec<Vec<String>> = nodes.iter().map(|n| docker_ids(n, Some(SET))).collect();
    assert_eq!(
        before, after,
        "the pods of the last good revision keep running"
    );

    // Deleting the set removes its pods everywhere, then its records.
    let o = cli(&v1, &["podset", "delete", SET]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually(
        "the set's pods and records gone",
        Duration::from_secs(60),
        || {
            let o = v1.etcdctl(&["get", "--prefix", "/hostlet/podsets/", "--keys-only"]);
            (nodes.iter().all(|n| pod_of(&v1, n) == (None, None)) && stdout(&o).trim().is_empty())
                .then_some(())
        },
    );
    for n in [&mut v1, &mut w2, &mut w3] {
        n.stop(Duration::from_secs(30));
    }
}
