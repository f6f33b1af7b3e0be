//! Pods from etcd keys on the real Docker engine: run in one network namespace and serve, report status
//! and events; a changed container is replaced alone; deletion stops with SIGTERM and removes the status;
//! a bad manifest is rejected and nothing runs.

mod pods_support;

use std::time::Duration;

use hostlet_api::objects::{ContainerState, PodPhase};
use std::future::IntoFuture;

use hostlet_controllers::pods::http::router;
use pods_support::{docker_lines, eventually, free_port, Harness};

fn web_pod(port: u16, writer_command: &str) -> String {
    format!(
        r#"
version: v1beta1
id: web
terminationGracePeriodSeconds: 2
volumes:
  - name: www
    source: {{ emptyDir: {{}} }}
containers:
  - name: httpd
    image: busybox:latest
    command: [httpd, -f, -p, "8080", -h, /www]
    ports: [{{ containerPort: 8080, hostPort: {port}, hostIP: 127.0.0.1 }}]
    volumeMounts: [{{ name: www, mountPath: /www }}]
    readinessProbe: {{ httpGet: {{ path: /index.html, port: 8080 }}, periodSeconds: 1 }}
  - name: writer
    image: busybox:latest
    command: [sh, -c, "{writer_command}"]
    volumeMounts: [{{ name: www, mountPath: /www }}]
"#
    )
}

const WRITER: &str = "while true; do echo hello-from-sidecar > /www/index.html; sleep 1; done";

