//! The server side of the join protocol (see [`super::join`]): `/cacerts`, `/db/info`, `/db/join`, served
//! on the agent's `--listen` API.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use hostlet_api::routes;
use hostlet_runtime::Etcd;

use super::join::{DbInfo, HandedCa, JoinRequest, JoinResponse};
use super::tls::ClusterCa;
use super::token::ClusterToken;
use crate::routes::serve;

/// Whether `headers` carry `Authorization: Bearer <token>` for `token`. No token configured: nobody is.
pub fn authorized(headers: &HeaderMap, token: Option<&ClusterToken>) -> bool {
    let Some(token) = token else {
        return false;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|presented| token.accepts(presented.trim()))
        .unwrap_or(false)
}

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

/// Who a join request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// The server token: a voter's join.
    Server,
    /// A worker token, with its record's revision (a use is counted against it).
    Worker {
        id: String,
        record: hostlet_api::objects::JoinToken,
        mod_revision: i64,
        /// Admits only the member the leader asked its node to become.
        used_up: bool,
    },
}

/// The id and secret of a worker token's secret part, `wt.<id>.<secret>`.
pub fn worker_token_parts(secret: &str) -> Option<(&str, &str)> {
    let (id, secret) = secret.strip_prefix(WORKER_TOKEN_PREFIX)?.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 6) && hex(secret, 32)).then_some((id, secret))
}

/// What a join with a worker token gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerJoin {
    Admit,
    /// It asks to start an etcd member the leader did not ask this node for.
    NotAMember,
    /// Its joins are spent, and this is not the member the leader asked its node to become.
    UsedUp,
    /// It claims the name of a node that exists (and was not asked to become a member).
    NameTaken,
}

/// The rules of a worker token's join: a worker only, unless the leader's member request for the node
/// exists; a spent token only for that member; never an existing node's name but the one asked for.
fn worker_join_verdict(member: bool, requested: bool, exists: bool, used_up: bool) -> WorkerJoin {
    if member && !requested {
        WorkerJoin::NotAMember
    } else if used_up && !(member && requested) {
        WorkerJoin::UsedUp
    } else if exists && !requested {
        WorkerJoin::NameTaken
    } else {
        WorkerJoin::Admit
    }
}

/// Where a worker token's secret part begins.
pub const WORKER_TOKEN_PREFIX: &str = "wt.";

/// Stores a new worker token (a fresh id; a clash, one in 16 million, is tried again) and returns its
/// secret part, `wt.<id>.<secret>`: what `hostlet token create` prints after the CA fingerprint.
pub async fn put_worker_token(
    etcd: &Etcd,
    keys: &hostlet_api::KeyLayout,
    description: &str,
    expires: Option<std::time::SystemTime>,
    uses: Option<u32>,
    used: u32,
) -> Result<String, hostlet_runtime::EtcdError> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    use hostlet_api::objects::{JoinToken, Timestamp};
    for _ in 0..5 {
        let mut b = [0u8; 3];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
        // The secret is made as the server token's is.
        let (id, secret) = (hex::encode(b), ClusterToken::generate(None).secret);
        let record = JoinToken {
            id: id.clone(),
            secret_sha256: sha256_hex(&secret),
            description: description.to_string(),
            created: Timestamp::now(),
            expires: expires.map(Timestamp),
            uses,
            used,
            revoked: false,
        };
        let key = keys.join_token(&id);
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(format!("{WORKER_TOKEN_PREFIX}{id}.{secret}"));
        }
    }
    Err(hostlet_runtime::EtcdError::unavailable(
        "worker tokens",
        etcd_client::Error::InvalidArgs("could not find a free token id".into()),
    ))
}

/// The token a worker that joined with the server token keeps instead: a worker token of its own, its
/// one use spent by that join. It still carries the node to the member the leader may ask it to become,
/// and never makes a voter otherwise; the server token stays on the voters.
pub async fn node_token(
    etcd: &Etcd,
    keys: &hostlet_api::KeyLayout,
    node: &str,
    fingerprint: Option<String>,
) -> Result<ClusterToken, hostlet_runtime::EtcdError> {
    let secret = put_worker_token(
        etcd,
        keys,
        &format!("node {node}: kept by it instead of the server token"),
        None,
        Some(1),
        1,
    )
    .await?;
    Ok(ClusterToken {
        ca_fingerprint: fingerprint,
        secret,
    })
}

