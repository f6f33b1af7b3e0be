//! The join protocol between a new node and any running hostlet (its `--listen` API).
//!
//! 1. `GET /cacerts` (no token): the cluster CA certificate. The joiner fetches it without verifying the
//!    server, then checks its SHA-256 against the fingerprint in the token, and from then on trusts only
//!    that CA. A CA that does not match ends the join before the secret is sent anywhere.
//! 2. `GET /db/info` (Bearer token): the members, so the joiner knows whom to ask to add it.
//! 3. `POST /db/join` (Bearer token, TLS clusters only): the joiner sends a certificate request for a key
//!    it generated; the server issues its server, peer and client certificates for that key and the names
//!    the joiner asks for. A joiner that becomes an etcd member also gets the CA key, so that it can admit
//!    later joiners itself; a worker gets the CA certificate only.
//!
//! A missing or wrong token gets 401 and changes nothing on the server.

use std::time::Duration;

use hostlet_runtime::Member;
use serde::{Deserialize, Serialize};

use crate::pki::{
    fingerprint_pem, worker_token_parts, ClusterCa, ClusterToken, IssuedCerts, TlsDir, TlsError,
    WORKER_TOKEN_PREFIX,
};

/// `GET /db/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DbInfo {
    /// On the wire each member's id is hex (the `wire_members` form below).
    #[serde(with = "wire_members")]
    pub members: Vec<Member>,
    /// Whether the cluster uses TLS (then `POST /db/join` hands out certificates).
    pub tls: bool,
    /// The cluster policy's voter target (absent from servers that predate roles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voters_target: Option<u8>,
    /// The leader asked the node named in the query to become a member.
    #[serde(default)]
    pub member_requested: bool,
    /// The joiner presented a worker token: it joins as a worker unless the leader asked for it.
    #[serde(default)]
    pub worker_only: bool,
}

impl DbInfo {
    /// Whether a joiner with `--role auto` whose peer URL is `own_peer_url` becomes an etcd member: asked
    /// to, or the other members (voters and learners) are fewer than the target, or the cluster already
    /// has a member with its peer URL (an earlier attempt's learner, or its own member before a tombstone,
    /// which the join replaces). Otherwise it joins as a worker.
    pub fn auto_joins_as_member(&self, own_peer_url: &str) -> bool {
        let target = self
            .voters_target
            .unwrap_or(hostlet_api::objects::DEFAULT_VOTERS) as usize;
        let own = |m: &&Member| m.peer_urls.iter().any(|u| u == own_peer_url);
        let others = self.members.iter().filter(|m| !own(m)).count();
        if self.worker_only {
            return self.member_requested;
        }
        self.member_requested || others < target || self.members.iter().any(|m| own(&m))
    }
}

