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

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use hostlet_api::authz::Identity;
use hostlet_api::{routes, KeyLayout};
use hostlet_runtime::nodeapi::NodeApiClient;
use hostlet_runtime::Etcd;
use serde::{Deserialize, Serialize};

use super::{NodeRoles, PeerNode};
use crate::etcd_member::tls::{
    cert_sans, check_request, outlasts, renew_at, serial_if_issued_to, CertRole, ClusterCa,
    IssuedCerts, NodeKey, TlsDir,
};

/// The request body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RenewRequest {
    pub csr: String,
    pub sans: Vec<String>,
    /// The certificates (PEM) the node holds now: those the cluster CA issued to it are superseded even
    /// if no join recorded them (an earlier version's did not).
    #[serde(default)]
    pub retire: Vec<String>,
}

/// The answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewResponse {
    pub certs: IssuedCerts,
    pub node_ca: String,
}

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
    match crate::etcd_member::api::node_token(&r.etcd, &r.keys, &node, fingerprint).await {
        Ok(t) => Json(serde_json::json!({ "token": t.to_string() })).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot store the token: {e}\n"),
        )
            .into_response(),
    }
}

/// A worker that keeps the server token (an earlier version's join with it) swaps it for a worker token
/// of its own, through the voters, and writes that over it: the server token, which makes voters, stays
/// on the voters. Tried every 30 s until it is done.
pub async fn drop_server_token(
    api: NodeApiClient,
    token_file: std::path::PathBuf,
    stop: tokio_util::sync::CancellationToken,
) {
    use crate::etcd_member::token::ClusterToken;
    let Some(current) = std::fs::read_to_string(&token_file)
        .ok()
        .and_then(|t| ClusterToken::parse(&t).ok())
    else {
        return;
    };
    if crate::etcd_member::api::worker_token_parts(&current.secret).is_some() {
        return;
    }
    #[derive(Deserialize)]
    struct Own {
        token: String,
    }
    loop {
        let answer: Result<Own, _> = api
            .post_json(routes::NODE_TOKEN.path, &serde_json::json!({}))
            .await;
        match answer.map(|o| ClusterToken::parse(&o.token)) {
            Ok(Ok(t)) => {
                match crate::etcd_member::tls::write_file(&token_file, &format!("{t}\n"), 0o600) {
                    Ok(()) => {
                        tracing::warn!(
                            "this worker kept the server token from its join: replaced it in {} by a worker token of its own",
                            token_file.display()
                        );
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot write the worker's own token"),
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "the voters' token does not parse"),
            Err(e) => tracing::warn!(error = %e, "cannot get a token of this worker's own"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
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
        Ok::<_, crate::etcd_member::tls::TlsError>(RenewResponse {
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
                format!("{}\n", crate::etcd_member::error_chain(&e)),
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
    let recorded = crate::etcd_member::revocation::update(&r.etcd, &r.keys, &node, |rec| {
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

/// The node record (its certificates' expiry and serials, which also makes the API serve the new server
/// certificate) and `hostlet_certificate_expiry_timestamp_seconds` follow the certificates in `tls`.
fn report_renewed(
    tls: &TlsDir,
    info: &tokio::sync::watch::Sender<hostlet_api::objects::NodeInfo>,
    expiry: Option<&prometheus::IntGaugeVec>,
) {
    let expiries = tls.expiries();
    info.send_modify(|i| {
        i.cert_expires = expiries
            .iter()
            .filter(|(name, _)| *name != "ca")
            .map(|(_, at)| hostlet_api::objects::Timestamp(*at))
            .min();
        i.cert_serials = tls.serials();
    });
    if let Some(g) = expiry {
        for (name, at) in expiries {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            g.with_label_values(&[name])
                .set(i64::try_from(secs).unwrap_or(i64::MAX));
        }
    }
}

/// When a member's own certificates are due: two thirds into the life of the one that expires first, or
/// now if one lasts longer than this member would issue it (`lifetime`): an earlier version's ten-year
/// certificate, or a shortened `--cert-lifetime`.
pub fn member_renewal_due(tls: &TlsDir, lifetime: Duration) -> SystemTime {
    let pems: Vec<Vec<u8>> = [CertRole::Server, CertRole::Peer, CertRole::Client]
        .iter()
        .filter_map(|r| std::fs::read(tls.cert(*r)).ok())
        .collect();
    if pems.iter().any(|p| outlasts(p, lifetime)) {
        return SystemTime::now();
    }
    pems.iter()
        .filter_map(|p| renew_at(p))
        .min()
        .unwrap_or_else(SystemTime::now)
}

/// A voter's (any etcd member's) own certificates, issued again by the cluster CA it holds for a new key,
/// without a restart: recorded first (so that they can be revoked), then written; its etcd reads them on
/// each new connection, the agent's etcd client and API present them from then on, the earlier ones are
/// superseded (etcd refuses them), and the node record and the expiry metric follow.
pub async fn keep_member_certificates_fresh(
    etcd: Etcd,
    keys: KeyLayout,
    lifetime: Duration,
    node: RenewingNode,
) {
    let due = |tls: &TlsDir| member_renewal_due(tls, lifetime);
    let name = node.name.clone();
    let renew = |tls: TlsDir| {
        let (etcd, keys, name) = (etcd.clone(), keys.clone(), name.clone());
        async move {
            renew_member(&etcd, &keys, &tls, &name, lifetime).await?;
            Ok("this member's certificates were renewed")
        }
    };
    keep_fresh("this member's", node, due, renew).await;
}

/// A worker's certificates, renewed before they expire and moved off the cluster CA, without a restart:
/// the node API client presents the new ones, the agent's API serves its new server certificate from
/// the files, and the node record and `hostlet_certificate_expiry_timestamp_seconds` follow.
pub async fn keep_certificates_fresh(api: NodeApiClient, node: RenewingNode) {
    let name = node.name.clone();
    let renew = |tls: TlsDir| {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let moving = !tls.client_from_node_ca();
            renew_once(&api, &tls, &name).await?;
            Ok(if moving {
                "this worker's certificates come from the node CA now: the ones it had, which opened etcd, are superseded"
            } else {
                "this worker's certificates were renewed"
            })
        }
    };
    keep_fresh("this worker's", node, renewal_due, renew).await;
}

/// What a renewal loop works on and reports to, whichever kind of node it runs on.
pub struct RenewingNode {
    pub name: String,
    pub tls: TlsDir,
    /// The node record's source: its certificates' expiry and serials follow each renewal.
    pub info: tokio::sync::watch::Sender<hostlet_api::objects::NodeInfo>,
    pub expiry: Option<prometheus::IntGaugeVec>,
    pub stop: tokio_util::sync::CancellationToken,
}

/// The renewal loop both kinds of node run: wait until `due`, `renew` (which says what it did), report
/// the new certificates; after a failure, try again in [`RETRY`].
async fn keep_fresh<F>(
    whose: &str,
    node: RenewingNode,
    due: impl Fn(&TlsDir) -> SystemTime,
    renew: impl Fn(TlsDir) -> F,
) where
    F: std::future::Future<Output = anyhow::Result<&'static str>>,
{
    let RenewingNode {
        tls,
        info,
        expiry,
        stop,
        ..
    } = node;
    loop {
        let wait = due(&tls)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match renew(tls.clone()).await {
            Ok(what) => {
                tracing::info!("{what}");
                report_renewed(&tls, &info, expiry.as_ref());
            }
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot renew {whose} certificates; trying again in {}s",
                    RETRY.as_secs()
                );
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
}

async fn renew_member(
    etcd: &Etcd,
    keys: &KeyLayout,
    tls: &TlsDir,
    node: &str,
    lifetime: Duration,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let ca = tls.load_ca()?;
    let server = std::fs::read_to_string(tls.cert(CertRole::Server))
        .with_context(|| format!("reading {}", tls.cert(CertRole::Server).display()))?;
    let sans = cert_sans(&server).context("the names of the server certificate")?;
    let certs = ca.issue_node_lasting(node, &sans, Some(lifetime))?;
    let serials: Vec<String> = [&certs.server, &certs.peer, &certs.client]
        .iter()
        .filter_map(|c| crate::etcd_member::tls::serial_of(c.cert.as_bytes()))
        .collect();
    crate::etcd_member::revocation::update(etcd, keys, node, |r| r.issue(serials.clone()))
        .await
        .context("recording the new certificates")?;
    tls.write(&ca, &certs)?;
    etcd.reload_tls()
        .await
        .context("presenting the new client certificate to etcd")?;
    // Only now that nothing here presents them: the earlier ones stop opening etcd (a failure here is
    // tried again with the whole renewal).
    crate::etcd_member::revocation::update(etcd, keys, node, |r| r.supersede_all_but(&serials))
        .await
        .context("superseding the earlier certificates")?;
    Ok(())
}

/// How long a failed renewal waits before the next try.
const RETRY: Duration = Duration::from_secs(30);

/// When the certificates in `tls` are due for renewal: now while the client certificate is not from the
/// node CA (an earlier version's worker, whose certificates open etcd), else two thirds into the life of
/// the one that expires first.
pub fn renewal_due(tls: &TlsDir) -> SystemTime {
    if !tls.client_from_node_ca() {
        return SystemTime::now();
    }
    [CertRole::Server, CertRole::Client]
        .iter()
        .filter_map(|r| renew_at(&std::fs::read(tls.cert(*r)).ok()?))
        .min()
        .unwrap_or_else(SystemTime::now)
}

/// Asks a voter for new certificates for a new key, writes them, and presents them from then on.
pub async fn renew_once(api: &NodeApiClient, tls: &TlsDir, node: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let server = std::fs::read_to_string(tls.cert(CertRole::Server))
        .with_context(|| format!("reading {}", tls.cert(CertRole::Server).display()))?;
    let sans = cert_sans(&server).context("the names of the server certificate")?;
    let key = NodeKey::generate()?;
    let retire = [CertRole::Server, CertRole::Peer, CertRole::Client]
        .iter()
        .filter_map(|r| std::fs::read_to_string(tls.cert(*r)).ok())
        .collect();
    let req = RenewRequest {
        csr: key.request(node)?,
        sans,
        retire,
    };
    let answer: RenewResponse = api
        .post_json(routes::NODE_CERTIFICATES.path, &req)
        .await
        .context("asking the voters for new certificates")?;
    let ca = std::fs::read_to_string(tls.ca_cert())
        .with_context(|| format!("reading {}", tls.ca_cert().display()))?;
    tls.write_worker(&ca, Some(&answer.node_ca), &key.with(answer.certs))?;
    api.reload(&crate::etcd_member::bootstrap::client_tls_files(tls))?;
    Ok(())
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
