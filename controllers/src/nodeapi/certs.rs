//! `POST /node/v1/certificates`: a worker's certificates, issued again for a new key of its own.
//!
//! The caller proves who it is with its current client certificate (the API's gate has already refused
//! a revoked one). The body is `{"csr": PEM, "sans": [names]}`, as a join sends; the answer is
//! `{"certs": {"server", "peer", "client"}, "nodeCa": PEM}`. Every certificate the node held before is
//! superseded: etcd refuses it from then on. That is how a worker joined by an earlier version, whose
//! certificates came from the cluster CA and opened etcd, moves to certificates that do not, and how a
//! worker renews its certificates before they expire.
//!
//! Voters and admins are refused: a voter's certificates open etcd and it issues its own.
//!
//! The CA, the certificate records and the worker's side of the renewal are `crate::pki`'s; this is the
//! route that serves them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use hostlet_api::authz::Identity;
use hostlet_api::{routes, KeyLayout};
use hostlet_runtime::Etcd;

use super::NodeRoles;
use crate::pki::{
    check_request, node_token, serial_if_issued_to, update_certificates, ClusterCa, PeerNode,
    RenewRequest, RenewResponse, TlsError,
};

struct Renewals {
    etcd: Etcd,
    keys: KeyLayout,
    roles: NodeRoles,
    ca: ClusterCa,
    lifetime: Duration,
}

/// The route, for a voter holding the cluster CA `ca`; `lifetime` is `--cert-lifetime`.
pub fn router(
    etcd: Etcd,
    keys: KeyLayout,
    roles: NodeRoles,
    ca: ClusterCa,
    lifetime: Duration,
) -> Router {
    let r = crate::routes::serve(Router::new(), &routes::NODE_CERTIFICATES, renew);
    crate::routes::serve(r, &routes::NODE_TOKEN, own_token).with_state(Arc::new(Renewals {
        etcd,
        keys,
        roles,
        ca,
        lifetime,
    }))
}

/// Whether `identity` may have worker certificates issued for itself: a worker only.
pub fn may_renew(identity: &Identity) -> Result<&str, String> {
    match identity {
        Identity::Node(n) => Ok(n),
        Identity::Voter(n) => Err(format!(
            "node {n} is a voter: its certificates come from its own cluster CA, not from a renewal"
        )),
        Identity::Admin(a) => Err(format!(
            "admin {a} has no node certificates to renew (hostlet cert admin issues admin certificates)"
        )),
    }
}

/// `POST /node/v1/token`: a worker token of the caller's own, its one use spent, for a worker that
/// still keeps the server token from an earlier version's join (`{"token"}`).
async fn own_token(State(r): State<Arc<Renewals>>, peer: Option<Extension<PeerNode>>) -> Response {
    let Some(PeerNode(Some(who), _)) = peer.map(|Extension(p)| p) else {
        return super::no_certificate();
    };
    let node = match may_renew(&r.roles.identity(&who)) {
        Ok(n) => n.to_string(),
        Err(why) => return (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
    };
    let fingerprint = r.ca.fingerprint().ok();
    match node_token(&r.etcd, &r.keys, &node, fingerprint).await {
        Ok(t) => Json(serde_json::json!({ "token": t.to_string() })).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot store the token: {e}\n"),
        )
            .into_response(),
    }
}

async fn renew(
    State(r): State<Arc<Renewals>>,
    peer: Option<Extension<PeerNode>>,
    body: axum::body::Bytes,
) -> Response {
    let Some(PeerNode(Some(who), serial)) = peer.map(|Extension(p)| p) else {
        return super::no_certificate();
    };
    let identity = r.roles.identity(&who);
    let node = match may_renew(&identity) {
        Ok(n) => n.to_string(),
        Err(why) => return (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
    };
    let req: RenewRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("body: {e}\n")).into_response(),
    };
    if req.sans.is_empty() || req.sans.len() > 32 || req.sans.iter().any(|s| s.len() > 253) {
        return (
            StatusCode::BAD_REQUEST,
            "sans: 1 to 32 names of at most 253 characters\n",
        )
            .into_response();
    }
    if req.csr.len() > 16 * 1024 || check_request(&req.csr).is_err() {
        return (
            StatusCode::BAD_REQUEST,
            "csr: a PEM certificate request signed by the node's new key\n",
        )
            .into_response();
    }
    if req.retire.len() > 8 || req.retire.iter().any(|p| p.len() > 16 * 1024) {
        return (
            StatusCode::BAD_REQUEST,
            "retire: at most 8 PEM certificates of at most 16 KiB\n",
        )
            .into_response();
    }
    // The certificate it called with, and those it hands in that the cluster CA issued to it.
    let mut retired: Vec<String> = req
        .retire
        .iter()
        .filter_map(|p| serial_if_issued_to(p.as_bytes(), r.ca.cert.as_bytes(), &node))
        .collect();
    retired.extend(serial.clone());
    let ca = r.ca.clone();
    let lifetime = r.lifetime;
    let for_node = node.clone();
    let issued = tokio::task::spawn_blocking(move || {
        let certs = ca.issue_worker_for(&for_node, &req.sans, &req.csr, lifetime)?;
        Ok::<_, TlsError>(RenewResponse {
            certs,
            node_ca: ca.node_ca()?.cert,
        })
    })
    .await;
    let answer = match issued {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("{}\n", crate::error_chain(&e)),
            )
                .into_response()
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    // Recorded before they are handed out: a certificate nobody recorded could not be revoked, and the
    // old ones are superseded only once the new ones are known.
    let serials = answer.certs.serials();
    // A deletion that lands while this runs wins: the revoked certificate gets nothing.
    let deleted = std::sync::atomic::AtomicBool::new(false);
    let recorded = update_certificates(&r.etcd, &r.keys, &node, |rec| {
        let revoked = serial.as_ref().is_some_and(|s| rec.revoked.contains(s));
        deleted.store(revoked, std::sync::atomic::Ordering::Relaxed);
        if !revoked {
            rec.issued.extend(retired.iter().cloned());
            rec.issue_to_worker(serials.clone())
        }
    })
    .await;
    match recorded {
        Ok(_) if deleted.load(std::sync::atomic::Ordering::Relaxed) => (
            StatusCode::FORBIDDEN,
            format!("node {node} was deleted: it joins again with a new worker token\n"),
        )
            .into_response(),
        Ok(_) => {
            tracing::info!(node = %node, "issued a worker's certificates again");
            Json(answer).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot record the certificates issued: {e}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_worker_has_its_certificates_issued_again() {
        assert_eq!(may_renew(&Identity::Node("w1".into())), Ok("w1"));
        let voter = may_renew(&Identity::Voter("v1".into())).unwrap_err();
        assert!(voter.contains("v1 is a voter"), "{voter}");
        let admin = may_renew(&Identity::Admin("ops".into())).unwrap_err();
        assert!(admin.contains("admin ops"), "{admin}");
    }
}
