//! The Docker adapter against the real engine: infra + joined app container, list/inspect/events scoped
//! to the node's label, stop with grace, exec, stats, and one pull for concurrent pulls of an image.

mod pods_support;

use std::time::Duration;

use futures::StreamExt;
use hostlet_api::parse_manifest;
use hostlet_controllers::pods::docker::DockerRuntime;
use hostlet_controllers::pods::metrics::DockerOpMetrics;
use hostlet_controllers::pods::runtime::{ContainerRuntime, RunState, RuntimeEventKind};
use hostlet_controllers::pods::spec::{app_spec, infra_spec, SpecConfig};
use pods_support::{ensure_images, eventually, free_port, ForeignContainer, TestNode};

fn runtime(node: &TestNode, metrics: DockerOpMetrics) -> DockerRuntime {
    DockerRuntime::new(None, &node.name, metrics).unwrap()
}

#[tokio::test]
async fn infra_and_app_share_a_namespace_and_only_this_nodes_containers_are_seen() {
    ensure_images();
    let node = TestNode::new("docker-basics");
    let other = ForeignContainer::start("other-node", &[("io.hostlet.node", "someone-else")]);
    let metrics = DockerOpMetrics::unregistered();
    let rt = runtime(&node, metrics.clone());
    let data = tempfile::tempdir().unwrap();
    let cfg = SpecConfig::new(&node.name, data.path());
    let port = free_port();
    let pod = parse_manifest(
        format!(
            "version: v1beta1\nid: web\ncontainers:\n- name: httpd\n  image: busybox:latest\n  \
             command: [sh, -c, 'echo hi > /tmp/index.html && exec httpd -f -p 8080 -h /tmp']\n  \
             ports: [{{containerPort: 8080, hostPort: {port}, hostIP: 127.0.0.1}}]\n"
        )
        .as_bytes(),
    )
    .unwrap();

    let mut events = rt.events(std::time::SystemTime::now());
    let infra_id = rt.create(&infra_spec(&cfg, &pod, 0)).await.unwrap();
    rt.start(&infra_id).await.unwrap();
    let app_id = rt
        .create(&app_spec(
            &cfg,
            &pod,
            &Default::default(),
            &pod.containers[0],
            &infra_id,
            0,
        ))
        .await
        .unwrap();
    rt.start(&app_id).await.unwrap();

    // The event stream reports create and start of both, with hostlet's labels.
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        assert!(ev.labels.is_some(), "{ev:?}");
        seen.push((ev.id.clone(), ev.kind.clone()));
    }
    assert!(
        seen.contains(&(app_id.clone(), RuntimeEventKind::Start)),
        "{seen:?}"
    );

    let listed = rt.list().await.unwrap();
    assert_eq!(listed.len(), 2, "only this node's containers: {listed:?}");
    let infra = rt.inspect(&infra_id).await.unwrap();
    assert!(
        infra.ip.is_some(),
        "the infra container has the pod's address"
    );
    let app = listed.iter().find(|c| c.id == app_id).unwrap();
    assert_eq!(app.joined_to.as_deref(), Some(infra_id.as_str()));
    assert!(app.state.is_running());
    assert!(
        rt.inspect(&other.id).await.unwrap_err().is_not_found(),
        "another node's container is not ours"
    );

    // The app serves on the infra container's published port.
    let body = eventually(
        "the page on the host port",
        Duration::from_secs(10),
        || async {
            reqwest::get(format!("http://127.0.0.1:{port}/index.html"))
                .await
                .ok()?
                .text()
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(body.trim(), "hi");

    assert_eq!(
        rt.exec(
            &app_id,
            &["sh".into(), "-c".into(), "exit 3".into()],
            Duration::from_secs(5)
        )
        .await
        .unwrap(),
        3
    );
    let stats = rt.stats(&app_id).await.unwrap();
    assert!(stats.memory_usage_bytes > 0, "{stats:?}");

    // httpd as PID 1 has no SIGTERM handler: stop waits the grace period, then kills.
    let started = std::time::Instant::now();
    rt.stop(&app_id, Duration::from_secs(1)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    match rt.inspect(&app_id).await.unwrap().state {
        RunState::Exited { exit_code, .. } => assert_eq!(exit_code, 137),
        s => panic!("stopped container is {s:?}"),
    }
    rt.remove(&app_id).await.unwrap();
    rt.remove(&infra_id).await.unwrap();
    assert!(rt.list().await.unwrap().is_empty());
    assert!(other.state().1, "the other node's container still runs");
}

#[tokio::test]
async fn concurrent_pulls_of_one_image_run_once() {
    let node = TestNode::new("docker-pull");
    let metrics = DockerOpMetrics::unregistered();
    let rt = runtime(&node, metrics.clone());
    // No registry is reachable: every pull fails, but concurrent ones must share the one attempt.
    let image = format!(
        "localhost:1/hostlet-missing-{:08x}:v1",
        rand::random::<u32>()
    );
    let results = futures::future::join_all((0..5).map(|_| rt.pull(&image))).await;
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    let pulls = metrics
        .operations
        .with_label_values(&["pull", "error"])
        .get()
        + metrics
            .operations
            .with_label_values(&["pull", "success"])
            .get();
    assert_eq!(pulls, 1, "five concurrent pulls, one Docker call");
    assert!(!rt.image_present(&image).await.unwrap());
    assert!(rt.image_present("busybox:latest").await.unwrap());
}
