//! The agent's two listeners.
//!
//! - `--listen`: the API, HTTPS with the node's server certificate from the cluster CA (plain HTTP under
//!   `--etcd-insecure`). Denies by default: the gate ([`crate::gate`]) lets a request reach a handler
//!   only as the route table (`hostlet_api::routes`) says, and a route not in it is unreachable. A
//!   request's headers must arrive within
//!   [`ApiLimits::header_read_timeout`] (an idle kept-alive connection ends then too), a TLS handshake
//!   within 10 s, and at most [`ApiLimits::max_connections`] connections are open at once (more are
//!   closed as they arrive).
//! - `--metrics-listen`: plain HTTP `/metrics`, `/healthz`, `/readyz`.
//!
//! Both sockets are bound first thing ([`Listeners::bind`]), so a port already taken is reported before
//! anything else happens.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use hostlet_controllers::pki::{identity_of_certificate, serial_of_der, ClusterToken, PeerNode};
use hostlet_runtime::{Metrics, Readiness};
use tokio_util::sync::CancellationToken;

pub use crate::gate::CertAccess;
use crate::gate::{admit, Gate};

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

/// How much of the API one client can hold.
#[derive(Debug, Clone, Copy)]
pub struct ApiLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 512,
        }
    }
}

/// Accepts a connection only while fewer than the cap are open; the permit goes with the connection.
#[derive(Clone)]
struct CappedAcceptor {
    permits: Arc<tokio::sync::Semaphore>,
}

impl<S: Send + 'static> axum_server::accept::Accept<tokio::net::TcpStream, S> for CappedAcceptor {
    type Stream = Capped;
    type Service = S;
    type Future = std::future::Ready<std::io::Result<(Capped, S)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        std::future::ready(match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok((
                Capped {
                    stream,
                    _permit: permit,
                },
                service,
            )),
            // Dropping the stream closes it: the client sees the connection refused at once.
            Err(_) => Err(std::io::Error::other("too many connections")),
        })
    }
}

/// A connection holding one of the cap's permits.
struct Capped {
    stream: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The API router: `routes` (join endpoints, the pod endpoints, a voter's node API) behind the gate, which
/// enforces the route table before any handler runs.
pub fn api_router(
    routes: Router,
    token: Option<ClusterToken>,
    certs: Option<CertAccess>,
) -> Router {
    hostlet_controllers::routes::serve(routes, &hostlet_api::routes::HEALTHZ, || async { "ok\n" })
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Gate {
                token,
                certs,
                drain_timeout: DRAIN_TIMEOUT,
            }),
            admit,
        ))
}

/// How long a refused client may take to send the rest of its body before its connection closes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The API's TLS: the node's certificate, and client certificates from `client_ca` asked for (not
/// required: the token and the open routes need none).
fn tls_config(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .context("--listen: the server certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key).context("--listen: the server key")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("--listen: TLS versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(c.context("--listen: the cluster CA")?)
                    .context("--listen: the cluster CA")?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .context("--listen: the client certificate check")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("--listen: the server certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

type TlsAcceptor = axum_server::tls_rustls::RustlsAcceptor<CappedAcceptor>;

/// After the TLS handshake, hands every request of the connection the node its client certificate names.
#[derive(Clone)]
struct PeerAcceptor {
    tls: TlsAcceptor,
}

impl<S: Send + 'static> axum_server::accept::Accept<tokio::net::TcpStream, S> for PeerAcceptor {
    type Stream = <TlsAcceptor as axum_server::accept::Accept<tokio::net::TcpStream, S>>::Stream;
    type Service = axum::middleware::AddExtension<S, PeerNode>;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = std::io::Result<(Self::Stream, Self::Service)>> + Send,
        >,
    >;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let handshake = self.tls.accept(stream, service);
        Box::pin(async move {
            let (stream, service) = handshake.await?;
            let leaf = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref().to_vec());
            let node = leaf.as_deref().and_then(identity_of_certificate);
            let serial = leaf.as_deref().and_then(serial_of_der);
            let service =
                tower_layer::Layer::layer(&axum::Extension(PeerNode(node, serial)), service);
            Ok((stream, service))
        })
    }
}

