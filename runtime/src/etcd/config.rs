//! How clients are built: the configuration ([`EtcdConfig`], [`TlsFiles`]), TLS, and the endpoints' form.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::EtcdError;

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs (`http://host:2379`, `https://host:2379`, or `host:2379`, which takes its scheme from `tls`).
    pub endpoints: Vec<String>,
    /// Client certificate authentication; `None` for plain HTTP.
    pub tls: Option<TlsFiles>,
    pub connect_timeout: Duration,
    /// Deadline of one attempt of one unary request (watches are not limited).
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// Plain-HTTP config with the default timeouts (connect 5 s, request 10 s).
    ///
    /// ```
    /// let cfg = hostlet_runtime::EtcdConfig::new(["http://127.0.0.1:2379"]);
    /// assert_eq!(cfg.endpoints.len(), 1);
    /// ```
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }

    #[must_use]
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// PEM files for TLS with client certificate authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server certificates.
    pub ca: PathBuf,
    /// This client's certificate and key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How every client is built.
pub(super) struct Settings {
    /// Built again from `tls_files` when the certificate is renewed ([`Etcd::reload_tls`](super::Etcd::reload_tls)).
    pub(super) tls: std::sync::RwLock<Option<ClientTlsConfig>>,
    pub(super) tls_files: Option<TlsFiles>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
}

fn read_pem(path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::TlsFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The client TLS configuration of `files`.
pub(super) fn tls_config(files: &TlsFiles) -> Result<ClientTlsConfig, EtcdError> {
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read_pem(&files.ca)?))
        .identity(Identity::from_pem(
            read_pem(&files.cert)?,
            read_pem(&files.key)?,
        )))
}

impl Settings {
    pub(super) fn tls(&self) -> Option<ClientTlsConfig> {
        self.tls.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn uses_tls(&self) -> bool {
        self.tls_files.is_some() || self.tls().is_some()
    }

    pub(super) async fn build_client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        let invalid = |reason: String| EtcdError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let mut ep = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .tcp_nodelay(true)
            // Finds a peer that vanished without closing the connection (watches would hang forever).
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = self.tls() {
            ep = ep.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        let channel = etcd_client::Channel::Tonic(ep.connect_lazy());
        // Without a leader a member cannot serve current data: make it say so instead of hanging.
        let opts = ConnectOptions::new().with_require_leader(true);
        Client::from_channel(channel, Some(opts))
            .await
            .map_err(EtcdError::request)
    }
}

pub(super) fn normalise_endpoint(e: &str, tls: bool) -> Result<String, EtcdError> {
    let e = e.trim().trim_end_matches('/');
    if e.is_empty() {
        return Err(EtcdError::InvalidEndpoint {
            endpoint: e.to_string(),
            reason: "empty".to_string(),
        });
    }
    if e.starts_with("http://") || e.starts_with("https://") {
        if tls && e.starts_with("http://") {
            return Err(EtcdError::InvalidEndpoint {
                endpoint: e.to_string(),
                reason: "plain http with TLS configured".to_string(),
            });
        }
        return Ok(e.to_string());
    }
    Ok(format!("{}://{e}", if tls { "https" } else { "http" }))
}

pub(super) fn normalise_endpoints(
    endpoints: &[String],
    tls: bool,
) -> Result<Vec<String>, EtcdError> {
    let mut out: Vec<String> = Vec::new();
    for e in endpoints {
        let e = normalise_endpoint(e, tls)?;
        if !out.contains(&e) {
            out.push(e);
        }
    }
    if out.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_their_scheme_from_tls() {
        assert_eq!(
            normalise_endpoint("127.0.0.1:2379", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            normalise_endpoint("127.0.0.1:2379", true).unwrap(),
            "https://127.0.0.1:2379"
        );
        assert_eq!(
            normalise_endpoint("https://h:1/", true).unwrap(),
            "https://h:1"
        );
        assert!(normalise_endpoint("http://h:1", true).is_err());
        assert!(matches!(
            normalise_endpoints(&[], false),
            Err(EtcdError::NoEndpoints)
        ));
        assert_eq!(
            normalise_endpoints(&["a:1".into(), "http://a:1".into()], false).unwrap(),
            vec!["http://a:1"]
        );
    }
}
