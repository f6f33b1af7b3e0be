//! The server side of the join protocol (see [`super::join`]): `/cacerts`, `/db/info`, `/db/join`, served
//! on the agent's `--listen` API.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hostlet_runtime::Etcd;

use super::join::{DbInfo, JoinRequest, JoinResponse, MemberInfo};
use super::tls::ClusterCa;
use super::token::ClusterToken;

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
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "missing or wrong cluster token\n",
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
}

impl JoinService {
    pub fn new(
        token: ClusterToken,
        ca: Option<ClusterCa>,
        etcd: Etcd,
        keys: hostlet_api::KeyLayout,
    ) -> Self {
        JoinService {
            inner: Arc::new(JoinServiceInner {
                token,
                ca,
                etcd,
                keys,
            }),
        }
    }

    pub fn token(&self) -> &ClusterToken {
        &self.inner.token
    }

    /// `/cacerts`, `/db/info`, `/db/join`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/cacerts", get(cacerts))
            .route("/db/info", get(db_info))
            .route("/db/join", post(db_join))
            .with_state(self.clone())
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
    if !authorized(&headers, Some(&svc.inner.token)) {
        return unauthorized();
    }
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
    Json(DbInfo {
        members: members.iter().map(MemberInfo::from).collect(),
        tls: svc.inner.ca.is_some(),
        voters_target: Some(voters_target),
        member_requested,
    })
    .into_response()
}

async fn db_join(
    State(svc): State<JoinService>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // Authenticate before even parsing the body.
    if !authorized(&headers, Some(&svc.inner.token)) {
        return unauthorized();
    }
    let Some(ca) = svc.inner.ca.clone() else {
        return (StatusCode::NOT_FOUND, "this cluster runs without TLS\n").into_response();
    };
    let req: JoinRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let bad = |m: &str| (StatusCode::BAD_REQUEST, format!("{m}\n")).into_response();
    if req.node.is_empty() || req.node.len() > 253 {
        return bad("node: 1 to 253 characters");
    }
    if req.sans.is_empty() || req.sans.len() > 32 || req.sans.iter().any(|s| s.len() > 253) {
        return bad("sans: 1 to 32 names of at most 253 characters");
    }
    tracing::info!(node = %req.node, sans = ?req.sans, "issuing certificates to a joining node");
    let issued =
        tokio::task::spawn_blocking(move || ca.issue_node(&req.node, &req.sans).map(|c| (ca, c)))
            .await;
    match issued {
        Ok(Ok((ca, certs))) => Json(JoinResponse { ca, certs }).into_response(),
        Ok(Err(e)) => bad(&super::error_chain(&e)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
