//! Deciding how the member comes up and preparing its files: checks made before anything is created, then
//! a restart of an initialized member, a new cluster, or a join as learner through another node's API.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hostlet_runtime::{Etcd, EtcdConfig, EtcdError, ExponentialBackoff};
use tokio_util::sync::CancellationToken;

use super::join::{DbInfo, JoinClient, JoinError, JoinRequest};
use super::layout::{new_member_name, MemberLayout};
use super::process::{resolve_binary, ClusterStart, MemberSpec};
use super::{MemberConfig, MemberError};
use crate::pki::{
    client_tls_files, node_sans, write_file, ClusterCa, ClusterToken, NodeKey, TlsError, TokenError,
};

/// How this start goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// The WAL is there: etcd starts with the member's existing configuration.
    Restart,
    /// No member yet and no `--server`: the first node of a new cluster.
    NewCluster,
    /// No member yet, `--server` given: join that cluster as a learner.
    Join { server: String },
}

/// The decision, from the state on disk and the flags. A `--server` given to an initialized member is
/// ignored: the member knows its cluster.
pub fn decide(initialized: bool, server: Option<&str>) -> Bootstrap {
    match (initialized, server) {
        (true, _) => Bootstrap::Restart,
        (false, None) => Bootstrap::NewCluster,
        (false, Some(s)) => Bootstrap::Join {
            server: s.to_string(),
        },
    }
}

/// Checks that need no side effect and catch the usual mistakes before anything is created: the etcd
/// binary, the ports, the data dir. Returns the resolved etcd binary.
pub fn preflight(cfg: &MemberConfig) -> Result<PathBuf, MemberError> {
    let binary = resolve_binary(&cfg.etcd_binary).ok_or_else(|| MemberError::BinaryMissing {
        binary: cfg.etcd_binary.clone(),
    })?;
    check_port_free(
        "etcd client port (--etcd-client-port)",
        "127.0.0.1",
        cfg.client_port,
    )?;
    if cfg.advertise_address != "127.0.0.1" {
        check_port_free(
            "etcd client port (--etcd-client-port)",
            &cfg.advertise_address,
            cfg.client_port,
        )?;
    }
    check_port_free(
        "etcd peer port (--etcd-peer-port)",
        &cfg.advertise_address,
        cfg.peer_port,
    )?;
    check_writable(&cfg.data_dir)?;
    Ok(binary)
}

fn check_port_free(what: &'static str, host: &str, port: u16) -> Result<(), MemberError> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    match TcpListener::bind(&addr) {
        Ok(l) => {
            drop(l);
            Ok(())
        }
        Err(source) => Err(MemberError::PortUnavailable { what, addr, source }),
    }
}

