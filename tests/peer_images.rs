//! Images from another node, with real agents (TLS as deployed) each on a Docker engine of its own (a
//! dockerd in a network namespace the test makes, with no registry in reach): a pod on a worker whose
//! image only the voter holds runs after a fetch from the voter, and one whose image only another worker
//! holds after a fetch from that worker (which asks a voter whether the asker's pods name it); a node's
//! certificate fetches only the images its own pods name, a worker cannot probe for images it does not
//! hold, and `imagePullPolicy: Never` never fetches.

mod engine_support;
mod member_support;

use std::time::Duration;

use engine_support::TestEngine;
use member_support::*;

const READY: Duration = Duration::from_secs(120);
const PAUSE: &str = "peer-test/pause:1";

/// `GET /images/save?ref=` on `holder`'s agent with `who`'s client certificate: the status and the body's
/// first bytes.
fn save(
    holder: &Node,
    who: (std::path::PathBuf, std::path::PathBuf),
    reference: &str,
) -> (u16, Vec<u8>) {
    let ca = std::fs::read(holder.tls_file("ca.crt")).unwrap();
    let mut pem = std::fs::read(&who.0).unwrap();
    pem.extend(std::fs::read(&who.1).unwrap());
    let url = format!("{}/images/save?ref={reference}", holder.api_url());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let c = reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                .identity(reqwest::Identity::from_pem(&pem).unwrap())
                .build()
                .unwrap();
            let r = c.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.bytes().await.unwrap();
            (status, body[..body.len().min(512)].to_vec())
        })
}

/// `POST /node/v1/image-check` on `voter` with `who`'s client certificate: the status and the body.
fn image_check(
    voter: &Node,
    who: (std::path::PathBuf, std::path::PathBuf),
    node: &str,
    image: &str,
) -> (u16, String) {
    let ca = std::fs::read(voter.tls_file("ca.crt")).unwrap();
    let mut pem = std::fs::read(&who.0).unwrap();
    pem.extend(std::fs::read(&who.1).unwrap());
    let url = format!("{}/node/v1/image-check", voter.api_url());
    let body = serde_json::json!({"node": node, "image": image}).to_string();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let c = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                .identity(reqwest::Identity::from_pem(&pem).unwrap())
                .build()
                .unwrap();
            let r = c
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
}

