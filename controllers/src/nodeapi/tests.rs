//! The node API's unit tests: certificate identities, watch slots, the client against fake voters.

use super::*;
use crate::pki::{identity_of_certificate, CertRole, ClusterCa};
use axum::routing::get;

fn der(pem: &str) -> Vec<u8> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    p.contents
}

#[test]
fn a_certificate_names_its_node_by_its_use() {
    let ca = ClusterCa::generate().unwrap();
    let sans = ["127.0.0.1".to_string()];
    let node_of = |der: &[u8]| match identity_of_certificate(der) {
        Some(CertIdentity::Node(n)) => Some(n),
        _ => None,
    };
    let certs = ca.issue_node("db", &sans).unwrap();
    assert_eq!(node_of(&der(&certs.server.cert)).as_deref(), Some("db"));
    assert_eq!(node_of(&der(&certs.peer.cert)).as_deref(), Some("db"));
    assert_eq!(node_of(&der(&certs.client.cert)).as_deref(), Some("db"));
    // A node whose name ends in -client is named by its server certificate, never by another node's
    // client one.
    let other = ca.issue_node("db-client", &sans).unwrap();
    assert_eq!(
        node_of(&der(&other.server.cert)).as_deref(),
        Some("db-client")
    );
    assert_eq!(
        node_of(&der(&other.client.cert)).as_deref(),
        Some("db-client")
    );
    // A client certificate whose name is not `<node>-client`, and garbage, name no node.
    let odd = ca.issue(CertRole::Client, "admin", &sans).unwrap();
    assert_eq!(identity_of_certificate(&der(&odd.cert)), None);
    // A node joined as `admin:x` (the join refuses such names) would still not be an admin.
    let posing = ca
        .issue_node("admin:x", &sans)
        .map(|c| identity_of_certificate(&der(&c.client.cert)));
    assert!(
        !matches!(posing, Ok(Some(CertIdentity::Admin(_)))),
        "{posing:?}"
    );
    assert_eq!(identity_of_certificate(b"not a certificate"), None);
    // An admin's.
    let admin = ca
        .issue_admin("ops", std::time::Duration::from_secs(3600))
        .unwrap();
    assert_eq!(
        identity_of_certificate(&der(&admin.cert)),
        Some(CertIdentity::Admin("ops".into()))
    );
}

/// Serves `router` on a free loopback port; its URL.
async fn serve(router: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
    url
}

#[tokio::test]
async fn a_node_client_passes_over_agents_without_a_node_api_and_hears_a_revocation() {
    use hostlet_runtime::nodeapi::{NodeApiClient, NODE_API_HEADER, REVOKED_HEADER};
    let marked = [(NODE_API_HEADER, "v1")];
    // An agent that serves no node API (a record can name a member that is gone): 404, unmarked.
    let no_api = serve(Router::new()).await;
    let voter = serve(Router::new().route(
        hostlet_api::routes::NODE_KV_GET.path,
        get(move || async move {
            (
                marked,
                Json(serde_json::json!({"key": "/k", "value": "v", "modRevision": 3})),
            )
        }),
    ))
    .await;
    let client = NodeApiClient::new(reqwest::Client::new(), vec![no_api.clone(), voter]);
    assert_eq!(client.get("/k").await.unwrap(), Some(b"v".to_vec()));
    // A marked 404 is an absent key, not a voter to pass over.
    let absent = serve(Router::new().route(
        hostlet_api::routes::NODE_KV_GET.path,
        get(move || async move { (StatusCode::NOT_FOUND, marked, "/k does not exist") }),
    ))
    .await;
    let client = NodeApiClient::new(reqwest::Client::new(), vec![absent]);
    assert_eq!(client.get("/k").await.unwrap(), None);
    // Nobody answers: an error, and the unreachable count moves.
    let client = NodeApiClient::new(reqwest::Client::new(), vec![no_api]);
    let unreachable = client.watch_unreachable();
    assert!(client.get("/k").await.is_err());
    assert!(unreachable.has_changed().unwrap());
    // A refusal that says the certificate is revoked is final and is told.
    let revoked = serve(Router::new().route(
        hostlet_api::routes::NODE_KV_GET.path,
        get(|| async {
            (
                StatusCode::FORBIDDEN,
                [(REVOKED_HEADER, "1")],
                "certificate ab is revoked",
            )
        }),
    ))
    .await;
    let client = NodeApiClient::new(reqwest::Client::new(), vec![revoked]);
    let refusal = client.get("/k").await.unwrap_err().to_string();
    assert!(refusal.contains("403"), "{refusal}");
    assert_eq!(
        client.revoked().borrow().as_deref(),
        Some("certificate ab is revoked")
    );
}

#[test]
fn a_node_holds_a_bounded_number_of_watches_and_gets_each_back() {
    let slots = WatchSlots::default();
    let mut held: Vec<WatchSlot> = (0..MAX_WATCHES_PER_NODE)
        .map(|_| slots.take("w1").unwrap())
        .collect();
    assert!(slots.take("w1").is_none());
    // Another node's are its own.
    let other = slots.take("w2");
    assert!(other.is_some());
    // A watch that ends gives its slot back, one for one.
    held.pop();
    held.push(slots.take("w1").unwrap());
    assert!(slots.take("w1").is_none());
    drop(held);
    assert!(!slots.0.lock().unwrap().contains_key("w1"));
    drop(other);
    assert!(!slots.0.lock().unwrap().contains_key("w2"));
}

#[test]
fn a_node_uses_only_its_own_agent() {
    assert!(may_use_agent(&Identity::Node("w1".into()), "w1").is_ok());
    assert_eq!(
        may_use_agent(&Identity::Node("w1".into()), "w2").unwrap_err(),
        "node w1 may use only its own agent's API (this is node w2's)"
    );
    assert!(may_use_agent(&Identity::Voter("v1".into()), "w2").is_ok());
    assert!(may_use_agent(&Identity::Admin("ops".into()), "w2").is_ok());
}
