//! The etcd wrapper against real etcd processes.

use std::time::Duration;

use hostlet_runtime::testkit::{free_port, TestCluster, TestEtcd};
use hostlet_runtime::{Etcd, EtcdConfig, EtcdError};

#[tokio::test]
async fn basic_operations_round_trip() {
    let etcd = TestEtcd::start().await;
    let c = etcd.connect().await;
    let rev = c.put("/t/a", "1").await.unwrap();
    assert!(rev > 0);
    c.put("/t/b", "2").await.unwrap();
    c.put("/u/c", "3").await.unwrap();
    assert_eq!(c.get("/t/a").await.unwrap().unwrap().value(), b"1");
    assert!(c.get("/t/none").await.unwrap().is_none());
    let (kvs, at) = c.get_prefix("/t/").await.unwrap();
    assert_eq!(kvs.len(), 2);
    assert!(at >= rev);
    assert_eq!(c.delete("/t/a").await.unwrap(), 1);
    assert_eq!(c.delete_prefix("/t/").await.unwrap(), 1);
    let lease = c.lease_grant(Duration::from_secs(30)).await.unwrap();
    c.put_with_lease("/t/leased", "x", lease).await.unwrap();
    c.lease_keep_alive_once(lease).await.unwrap();
    c.lease_revoke(lease).await.unwrap();
    assert!(c.get("/t/leased").await.unwrap().is_none());
    let expired = c.lease_keep_alive_once(lease).await;
    assert!(
        matches!(expired, Err(EtcdError::LeaseExpired(_))),
        "{expired:?}"
    );
    let members = c.member_list().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].name(), etcd.name());
}

#[tokio::test]
async fn get_prefix_pages_through_more_keys_than_one_page() {
    let etcd = TestEtcd::start().await;
    let c = etcd.connect().await;
    let mut raw = c.client();
    for chunk in 0..20 {
        let ops: Vec<etcd_client::TxnOp> = (0..125)
            .map(|i| etcd_client::TxnOp::put(format!("/p/{chunk:02}-{i:04}"), "v", None))
            .collect();
        raw.txn(etcd_client::Txn::new().and_then(ops))
            .await
            .unwrap();
    }
    let (kvs, _) = c.get_prefix("/p/").await.unwrap();
    assert_eq!(kvs.len(), 2500);
    let mut keys: Vec<&[u8]> = kvs.iter().map(|k| k.key()).collect();
    keys.dedup();
    assert_eq!(keys.len(), 2500);
}

#[tokio::test]
async fn a_request_is_retried_on_the_next_endpoint_when_one_is_dead() {
    let mut cluster = TestCluster::start(3).await;
    // The dead member comes first, so the first attempt of every fresh client fails.
    let dead = cluster.members[0].endpoint();
    cluster.members[0].kill();
    let c = cluster.connect().await;
    assert_eq!(c.current_endpoint(), dead);
    let unreachable = c.watch_unreachable();
    c.put("/k", "v").await.unwrap();
    assert_ne!(c.current_endpoint(), dead);
    assert_eq!(c.get("/k").await.unwrap().unwrap().value(), b"v");
    // Served by another endpoint: not counted as unreachable.
    assert!(!unreachable.has_changed().unwrap());
}

#[tokio::test]
async fn the_client_recovers_after_its_only_endpoint_restarts() {
    let mut etcd = TestEtcd::start().await;
    let c = etcd.connect().await;
    c.put("/k", "1").await.unwrap();
    let mut unreachable = c.watch_unreachable();
    etcd.kill();
    assert!(c.get("/k").await.unwrap_err().is_unavailable());
    // Those keeping the endpoint list fresh hear of it.
    assert!(unreachable.has_changed().unwrap());
    assert_eq!(*unreachable.borrow_and_update(), 1);
    etcd.restart().await;
    assert_eq!(c.get("/k").await.unwrap().unwrap().value(), b"1");
}

