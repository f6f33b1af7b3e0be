//! The agent's two listeners.
//!
//! - `--listen`: the API, HTTPS with the node's server certificate from the cluster CA (plain HTTP under
//!   `--etcd-insecure`). Every POST needs `Authorization: Bearer <token>`, and so does every GET beyond
//!   health, the CA, the pod list and stats (`/db/*`, a pod's logs and exec).
//! - `--metrics-listen`: plain HTTP `/metrics`, `/healthz`, `/readyz`.
//!
//! Both sockets are bound first thing ([`Listeners::bind`]), so a port already taken is reported before
//! anything else happens.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hostlet_controllers::etcd_member::{api::authorized, ClusterToken};
use hostlet_runtime::{Metrics, Readiness};
use tokio_util::sync::CancellationToken;

/// The two bound sockets.
pub struct Listeners {
    pub api: TcpListener,
    pub metrics: TcpListener,
}

fn bind(flag: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let l = TcpListener::bind(addr).with_context(|| format!("{flag} {addr}: cannot listen"))?;
    l.set_nonblocking(true)
        .with_context(|| format!("{flag} {addr}"))?;
    Ok(l)
}

impl Listeners {
    /// Binds `--listen` and `--metrics-listen`.
    pub fn bind(api: SocketAddr, metrics: SocketAddr) -> anyhow::Result<Self> {
        Ok(Listeners {
            api: bind("--listen", api)?,
            metrics: bind("--metrics-listen", metrics)?,
        })
    }
}

/// `/metrics`, `/healthz`, `/readyz`.
pub fn metrics_router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State((m, _)): State<(Metrics, Readiness)>| async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    m.encode_text(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State((_, r)): State<(Metrics, Readiness)>| async move {
                let report = r.report();
                let code = if report.ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (code, Json(report))
            }),
        )
        .with_state((metrics, readiness))
}

/// Serves the metrics router on its listener until `shutdown`.
pub async fn serve_metrics(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// What anyone may read without the token: health, the CA, the pod list and statuses, stats. Everything
/// else (every POST, `/db/*`, a pod's logs and exec, any route added later) needs it.
fn open_to_anyone(method: &Method, path: &str) -> bool {
    if method != Method::GET {
        return false;
    }
    let one_pod = path
        .strip_prefix("/pods/")
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
    matches!(path, "/healthz" | "/cacerts" | "/pods") || one_pod || path.starts_with("/stats/")
}

/// Refuses requests outside [`open_to_anyone`] without the cluster token; what it refuses changes nothing.
async fn require_token(
    State(token): State<Option<Arc<ClusterToken>>>,
    req: Request,
    next: Next,
) -> Response {
    let guarded = !open_to_anyone(req.method(), req.uri().path());
    if guarded && !authorized(req.headers(), token.as_deref()) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong cluster token\n",
        )
            .into_response();
    }
    next.run(req).await
}

/// The API router: `routes` (join endpoints, the pod endpoints) behind the token check.
pub fn api_router(routes: Router, token: Option<ClusterToken>) -> Router {
    routes
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(axum::middleware::from_fn_with_state(
            token.map(Arc::new),
            require_token,
        ))
}

/// Serves the API on its listener until `shutdown`: HTTPS when `tls` (certificate and key PEM) is given.
pub async fn serve_api(
    listener: TcpListener,
    router: Router,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        h.graceful_shutdown(Some(Duration::from_secs(2)));
    });
    let app = router.into_make_service();
    match tls {
        Some((cert, key)) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_pem(cert, key)
                .await
                .context("--listen: the server certificate")?;
            axum_server::from_tcp_rustls(listener, config)
                .handle(handle)
                .serve(app)
                .await?
        }
        None => {
            axum_server::from_tcp(listener)
                .handle(handle)
                .serve(app)
                .await?
        }
    }
    Ok(())
}
