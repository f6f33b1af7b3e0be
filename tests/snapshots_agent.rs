//! Snapshots through the agent and the CLI: save/ls/delete/prune, restore, and a SIGKILL in the middle of a
//! large snapshot leaving no partial file under a final name.

mod member_support;

use std::process::{Command, Output};
use std::time::Duration;

use member_support::{eventually, Node};

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");

fn cli(node: &Node, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(&node.data_dir)
        .env_remove("HOSTLET_ETCD_ENDPOINTS")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Off a terminal, progress is whole lines ending in a done line naming the bytes.
fn assert_plain_progress(o: &Output, verb: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains('\r'), "a carriage return in {err:?}");
    assert!(
        err.lines()
            .any(|l| l.trim_start().starts_with(&format!("done: {verb} "))),
        "no done line in {err:?}"
    );
}

/// Runs hostlet with a pseudo-terminal for its stdout and stderr (util-linux `script`) and returns what the
/// terminal showed.
fn on_a_terminal(args: &[&str]) -> String {
    let quote = |a: &str| format!("'{}'", a.replace('\'', "'\\''"));
    let line = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ");
    let o = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("HOSTLET_ETCD_ENDPOINTS")
        .output()
        .unwrap();
    let shown = text(&o);
    assert!(o.status.success(), "{line}: {shown}");
    shown
}

