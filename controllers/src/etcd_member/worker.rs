//! A worker: a host that runs no etcd member. It joins through the same endpoints as a member (the token
//! verifies the server, `POST /db/join` issues certificates for the worker's own key; no CA key), then
//! reaches the cluster through the voters' node API only, following the voters' node records
//! (`db/voters` keeps their API URLs for a restart). Without TLS (`--etcd-insecure`) no caller can be
//! told apart, so such a worker talks to the voters' etcd (`db/endpoints`).
//! `<data-dir>/db/worker` marks the data dir as a worker's, so that a restart without `--server` connects
//! again instead of founding a new cluster.

use std::path::PathBuf;

use hostlet_runtime::nodeapi::NodeApiClient;
use hostlet_runtime::{ClusterClient, Etcd, EtcdConfig, TlsFiles};
use tokio_util::sync::CancellationToken;

use super::bootstrap::{read_endpoints, write_endpoints};
use super::join::{DbInfo, JoinClient, JoinRequest};
use super::layout::MemberLayout;
use super::{MemberConfig, MemberError};
use crate::pki::{
    client_tls_files, fingerprint_pem, node_sans, write_file, ClusterToken, NodeKey, TlsError,
    TokenError,
};

/// How a host takes part in the etcd cluster (`--role`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JoinRole {
    /// A member while the voter target wants one (or the leader asks), else a worker.
    #[default]
    Auto,
    /// Always a member.
    Voter,
    /// Never a member.
    Worker,
}

/// A worker's connection to the cluster.
#[derive(Debug, Clone)]
pub struct WorkerStart {
    /// The agent's client: the voters' node API (etcd without TLS).
    pub client: ClusterClient,
    pub token: ClusterToken,
    /// The client certificate (`None` under `--etcd-insecure`).
    pub tls: Option<TlsFiles>,
    pub layout: MemberLayout,
}

/// The marker of a worker's data dir.
pub fn marker(layout: &MemberLayout) -> PathBuf {
    layout.db_dir().join("worker")
}

/// The voters' API URLs a worker last followed.
pub fn voters_file(layout: &MemberLayout) -> PathBuf {
    layout.db_dir().join("voters")
}

pub fn read_voters(layout: &MemberLayout) -> Vec<String> {
    super::bootstrap::read_urls(&voters_file(layout))
}

pub fn write_voters(layout: &MemberLayout, urls: &[String]) {
    super::bootstrap::write_urls(&voters_file(layout), urls, "the voters' API URLs");
}

/// The server a worker joined through, from its marker.
fn joined_through(layout: &MemberLayout) -> Option<String> {
    std::fs::read_to_string(marker(layout))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether this data dir belongs to a worker (and holds no member).
pub fn is_worker(layout: &MemberLayout) -> bool {
    marker(layout).exists() && !layout.is_initialized()
}

/// Removes the worker marker: the host runs a member now.
pub fn clear_marker(layout: &MemberLayout) {
    if let Err(e) = std::fs::remove_file(marker(layout)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %e, "cannot remove {}", marker(layout).display());
        }
    }
}

fn tls_err(e: TlsError) -> MemberError {
    MemberError::Tls(e)
}

/// Whether a join through `server` makes this host a member: `--role voter` always, `--role worker`
/// never, `auto` as the server's answer says (the leader asked for this node, or the members are fewer
/// than the voter target). An unanswered question is an error, not a guess.
pub async fn joins_as_member(
    cfg: &MemberConfig,
    server: &str,
    shutdown: &CancellationToken,
) -> Result<bool, MemberError> {
    match cfg.role {
        JoinRole::Voter => return Ok(true),
        JoinRole::Worker => return Ok(false),
        JoinRole::Auto => {}
    }
    let (_, info) = ask(cfg, server, shutdown).await?;
    let member = info.auto_joins_as_member(&cfg.spec(String::new()).peer_url());
    tracing::info!(
        members = info.members.len(),
        target = ?info.voters_target,
        requested = info.member_requested,
        "joining as {}",
        if member { "an etcd member" } else { "a worker" }
    );
    Ok(member)
}

async fn ask(
    cfg: &MemberConfig,
    server: &str,
    shutdown: &CancellationToken,
) -> Result<(JoinClient, DbInfo), MemberError> {
    let token = cfg
        .flag_token()?
        .ok_or(MemberError::Token(TokenError::Empty))?;
    let client = JoinClient::connect(
        server,
        &token,
        Some(&MemberLayout::new(&cfg.data_dir).tls()),
    )
    .await
    .map_err(MemberError::Join)?;
    let info =
        super::bootstrap::retry_transient(shutdown, || client.db_info_for(&cfg.node_name)).await?;
    Ok((client, info))
}