/// The data dir, or the closest ancestor that exists, must be a directory we can write in. Probed with a
/// temporary file that is removed at once: the data dir itself is not created here.
fn check_writable(data_dir: &Path) -> Result<(), MemberError> {
    let unwritable = |source: std::io::Error| MemberError::DataDirUnwritable {
        path: data_dir.to_path_buf(),
        source,
    };
    let mut dir = data_dir.to_path_buf();
    loop {
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(unwritable(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", dir.display()),
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => dir = p.to_path_buf(),
                _ => return Err(unwritable(e)),
            },
            Err(e) => return Err(unwritable(e)),
        }
    }
    let probe = dir.join(format!(".hostlet-write-test-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(unwritable)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Everything etcd needs to start, once the files are in place.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub spec: MemberSpec,
    pub start: ClusterStart,
    pub token: ClusterToken,
    pub ca: Option<ClusterCa>,
    /// Client URLs of the other members known at start (a learner's agent talks to them).
    pub cluster_client_urls: Vec<String>,
    /// The member id when this start added the member (join), for cleanup if etcd never serves.
    pub added_member: Option<(u64, Etcd)>,
    /// Paths this start created, removed again if it fails before etcd serves.
    pub created: Vec<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MemberError + '_ {
    move |source| MemberError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn tls_err(e: TlsError) -> MemberError {
    MemberError::Tls(e)
}

/// Creates `dir` (and its parents) with mode 0700 for the dirs it creates; records the topmost one created.
fn create_private_dir(dir: &Path, created: &mut Vec<PathBuf>) -> Result<(), MemberError> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut d = dir.to_path_buf();
    while !d.exists() {
        missing.push(d.clone());
        match d.parent() {
            Some(p) => d = p.to_path_buf(),
            None => break,
        }
    }
    if let Some(top) = missing.last() {
        created.push(top.clone());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
}

impl MemberConfig {
    pub(crate) fn spec(&self, name: String) -> MemberSpec {
        let layout = MemberLayout::new(&self.data_dir);
        MemberSpec {
            name,
            data_dir: layout.member_dir(),
            advertise: self.advertise_address.clone(),
            client_port: self.client_port,
            peer_port: self.peer_port,
            tls: (!self.insecure).then(|| layout.tls()),
        }
    }

    fn sans(&self) -> Vec<String> {
        node_sans(&self.advertise_address, &self.hostname, &self.extra_sans)
    }

    pub(crate) fn flag_token(&self) -> Result<Option<ClusterToken>, MemberError> {
        self.token
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .map(ClusterToken::parse)
            .transpose()
            .map_err(MemberError::Token)
    }
}

/// A restart: the name, TLS material and token are already on disk.
pub fn prepare_restart(cfg: &MemberConfig) -> Result<Prepared, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let name = layout.read_name().ok_or_else(|| {
        MemberError::Inconsistent(format!(
            "{} holds an etcd member but its name file {} is missing or empty",
            layout.member_dir().display(),
            layout.name_file().display()
        ))
    })?;
    let tls = layout.tls();
    let ca = if cfg.insecure {
        None
    } else {
        if !tls.is_complete() {
            return Err(MemberError::Inconsistent(format!(
                "the member in {} has no TLS material in {} (was it created with --etcd-insecure? then start it with --etcd-insecure)",
                layout.member_dir().display(),
                tls.dir.display()
            )));
        }
        let ca = tls.load_ca().map_err(tls_err)?;
        // A member of an earlier version has no node CA certificate yet.
        tls.ensure_node_ca(&ca).map_err(tls_err)?;
        let missing = tls
            .refresh_node_certs(&ca, &cfg.node_name, &cfg.sans(), Some(cfg.cert_lifetime))
            .map_err(tls_err)?;
        if !missing.is_empty() {
            tracing::info!(
                ?missing,
                "the node's certificates did not name every address it has now: issued new ones"
            );
        }
        Some(ca)
    };
    let token = match std::fs::read_to_string(layout.token_file()) {
        Ok(s) => ClusterToken::parse(&s).map_err(MemberError::Token)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // An older data dir: mint a token bound to the CA so the node can admit joiners again.
            let t = match cfg.flag_token()? {
                Some(t) => bind_to_ca(t, ca.as_ref())?,
                None => ClusterToken::generate(fingerprint(ca.as_ref())?),
            };
            write_file(&layout.token_file(), &format!("{t}\n"), 0o600).map_err(tls_err)?;
            t
        }
        Err(e) => return Err(io(&layout.token_file())(e)),
    };
    Ok(Prepared {
        spec: cfg.spec(name),
        start: ClusterStart::Existing,
        token,
        ca,
        cluster_client_urls: read_endpoints(&layout),
        added_member: None,
        created: Vec::new(),
    })
}

fn fingerprint(ca: Option<&ClusterCa>) -> Result<Option<String>, MemberError> {
    ca.map(|c| c.fingerprint()).transpose().map_err(tls_err)
}

/// A `--token` given to the first node is its secret; the CA fingerprint is added to it.
fn bind_to_ca(t: ClusterToken, ca: Option<&ClusterCa>) -> Result<ClusterToken, MemberError> {
    let fp = fingerprint(ca)?;
    if let (Some(given), Some(real)) = (&t.ca_fingerprint, &fp) {
        if given != real {
            return Err(MemberError::Token(TokenError::Malformed));
        }
    }
    Ok(ClusterToken {
        ca_fingerprint: fp,
        secret: t.secret,
    })
}

/// A new cluster CA and this node's certificates, written (nothing with `--etcd-insecure`).
fn new_ca(
    cfg: &MemberConfig,
    layout: &MemberLayout,
    created: &mut Vec<PathBuf>,
) -> Result<Option<ClusterCa>, MemberError> {
    if cfg.insecure {
        return Ok(None);
    }
    let ca = ClusterCa::generate().map_err(tls_err)?;
    let certs = ca
        .issue_node_lasting(&cfg.node_name, &cfg.sans(), Some(cfg.cert_lifetime))
        .map_err(tls_err)?;
    let tls = layout.tls();
    if !tls.dir.exists() {
        created.push(tls.dir.clone());
    }
    tls.write(&ca, &certs).map_err(tls_err)?;
    Ok(Some(ca))
}

/// The first node: a new CA (unless insecure), certificates, the token, the name.
pub fn prepare_new_cluster(cfg: &MemberConfig) -> Result<Prepared, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let mut created = Vec::new();
    let result = (|| {
        create_private_dir(&layout.member_dir(), &mut created)?;
        let ca = new_ca(cfg, &layout, &mut created)?;
        let token = match cfg.flag_token()? {
            Some(t) => bind_to_ca(t, ca.as_ref())?,
            None => ClusterToken::generate(fingerprint(ca.as_ref())?),
        };
        if !layout.token_file().exists() {
            created.push(layout.token_file());
        }
        write_file(&layout.token_file(), &format!("{token}\n"), 0o600).map_err(tls_err)?;
        let name = layout
            .read_name()
            .unwrap_or_else(|| new_member_name(&cfg.hostname));
        write_file(&layout.name_file(), &format!("{name}\n"), 0o600).map_err(tls_err)?;
        let mut b = [0u8; 4];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
        Ok(Prepared {
            spec: cfg.spec(name),
            start: ClusterStart::New {
                cluster_token: format!("hostlet-{}", hex::encode(b)),
            },
            token,
            ca,
            cluster_client_urls: Vec::new(),
            added_member: None,
            created: created.clone(),
        })
    })();
    if result.is_err() {
        remove_created(&created);
    }
    result
}