/// How etcd keeps a worker token's secret (`/hostlet/tokens/<id>`): its SHA-256, lowercase hex.
pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
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
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, Response> {
        if authorized(headers, Some(&self.inner.token)) {
            return Ok(Caller::Server);
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|v| ClusterToken::parse(v.trim()).ok())
            .ok_or_else(unauthorized)?;
        if let (Some(mine), Some(theirs)) =
            (&self.inner.token.ca_fingerprint, &presented.ca_fingerprint)
        {
            if mine != theirs {
                return Err(unauthorized());
            }
        }
        let (id, secret) = worker_token_parts(&presented.secret).ok_or_else(unauthorized)?;
        let kv = match self.inner.etcd.get(self.inner.keys.join_token(id)).await {
            Ok(Some(kv)) => kv,
            Ok(None) => return Err(unauthorized()),
            Err(e) => {
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot read the token: {e}\n"),
                )
                    .into_response())
            }
        };
        let record: hostlet_api::objects::JoinToken = serde_json::from_slice(kv.value())
            .map_err(|_| refused_401(&format!("token {id} is not readable")))?;
        if !super::token::constant_time_eq(
            record.secret_sha256.as_bytes(),
            sha256_hex(secret).as_bytes(),
        ) {
            return Err(unauthorized());
        }
        // A used-up token still carries the node it admitted to the member the leader asks it to
        // become (the handlers check that request); an expired or revoked one carries nobody.
        let state = record.state(std::time::SystemTime::now());
        let used_up = state == hostlet_api::objects::JoinTokenState::UsedUp;
        if state != hostlet_api::objects::JoinTokenState::Valid && !used_up {
            return Err(refused_401(&format!("token {id} is {}", state.as_str())));
        }
        Ok(Caller::Worker {
            id: id.to_string(),
            record,
            mod_revision: kv.mod_revision(),
            used_up,
        })
    }

    /// Counts one use of a worker token; refuses when another join took its last use meanwhile.
    async fn use_worker_token(
        &self,
        id: &str,
        mut record: hostlet_api::objects::JoinToken,
        mod_revision: i64,
    ) -> Result<(), Response> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let key = self.inner.keys.join_token(id);
        record.used += 1;
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::put(key, value, None)]);
        match self.inner.etcd.txn(txn).await {
            Ok(r) if r.succeeded() => Ok(()),
            Ok(_) => Err(refused_401(&format!(
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
    if let Caller::Worker {
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
        worker_only: caller != Caller::Server,
    })
    .into_response()
}

async fn db_join(
    State(svc): State<JoinService>,
    peer: Option<axum::Extension<super::tls::PeerNode>>,
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
    if req.csr.len() > 16 * 1024 || super::tls::check_request(&req.csr).is_err() {
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
        matches!(&p.0 .0, Some(super::tls::CertIdentity::Node(n)) if *n == req.node)
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
            Caller::Worker { record, .. } => record.created.0 > at.0,
            Caller::Server => false,
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
    let from_server = caller == Caller::Server;
    if let Caller::Worker {
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
        Ok::<_, super::tls::TlsError>(JoinResponse {
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
            let recorded = crate::etcd_member::revocation::update(
                &svc.inner.etcd,
                &svc.inner.keys,
                &node,
                |r| {
                    if member {
                        r.issue(serials.clone())
                    } else {
                        r.issue_to_worker(serials.clone())
                    }
                },
            )
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
        Ok(Err(e)) => bad(&super::error_chain(&e)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_worker_token_joins_a_worker_or_the_member_the_leader_asked_for() {
        use WorkerJoin::*;
        // (member, requested, exists, used up) → verdict
        for (member, requested, exists, used_up, want) in [
            (false, false, false, false, Admit),
            (true, false, false, false, NotAMember),
            (true, true, true, false, Admit),
            (false, false, true, false, NameTaken),
            (false, true, true, false, Admit),
            (false, false, false, true, UsedUp),
            (true, false, false, true, NotAMember),
            (false, true, true, true, UsedUp),
            (true, true, true, true, Admit),
        ] {
            assert_eq!(
                worker_join_verdict(member, requested, exists, used_up),
                want,
                "member {member}, requested {requested}, exists {exists}, used up {used_up}"
            );
        }
    }

    #[test]
    fn worker_token_secrets_have_one_shape() {
        let ok = "wt.abc123.0123456789abcdef0123456789abcdef";
        assert_eq!(
            worker_token_parts(ok),
            Some(("abc123", "0123456789abcdef0123456789abcdef"))
        );
        for bad in [
            "abc123.0123456789abcdef0123456789abcdef",
            "wt.abc12.0123456789abcdef0123456789abcdef",
            "wt.abc123.0123456789abcdef0123456789abcde",
            "wt.abc12g.0123456789abcdef0123456789abcdef",
            "wt.abc123",
            "",
        ] {
            assert_eq!(worker_token_parts(bad), None, "{bad}");
        }
    }

    #[test]
    fn bearer_token_is_required_and_checked() {
        let t = ClusterToken::parse("s3cret").unwrap();
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(authorized(&h, Some(&t)));
        assert!(!authorized(&h, None));
    }
}
