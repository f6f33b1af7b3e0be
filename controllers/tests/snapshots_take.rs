//! Taking snapshots of a real etcd member and restoring them.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use hostlet_api::objects::SnapshotStatus;
use hostlet_controllers::snapshots::encryption::SnapshotKey;
use hostlet_controllers::snapshots::file::{sha256_file, verify, SnapshotFileError};
use hostlet_controllers::snapshots::restore::{restore, RestoreTarget};
use hostlet_controllers::snapshots::take::{take_snapshot, TakeRequest};
use hostlet_runtime::testkit::TestEtcd;
use std::process::Command;

async fn fill(etcd: &TestEtcd, n: usize) {
    let c = etcd.connect().await;
    for i in 0..n {
        c.put(format!("/snap/k{i:05}"), vec![b'v'; 1024])
            .await
            .unwrap();
    }
}

fn etcdctl_status(path: &std::path::Path) -> String {
    let out = Command::new(hostlet_runtime::testkit::etcd_program("etcdctl"))
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

use hostlet_runtime::testkit::free_port;

/// Starts etcd on a restored member dir and counts the keys under /snap/ once it serves.
async fn count_keys_served_from(member_dir: &std::path::Path) -> usize {
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let mut child = tokio::process::Command::new(hostlet_runtime::testkit::etcd_binary())
        .arg("--data-dir")
        .arg(member_dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let count = loop {
        let attempt = async {
            let c = hostlet_runtime::etcd::Etcd::connect(hostlet_runtime::etcd::EtcdConfig::new([
                url.clone(),
            ]))
            .await?;
            c.get_prefix("/snap/").await
        };
        match tokio::time::timeout(std::time::Duration::from_secs(2), attempt).await {
            Ok(Ok((kvs, _))) => break kvs.len(),
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => panic!("restored member never served: {other:?}"),
        }
    };
    let _ = child.kill().await;
    count
}

#[tokio::test]
async fn snapshot_passes_etcdctl_status_and_restores_the_same_keys() {
    let etcd = TestEtcd::start().await;
    fill(&etcd, 300).await;
    let marker = "marker-only-in-the-keyspace-7c1f";
    etcd.connect()
        .await
        .put("/snap/secret", marker.as_bytes().to_vec())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = Arc::new(SnapshotKey::from_bytes([0x5a; 32], "test.key"));
    let cases = [(false, false), (true, false), (false, true), (true, true)];
    for (i, (compress, encrypt)) in cases.into_iter().enumerate() {
        let req = TakeRequest {
            dir: dir.path().join("snapshots"),
            node: "node-a".into(),
            name: "etcd-snapshot".into(),
            compress,
            key: encrypt.then(|| key.clone()),
            on_demand: false,
        };
        let k = req.key.as_deref();
        let mut client = etcd.connect().await.client();
        let mut seen = 0;
        let rec = take_snapshot(&mut client, &req, 1_700_000_000 + i as u64, |b| seen = b)
            .await
            .unwrap();
        assert_eq!(rec.status, SnapshotStatus::Successful);
        assert!(rec.revision >= 300, "{rec:?}");
        assert!(seen > 300 * 1024, "progress reported {seen}");
        let path = req.dir.join(&rec.file);
        assert_eq!(
            rec.file.trim_end_matches(".enc").ends_with(".zst"),
            compress
        );
        assert_eq!(rec.file.ends_with(".enc"), encrypt);
        assert_eq!(rec.encrypted, encrypt);
        assert_eq!(sha256_file(&path).unwrap(), rec.sha256);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), rec.size);
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600, "{}", rec.file);
        assert_eq!(mode(&req.dir), 0o700);
        let on_disk = std::fs::read(&path).unwrap();
        let has_marker = on_disk
            .windows(marker.len())
            .any(|w| w == marker.as_bytes());
        // Only an uncompressed plain file shows the value as it is.
        assert_eq!(has_marker, !compress && !encrypt, "{}", rec.file);

        if encrypt {
            let e = verify(&path, None, None, |_| {}).unwrap_err();
            assert!(matches!(e, SnapshotFileError::Encrypted { .. }), "{e}");
            let wrong = SnapshotKey::from_bytes([0x5b; 32], "wrong.key");
            assert!(verify(&path, None, Some(&wrong), |_| {}).is_err());
        }

        // etcdctl reads the plain stream (decrypted and decompressed first).
        let plain = dir.path().join(format!("plain-{i}.db"));
        verify(&path, Some(&plain), k, |_| {}).unwrap();
        assert_eq!(mode(&plain), 0o600);
        let status = etcdctl_status(&plain);
        assert!(status.contains("\"totalKey\""), "{status}");

        // Restored into a fresh member, it holds the same keys.
        let member_dir = dir.path().join(format!("restored-{i}"));
        restore(
            &path,
            k,
            &RestoreTarget {
                member_dir: member_dir.clone(),
                name: "restored".into(),
                peer_url: "http://127.0.0.1:2380".into(),
                tool: hostlet_controllers::etcd_member::version::Capabilities::probe(
                    &hostlet_runtime::testkit::etcd_binary(),
                )
                .await
                .unwrap()
                .restore_tool(),
            },
            |_| {},
        )
        .unwrap();
        assert!(member_dir.join("member").join("wal").is_dir());
        assert_eq!(count_keys_served_from(&member_dir).await, 301);
    }
}

#[tokio::test]
async fn unwritable_snapshot_dir_fails_cleanly() {
    let etcd = TestEtcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file-not-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let req = TakeRequest {
        dir: blocker.join("snapshots"),
        node: "n".into(),
        name: "etcd-snapshot".into(),
        compress: false,
        key: None,
        on_demand: false,
    };
    let mut client = etcd.connect().await.client();
    let err = take_snapshot(&mut client, &req, 1, |_| {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("file-not-dir"), "{err}");
}
