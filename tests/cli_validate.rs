//! `hostlet pod validate` and `hostlet run --print-config`, run as an operator runs them.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/manifests");

fn validate(file: &str) -> Output {
    Command::new(BIN)
        .args(["pod", "validate", "-f", &format!("{MANIFESTS}/{file}")])
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn design_example_2014_manifest_and_json_are_valid() {
    for (file, id) in [
        ("design-example.yaml", "web"),
        ("kubelet-2014.yaml", "nginx-2014"),
        ("json-pod.json", "json-pod"),
    ] {
        let o = validate(file);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{file}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        assert_eq!(stdout(&o).trim(), format!("{id}: valid"));
    }
}

#[test]
fn empty_list_is_valid_with_zero_pods() {
    let o = validate("empty-list.yaml");
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("no pods"), "{}", stdout(&o));
}

#[test]
fn several_errors_are_each_reported_with_their_path() {
    let o = validate("many-errors.yaml");
    assert_eq!(o.status.code(), Some(4), "refused");
    let out = stdout(&o);
    assert!(out.starts_with("Bad_Pod: invalid"), "{out}");
    for path in [
        "  id: ",
        "  volumes[1].name: duplicate",
        "  containers[0].ports[0].containerPort: 70000",
        "  containers[0].ports[0].protocol: unknown protocol \"XTP\"",
        "  containers[1].name: duplicate",
        "  containers[1].image: required",
        "  containers[1].volumeMounts[0].name: no volume named \"missing\"",
        "  containers[1].volumeMounts[0].mountPath:",
        "  containers[1].ports[1].hostPort: host port 0.0.0.0:8080/TCP",
    ] {
        assert!(out.contains(path), "missing {path:?} in\n{out}");
    }
}

