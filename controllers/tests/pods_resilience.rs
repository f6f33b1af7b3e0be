//! Orphans are removed only once etcd was read; Docker going away leaves running pods alone and says so
//! in readiness; images that cannot be had are reported; resources reach Docker.

mod pods_support;

use std::time::Duration;

use hostlet_api::objects::{ContainerState, PodPhase};
use hostlet_api::parse_manifest;
use hostlet_controllers::pods::docker::DockerRuntime;
use hostlet_controllers::pods::metrics::DockerOpMetrics;
use hostlet_controllers::pods::runtime::ContainerRuntime;
use hostlet_controllers::pods::spec::{app_spec, infra_spec, SpecConfig};
use pods_support::{docker_lines, eventually, DockerProxy, ForeignContainer, Harness};

fn sleeper(id: &str) -> String {
    format!(
        "version: v1beta1\nid: {id}\nterminationGracePeriodSeconds: 2\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n"
    )
}

#[tokio::test]
async fn orphans_are_removed_only_after_etcd_was_read() {
    let mut h = Harness::without_controller("orphans").await;
    let unlabelled = ForeignContainer::start("not-hostlets", &[]);
    // A pod of this node that etcd does not know (deleted while hostlet was down).
    let rt = DockerRuntime::new(None, &h.node.name, DockerOpMetrics::unregistered()).unwrap();
    let cfg = SpecConfig::new(&h.node.name, h.data.path());
    let ghost = parse_manifest(sleeper("ghost").as_bytes()).unwrap();
    let infra = rt.create(&infra_spec(&cfg, &ghost, 0)).await.unwrap();
    rt.start(&infra).await.unwrap();
    let app = rt
        .create(&app_spec(
            &cfg,
            &ghost,
            &Default::default(),
            &ghost.containers[0],
            &infra,
            0,
        ))
        .await
        .unwrap();
    rt.start(&app).await.unwrap();

    // etcd is down as hostlet starts: Docker is listed, but nothing may be removed.
    h.etcd.kill();
    h.start_controller();
    eventually("the containers listed", Duration::from_secs(10), || async {
        h.handle().readiness().observed_synced.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!h.handle().readiness().desired_synced);
    assert_eq!(
        h.containers("ghost").iter().filter(|c| c.3).count(),
        2,
        "the orphan still runs"
    );
    assert_eq!(h.docker_ops("remove") + h.docker_ops("signal"), 0);

    h.etcd.restart().await;
    eventually("the orphan removed", Duration::from_secs(60), || async {
        h.containers("ghost").is_empty().then_some(())
    })
    .await;
    assert!(
        unlabelled.state().1,
        "a container hostlet did not create is untouched"
    );
}

#[tokio::test]
async fn docker_unreachable_leaves_pods_alone_and_readiness_says_so() {
    let mut h = Harness::without_controller("docker-down").await;
    let proxy = DockerProxy::start();
    h.docker_host = Some(proxy.docker_host());
    h.start_controller();
    h.put("a", &sleeper("a")).await;
    h.wait_status("a", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    assert!(h.handle().readiness().docker_reachable);
    let before = h.node.container_ids(true);

    proxy.cut();
    eventually(
        "readiness to say Docker is unreachable",
        Duration::from_secs(15),
        || async { (!h.handle().readiness().docker_reachable).then_some(()) },
    )
    .await;
    h.put("b", &sleeper("b")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        h.node.container_ids(true),
        before,
        "nothing changes while Docker is away"
    );

    proxy.restore();
    h.wait_status(
        "b",
        "the pod put meanwhile running",
        Duration::from_secs(60),
        |s| s.phase == PodPhase::Running,
    )
    .await;
    eventually(
        "readiness to say Docker is back",
        Duration::from_secs(15),
        || async { h.handle().readiness().docker_reachable.then_some(()) },
    )
    .await;
    let after = h.node.container_ids(true);
    assert!(
        before.iter().all(|id| after.contains(id)),
        "pod a's containers were left alone"
    );
    assert_eq!(h.status("a").await.unwrap().containers[0].restart_count, 0);
}

#[tokio::test]
async fn pull_policies_and_resources() {
    let h = Harness::start("images").await;
    let missing = format!(
        "localhost:1/hostlet-missing-{:08x}:v1",
        rand::random::<u32>()
    );
    h.put(
        "nopull",
        &format!("version: v1beta1\nid: nopull\ncontainers:\n- name: app\n  image: {missing}\n"),
    )
    .await;
    h.put(
        "never",
        &format!("version: v1beta1\nid: never\ncontainers:\n- name: app\n  image: {missing}\n  imagePullPolicy: Never\n"),
    )
    .await;
    // Always, with no registry: the pull fails, the present image runs, with a warning.
    h.put(
        "always",
        "version: v1beta1\nid: always\ncontainers:\n- name: app\n  image: busybox:latest\n  imagePullPolicy: Always\n  \
         command: [sleep, '100000']\n  resources: { limits: { cpu: 250m, memory: 32Mi } }\n",
    )
    .await;

    let s = h
        .wait_status("nopull", "ErrImagePull", Duration::from_secs(30), |s| {
            matches!(&s.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "ErrImagePull")
        })
        .await;
    assert_eq!(s.phase, PodPhase::Pending);
    assert!(s.message.contains(&missing), "{}", s.message);
    h.wait_event("nopull", Some("app"), "Failed", Duration::from_secs(5))
        .await;
    let s = h
        .wait_status("never", "not pulled", Duration::from_secs(30), |s| {
            matches!(&s.containers[0].state, ContainerState::Waiting { message, .. } if message.contains("Never"))
        })
        .await;
    assert_eq!(s.phase, PodPhase::Pending);

    h.wait_status("always", "running", Duration::from_secs(30), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    let warning = h
        .wait_event("always", Some("app"), "Failed", Duration::from_secs(5))
        .await;
    assert!(
        warning
            .message
            .contains("running the image already present"),
        "{}",
        warning.message
    );
    let id = h.running_id("always", "app").unwrap();
    let limits = docker_lines(&[
        "inspect",
        "-f",
        "{{.HostConfig.CpuShares}} {{.HostConfig.CpuQuota}} {{.HostConfig.CpuPeriod}} {{.HostConfig.Memory}}",
        &id,
    ]);
    assert_eq!(limits, [format!("256 25000 100000 {}", 32 << 20)]);
}

#[tokio::test]
async fn an_infra_container_that_cannot_start_backs_off_and_recovers() {
    let h = Harness::start("port-taken").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    h.put(
        "clash",
        &format!(
            "version: v1beta1\nid: clash\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n  \
             ports: [{{containerPort: 80, hostPort: {port}, hostIP: 127.0.0.1}}]\n"
        ),
    )
    .await;
    let s = h
        .wait_status(
            "clash",
            "the infra failure reported",
            Duration::from_secs(30),
            |s| s.message.contains("pod infra container did not start"),
        )
        .await;
    assert_eq!(s.phase, PodPhase::Pending);
    h.wait_event("clash", Some("net"), "BackOff", Duration::from_secs(15))
        .await;
    let creates = h.docker_ops("create");
    assert!(
        creates <= 3,
        "the infra container is not recreated in a loop ({creates} creates)"
    );
    drop(taken);
    h.wait_status(
        "clash",
        "running once the port is free",
        Duration::from_secs(40),
        |s| s.phase == PodPhase::Running && s.message.is_empty(),
    )
    .await;
}
