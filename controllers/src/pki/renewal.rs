//! A node's certificates kept fresh, and a worker's server token swapped for a token of its own.
//!
//! A worker asks its voters (`POST /node/v1/certificates`, served by `nodeapi::certs`) for certificates
//! for a new key two thirds into their life, and at once while its client certificate is not from the
//! node CA; a voter issues its own from the cluster CA it holds. Either way the new serials are recorded
//! before they are used and the earlier ones superseded, so that etcd refuses them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_api::{routes, KeyLayout};
use hostlet_runtime::nodeapi::NodeApiClient;
use hostlet_runtime::Etcd;
use serde::{Deserialize, Serialize};

use super::admission::worker_token_parts;
use super::ca::{
    cert_sans, client_tls_files, outlasts, renew_at, serial_of, CertRole, IssuedCerts, NodeKey,
    TlsDir, TlsError,
};
use super::revocation::update_certificates;
use super::token::ClusterToken;

/// The body of `POST /node/v1/certificates` (its route is `nodeapi::certs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RenewRequest {
    pub csr: String,
    pub sans: Vec<String>,
    /// The certificates (PEM) the node holds now: those the cluster CA issued to it are superseded even
    /// if no join recorded them (an earlier version's did not).
    #[serde(default)]
    pub retire: Vec<String>,
}

/// Its answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewResponse {
    pub certs: IssuedCerts,
    pub node_ca: String,
}

/// A worker that keeps the server token (an earlier version's join with it) swaps it for a worker token
/// of its own, through the voters, and writes that over it: the server token, which makes voters, stays
/// on the voters. Tried every 30 s until it is done.
pub async fn drop_server_token(
    api: NodeApiClient,
    token_file: std::path::PathBuf,
    stop: tokio_util::sync::CancellationToken,
) {
    let Some(current) = std::fs::read_to_string(&token_file)
        .ok()
        .and_then(|t| ClusterToken::parse(&t).ok())
    else {
        return;
    };
    if worker_token_parts(&current.secret).is_some() {
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
            Ok(Ok(t)) => match super::ca::write_file(&token_file, &format!("{t}\n"), 0o600) {
                Ok(()) => {
                    tracing::warn!(
                            "this worker kept the server token from its join: replaced it in {} by a worker token of its own",
                            token_file.display()
                        );
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot write the worker's own token"),
            },
            Ok(Err(e)) => tracing::warn!(error = %e, "the voters' token does not parse"),
            Err(e) => tracing::warn!(error = %e, "cannot get a token of this worker's own"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
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
        .filter_map(|c| serial_of(c.cert.as_bytes()))
        .collect();
    update_certificates(etcd, keys, node, |r| r.issue(serials.clone()))
        .await
        .context("recording the new certificates")?;
    off_runtime(tls, move |tls| tls.write(&ca, &certs)).await?;
    etcd.reload_tls()
        .await
        .context("presenting the new client certificate to etcd")?;
    // Only now that nothing here presents them: the earlier ones stop opening etcd (a failure here is
    // tried again with the whole renewal).
    update_certificates(etcd, keys, node, |r| r.supersede_all_but(&serials))
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
    let certs = key.with(answer.certs);
    off_runtime(tls, move |tls| {
        tls.write_worker(&ca, Some(&answer.node_ca), &certs)
    })
    .await?;
    api.reload(&client_tls_files(tls))?;
    Ok(())
}

/// Writes the node's files on a blocking thread: each is synced to disk, which on a slow disk would
/// hold up the runtime's other tasks. The renewal waits for the whole write, and so does a stop.
async fn off_runtime(
    tls: &TlsDir,
    write: impl FnOnce(&TlsDir) -> Result<(), TlsError> + Send + 'static,
) -> anyhow::Result<()> {
    let tls = tls.clone();
    tokio::task::spawn_blocking(move || write(&tls)).await??;
    Ok(())
}