fn snapshot_files(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(node.data_dir.join("db/snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn save_ls_delete_prune_and_restore_through_the_cli() {
    let mut node = Node::new("snap-cli");
    node.start(&["--snapshot-schedule=0 0 1 1 *".to_string()]);
    node.wait_ready(Duration::from_secs(60));
    let put = node.etcdctl(&["put", "/data/k1", "v1"]);
    assert!(put.status.success(), "{}", text(&put));

    let o = cli(
        &node,
        &[
            "etcd",
            "snapshot",
            "save",
            "--name",
            "before-upgrade",
            "-o",
            "json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file = recs[0]["file"].as_str().unwrap().to_string();
    assert!(file.starts_with("before-upgrade-snap-cli-"), "{file}");
    assert_plain_progress(&o, "received");
    assert_eq!(snapshot_files(&node), vec![file.clone()]);

    for _ in 0..2 {
        let o = cli(
            &node,
            &["etcd", "snapshot", "save", "--name", "before-upgrade"],
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = cli(&node, &["etcd", "snapshot", "ls", "-o", "json"]);
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(recs.as_array().unwrap().len(), 3, "{recs}");

    let o = cli(&node, &["etcd", "snapshot", "prune", "--retention", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(snapshot_files(&node).len(), 1);
    let kept = snapshot_files(&node)[0].clone();

    // The kept file restores offline into a fresh data dir holding the same key.
    let restore_dir = node.dir.join("restored");
    let o = Command::new(BIN)
        .args(["etcd", "snapshot", "restore"])
        .arg(node.data_dir.join("db/snapshots").join(&kept))
        .arg("--data-dir")
        .arg(&restore_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(restore_dir.join("db/etcd/member/wal").is_dir());
    assert_plain_progress(&o, "checked");

    // On a terminal the same restore draws a bar (bytes, rate, ETA) instead of plain lines.
    let shown = on_a_terminal(&[
        "etcd",
        "snapshot",
        "restore",
        &node
            .data_dir
            .join("db/snapshots")
            .join(&kept)
            .to_string_lossy(),
        "--data-dir",
        &node.dir.join("restored-tty").to_string_lossy(),
    ]);
    assert!(
        node.dir.join("restored-tty/db/etcd/member/wal").is_dir(),
        "{shown}"
    );
    assert!(
        shown.contains("ETA") && shown.contains("/s"),
        "no bar: {shown:?}"
    );
    assert!(
        shown.contains("\x1b["),
        "no terminal control sequences: {shown:?}"
    );
    assert!(
        // A plain line ends in the share done, "(40%)".
        !shown.contains("%)"),
        "plain progress lines on a terminal: {shown:?}"
    );
    assert!(shown.contains("done: checked "), "{shown:?}");

    let o = cli(&node, &["etcd", "snapshot", "delete", &kept]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(snapshot_files(&node).is_empty());
    let o = cli(&node, &["etcd", "snapshot", "ls", "-o", "json"]);
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(recs.as_array().unwrap().len(), 0);
    // Exit codes (docs/reference.md): 3 not found, 4 refused.
    let o = cli(&node, &["etcd", "snapshot", "delete", &kept]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = cli(&node, &["etcd", "snapshot", "delete", "../x"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = cli(&node, &["etcd", "snapshot", "save", "--name", "bad/name"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = Command::new(BIN)
        .args(["etcd", "snapshot", "restore", "--check-only"])
        .arg(node.dir.join("no-such-snapshot"))
        .arg("--data-dir")
        .arg(node.dir.join("restore-2"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let junk = node.dir.join("junk.db");
    std::fs::write(&junk, vec![7u8; 544]).unwrap();
    let o = Command::new(BIN)
        .args(["etcd", "snapshot", "restore", "--check-only"])
        .arg(&junk)
        .arg("--data-dir")
        .arg(node.dir.join("restore-2"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
}

#[test]
fn sigkill_in_the_middle_of_a_large_snapshot_leaves_no_partial_final_file() {
    let mut node = Node::new("snap-kill").insecure();
    node.start(&["--snapshot-schedule=0 0 1 1 *".to_string()]);
    node.wait_ready(Duration::from_secs(60));
    // ~160 MB of data, 1 MB per put.
    let value = "x".repeat(1 << 20);
    let endpoint = node.client_url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = hostlet_runtime::Etcd::connect(hostlet_runtime::EtcdConfig::new([endpoint]))
            .await
            .unwrap();
        for i in 0..160 {
            c.put(format!("/big/{i}"), value.as_bytes()).await.unwrap();
        }
    });
    let mut save = Command::new(BIN)
        .args(["etcd", "snapshot", "save", "--data-dir"])
        .arg(&node.data_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let snaps = node.data_dir.join("db/snapshots");
    eventually(
        "a .part file being written",
        Duration::from_secs(60),
        || {
            let files = std::fs::read_dir(&snaps).ok()?;
            files
                .flatten()
                .any(|e| {
                    e.file_name().to_string_lossy().ends_with(".part")
                        && e.metadata().map(|m| m.len() > 0).unwrap_or(false)
                })
                .then_some(())
        },
    );
    let etcd_pid = node.etcd_pid();
    node.kill();
    let _ = save.kill();
    if let Some(pid) = etcd_pid {
        eventually("etcd to follow hostlet", Duration::from_secs(20), || {
            (!member_support::alive(pid)).then_some(())
        });
    }
    let _ = save.wait();
    for f in snapshot_files(&node) {
        assert!(
            f.ends_with(".part"),
            "a final name appeared before the snapshot was whole: {f}"
        );
    }
    // etcd follows hostlet through its parent-death signal; its ports free up once it is gone.
    eventually(
        "the old member's ports to be free",
        Duration::from_secs(30),
        || {
            [node.client_port, node.peer_port]
                .iter()
                .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
                .then_some(())
        },
    );
    node.start(&["--snapshot-schedule=0 0 1 1 *".to_string()]);
    node.wait_ready(Duration::from_secs(60));
    eventually(".part cleaned at start", Duration::from_secs(30), || {
        snapshot_files(&node)
            .iter()
            .all(|f| !f.ends_with(".part"))
            .then_some(())
    });
}

#[test]
fn prune_without_flags_applies_the_agents_retention_from_its_config_file() {
    let mut node = Node::new("snap-prune-cfg");
    let config = node.dir.join("hostlet.yaml");
    std::fs::write(&config, "snapshot-retention: 7\n").unwrap();
    node.start(&[
        "--snapshot-schedule=0 0 1 1 *".to_string(),
        format!("--config={}", config.display()),
    ]);
    node.wait_ready(Duration::from_secs(60));
    for _ in 0..6 {
        let o = cli(&node, &["etcd", "snapshot", "save", "--name", "nightly"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert_eq!(snapshot_files(&node).len(), 6);
    // The agent keeps 7 per name: so does prune, where a default of its own would delete.
    let o = cli(&node, &["etcd", "snapshot", "prune"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("retention 7"), "{}", text(&o));
    assert_eq!(snapshot_files(&node).len(), 6);
    // A policy key wins over the file, for prune as for the agent.
    let put = node.etcdctl(&[
        "put",
        &format!("/hostlet/hosts/{}/config/snapshots", node.name),
        r#"{"retention": 4}"#,
    ]);
    assert!(put.status.success(), "{}", text(&put));
    let o = cli(&node, &["etcd", "snapshot", "prune"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("retention 4"), "{}", text(&o));
    member_support::eventually("4 files left", Duration::from_secs(30), || {
        (snapshot_files(&node).len() == 4).then_some(())
    });
    let o = cli(&node, &["etcd", "snapshot", "prune", "--retention", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(snapshot_files(&node).len(), 3);
}

/// SIGTERM while an on-demand snapshot is under way: the request is answered ("interrupted"), never left
/// `running` with nobody to finish it; the agent exits within 15 s; no partial file is left or catalogued.
/// The object store accepts connections and never answers, so the request is still running (its upload
/// pass waiting on the bucket) when the agent is told to stop.
#[test]
fn sigterm_during_a_snapshot_answers_its_request_and_the_agent_exits_in_time() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming().flatten() {
            held.push(c);
        }
    });
    let mut node = Node::new("snap-stop");
    std::fs::create_dir_all(&node.dir).unwrap();
    let creds = node.dir.join("s3-credentials");
    std::fs::write(
        &creds,
        "AWS_ACCESS_KEY_ID=hostlet-test\nAWS_SECRET_ACCESS_KEY=hostlet-test-secret\n",
    )
    .unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    node.start(&[
        format!("--snapshot-s3-endpoint=http://127.0.0.1:{port}"),
        "--snapshot-s3-allow-http".to_string(),
        "--snapshot-s3-bucket=silent".to_string(),
        "--snapshot-s3-region=test".to_string(),
        format!("--snapshot-s3-credentials-file={}", creds.display()),
    ]);
    node.wait_ready(Duration::from_secs(60));

    let (tx, rx) = std::sync::mpsc::channel();
    let save = {
        let data_dir = node.data_dir.clone();
        std::thread::spawn(move || {
            let o = Command::new(BIN)
                .args([
                    "etcd",
                    "snapshot",
                    "save",
                    "--name",
                    "stopping",
                    "--data-dir",
                ])
                .arg(&data_dir)
                .env_remove("HOSTLET_ETCD_ENDPOINTS")
                .output()
                .unwrap();
            let _ = tx.send(o);
        })
    };
    let key = format!("/hostlet/hosts/{}/requests/snapshot", node.name);
    eventually("the request to run", Duration::from_secs(60), || {
        let o = node.etcdctl(&["get", &key, "--print-value-only"]);
        String::from_utf8_lossy(&o.stdout)
            .contains(r#""state":"running""#)
            .then_some(())
    });

    let status = node.terminate(Duration::from_secs(15));
    assert!(
        status.success(),
        "the agent's exit: {status:?}\n{}",
        node.log_tail(40)
    );
    let o = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the CLI to end once its request is answered");
    save.join().unwrap();
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("interrupted: the agent stopped while taking this snapshot"),
        "the request's answer: {out}\n{}",
        node.log_tail(40)
    );
    let parts: Vec<String> = snapshot_files(&node)
        .into_iter()
        .filter(|f| f.ends_with(".part"))
        .collect();
    assert!(parts.is_empty(), "partial files left: {parts:?}");
}

#[test]
fn a_new_snapshot_never_makes_the_files_on_disk_exceed_the_retention() {
    use notify::{EventKind, RecursiveMode, Watcher};
    let mut node = Node::new("snap-room");
    node.start(&[
        "--snapshot-schedule=0 0 1 1 *".to_string(),
        "--snapshot-retention=2".to_string(),
    ]);
    node.wait_ready(Duration::from_secs(60));
    let save = |node: &Node| {
        let o = cli(node, &["etcd", "snapshot", "save", "--name", "room"]);
        assert!(o.status.success(), "{}", text(&o));
    };
    save(&node);
    save(&node);
    assert_eq!(snapshot_files(&node).len(), 2);

    // Every file made or removed in the directory, in the kernel's order: a `.part` file takes disk as
    // its final file will.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |r: notify::Result<notify::Event>| {
        let _ = tx.send(r);
    })
    .unwrap();
    watcher
        .watch(
            &node.data_dir.join("db/snapshots"),
            RecursiveMode::NonRecursive,
        )
        .unwrap();
    for _ in 0..2 {
        save(&node);
    }
    // The events come on the watcher's thread: read until both takes' file and deletion are in.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut made, mut removed) = (0, 0);
    let mut on_disk: i64 = 2;
    let mut most = on_disk;
    let mut seen = Vec::new();
    while made < 2 || removed < 2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let e = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no more change events within 30 s: {seen:#?}"))
            .expect("a change event");
        match e.kind {
            EventKind::Create(_) => {
                made += 1;
                on_disk += 1;
            }
            EventKind::Remove(_) => {
                removed += 1;
                on_disk -= 1;
            }
            _ => continue,
        }
        seen.push(format!("{:?} {:?}", e.kind, e.paths));
        most = most.max(on_disk);
    }
    drop(watcher);
    assert_eq!(on_disk, 2, "{seen:#?}");
    assert_eq!(snapshot_files(&node).len(), 2);
    assert!(
        most <= 2,
        "{most} files on disk at once with a retention of 2: {seen:#?}"
    );
}