fn fetches(n: &Node, result: &str) -> f64 {
    let (_, text) = n.get_metrics("/metrics").expect("metrics");
    metric(
        &text,
        &format!("hostlet_peer_image_fetches_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(-1.0)
}

#[test]
fn a_pod_runs_from_an_image_only_another_node_holds_and_a_node_gets_only_what_its_pods_name() {
    let mut a = Node::new("peer-a");
    let mut b = Node::new("peer-b");
    let mut c = Node::new("peer-c");
    let ea = TestEngine::start(&a.dir.join("engine"), 256);
    let eb = TestEngine::start(&b.dir.join("engine"), 256);
    let ec = TestEngine::start(&c.dir.join("engine"), 256);
    for e in [&ea, &eb, &ec] {
        e.build(PAUSE, 0);
    }
    ea.build("peer-test/app:1", 16);
    ea.build("peer-test/other:1", 0);
    eb.build("peer-test/worker-only:1", 0);
    a.start(&[
        "--etcd-voters=1".to_string(),
        format!("--docker-host=unix://{}", ea.socket().display()),
        format!("--pause-image={PAUSE}"),
    ]);
    a.wait_ready(READY);
    let token_file = a.run_dir().join("join-token");
    std::fs::write(&token_file, a.token()).unwrap();
    b.start(&[
        format!("--server={}", a.api_url()),
        format!("--token-file={}", token_file.display()),
        "--role=worker".to_string(),
        format!("--docker-host=unix://{}", eb.socket().display()),
        format!("--pause-image={PAUSE}"),
    ]);
    b.wait_ready(READY);
    c.start(&[
        format!("--server={}", a.api_url()),
        format!("--token-file={}", token_file.display()),
        "--role=worker".to_string(),
        format!("--docker-host=unix://{}", ec.socket().display()),
        format!("--pause-image={PAUSE}"),
    ]);
    c.wait_ready(READY);

    // The voter advertises what its engine holds.
    eventually("the voter's record to list its images", READY, || {
        let o = cli(&a, &["node", "ls", "-o", "json"]);
        let nodes: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        nodes
            .as_array()?
            .iter()
            .any(|n| n["name"] == "peer-a" && n["images"]["peer-test/app:1"].is_string())
            .then_some(())
    });

    // The worker's pod names an image only the voter has: it cannot be pulled (no registry), so it is
    // fetched from the voter, and the pod runs.
    assert!(!eb.images().contains(&"peer-test/app:1".to_string()));
    apply_sleeper(&b, "app", "peer-test/app:1", "IfNotPresent");
    wait_running(&b, "app", READY);
    assert!(eb.images().contains(&"peer-test/app:1".to_string()));
    let o = cli(&b, &["events", "--node", "peer-b", "-o", "json"]);
    assert!(
        stdout(&o).contains("Fetched image peer-test/app:1 from node peer-a"),
        "{}",
        stdout(&o)
    );
    assert_eq!(fetches(&b, "ok"), 1.0);

    // The worker's certificate: the image its pod names, yes; another, no (403, saying why); an admin's
    // certificate, yes.
    let worker_tls = || (b.tls_file("client.crt"), b.tls_file("client.key"));
    let (code, body) = save(&a, worker_tls(), "peer-test/app:1");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let (code, body) = save(&a, worker_tls(), "peer-test/other:1");
    assert_eq!(code, 403);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("no pod of node peer-b names image peer-test/other:1"),
        "{text}"
    );
    let admin = admin_certificate(&a);
    let (code, body) = save(
        &a,
        (admin.join("admin.crt"), admin.join("admin.key")),
        "peer-test/other:1",
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    // Node C's certificate: nothing its pods do not name.
    let node_c = || (c.tls_file("client.crt"), c.tls_file("client.key"));
    let (code, body) = save(&a, node_c(), "peer-test/other:1");
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));

    // An image only worker B holds: C's pod gets it from B, which asks the voter whether C's pods name it.
    eventually("worker B's record to list its image", READY, || {
        let o = cli(&a, &["node", "ls", "-o", "json"]);
        let nodes: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        nodes
            .as_array()?
            .iter()
            .any(|n| n["name"] == "peer-b" && n["images"]["peer-test/worker-only:1"].is_string())
            .then_some(())
    });
    apply_sleeper(&c, "from-worker", "peer-test/worker-only:1", "IfNotPresent");
    let deadline = std::time::Instant::now() + READY;
    while !status(&c, "from-worker").is_some_and(|s| s["phase"] == "Running") {
        assert!(
            std::time::Instant::now() < deadline,
            "pod from-worker not running: {:?}\n--- c:\n{}\n--- b:\n{}",
            status(&c, "from-worker"),
            c.log_tail(30),
            b.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(ec.images().contains(&"peer-test/worker-only:1".to_string()));
    let o = cli(&c, &["events", "--node", "peer-c", "-o", "json"]);
    assert!(
        stdout(&o).contains("Fetched image peer-test/worker-only:1 from node peer-b"),
        "{}",
        stdout(&o)
    );
    // B serves it to no node whose pods do not name it (the voter says no), and B cannot ask the voter
    // about an image it does not hold.
    let (code, body) = save(
        &b,
        (a.tls_file("client.crt"), a.tls_file("client.key")),
        "peer-test/worker-only:1",
    );
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));
    assert!(
        String::from_utf8_lossy(&body).contains("no pod of node peer-a names"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (code, body) = image_check(&a, worker_tls(), "peer-c", "peer-test/other:1");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("does not list peer-test/other:1"), "{body}");

    // Never: never fetched, though the voter has it.
    apply_sleeper(&b, "never", "peer-test/other:1", "Never");
    eventually("the Never pod waiting", READY, || {
        status(&b, "never")?
            .to_string()
            .contains("ErrImageNeverPull")
            .then_some(())
    });
    assert!(!eb.images().contains(&"peer-test/other:1".to_string()));
    assert_eq!(fetches(&b, "ok"), 1.0);

    for (n, pod) in [(&b, "app"), (&b, "never"), (&c, "from-worker")] {
        let o = cli(n, &["pod", "delete", pod]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    c.terminate(Duration::from_secs(30));
    b.terminate(Duration::from_secs(30));
    a.terminate(Duration::from_secs(30));
}
