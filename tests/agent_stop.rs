//! An agent stopped (SIGTERM) while it writes its certificates or its revocation list finishes the write
//! before it exits: the stop drains the writers after the controllers, every task within the deadline, and
//! leaves no file torn, no temporary file and no certificate beside another's key. A fail point holds
//! every file write of the agent a while before its rename (`FAILPOINTS`, a test build's feature), so
//! that the signal lands midway.

mod member_support;

use std::path::Path;
use std::time::{Duration, Instant};

use member_support::{cli, eventually, output_text, Node};

const READY: Duration = Duration::from_secs(120);
/// Each file write waits this long before its rename: a renewal (six files) or a list takes seconds.
const SLOW_WRITES: (&str, &str) = ("FAILPOINTS", "files::before-rename=sleep(300)");
const ROLES: [&str; 3] = ["server", "peer", "client"];

/// The temporary files (`.<name>.<pid>.<n>.tmp`) in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with('.') && f.ends_with(".tmp"))
        .collect()
}

/// Those of [`temporaries`] whose target is one of `names`.
fn writing(dir: &Path, names: &[String]) -> Vec<String> {
    temporaries(dir)
        .into_iter()
        .filter(|f| names.iter().any(|n| f.starts_with(&format!(".{n}."))))
        .collect()
}

/// The value of `field=` in a log line.
fn field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(field)?.strip_prefix('='))
}

