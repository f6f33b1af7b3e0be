//! The server side of the join protocol (see [`super::join`]): `/cacerts`, `/db/info`, `/db/join`, served
//! on the agent's `--listen` API. Whom a token admits and what a worker token's join may claim are
//! decided in `crate::pki`, with the rest of the cluster's trust; these routes answer with it.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use hostlet_api::routes;
use hostlet_runtime::Etcd;

use super::join::{DbInfo, HandedCa, JoinRequest, JoinResponse};
use crate::pki::{
    check_request, node_token, spend_worker_token, verify_join_token, worker_join_verdict,
    CertIdentity, ClusterCa, ClusterToken, JoinCaller, JoinRefusal, PeerNode, TlsError, WorkerJoin,
};
use crate::routes::serve;

fn unauthorized() -> Response {
    refused_401("missing or wrong cluster token")
}

fn refused_401(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        format!("{why}\n"),
    )
        .into_response()
}

/// What the join endpoints need.
#[derive(Clone)]
pub struct JoinService {
    inner: Arc<JoinServiceInner>,
}

struct JoinServiceInner {
    token: ClusterToken,
    /// `None` under `--etcd-insecure`.
    ca: Option<ClusterCa>,
    etcd: Etcd,
    keys: hostlet_api::KeyLayout,
    /// How long a worker's certificates last.
    cert_lifetime: std::time::Duration,
}

impl JoinService {
    pub fn new(
        token: ClusterToken,
        ca: Option<ClusterCa>,
        etcd: Etcd,
        keys: hostlet_api::KeyLayout,
        cert_lifetime: std::time::Duration,
    ) -> Self {
        JoinService {
            inner: Arc::new(JoinServiceInner {
                token,
                ca,
                etcd,
                keys,
                cert_lifetime,
            }),
        }
    }

    pub fn token(&self) -> &ClusterToken {
        &self.inner.token
    }

    /// The server token, or a worker token that admits a join now; else the refusal to send (401 naming
    /// why; 503 when etcd does not answer: never a guess).
    async fn authenticate(&self, headers: &HeaderMap) -> Result<JoinCaller, Response> {
        let inner = &self.inner;
        verify_join_token(&inner.etcd, &inner.keys, &inner.token, headers)
            .await
            .map_err(|refusal| match refusal {
                JoinRefusal::WrongToken => unauthorized(),
                JoinRefusal::Refused(why) => refused_401(&why),
                JoinRefusal::Unavailable(e) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot read the token: {e}\n"),
                )
                    .into_response(),
            })
    }

    /// Counts one use of a worker token; refuses when another join took its last use meanwhile.
    async fn use_worker_token(
        &self,
        id: &str,
        record: hostlet_api::objects::JoinToken,
        mod_revision: i64,
    ) -> Result<(), Response> {
        let spent =
            spend_worker_token(&self.inner.etcd, &self.inner.keys, id, record, mod_revision).await;
        match spent {
            Ok(true) => Ok(()),
            Ok(false) => Err(refused_401(&format!(
                "token {id} changed while this join was admitted: try again"
            ))),
            Err(e) => Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot count the token's use: {e}\n"),
            )
                .into_response()),
        }
    }

    /// `/cacerts`, `/db/info`, `/db/join`.
    pub fn router(&self) -> Router {
        let r = serve(Router::new(), &routes::CACERTS, cacerts);
        let r = serve(r, &routes::DB_INFO, db_info);
        serve(r, &routes::DB_JOIN, db_join).with_state(self.clone())
    }
}