/// A fresh host (no TLS material, no token) about to reset a lost cluster from a snapshot: its own CA and
/// certificates, and the token. `--token`'s secret is kept but bound to the new CA, since the old CA went
/// with the old hosts; without `--token` a new one is made. Returns what it created, for
/// [`remove_created`] when the reset is refused.
pub fn prepare_fresh_reset(cfg: &MemberConfig) -> Result<Vec<PathBuf>, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let mut created = Vec::new();
    let result = (|| {
        create_private_dir(&cfg.data_dir, &mut created)?;
        let ca = new_ca(cfg, &layout, &mut created)?;
        let fp = fingerprint(ca.as_ref())?;
        let token = match cfg.flag_token()? {
            Some(t) => ClusterToken {
                ca_fingerprint: fp,
                secret: t.secret,
            },
            None => ClusterToken::generate(fp),
        };
        created.push(layout.token_file());
        write_file(&layout.token_file(), &format!("{token}\n"), 0o600).map_err(tls_err)?;
        Ok(())
    })();
    if let Err(e) = result {
        remove_created(&created);
        return Err(e);
    }
    Ok(created)
}

/// Removes what a failed start created (newest first).
pub fn remove_created(created: &[PathBuf]) {
    for p in created.iter().rev() {
        let r = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
        if let Err(e) = r {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove after a failed start");
            }
        }
    }
}

/// Backoff between attempts to add this member: every second for the first ten tries (etcd refuses new
/// members for 5 s after any member (re)connects — "unhealthy cluster" — and that clears soon), then doubling
/// to 30 s.
fn add_backoff(attempt: u32) -> Duration {
    ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30))
        .with_steady_start(10)
        .delay_for(attempt.saturating_sub(1))
}

/// Whether etcd's refusal of a membership change is worth waiting out.
pub(crate) fn add_is_retryable(e: &EtcdError) -> bool {
    if e.is_unavailable() {
        return true;
    }
    let msg = e.server_message().unwrap_or_default();
    msg.contains("too many learner")
        || msg.contains("unhealthy cluster")
        || msg.contains("no leader")
        || msg.contains("not enough started members")
        || msg.contains("timed out")
        // Seen right after this node's old member was removed: the membership change is still settling.
        || msg.contains("member not found")
}