/// Serves the API on its listener until `shutdown`: HTTPS when `tls` (certificate and key PEM) is given.
pub async fn serve_api(
    listener: TcpListener,
    router: Router,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    client_ca: Option<Vec<u8>>,
    reload: Option<hostlet_controllers::agent::ApiTlsReload>,
    limits: ApiLimits,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    let stop = shutdown.clone();
    let graceful = async move {
        stop.cancelled().await;
        h.graceful_shutdown(Some(Duration::from_secs(2)));
    };
    let app = router.into_make_service();
    let capped = CappedAcceptor {
        permits: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
    };
    let mut server = axum_server::from_tcp(listener).handle(handle);
    server
        .http_builder()
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    match tls {
        Some((cert, key)) => {
            let config = tls_config(&cert, &key, client_ca.as_deref())?;
            let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
            let reload = reload.map(|r| reload_tls(r, config.clone(), client_ca, shutdown.clone()));
            let tls = PeerAcceptor {
                tls: axum_server::tls_rustls::RustlsAcceptor::new(config).acceptor(capped),
            };
            alongside(server.acceptor(tls).serve(app), graceful, reload).await?
        }
        None => {
            alongside(
                server.acceptor(capped).serve(app),
                graceful,
                None::<std::future::Pending<()>>,
            )
            .await?
        }
    }
    Ok(())
}

/// Runs `serve` to its end with the stop's graceful shutdown and the TLS reload beside it, in the same
/// task: they end with the server, not after it.
async fn alongside<S, R>(
    serve: S,
    graceful: impl Future<Output = ()>,
    reload: Option<R>,
) -> S::Output
where
    S: Future,
    R: Future<Output = ()>,
{
    let beside = async move {
        tokio::join!(graceful, async move {
            if let Some(r) = reload {
                r.await
            }
        });
        // Done once the stop has come: the server ends by itself, gracefully.
        std::future::pending::<std::convert::Infallible>().await
    };
    tokio::select! {
        r = serve => r,
        never = beside => match never {},
    }
}

/// Serves the certificate in the files of `r` from each renewal on; connections open finish with the
/// one they began with.
async fn reload_tls(
    mut r: hostlet_controllers::agent::ApiTlsReload,
    config: axum_server::tls_rustls::RustlsConfig,
    client_ca: Option<Vec<u8>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = r.renewed.changed() => if changed.is_err() { return },
        }
        let loaded = std::fs::read(&r.cert)
            .and_then(|c| Ok((c, std::fs::read(&r.key)?)))
            .map_err(anyhow::Error::from)
            .and_then(|(c, k)| tls_config(&c, &k, client_ca.as_deref()));
        match loaded {
            Ok(c) => {
                config.reload_from_config(Arc::new(c));
                tracing::info!("the API serves the renewed certificate");
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot load the renewed certificate; the API keeps serving the one it has")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A plain-HTTP API on a free loopback port with `limits`: `/pods` behind the token `s3cret`.
    fn start(limits: ApiLimits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let token = ClusterToken::parse("s3cret").ok();
        let routes = hostlet_controllers::routes::serve(
            Router::new(),
            &hostlet_api::routes::PODS,
            || async { "[]" },
        );
        let stop = CancellationToken::new();
        tokio::spawn(serve_api(
            listener,
            api_router(routes, token, None),
            None,
            None,
            None,
            limits,
            stop.clone(),
        ));
        (addr, stop)
    }

    /// The status line of one request (empty when the connection was refused or cut).
    async fn status(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            return String::new();
        };
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        let mut out = String::new();
        if s.write_all(req.as_bytes()).await.is_err() || s.read_to_string(&mut out).await.is_err() {
            return String::new();
        }
        out.lines().next().unwrap_or_default().to_string()
    }

    /// Whether the server closes `s` (a read ends) within `deadline`.
    async fn closed_within(s: &mut tokio::net::TcpStream, deadline: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(deadline, s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn the_pod_list_needs_the_token_and_a_slow_client_is_cut_off() {
        let (addr, stop) = start(ApiLimits {
            header_read_timeout: Duration::from_secs(1),
            max_connections: 16,
        });
        assert_eq!(
            status(addr, "/pods", None).await,
            "HTTP/1.1 401 Unauthorized"
        );
        assert_eq!(
            status(addr, "/pods", Some("wrong")).await,
            "HTTP/1.1 401 Unauthorized"
        );
        assert_eq!(
            status(addr, "/pods", Some("s3cret")).await,
            "HTTP/1.1 200 OK"
        );
        assert_eq!(status(addr, "/healthz", None).await, "HTTP/1.1 200 OK");
        // Headers that never end: the connection goes, well before the test's own deadline.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(30)).await);
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_as_they_arrive() {
        let (addr, stop) = start(ApiLimits {
            header_read_timeout: Duration::from_secs(600),
            max_connections: 2,
        });
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            // A request on each, so both are surely accepted before the third arrives.
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 12];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"HTTP/1.1 200");
            held.push(s);
        }
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut third, Duration::from_secs(30)).await);
        // One given back: a new connection is served again.
        held.pop();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if status(addr, "/healthz", None).await == "HTTP/1.1 200 OK" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no connection served after one closed"
            );
            tokio::task::yield_now().await;
        }
        stop.cancel();
    }
}
