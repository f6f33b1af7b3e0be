//! Snapshots at rest on a real agent: files 0600 in 0700 dirs, encrypted with the node's key so the data
//! cannot be read from them, and restored (offline, or by a cluster reset) only with that key and only
//! whole — a refused restore leaves the data dir as it was. Also the start-time refusals of this surface:
//! a key file others can read, `http://` object storage without its flag, and `--etcd-insecure` on a
//! non-loopback address (refused before anything binds).

mod member_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use member_support::{output_text, Node, BIN};

const MARKER: &str = "at-rest-marker-3f9c2e71";

fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{}\n", hex_of(byte))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn hex_of(byte: u8) -> String {
    format!("{byte:02x}").repeat(32)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every path under `dir` with its size and modification time: what "unchanged" is checked against. The
/// data dir's lock file is left out: every start, refused or not, takes the lock and writes its pid there.
fn tree(dir: &Path) -> Vec<(String, u64, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if rel == "hostlet.lock" {
                continue;
            }
            if meta.is_dir() {
                stack.push(p);
                out.push((rel, 0, None));
            } else {
                out.push((rel, meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

fn restore(file: &Path, data_dir: &Path, key: Option<&Path>) -> Output {
    let mut c = Command::new(BIN);
    c.args(["etcd", "snapshot", "restore"])
        .arg(file)
        .arg("--data-dir")
        .arg(data_dir);
    if let Some(k) = key {
        c.arg(format!("--snapshot-encryption-key-file={}", k.display()));
    }
    c.output().unwrap()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn encrypted_snapshots_hide_the_data_and_restore_only_whole_and_with_their_key() {
    let mut node = Node::new("at-rest");
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), "snap.key", 0x11);
    let wrong = key_file(keys.path(), "other.key", 0x22);
    let key_arg = format!("--snapshot-encryption-key-file={}", key.display());
    let args = vec!["--snapshot-schedule=0 0 1 1 *".to_string(), key_arg.clone()];

    // A key file others may read stops the start before anything binds, naming the file.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = node.run_to_exit(&args, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains(&key.display().to_string())
            && output_text(&o).contains("chmod 600"),
        "{}",
        output_text(&o)
    );
    assert!(!output_text(&o).contains(&hex_of(0x11)));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();

    node.start(&args);
    node.wait_ready(Duration::from_secs(90));
    let put = node.etcdctl(&["put", "/data/secret", MARKER]);
    assert!(put.status.success(), "{}", output_text(&put));
    let o = member_support::cli(&node, &["etcd", "snapshot", "save", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file = recs[0]["file"].as_str().unwrap().to_string();
    assert!(file.ends_with(".enc"), "{file}");
    assert_eq!(recs[0]["encrypted"], true, "{recs}");
    let dir = node.data_dir.join("db/snapshots");
    let path = dir.join(&file);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir), 0o700);
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        !contains(&bytes, MARKER),
        "the marker is readable in {file}"
    );
    // The key never reaches etcd.
    let all = node.etcdctl(&["get", "", "--prefix"]);
    assert!(all.status.success(), "{}", output_text(&all));
    assert!(!contains(&all.stdout, &hex_of(0x11)));

    // Offline restores: refused without the key, with another key, or of a file with one byte changed —
    // exit 4, and the target data dir is left as it was.
    let scratch = node.dir.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let tampered = scratch.join(&file);
    let mut changed = bytes.clone();
    let at = changed.len() / 2;
    changed[at] ^= 0x01;
    std::fs::write(&tampered, &changed).unwrap();
    let target = node.dir.join("restore-target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep-me"), b"x").unwrap();
    let before = tree(&target);
    for (what, f, k, needle) in [
        ("no key", &path, None, "no key was given"),
        ("another key", &path, Some(wrong.as_path()), "another key"),
        ("a changed byte", &tampered, Some(key.as_path()), "changed"),
    ] {
        let o = restore(f, &target, k);
        assert_eq!(o.status.code(), Some(4), "{what}: {}", output_text(&o));
        assert!(
            output_text(&o).contains(needle),
            "{what}: {}",
            output_text(&o)
        );
        assert_eq!(tree(&target), before, "{what}: the data dir changed");
    }
    let o = restore(&path, &target, Some(&key));
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(target.join("db/etcd/member/wal").is_dir());

    // A cluster reset from the snapshot: refused whole (nothing moved) without the key and for the
    // changed file; with the key it brings back the data.
    let put = node.etcdctl(&["put", "/data/secret", "after-the-snapshot"]);
    assert!(put.status.success(), "{}", output_text(&put));
    node.terminate(Duration::from_secs(30));
    let before = tree(&node.data_dir);
    let reset = |restore_path: &Path, key: Option<&str>| {
        let mut a = vec![
            "--cluster-reset".to_string(),
            format!("--cluster-reset-restore-path={}", restore_path.display()),
        ];
        a.extend(key.map(str::to_string));
        node.run_to_exit(&a, Duration::from_secs(120))
    };
    for (what, f, k) in [
        ("no key", &path, None),
        ("a changed byte", &tampered, Some(key_arg.as_str())),
        (
            "another key",
            &path,
            Some(&*format!(
                "--snapshot-encryption-key-file={}",
                wrong.display()
            )),
        ),
    ] {
        let o = reset(f, k);
        assert_eq!(o.status.code(), Some(4), "{what}: {}", output_text(&o));
        assert!(
            output_text(&o).contains("--cluster-reset-restore-path"),
            "{what}: {}",
            output_text(&o)
        );
        assert_eq!(tree(&node.data_dir), before, "{what}: the data dir changed");
    }
    let o = reset(&path, Some(&key_arg));
    assert!(o.status.success(), "{}", output_text(&o));
    node.start(&args);
    node.wait_ready(Duration::from_secs(90));
    let got = node.etcdctl(&["get", "/data/secret", "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        MARKER,
        "{}",
        output_text(&got)
    );
    node.terminate(Duration::from_secs(30));
}

#[test]
fn plain_snapshots_are_private_and_a_restore_checks_their_own_trailer() {
    let mut node = Node::new("at-rest-plain");
    node.start(&["--snapshot-schedule=0 0 1 1 *".to_string()]);
    node.wait_ready(Duration::from_secs(90));
    let o = member_support::cli(&node, &["etcd", "snapshot", "save", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file = recs[0]["file"].as_str().unwrap().to_string();
    assert!(recs[0].get("encrypted").is_none(), "{recs}");
    let dir = node.data_dir.join("db/snapshots");
    assert_eq!(mode(&dir.join(&file)), 0o600);
    assert_eq!(mode(&dir), 0o700);
    node.terminate(Duration::from_secs(30));

    let mut bytes = std::fs::read(dir.join(&file)).unwrap();
    bytes[4096] ^= 0x01;
    let changed = node.dir.join("changed.db");
    std::fs::write(&changed, &bytes).unwrap();
    let target = node.dir.join("target");
    let o = restore(&changed, &target, None);
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(output_text(&o).contains("trailer"), "{}", output_text(&o));
    assert!(
        !target.exists(),
        "a refused restore created {}",
        target.display()
    );
    // With a key configured, a plain file is not taken in place of an encrypted one.
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path(), "snap.key", 0x33);
    let o = restore(&dir.join(&file), &target, Some(&key));
    assert_eq!(o.status.code(), Some(4), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("not encrypted"),
        "{}",
        output_text(&o)
    );
    assert!(!target.join("db/etcd").exists());
}

/// Nothing may be bound, or created, by a start that is refused for its addresses.
#[test]
fn insecure_etcd_on_a_non_loopback_address_is_refused_before_anything_binds() {
    let node = Node::new("insecure-remote").insecure();
    let mut args = node.args();
    args.retain(|a| !a.starts_with("--advertise-address"));
    args.push("--advertise-address=192.0.2.10".to_string());
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    let text = output_text(&o);
    assert!(
        text.contains("192.0.2.10") && text.contains("--etcd-insecure-allow-remote"),
        "{text}"
    );
    assert!(
        !node.data_dir.exists(),
        "the refused start created its data dir"
    );
    for port in [node.api_port, node.metrics_port, node.client_port] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} was left bound"
        );
    }

    // Plain-HTTP object storage is refused the same way without its flag.
    let mut args = Node::new("plain-http").args();
    args.push("--snapshot-s3-endpoint=http://127.0.0.1:9".to_string());
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("--snapshot-s3-allow-http"),
        "{}",
        output_text(&o)
    );
}