/// Joins through `server` as a worker: certificates and the CA from the server, the token, the voters'
/// client URLs, the marker.
pub async fn join_as_worker(
    cfg: &MemberConfig,
    server: &str,
    shutdown: &CancellationToken,
) -> Result<WorkerStart, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let (client, info) = ask(cfg, server, shutdown).await?;
    super::bootstrap::check_same_tls(cfg, server, &info)?;
    std::fs::create_dir_all(layout.db_dir()).map_err(|source| MemberError::Io {
        path: layout.db_dir(),
        source,
    })?;
    let token = cfg
        .flag_token()?
        .ok_or(MemberError::Token(TokenError::Empty))?;
    let mut own_token = None;
    let ca_cert = if cfg.insecure {
        None
    } else {
        // The key stays here: the join sends a request for it and gets certificates, never a key.
        let key = NodeKey::generate().map_err(tls_err)?;
        let req = JoinRequest {
            node: cfg.node_name.clone(),
            sans: node_sans(&cfg.advertise_address, &cfg.hostname, &cfg.extra_sans),
            member: false,
            csr: key.request(&cfg.node_name).map_err(tls_err)?,
        };
        let answer = super::bootstrap::retry_transient(shutdown, || client.join(&req)).await?;
        layout
            .tls()
            .write_worker(
                &answer.ca.cert,
                answer.node_ca.as_deref(),
                &key.with(answer.certs),
            )
            .map_err(tls_err)?;
        own_token = answer.token;
        Some(answer.ca.cert)
    };
    // Joined with the server token: the server handed a token of this node's own to keep instead.
    let secret = match own_token.as_deref().map(ClusterToken::parse) {
        Some(Ok(t)) => t.secret,
        Some(Err(e)) => return Err(MemberError::Token(e)),
        None => token.secret,
    };
    let token = ClusterToken {
        ca_fingerprint: ca_cert
            .as_deref()
            .map(fingerprint_pem)
            .transpose()
            .map_err(tls_err)?,
        secret,
    };
    write_file(&layout.token_file(), &format!("{token}\n"), 0o600).map_err(tls_err)?;
    let voters: Vec<String> = info
        .members
        .iter()
        .filter(|m| !m.is_learner && !m.name.is_empty())
        .flat_map(|m| m.client_urls.iter().cloned())
        .collect();
    if voters.is_empty() {
        return Err(MemberError::Inconsistent(format!(
            "{server} lists no serving voter to talk to"
        )));
    }
    write_endpoints(&layout, &voters);
    write_voters(&layout, &[server.to_string()]);
    write_file(&marker(&layout), &format!("{server}\n"), 0o644).map_err(tls_err)?;
    connect(cfg, &layout, voters, vec![server.to_string()], token).await
}

/// Starts an existing worker again: the token, certificates and voters' URLs of its data dir.
pub async fn restart_worker(cfg: &MemberConfig) -> Result<WorkerStart, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let token_file = layout.token_file();
    let token = std::fs::read_to_string(&token_file)
        .map_err(|source| MemberError::Io {
            path: token_file.clone(),
            source,
        })
        .and_then(|t| ClusterToken::parse(&t).map_err(MemberError::Token))?;
    let endpoints = read_endpoints(&layout);
    // A data dir from before workers used the node API has no db/voters: the server it joined through is
    // a voter's API.
    let mut voters = read_voters(&layout);
    if voters.is_empty() {
        voters.extend(joined_through(&layout));
    }
    let (known, file) = if cfg.insecure {
        (&endpoints, "db/endpoints")
    } else {
        (&voters, "db/voters")
    };
    if known.is_empty() {
        return Err(MemberError::Inconsistent(format!(
            "this worker's data dir {} has no voter URLs in {file}: start it with --server <url of a running hostlet> --token <token>",
            cfg.data_dir.display()
        )));
    }
    let dropped = drop_keys(&layout)?;
    if !dropped.is_empty() {
        tracing::warn!(
            "this worker's data dir held {} from an earlier version's join: deleted (a worker holds no CA key, and its voters open the secrets its pods use)",
            dropped.join(" and ")
        );
    }
    connect(cfg, &layout, endpoints, voters, token).await
}

