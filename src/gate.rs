//! The API's gate: every request meets the route table ([`hostlet_api::routes`]) before any handler runs.
//!
//! - A route the table does not list is unreachable (404, or 405 for a listed path and another method).
//! - Who may call is the table's answer, one for every agent: anyone, a joiner (the route checks its
//!   token), a node or an admin by certificate (the node API, which then decides per key), or the agent's
//!   users (the token, a voter's or an admin's certificate, or this node's own). A revoked certificate is
//!   refused on every route but the open ones and the joins.
//! - A body longer than the route's limit is answered 413 at once, from its `Content-Length`, and never
//!   read past the limit.
//! - Every refusal, the gate's or a handler's, reaches the client as a whole response: the rest of the
//!   request body is read and dropped (up to the route's limit) before the answer goes. Answering first
//!   resets an HTTP/2 stream under a client still sending (curl exits 92) and can lose the answer to a TCP
//!   reset over HTTP/1.1. Past the limit, an HTTP/1.1 connection is closed after the answer.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hostlet_api::routes::{self, Caller, Lookup, Route};
use hostlet_controllers::nodeapi::{may_use_agent, NodeRoles};
use hostlet_controllers::pki::{authorized, CertIdentity, ClusterToken, PeerNode, Revocations};

/// Who the API admits besides the token holders: callers by their client certificate.
#[derive(Clone)]
pub struct CertAccess {
    /// This agent's node.
    pub node: String,
    pub roles: NodeRoles,
    /// Certificates of deleted nodes, refused on every route but the open ones.
    pub revocations: Revocations,
    /// Fires when this agent's own node has been deleted: a worker sees no revocation list, yet its own
    /// certificate must be refused like every other revoked one.
    pub deleted: tokio_util::sync::CancellationToken,
}

pub struct Gate {
    pub token: Option<ClusterToken>,
    pub certs: Option<CertAccess>,
    /// How long a refused client may take to send the rest of its body.
    pub drain_timeout: Duration,
}

/// Enforces the route table, then runs the handler; a refusal, its own or the handler's, is sent after
/// the request body has been read.
pub async fn admit(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let matched = req.extensions().get::<MatchedPath>().map(|m| m.as_str());
    let lookup = matched.map_or(Lookup::NotFound, |p| routes::find(req.method().as_str(), p));
    let route = match lookup {
        Lookup::Found(r) => r,
        Lookup::WrongMethod => {
            let allow = matched
                .map(routes::methods_of)
                .unwrap_or_default()
                .join(", ");
            let answer = (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, allow)],
                format!("{} is not served on this path\n", req.method()),
            )
                .into_response();
            return refuse(&gate, req, routes::SMALL_BODY, answer).await;
        }
        Lookup::NotFound => {
            let answer = (StatusCode::NOT_FOUND, "no such route\n").into_response();
            return refuse(&gate, req, routes::SMALL_BODY, answer).await;
        }
    };
    if let Some(len) = content_length(&req) {
        if len > route.body_limit as u64 {
            let answer = too_large(route, len);
            return close_after(req.version(), answer);
        }
    }
    if let Some(answer) = decide(&gate, route, &req) {
        return refuse(&gate, req, route.body_limit, answer).await;
    }
    let version = req.version();
    let (parts, body) = req.into_parts();
    let tracked = Tracked::new(body);
    let req = Request::from_parts(parts, Body::new(tracked.clone()));
    let answer = next.run(req).await;
    if answer.status().is_client_error() || answer.status().is_server_error() {
        return tracked
            .drain_then(&gate, version, route.body_limit, answer)
            .await;
    }
    answer
}

/// The table's answer for `route`: the refusal, if it refuses.
fn decide(gate: &Gate, route: &Route, req: &Request) -> Option<Response> {
    if matches!(route.caller, Caller::Anyone | Caller::Joiner) {
        return None;
    }
    let peer = req.extensions().get::<PeerNode>();
    let who = peer.and_then(|p| p.0.clone());
    let serial = peer.and_then(|p| p.1.clone());
    if let (Some(serial), Some(certs)) = (serial, &gate.certs) {
        let own_deleted = certs.deleted.is_cancelled()
            && matches!(&who, Some(CertIdentity::Node(n)) if *n == certs.node);
        let owner = certs
            .revocations
            .revoked(&serial)
            .or_else(|| own_deleted.then(|| certs.node.clone()));
        if let Some(owner) = owner {
            return Some((
                StatusCode::FORBIDDEN,
                [(hostlet_runtime::nodeapi::REVOKED_HEADER, "1")],
                format!("certificate {serial} is revoked: node {owner} was deleted (hostlet node delete)\n"),
            )
                .into_response());
        }
    }
    match route.caller {
        Caller::Anyone | Caller::Joiner => None,
        Caller::Node => match who {
            Some(_) if gate.certs.is_some() => None,
            _ => Some(hostlet_controllers::nodeapi::no_certificate()),
        },
        Caller::AgentUser => {
            let token = authorized(req.headers(), gate.token.as_ref());
            match (who, &gate.certs) {
                (Some(who), Some(certs)) => {
                    match may_use_agent(&certs.roles.identity(&who), &certs.node) {
                        Ok(()) => None,
                        // The token still opens what the certificate does not.
                        Err(_) if token => None,
                        Err(why) => {
                            Some((StatusCode::FORBIDDEN, format!("{why}\n")).into_response())
                        }
                    }
                }
                _ if token => None,
                _ => Some(
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "missing or wrong cluster token\n",
                    )
                        .into_response(),
                ),
            }
        }
    }
}

fn content_length(req: &Request) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn too_large(route: &Route, len: u64) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "a body of {len} bytes: {} {} takes at most {} bytes\n",
            route.method, route.path, route.body_limit
        ),
    )
        .into_response()
}

/// `answer`, and over HTTP/1 the connection closed after it: the rest of the body stays unread.
fn close_after(version: Version, mut answer: Response) -> Response {
    if matches!(version, Version::HTTP_10 | Version::HTTP_11) {
        answer
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    answer
}

/// `answer` once the body of `req` has been read (up to `limit`).
async fn refuse(gate: &Gate, req: Request, limit: usize, answer: Response) -> Response {
    let version = req.version();
    Tracked::new(req.into_body())
        .drain_then(gate, version, limit, answer)
        .await
}

/// A request body whose unread rest the gate can still take back after the handler has answered.
#[derive(Clone)]
struct Tracked {
    inner: Arc<Mutex<Option<Body>>>,
    read: Arc<AtomicUsize>,
}

impl Tracked {
    fn new(body: Body) -> Self {
        Tracked {
            inner: Arc::new(Mutex::new(Some(body))),
            read: Arc::default(),
        }
    }

    /// Reads and drops what is left of the body, `limit` bytes at most over the whole request, then
    /// `answer`; past the limit or the drain timeout, the connection (HTTP/1) closes after it.
    async fn drain_then(
        self,
        gate: &Gate,
        version: Version,
        limit: usize,
        answer: Response,
    ) -> Response {
        let rest = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(rest) = rest else {
            return close_after(version, answer);
        };
        let budget = limit.saturating_sub(self.read.load(Ordering::Relaxed));
        let drained =
            tokio::time::timeout(gate.drain_timeout, axum::body::to_bytes(rest, budget)).await;
        match drained {
            Ok(Ok(_)) => answer,
            _ => close_after(version, answer),
        }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(body) = inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.read.fetch_add(data.len(), Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.as_ref().is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        )
    }
}