async fn cacerts(State(svc): State<JoinService>) -> Response {
    match &svc.inner.ca {
        Some(ca) => (
            [(header::CONTENT_TYPE, "application/x-pem-file")],
            ca.cert.clone(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "this cluster runs without TLS\n").into_response(),
    }
}

/// `GET /db/info?node=<name>`: the node name asks whether the leader wants that node as a member.
#[derive(Debug, serde::Deserialize)]
struct InfoQuery {
    node: Option<String>,
}

async fn db_info(
    State(svc): State<JoinService>,
    Query(q): Query<InfoQuery>,
    headers: HeaderMap,
) -> Response {
    let caller = match svc.authenticate(&headers).await {
        Ok(c) => c,
        Err(refusal) => return refusal,
    };
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot {what}: {e}\n"),
        )
            .into_response()
    };
    let members = match svc.inner.etcd.member_list().await {
        Ok(m) => m,
        Err(e) => return unavailable("list etcd members", &e),
    };
    // The voter target and the member request decide whether a joiner becomes a member or a worker;
    // an unreadable answer is an error, never a guess.
    let keys = &svc.inner.keys;
    let voters_target = match svc.inner.etcd.get(&keys.cluster_policy()).await {
        Ok(Some(kv)) => match hostlet_api::objects::ClusterPolicy::parse(kv.value()) {
            Ok(p) => p.voters_target(),
            Err(e) => return unavailable(&format!("read {}", keys.cluster_policy()), &e),
        },
        Ok(None) => hostlet_api::objects::DEFAULT_VOTERS,
        Err(e) => return unavailable(&format!("read {}", keys.cluster_policy()), &e),
    };
    let member_requested = match q.node.as_deref().filter(|n| !n.is_empty()) {
        Some(node) => match svc.inner.etcd.get(&keys.member_request(node)).await {
            Ok(v) => v.is_some(),
            Err(e) => return unavailable("read the member request", &e),
        },
        None => false,
    };
    if let JoinCaller::Worker {
        id, used_up: true, ..
    } = &caller
    {
        if !member_requested {
            return refused_401(&format!("token {id} is used up"));
        }
    }
    Json(DbInfo {
        members: members.iter().map(hostlet_runtime::Member::from).collect(),
        tls: svc.inner.ca.is_some(),
        voters_target: Some(voters_target),
        member_requested,
        worker_only: caller != JoinCaller::Server,
    })
    .into_response()
}

