//! A restarted hostlet adopts what runs (no container created or removed, statuses rewritten); an etcd
//! outage leaves every pod running and later changes apply; containers hostlet did not create, or that
//! belong to another node, are never touched.

mod pods_support;

use std::time::Duration;

use hostlet_api::objects::PodPhase;
use pods_support::{eventually, ForeignContainer, Harness};

fn sleeper(id: &str) -> String {
    format!(
        "version: v1beta1\nid: {id}\nterminationGracePeriodSeconds: 2\ncontainers:\n- name: app\n  image: busybox:latest\n  command: [sleep, '100000']\n"
    )
}

#[tokio::test]
async fn a_restarted_hostlet_adopts_twenty_running_pods() {
    let mut h = Harness::start("adopt").await;
    let unlabelled = ForeignContainer::start("not-hostlets", &[]);
    let other_node = ForeignContainer::start(
        "other-node",
        &[
            ("io.hostlet.node", "another-node"),
            ("io.hostlet.pod", "p1"),
            ("io.hostlet.container", "app"),
            ("io.hostlet.role", "app"),
            ("io.hostlet.spec-hash", "0"),
        ],
    );
    let ids: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    for id in &ids {
        h.put(id, &sleeper(id)).await;
    }
    for id in &ids {
        h.wait_status(id, "running", Duration::from_secs(60), |s| {
            s.phase == PodPhase::Running && s.ready
        })
        .await;
    }
    let before = h.node.container_ids(true);
    assert_eq!(before.len(), 40, "20 infra + 20 app containers");

    h.stop_controller().await;
    // Without hostlet the statuses go stale; the new one must write them again.
    for id in &ids {
        h.client
            .delete(h.layout.pod_status(&h.node.name, id))
            .await
            .unwrap();
    }
    h.start_controller();
    for id in &ids {
        h.wait_status(id, "rewritten", Duration::from_secs(30), |s| {
            s.phase == PodPhase::Running && s.ready
        })
        .await;
    }
    for op in ["create", "remove", "start", "signal", "stop"] {
        assert_eq!(
            h.docker_ops(op),
            0,
            "the restarted hostlet made no `{op}` call"
        );
    }
    let mut after = h.node.container_ids(true);
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(after, before, "the same containers run");
    assert_eq!(
        unlabelled.state(),
        (unlabelled.id.clone(), true),
        "a container hostlet did not create is untouched"
    );
    assert_eq!(
        other_node.state(),
        (other_node.id.clone(), true),
        "another node's container is untouched"
    );
}

#[tokio::test]
async fn pods_keep_running_through_an_etcd_outage_and_later_changes_apply() {
    let mut h = Harness::start("etcd-outage").await;
    let unlabelled = ForeignContainer::start("not-hostlets", &[]);
    let other_node = ForeignContainer::start("other-node", &[("io.hostlet.node", "another-node")]);
    for id in ["a", "b", "c"] {
        h.put(id, &sleeper(id)).await;
    }
    for id in ["a", "b", "c"] {
        h.wait_status(id, "running", Duration::from_secs(30), |s| {
            s.phase == PodPhase::Running
        })
        .await;
    }
    let mut before = h.node.container_ids(true);
    before.sort();

    h.etcd.kill();
    // The outage lasts 60 s (the scenario's length, not a wait for a condition); every few seconds the pods
    // must still be there, untouched.
    let outage = tokio::time::Instant::now();
    while outage.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut now = h.node.container_ids(true);
        now.sort();
        assert_eq!(
            now,
            before,
            "pods keep running while etcd is down ({:?} in)",
            outage.elapsed()
        );
    }
    assert_eq!(h.docker_ops("remove") + h.docker_ops("signal"), 0);

    h.etcd.restart().await;
    h.delete("a").await;
    h.put("d", &sleeper("d")).await;
    h.wait_status("d", "the new pod running", Duration::from_secs(60), |s| {
        s.phase == PodPhase::Running
    })
    .await;
    eventually("the deleted pod gone", Duration::from_secs(30), || async {
        (h.containers("a").is_empty() && h.status("a").await.is_none()).then_some(())
    })
    .await;
    for id in ["b", "c"] {
        assert!(h.running_id(id, "app").is_some(), "{id} still runs");
    }
    assert!(
        unlabelled.state().1 && other_node.state().1,
        "foreign containers untouched"
    );
    h.stop_controller().await;
}