#[tokio::test]
async fn learners_stay_out_of_the_endpoint_list() {
    let etcd = TestEtcd::start().await;
    let (learner, id) = etcd.join(true).await;
    let c = Etcd::connect(EtcdConfig::new([learner.endpoint(), etcd.endpoint()]))
        .await
        .unwrap();
    let voters = c.sync_endpoints().await.unwrap();
    assert_eq!(voters, vec![etcd.endpoint()]);
    assert_eq!(c.endpoints(), vec![etcd.endpoint()]);
    // The learner still answers status on its own endpoint.
    let s = c.status_of(&learner.endpoint()).await.unwrap();
    assert!(s.is_learner());
    c.member_remove(id).await.unwrap();
}

#[tokio::test]
async fn member_add_as_learner_then_promote() {
    let etcd = TestEtcd::start().await;
    let c = etcd.connect().await;
    let m = c
        .member_add_as_learner(&["http://127.0.0.1:1".to_string()])
        .await
        .unwrap();
    assert!(m.is_learner());
    // Never started, so never in sync: etcd refuses the promotion with its own message.
    let err = c.member_promote(m.id()).await.unwrap_err();
    assert!(err.server_message().is_some(), "{err}");
    c.member_remove(m.id()).await.unwrap();
    assert_eq!(c.member_list().await.unwrap().len(), 1);
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let etcd = TestEtcd::start_tls().await;
    assert!(etcd.endpoint().starts_with("https://"));
    let c = etcd.connect().await;
    c.put("/secure", "yes").await.unwrap();
    assert_eq!(c.get("/secure").await.unwrap().unwrap().value(), b"yes");
    // Without a client certificate the server refuses.
    let tls = etcd.tls().unwrap();
    let mut cfg = etcd.config();
    cfg.tls = Some(hostlet_runtime::TlsFiles {
        ca: tls.ca.clone(),
        cert: tls.server_cert.clone(),
        key: tls.server_key.clone(),
    });
    cfg.request_timeout = Duration::from_secs(2);
    let wrong = Etcd::connect(cfg).await.unwrap();
    assert!(wrong.get("/secure").await.is_err());
}

#[tokio::test]
async fn move_leader_hands_leadership_over() {
    let cluster = TestCluster::start(3).await;
    let c = cluster.connect().await;
    let leader = c.status_all().await[0].1.as_ref().unwrap().leader();
    let members = c.member_list().await.unwrap();
    let target = members.iter().find(|m| m.id() != leader).unwrap().id();
    c.move_leader(target).await.unwrap();
    let now = c.status_all().await[0].1.as_ref().unwrap().leader();
    assert_eq!(now, target);
}

/// A refused connection is told apart from silence: the first is the host's own answer that nothing listens,
/// the second proves nothing (a reset judges members by exactly this difference).
#[tokio::test]
async fn a_refused_connection_is_not_silence() {
    let refused = format!("http://127.0.0.1:{}", free_port());
    // Accepts the connection and never speaks: what a paused or cut-off member looks like.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("http://{}", listener.local_addr().unwrap());
    let mut cfg = EtcdConfig::new([refused.clone(), silent.clone()]);
    cfg.connect_timeout = Duration::from_millis(500);
    cfg.request_timeout = Duration::from_millis(500);
    let etcd = Etcd::connect(cfg).await.unwrap();
    let e = etcd.status_of(&refused).await.unwrap_err();
    assert!(e.is_connection_refused(), "{e:?}");
    let e = etcd.status_of(&silent).await.unwrap_err();
    assert!(!e.is_connection_refused(), "{e:?}");
    // A member that answers is neither.
    let live = TestEtcd::start().await;
    let mut cfg = EtcdConfig::new([live.endpoint()]);
    cfg.request_timeout = Duration::from_secs(5);
    let etcd = Etcd::connect(cfg).await.unwrap();
    assert!(etcd.status_of(&live.endpoint()).await.is_ok());
    drop(listener);
}