/// A worker's data dir from a version whose joins handed every node the CA key, or later the root of
/// the secret keys: both go. Which there were.
fn drop_keys(layout: &MemberLayout) -> Result<Vec<&'static str>, MemberError> {
    let tls = layout.tls();
    let mut dropped = Vec::new();
    for (path, what) in [
        (tls.ca_key(), "the cluster CA key"),
        (tls.secrets_root(), "the root of the secret keys"),
    ] {
        match std::fs::remove_file(&path) {
            Ok(()) => dropped.push(what),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(MemberError::Io { path, source }),
        }
    }
    Ok(dropped)
}

/// The worker's client: the node API of `voters` with its client certificate, or without TLS the etcd
/// of `endpoints`.
async fn connect(
    cfg: &MemberConfig,
    layout: &MemberLayout,
    endpoints: Vec<String>,
    voters: Vec<String>,
    token: ClusterToken,
) -> Result<WorkerStart, MemberError> {
    let tls = (!cfg.insecure).then(|| client_tls_files(&layout.tls()));
    let client = match &tls {
        Some(files) => ClusterClient::NodeApi(
            NodeApiClient::from_files(files, voters).map_err(|e| MemberError::Etcd(Box::new(e)))?,
        ),
        None => ClusterClient::Etcd(
            Etcd::connect(EtcdConfig::new(endpoints))
                .await
                .map_err(|e| MemberError::Etcd(Box::new(e)))?,
        ),
    };
    Ok(WorkerStart {
        client,
        token,
        tls,
        layout: layout.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlet_runtime::Member;

    #[test]
    fn a_worker_from_before_drops_the_ca_key_and_the_secret_root() {
        use crate::pki::ClusterCa;
        let dir = tempfile::tempdir().unwrap();
        let layout = MemberLayout::new(dir.path());
        assert!(drop_keys(&layout).unwrap().is_empty(), "nothing to drop");
        let ca = ClusterCa::generate().unwrap();
        let tls = layout.tls();
        tls.write(
            &ca,
            &ca.issue_node("w1", &["127.0.0.1".to_string()]).unwrap(),
        )
        .unwrap();
        std::fs::write(tls.secrets_root(), "root\n").unwrap();
        assert_eq!(
            drop_keys(&layout).unwrap(),
            vec!["the cluster CA key", "the root of the secret keys"]
        );
        assert!(!tls.ca_key().exists() && !tls.secrets_root().exists() && tls.is_complete());
        assert!(drop_keys(&layout).unwrap().is_empty(), "once");
    }

    fn info(members: usize, target: Option<u8>, requested: bool) -> DbInfo {
        DbInfo {
            members: (0..members)
                .map(|i| Member {
                    id: i as u64,
                    name: format!("m{i}"),
                    peer_urls: vec![format!("https://10.0.0.{i}:2380")],
                    client_urls: vec![],
                    is_learner: false,
                })
                .collect(),
            tls: false,
            voters_target: target,
            member_requested: requested,
            worker_only: false,
        }
    }

    #[test]
    fn auto_joins_as_member_below_the_target_or_when_asked() {
        let me = "https://10.0.0.9:2380";
        assert!(info(1, Some(3), false).auto_joins_as_member(me));
        assert!(info(2, None, false).auto_joins_as_member(me));
        assert!(!info(3, None, false).auto_joins_as_member(me));
        assert!(!info(3, Some(3), false).auto_joins_as_member(me));
        assert!(info(3, Some(5), false).auto_joins_as_member(me));
        assert!(info(3, Some(3), true).auto_joins_as_member(me));
        // A worker token: a worker, below the target too, unless the leader asked for this node.
        let worker_only = |requested| DbInfo {
            worker_only: true,
            ..info(1, Some(3), requested)
        };
        assert!(!worker_only(false).auto_joins_as_member(me));
        assert!(worker_only(true).auto_joins_as_member(me));
        assert!(!info(1, Some(1), false).auto_joins_as_member(me));
    }

    #[test]
    fn a_member_with_this_nodes_peer_url_is_this_node_not_another_voter() {
        // Three members, the third of them this node's own (a join cut short, or its tombstoned self):
        // the join goes on as a member.
        let i = info(3, Some(3), false);
        assert!(i.auto_joins_as_member("https://10.0.0.2:2380"));
        assert!(!i.auto_joins_as_member("https://10.0.0.7:2380"));
    }
}