/// A joiner: verify the server against the token, read the members, receive certificates, add this node as
/// a learner (retrying what etcd asks to wait out), and start with the existing cluster.
///
/// `previous_name` is the name of this node's member before a tombstone backed it up: a member of that name
/// with this node's peer URL is this node's old self, and is removed before the new one is added.
pub async fn prepare_join(
    cfg: &MemberConfig,
    server: &str,
    previous_name: Option<&str>,
    shutdown: &CancellationToken,
) -> Result<Prepared, MemberError> {
    let layout = MemberLayout::new(&cfg.data_dir);
    let token = cfg
        .flag_token()?
        .ok_or(MemberError::Token(TokenError::Empty))?;
    if !cfg.insecure && !server.starts_with("https://") {
        return Err(MemberError::Inconsistent(format!(
            "--server {server} is plain HTTP but this node uses TLS: give the https:// URL of the server, or run every node with --etcd-insecure"
        )));
    }
    let client = JoinClient::connect(server, &token, Some(&layout.tls()))
        .await
        .map_err(MemberError::Join)?;
    // Nothing is created before the server accepted the token.
    let info = retry_transient(shutdown, || client.db_info_for(&cfg.node_name)).await?;
    check_same_tls(cfg, server, &info)?;
    let name = layout
        .read_name()
        .unwrap_or_else(|| new_member_name(&cfg.hostname));
    let spec = cfg.spec(name.clone());
    let peer_url = spec.peer_url();
    let mut old_self = None;
    if let Some(m) = info
        .members
        .iter()
        .find(|m| m.peer_urls.contains(&peer_url) && !m.name.is_empty() && m.name != name)
    {
        if previous_name == Some(m.name.as_str()) {
            old_self = Some(m.id);
        } else {
            return Err(MemberError::Inconsistent(format!(
                "the cluster already has a member {:?} (id {:x}) with this node's peer URL {peer_url}: remove it first (etcdctl member remove {:x})",
                m.name, m.id, m.id
            )));
        }
    }
    let mut created = Vec::new();
    let mut server_token: Option<ClusterToken> = None;
    let result = async {
        create_private_dir(&layout.member_dir(), &mut created)?;
        let ca = if cfg.insecure {
            None
        } else {
            let key = NodeKey::generate().map_err(tls_err)?;
            let req = JoinRequest {
                node: cfg.node_name.clone(),
                sans: cfg.sans(),
                member: true,
                csr: key.request(&cfg.node_name).map_err(tls_err)?,
            };
            let answer = retry_transient(shutdown, || client.join(&req)).await?;
            // The server token, which a member keeps: the joiner may have come with a worker token.
            if let Some(t) = answer.token.as_deref() {
                server_token = Some(ClusterToken::parse(t).map_err(MemberError::Token)?);
            }
            let ca = answer.ca.cluster_ca().ok_or_else(|| {
                MemberError::Inconsistent(format!(
                    "{server} handed over no CA key to a joining member: is it a worker? join through a voter"
                ))
            })?;
            let tls = layout.tls();
            if !tls.dir.exists() {
                created.push(tls.dir.clone());
            }
            tls.write(&ca, &key.with(answer.certs)).map_err(tls_err)?;
            Some(ca)
        };
        let token = ClusterToken {
            ca_fingerprint: fingerprint(ca.as_ref())?,
            secret: server_token
                .as_ref()
                .map_or_else(|| token.secret.clone(), |t| t.secret.clone()),
        };
        if !layout.token_file().exists() {
            created.push(layout.token_file());
        }
        write_file(&layout.token_file(), &format!("{token}\n"), 0o600).map_err(tls_err)?;
        write_file(&layout.name_file(), &format!("{name}\n"), 0o600).map_err(tls_err)?;

        let voters: Vec<String> = info
            .members
            .iter()
            .filter(|m| old_self != Some(m.id))
            .filter(|m| !m.is_learner && !m.name.is_empty())
            .flat_map(|m| m.client_urls.iter().cloned())
            .collect();
        let mut etcd_cfg = EtcdConfig::new(voters.clone());
        if ca.is_some() {
            etcd_cfg = etcd_cfg.with_tls(client_tls_files(&layout.tls()));
        }
        let etcd = Etcd::connect(etcd_cfg).await.map_err(MemberError::etcd)?;
        if let Some(id) = old_self {
            remove_old_self(&etcd, id, shutdown).await?;
        }
        let member = add_learner(&etcd, &peer_url, shutdown).await?;
        crate::learners::record_learner_added(
            &etcd,
            &hostlet_api::KeyLayout::new(&cfg.key_prefix),
            member.id(),
            std::time::SystemTime::now(),
        )
        .await;
        let members = etcd.member_list().await.map_err(MemberError::etcd)?;
        let mut initial_cluster = Vec::new();
        for m in &members {
            let n = if m.id() == member.id() {
                name.clone()
            } else if m.name().is_empty() {
                // Another member added but not started: any name will do, etcd matches on peer URLs.
                format!("unstarted-{:x}", m.id())
            } else {
                m.name().to_string()
            };
            for u in m.peer_urls() {
                initial_cluster.push((n.clone(), u.clone()));
            }
        }
        tracing::info!(member = %name, id = %format!("{:x}", member.id()), "added as learner");
        let all_client_urls = members
            .iter()
            .filter(|m| !m.is_learner())
            .flat_map(|m| m.client_urls().to_vec())
            .collect();
        Ok(Prepared {
            spec: spec.clone(),
            start: ClusterStart::Join { initial_cluster },
            token,
            ca,
            cluster_client_urls: all_client_urls,
            added_member: Some((member.id(), etcd)),
            created: created.clone(),
        })
    }
    .await;
    if result.is_err() {
        remove_created(&created);
    }
    result
}

