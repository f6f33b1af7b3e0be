//! Joining a running cluster with `--server`/`--token`: learners that serve the data, etcd's refusals
//! ("too many learners", "unhealthy cluster") waited out, wrong tokens and CAs refused with nothing added.

mod member_support;

use std::time::Duration;

use member_support::*;

const READY: Duration = Duration::from_secs(60);

fn join_args(server: &Node, token: &str) -> Vec<String> {
    vec![
        format!("--server={}", server.api_url()),
        format!("--token={token}"),
    ]
}

/// (id as etcdctl prints it in hex, name, is learner) of every member, asked through `via`.
fn members(via: &Node) -> Vec<(String, String, bool)> {
    let o = via.etcdctl(&["member", "list", "-w", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                format!("{:x}", m["ID"].as_u64().unwrap()),
                m["name"].as_str().unwrap_or("").to_string(),
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// A serializable read on `node`'s own member (learners refuse linearizable ones).
fn local_read(node: &Node, key: &str) -> String {
    let o = node.etcdctl(&["get", key, "--print-value-only", "--consistency=s"]);
    stdout(&o).trim().to_string()
}

/// Promotes whatever learner there is, as the learner manager would (harmless when it did already).
fn promote_learners(via: &Node) {
    for (id, _, learner) in members(via) {
        if learner {
            let _ = via.etcdctl(&["member", "promote", &id]);
        }
    }
}

#[test]
fn two_more_nodes_join_as_learners_and_serve_the_data() {
    let mut n1 = Node::new("n1");
    n1.start(&[]);
    n1.wait_ready(READY);
    let put = n1.etcdctl(&["put", "/test/data", "from-n1"]);
    assert!(put.status.success(), "{}", stderr(&put));

    let mut n2 = Node::new("n2");
    n2.start(&join_args(&n1, &n1.token()));
    n2.wait_ready(READY);
    // n2 joined as a learner and got its certificates from the cluster CA, and the same token.
    assert!(n2.log().contains("added as learner"), "{}", n2.log());
    // It may already be a voter by the time it serves: the learner manager promotes within ~0.1 s.
    assert_eq!(
        std::fs::read_to_string(n2.tls_file("ca.crt")).unwrap(),
        std::fs::read_to_string(n1.tls_file("ca.crt")).unwrap()
    );
    assert_eq!(n2.token(), n1.token());
    let m = members(&n1);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m.iter().any(|(_, name, _)| *name == n2.member_name()),
        "{m:?}"
    );
    eventually("n2 to serve the data", Duration::from_secs(20), || {
        (local_read(&n2, "/test/data") == "from-n1").then_some(())
    });
    // n2's agent wrote its record through the voters (a learner refuses writes).
    let o = n1.etcdctl(&["get", "/hostlet/nodes/n2", "--print-value-only"]);
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["memberName"], n2.member_name().as_str());

    // n3 asks n2 (any hostlet will do). etcd allows one learner at a time and refuses new members for a
    // few seconds after one joined: n3 retries until it is let in. The learner manager promotes n2; the
    // test does it too, so that this test does not depend on it.
    let mut n3 = Node::new("n3");
    n3.start(&join_args(&n2, &n2.token()));
    let deadline = std::time::Instant::now() + READY;
    while !n3.is_ready() {
        if let Some(status) = n3.exited() {
            panic!("n3 exited ({status}):\n{}", n3.log());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "n3 not ready:\n{}",
            n3.log()
        );
        if !n3.log().contains("added as learner") {
            promote_learners(&n1);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(n3.log().contains("added as learner"), "{}", n3.log());
    eventually("n3 to serve the data", Duration::from_secs(20), || {
        (local_read(&n3, "/test/data") == "from-n1").then_some(())
    });
    let m = members(&n1);
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(
        m.iter().any(|(_, name, _)| *name == n3.member_name()),
        "{m:?}"
    );
    let put = n1.etcdctl(&["put", "/test/later", "x"]);
    assert!(put.status.success());
    eventually("n3 to see a later write", Duration::from_secs(20), || {
        (local_read(&n3, "/test/later") == "x").then_some(())
    });
}

#[test]
fn a_wrong_token_gets_401_and_the_joiner_exits_saying_why_with_no_member_added() {
    let mut n1 = Node::new("n1");
    n1.start(&[]);
    n1.wait_ready(READY);
    let token = n1.token();
    let (fp, _) = token
        .strip_prefix("H10::")
        .unwrap()
        .split_once("::")
        .unwrap();
    let n2 = Node::new("n2");

    // Right CA, wrong secret: the server answers 401.
    let wrong = format!("H10::{fp}::not-the-secret");
    let o = n2.run_to_exit(&join_args(&n1, &wrong), Duration::from_secs(30));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("401") && err.contains("token"), "{err}");

    // A token naming another CA: refused before the secret is sent.
    let other_fp = fp.chars().rev().collect::<String>();
    let secret = token.rsplit_once("::").unwrap().1;
    let o = n2.run_to_exit(
        &join_args(&n1, &format!("H10::{other_fp}::{secret}")),
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("fingerprint"), "{}", stderr(&o));

    // A bare secret cannot verify an HTTPS server.
    let o = n2.run_to_exit(&join_args(&n1, secret), Duration::from_secs(30));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("fingerprint"), "{}", stderr(&o));

    assert!(!n2.data_dir.exists(), "a refused join created files");
    assert_eq!(members(&n1).len(), 1, "a refused join added a member");
}

#[test]
fn insecure_nodes_join_over_plain_http_with_a_bare_token() {
    let mut n1 = Node::new("n1").insecure();
    n1.start(&[]);
    n1.wait_ready(READY);
    n1.etcdctl(&["put", "/k", "v"]);
    let mut n2 = Node::new("n2").insecure();
    n2.start(&join_args(&n1, &n1.token()));
    n2.wait_ready(READY);
    assert!(!n2.data_dir.join("tls").exists());
    eventually("n2 to serve the data", Duration::from_secs(20), || {
        (local_read(&n2, "/k") == "v").then_some(())
    });
    assert!(n2.log().contains("added as learner"), "{}", n2.log());
    assert_eq!(members(&n1).len(), 2);
}

#[test]
fn a_restarted_joiner_comes_back_without_the_server_flag() {
    let mut n1 = Node::new("n1");
    n1.start(&[]);
    n1.wait_ready(READY);
    let mut n2 = Node::new("n2");
    n2.start(&join_args(&n1, &n1.token()));
    n2.wait_ready(READY);
    let name = n2.member_name();
    assert!(n2.terminate(Duration::from_secs(20)).success());
    // Restarted without --server: the member knows its cluster; its agent finds the voters on disk.
    n2.start(&[]);
    n2.wait_ready(READY);
    assert_eq!(n2.member_name(), name);
    assert!(n2.log().contains("Restart"));
    assert_eq!(members(&n1).len(), 2);
}

#[test]
fn sigterm_while_a_join_waits_its_turn_exits_cleanly_and_leaves_nothing() {
    let mut n1 = Node::new("n1");
    n1.start(&[]);
    n1.wait_ready(READY);
    let mut n2 = Node::new("n2");
    n2.start(&join_args(&n1, &n1.token()));
    n2.wait_ready(READY);
    // A learner that never starts holds etcd's one learner place: n3 is refused ("too many learners")
    // and waits its turn, retrying.
    let o = n1.etcdctl(&[
        "member",
        "add",
        "held",
        "--learner",
        "--peer-urls=https://127.0.0.1:9",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut n3 = Node::new("n3");
    // Pinned as a voter: with n1, n2 and the held learner the target is full, and auto would make a worker.
    let mut args = join_args(&n1, &n1.token());
    args.push("--role=voter".into());
    n3.start(&args);
    eventually("n3 to retry its join", Duration::from_secs(30), || {
        n3.log()
            .contains("cannot add this node as a learner yet")
            .then_some(())
    });
    let status = n3.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}\n{}", n3.log());
    assert!(!n3.data_dir.exists(), "an abandoned join left files");
    assert_eq!(members(&n1).len(), 3, "an abandoned join left a member");
}

#[test]
fn a_token_file_is_waited_for_and_one_holding_no_token_is_refused() {
    let mut n1 = Node::new("n1");
    n1.start(&[]);
    n1.wait_ready(READY);
    let mut n2 = Node::new("n2");
    let server = format!("--server={}", n1.api_url());

    // A file that holds no token: refused, naming the file, before anything is created.
    let bad = n2.dir.join("bad-token");
    std::fs::write(&bad, "not a token\n").unwrap();
    let o = n2.run_to_exit(
        &[server.clone(), format!("--token-file={}", bad.display())],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("--token-file {}", bad.display())),
        "{}",
        stderr(&o)
    );
    assert!(!n2.data_dir.exists(), "a refused token file created files");

    // A file that is not there yet (the first node of a compose cluster writes it): waited for, then the
    // join goes on with what it holds.
    let shared = n2.dir.join("shared");
    let file = shared.join("token");
    n2.start(&[server, format!("--token-file={}", file.display())]);
    wait_for_nodes("n2 to wait for its token file", READY, &[&n2], || {
        n2.log()
            .contains("waiting for the token file")
            .then_some(())
    });
    assert!(n2.exited().is_none(), "{}", n2.log());
    assert_eq!(members(&n1).len(), 1);
    std::fs::create_dir_all(&shared).unwrap();
    let tmp = shared.join(".token.tmp");
    std::fs::write(&tmp, format!("{}\n", n1.token())).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    n2.wait_ready(READY);
    assert_eq!(members(&n1).len(), 2);
}
