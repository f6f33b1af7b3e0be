//! Snapshots copied to a real S3-compatible server (Garage, started per test): two nodes sharing one
//! bucket keep exactly their own counts, an outage is recorded and recovered from, and a restore from
//! `s3://` refuses a corrupted object and brings back the data from a good one.

mod member_support;
mod s3_support;

use std::process::{Command, Output};
use std::time::Duration;

use member_support::{join_args, metric, output_text, wait_for_nodes, Node, BIN};
use s3_support::{block_on, Garage, BUCKET};

const PREFIX: &str = "team/etcd";

fn local_files(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(node.data_dir.join("db/snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| !f.ends_with(".part"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Snapshot objects of `node` under the prefix, as the bucket lists them.
fn objects(g: &Garage, node: &str) -> Vec<String> {
    let mut v: Vec<String> = block_on(async { g.remote(PREFIX).list(node).await })
        .map(|l| l.into_iter().map(|(f, _)| f).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn metrics_of(node: &Node) -> String {
    node.get_metrics("/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default()
}

fn counter(node: &Node, name: &str) -> f64 {
    metric(&metrics_of(node), name).unwrap_or(0.0)
}

/// This node's records, as `snapshot ls` shows them.
fn records(node: &Node) -> Vec<serde_json::Value> {
    let o = member_support::cli(node, &["etcd", "snapshot", "ls", "-o", "json"]);
    serde_json::from_slice::<Vec<serde_json::Value>>(&o.stdout)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["node"] == node.name.as_str())
        .collect()
}

fn s3_agent_args(g: &Garage) -> Vec<String> {
    let mut a = vec![
        "--snapshot-schedule=@every 3s".to_string(),
        "--snapshot-retention=2".to_string(),
        "--snapshot-s3-retention=3".to_string(),
    ];
    a.extend(g.agent_args(PREFIX));
    a
}

#[test]
fn two_nodes_sharing_a_bucket_keep_their_own_counts_and_survive_an_outage() {
    let mut g = Garage::start();
    // Objects that are not this node's snapshots, planted where a careless prefix match would reach.
    let dir = tempfile::tempdir().unwrap();
    let stray = dir.path().join("stray");
    std::fs::write(&stray, b"not a snapshot").unwrap();
    g.put_with_sha256(&stray, &format!("{PREFIX}/s3n-1/notes.txt"), "x");
    g.put_with_sha256(
        &stray,
        &format!("{PREFIX}/elsewhere/etcd-snapshot-s3n-1-100"),
        "x",
    );
    // "s3n-1" is a prefix of "s3n-10": neither may see the other's objects.
    let mut a = Node::new("s3n-1");
    a.start(&s3_agent_args(&g));
    a.wait_ready(Duration::from_secs(60));
    let put = a.etcdctl(&["put", "/data/k1", "v1"]);
    assert!(put.status.success(), "{}", output_text(&put));
    let mut b = Node::new("s3n-10");
    let mut args = join_args(&a);
    args.extend(s3_agent_args(&g));
    b.start(&args);
    b.wait_ready(Duration::from_secs(90));

    let ok = r#"hostlet_snapshot_uploads_total{result="success"}"#;
    let steady = |g: &Garage, a: &Node, b: &Node| {
        [a, b].iter().all(|n| {
            counter(n, ok) >= 6.0
                && local_files(n).len() == 2
                && objects(g, &n.name).len() == 3
                && metric(&metrics_of(n), "hostlet_snapshot_remote_count") == Some(3.0)
                && {
                    // Every object has its record, saying it was uploaded and read back.
                    let recs = records(n);
                    objects(g, &n.name).iter().all(|f| {
                        recs.iter()
                            .any(|r| r["file"] == f.as_str() && r["remote"]["state"] == "ok")
                    })
                }
        })
    };
    wait_for_nodes(
        "6 uploads on each node, then 2 files on each disk and 3 objects under each node's prefix",
        Duration::from_secs(120),
        &[&a, &b],
        || steady(&g, &a, &b).then_some(()),
    );
    for n in [&a, &b] {
        for f in objects(&g, &n.name) {
            assert!(
                f.starts_with(&format!("etcd-snapshot-{}-", n.name)),
                "{f} under {}",
                n.name
            );
        }
    }
    let strays = block_on(async {
        let r = g.remote(PREFIX);
        (
            r.head(&r.key("s3n-1", "notes.txt")).await.is_ok(),
            r.head(&r.key("elsewhere", "etcd-snapshot-s3n-1-100"))
                .await
                .is_ok(),
        )
    });
    assert_eq!(
        strays,
        (true, true),
        "remote retention deleted an object not its own"
    );
    // Neither node deleted the other's objects: each node's copies went up once and were never found gone
    // (a node whose object vanished would record that and upload it again).
    for n in [&a, &b] {
        for r in records(n) {
            assert!(r["remote"]["error"].is_null(), "{}: {r}", n.name);
            if r["remote"]["state"] == "ok" {
                assert_eq!(r["remote"]["attempts"], 1, "{}: {r}", n.name);
            }
        }
    }

    // The server goes away: uploads fail and are recorded, local retention keeps working.
    g.stop();
    let failed = r#"hostlet_snapshot_uploads_total{result="failure"}"#;
    let before = counter(&a, failed);
    wait_for_nodes(
        "failed uploads recorded on node a",
        Duration::from_secs(90),
        &[&a],
        || {
            let failing = records(&a).into_iter().any(|r| {
                r["remote"]["state"] == "failed"
                    && r["remote"]["error"].as_str().is_some_and(|e| !e.is_empty())
                    && r["local"] != false
            });
            (counter(&a, failed) >= before + 2.0 && failing && local_files(&a).len() == 2)
                .then_some(())
        },
    );
    let failing: Vec<String> = records(&a)
        .into_iter()
        .filter(|r| r["remote"]["state"] == "failed")
        .filter_map(|r| r["file"].as_str().map(str::to_string))
        .collect();
    for f in &failing {
        assert!(
            local_files(&a).contains(f),
            "{f} failed to upload but its local file is gone: {:?}",
            local_files(&a)
        );
    }
    let o = member_support::cli(&a, &["etcd", "snapshot", "ls"]);
    assert!(
        output_text(&o).contains("failed ("),
        "ls shows no failed upload:\n{}",
        output_text(&o)
    );

    // Back again: the failed uploads are retried and the remote count recovers.
    g.resume();
    wait_for_nodes(
        "the remote copies to recover on both nodes",
        Duration::from_secs(90),
        &[&a, &b],
        || {
            let newest_ok = |n: &Node| {
                let recs = records(n);
                let newest = recs
                    .iter()
                    .filter(|r| r["local"] != false && r["status"] == "successful")
                    .max_by_key(|r| r["file"].as_str().map(str::to_string));
                newest.is_some_and(|r| r["remote"]["state"] == "ok")
            };
            (steady(&g, &a, &b) && newest_ok(&a) && newest_ok(&b)).then_some(())
        },
    );
    // (The retry of one failed upload, attempt by attempt, is a_full_bucket_keeps_the_good_copies_….)
}

/// Starts `n` snapshotting only on demand, uploading to `g`, with `extra` flags; returns it once ready.
fn on_demand(mut n: Node, g: &Garage, extra: &[&str]) -> Node {
    let mut args = vec!["--snapshot-schedule=0 0 1 1 *".to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend(g.agent_args(PREFIX));
    n.start(&args);
    n.wait_ready(Duration::from_secs(60));
    n
}

/// Saves a snapshot on demand (the save follows its upload); its record.
fn save(n: &Node, name: &str) -> serde_json::Value {
    let o = member_support::cli(
        n,
        &["etcd", "snapshot", "save", "--name", name, "-o", "json"],
    );
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("save {name}: {e}\n{}", output_text(&o)));
    recs[0].clone()
}

#[test]
fn a_full_bucket_keeps_the_good_copies_and_the_failed_uploads_are_retried() {
    let g = Garage::start();
    let n = on_demand(
        Node::new("s3q"),
        &g,
        &["--snapshot-retention=10", "--snapshot-s3-retention=2"],
    );
    // One name throughout: retention counts per name.
    for _ in 0..2 {
        let r = save(&n, "q");
        assert_eq!(r["remote"]["state"], "ok", "{r}");
    }
    let good = objects(&g, &n.name);
    assert_eq!(good.len(), 2, "{good:?}");

    // The bucket is full: uploads fail while listing and deleting still work. Retention must not make room
    // for an upload that did not happen: the two good copies stay.
    g.set_max_objects(Some(2));
    let mut failed = Vec::new();
    for _ in 0..2 {
        let r = save(&n, "q");
        assert_eq!(r["status"], "successful", "{r}");
        assert_eq!(r["remote"]["state"], "failed", "{r}");
        failed.push(r["file"].as_str().unwrap().to_string());
        assert_eq!(
            objects(&g, &n.name),
            good,
            "a good copy was deleted for an upload that failed"
        );
        assert_eq!(
            metric(&metrics_of(&n), "hostlet_snapshot_remote_count"),
            Some(2.0)
        );
    }
    for f in &failed {
        assert!(local_files(&n).contains(f), "{f} is not kept locally");
    }

    // Room again: the next run retries the failed uploads, and only then does retention drop old copies.
    g.set_max_objects(None);
    let r = save(&n, "q");
    assert_eq!(r["remote"]["state"], "ok", "{r}");
    let newest = r["file"].as_str().unwrap().to_string();
    let now = objects(&g, &n.name);
    assert_eq!(now, {
        let mut want = vec![failed[1].clone(), newest];
        want.sort();
        want
    });
    let recs = records(&n);
    let retried = recs
        .iter()
        .find(|r| r["file"] == failed[1].as_str())
        .unwrap();
    assert_eq!(retried["remote"]["state"], "ok", "{retried}");
    assert_eq!(retried["remote"]["attempts"], 2, "{retried}");
    assert_eq!(
        metric(&metrics_of(&n), "hostlet_snapshot_remote_count"),
        Some(2.0)
    );
}

fn restore(g: &Garage, url: &str, data_dir: &std::path::Path) -> Output {
    Command::new(BIN)
        .args(["etcd", "snapshot", "restore", url, "--data-dir"])
        .arg(data_dir)
        .arg(format!("--snapshot-s3-endpoint={}", g.endpoint()))
        .arg("--snapshot-s3-allow-http")
        .arg("--snapshot-s3-region=garage")
        .envs(g.env())
        .env_remove("HOSTLET_ETCD_ENDPOINTS")
        .output()
        .unwrap()
}

#[test]
fn restore_from_s3_refuses_a_corrupted_object_and_restores_a_good_one() {
    let g = Garage::start();
    let mut n = on_demand(Node::new("s3r"), &g, &["--snapshot-s3-retention=5"]);
    let put = n.etcdctl(&["put", "/data/k1", "from-the-bucket"]);
    assert!(put.status.success(), "{}", output_text(&put));
    let mut files = Vec::new();
    for name in ["good", "bad"] {
        let o = member_support::cli(
            &n,
            &["etcd", "snapshot", "save", "--name", name, "-o", "json"],
        );
        assert!(o.status.success(), "{}", output_text(&o));
        let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(recs[0]["remote"]["state"], "ok", "{recs}");
        files.push(recs[0]["file"].as_str().unwrap().to_string());
    }
    let node_name = n.name.clone();
    let url = |f: &str| format!("s3://{BUCKET}/{PREFIX}/{node_name}/{f}");

    // One byte of the "bad" object changes in the bucket; its stored sha256 stays.
    let bad = &files[1];
    let r = g.remote(PREFIX);
    let key = r.key(&n.name, bad);
    let (_, hash) = block_on(r.head(&key)).unwrap();
    let hash = hash.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("copy");
    let mut bytes = std::fs::read(n.data_dir.join("db/snapshots").join(bad)).unwrap();
    bytes[4096] ^= 0x01;
    std::fs::write(&copy, &bytes).unwrap();
    // hostlet refuses to upload data that does not hash to the sha256 it is to store beside it.
    let refused = block_on(r.upload(&copy, &n.name, bad, &hash)).expect_err("a mismatching upload");
    assert!(refused.to_string().contains("sha256"), "{refused}");
    g.put_with_sha256(&copy, key.as_ref(), &hash);
    let fresh = tempfile::tempdir().unwrap();
    let o = restore(&g, &url(bad), &fresh.path().join("bad"));
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("sha256 mismatch"),
        "{}",
        output_text(&o)
    );
    assert!(!fresh.path().join("bad/db/etcd").exists());
    assert!(
        !fresh.path().join("bad/restore-download").exists(),
        "a refused download leaves its folder behind"
    );
    let o = restore(
        &g,
        &format!("s3://{BUCKET}/{PREFIX}/s3r/no-such-object"),
        &fresh.path().join("none"),
    );
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));

    // The good one restores on a fresh data dir, with only the S3 settings and the usual variables.
    let o = restore(&g, &url(&files[0]), &fresh.path().join("good"));
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(fresh.path().join("good/db/etcd/member/wal").is_dir());
    // The download is gone once restored.
    assert!(!fresh.path().join("good/restore-download").exists());

    // A cluster reset from the object brings the snapshot's data back, whatever the member holds since.
    let put = n.etcdctl(&["put", "/data/k1", "after-the-snapshot"]);
    assert!(put.status.success(), "{}", output_text(&put));
    n.terminate(Duration::from_secs(30));
    let mut reset = vec![
        "--cluster-reset".to_string(),
        format!("--cluster-reset-restore-path={}", url(&files[0])),
    ];
    reset.extend(g.agent_args(PREFIX));
    let o = n.run_to_exit(&reset, Duration::from_secs(120));
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(!n.data_dir.join("restore-download").join(&files[0]).exists());
    n.start(&g.agent_args(PREFIX));
    n.wait_ready(Duration::from_secs(60));
    // The restarted agent counts the objects already in the bucket (good and bad) before any pass.
    member_support::eventually(
        "the remote count of the restarted agent",
        Duration::from_secs(30),
        || (counter(&n, "hostlet_snapshot_remote_count") == 2.0).then_some(()),
    );
    let got = n.etcdctl(&["get", "/data/k1", "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "from-the-bucket",
        "{}",
        output_text(&got)
    );

    // A fresh host (an empty data dir) with only the token and the S3 settings resets a new cluster from
    // the object and serves the data.
    let token = n.token();
    n.terminate(Duration::from_secs(30));
    let mut fresh_host = Node::new("s3r-new");
    let mut reset = vec![
        "--cluster-reset".to_string(),
        format!("--cluster-reset-restore-path={}", url(&files[0])),
        format!("--token={token}"),
    ];
    reset.extend(g.agent_args(PREFIX));
    // Fail closed: the host has no record of the old cluster's members, so it cannot show them down; the
    // operator says they are gone for good.
    let o = fresh_host.run_to_exit(&reset, Duration::from_secs(120));
    assert!(!o.status.success(), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("--cluster-reset-lost all"),
        "{}",
        output_text(&o)
    );
    assert!(!fresh_host.data_dir.join("db/etcd").exists());
    reset.push("--cluster-reset-lost=all".to_string());
    let o = fresh_host.run_to_exit(&reset, Duration::from_secs(120));
    assert!(o.status.success(), "{}", output_text(&o));
    // The old CA went with the old host: the token keeps its secret and names the new CA.
    let secret = |t: &str| t.rsplit("::").next().unwrap_or_default().to_string();
    assert_eq!(secret(&fresh_host.token()), secret(&token));
    assert_ne!(fresh_host.token(), token);
    fresh_host.start(&g.agent_args(PREFIX));
    fresh_host.wait_ready(Duration::from_secs(60));
    let got = fresh_host.etcdctl(&["get", "/data/k1", "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "from-the-bucket",
        "{}",
        output_text(&got)
    );
}

/// A private endpoint behind TLS (socat terminating it with a certificate of a CA of the test's own, in
/// front of the server): reached with `--snapshot-s3-ca-file`, refused without it.
#[test]
fn a_private_tls_endpoint_is_trusted_through_its_ca_file_only() {
    use hostlet_controllers::pki::ClusterCa;
    use hostlet_controllers::snapshots::remote::Remote;

    let g = Garage::start();
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    let server = ca
        .issue_node("s3", &["127.0.0.1".to_string()])
        .unwrap()
        .server;
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.cert).unwrap();
    let pem = dir.path().join("server.pem");
    std::fs::write(&pem, format!("{}\n{}", server.cert, server.key)).unwrap();
    let port = member_support::free_port();
    let mut socat = Command::new("socat")
        .arg(format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={}",
            pem.display()
        ))
        .arg(format!("TCP:127.0.0.1:{}", g.s3_port))
        .spawn()
        .expect("socat (hack/install-deps.sh installs it)");
    member_support::eventually("the TLS endpoint", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .is_ok()
            .then_some(())
    });
    let file = dir.path().join("snap-n-1");
    std::fs::write(&file, b"a snapshot's bytes").unwrap();
    let sha = hostlet_controllers::snapshots::file::sha256_file(&file).unwrap();

    let mut target = g.target("tls");
    target.endpoint = Some(format!("https://127.0.0.1:{port}"));
    let untrusted = Remote::new(&target).unwrap();
    let refused = block_on(untrusted.upload(&file, "n", "snap-n-1", &sha));
    assert!(
        refused.is_err(),
        "a certificate of an unknown CA was trusted"
    );

    target.ca_file = Some(ca_file);
    let trusted = Remote::new(&target).unwrap();
    block_on(trusted.upload(&file, "n", "snap-n-1", &sha)).expect("upload through TLS");
    let (size, stored) = block_on(trusted.head(&trusted.key("n", "snap-n-1"))).unwrap();
    assert_eq!(size, 18);
    assert_eq!(stored.as_deref(), Some(sha.as_str()));
    let _ = socat.kill();
    let _ = socat.wait();
}

/// A file of `mib` MiB of varied bytes.
fn big_file(path: &std::path::Path, mib: usize) {
    let mut bytes = Vec::with_capacity(mib << 20);
    let mut x = 0x9e37_79b9_u32;
    while bytes.len() < mib << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, &bytes).unwrap();
}