async fn db_join(
    State(svc): State<JoinService>,
    peer: Option<axum::Extension<PeerNode>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // Authenticate before even parsing the body.
    let caller = match svc.authenticate(&headers).await {
        Ok(c) => c,
        Err(refusal) => return refusal,
    };
    let Some(ca) = svc.inner.ca.clone() else {
        return (StatusCode::NOT_FOUND, "this cluster runs without TLS\n").into_response();
    };
    let req: JoinRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let bad = |m: &str| (StatusCode::BAD_REQUEST, format!("{m}\n")).into_response();
    // A node name is what its certificates name: never an admin's (`admin:`), never a path.
    if req.node.is_empty()
        || req.node.len() > 253
        || req
            .node
            .chars()
            .any(|c| c == ':' || c == '/' || c.is_whitespace() || c.is_control())
    {
        return bad("node: 1 to 253 characters, without ':', '/', spaces or control characters");
    }
    if req.sans.is_empty() || req.sans.len() > 32 || req.sans.iter().any(|s| s.len() > 253) {
        return bad("sans: 1 to 32 names of at most 253 characters");
    }
    // Checked before a worker token's join is spent on it.
    if req.csr.is_empty() {
        return bad("csr: missing: the joiner runs an earlier hostlet version, which expects a private key back; upgrade it to this version, then join");
    }
    if req.csr.len() > 16 * 1024 || check_request(&req.csr).is_err() {
        return bad("csr: a PEM certificate request signed by the joiner's own key (a joiner of this hostlet version sends one)");
    }
    let keys = &svc.inner.keys;
    let (certificates, record_exists) = match tokio::try_join!(
        svc.inner.etcd.get(keys.node_certificates(&req.node)),
        svc.inner.etcd.get(keys.node(&req.node)),
    ) {
        Ok((c, n)) => (
            c.and_then(|kv| {
                serde_json::from_slice::<hostlet_api::objects::NodeCertificates>(kv.value()).ok()
            })
            .unwrap_or_default(),
            n.is_some(),
        ),
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the node's records: {e}\n"),
            )
                .into_response()
        }
    };
    // A name is bound at the first join: a later one claims it only with that node's own certificate (a
    // rejoin, a worker becoming a member), whatever its token.
    let proves = peer.as_ref().is_some_and(|p| {
        matches!(&p.0 .0, Some(CertIdentity::Node(n)) if *n == req.node)
            && p.0
                 .1
                .as_ref()
                .is_some_and(|s| !certificates.revoked.contains(s))
    });
    if record_exists && !proves {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "node {:?} exists: a join that claims its name must present that node's certificate (join from its data dir), or delete the node first (hostlet node delete)\n",
                req.node
            ),
        )
            .into_response();
    }
    // A deleted worker's name comes back only through a worker token made since it was deleted.
    let revoked_at = certificates.revoked_at;
    if let Some(at) = revoked_at {
        let made_since = match &caller {
            JoinCaller::Worker { record, .. } => record.created.0 > at.0,
            JoinCaller::Server => false,
        };
        if !made_since {
            return (
                StatusCode::FORBIDDEN,
                format!(
                    "node {:?} was deleted at {} and its certificates revoked: it joins again only with a worker token made since (hostlet token create)\n",
                    req.node,
                    humantime::format_rfc3339_seconds(at.0)
                ),
            )
                .into_response();
        }
    }
    let from_server = caller == JoinCaller::Server;
    if let JoinCaller::Worker {
        id,
        record,
        mod_revision,
        used_up,
    } = caller
    {
        let forbidden = |m: String| (StatusCode::FORBIDDEN, format!("{m}\n")).into_response();
        let keys = &svc.inner.keys;
        let (record_exists, requested) = match tokio::try_join!(
            svc.inner.etcd.get(keys.node(&req.node)),
            svc.inner.etcd.get(keys.member_request(&req.node)),
        ) {
            Ok((n, r)) => (n.is_some(), r.is_some()),
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot read the node's record: {e}\n"),
                )
                    .into_response()
            }
        };
        match worker_join_verdict(req.member, requested, record_exists, used_up) {
            WorkerJoin::NotAMember => {
                return forbidden(format!(
                    "token {id} is a worker token: it cannot make an etcd member (voter or learner); join as a worker, or with the server token"
                ))
            }
            WorkerJoin::UsedUp => return refused_401(&format!("token {id} is used up")),
            WorkerJoin::NameTaken => {
                return forbidden(format!(
                    "node {:?} exists: a worker token cannot claim an existing node's name (delete the node first, or pick another name)",
                    req.node
                ))
            }
            WorkerJoin::Admit => {}
        }
        if !used_up {
            if let Err(refusal) = svc.use_worker_token(&id, record, mod_revision).await {
                return refusal;
            }
        }
        tracing::info!(node = %req.node, token = %id, "a worker token admitted a join");
    }
    tracing::info!(
        node = %req.node,
        sans = ?req.sans,
        member = req.member,
        "issuing certificates to a joining node"
    );
    // A member gets the server token (it admits joiners itself; a worker token's join becomes a member
    // only while the leader asks for it); a worker never keeps it: it gets a token of its own instead.
    let node_token = if req.member {
        Some(svc.inner.token.to_string())
    } else if from_server {
        match node_token(
            &svc.inner.etcd,
            &svc.inner.keys,
            &req.node,
            svc.inner.token.ca_fingerprint.clone(),
        )
        .await
        {
            Ok(t) => Some(t.to_string()),
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot store the worker's own token: {e}\n"),
                )
                    .into_response()
            }
        }
    } else {
        None
    };
    let node = req.node.clone();
    let member = req.member;
    let lifetime = svc.inner.cert_lifetime;
    let issued = tokio::task::spawn_blocking(move || {
        // A member's certificates open etcd; a worker's never do.
        let (certs, node_ca) = if req.member {
            (
                ca.issue_node_for(&req.node, &req.sans, &req.csr, Some(lifetime))?,
                None,
            )
        } else {
            (
                ca.issue_worker_for(&req.node, &req.sans, &req.csr, lifetime)?,
                Some(ca.node_ca()?.cert),
            )
        };
        // Only a member admits joiners: a worker never holds the key that signs certificates.
        let ca = HandedCa {
            cert: ca.cert,
            key: req.member.then_some(ca.key),
        };
        Ok::<_, TlsError>(JoinResponse {
            ca,
            certs,
            node_ca,
            token: node_token,
        })
    })
    .await;
    match issued {
        Ok(Ok(answer)) => {
            // Recorded before they are handed out: a certificate nobody recorded could not be revoked.
            let serials = answer.certs.serials();
            let recorded =
                crate::pki::update_certificates(&svc.inner.etcd, &svc.inner.keys, &node, |r| {
                    if member {
                        r.issue(serials.clone())
                    } else {
                        r.issue_to_worker(serials.clone())
                    }
                })
                .await;
            match recorded {
                Ok(_) => Json(answer).into_response(),
                Err(e) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot record the certificates issued: {e}\n"),
                )
                    .into_response(),
            }
        }
        Ok(Err(e)) => bad(&crate::error_chain(&e)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
