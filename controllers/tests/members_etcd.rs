//! Member removal against real etcd members on loopback ports: `hostlet node delete` deletes the node record,
//! the leader's agent removes that node's member.

mod learners_support;

use std::time::Duration;

use hostlet_api::KeyLayout;
use hostlet_controllers::learners::LearnerConfig;
use hostlet_runtime::testkit::{TestCluster, TestEtcd};
use learners_support::{events, eventually, leader_of, node_record, put_node, Agent};

/// Three voters, each with its agent and its node record (`node-0`…`node-2`).
async fn three_nodes() -> (TestCluster, Vec<Agent>) {
    let cluster = TestCluster::start(3).await;
    let etcd = cluster.connect().await;
    let mut agents = Vec::new();
    for (i, m) in cluster.members.iter().enumerate() {
        let node = format!("node-{i}");
        put_node(
            &etcd,
            &node_record(&node, m.name(), &m.peer_url(), &m.endpoint()),
        )
        .await;
        agents.push(
            Agent::start(
                &node,
                cluster.endpoints(),
                &m.endpoint(),
                LearnerConfig::default(),
            )
            .await,
        );
    }
    for a in &agents {
        a.wait_nodes_cached(&["node-0", "node-1", "node-2"]).await;
    }
    (cluster, agents)
}

async fn member_names(etcd: &hostlet_runtime::Etcd) -> Vec<String> {
    etcd.member_list()
        .await
        .map(|ms| ms.iter().map(|m| m.name().to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_followers_node_record_removes_its_member() {
    let (cluster, agents) = three_nodes().await;
    let etcd = cluster.connect().await;
    let leader = leader_of(&etcd, &cluster.endpoints()).await.unwrap();
    let members = etcd.member_list().await.unwrap();
    let follower = cluster
        .members
        .iter()
        .position(|m| {
            members
                .iter()
                .any(|x| x.name() == m.name() && x.id() != leader)
        })
        .unwrap();
    let gone = cluster.members[follower].name().to_string();
    etcd.delete(KeyLayout::default().node(&format!("node-{follower}")))
        .await
        .unwrap();
    eventually("member removed", Duration::from_secs(15), || async {
        let names = member_names(&etcd).await;
        names.len() == 2 && !names.contains(&gone)
    })
    .await;
    eventually("removal event", Duration::from_secs(10), || async {
        events(&etcd, "MemberRemoved").await.len() == 1
    })
    .await;
    let removed_by = &events(&etcd, "MemberRemoved").await[0].node;
    let by = agents.iter().find(|a| &a.node == removed_by).unwrap();
    assert_eq!(
        by.metric("hostlet_member_removals_total{result=\"success\"}"),
        Some(1.0)
    );
    assert!(
        events(&etcd, "LeadershipMoved").await.is_empty(),
        "a follower needs no handover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_leaders_node_record_moves_leadership_first_then_removes_it() {
    let (cluster, agents) = three_nodes().await;
    let etcd = cluster.connect().await;
    let leader = leader_of(&etcd, &cluster.endpoints()).await.unwrap();
    let members = etcd.member_list().await.unwrap();
    let leader_name = members
        .iter()
        .find(|m| m.id() == leader)
        .unwrap()
        .name()
        .to_string();
    let i = cluster
        .members
        .iter()
        .position(|m| m.name() == leader_name)
        .unwrap();
    etcd.delete(KeyLayout::default().node(&format!("node-{i}")))
        .await
        .unwrap();
    eventually(
        "the leader's member removed",
        Duration::from_secs(20),
        || async {
            let names = member_names(&etcd).await;
            names.len() == 2 && !names.contains(&leader_name)
        },
    )
    .await;
    eventually("events", Duration::from_secs(10), || async {
        !events(&etcd, "MemberRemoved").await.is_empty()
    })
    .await;
    let moved = events(&etcd, "LeadershipMoved").await;
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(
        moved[0].node,
        format!("node-{i}"),
        "the old leader handed over"
    );
    let removed = events(&etcd, "MemberRemoved").await;
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_ne!(
        removed[0].node,
        format!("node-{i}"),
        "the new leader removed it"
    );
    assert!(moved[0].timestamp <= removed[0].timestamp);
    let alive: Vec<String> = cluster
        .endpoints()
        .into_iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, e)| e)
        .collect();
    let new_leader = leader_of(&etcd, &alive).await.unwrap();
    assert_ne!(new_leader, leader);
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_voter_is_never_removed() {
    let only = TestEtcd::start().await;
    let etcd = only.connect().await;
    put_node(
        &etcd,
        &node_record("node-0", only.name(), &only.peer_url(), &only.endpoint()),
    )
    .await;
    let agent = Agent::start(
        "node-0",
        only.endpoints(),
        &only.endpoint(),
        LearnerConfig::default(),
    )
    .await;
    agent.wait_nodes_cached(&["node-0"]).await;
    etcd.delete(KeyLayout::default().node("node-0"))
        .await
        .unwrap();
    eventually("refusal event", Duration::from_secs(10), || async {
        events(&etcd, "MemberNotRemoved").await.len() == 1
    })
    .await;
    assert_eq!(
        agent.metric("hostlet_member_removals_total{result=\"refused\"}"),
        Some(1.0)
    );
    assert_eq!(member_names(&etcd).await, vec![only.name().to_string()]);
    assert!(events(&etcd, "MemberRemoved").await.is_empty());
}
