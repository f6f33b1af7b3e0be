//! Worker join tokens with real agents and etcd (TLS as deployed): a host joins with a token from
//! `hostlet token create` and is a worker that runs a pod; tokens that expired, were used up or revoked
//! are refused with 401 naming why, and a host joining with one exits saying why; a worker token never
//! makes an etcd member and never claims an existing node's name.

mod member_support;

use std::process::Output;
use std::time::Duration;

use hostlet_controllers::pki::NodeKey;
use member_support::{
    api_client, ca_keys_under, cli, run_pod, status, wait_for_nodes, Cleanup, Node,
};

const READY: Duration = Duration::from_secs(120);

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `hostlet token create ARGS` on `node`: the token, alone on stdout.
fn create(node: &Node, args: &[&str]) -> String {
    let mut all = vec!["token", "create"];
    all.extend_from_slice(args);
    let o = cli(node, &all);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(out.lines().count(), 1, "the token alone: {out:?}");
    out.trim().to_string()
}

/// (status, body) of `POST /db/join` for `node` through `server` with `token`.
async fn join(server: &Node, token: &str, node: &str, member: bool) -> (u16, String) {
    let client = api_client(Some(&server.tls_file("ca.crt")));
    let r = client
        .post(format!("{}/db/join", server.api_url()))
        .bearer_auth(token)
        .json(&serde_json::json!({
            "node": node,
            "sans": ["127.0.0.1"],
            "member": member,
            "csr": NodeKey::generate().unwrap().request(node).unwrap(),
        }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn info(server: &Node, token: &str) -> (u16, String) {
    let client = api_client(Some(&server.tls_file("ca.crt")));
    let r = client
        .get(format!("{}/db/info", server.api_url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_tokens_admit_workers_only_and_are_refused_once_expired_used_up_or_revoked() {
    // Declared first so that it drops last, after the agents: the pod runs on the worker, tok-2.
    let _cleanup = Cleanup("tok-2".to_string());
    // One voter is the target: the worker stays a worker (placement would grow voters from it otherwise).
    let mut first = Node::new("tok-1");
    first.start(&["--etcd-voters=1".to_string()]);
    first.wait_ready(READY);

    // A host joins with a worker token: a worker (no etcd member), running a pod that reports status.
    let token = create(&first, &["--description", "rack 2"]);
    assert!(
        token.starts_with("H10::") && token.contains("::wt."),
        "{token}"
    );
    let mut worker = Node::new("tok-2");
    worker.start(&[
        format!("--server={}", first.api_url()),
        format!("--token={token}"),
    ]);
    worker.wait_ready(READY);
    assert!(
        worker.data_dir.join("db/worker").exists() && worker.etcd_pid().is_none(),
        "{}",
        worker.log_tail(40)
    );
    // The worker holds no CA key, under any name; it holds its own key and the CA certificate.
    assert_eq!(
        ca_keys_under(&worker.data_dir, &first.tls_file("ca.crt")),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(!worker.tls_file("ca.key").exists() && worker.tls_file("client.key").exists());
    // And no certificate of it opens etcd.
    member_support::assert_no_pair_opens_etcd(&worker, &first);
    // Nor any root of the secret keys: its voters open the secrets its pods use.
    assert!(!worker.tls_file("secrets.key").exists());
    assert!(ca_keys_under(&first.data_dir, &first.tls_file("ca.crt"))
        .contains(&first.tls_file("ca.key")));
    run_pod(&worker, "on-worker");
    wait_for_nodes(
        "the worker's pod running",
        READY,
        &[&first, &worker],
        || {
            let st = status(&worker, "on-worker")?;
            (st["phase"] == "Running").then_some(())
        },
    );
    // A secret sealed on the voter reaches the worker's pod, opened by the voter (the worker holds no key).
    let o = cli(
        &first,
        &["secret", "apply", "-f", "tests/manifests/k8s-secret.yaml"],
    );
    assert!(o.status.success(), "{}", text(&o));
    // A pod on the worker that prints the secret's username from its volume, applied there; its output.
    let reads_secret = |worker: &Node, name: &str| {
        let pod = worker.dir.join(format!("{name}.yaml"));
        std::fs::write(
            &pod,
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n    - name: app\n      image: busybox:latest\n      command: [sh, -c, 'cat /s/username; echo; sleep 3600']\n      volumeMounts: [{{name: s, mountPath: /s}}]\n  volumes: [{{name: s, secret: {{secretName: test-secret}}}}]\n"),
        )
        .unwrap();
        let o = cli(worker, &["pod", "apply", "-f", pod.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        wait_for_nodes(
            &format!("{name} on the worker to read the secret"),
            READY,
            &[&first, worker],
            || {
                let o = cli(worker, &["pod", "logs", name]);
                String::from_utf8_lossy(&o.stdout)
                    .contains("my-app\n")
                    .then_some(())
            },
        );
    };
    reads_secret(&worker, "secret-reader");

    // A worker's data dir from versions whose joins handed every node the CA key, or later the root of
    // the secret keys: on its next start the worker deletes both; its pods still get their secrets.
    assert!(worker.terminate(Duration::from_secs(20)).success());
    std::fs::copy(first.tls_file("ca.key"), worker.tls_file("ca.key")).unwrap();
    std::fs::write(worker.tls_file("secrets.key"), "root\n").unwrap();
    worker.start(&[]);
    worker.wait_ready(READY);
    assert!(
        worker
            .log()
            .contains("the cluster CA key and the root of the secret keys"),
        "{}",
        worker.log_tail(40)
    );
    assert_eq!(
        ca_keys_under(&worker.data_dir, &first.tls_file("ca.crt")),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(!worker.tls_file("secrets.key").exists());
    reads_secret(&worker, "secret-reader-2");

    let o = cli(&first, &["token", "ls"]);
    let listed = text(&o);
    assert!(
        listed.contains("rack 2") && listed.contains("1/-") && listed.contains("valid"),
        "{listed}"
    );
    assert!(
        !listed.contains(token.rsplit('.').next().unwrap()),
        "no secret in the list: {listed}"
    );

    // A worker token cannot make an etcd member, nor claim an existing node's name.
    let any = create(&first, &[]);
    let (code, body) = join(&first, &any, "tok-new", true).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("worker token"), "{body}");
    let (code, body) = join(&first, &any, "tok-1", false).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("exists"), "{body}");
    // Nor can the server token without that node's certificate: a name is bound at its first join.
    for (token, member) in [(first.token(), false), (first.token(), true)] {
        let (code, body) = join(&first, &token, "tok-2", member).await;
        assert_eq!(code, 403, "{body}");
        assert!(
            body.contains("must present that node's certificate"),
            "{body}"
        );
    }

    // Used up: one join, then no more. A join in an earlier version's form (no certificate request) is
    // refused naming the field and the version, and spends nothing.
    let once = create(&first, &["--uses", "1"]);
    let r = api_client(Some(&first.tls_file("ca.crt")))
        .post(format!("{}/db/join", first.api_url()))
        .bearer_auth(&once)
        .json(&serde_json::json!({"node": "tok-once-a", "sans": ["127.0.0.1"]}))
        .send()
        .await
        .unwrap();
    let (code, body) = (r.status().as_u16(), r.text().await.unwrap_or_default());
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("csr: missing") && body.contains("earlier hostlet version"),
        "{body}"
    );
    let (code, body) = join(&first, &once, "tok-once-a", false).await;
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        answer["ca"]["cert"].is_string() && answer["ca"].get("key").is_none(),
        "a worker gets no CA key: {body}"
    );
    assert!(answer["certs"]["client"]
        .as_str()
        .unwrap()
        .contains("CERTIFICATE"));
    assert!(!body.contains("PRIVATE KEY"), "{body}");
    assert!(answer.get("secretsRoot").is_none(), "{body}");
    let (code, body) = join(&first, &once, "tok-once-b", false).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("used up"), "{body}");

    // Revoked.
    let revoked = create(&first, &[]);
    let id = revoked
        .split("::wt.")
        .nth(1)
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .to_string();
    let o = cli(&first, &["token", "revoke", &id]);
    assert!(o.status.success(), "{}", text(&o));
    let (code, body) = info(&first, &revoked).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("revoked"), "{body}");
    let o = cli(&first, &["token", "revoke", "ffffff"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));

    // Expired: valid now, refused once its 5 s are over.
    let short = create(&first, &["--ttl", "5s"]);
    let (code, body) = info(&first, &short).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"workerOnly\":true"), "{body}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = info(&first, &short).await;
        if code == 401 {
            assert!(body.contains("expired"), "{body}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {code} after 60 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A made-up worker token, or none: the plain refusal.
    let (code, _) = info(&first, "wt.abcdef.0123456789abcdef0123456789abcdef").await;
    assert_eq!(code, 401);

    // A host joining with any of those tokens exits naming the voter's reason and the advice for a
    // worker token (a new one from an admin), never the cluster token's, and never printing the secret.
    for (token, reason) in [
        (&once, "used up"),
        (&revoked, "revoked"),
        (&short, "expired"),
    ] {
        let id = token
            .split("::wt.")
            .nth(1)
            .unwrap()
            .split('.')
            .next()
            .unwrap();
        let err = refused_join(&first, token);
        assert!(
            err.contains(&format!("token {id} is {reason}")),
            "{reason}: {err}"
        );
        assert!(err.contains("hostlet token create"), "{reason}: {err}");
        assert!(!err.contains("<data-dir>/token"), "{reason}: {err}");
        assert!(
            !err.contains(token.rsplit('.').next().unwrap()),
            "{reason}: the secret printed: {err}"
        );
    }
    // A wrong cluster token still gets the cluster token's advice.
    let fp = first.token().split("::").nth(1).unwrap().to_string();
    let err = refused_join(&first, &format!("H10::{fp}::not-the-secret"));
    assert!(
        err.contains("missing or wrong cluster token") && err.contains("<data-dir>/token"),
        "{err}"
    );
    assert!(!err.contains("hostlet token create"), "{err}");
}

/// What a new host joining through `server` with `token` prints as it exits refused (it must fail).
fn refused_join(server: &Node, token: &str) -> String {
    let joiner = Node::new("tok-refused");
    let o = joiner.run_to_exit(
        &[
            format!("--server={}", server.api_url()),
            format!("--token={token}"),
        ],
        Duration::from_secs(60),
    );
    assert!(!o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stderr).into_owned()
}
