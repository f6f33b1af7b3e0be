//! The node API and callers by certificate, with real agents and etcd (TLS as deployed): a worker's own
//! certificate against the voter's `/node/v1/kv` reads and writes what is its own and is refused, naming
//! the rule, everything else; on the agent API a node's certificate opens its own agent only, a voter's
//! every agent, and nothing opens without a credential.

mod member_support;

use std::time::Duration;

use member_support::{wait_for_nodes, Cleanup, Node};

const READY: Duration = Duration::from_secs(120);

/// An HTTPS client trusting `node`'s cluster CA, presenting `who`'s client certificate if given.
fn client(node: &Node, who: Option<&Node>) -> reqwest::Client {
    let ca = std::fs::read(node.tls_file("ca.crt")).unwrap();
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
    if let Some(w) = who {
        let mut pem = std::fs::read(w.tls_file("client.crt")).unwrap();
        pem.extend(std::fs::read(w.tls_file("client.key")).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

/// (status, body) of one request.
async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<&str>,
) -> (u16, String) {
    let mut r = c.request(method, url);
    if let Some(b) = body {
        r = r.body(b.to_string());
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

fn kv(node: &Node, what: &str, target: &str) -> String {
    format!("{}/node/v1/kv?{what}={target}", node.api_url())
}

fn etcd_value(via: &Node, key: &str, revision: i64) -> String {
    let o = via.etcdctl(&[
        "get",
        key,
        &format!("--rev={revision}"),
        "--print-value-only",
    ]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_certificate_reaches_only_what_is_its_own() {
    let _cleanup = Cleanup("napi-2".to_string());
    let (voter, worker) = member_support::voter_and_worker("napi", READY);
    let (v, w) = ("napi-1", "napi-2");
    assert!(
        worker.etcd_pid().is_none(),
        "the worker runs no etcd member"
    );

    let anon = client(&voter, None);
    let as_worker = client(&voter, Some(&worker));
    let as_voter = client(&voter, Some(&voter));
    use reqwest::Method as M;

    // No certificate: nothing.
    let (code, body) = call(
        &anon,
        M::GET,
        kv(&voter, "key", "/hostlet/config/cluster"),
        None,
    )
    .await;
    assert_eq!(code, 401, "{body}");

    // What is not the worker's own: refused, naming the rule.
    let refused: &[(M, &str, &str, &str)] = &[
        (
            M::GET,
            "key",
            "/hostlet/hosts/ghost/pods/web",
            "acts for itself alone",
        ),
        (
            M::GET,
            "prefix",
            "/hostlet/hosts/ghost/pods/",
            "lists and watches only its own",
        ),
        (
            M::GET,
            "prefix",
            "/hostlet/",
            "lists and watches only its own",
        ),
        (
            M::PUT,
            "key",
            "/hostlet/config/cluster",
            "read-only to nodes",
        ),
        (
            M::PUT,
            "key",
            &format!("/hostlet/hosts/{v}/requests/tombstone"),
            "acts for itself alone",
        ),
        (
            M::PUT,
            "key",
            &format!("/hostlet/hosts/{w}/requests/tombstone"),
            "written by voters and admins",
        ),
        (
            M::PUT,
            "key",
            &format!("/hostlet/hosts/{v}/requests/member"),
            "acts for itself alone",
        ),
        (
            M::PUT,
            "key",
            "/hostlet/hosts/ghost/status/web",
            "acts for itself alone",
        ),
        (
            M::PUT,
            "key",
            "/hostlet/events/ghost/00000000000000000001-000001",
            "acts for itself alone",
        ),
        (
            M::PUT,
            "key",
            &format!("/hostlet/hosts/{w}/pods/web"),
            "voters and admins write them",
        ),
        (
            M::PUT,
            "key",
            &format!("/hostlet/hosts/{v}/pods/web"),
            "acts for itself alone",
        ),
        (
            M::PUT,
            "key",
            "/hostlet/podsets/agent",
            "pod sets are for voters and admins",
        ),
        (
            M::PUT,
            "key",
            "/hostlet/podsets/agent/status",
            "pod sets are for voters and admins",
        ),
        (
            M::GET,
            "key",
            "/hostlet/podsets/agent/revisions/0000000001",
            "pod sets are for voters and admins",
        ),
        (
            M::GET,
            "prefix",
            "/hostlet/podsets/",
            "lists and watches only its own",
        ),
        (
            M::DELETE,
            "key",
            &format!("/hostlet/nodes/{v}"),
            "writes only its own",
        ),
        (
            M::GET,
            "key",
            "/hostlet/etcd/maintenance-lock",
            "upkeep is for voters",
        ),
        (
            M::GET,
            "prefix",
            "/hostlet/tokens/",
            "lists and watches only its own",
        ),
    ];
    for (method, what, target, rule) in refused {
        let (code, body) = call(
            &as_worker,
            method.clone(),
            kv(&voter, what, target),
            Some("x"),
        )
        .await;
        assert_eq!(code, 403, "{method} {target}: {body}");
        assert!(
            body.contains(&format!("node {w} may not")) && body.contains(rule),
            "{method} {target}: {body}"
        );
    }
    // Nothing refused was written.
    let policy = voter.etcdctl(&["get", "/hostlet/config/cluster", "--print-value-only"]);
    assert!(
        String::from_utf8_lossy(&policy.stdout).contains("\"voters\""),
        "{}",
        String::from_utf8_lossy(&policy.stdout)
    );
    let tomb = voter.etcdctl(&["get", &format!("/hostlet/hosts/{v}/requests/tombstone")]);
    assert!(tomb.stdout.is_empty(), "no tombstone request");

    // Its own: accepted.
    let status_key = format!("/hostlet/hosts/{w}/status/probe");
    let (code, body) = call(
        &as_worker,
        M::PUT,
        kv(&voter, "key", &status_key),
        Some("{\"phase\":\"probe\"}"),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let revision = serde_json::from_str::<serde_json::Value>(&body).unwrap()["revision"]
        .as_i64()
        .unwrap();
    assert_eq!(
        etcd_value(&voter, &status_key, revision),
        "{\"phase\":\"probe\"}"
    );
    let (code, body) = call(&as_worker, M::DELETE, kv(&voter, "key", &status_key), None).await;
    assert_eq!(code, 200, "{body}");
    let event_key = format!("/hostlet/events/{w}/00000000000000000001-000001");
    let (code, body) = call(
        &as_worker,
        M::PUT,
        kv(&voter, "key", &event_key),
        Some("{\"reason\":\"Probe\"}"),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(
        &as_worker,
        M::GET,
        kv(&voter, "key", "/hostlet/config/cluster"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    // Its own record, but naming a voter's etcd member (it would pass for that voter): refused.
    let own_record = kv(&voter, "key", &format!("/hostlet/nodes/{w}"));
    let (_, mine) = call(&as_worker, M::GET, own_record.clone(), None).await;
    let value = serde_json::from_str::<serde_json::Value>(&mine).unwrap()["value"].clone();
    let mut record: serde_json::Value = serde_json::from_str(value.as_str().unwrap()).unwrap();
    record["memberName"] = serde_json::json!(voter.member_name());
    let (code, body) = call(&as_worker, M::PUT, own_record, Some(&record.to_string())).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("names an etcd member only when a voter writes it"),
        "{body}"
    );
    // Its record carries its built-in labels; a label only an admin may set, or a voter's role, is
    // refused, and the admins' labels of it are out of its reach.
    let record: serde_json::Value = serde_json::from_str(value.as_str().unwrap()).unwrap();
    assert_eq!(record["labels"]["hostlet.io/role"], "worker", "{record}");
    assert_eq!(record["labels"]["hostlet.io/hostname"], w, "{record}");
    for (label, value) in [
        ("hostlet.io/role", "voter"),
        ("node-restriction.hostlet.io/dedicated", "db"),
        ("hostlet.io/hostname", v),
    ] {
        let mut claimed = record.clone();
        claimed["labels"][label] = serde_json::json!(value);
        let (code, body) = call(
            &as_worker,
            M::PUT,
            kv(&voter, "key", &format!("/hostlet/nodes/{w}")),
            Some(&claimed.to_string()),
        )
        .await;
        assert_eq!(code, 403, "{label}={value}: {body}");
    }
    for method in [M::GET, M::PUT] {
        let (code, body) = call(
            &as_worker,
            method.clone(),
            kv(&voter, "key", &format!("/hostlet/node-labels/{w}")),
            Some("{\"labels\":{\"hostlet.io/dedicated\":\"db\"}}"),
        )
        .await;
        assert_eq!(code, 403, "{method}: {body}");
    }
    let (code, body) = call(
        &as_worker,
        M::GET,
        kv(&voter, "key", &format!("/hostlet/nodes/{v}")),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(v), "{body}");
    let (code, body) = call(
        &as_worker,
        M::GET,
        kv(&voter, "prefix", "/hostlet/nodes/"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let items = serde_json::from_str::<serde_json::Value>(&body).unwrap()["items"].clone();
    assert_eq!(items.as_array().map(Vec::len), Some(2), "{body}");

    // ConfigMaps and Secrets by the pod graph: one of each its pod uses, one of each it does not.
    for name in ["napi-used", "napi-other"] {
        let o = voter.etcdctl(&[
            "put",
            &format!("/hostlet/configmaps/{name}"),
            &format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"k":"v"}}}}"#),
        ]);
        assert!(o.status.success());
        let o = member_support::cli(
            &voter,
            &["secret", "create", name, "--from-literal", "k=napi-marker"],
        );
        assert!(o.status.success(), "{}", member_support::output_text(&o));
    }
    let secret = |name: &str| kv(&voter, "key", &format!("/hostlet/secrets/{name}"));
    let (code, body) = call(&as_worker, M::GET, secret("napi-used"), None).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("no pod of node napi-2 uses secret \"napi-used\""),
        "{body}"
    );
    let used = kv(&voter, "key", "/hostlet/configmaps/napi-used");
    let (code, body) = call(&as_worker, M::GET, used.clone(), None).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("no pod of node napi-2 uses configmap \"napi-used\""),
        "{body}"
    );
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"uses-cm"},"spec":{"containers":[{"name":"app","image":"busybox:latest","command":["sleep","3600"],"volumeMounts":[{"name":"c","mountPath":"/etc/c"},{"name":"s","mountPath":"/etc/s"}]}],"volumes":[{"name":"c","configMap":{"name":"napi-used"}},{"name":"s","secret":{"secretName":"napi-used"}}]}}"#;
    assert!(voter
        .etcdctl(&["put", &format!("/hostlet/hosts/{w}/pods/uses-cm"), pod])
        .status
        .success());
    let (code, body) = call(&as_worker, M::GET, used.clone(), None).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(
        &as_worker,
        M::GET,
        kv(&voter, "key", "/hostlet/configmaps/napi-other"),
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    // The secret its pod uses comes opened by the voter (a worker holds no key; etcd holds ciphertext).
    let (code, body) = call(&as_worker, M::GET, secret("napi-used"), None).await;
    assert_eq!(code, 200, "{body}");
    let value = serde_json::from_str::<serde_json::Value>(&body).unwrap()["value"].clone();
    let opened: serde_json::Value = serde_json::from_str(value.as_str().unwrap()).unwrap();
    // "napi-marker", base64 as a Secret's data holds it.
    assert_eq!(opened["data"]["k"], "bmFwaS1tYXJrZXI=", "{opened}");
    assert!(opened.get("encrypted").is_none(), "{opened}");
    let stored = voter.etcdctl(&["get", "/hostlet/secrets/napi-used"]);
    assert!(!String::from_utf8_lossy(&stored.stdout).contains("napi-marker"));
    let (code, body) = call(&as_worker, M::GET, secret("napi-other"), None).await;
    assert_eq!(code, 403, "{body}");
    // Nor straight from etcd: no certificate the worker holds opens it.
    let o = std::process::Command::new(member_support::etcdctl_program())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", voter.client_url()))
        .args(["--dial-timeout=2s", "--command-timeout=2s"])
        .arg(format!("--cacert={}", worker.tls_file("ca.crt").display()))
        .arg(format!(
            "--cert={}",
            worker.tls_file("client.crt").display()
        ))
        .arg(format!("--key={}", worker.tls_file("client.key").display()))
        .args(["get", "/hostlet/secrets/napi-other"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", member_support::output_text(&o));
    member_support::assert_no_pair_opens_etcd(&worker, &voter);
    // The list of every ConfigMap, as the worker's informer reads it: the one its pod uses, alone.
    let listed = |body: &str| -> Vec<String> {
        let page: serde_json::Value = serde_json::from_str(body).unwrap();
        page["kvs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kv| kv["key"].as_str().unwrap().to_string())
            .collect()
    };
    let list_all = format!(
        "{}/node/v1/list?prefix=/hostlet/configmaps/&revision=0",
        voter.api_url()
    );
    let (code, body) = call(&as_worker, M::GET, list_all.clone(), None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(listed(&body), vec!["/hostlet/configmaps/napi-used"]);
    assert!(voter
        .etcdctl(&["del", &format!("/hostlet/hosts/{w}/pods/uses-cm")])
        .status
        .success());
    let (code, body) = call(&as_worker, M::GET, list_all, None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(listed(&body), Vec::<String>::new());
    // Its pod gone, what it used is refused too.
    for target in [used, secret("napi-used")] {
        let (code, body) = call(&as_worker, M::GET, target, None).await;
        assert_eq!(code, 403, "{body}");
    }
    // Every ConfigMap and Secret decision above came from the voter's in-memory graph: none read etcd.
    let fallbacks = voter.get_metrics("/metrics").and_then(|(_, text)| {
        member_support::metric(&text, "hostlet_node_api_graph_fallbacks_total")
    });
    assert_eq!(fallbacks, Some(0.0));
    // And the graph followed the voter's shared watches from its start: no etcd watch of its own.
    let own_watches = voter.get_metrics("/metrics").and_then(|(_, text)| {
        member_support::metric(&text, "hostlet_node_api_graph_own_watches_total")
    });
    assert_eq!(own_watches, Some(0.0));

    // A voter's certificate: anything.
    let (code, body) = call(
        &as_voter,
        M::GET,
        kv(&voter, "prefix", "/hostlet/tokens/"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");

    // The agent API: a node's certificate opens its own agent only; a voter's, every agent.
    let pods = |n: &Node| format!("{}/pods", n.api_url());
    let (code, body) = call(&as_worker, M::GET, pods(&voter), None).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("node napi-2 may use only its own agent's API (this is node napi-1's)"),
        "{body}"
    );
    let (code, body) = call(&anon, M::GET, pods(&voter), None).await;
    assert_eq!(code, 401, "{body}");
    // The token still opens what the certificate does not.
    let r = as_worker
        .get(pods(&voter))
        .bearer_auth(voter.token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let own = client(&worker, Some(&worker));
    let (code, body) = call(&own, M::GET, pods(&worker), None).await;
    assert_eq!(code, 200, "{body}");
    let voter_on_worker = client(&worker, Some(&voter));
    let (code, body) = call(&voter_on_worker, M::GET, pods(&worker), None).await;
    assert_eq!(code, 200, "{body}");
    // A worker serves no node API.
    let (code, _) = call(
        &voter_on_worker,
        M::GET,
        kv(&worker, "key", "/hostlet/config/cluster"),
        None,
    )
    .await;
    assert_eq!(code, 404);

    // The pod the graph test put is gone from the worker before the agents stop.
    wait_for_nodes(
        "the pod removed",
        Duration::from_secs(60),
        &[&worker],
        || {
            member_support::docker_ids(w, Some("uses-cm"))
                .is_empty()
                .then_some(())
        },
    );
}

/// An HTTPS client trusting `ca` and presenting the certificate and key in `dir` (`admin.crt`, `admin.key`).
fn admin_client(dir: &std::path::Path) -> reqwest::Client {
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let mut pem = std::fs::read(dir.join("admin.crt")).unwrap();
    pem.extend(std::fs::read(dir.join("admin.key")).unwrap());
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_certificate_opens_etcd_the_cli_and_every_agent() {
    let (voter, worker) = member_support::voter_and_worker("nadm", READY);

    let dir = voter.run_dir().join("admin");
    let dir_s = dir.to_str().unwrap();
    let o = member_support::cli(
        &voter,
        &[
            "cert",
            "admin",
            "--out",
            dir_s,
            "--name",
            "ops",
            "--valid-for",
            "1h",
        ],
    );
    assert!(o.status.success(), "{}", member_support::output_text(&o));
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("admin.key")), 0o600);
    // Never over what is there; a bad name is refused.
    let again = member_support::cli(&voter, &["cert", "admin", "--out", dir_s]);
    assert_eq!(
        again.status.code(),
        Some(4),
        "{}",
        member_support::output_text(&again)
    );
    // A directory open to others is refused and left as it was.
    let open = voter.run_dir().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = member_support::cli(&voter, &["cert", "admin", "--out", open.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        member_support::output_text(&o)
    );
    assert_eq!(mode(&open), 0o755);
    assert!(std::fs::read_dir(&open).unwrap().next().is_none());
    let bad = member_support::cli(
        &voter,
        &[
            "cert",
            "admin",
            "--out",
            "/tmp/nadm-unused",
            "--name",
            "Ops!",
        ],
    );
    assert_eq!(
        bad.status.code(),
        Some(4),
        "{}",
        member_support::output_text(&bad)
    );
    assert!(!std::path::Path::new("/tmp/nadm-unused").exists());

    // etcdctl from a workstation.
    let o = std::process::Command::new(member_support::etcdctl_program())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", voter.client_url()))
        .arg(format!("--cacert={}", dir.join("ca.crt").display()))
        .arg(format!("--cert={}", dir.join("admin.crt").display()))
        .arg(format!("--key={}", dir.join("admin.key").display()))
        .args(["get", "/hostlet/config/cluster", "--print-value-only"])
        .output()
        .unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("voters"),
        "{}",
        member_support::output_text(&o)
    );
    // The CLI with explicit endpoints and the three files.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hostlet"))
        .args(["node", "ls", "--etcd-endpoints", &voter.client_url()])
        .arg("--etcd-ca-file")
        .arg(dir.join("ca.crt"))
        .arg("--etcd-cert-file")
        .arg(dir.join("admin.crt"))
        .arg("--etcd-key-file")
        .arg(dir.join("admin.key"))
        .output()
        .unwrap();
    let text = member_support::output_text(&o);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("nadm-1") && text.contains("nadm-2"), "{text}");
    // Each node's first certificate expiry, in the table and as a metric.
    assert!(text.contains("CERT EXPIRES"), "{text}");
    // Every node's certificates last the default --cert-lifetime, 90 days.
    let now = std::time::SystemTime::now();
    let days = |d: u64| Duration::from_secs(86400 * d);
    for row in text.lines().filter(|l| l.starts_with("nadm-")) {
        let expires = row
            .split_whitespace()
            .filter_map(|c| humantime::parse_rfc3339(c).ok())
            .max();
        let in_range = |from: u64, to: u64| {
            expires.is_some_and(|t| t > now + days(from) && t <= now + days(to))
        };
        assert!(in_range(89, 90), "{text}");
    }
    let (_, metrics) = worker.get_metrics("/metrics").unwrap();
    let client_expiry = member_support::metric(
        &metrics,
        "hostlet_certificate_expiry_timestamp_seconds{certificate=\"client\"}",
    )
    .unwrap_or_else(|| panic!("{metrics}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        client_expiry > now + 86400.0 * 89.0 && client_expiry <= now + 86400.0 * 90.0,
        "{client_expiry}"
    );

    // Every agent's routes, and the node API's every key.
    let admin = admin_client(&dir);
    for n in [&voter, &worker] {
        let (code, body) = call(
            &admin,
            reqwest::Method::GET,
            format!("{}/pods", n.api_url()),
            None,
        )
        .await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = call(
        &admin,
        reqwest::Method::GET,
        kv(&voter, "prefix", "/hostlet/tokens/"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_informer_lists_and_watches_through_a_voters_node_api() {
    use futures::StreamExt;
    use hostlet_runtime::informer::{ListWatch, RawEvent, WatchItem};
    use hostlet_runtime::nodeapi::NodeApiClient;

    let (voter, worker) = member_support::voter_and_worker("nlw", READY);
    let w = "nlw-2";
    let prefix = format!("/hostlet/hosts/{w}/pods/lw-");
    let put = |k: &str, v: &str| {
        let o = voter.etcdctl(&["put", k, v]);
        assert!(o.status.success(), "{}", member_support::output_text(&o));
    };
    let first = format!("{prefix}1");
    put(&first, "one");

    // A store filled through the node API with the worker's certificate.
    let informer = hostlet_runtime::Informer::over("lw", prefix.clone(), |_k, v: &[u8]| {
        String::from_utf8(v.to_vec())
    });
    let store = informer.store();
    let stop = tokio_util::sync::CancellationToken::new();
    let lw = NodeApiClient::new(client(&voter, Some(&worker)), vec![voter.api_url()])
        .list_watch(prefix.clone());
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { informer.run_with(&lw, stop).await }
    });
    let keys = |store: &hostlet_runtime::Store<String, hostlet_runtime::Object<String>>| {
        let mut k: Vec<String> = store.state().iter().map(|o| o.key.clone()).collect();
        k.sort();
        k
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while keys(&store) != vec![first.clone()] {
        assert!(
            std::time::Instant::now() < deadline,
            "listed: {:?}",
            keys(&store)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = format!("{prefix}2");
    put(&second, "two");
    assert!(voter.etcdctl(&["del", &first]).status.success());
    while keys(&store) != vec![second.clone()] {
        assert!(
            std::time::Instant::now() < deadline,
            "watched: {:?}",
            keys(&store)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.state()[0].valid().map(String::as_str), Some("two"));
    stop.cancel();
    run.await.unwrap();

    // A watch resumes from a revision: the history since then comes first.
    let lw = NodeApiClient::new(client(&voter, Some(&worker)), vec![voter.api_url()])
        .list_watch(prefix.clone());
    let page = lw.list(None, 0).await.unwrap();
    let since = page.kvs[0].mod_revision;
    let mut watch = lw.watch(since).await.unwrap();
    match watch.next().await {
        Some(Ok(WatchItem::Events(ev))) => assert!(
            matches!(&ev[0], RawEvent::Put(kv) if kv.key == second && kv.value == b"two"),
            "{ev:?}"
        ),
        other => panic!("{other:?}"),
    }
    drop(watch);

    // A compacted revision is told apart (the informer relists); another node's prefix is refused.
    let o = voter.etcdctl(&["compact", &(page.revision).to_string()]);
    assert!(o.status.success(), "{}", member_support::output_text(&o));
    match lw.list(None, since - 1).await {
        Err(hostlet_runtime::EtcdError::Compacted { .. }) => {}
        other => panic!("{other:?}"),
    }
    let other = NodeApiClient::new(client(&voter, Some(&worker)), vec![voter.api_url()])
        .list_watch("/hostlet/hosts/nlw-1/pods/");
    let refused = other.list(None, 0).await.unwrap_err().to_string();
    assert!(
        refused.contains("403") && refused.contains("lists and watches only its own"),
        "{refused}"
    );
    // One key a node may read though not its prefix, and one it may not.
    let policy = NodeApiClient::new(client(&voter, Some(&worker)), vec![voter.api_url()])
        .key_watch("/hostlet/config/cluster");
    let page = policy.list(None, 0).await.unwrap();
    assert_eq!(page.kvs.len(), 1, "{page:?}");
    assert_eq!(page.kvs[0].key, "/hostlet/config/cluster");
    assert!(policy.watch(page.revision + 1).await.is_ok());
    let theirs = NodeApiClient::new(client(&voter, Some(&worker)), vec![voter.api_url()])
        .key_watch("/hostlet/hosts/nlw-1/requests/member");
    let refused = theirs.list(None, 0).await.unwrap_err().to_string();
    assert!(
        refused.contains("403") && refused.contains("acts for itself alone"),
        "{refused}"
    );
    // A page may not start before its prefix (the range would reach keys outside it).
    let (code, body) = call(
        &client(&voter, Some(&worker)),
        reqwest::Method::GET,
        format!(
            "{}/node/v1/list?prefix={prefix}&from=L2hvc3RsZXQv",
            voter.api_url()
        ),
        None,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let refused = match other.watch(0).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a watch of another node's pods opened"),
    };
    assert!(refused.contains("403"), "{refused}");
    assert!(voter.etcdctl(&["del", &second]).status.success());
}

/// `hostlet token create` on `node`: the token alone.
fn worker_token(node: &Node) -> String {
    let o = member_support::cli(node, &["token", "create"]);
    assert!(o.status.success(), "{}", member_support::output_text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_workers_certificates_are_refused_its_agent_stops_and_its_pods_stay() {
    use member_support::{cli, docker_ids, output_text, run_pod, status, stdout};
    let _cleanup = Cleanup("rvk-2".to_string());
    let mut voter = Node::new("rvk-1");
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
    let token = worker_token(&voter);
    let mut worker = Node::new("rvk-2");
    worker.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token={token}"),
    ]);
    worker.wait_ready(READY);
    run_pod(&worker, "rvk-pod");
    wait_for_nodes(
        "the worker's pod running",
        READY,
        &[&voter, &worker],
        || (status(&worker, "rvk-pod")?["phase"] == "Running").then_some(()),
    );
    let containers = docker_ids("rvk-2", Some("rvk-pod"));
    assert!(!containers.is_empty());
    // The worker reaches the cluster through the voter's node API alone: it holds connections to the
    // voter's API and none to its etcd.
    wait_for_nodes(
        "the worker connected to the voter's API",
        READY,
        &[&voter, &worker],
        || {
            worker
                .connected_ports()
                .contains(&voter.api_port)
                .then_some(())
        },
    );
    let ports = worker.connected_ports();
    assert!(
        !ports.contains(&voter.client_port),
        "the worker's agent holds a connection to the voter's etcd ({}): {ports:?}",
        voter.client_port
    );
    // No certificate the worker holds opens etcd, deleted or not.
    member_support::assert_no_pair_opens_etcd(&worker, &voter);
    let as_worker = client(&voter, Some(&worker));
    let own_status = kv(&voter, "key", "/hostlet/hosts/rvk-2/status/rvk-pod");
    assert_eq!(
        call(&as_worker, reqwest::Method::GET, own_status.clone(), None)
            .await
            .0,
        200
    );

    // Both nodes' certificates are recorded: the worker's by its join, the voter's by the voter itself.
    let states = |via: &Node| {
        let o = cli(via, &["node", "certs", "-o", "json"]);
        assert!(o.status.success(), "{}", output_text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let mut s: Vec<(String, String)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["name"].as_str().unwrap().into(),
                    n["state"].as_str().unwrap().into(),
                )
            })
            .collect();
        s.sort();
        s
    };
    wait_for_nodes(
        "both nodes' certificates recorded",
        READY,
        &[&voter, &worker],
        || {
            let s = states(&voter);
            (s == [
                ("rvk-1".into(), "recorded".into()),
                ("rvk-2".into(), "recorded".into()),
            ])
            .then_some(())
        },
    );

    let o = cli(&voter, &["node", "delete", "rvk-2"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        stdout(&o).contains("certificates are revoked"),
        "{}",
        stdout(&o)
    );
    let deleted = std::time::Instant::now();

    // The voter's node API refuses the worker's certificate within 5 s.
    let body = loop {
        let (code, body) = call(&as_worker, reqwest::Method::GET, own_status.clone(), None).await;
        if code == 403 {
            break body;
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "still answered {code} {:?} after the delete: {body}",
            deleted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("revoked"), "{body}");
    eprintln!("refused {:?} after the delete", deleted.elapsed());

    // Its own agent refuses its certificate too, within 5 s of the delete (a worker sees no revocation
    // list: it knows from its voters' refusal).
    let own_agent = client(&worker, Some(&worker));
    let own_pods = format!("{}/pods", worker.api_url());
    loop {
        let (code, body) = call(&own_agent, reqwest::Method::GET, own_pods.clone(), None).await;
        if code == 403 {
            assert!(body.contains("revoked"), "{body}");
            break;
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "the worker's own agent still answers {code} to its revoked certificate {:?} after the \
             delete: {body}",
            deleted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Its agent stops: /readyz says why; its record stays gone; its container is the one it was.
    let report = wait_for_nodes(
        "the worker to report the revocation",
        READY,
        &[&worker],
        || {
            let r = worker.readyz()?;
            (r["components"]["certificate"]["ready"] == false).then_some(r)
        },
    );
    assert!(
        report["components"]["certificate"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("revoked") && m.contains("new worker token")),
        "{report}"
    );
    assert!(!worker.is_ready());
    assert!(worker.running(), "the agent keeps answering");
    // Its lease ended with its registration, which is what writes the record: the record stays gone.
    wait_for_nodes(
        "the deleted worker's lease to end",
        READY,
        &[&voter],
        || {
            let o = voter.etcdctl(&["get", "/hostlet/leases/rvk-2", "--print-value-only"]);
            (o.status.success() && stdout(&o).trim().is_empty()).then_some(())
        },
    );
    assert!(worker
        .log()
        .contains("stopped and left its pods as they are"));
    let o = voter.etcdctl(&["get", "/hostlet/nodes/rvk-2", "--print-value-only"]);
    assert_eq!(stdout(&o).trim(), "", "the record does not come back");
    assert_eq!(docker_ids("rvk-2", Some("rvk-pod")), containers);

    // The name comes back only with a worker token made since: the old one is refused.
    worker.stop(Duration::from_secs(20));
    let mut again = Node::new("rvk-2");
    again.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token={token}"),
    ]);
    let exited = wait_for_nodes("the join with the old token to end", READY, &[], || {
        again.exited()
    });
    assert!(!exited.success());
    assert!(
        again.log().contains("was deleted") && again.log().contains("worker token made since"),
        "{}",
        again.log_tail(20)
    );
    let fresh = worker_token(&voter);
    let mut back = Node::new("rvk-2");
    back.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token={fresh}"),
    ]);
    back.wait_ready(READY);
    member_support::assert_no_pair_opens_etcd(&back, &voter);

    // Certificates no join recorded (a node from before serials were recorded) are listed as such.
    let o = voter.etcdctl(&["del", "/hostlet/certs/rvk-2"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        states(&voter),
        [
            ("rvk-1".into(), "recorded".into()),
            ("rvk-2".into(), "unrecorded".into())
        ]
    );
    let o = cli(&voter, &["node", "certs"]);
    assert!(member_support::stderr(&o).contains("1 node(s) hold certificates no join recorded"));
}

/// The serial of the certificate in `path`.
fn serial(path: &std::path::Path) -> String {
    hostlet_controllers::pki::serial_of(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_renews_its_certificates_before_they_expire_without_a_restart() {
    use member_support::{docker_ids, metric, run_pod, status};
    let _cleanup = Cleanup("rnw-2".to_string());
    let mut voter = Node::new("rnw-1");
    voter.start(&[
        "--etcd-voters=1".to_string(),
        "--cert-lifetime=2m".to_string(),
    ]);
    voter.wait_ready(READY);
    let token = worker_token(&voter);
    let mut worker = Node::new("rnw-2");
    worker.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token={token}"),
    ]);
    worker.wait_ready(READY);
    let pid = worker.pid();
    run_pod(&worker, "rnw-a");
    wait_for_nodes(
        "the worker's pod running",
        READY,
        &[&voter, &worker],
        || (status(&worker, "rnw-a")?["phase"] == "Running").then_some(()),
    );
    let containers = docker_ids("rnw-2", Some("rnw-a"));
    let first = serial(&worker.tls_file("client.crt"));
    let first_expiry =
        hostlet_controllers::pki::not_after(&std::fs::read(worker.tls_file("server.crt")).unwrap())
            .unwrap();

    // Renewed two thirds into the two minutes: new serials, the node record and the metric follow.
    let renewed = wait_for_nodes(
        "the worker's certificates renewed",
        Duration::from_secs(150),
        &[&voter, &worker],
        || {
            let now = serial(&worker.tls_file("client.crt"));
            (now != first).then_some(now)
        },
    );
    wait_for_nodes(
        "the node record naming the new serials",
        READY,
        &[&voter, &worker],
        || {
            let o = voter.etcdctl(&["get", "/hostlet/nodes/rnw-2", "--print-value-only"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            v["certSerials"]
                .as_array()?
                .iter()
                .any(|s| s == renewed.as_str())
                .then_some(())
        },
    );
    let expiry =
        hostlet_controllers::pki::not_after(&std::fs::read(worker.tls_file("client.crt")).unwrap())
            .unwrap();
    let want = expiry
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    wait_for_nodes("the expiry metric to follow", READY, &[&worker], || {
        let (_, text) = worker.get_metrics("/metrics")?;
        let name = "hostlet_certificate_expiry_timestamp_seconds{certificate=\"client\"}";
        (metric(&text, name) == Some(want)).then_some(())
    });

    // Past the first certificates' expiry: the same agent serves and writes with the new ones, and its pod
    // was never touched.
    let left = first_expiry
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    wait_for_nodes(
        "the first certificates to expire",
        left + Duration::from_secs(10),
        &[&voter, &worker],
        || (std::time::SystemTime::now() > first_expiry + Duration::from_secs(2)).then_some(()),
    );
    let api = client(&worker, None);
    let (code, body) = call(
        &api,
        reqwest::Method::GET,
        format!("{}/healthz", worker.api_url()),
        None,
    )
    .await;
    assert_eq!(
        code, 200,
        "the worker's API with its renewed certificate: {body}"
    );
    let as_worker = client(&voter, Some(&worker));
    let (code, body) = call(
        &as_worker,
        reqwest::Method::GET,
        kv(&voter, "key", "/hostlet/hosts/rnw-2/status/rnw-a"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    run_pod(&worker, "rnw-b");
    wait_for_nodes(
        "a pod applied after the expiry running",
        READY,
        &[&voter, &worker],
        || (status(&worker, "rnw-b")?["phase"] == "Running").then_some(()),
    );
    assert!(worker.is_ready());
    assert_eq!(worker.pid(), pid, "the agent did not restart");
    assert_eq!(docker_ids("rnw-2", Some("rnw-a")), containers);
    assert_eq!(
        status(&worker, "rnw-a").unwrap()["containers"][0]["restartCount"],
        0
    );
    member_support::assert_no_pair_opens_etcd(&worker, &voter);
}

/// Whether `cert` with `key` is let into `voter`'s etcd peer port (its `/members` answered).
async fn opens_peer_port(voter: &Node, cert: &std::path::Path, key: &std::path::Path) -> bool {
    let mut pem = std::fs::read(cert).unwrap();
    pem.extend(std::fs::read(key).unwrap());
    let ca = std::fs::read(voter.tls_file("ca.crt")).unwrap();
    // etcd's peer port speaks HTTP/1.1 to such a caller.
    let client = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(5))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{}/members", voter.peer_port);
    client
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_an_earlier_version_joined_moves_off_the_cluster_ca_and_its_old_certificate_stops_opening_etcd(
) {
    use hostlet_controllers::pki::{ClusterCa, TlsDir};
    use member_support::{cli, docker_ids, output_text, run_pod, status, stderr, stdout};
    let _cleanup = Cleanup("mov-2".to_string());
    let mut voter = Node::new("mov-1");
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
    let token = worker_token(&voter);
    let mut worker = Node::new("mov-2");
    worker.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token={token}"),
    ]);
    worker.wait_ready(READY);
    run_pod(&worker, "mov-a");
    wait_for_nodes(
        "the worker's pod running",
        READY,
        &[&voter, &worker],
        || (status(&worker, "mov-a")?["phase"] == "Running").then_some(()),
    );
    let containers = docker_ids("mov-2", Some("mov-a"));

    // The worker as an earlier version left it: certificates from the cluster CA (which open etcd), no
    // node CA certificate, and the serials its join recorded.
    worker.stop(Duration::from_secs(20));
    let ca = ClusterCa {
        cert: std::fs::read_to_string(voter.tls_file("ca.crt")).unwrap(),
        key: std::fs::read_to_string(voter.tls_file("ca.key")).unwrap(),
    };
    let old = ca
        .issue_node("mov-2", &["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap();
    let tls = TlsDir::new(worker.data_dir.join("tls"));
    tls.write_worker(&ca.cert, None, &old).unwrap();
    std::fs::remove_file(tls.node_ca_cert()).unwrap();
    let kept = worker.dir.join("old-client");
    std::fs::create_dir_all(&kept).unwrap();
    let (old_cert, old_key) = (kept.join("client.crt"), kept.join("client.key"));
    std::fs::write(&old_cert, &old.client.cert).unwrap();
    std::fs::write(&old_key, &old.client.key).unwrap();
    // Its server and peer certificates also serve as a client's (and share the key); the earliest
    // versions recorded no serial at all, so only the client's is recorded here: the others are known
    // only from the worker handing them in.
    let (old_server, old_peer) = (kept.join("server.crt"), kept.join("peer.crt"));
    std::fs::write(&old_server, &old.server.cert).unwrap();
    std::fs::write(&old_peer, &old.peer.cert).unwrap();
    let serials: Vec<String> = [&old.client]
        .iter()
        .map(|c| hostlet_controllers::pki::serial_of(c.cert.as_bytes()).unwrap())
        .collect();
    let record = serde_json::json!({ "issued": serials }).to_string();
    let o = voter.etcdctl(&["put", "/hostlet/certs/mov-2", &record]);
    assert!(o.status.success(), "{}", output_text(&o));
    // And the server token, which such a worker kept when it joined with it.
    std::fs::write(
        worker.data_dir.join("token"),
        format!("{}\n", voter.token()),
    )
    .unwrap();
    for c in [&old_cert, &old_server, &old_peer] {
        assert!(
            member_support::pair_opens_etcd(&voter, c, &old_key),
            "the old certificate {} opens etcd",
            c.display()
        );
    }
    assert!(
        opens_peer_port(&voter, &old_peer, &old_key).await,
        "the old peer certificate opens etcd's peer port"
    );
    let etcd_column = |via: &Node| {
        let o = cli(via, &["node", "certs", "-o", "json"]);
        assert!(o.status.success(), "{}", output_text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "mov-2")
            .map(|n| n["opensEtcd"].as_bool().unwrap())
            .unwrap()
    };
    assert!(etcd_column(&voter), "listed as holding old credentials");
    let o = cli(&voter, &["node", "certs"]);
    assert!(
        stdout(&o).contains("yes (old credentials)"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("1 worker(s) hold certificates that open etcd"),
        "{}",
        stderr(&o)
    );

    // Started with this version: it moves to the node CA, and etcd refuses the old certificate.
    worker.start(&[]);
    worker.wait_ready(READY);
    wait_for_nodes(
        "the worker's certificates from the node CA",
        READY,
        &[&voter, &worker],
        || tls.client_from_node_ca().then_some(()),
    );
    for c in [&old_cert, &old_server, &old_peer] {
        wait_for_nodes(
            &format!("etcd to refuse the old {}", c.display()),
            READY,
            &[&voter, &worker],
            || (!member_support::pair_opens_etcd(&voter, c, &old_key)).then_some(()),
        );
    }
    assert!(
        member_support::pair_opens_etcd(
            &voter,
            &voter.tls_file("client.crt"),
            &voter.tls_file("client.key")
        ),
        "etcd still answers the voter: the refusals above are refusals"
    );
    assert!(
        opens_peer_port(
            &voter,
            &voter.tls_file("peer.crt"),
            &voter.tls_file("peer.key")
        )
        .await,
        "the voter's own peer certificate opens its peer port"
    );
    assert!(
        !opens_peer_port(&voter, &old_peer, &old_key).await,
        "the old peer certificate is refused at the peer port"
    );
    member_support::assert_no_pair_opens_etcd(&worker, &voter);
    wait_for_nodes(
        "the worker to swap the server token for one of its own",
        READY,
        &[&voter, &worker],
        || {
            let kept = worker.token();
            (kept != voter.token() && kept.split("::").last()?.starts_with("wt.")).then_some(())
        },
    );
    wait_for_nodes(
        "no worker left with old credentials",
        READY,
        &[&voter],
        || (!etcd_column(&voter)).then_some(()),
    );
    assert_eq!(
        docker_ids("mov-2", Some("mov-a")),
        containers,
        "its pod untouched"
    );
    // The CLI on the worker reads its own pods through the voters, and says what it cannot do there.
    let o = member_support::cli_bare(&worker, &["pod", "ls", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == "mov-a"),
        "{listed}"
    );
    let o = member_support::cli_bare(&worker, &["pod", "get", "mov-a", "-o", "json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    for args in [&["node", "ls"][..], &["pod", "ls", "-A"]] {
        let o = member_support::cli_bare(&worker, args);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("this host is a worker")
                && stderr(&o).contains("hostlet cert admin"),
            "{args:?}: {}",
            output_text(&o)
        );
    }
    run_pod(&worker, "mov-b");
    wait_for_nodes("a later pod running", READY, &[&voter, &worker], || {
        (status(&worker, "mov-b")?["phase"] == "Running").then_some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_voter_an_earlier_version_started_renews_its_ten_year_certificates_at_once_and_they_stop_opening_etcd(
) {
    use hostlet_controllers::pki::{not_after, serial_of, ClusterCa, TlsDir};
    use member_support::{output_text, pair_opens_etcd};
    let mut voter = Node::new("old-v1");
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(READY);
    // The voter as an earlier version left it: ten-year certificates from the cluster CA, their serials
    // recorded as its join (or bootstrap) recorded them.
    let ca = ClusterCa {
        cert: std::fs::read_to_string(voter.tls_file("ca.crt")).unwrap(),
        key: std::fs::read_to_string(voter.tls_file("ca.key")).unwrap(),
    };
    let tls = TlsDir::new(voter.data_dir.join("tls"));
    let sans = hostlet_controllers::pki::cert_sans(
        &std::fs::read_to_string(voter.tls_file("server.crt")).unwrap(),
    )
    .unwrap();
    let old = ca.issue_node("old-v1", &sans).unwrap();
    let serials: Vec<String> = [&old.server, &old.peer, &old.client]
        .iter()
        .map(|c| serial_of(c.cert.as_bytes()).unwrap())
        .collect();
    let record = serde_json::json!({ "issued": serials }).to_string();
    let o = voter.etcdctl(&["put", "/hostlet/certs/old-v1", &record]);
    assert!(o.status.success(), "{}", output_text(&o));
    voter.stop(Duration::from_secs(20));
    tls.write(&ca, &old).unwrap();
    let kept = voter.dir.join("old-client");
    std::fs::create_dir_all(&kept).unwrap();
    let (old_cert, old_key) = (kept.join("client.crt"), kept.join("client.key"));
    std::fs::write(&old_cert, &old.client.cert).unwrap();
    std::fs::write(&old_key, &old.client.key).unwrap();
    let ten_years_out = not_after(old.client.cert.as_bytes()).unwrap();

    // Started with this version (default --cert-lifetime, 90 days): it issues itself new certificates at
    // once, and etcd refuses the ten-year ones from then on.
    voter.start(&[]);
    voter.wait_ready(READY);
    let pid = voter.pid();
    let limit = std::time::SystemTime::now() + Duration::from_secs(91 * 86_400);
    wait_for_nodes("the voter's certificates renewed", READY, &[&voter], || {
        let pem = std::fs::read(voter.tls_file("client.crt")).ok()?;
        (not_after(&pem)? < limit).then_some(())
    });
    assert!(ten_years_out > limit);
    // Its own new certificate opens etcd (so a refusal below is a refusal, not an etcd that is down)…
    wait_for_nodes(
        "the voter's new client certificate to open etcd",
        READY,
        &[&voter],
        || {
            pair_opens_etcd(
                &voter,
                &voter.tls_file("client.crt"),
                &voter.tls_file("client.key"),
            )
            .then_some(())
        },
    );
    // …and the ten-year one does not.
    wait_for_nodes(
        "etcd to refuse the ten-year certificate",
        READY,
        &[&voter],
        || (!pair_opens_etcd(&voter, &old_cert, &old_key)).then_some(()),
    );
    assert!(pair_opens_etcd(
        &voter,
        &voter.tls_file("client.crt"),
        &voter.tls_file("client.key")
    ));
    assert_eq!(voter.pid(), pid, "renewed without a restart");
    let o = voter.etcdctl(&["get", "/hostlet/certs/old-v1", "--print-value-only"]);
    assert!(o.status.success(), "{}", output_text(&o));
    let rec: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for s in &serials {
        assert!(
            rec["superseded"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == s)),
            "{s} superseded: {rec}"
        );
    }
}