/// Upload progress counts the parts the server has taken: from 0, growing part by part, to the size.
#[test]
fn an_upload_reports_each_acknowledged_part_up_to_its_size() {
    let g = Garage::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd-snapshot-p-1");
    big_file(&file, 40);
    let sha = hostlet_controllers::snapshots::file::sha256_file(&file).unwrap();
    let mut seen = Vec::new();
    block_on(
        g.remote(PREFIX)
            .upload_with(&file, "p", "etcd-snapshot-p-1", &sha, |sent, total| {
                seen.push((sent, total))
            }),
    )
    .expect("upload");
    let size = 40u64 << 20;
    assert!(seen.iter().all(|(_, t)| *t == size), "{seen:?}");
    let sent: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    // 40 MiB in 16 MiB parts: the start, then three parts.
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!(sent[0], 0);
    assert!(sent.windows(2).all(|w| w[0] < w[1]), "{sent:?}");
    assert_eq!(sent.last(), Some(&size));
    assert_eq!(objects(&g, "p"), ["etcd-snapshot-p-1"]);
}

/// `snapshot save` follows the agent's upload too: its plain lines (stderr is no terminal here) reach the
/// object's size and end with the copy's state, and the agent wrote the request's progress at most once a
/// second (plus once at the upload's start and end), not once per chunk.
#[test]
fn save_follows_the_upload_to_its_total_with_few_progress_writes() {
    let mut g = Garage::start();
    let n = on_demand(
        Node::new("s3p").insecure(),
        &g,
        &["--snapshot-s3-retention=5", "--etcd-compaction-retention=0"],
    );
    // Data enough for a snapshot of several upload parts.
    let before = block_on(async {
        let mut c = etcd_client::Client::connect([n.client_url()], None)
            .await
            .unwrap();
        let value: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        for i in 0..40 {
            c.put(format!("/data/big/{i:02}"), value.clone(), None)
                .await
                .unwrap();
        }
        c.get("/data/big/00", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision()
    });

    let started = std::time::Instant::now();
    let o = member_support::cli(
        &n,
        &["etcd", "snapshot", "save", "--name", "big", "-o", "json"],
    );
    let took = started.elapsed();
    assert!(o.status.success(), "{}", output_text(&o));
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rec = &recs[0];
    assert_eq!(rec["remote"]["state"], "ok", "{rec}");
    let file = rec["file"].as_str().unwrap();
    let size = rec["size"].as_u64().unwrap();
    assert!(size > 32 << 20, "a snapshot of three parts at least: {rec}");
    let url = format!("s3://{BUCKET}/{PREFIX}/s3p/{file}");

    let err = member_support::stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    let at = |pred: &dyn Fn(&str) -> bool, what: &str| {
        lines
            .iter()
            .position(|l| pred(l))
            .unwrap_or_else(|| panic!("no line {what}:\n{err}"))
    };
    // The size as the CLI prints sizes.
    let human = hostlet_controllers::members::table::human_size(size);
    let received = at(
        &|l| l.starts_with("  done: received "),
        "with the snapshot received",
    );
    let uploading = at(
        &|l| l == format!("uploading {file} to {url}"),
        "naming the upload",
    );
    let full = at(
        &|l| l == format!("  uploaded {human} of {human} (100%)"),
        "with the upload at its total",
    );
    let done = at(
        &|l| l.starts_with(&format!("  done: uploaded {human} in ")),
        "ending the upload",
    );
    let state = at(
        &|l| l == format!("remote copy ok: {url} (size and sha256 read back)"),
        "with the copy's state",
    );
    assert!(
        received < uploading && uploading < full && full < done && done < state,
        "out of order:\n{err}"
    );
    for l in &lines[uploading + 1..full] {
        assert!(
            l.starts_with("  uploaded ") && !l.contains('\r'),
            "{l:?}:\n{err}"
        );
    }

    // The request key's history: every progress write the agent made for this request.
    let writes: Vec<serde_json::Value> = block_on(async {
        let mut c = etcd_client::Client::connect([n.client_url()], None)
            .await
            .unwrap();
        let key = "/hostlet/hosts/s3p/requests/snapshot";
        let (_w, mut stream) = c
            .watch(
                key,
                Some(etcd_client::WatchOptions::new().with_start_revision(before + 1)),
            )
            .await
            .unwrap();
        let mut puts = Vec::new();
        loop {
            let resp = tokio::time::timeout(Duration::from_secs(20), stream.message())
                .await
                .expect("the request's history")
                .unwrap()
                .unwrap();
            for ev in resp.events() {
                if ev.event_type() == etcd_client::EventType::Delete {
                    return puts;
                }
                let v = ev.kv().map(|kv| kv.value()).unwrap_or_default();
                puts.push(serde_json::from_slice(v).unwrap());
            }
        }
    });
    let progress: Vec<&serde_json::Value> = writes
        .iter()
        .filter(|w| {
            w["state"] == "running"
                && (w.get("progressBytes").is_some() || w.get("upload").is_some())
        })
        .collect();
    let uploads: Vec<&serde_json::Value> =
        progress.iter().filter_map(|w| w.get("upload")).collect();
    let last = uploads.last().expect("no upload progress written");
    assert_eq!(last["file"], file);
    assert_eq!(last["url"], url.as_str());
    assert_eq!(last["sentBytes"].as_u64(), Some(size), "{last}");
    assert_eq!(last["totalBytes"].as_u64(), Some(size), "{last}");
    let sent: Vec<u64> = uploads
        .iter()
        .filter_map(|u| u["sentBytes"].as_u64())
        .collect();
    assert_eq!(
        sent.first(),
        Some(&0),
        "the upload's start is written: {sent:?}"
    );
    assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{sent:?}");
    // The first write at once, then one a second at most, and the upload's start and end.
    let bound = took.as_secs() as usize + 3;
    assert!(
        progress.len() <= bound,
        "{} progress writes in {took:?}: {progress:#?}",
        progress.len()
    );

    // With the server gone the snapshot is still taken; the save says the copy failed, and why.
    g.stop();
    let o = member_support::cli(&n, &["etcd", "snapshot", "save", "--name", "offline"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let err = member_support::stderr(&o);
    let failed = err
        .lines()
        .find(|l| l.starts_with("remote copy failed: s3://"))
        .unwrap_or_else(|| panic!("no failed copy line:\n{err}"));
    assert!(
        failed.contains(&format!("/{PREFIX}/s3p/offline-s3p-"))
            && failed.ends_with("; the agent retries it on every run"),
        "{failed}"
    );
}

/// `hostlet etcd snapshot prune` applies remote retention as the scheduler does: from the policy key, or
/// from `--s3-retention`, per name, under this node's own prefix only (another node whose name starts with
/// this one's keeps its objects).
#[test]
fn prune_applies_remote_retention_from_the_policy_key_or_its_flag_to_this_node_only() {
    let g = Garage::start();
    let n = on_demand(
        Node::new("s3p"),
        &g,
        &["--snapshot-retention=10", "--snapshot-s3-retention=10"],
    );
    let mut saved = Vec::new();
    for name in ["p", "p", "p", "p", "other"] {
        let r = save(&n, name);
        assert_eq!(r["remote"]["state"], "ok", "{r}");
        saved.push(r["file"].as_str().unwrap().to_string());
    }
    // A neighbour's objects: a node named "s3p-x", whose prefix starts with this node's name.
    let neighbour = "s3p-x";
    let r = g.remote(PREFIX);
    for f in &saved[..2] {
        let theirs = f.replace("-s3p-", &format!("-{neighbour}-"));
        let local = n.data_dir.join("db/snapshots").join(f);
        let sha = records(&n)
            .into_iter()
            .find(|rec| rec["file"] == f.as_str())
            .and_then(|rec| rec["sha256"].as_str().map(str::to_string))
            .unwrap();
        block_on(r.upload(&local, neighbour, &theirs, &sha)).unwrap();
    }
    assert_eq!(objects(&g, neighbour).len(), 2);
    assert_eq!(objects(&g, &n.name).len(), 5);

    // The policy key says 3 per name: the agent applies it at once, and prune (no flag) reads the same
    // retention from the key rather than the agent's flag (10).
    let put = n.etcdctl(&[
        "put",
        "/hostlet/config/snapshots",
        r#"{"s3": {"retention": 3}}"#,
    ]);
    assert!(put.status.success(), "{}", output_text(&put));
    let mut want: Vec<String> = saved[1..].to_vec();
    want.sort();
    member_support::eventually(
        "the agent to apply the policy key's remote retention",
        Duration::from_secs(30),
        || (objects(&g, &n.name) == want).then_some(()),
    );
    let o = member_support::cli(&n, &["etcd", "snapshot", "prune"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("0 object(s) deleted under this node's prefix, retention 3"),
        "{}",
        output_text(&o)
    );
    assert_eq!(objects(&g, &n.name), want);

    // The flag wins over the key: 1 per name.
    let o = member_support::cli(&n, &["etcd", "snapshot", "prune", "--s3-retention", "1"]);
    assert!(o.status.success(), "{}", output_text(&o));
    for f in &saved[1..3] {
        let url = format!("s3://{BUCKET}/{PREFIX}/s3p/{f}");
        assert!(
            output_text(&o).contains(&format!("deleted object {url}")),
            "{}",
            output_text(&o)
        );
    }
    let mut want = vec![saved[3].clone(), saved[4].clone()];
    want.sort();
    assert_eq!(objects(&g, &n.name), want);
    // Local files follow local retention (10), not the remote one; the neighbour was not touched.
    assert_eq!(local_files(&n).len(), 5);
    assert_eq!(objects(&g, neighbour).len(), 2);
    // Records of pruned copies say so.
    let recs = records(&n);
    let first = recs
        .iter()
        .find(|r| r["file"] == saved[0].as_str())
        .unwrap();
    assert_eq!(first["remote"]["state"], "pruned", "{first}");
}

fn sha256_hex(p: &std::path::Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Every path under `dir` with its size: what "unchanged" is checked against (the lock file left out).
fn tree(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if rel == "hostlet.lock" {
                continue;
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
            out.push((rel, if meta.is_dir() { 0 } else { meta.len() }));
        }
    }
    out.sort();
    out
}

/// With a key, the object in the bucket is encrypted: the data cannot be read from it, a restore needs the
/// key, and an object rewritten whole — data and stored sha256 agreeing, as anyone with write access to
/// the bucket could make it — is refused before anything is moved. An endpoint written into the policy
/// key is ignored with an event naming the field.
#[test]
fn encrypted_objects_hide_the_data_and_restore_only_with_their_key_and_whole() {
    use std::os::unix::fs::PermissionsExt;
    let g = Garage::start();
    let keys = tempfile::tempdir().unwrap();
    let key_file = |name: &str, byte: u8| {
        let p = keys.path().join(name);
        std::fs::write(&p, format!("{byte:02x}").repeat(32)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    let key = key_file("snap.key", 0x44);
    let wrong = key_file("wrong.key", 0x45);
    let key_arg = format!("--snapshot-encryption-key-file={}", key.display());
    let mut n = on_demand(Node::new("s3e"), &g, &[key_arg.as_str()]);
    let marker = "s3-at-rest-marker-5d0b7a";
    let put = n.etcdctl(&["put", "/data/secret", marker]);
    assert!(put.status.success(), "{}", output_text(&put));

    // A policy key cannot send the snapshots elsewhere.
    let put = n.etcdctl(&[
        "put",
        "/hostlet/config/snapshots",
        r#"{"s3": {"endpoint": "https://elsewhere.invalid:9000"}}"#,
    ]);
    assert!(put.status.success(), "{}", output_text(&put));
    member_support::eventually(
        "an event naming the ignored field",
        Duration::from_secs(30),
        || {
            let o = member_support::cli(&n, &["events", "-o", "json"]);
            let t = String::from_utf8_lossy(&o.stdout).into_owned();
            (t.contains("SnapshotPolicyFieldIgnored") && t.contains("s3.endpoint")).then_some(())
        },
    );

    let rec = save(&n, "sealed");
    assert_eq!(rec["remote"]["state"], "ok", "{rec}");
    assert_eq!(rec["encrypted"], true, "{rec}");
    let file = rec["file"].as_str().unwrap().to_string();
    assert!(file.ends_with(".enc"), "{file}");
    let r = g.remote(PREFIX);
    let key_path = r.key(&n.name, &file);
    let work = tempfile::tempdir().unwrap();
    let object = work.path().join("object");
    block_on(r.download(key_path.as_ref(), &object)).unwrap();
    assert_eq!(
        std::fs::metadata(&object).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let bytes = std::fs::read(&object).unwrap();
    assert!(
        !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "the marker is readable in the object"
    );

    let url = format!("s3://{BUCKET}/{PREFIX}/{}/{file}", n.name);
    let restore_with = |data_dir: &std::path::Path, key: Option<&std::path::Path>| {
        let mut c = Command::new(BIN);
        c.args(["etcd", "snapshot", "restore", &url, "--data-dir"])
            .arg(data_dir)
            .arg(format!("--snapshot-s3-endpoint={}", g.endpoint()))
            .arg("--snapshot-s3-allow-http")
            .arg("--snapshot-s3-region=garage")
            .envs(g.env())
            .env_remove("HOSTLET_ETCD_ENDPOINTS");
        if let Some(k) = key {
            c.arg(format!("--snapshot-encryption-key-file={}", k.display()));
        }
        c.output().unwrap()
    };
    let target = work.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let before = tree(&target);
    for (what, k, needle) in [
        ("no key", None, "no key was given"),
        ("another key", Some(wrong.as_path()), "another key"),
    ] {
        let o = restore_with(&target, k);
        assert_eq!(o.status.code(), Some(4), "{what}: {}", output_text(&o));
        assert!(
            output_text(&o).contains(needle),
            "{what}: {}",
            output_text(&o)
        );
        assert_eq!(tree(&target), before, "{what}");
    }
    // http:// without its flag is refused before any request.
    let o = Command::new(BIN)
        .args(["etcd", "snapshot", "restore", &url, "--check-only"])
        .arg(format!("--snapshot-s3-endpoint={}", g.endpoint()))
        .arg(&key_arg)
        .envs(g.env())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("--snapshot-s3-allow-http"),
        "{}",
        output_text(&o)
    );

    let o = restore_with(&work.path().join("good"), Some(&key));
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(work.path().join("good/db/etcd/member/wal").is_dir());

    // One byte of the object changes, and its stored sha256 with it.
    let mut changed = bytes.clone();
    let at = changed.len() / 3;
    changed[at] ^= 0x01;
    let copy = work.path().join("changed");
    std::fs::write(&copy, &changed).unwrap();
    g.put_with_sha256(&copy, key_path.as_ref(), &sha256_hex(&copy));
    let o = restore_with(&target, Some(&key));
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(output_text(&o).contains("changed"), "{}", output_text(&o));
    assert_eq!(tree(&target), before);

    // A cluster reset from the changed object is refused too, its data dir untouched.
    n.terminate(Duration::from_secs(30));
    let before = tree(&n.data_dir);
    let mut reset = vec![
        "--cluster-reset".to_string(),
        format!("--cluster-reset-restore-path={url}"),
        key_arg.clone(),
    ];
    reset.extend(g.agent_args(PREFIX));
    let o = n.run_to_exit(&reset, Duration::from_secs(120));
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert_eq!(tree(&n.data_dir), before);
}
