//! Starts that cannot work fail at once with a clear message, a non-zero exit, and nothing half-created.

mod member_support;

use std::net::TcpListener;
use std::time::Duration;

use member_support::*;

const EXIT: Duration = Duration::from_secs(30);

#[test]
fn a_data_dir_that_is_not_writable_is_refused() {
    let mut n = Node::new("n1");
    // Root writes wherever modes forbid it, so make the path impossible: below a regular file.
    let file = n.dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    n.data_dir = file.join("data");
    let o = n.run_to_exit(&[], EXIT);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("data dir") && err.contains("not writable"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    // Nothing else appeared next to it.
    let entries: Vec<_> = std::fs::read_dir(&n.dir).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
}

#[test]
fn a_taken_etcd_port_is_refused_before_anything_is_created() {
    let n = Node::new("n1");
    let _taken = TcpListener::bind(("127.0.0.1", n.client_port)).unwrap();
    let o = n.run_to_exit(&[], EXIT);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("--etcd-client-port") && err.contains(&n.client_port.to_string()),
        "{err}"
    );
    assert!(!n.data_dir.exists(), "a failed start created the data dir");

    let n = Node::new("n1");
    let _taken = TcpListener::bind(("127.0.0.1", n.peer_port)).unwrap();
    let o = n.run_to_exit(&[], EXIT);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--etcd-peer-port"), "{}", stderr(&o));
    assert!(!n.data_dir.exists());
}

#[test]
fn a_taken_listen_port_is_refused_before_anything_is_created() {
    let n = Node::new("n1");
    let _taken = TcpListener::bind(("127.0.0.1", n.api_port)).unwrap();
    let o = n.run_to_exit(&[], EXIT);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("--listen") && err.contains(&n.api_port.to_string()),
        "{err}"
    );
    assert!(!n.data_dir.exists());

    let n = Node::new("n1");
    let _taken = TcpListener::bind(("127.0.0.1", n.metrics_port)).unwrap();
    let o = n.run_to_exit(&[], EXIT);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--metrics-listen"), "{}", stderr(&o));
    assert!(!n.data_dir.exists());
}

#[test]
fn a_missing_etcd_binary_is_refused_before_anything_is_created() {
    let n = Node::new("n1");
    let o = n.run_to_exit(&["--etcd-binary=/nonexistent/etcd".to_string()], EXIT);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("/nonexistent/etcd") && err.contains("not found"),
        "{err}"
    );
    assert!(!n.data_dir.exists());

    // Not on PATH either.
    let o = std::process::Command::new(BIN)
        .args(n.args())
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--etcd-binary"), "{}", stderr(&o));
    assert!(!n.data_dir.exists());
}

#[test]
fn etcd_failing_on_its_first_start_leaves_nothing_behind() {
    let n = Node::new("n1");
    // A binary that exits at once: the start fails with its output, and the new member is removed. It
    // answers `--version` as etcd does, so that the version gate lets it start.
    let fake = n.dir.join("fake-etcd");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'etcd Version: 3.4.23'; exit 0; }\necho 'fake etcd: refusing' >&2\nexit 3\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = n.run_to_exit(&[format!("--etcd-binary={}", fake.display())], EXIT);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("etcd exited") && err.contains("fake etcd: refusing"),
        "{err}"
    );
    assert!(!n.data_dir.exists(), "a failed first start left files");
}