/// The form of `/db/info`'s members: [`Member`] with its id as a hex string, as etcdctl prints ids.
mod wire_members {
    use hostlet_runtime::Member;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// One member on the wire only; nothing but (de)serialising `DbInfo` uses it.
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        id: String,
        name: String,
        peer_urls: Vec<String>,
        client_urls: Vec<String>,
        is_learner: bool,
    }

    pub fn serialize<S: Serializer>(members: &[Member], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(members.iter().map(|m| Wire {
            id: format!("{:x}", m.id),
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
            client_urls: m.client_urls.clone(),
            is_learner: m.is_learner,
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Member>, D::Error> {
        Vec::<Wire>::deserialize(d)?
            .into_iter()
            .map(|w| {
                let id = u64::from_str_radix(&w.id, 16).map_err(|e| {
                    D::Error::custom(format!("member id {:?} is not hex: {e}", w.id))
                })?;
                Ok(Member {
                    id,
                    name: w.name,
                    peer_urls: w.peer_urls,
                    client_urls: w.client_urls,
                    is_learner: w.is_learner,
                })
            })
            .collect()
    }
}

/// `POST /db/join` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinRequest {
    pub node: String,
    /// Names the joiner's certificates must be valid for (its advertise address, hostname…).
    pub sans: Vec<String>,
    /// The joiner starts an etcd member (a worker token may ask only while the leader's member request for
    /// the node exists).
    #[serde(default)]
    pub member: bool,
    /// A certificate request (PEM) signed by the joiner's own key: the certificates are issued for it.
    #[serde(default)]
    pub csr: String,
}

/// `POST /db/join` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    pub ca: HandedCa,
    /// For the key of the request.
    pub certs: IssuedCerts,
    /// The node CA's certificate, beside a worker's certificates (its client certificate comes from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ca: Option<String>,
    /// For a worker that joined with the server token: the token it keeps instead (a worker token of its
    /// own), so that the server token stays on the voters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// The CA as a join hands it over: its key only to a joiner that becomes an etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedCa {
    pub cert: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl HandedCa {
    /// The whole CA, which a member needs: `None` when the key was not handed over.
    pub fn cluster_ca(&self) -> Option<ClusterCa> {
        Some(ClusterCa {
            cert: self.cert.clone(),
            key: self.key.clone()?,
        })
    }
}

/// Why a join request failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// `reason`: the server's, as [`refusal_reason`] cleans it; `worker`: the token given is a worker
    /// token, which needs other advice than the cluster token.
    #[error("{}", unauthorized_text(.server, .reason.as_deref(), *.worker))]
    Unauthorized {
        server: String,
        reason: Option<String>,
        worker: bool,
    },
    #[error("the token carries no CA fingerprint, so {server} cannot be verified: use the full token (H10::…) from the first node's <data-dir>/token")]
    NoFingerprint { server: String },
    #[error("{server} presents a CA whose fingerprint {got} does not match the token's {want}: refusing to join it")]
    CaMismatch {
        server: String,
        got: String,
        want: String,
    },
    #[error("{server}")]
    Http {
        server: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{server}{path}: HTTP {status}: {body}")]
    Status {
        server: String,
        path: String,
        status: u16,
        body: String,
    },
    /// The answer is not one this version reads: most likely the server runs an earlier hostlet, which
    /// hands out private keys instead of certificates for the joiner's own.
    #[error("{server}/db/join answered in a form this hostlet version does not read ({detail}): it most likely runs an earlier hostlet version; upgrade the voters first, then join")]
    Incompatible { server: String, detail: String },
    #[error("{server}")]
    Tls {
        server: String,
        #[source]
        source: TlsError,
    },
}

impl JoinError {
    /// Worth retrying (the server may come up, or answer next time); a refused token or CA is not.
    pub fn is_transient(&self) -> bool {
        match self {
            // Voters being upgraded answer in this version's form soon.
            JoinError::Http { .. } | JoinError::Incompatible { .. } => true,
            JoinError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// An HTTP client for one server, trusting only the cluster CA once it is verified.
#[derive(Debug, Clone)]
pub struct JoinClient {
    server: String,
    http: reqwest::Client,
    token: ClusterToken,
    /// The verified CA certificate (TLS clusters).
    pub ca_cert: Option<String>,
}

const TIMEOUT: Duration = Duration::from_secs(10);

impl JoinClient {
    /// Connects to `server`; for `https://` it fetches the CA and checks it against the token first. A
    /// node that has certificates already (a rejoin, a worker becoming a member) presents its client
    /// certificate from `tls`: a join that claims an existing node's name must prove it is that node.
    pub async fn connect(
        server: &str,
        token: &ClusterToken,
        tls: Option<&TlsDir>,
    ) -> Result<Self, JoinError> {
        let server = server.trim_end_matches('/').to_string();
        let http_err = |source| JoinError::Http {
            server: server.clone(),
            source,
        };
        if !server.starts_with("https://") {
            let http = reqwest::Client::builder()
                .timeout(TIMEOUT)
                .build()
                .map_err(http_err)?;
            return Ok(JoinClient {
                server,
                http,
                token: token.clone(),
                ca_cert: None,
            });
        }
        let want = token
            .ca_fingerprint
            .clone()
            .ok_or_else(|| JoinError::NoFingerprint {
                server: server.clone(),
            })?;
        // Unverified on purpose: what it returns is checked against the fingerprint before any use.
        let probe = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .danger_accept_invalid_certs(true)
            .build()
            .map_err(http_err)?;
        let resp = probe
            .get(format!("{server}/cacerts"))
            .send()
            .await
            .map_err(http_err)?;
        let pem = checked(resp, &server, "/cacerts", token)
            .await?
            .text()
            .await
            .map_err(http_err)?;
        let got = fingerprint_pem(&pem).map_err(|source| JoinError::Tls {
            server: server.clone(),
            source,
        })?;
        if got != want {
            return Err(JoinError::CaMismatch { server, got, want });
        }
        let root = reqwest::Certificate::from_pem(pem.as_bytes()).map_err(http_err)?;
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .tls_built_in_root_certs(false)
            .add_root_certificate(root);
        // Only certificates of this cluster's CA: another's would fail the handshake.
        let same_ca = |t: &&TlsDir| {
            std::fs::read_to_string(t.ca_cert())
                .ok()
                .and_then(|c| fingerprint_pem(&c).ok())
                .is_some_and(|f| f == want)
        };
        if let Some(identity) = tls.filter(same_ca).and_then(own_identity) {
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(http_err)?;
        Ok(JoinClient {
            server,
            http,
            token: token.clone(),
            ca_cert: Some(pem),
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    fn http_err(&self) -> impl FnOnce(reqwest::Error) -> JoinError + '_ {
        |source| JoinError::Http {
            server: self.server.clone(),
            source,
        }
    }

    /// `GET /db/info`.
    pub async fn db_info(&self) -> Result<DbInfo, JoinError> {
        self.db_info_for("").await
    }

    /// `GET /db/info?node=…`: also whether the leader asked `node` to become a member.
    pub async fn db_info_for(&self, node: &str) -> Result<DbInfo, JoinError> {
        let resp = self
            .http
            .get(format!("{}/db/info", self.server))
            .query(&[("node", node)])
            .bearer_auth(self.token.to_string())
            .send()
            .await
            .map_err(self.http_err())?;
        checked(resp, &self.server, "/db/info", &self.token)
            .await?
            .json()
            .await
            .map_err(self.http_err())
    }

    /// `POST /db/join`: this node's certificates and the CA.
    pub async fn join(&self, req: &JoinRequest) -> Result<JoinResponse, JoinError> {
        let resp = self
            .http
            .post(format!("{}/db/join", self.server))
            .bearer_auth(self.token.to_string())
            .json(req)
            .send()
            .await
            .map_err(self.http_err())?;
        let body = checked(resp, &self.server, "/db/join", &self.token)
            .await?
            .bytes()
            .await
            .map_err(self.http_err())?;
        let answer: JoinResponse =
            serde_json::from_slice(&body).map_err(|e| JoinError::Incompatible {
                server: self.server.clone(),
                detail: e.to_string(),
            })?;
        // The CA handed over must be the one the token names.
        let got = fingerprint_pem(&answer.ca.cert).map_err(|source| JoinError::Tls {
            server: self.server.clone(),
            source,
        })?;
        if let Some(want) = &self.token.ca_fingerprint {
            if &got != want {
                return Err(JoinError::CaMismatch {
                    server: self.server.clone(),
                    got,
                    want: want.clone(),
                });
            }
        }
        Ok(answer)
    }
}

/// The node's client certificate and key, when it has them and they load.
fn own_identity(tls: &TlsDir) -> Option<reqwest::Identity> {
    use crate::pki::CertRole;
    let mut pem = std::fs::read(tls.cert(CertRole::Client)).ok()?;
    pem.extend(std::fs::read(tls.key(CertRole::Client)).ok()?);
    reqwest::Identity::from_pem(&pem).ok()
}

async fn checked(
    resp: reqwest::Response,
    server: &str,
    path: &str,
    token: &ClusterToken,
) -> Result<reqwest::Response, JoinError> {
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        let body = resp.text().await.unwrap_or_default();
        return Err(JoinError::Unauthorized {
            server: server.to_string(),
            reason: refusal_reason(&body, token),
            worker: token.secret.starts_with(WORKER_TOKEN_PREFIX),
        });
    }
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(JoinError::Status {
            server: server.to_string(),
            path: path.to_string(),
            status: status.as_u16(),
            body: body.chars().take(500).collect(),
        });
    }
    Ok(resp)
}

/// The longest refusal reason the joiner prints: a server not yet verified (`/cacerts`) may send anything.
const MAX_REASON_CHARS: usize = 200;

/// The reason in a 401's body (plain text, or JSON with a `reason`, `message` or `error` string) as the
/// joiner may print and log it: control characters and runs of blanks made one space, the token's secret
/// blanked out should the server echo it, at most [`MAX_REASON_CHARS`]. `None` when it says nothing.
pub fn refusal_reason(body: &str, token: &ClusterToken) -> Option<String> {
    let text = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(serde_json::Value::Object(o)) => ["reason", "message", "error"]
            .iter()
            .find_map(|k| o.get(*k)?.as_str().map(str::to_string))
            .unwrap_or_default(),
        _ => body.to_string(),
    };
    let mut text = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let inner = worker_token_parts(&token.secret).map(|(_, secret)| secret);
    for secret in [Some(token.secret.as_str()), inner].into_iter().flatten() {
        if !secret.is_empty() {
            text = text.replace(secret, "<secret>");
        }
    }
    if text.is_empty() {
        return None;
    }
    if text.chars().count() > MAX_REASON_CHARS {
        text = text.chars().take(MAX_REASON_CHARS).collect::<String>() + "…";
    }
    Some(text)
}

/// A 401's message: the server's reason, and advice for the kind of token given (a worker token is
/// replaced by an admin; a cluster token is copied from a node).
fn unauthorized_text(server: &str, reason: Option<&str>, worker: bool) -> String {
    let advice = if worker {
        "ask an admin for a new worker token: hostlet token create"
    } else {
        "give the cluster token of the node you join (its <data-dir>/token)"
    };
    match reason {
        Some(reason) => format!("{server} refused the token (HTTP 401): {reason}: {advice}"),
        None => format!("{server} refused the token (HTTP 401): {advice}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/db/info` reads the same to joiners of earlier versions: ids in hex, fields as before.
    #[test]
    fn db_info_members_keep_their_wire_form() {
        let info = DbInfo {
            members: vec![Member {
                id: 0x8e9e05c52164694d,
                name: "m1".into(),
                peer_urls: vec!["https://10.0.0.1:2380".into()],
                client_urls: vec!["https://10.0.0.1:2379".into()],
                is_learner: true,
            }],
            tls: true,
            voters_target: Some(3),
            member_requested: false,
            worker_only: false,
        };
        let json = serde_json::to_string(&info).unwrap();
        assert_eq!(
            json,
            r#"{"members":[{"id":"8e9e05c52164694d","name":"m1","peerUrls":["https://10.0.0.1:2380"],"clientUrls":["https://10.0.0.1:2379"],"isLearner":true}],"tls":true,"votersTarget":3,"memberRequested":false,"workerOnly":false}"#
        );
        assert_eq!(serde_json::from_str::<DbInfo>(&json).unwrap(), info);
        let not_hex = json.replace("8e9e05c52164694d", "member-1");
        assert!(serde_json::from_str::<DbInfo>(&not_hex).is_err());
    }

    /// A 401 names the server's reason and the advice for the kind of token given.
    #[test]
    fn a_refusal_names_the_reason_and_advice_for_the_token_kind() {
        let s = "https://10.0.0.1:10250";
        assert_eq!(
            unauthorized_text(s, Some("token fb8847 is expired"), true),
            "https://10.0.0.1:10250 refused the token (HTTP 401): token fb8847 is expired: ask an admin for a new worker token: hostlet token create"
        );
        assert_eq!(
            unauthorized_text(s, Some("missing or wrong cluster token"), false),
            "https://10.0.0.1:10250 refused the token (HTTP 401): missing or wrong cluster token: give the cluster token of the node you join (its <data-dir>/token)"
        );
        assert_eq!(
            unauthorized_text(s, None, false),
            "https://10.0.0.1:10250 refused the token (HTTP 401): give the cluster token of the node you join (its <data-dir>/token)"
        );
    }

    /// What a server says is printed only cleaned: text or JSON, no control characters, no secret, short.
    #[test]
    fn a_refusal_reason_is_cleaned() {
        let secret = "0123456789abcdef0123456789abcdef";
        let worker = ClusterToken::parse(&format!("wt.fb8847.{secret}")).unwrap();
        let reason = |body: &str| refusal_reason(body, &worker);
        assert_eq!(
            reason("token fb8847 is used up\n").as_deref(),
            Some("token fb8847 is used up")
        );
        assert_eq!(
            reason(r#"{"reason":"token fb8847 is revoked"}"#).as_deref(),
            Some("token fb8847 is revoked")
        );
        assert_eq!(
            reason(r#"{"code":401,"message":"no"}"#).as_deref(),
            Some("no")
        );
        assert_eq!(
            reason("bad\x1b[31m\r\n\tthing\u{7}").as_deref(),
            Some("bad [31m thing")
        );
        assert_eq!(reason(" \n"), None);
        assert_eq!(reason(r#"{"other":1}"#), None);
        let long = reason(&"x".repeat(5000)).unwrap();
        assert_eq!(long.chars().count(), MAX_REASON_CHARS + 1);
        let echoed = reason(&format!("you sent wt.fb8847.{secret}, and {secret}")).unwrap();
        assert!(!echoed.contains(secret), "{echoed}");
        let cluster = ClusterToken::parse("s3cret-value").unwrap();
        let echoed = refusal_reason("you sent s3cret-value", &cluster).unwrap();
        assert_eq!(echoed, "you sent <secret>");
    }

    /// A joiner reads the 401's body: a worker token's refusal reaches the error with its reason.
    #[tokio::test]
    async fn a_401_carries_the_servers_reason() {
        let app = axum::Router::new().route(
            "/db/info",
            axum::routing::get(|| async {
                (
                    axum::http::StatusCode::UNAUTHORIZED,
                    "token fb8847 is expired\n",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let secret = "wt.fb8847.0123456789abcdef0123456789abcdef";
        let token = ClusterToken::parse(secret).unwrap();
        let client = JoinClient::connect(&format!("http://{addr}"), &token, None)
            .await
            .unwrap();
        let err = client.db_info().await.unwrap_err();
        assert!(
            matches!(&err, JoinError::Unauthorized { reason: Some(r), worker: true, .. } if r == "token fb8847 is expired"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("hostlet token create") && !text.contains(secret),
            "{text}"
        );
        assert!(!err.is_transient());
    }

    /// A join answered by an earlier version's voter (the CA key and private keys, not certificates for
    /// the joiner's own key): refused with a message that says so, and retried (the voters may be
    /// upgraded meanwhile).
    #[tokio::test]
    async fn an_answer_in_an_earlier_versions_form_is_named_as_such() {
        let old = serde_json::json!({
            "ca": {"cert": "-----BEGIN CERTIFICATE-----", "key": "-----BEGIN PRIVATE KEY-----"},
            "certs": {
                "server": {"cert": "c", "key": "k"},
                "peer": {"cert": "c", "key": "k"},
                "client": {"cert": "c", "key": "k"},
            },
        });
        let app = axum::Router::new().route(
            "/db/join",
            axum::routing::post(move || {
                let old = old.clone();
                async move { axum::Json(old) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let token = ClusterToken::parse("secret").unwrap();
        let client = JoinClient::connect(&format!("http://{addr}"), &token, None)
            .await
            .unwrap();
        let err = client
            .join(&JoinRequest {
                node: "n2".into(),
                sans: vec!["127.0.0.1".into()],
                member: false,
                csr: String::new(),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, JoinError::Incompatible { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("earlier hostlet version") && text.contains("/db/join"),
            "{text}"
        );
        assert!(err.is_transient());
    }
}