/// Waits (polling often: each write is held for 300 ms) until `node` writes one of `names` in its TLS
/// directory, and says which.
fn wait_for_write(node: &Node, names: &[String], within: Duration) -> String {
    let dir = node.data_dir.join("tls");
    let deadline = Instant::now() + within;
    loop {
        if let Some(f) = writing(&dir, names).pop() {
            return f;
        }
        assert!(
            Instant::now() < deadline,
            "{} wrote none of {names:?} within {within:?} (is the test build's `failpoints` feature on?)\n{}",
            node.name,
            node.log_story(30)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cert_files() -> Vec<String> {
    ROLES
        .iter()
        .flat_map(|r| [format!("{r}.crt"), format!("{r}.key")])
        .collect()
}

/// The serial of the certificate in `pem`, lowercase hex (as the revocation list names them).
fn serial(pem: &[u8]) -> String {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).expect("a PEM certificate");
    let cert = p.parse_x509().expect("a whole certificate");
    format!("{:x}", cert.tbs_certificate.serial)
}

/// The serials of the node's three certificates, after checking that each file is whole and each
/// certificate is for the key beside it.
fn whole_pairs(node: &Node) -> Vec<String> {
    ROLES
        .iter()
        .map(|r| {
            let cert = std::fs::read(node.tls_file(&format!("{r}.crt"))).unwrap();
            let key = std::fs::read_to_string(node.tls_file(&format!("{r}.key"))).unwrap();
            let (_, p) = x509_parser::pem::parse_x509_pem(&cert).expect("a PEM certificate");
            let parsed = p.parse_x509().expect("a whole certificate");
            let key = rcgen::KeyPair::from_pem(&key).expect("a whole key");
            assert_eq!(
                parsed.public_key().raw,
                key.public_key_der().as_slice(),
                "{}: {r}.crt is not for {r}.key",
                node.name
            );
            serial(&cert)
        })
        .collect()
}

/// The stop after the signal: the agent exits 0, its drain finished every task, no temporary file is
/// left in its TLS directory.
fn stopped_cleanly(node: &mut Node) {
    let status = node.terminate(Duration::from_secs(60));
    assert!(
        status.success(),
        "{} exited {status}\n{}",
        node.name,
        node.log_story(30)
    );
    let log = node.log();
    let drained = log
        .lines()
        .rfind(|l| l.contains("agent tasks drained"))
        .unwrap_or_else(|| {
            panic!(
                "{} did not drain its tasks\n{}",
                node.name,
                node.log_story(30)
            )
        });
    let finished: usize = field(drained, "finished")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        field(drained, "unfinished") == Some("0") && finished > 0,
        "{}: {drained}",
        node.name
    );
    let left = temporaries(&node.data_dir.join("tls"));
    assert!(
        left.is_empty(),
        "{}: temporary files left: {left:?}",
        node.name
    );
}

/// Every one of the node's certificates is new (none differs from `before` only in part) and its log
/// says the renewal ended with `said`.
fn all_renewed(node: &Node, before: &[String], file: &str, said: &str) {
    let after = whole_pairs(node);
    for (b, a) in before.iter().zip(&after) {
        assert_ne!(
            b, a,
            "stopped while writing {file}: a certificate was not renewed"
        );
    }
    assert!(node.log().contains(said), "{}", node.log_story(30));
}

#[test]
fn a_member_stopped_mid_renewal_finishes_it() {
    let mut voter = Node::new("stop-renew-1");
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
    let before = whole_pairs(&voter);
    voter.terminate(Duration::from_secs(60));

    // A lifetime shorter than its certificates' makes the member renew them as it starts.
    voter.env.push((SLOW_WRITES.0.into(), SLOW_WRITES.1.into()));
    voter.start(&[
        "--etcd-voters=1".to_string(),
        "--cert-lifetime=1m".to_string(),
    ]);
    let file = wait_for_write(&voter, &cert_files(), READY);
    stopped_cleanly(&mut voter);

    all_renewed(
        &voter,
        &before,
        &file,
        "this member's certificates were renewed",
    );

    // What it wrote is what it starts on.
    voter.env.clear();
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
}

#[test]
fn a_worker_stopped_mid_renewal_finishes_it() {
    let mut voter = Node::new("stop-wrenew-1");
    // Every certificate the voter issues lasts a minute: the worker renews two thirds in.
    voter.start(&[
        "--etcd-voters=1".to_string(),
        "--cert-lifetime=1m".to_string(),
    ]);
    voter.wait_ready(READY);
    let token_file = voter.run_dir().join("join-token");
    std::fs::write(&token_file, voter.token()).unwrap();
    let mut worker = Node::new("stop-wrenew-2");
    worker
        .env
        .push((SLOW_WRITES.0.into(), SLOW_WRITES.1.into()));
    let join = [
        format!("--server={}", voter.api_url()),
        format!("--token-file={}", token_file.display()),
        "--role=worker".to_string(),
    ];
    worker.start(&join);
    worker.wait_ready(READY);
    let before = whole_pairs(&worker);

    let file = wait_for_write(&worker, &cert_files(), Duration::from_secs(120));
    stopped_cleanly(&mut worker);

    all_renewed(
        &worker,
        &before,
        &file,
        "this worker's certificates were renewed",
    );

    // The voter takes what the worker wrote.
    worker.env.clear();
    worker.start(&join);
    worker.wait_ready(READY);
}

#[test]
fn a_member_stopped_mid_crl_write_finishes_it() {
    let mut voter = Node::new("stop-crl-1");
    voter.env.push((SLOW_WRITES.0.into(), SLOW_WRITES.1.into()));
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
    let token_file = voter.run_dir().join("join-token");
    std::fs::write(&token_file, voter.token()).unwrap();
    let mut worker = Node::new("stop-crl-2");
    worker.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token-file={}", token_file.display()),
        "--role=worker".to_string(),
    ]);
    worker.wait_ready(READY);
    let serials = whole_pairs(&worker);
    // The list the voter wrote as it started (no serial yet) is behind it.
    eventually("the voter's first revocation list", READY, || {
        voter
            .log()
            .contains("certificate revocation list written")
            .then_some(())
    });

    let o = cli(&voter, &["node", "delete", "stop-crl-2"]);
    assert!(o.status.success(), "{}", output_text(&o));
    wait_for_write(
        &voter,
        &["revoked.crl".to_string()],
        Duration::from_secs(60),
    );
    stopped_cleanly(&mut voter);

    let pem = std::fs::read(voter.tls_file("revoked.crl")).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).expect("a PEM revocation list");
    let (_, crl) = x509_parser::parse_x509_crl(&p.contents).expect("a whole revocation list");
    let listed: Vec<String> = crl
        .iter_revoked_certificates()
        .map(|r| format!("{:x}", r.user_certificate))
        .collect();
    for s in &serials {
        assert!(listed.contains(s), "{s} is not in the list: {listed:?}");
    }
    worker.stop(Duration::from_secs(30));
}