/// Removes this node's tombstoned member, retrying what etcd asks to wait out ("unhealthy cluster" right
/// after a member (re)connects).
async fn remove_old_self(
    etcd: &Etcd,
    id: u64,
    shutdown: &CancellationToken,
) -> Result<(), MemberError> {
    let mut attempt = 0u32;
    loop {
        match etcd.member_remove(id).await {
            Ok(_) => {
                tracing::info!(id = %format!("{id:x}"), "removed this node's tombstoned member");
                return Ok(());
            }
            Err(e)
                if e.server_message()
                    .is_some_and(|m| m.contains("member not found")) =>
            {
                return Ok(())
            }
            Err(e) if add_is_retryable(&e) && attempt < 60 => {
                attempt += 1;
                tracing::warn!(error = %e, "cannot remove this node's tombstoned member yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(add_backoff(attempt)) => {}
                    _ = shutdown.cancelled() => return Err(MemberError::Cancelled),
                }
            }
            Err(e) => return Err(MemberError::etcd(e)),
        }
    }
}

pub(crate) async fn retry_transient<T, F, Fut>(
    shutdown: &CancellationToken,
    mut op: F,
) -> Result<T, MemberError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, JoinError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && attempt < 5 => {
                tracing::warn!(error = %crate::error_chain(&e), "join request failed; retrying");
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(add_backoff(attempt)) => {}
                    _ = shutdown.cancelled() => return Err(MemberError::Cancelled),
                }
            }
            Err(e) => return Err(MemberError::Join(e)),
        }
    }
}

/// Adds this node as a learner, or finds it added already by an earlier attempt (an unstarted member —
/// empty name — with our peer URL).
async fn add_learner(
    etcd: &Etcd,
    peer_url: &str,
    shutdown: &CancellationToken,
) -> Result<etcd_client::Member, MemberError> {
    let mut attempt = 0u32;
    loop {
        let existing = match etcd.member_list().await {
            Ok(members) => members
                .into_iter()
                .find(|m| m.peer_urls().iter().any(|u| u == peer_url)),
            Err(e) if add_is_retryable(&e) => None,
            Err(e) => return Err(MemberError::etcd(e)),
        };
        if let Some(m) = existing {
            tracing::info!(id = %format!("{:x}", m.id()), "found this node's member from an earlier attempt");
            return Ok(m);
        }
        match etcd.member_add_as_learner(&[peer_url.to_string()]).await {
            Ok(m) => return Ok(m),
            Err(e) if !add_is_retryable(&e) => {
                tracing::error!(error = %e, %peer_url, "etcd refused to add this node as a learner");
                return Err(MemberError::etcd(e));
            }
            Err(e) if add_is_retryable(&e) => {
                attempt += 1;
                let wait = add_backoff(attempt);
                tracing::warn!(error = %e, ?wait, "cannot add this node as a learner yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return Err(MemberError::Cancelled),
                }
            }
            Err(e) => return Err(MemberError::etcd(e)),
        }
    }
}