#[tokio::test]
async fn a_pod_serves_from_an_empty_dir_written_by_its_sidecar() {
    let h = Harness::start("serve").await;
    let port = free_port();
    h.put("web", &web_pod(port, WRITER)).await;

    let status = h
        .wait_status("web", "Running and ready", Duration::from_secs(30), |s| {
            s.phase == PodPhase::Running && s.ready
        })
        .await;
    assert_eq!(status.containers.len(), 2);
    assert!(status
        .containers
        .iter()
        .all(|c| c.ready && c.restart_count == 0));
    assert!(status.started_at.is_some());

    // The host port serves the page the sidecar wrote into the shared emptyDir.
    let body = eventually(
        "the page on the host port",
        Duration::from_secs(10),
        || async {
            let r = reqwest::get(format!("http://127.0.0.1:{port}/index.html"))
                .await
                .ok()?;
            r.status().is_success().then_some(())?;
            r.text().await.ok()
        },
    )
    .await;
    assert_eq!(body.trim(), "hello-from-sidecar");
    assert!(
        h.data
            .path()
            .join("pods/web/volumes/www/index.html")
            .exists(),
        "emptyDir under the data dir"
    );

    // One network namespace: the sidecar reaches httpd on localhost, and both join the infra container.
    let writer = h.running_id("web", "writer").unwrap();
    let httpd = h.running_id("web", "httpd").unwrap();
    let infra = h.running_id("web", "net").unwrap();
    let page = docker_lines(&[
        "exec",
        &writer,
        "wget",
        "-qO-",
        "http://127.0.0.1:8080/index.html",
    ]);
    assert_eq!(page, ["hello-from-sidecar"]);
    for id in [&writer, &httpd] {
        let mode = docker_lines(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", id]);
        assert_eq!(mode, [format!("container:{infra}")]);
    }
    let hostname = docker_lines(&["exec", &httpd, "hostname"]);
    assert_eq!(
        hostname,
        ["web"],
        "the infra container sets the pod's hostname"
    );

    for c in ["httpd", "writer"] {
        h.wait_event("web", Some(c), "Created", Duration::from_secs(5))
            .await;
        h.wait_event("web", Some(c), "Started", Duration::from_secs(5))
            .await;
    }

    // Events live on a 48 h lease.
    let (kvs, _) = h
        .client
        .get_prefix(h.layout.events_prefix(&h.node.name))
        .await
        .unwrap();
    let lease = kvs[0].lease();
    assert!(
        kvs.iter().all(|kv| kv.lease() != 0),
        "every event is on a lease"
    );
    let ttl = h
        .client
        .client()
        .lease_time_to_live(lease, None)
        .await
        .unwrap()
        .ttl();
    assert!(ttl > 47 * 3600 && ttl <= 48 * 3600, "lease TTL {ttl} s");

    // The HTTP API: the pod list, one pod (manifest + status), a container's stats.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    let server = tokio::spawn(axum::serve(listener, router(h.handle().clone())).into_future());
    let get = |path: &str| {
        let url = format!("http://{api}{path}");
        async move {
            let r = reqwest::get(url).await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let (code, pods) = get("/pods").await;
    assert_eq!(code, 200);
    assert_eq!(pods[0]["id"], "web");
    let (code, pod) = get("/pods/web").await;
    assert_eq!(code, 200);
    assert_eq!(pod["manifest"]["containers"][1]["name"], "writer");
    assert_eq!(pod["status"]["phase"], "Running");
    let (code, stats) = get("/stats/web/httpd").await;
    assert_eq!(code, 200);
    assert!(stats["memoryUsageBytes"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["cpuPercent"].as_f64().is_some());
    assert_eq!(get("/stats/web/nope").await.0, 404);
    assert_eq!(get("/pods/nope").await.0, 404);
    server.abort();

    // The pod's metrics.
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&h.metrics.registry().gather())
        .unwrap();
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(value("hostlet_pod_start_duration_seconds_count"), 1.0);
    assert_eq!(value("hostlet_running_pods"), 1.0);
    assert_eq!(value("hostlet_running_containers"), 2.0);
    assert!(value("hostlet_docker_events_total{type=\"start\"}") >= 3.0);
    assert!(value("hostlet_probe_results_total{probe=\"readiness\",result=\"success\"}") >= 1.0);
    assert!(value("hostlet_docker_operations_total{op=\"create\",result=\"success\"}") >= 3.0);
    assert_eq!(value("hostlet_pleg_relist_duration_seconds_count"), 1.0);
}

#[tokio::test]
async fn changing_one_container_replaces_it_alone_and_unchanged_pods_are_not_touched() {
    let h = Harness::start("replace").await;
    let port = free_port();
    h.put("web", &web_pod(port, WRITER)).await;
    h.put(
        "other",
        "version: v1beta1\nid: other\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n",
    )
    .await;
    h.wait_status("web", "ready", Duration::from_secs(30), |s| s.ready)
        .await;
    h.wait_status("other", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    let before_web = h.containers("web");
    let before_other = h.containers("other");
    let creates = h.docker_ops("create");

    // Rewriting a key with the same manifest changes nothing.
    h.put("other", "version: v1beta1\nid: other\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n")
        .await;
    h.put("web", &web_pod(port, &WRITER.replace("hello", "bonjour")))
        .await;
    eventually(
        "the page of the new writer",
        Duration::from_secs(30),
        || async {
            let body = reqwest::get(format!("http://127.0.0.1:{port}/index.html"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            body.contains("bonjour").then_some(())
        },
    )
    .await;
    let status = h
        .wait_status("web", "ready again", Duration::from_secs(30), |s| {
            s.ready
                && s.containers
                    .iter()
                    .all(|c| matches!(c.state, ContainerState::Running { .. }))
        })
        .await;

    let after_web = h.containers("web");
    let id_of = |list: &[(String, String, String, bool)], name: &str| {
        list.iter()
            .filter(|(n, _, _, running)| n == name && *running)
            .map(|(_, _, id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        id_of(&after_web, "httpd"),
        id_of(&before_web, "httpd"),
        "httpd untouched"
    );
    assert_eq!(
        id_of(&after_web, "net"),
        id_of(&before_web, "net"),
        "infra untouched"
    );
    assert_ne!(
        id_of(&after_web, "writer"),
        id_of(&before_web, "writer"),
        "writer replaced"
    );
    assert_eq!(
        after_web.len(),
        3,
        "the old writer is removed: {after_web:?}"
    );
    assert_eq!(
        h.containers("other"),
        before_other,
        "the unchanged pod is not touched"
    );
    assert_eq!(
        h.docker_ops("create") - creates,
        1,
        "exactly one container created"
    );
    assert!(status.containers.iter().any(|c| c.name == "writer"));
}

#[tokio::test]
async fn deleting_the_key_stops_with_sigterm_and_removes_the_status() {
    let mut h = Harness::start("delete").await;
    let marks = tempfile::tempdir().unwrap();
    h.allowed_host_paths = vec![marks.path().to_path_buf()];
    h.stop_controller().await;
    h.start_controller();
    let manifest = format!(
        r#"
version: v1beta1
id: graceful
terminationGracePeriodSeconds: 20
volumes:
  - name: marks
    source: {{ hostDir: {{ path: {} }} }}
  - name: scratch
containers:
  - name: app
    image: busybox:latest
    command: [sh, -c, "trap 'echo got-sigterm > /marks/term; exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{{ name: marks, mountPath: /marks }}, {{ name: scratch, mountPath: /scratch }}]
"#,
        marks.path().display()
    );
    h.put("graceful", &manifest).await;
    h.wait_status("graceful", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    assert!(h.data.path().join("pods/graceful").exists());

    let deleted_at = std::time::Instant::now();
    h.delete("graceful").await;
    eventually(
        "the pod's containers gone",
        Duration::from_secs(15),
        || async { h.containers("graceful").is_empty().then_some(()) },
    )
    .await;
    let took = deleted_at.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "removed within the grace period ({took:?})"
    );
    let mark = std::fs::read_to_string(marks.path().join("term")).unwrap();
    assert_eq!(
        mark.trim(),
        "got-sigterm",
        "the container got SIGTERM, not SIGKILL"
    );
    eventually("the status key gone", Duration::from_secs(10), || async {
        h.status("graceful").await.is_none().then_some(())
    })
    .await;
    h.wait_event("graceful", Some("app"), "Killing", Duration::from_secs(5))
        .await;
    assert!(
        !h.data.path().join("pods/graceful").exists(),
        "the pod's directory is removed"
    );
}

#[tokio::test]
async fn a_manifest_that_does_not_parse_or_validate_is_rejected_and_nothing_runs() {
    let h = Harness::start("reject").await;
    h.put(
        "broken",
        "version: v1beta1\nid: broken\ncontainers: [ {name: a, image: busybox\n",
    )
    .await;
    h.put(
        "invalid",
        "version: v1beta1\nid: invalid\ncontainers:\n- name: a\n  image: busybox:latest\n  ports: [{containerPort: 80, protocol: XTP}]\n",
    )
    .await;
    let broken = h
        .wait_status("broken", "Rejected", Duration::from_secs(20), |s| {
            s.phase == PodPhase::Rejected
        })
        .await;
    assert!(
        broken.message.contains("line"),
        "the parser's position: {}",
        broken.message
    );
    let invalid = h
        .wait_status("invalid", "Rejected", Duration::from_secs(20), |s| {
            s.phase == PodPhase::Rejected
        })
        .await;
    assert!(
        invalid.message.contains("containers[0].ports[0].protocol"),
        "{}",
        invalid.message
    );
    h.wait_event("broken", None, "Rejected", Duration::from_secs(5))
        .await;
    h.wait_event("invalid", None, "Rejected", Duration::from_secs(5))
        .await;
    assert!(h.node.container_ids(false).is_empty(), "nothing ran");

    // Fixed, it runs.
    h.put("invalid", "version: v1beta1\nid: invalid\ncontainers:\n- name: a\n  image: busybox:latest\n  command: [sleep, '1000']\n")
        .await;
    h.wait_status("invalid", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
}