#[test]
fn random_bytes_give_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.bin");
    // A fixed pseudo-random byte pattern (xorshift) so the test is the same every run.
    let mut x: u32 = 0x9e37_79b9;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&path, bytes).unwrap();
    let o = Command::new(BIN)
        .args(["pod", "validate", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "refused");
    assert!(
        stderr(&o).contains(&path.display().to_string()),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_missing_file_is_named() {
    let o = Command::new(BIN)
        .args(["pod", "validate", "-f", "/nonexistent/pod.yaml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "not found");
    assert!(
        stderr(&o).contains("/nonexistent/pod.yaml"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn list_with_one_bad_pod_names_every_pod() {
    let o = validate("list-one-bad.yaml");
    assert_eq!(o.status.code(), Some(4), "refused");
    let out = stdout(&o);
    assert!(out.contains("good-one: valid"), "{out}");
    assert!(out.contains("good-two: valid"), "{out}");
    assert!(
        out.contains("bad-one: invalid\n  containers[0].name:"),
        "{out}"
    );
}

#[test]
fn two_pods_claiming_one_host_port_reject_the_second() {
    let o = validate("list-port-clash.yaml");
    assert_eq!(o.status.code(), Some(4), "refused");
    let out = stdout(&o);
    assert!(out.contains("first: valid"), "{out}");
    assert!(
        out.contains("second: invalid\n  host port 0.0.0.0:18080/TCP"),
        "{out}"
    );
}

#[test]
fn stdin_is_read_with_a_dash() {
    let mut child = Command::new(BIN)
        .args(["pod", "validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let text = std::fs::read(format!("{MANIFESTS}/design-example.yaml")).unwrap();
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "web: valid");
}

#[test]
fn yaml_syntax_error_has_line_and_column() {
    let mut child = Command::new(BIN)
        .args(["pod", "validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"version: v1beta1\nid: x\ncontainers:\n  - name: a\n    image: [busybox\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(4), "refused");
    assert!(
        stderr(&o).contains("<stdin>: line 6, column"),
        "{}",
        stderr(&o)
    );
}

fn print_config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--print-config"]).args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HOSTLET_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn run_flags_come_from_command_line_then_env_then_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hostlet.yaml");
    std::fs::write(
        &cfg,
        "node-name: from-file\nsnapshot-retention: 9\nlearner_stall_timeout: 10s\netcd-insecure: true\nallowed-host-paths: [/var/log, /srv]\n",
    )
    .unwrap();
    let o = print_config(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--node-name",
            "from-flag",
        ],
        &[
            ("HOSTLET_SNAPSHOT_RETENTION", "7"),
            ("HOSTLET_NODE_NAME", "from-env"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: serde_json::Value = yaml_serde::from_slice(&o.stdout).unwrap();
    assert_eq!(out["node-name"], "from-flag");
    assert_eq!(out["snapshot-retention"], 7);
    assert_eq!(out["learner-stall-timeout"], "10s");
    assert_eq!(out["etcd-insecure"], true);
    assert_eq!(
        out["allowed-host-paths"],
        serde_json::json!(["/var/log", "/srv"])
    );
    assert_eq!(out["snapshot-dir"], "/var/lib/hostlet/db/snapshots");
}

#[test]
fn relative_path_flags_are_taken_against_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    std::fs::write(cwd.join("hostlet.yaml"), "manifest-path: manifests\n").unwrap();
    let mut cmd = Command::new(BIN);
    cmd.current_dir(&cwd).args([
        "run",
        "--print-config",
        "--config=hostlet.yaml",
        "--data-dir=data",
        "--allowed-host-paths=srv,../up",
        "--etcd-binary=./bin/etcd",
        "--cluster-reset",
        "--cluster-reset-restore-path=snap.db",
        "--token-file=shared/token",
    ]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HOSTLET_")) {
        cmd.env_remove(k);
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: serde_json::Value = yaml_serde::from_slice(&o.stdout).unwrap();
    let at = |p: &str| serde_json::Value::from(cwd.join(p).to_str().unwrap());
    assert_eq!(out["data-dir"], at("data"));
    assert_eq!(out["manifest-path"], at("manifests"));
    assert_eq!(out["etcd-binary"], at("bin/etcd"));
    assert_eq!(out["cluster-reset-restore-path"], at("snap.db"));
    assert_eq!(out["token-file"], at("shared/token"));
    assert_eq!(out["snapshot-dir"], at("data/db/snapshots"));
    assert_eq!(
        out["allowed-host-paths"],
        serde_json::json!([at("srv"), at("../up")])
    );
    // A bare program name is still looked up on PATH.
    let o = print_config(&["--etcd-binary=etcd"], &[]);
    let out: serde_json::Value = yaml_serde::from_slice(&o.stdout).unwrap();
    assert_eq!(out["etcd-binary"], "etcd");
}

#[test]
fn bad_config_file_and_bad_flags_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hostlet.yaml");
    std::fs::write(&cfg, "bogus-flag: 1\n").unwrap();
    let o = print_config(&["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("bogus-flag") && stderr(&o).contains("hostlet.yaml"),
        "{}",
        stderr(&o)
    );

    std::fs::write(&cfg, "learner-stall-timeout: soon\n").unwrap();
    let o = print_config(&["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("learner-stall-timeout"),
        "{}",
        stderr(&o)
    );

    let o = print_config(&["--server", "http://10.0.0.1:10250"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--token"), "{}", stderr(&o));
}

#[test]
fn allowed_host_paths_that_would_hand_a_pod_the_host_are_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = format!("--data-dir={}", data.path().display());
    for (entry, says) in [
        ("/", "holds /"),
        ("/var", "holds /var/run"),
        ("/proc/sys", "lies inside /proc"),
        ("/sys", "is or holds /sys"),
        ("/run", "holds /run"),
    ] {
        let o = print_config(&[&data_dir, &format!("--allowed-host-paths={entry}")], &[]);
        assert_ne!(o.status.code(), Some(0), "{entry} accepted");
        assert!(
            stderr(&o).contains(&format!("--allowed-host-paths {entry}"))
                && stderr(&o).contains(says),
            "{entry}: {}",
            stderr(&o)
        );
    }
    let o = print_config(
        &[
            &data_dir,
            &format!("--allowed-host-paths={}", data.path().display()),
        ],
        &[],
    );
    assert!(stderr(&o).contains("the data dir"), "{}", stderr(&o));
    let o = print_config(&[&data_dir, "--allowed-host-paths=/srv"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