/// `<data-dir>/db/endpoints`: the cluster's client URLs, one a line, the local member first. Kept for
/// restarts (a learner's agent needs voters to talk to) and for the CLI.
pub fn endpoints_file(layout: &MemberLayout) -> PathBuf {
    layout.db_dir().join("endpoints")
}

pub fn read_endpoints(layout: &MemberLayout) -> Vec<String> {
    read_urls(&endpoints_file(layout))
}

pub fn write_endpoints(layout: &MemberLayout, urls: &[String]) {
    write_urls(&endpoints_file(layout), urls, "the cluster endpoints");
}

/// The URLs in `path`, one a line (none when it cannot be read).
pub(crate) fn read_urls(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| {
            s.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `urls` to `path`, one a line; a failure is logged as not recording `what`.
pub(crate) fn write_urls(path: &std::path::Path, urls: &[String], what: &str) {
    let body: String = urls.iter().map(|u| format!("{u}\n")).collect();
    if let Err(e) = write_file(path, &body, 0o644) {
        tracing::warn!(error = %crate::error_chain(&e), "cannot record {what}");
    }
}

/// A node joins only a cluster that uses TLS as it does.
pub(crate) fn check_same_tls(
    cfg: &MemberConfig,
    server: &str,
    info: &DbInfo,
) -> Result<(), MemberError> {
    if cfg.insecure != info.tls {
        return Ok(());
    }
    Err(MemberError::Inconsistent(format!(
        "{server} runs {} but this node was started {}",
        if info.tls {
            "with TLS"
        } else {
            "without TLS (--etcd-insecure)"
        },
        if cfg.insecure {
            "with --etcd-insecure"
        } else {
            "with TLS"
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_follows_the_wal_then_the_server_flag() {
        assert_eq!(decide(true, None), Bootstrap::Restart);
        assert_eq!(decide(true, Some("https://a")), Bootstrap::Restart);
        assert_eq!(decide(false, None), Bootstrap::NewCluster);
        assert_eq!(
            decide(false, Some("https://a")),
            Bootstrap::Join {
                server: "https://a".into()
            }
        );
    }

    #[test]
    fn add_backoff_is_steady_then_grows_to_thirty_seconds() {
        let waits: Vec<u64> = (1..18).map(|a| add_backoff(a).as_secs()).collect();
        assert_eq!(
            waits,
            vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 16, 30, 30, 30]
        );
    }

    #[test]
    fn writability_is_checked_without_creating_the_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("a/b/c");
        check_writable(&target).unwrap();
        assert!(!tmp.path().join("a").exists());
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = crate::error_chain(&check_writable(&file.join("data")).unwrap_err());
        assert!(
            err.to_string().to_lowercase().contains("not a directory"),
            "{err}"
        );
    }

    #[test]
    fn a_taken_port_is_reported() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let err = crate::error_chain(
            &check_port_free("etcd client port", "127.0.0.1", port).unwrap_err(),
        );
        assert!(
            err.to_string().contains("already in use")
                || err.to_string().contains(&port.to_string()),
            "{err}"
        );
    }

    #[test]
    fn created_dirs_are_recorded_from_the_top() {
        let tmp = tempfile::tempdir().unwrap();
        let mut created = Vec::new();
        create_private_dir(&tmp.path().join("x/db/etcd"), &mut created).unwrap();
        assert_eq!(created, vec![tmp.path().join("x")]);
        remove_created(&created);
        assert!(!tmp.path().join("x").exists());
    }
}
