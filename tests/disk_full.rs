//! A full disk under a voter's data dir (a size-limited tmpfs the test mounts, then fills): the other
//! members keep serving, the full host says so (event, metric, `/readyz`), its member is not restarted
//! into the same failure, nothing is tombstoned or moved, and once the filler goes the member catches up
//! with no operator action. The same on a worker: its pods keep running and their status resumes once there
//! is room. Root only (mount); a run that is not root fails.

mod member_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use member_support::*;

fn readyz(n: &Node) -> Option<serde_json::Value> {
    let (_, body) = n.get_metrics("/readyz")?;
    serde_json::from_str(&body).ok()
}

fn revision(n: &Node, endpoint: &str) -> Option<i64> {
    let o = n.etcdctl_at(endpoint, &["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    v[0]["Status"]["header"]["revision"].as_i64()
}

fn events_of(via: &Node, node: &str) -> String {
    let o = cli(via, &["events", "--node", node, "-o", "json"]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_full_disk_under_a_voter_is_reported_waited_out_and_healed_without_an_operator() {
    let ready = Duration::from_secs(90);
    let mut n1 = Node::new("full-1");
    n1.start(&[]);
    n1.wait_ready(ready);
    // The full host: its data dir on a small filesystem of its own.
    let mut n2 = Node::new("full-2");
    n2.disk_min_free = min_free_below_the_machines();
    let _tmpfs = Tmpfs::mount(&n2.data_dir, "160m");
    n2.start(&join_args(&n1));
    n2.wait_ready(ready);
    let mut n3 = Node::new("full-3");
    n3.start(&join_args(&n1));
    n3.wait_ready(ready);
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    eventually("three voters", Duration::from_secs(60), || {
        voters_named(&n1, &names)
    });
    let data_dir = n2.data_dir.display().to_string();

    // A writer putting a key every 100 ms through the other two; the longest run of failures.
    let writer = OutageWriter::start(&n1, &[n1.client_url(), n3.client_url()], "/full/");

    let entries_before = db_entries(&n2);
    let filler = fill(&n2.data_dir);
    // Values large enough that every member's database must grow: the full one cannot.
    let blob = n1.dir.join("blob");
    std::fs::write(&blob, vec![b'z'; 512 * 1024]).unwrap();
    for i in 0..8 {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ETCDCTL_API=3 etcdctl --endpoints={} --cacert={} --cert={} --key={} put /full/blob{i} < {}",
                n1.client_url(),
                n1.tls_file("ca.crt").display(),
                n1.tls_file("client.crt").display(),
                n1.tls_file("client.key").display(),
                blob.display()
            ))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", output_text(&o));
    }

    // The full host says so: /readyz names the path, the metric shows it, one event.
    let report = full_disk_reported(&n1, &n2, "full-2", &data_dir, 160.0);
    eprintln!("readyz while full: {report}");

    // Held full for a while: the member waits for room rather than restarting in a loop.
    let restarts = |n: &Node| {
        n.get_metrics("/metrics")
            .and_then(|(_, t)| metric(&t, "hostlet_etcd_member_restarts_total"))
            .unwrap_or(f64::MAX)
    };
    let full_since = Instant::now();
    while full_since.elapsed() < Duration::from_secs(20) {
        assert!(n2.exited().is_none(), "the full host's agent exited");
        std::thread::sleep(Duration::from_millis(500));
    }
    let restarted = restarts(&n2);
    eprintln!(
        "the member while full: {}",
        readyz(&n2)
            .map(|r| r["components"]["etcd"].to_string())
            .unwrap_or_default()
    );
    assert_eq!(
        restarted, 0.0,
        "the member was restarted while the disk was full"
    );
    // A snapshot asked for now is skipped with the reason; nothing is written, not even a `.part`.
    let o = cli(
        &n1,
        &[
            "etcd", "snapshot", "save", "--node", "full-2", "--name", "full",
        ],
    );
    assert!(
        !o.status.success(),
        "a snapshot on a full disk: {}",
        output_text(&o)
    );
    assert!(
        output_text(&o).contains("--disk-min-free"),
        "the reason should name the full disk: {}",
        output_text(&o)
    );
    let snapshots = n2.data_dir.join("db/snapshots");
    let files = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(files(&snapshots).is_empty(), "{:?}", files(&snapshots));
    let member_dir = n2.data_dir.join("db/etcd/member");
    assert!(member_dir.exists(), "the member dir is gone");
    assert!(
        !n2.data_dir.join("db/etcd/tombstone").exists() && !member_dir.join("tombstone").exists(),
        "a full disk was taken for a broken member"
    );
    assert!(
        backups(&n2).is_empty(),
        "the member was backed up: {:?}",
        backups(&n2)
    );
    assert_eq!(
        db_entries(&n2),
        entries_before,
        "the data dir's db/ changed"
    );

    // Room again: the member comes back and catches up with no operator action.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    wait_for_nodes(
        "/readyz ready again",
        Duration::from_secs(60),
        &[&n2],
        || n2.is_ready().then_some(()),
    );
    let worst = writer.finish();
    wait_for_nodes(
        "the member at the leader's revision",
        Duration::from_secs(30),
        &[&n2],
        || {
            let leader = revision(&n1, &n1.client_url())?;
            let mine = revision(&n1, &n2.client_url())?;
            (mine == leader).then_some(())
        },
    );
    eprintln!(
        "caught up {:.1} s after the filler went",
        freed.elapsed().as_secs_f64()
    );
    wait_for_nodes(
        "a DiskPressureRelieved event",
        Duration::from_secs(30),
        &[&n2],
        || {
            events_of(&n1, "full-2")
                .contains("DiskPressureRelieved")
                .then_some(())
        },
    );
    let after = restarts(&n2);
    assert!(
        after <= 1.0,
        "restarted {after} times: more than the one restart that waited for room"
    );
    // With room again, the next snapshot works.
    let o = cli(
        &n1,
        &[
            "etcd", "snapshot", "save", "--node", "full-2", "--name", "full",
        ],
    );
    assert!(
        o.status.success(),
        "a snapshot after the room came back: {}",
        output_text(&o)
    );
    assert_eq!(files(&snapshots).len(), 1, "{:?}", files(&snapshots));
    eprintln!("longest write outage {worst:?}");
    assert!(
        worst < Duration::from_secs(5),
        "writes failed for {worst:?}"
    );
    // Nothing was moved or deleted because of the full disk.
    assert!(backups(&n2).is_empty());
    drop(n3);
    drop(n2);
}

/// A worker's pod manifest: busybox sleeping `secs`.
fn worker_pod(n: &Node, id: &str, secs: u32) -> PathBuf {
    let file = n.dir.join(format!("{id}.yaml"));
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {id}}}\nspec:\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: Never\n    command: [sleep, \"{secs}\"]\n"
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_full_disk_under_a_worker_leaves_its_pods_running_and_their_status_resumes() {
    let ready = Duration::from_secs(90);
    let _cleanup = Cleanup("fullw-2".to_string());
    let mut n1 = Node::new("fullw-1");
    n1.start(&["--etcd-voters=1".to_string()]);
    n1.wait_ready(ready);
    // The worker (beyond the target of one voter), its data dir on a small filesystem of its own.
    let mut n2 = Node::new("fullw-2");
    n2.disk_min_free = min_free_below_the_machines();
    let _tmpfs = Tmpfs::mount(&n2.data_dir, "64m");
    n2.start(&join_args(&n1));
    n2.wait_ready(ready);
    assert!(
        n2.data_dir.join("db/worker").exists() && n2.etcd_pid().is_none(),
        "fullw-2 is a worker:\n{}",
        n2.log_tail(40)
    );
    let data_dir = n2.data_dir.display().to_string();
    let pod = "full-worker-pod";
    let o = cli(
        &n1,
        &[
            "pod",
            "apply",
            "--node",
            "fullw-2",
            "-f",
            worker_pod(&n2, pod, 86400).to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let running = wait_for_nodes("the worker's pod running", ready, &[&n2], || {
        status(&n2, pod).filter(|s| s["phase"] == "Running")
    });
    let ids = docker_ids("fullw-2", Some(pod));
    assert_eq!(ids.len(), 2, "infra + app: {ids:?}");

    let filler = fill(&n2.data_dir);
    let report = full_disk_reported(&n1, &n2, "fullw-2", &data_dir, 64.0);
    eprintln!("the worker's readyz while full: {report}");
    // Held full for a while: the pod keeps running, the same containers, the agent up.
    let full_since = Instant::now();
    while full_since.elapsed() < Duration::from_secs(15) {
        assert!(n2.exited().is_none(), "the full worker's agent exited");
        assert_eq!(
            docker_ids("fullw-2", Some(pod)),
            ids,
            "the pod's containers changed while the disk was full"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let s = status(&n2, pod).unwrap();
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(
        s["containers"][0]["containerId"], running["containers"][0]["containerId"],
        "{s}"
    );

    // Room again: ready, the pressure relieved, and a change to the pod shows in its status.
    std::fs::remove_file(&filler).unwrap();
    wait_for_nodes(
        "the worker's /readyz ready again",
        Duration::from_secs(60),
        &[&n2],
        || n2.is_ready().then_some(()),
    );
    wait_for_nodes(
        "a DiskPressureRelieved event",
        Duration::from_secs(30),
        &[&n2],
        || {
            events_of(&n1, "fullw-2")
                .contains("DiskPressureRelieved")
                .then_some(())
        },
    );
    assert_eq!(docker_ids("fullw-2", Some(pod)), ids);
    let o = cli(
        &n1,
        &[
            "pod",
            "apply",
            "--node",
            "fullw-2",
            "-f",
            worker_pod(&n2, pod, 7200).to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let old = running["containers"][0]["containerId"].clone();
    let changed = wait_for_nodes(
        "the changed pod in its status",
        Duration::from_secs(60),
        &[&n2],
        || {
            status(&n2, pod).filter(|s| {
                s["phase"] == "Running"
                    && s["containers"][0]["state"]["running"].is_object()
                    && !s["containers"][0]["containerId"].is_null()
                    && s["containers"][0]["containerId"] != old
            })
        },
    );
    eprintln!("the pod after the change: {changed}");
    n2.terminate(Duration::from_secs(30));
}

/// The full host says so: `/readyz` names the path, the metric is under 5 % of the filesystem's `fs_mib`,
/// and a `DiskPressure` event (read through `via`) names it. Returns the readiness report.
/// `--disk-min-free` for the full host: the default 5 %, or half the share the machine's own Docker root
/// has free when that is lower. The agent watches Docker's root too, and only the test's tmpfs may be full:
/// a machine short of disk must not make the host under test unready before its filler runs.
fn min_free_below_the_machines() -> String {
    let o = Command::new("docker")
        .args(["info", "-f", "{{.DockerRootDir}}"])
        .output()
        .unwrap();
    assert!(o.status.success(), "docker info: {}", output_text(&o));
    let root = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = Command::new("df")
        .args(["-B1", "--output=avail,size"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(o.status.success(), "df {root}: {}", output_text(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let figures: Vec<f64> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let [avail, size] = figures[..] else {
        panic!("df {root}: {text}");
    };
    let share = avail / size * 100.0;
    let pct = ((share / 2.0).min(5.0) * 100.0).floor() / 100.0;
    assert!(
        pct >= 0.01,
        "the machine's disk under {root} has {share:.3}% free: too full to test disk pressure on a filesystem of the test's own"
    );
    eprintln!("--disk-min-free={pct}% ({root} has {share:.2}% free)");
    format!("{pct}%")
}

fn full_disk_reported(
    via: &Node,
    n2: &Node,
    node: &str,
    data_dir: &str,
    fs_mib: f64,
) -> serde_json::Value {
    let report = wait_for_nodes(
        "/readyz to report the full disk",
        Duration::from_secs(30),
        &[n2],
        || {
            readyz(n2).filter(|r| {
                r["components"]["disk"]["ready"] == false
                    && r["components"]["disk"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(data_dir))
            })
        },
    );
    let (_, metrics) = n2.get_metrics("/metrics").unwrap();
    let free = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("hostlet_disk_free_bytes{{path=\"{data_dir}\"}} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no hostlet_disk_free_bytes for {data_dir}:\n{metrics}"));
    assert!(free < fs_mib * 1024.0 * 1024.0 * 0.05, "free {free}");
    wait_for_nodes(
        "a DiskPressure event",
        Duration::from_secs(30),
        &[via, n2],
        || {
            let ev = events_of(via, node);
            (ev.contains("DiskPressure") && ev.contains(data_dir)).then_some(())
        },
    );
    report
}
