//! The agent's boot: which etcd this host talks through (its own member, started, joined or rejoined as
//! its data dir says; a worker's voters; or an external cluster), what it says on arrival, the node
//! record and its registration, and every controller. `hostlet run` hands it a [`BootConfig`] made from
//! its flags and gets back a [`Running`] agent, whose [`Running::stop`] drains it and says how it ended.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::objects::{ClusterPolicy, NodeInfo, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, ComponentHandle, Etcd, Metrics, Readiness, TlsFiles};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Agent, AgentParts, MemberParts, SnapshotParts};
use crate::disk::DiskPressure;
use crate::etcd_member::{
    self, tls::CertRole, ClusterToken, JoinService, MemberConfig, MemberError, MemberLayout,
    MemberMetrics, StartedMember, WorkerStart,
};
use crate::events::{EventKind, EventRecorder};
use crate::pods::controller::PodControllerConfig;
use crate::tombstone::{self, rejoin::RejoinTarget, Rejoined};
use crate::upkeep::UpkeepConfig;

/// How long the stop waits for the controllers to finish the reconciles they are in, before the member
/// they write through stops: well inside a service manager's 30 s stop timeout, with etcd's own 15 s.
pub const DRAIN: Duration = Duration::from_secs(8);

/// How often the local member's `/version` is asked again: the cluster version moves only when the last
/// member of an upgrade restarts.
const VERSION_INFO_EVERY: Duration = Duration::from_secs(60);

/// Where the cluster's data lives for this host.
pub enum Datastore {
    /// This host's own etcd member, or a worker's voters: the data dir decides.
    Member(Box<MemberConfig>),
    /// An etcd cluster hostlet does not run.
    External {
        endpoints: Vec<String>,
        tls: Option<TlsFiles>,
        /// `--token`, else the data dir's token file.
        token: Option<String>,
    },
}

/// What a member's controllers are set up with, beside the member itself.
pub struct MemberSettings {
    /// Where a rejoin goes, and with which token.
    pub server: Option<String>,
    pub token: Option<String>,
    pub learner_stall_timeout: Duration,
    /// `--voter-replace-after`.
    pub voter_replace_after: Duration,
    pub snapshots: SnapshotParts,
    pub upkeep: UpkeepConfig,
    pub upgrade: crate::upgrade::UpgradeConfig,
}

/// Everything the boot needs, from `hostlet run`'s flags.
pub struct BootConfig {
    pub node: String,
    pub keys: KeyLayout,
    pub data_dir: PathBuf,
    pub datastore: Datastore,
    /// `--etcd-insecure`: no TLS towards etcd, the API in plain HTTP.
    pub insecure: bool,
    /// `--etcd-voters`: seeds the cluster policy unless one exists.
    pub voters: Option<u8>,
    /// `--cert-lifetime`: how long the certificates this node issues to workers last.
    pub cert_lifetime: Duration,
    /// The node record as the flags make it (name, address, role, failure domain); the boot adds the
    /// member's part and the API's URL.
    pub node_info: NodeInfo,
    /// `host:port` the API is reached at (its scheme follows from the TLS the boot finds).
    pub api_host_port: String,
    pub member: MemberSettings,
    pub pods: PodControllerConfig,
    pub metrics: Metrics,
    pub member_metrics: MemberMetrics,
    pub readiness: Readiness,
    /// The readiness component of the node record.
    pub node_ready: ComponentHandle,
    pub disk: DiskPressure,
}

/// Where the API's certificate and key are read again after a worker renewed them, and the record whose
/// change says it did.
#[derive(Clone)]
pub struct ApiTlsReload {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub renewed: tokio::sync::watch::Receiver<NodeInfo>,
}

/// A booted agent: what `hostlet run` serves, and what its stop takes down.
pub struct Running {
    /// etcd, or on a worker the voters' node API.
    pub client: ClusterClient,
    pub events: EventRecorder,
    /// The API's routes: pods, exec/logs, the HTTP manifest source, and a member's join service.
    pub api_routes: axum::Router,
    /// The token the API checks requests against.
    pub token: Option<ClusterToken>,
    /// The API's certificate and key; `None` serves plain HTTP.
    pub api_tls: Option<(Vec<u8>, Vec<u8>)>,
    /// The CA whose client certificates name the API's callers (the cluster CA); `None`: none are asked.
    pub api_client_ca: Option<Vec<u8>>,
    /// A worker's: its renewed certificate is served without a restart.
    pub api_tls_reload: Option<ApiTlsReload>,
    /// Who votes, for the API's callers by certificate (`None` on an agent of an external cluster).
    pub roles: Option<crate::nodeapi::NodeRoles>,
    pub node: String,
    /// Whether the agent talks TLS to etcd.
    pub etcd_tls: bool,
    pub api_url: String,
    /// The local member's client URL first, then the others the client knows.
    pub endpoints: Vec<String>,
    agent: Agent,
    member: Option<StartedMember>,
    worker: Option<WorkerStart>,
    registration: JoinHandle<()>,
    registration_stop: CancellationToken,
    /// Fired once this worker's certificate is revoked (its node deleted): its controllers have stopped.
    pub revoked: CancellationToken,
}

/// How an agent ended.
#[derive(Debug)]
pub enum Ended {
    Stopped,
    /// Start again as a joiner through this node's API: a rejoin, or a worker asked to become a member.
    Rejoin(RejoinTarget),
}

/// How this host arrived, for its events and the tombstone metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival<'a> {
    /// A worker: no local member.
    Worker,
    /// A member; `was_worker` when this data dir was a worker's until now.
    Member { name: &'a str, was_worker: bool },
}

/// A Normal event a start says, with its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrivalEvent {
    /// `Rejoined`: the tombstone that made this start rejoin.
    Rejoined(String),
    /// `JoinedAsWorker`.
    JoinedAsWorker(String),
    /// `BecameMember`: a worker's data dir now runs a member.
    BecameMember(String),
}

impl ArrivalEvent {
    pub fn message(&self) -> &str {
        match self {
            ArrivalEvent::Rejoined(m)
            | ArrivalEvent::JoinedAsWorker(m)
            | ArrivalEvent::BecameMember(m) => m,
        }
    }
}

/// The events a start says, in order: a rejoin (the tombstone that caused it), then how the host takes
/// part. Pure, so every case is a row of a table test.
pub fn arrival_events(arrival: Arrival<'_>, rejoined: Option<&Rejoined>) -> Vec<ArrivalEvent> {
    let mut out = Vec::new();
    if let Some(r) = rejoined {
        let reason = if r.reason.is_empty() {
            "no reason given"
        } else {
            &r.reason
        };
        let how = match arrival {
            Arrival::Worker => "as a worker (the voter target is full)".to_string(),
            Arrival::Member { name, .. } => format!("as member {name}"),
        };
        out.push(ArrivalEvent::Rejoined(format!(
            "tombstone ({reason}): member {} backed up to {}; rejoined through {} {how}",
            r.previous_name.as_deref().unwrap_or("?"),
            r.backup.display(),
            r.server,
        )));
    }
    match arrival {
        Arrival::Worker => out.push(ArrivalEvent::JoinedAsWorker(
            "runs no etcd member; talks to the voters".to_string(),
        )),
        Arrival::Member {
            name,
            was_worker: true,
        } => out.push(ArrivalEvent::BecameMember(format!(
            "this worker started etcd member {name} and joined the cluster"
        ))),
        Arrival::Member { .. } => {}
    }
    out
}

/// Whether a start counts a tombstone: a rejoin this process made (a resumed one was counted by the
/// process that made its backup).
pub fn counts_tombstone(rejoined: Option<&Rejoined>) -> bool {
    rejoined.is_some_and(|r| !r.resumed)
}

/// Boots the agent. `Ok(None)`: asked to stop before the member served (say, while a join waited its
/// turn).
pub async fn boot(
    cfg: BootConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Running>> {
    let BootConfig {
        node,
        keys,
        data_dir,
        datastore,
        insecure,
        voters,
        cert_lifetime,
        mut node_info,
        api_host_port,
        member: settings,
        mut pods,
        metrics,
        member_metrics,
        readiness,
        node_ready,
        disk,
    } = cfg;
    let layout = MemberLayout::new(&data_dir);
    let was_worker = etcd_member::worker::is_worker(&layout);
    let mut member = None;
    let mut worker = None;
    let mut api_routes = axum::Router::new();
    let etcd: ClusterClient;
    let token: Option<ClusterToken>;
    let api_tls: Option<(Vec<u8>, Vec<u8>)>;
    let mut api_client_ca: Option<Vec<u8>> = None;
    let etcd_tls: bool;
    let arrival: Vec<ArrivalEvent>;
    match datastore {
        Datastore::Member(mut mcfg) => {
            mcfg.disk = Some(disk.clone());
            let tm = tombstone::TombstoneMetrics::register(metrics.registry())
                .context("registering the tombstone metrics")?;
            let (started, rejoined) =
                match tombstone::start_member(&mcfg, member_metrics.clone(), &readiness, shutdown)
                    .await
                {
                    Ok(s) => s,
                    Err(tombstone::StartError::Member(MemberError::Cancelled)) => {
                        tracing::info!("stopped before the etcd member served");
                        return Ok(None);
                    }
                    Err(e) => return Err(e.into()),
                };
            if counts_tombstone(rejoined.as_ref()) {
                tm.tombstones_total.inc();
            }
            tm.data_dir_backups
                .set(tombstone::datadir::backups(&layout.db_dir()).len() as i64);
            match started {
                tombstone::Started::Worker(w) => {
                    etcd = w.client.clone();
                    etcd_tls = w.tls.is_some();
                    token = Some(w.token.clone());
                    api_tls = if insecure {
                        None
                    } else {
                        api_client_ca = Some(client_ca(&w.layout)?);
                        Some(server_cert(&w.layout)?)
                    };
                    readiness
                        .register(etcd_member::READINESS_COMPONENT)
                        .set_ready(format!(
                            "worker: no local member; voters {}",
                            etcd.endpoints().join(", ")
                        ));
                    arrival = arrival_events(Arrival::Worker, rejoined.as_ref());
                    worker = Some(w);
                }
                tombstone::Started::Member(started) => {
                    let started = *started;
                    etcd = started.etcd.clone().into();
                    etcd_tls = !insecure;
                    // The member serves after a reset: the reset is done, and a later one on purpose is
                    // allowed.
                    match tombstone::datadir::retire_reset_flag(&layout.db_dir()) {
                        Ok(true) => tracing::info!(
                            "the member serves after a cluster reset: db/reset-flag moved to db/reset-history"
                        ),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot retire db/reset-flag"),
                    }
                    tm.cluster_resets_total
                        .inc_by(tombstone::reset::resets_recorded(&layout.db_dir()));
                    token = Some(started.token.clone());
                    api_tls = if insecure {
                        None
                    } else {
                        api_client_ca = Some(client_ca(&started.layout)?);
                        Some(server_cert(&started.layout)?)
                    };
                    api_routes = api_routes.merge(
                        JoinService::new(
                            started.token.clone(),
                            started.ca.clone(),
                            started.etcd.clone(),
                            keys.clone(),
                            cert_lifetime,
                        )
                        .router(),
                    );
                    tokio::spawn(follow_version_info(
                        member_metrics.clone(),
                        started.member_name.clone(),
                        started.client_url.clone(),
                        (!insecure).then(|| {
                            etcd_member::bootstrap::client_tls_files(&started.layout.tls())
                        }),
                        shutdown.clone(),
                    ));
                    node_info.member_since = member_since(&started.layout);
                    node_info.member_name = Some(started.member_name.clone());
                    node_info.member_id = Some(started.member_id.clone());
                    node_info.peer_url = Some(started.peer_url.clone());
                    node_info.client_url = Some(started.client_url.clone());
                    seed_policy_and_clear_request(&started.etcd, &keys, &node, voters);
                    arrival = arrival_events(
                        Arrival::Member {
                            name: &started.member_name,
                            was_worker,
                        },
                        rejoined.as_ref(),
                    );
                    member = Some(started);
                }
            }
        }
        Datastore::External {
            endpoints,
            tls,
            token: flag_token,
        } => {
            etcd_tls = tls.is_some();
            etcd = etcd_member::connect_external(
                &endpoints,
                tls,
                member_metrics.clone(),
                &readiness,
                shutdown.clone(),
            )
            .await?
            .into();
            token = match flag_token.as_deref().filter(|t| !t.is_empty()) {
                Some(t) => Some(ClusterToken::parse(t).context("--token")?),
                None => std::fs::read_to_string(layout.token_file())
                    .ok()
                    .and_then(|t| ClusterToken::parse(&t).ok()),
            };
            // An external cluster has no CA of ours: serve HTTPS only if this data dir holds node
            // certificates.
            let tls = layout.tls();
            api_tls = match (
                std::fs::read(tls.cert(CertRole::Server)),
                std::fs::read(tls.key(CertRole::Server)),
            ) {
                (Ok(c), Ok(k)) if !insecure => Some((c, k)),
                _ => {
                    tracing::warn!(
                        "no node certificate in {}: the API serves plain HTTP",
                        tls.dir.display()
                    );
                    None
                }
            };
            arrival = Vec::new();
        }
    }
    let mut expiry_gauge = None;
    if api_client_ca.is_some() {
        let expiries = layout.tls().expiries();
        node_info.cert_expires = expiries
            .iter()
            .filter(|(name, _)| *name != "ca")
            .map(|(_, at)| *at)
            .min()
            .map(Timestamp);
        node_info.cert_serials = layout.tls().serials();
        if let Some(m) = &member {
            // A member issues its own certificates (the first node, new addresses): it records them, so
            // that `hostlet node certs` tells them from certificates nobody recorded.
            tokio::spawn(record_own_serials(
                m.etcd.clone(),
                keys.clone(),
                node.clone(),
                node_info.cert_serials.clone(),
                shutdown.clone(),
            ));
        }
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "hostlet_certificate_expiry_timestamp_seconds",
                "When each of this node's certificates expires (unix seconds)",
            ),
            &["certificate"],
        )
        .context("the certificate expiry metric")?;
        metrics
            .registry()
            .register(Box::new(gauge.clone()))
            .context("registering the certificate expiry metric")?;
        for (name, at) in expiries {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            gauge
                .with_label_values(&[name])
                .set(i64::try_from(secs).unwrap_or(i64::MAX));
        }
        expiry_gauge = Some(gauge);
    }
    // A worker holds no secret key: its voters open the secrets its pods use for it.
    let secret_keys = crate::secrets::SecretKeys::for_node(&data_dir, token.as_ref());
    pods.secret_keys = match &etcd {
        ClusterClient::NodeApi(_) => None,
        ClusterClient::Etcd(_) => secret_keys.clone(),
    };
    // The agent's one event recorder: one aggregation and one per-node cap for every concern.
    let events = EventRecorder::new(etcd.clone(), keys.clone(), node.clone());
    {
        let events = events.clone();
        let warnings: Vec<String> = member
            .iter()
            .flat_map(|m| m.version_warnings.iter())
            .map(|w| {
                member_metrics
                    .version_warning
                    .with_label_values(&[w.kind()])
                    .set(1);
                w.to_string()
            })
            .collect();
        tokio::spawn(async move {
            // Each reason written out at its call: the reference's scan finds them there.
            for a in arrival {
                match a {
                    ArrivalEvent::Rejoined(m) => {
                        events.node_event(EventKind::Normal, "Rejoined", m).await
                    }
                    ArrivalEvent::JoinedAsWorker(m) => {
                        events
                            .node_event(EventKind::Normal, "JoinedAsWorker", m)
                            .await
                    }
                    ArrivalEvent::BecameMember(m) => {
                        events
                            .node_event(EventKind::Normal, "BecameMember", m)
                            .await
                    }
                }
            }
            for w in warnings {
                tracing::warn!("{w}");
                events
                    .node_event(EventKind::Warning, "EtcdVersionWarning", w)
                    .await;
            }
        });
    }
    let scheme = if api_tls.is_some() { "https" } else { "http" };
    let api_url = format!("{scheme}://{api_host_port}");
    node_info.api_url = Some(api_url.clone());
    let mut endpoints: Vec<String> = member.iter().map(|m| m.local_client_url.clone()).collect();
    // The CLI beside a worker still reads etcd with the node's certificate: the voters' client URLs,
    // which the worker keeps in db/endpoints from their node records.
    let known = match (&etcd, &worker) {
        (ClusterClient::NodeApi(_), Some(w)) => etcd_member::bootstrap::read_endpoints(&w.layout),
        _ => etcd.endpoints(),
    };
    for e in known {
        if !endpoints.contains(&e) {
            endpoints.push(e);
        }
    }

    // The node's record and heartbeat. Its own token: it must revoke the lease before etcd stops.
    let registration_stop = CancellationToken::new();
    // The controllers stop with the process, or alone when this node's certificate is revoked.
    let agent_stop = shutdown.child_token();
    let (node_info, node_info_rx) = tokio::sync::watch::channel(node_info);
    let registration = tokio::spawn(etcd_member::run_registration(
        etcd.clone(),
        keys.clone(),
        node_info_rx,
        Some(node_ready),
        registration_stop.clone(),
    ));

    let member_parts = member.as_ref().map(|m| MemberParts {
        member: m,
        tls: !insecure,
        settings,
        db_size: member_metrics.db_size_bytes.clone(),
    });
    let agent = Agent::start(
        AgentParts {
            client: etcd.clone(),
            keys: keys.clone(),
            node: node.clone(),
            events: events.clone(),
            metrics: metrics.clone(),
            member: member_parts,
            worker: worker.as_ref().map(|w| w.layout.clone()),
            pods,
            process_stop: shutdown.clone(),
        },
        &agent_stop,
    )?;
    let revoked = CancellationToken::new();
    if let Some(w) = worker.as_ref().filter(|_| etcd_tls) {
        // A deleted worker's agent stops at once; its pods run on as they are, and /readyz says why.
        let client_cert = w.layout.tls().cert(etcd_member::tls::CertRole::Client);
        match std::fs::read(&client_cert)
            .ok()
            .and_then(|pem| etcd_member::tls::serial_of(&pem))
        {
            Some(serial) => match &etcd {
                ClusterClient::NodeApi(api) => {
                    tokio::spawn(crate::etcd_member::revocation::stop_when_refused(
                        api.clone(),
                        node.clone(),
                        serial,
                        readiness.register("certificate"),
                        agent_stop.clone(),
                        revoked.clone(),
                    ));
                }
                ClusterClient::Etcd(_) => {
                    tokio::spawn(crate::etcd_member::revocation::stop_when_revoked(
                        agent.revocations.clone(),
                        node.clone(),
                        serial,
                        readiness.register("certificate"),
                        agent_stop.clone(),
                        revoked.clone(),
                    ));
                }
            },
            None => tracing::warn!(
                "cannot read this worker's certificate serial from {}: a revocation will not stop it",
                client_cert.display()
            ),
        }
    }
    let mut api_tls_reload = None;
    if let (Some(m), true) = (&member, api_client_ca.is_some()) {
        let tls = m.layout.tls();
        api_tls_reload = Some(ApiTlsReload {
            cert: tls.cert(CertRole::Server),
            key: tls.key(CertRole::Server),
            renewed: node_info.subscribe(),
        });
        tokio::spawn(crate::nodeapi::certs::keep_member_certificates_fresh(
            m.etcd.clone(),
            keys.clone(),
            cert_lifetime,
            crate::nodeapi::certs::RenewingNode {
                name: node.clone(),
                tls,
                info: node_info.clone(),
                expiry: expiry_gauge.clone(),
                stop: agent_stop.clone(),
            },
        ));
    }
    if let (Some(w), ClusterClient::NodeApi(api)) = (worker.as_ref().filter(|_| etcd_tls), &etcd) {
        let tls = w.layout.tls();
        api_tls_reload = Some(ApiTlsReload {
            cert: tls.cert(CertRole::Server),
            key: tls.key(CertRole::Server),
            renewed: node_info.subscribe(),
        });
        tokio::spawn(crate::nodeapi::certs::drop_server_token(
            api.clone(),
            w.layout.token_file(),
            agent_stop.clone(),
        ));
        tokio::spawn(crate::nodeapi::certs::keep_certificates_fresh(
            api.clone(),
            crate::nodeapi::certs::RenewingNode {
                name: node.clone(),
                tls: w.layout.tls(),
                info: node_info.clone(),
                expiry: expiry_gauge,
                stop: agent_stop.clone(),
            },
        ));
    }
    let roles = match (&agent.caches, &agent.worker) {
        (Some(c), _) => Some((c.nodes.clone(), Some(c.members.clone()))),
        (None, Some(w)) => Some((w.nodes.clone(), w.members.clone())),
        (None, None) => None,
    }
    .map(|(nodes, members)| crate::nodeapi::NodeRoles::new(keys.clone(), nodes, members));
    if let (Some(roles), Some(m)) = (&roles, &member) {
        // Voters are the control plane: workers reach the cluster through them.
        // Workers' watches come from two shared watches per voter, not one etcd watch each.
        let hubs = [
            format!("{}/", keys.prefix()),
            format!("{}/", hostlet_api::keys::LEGACY_REGISTRY_PREFIX),
        ]
        .into_iter()
        .map(|root| {
            hostlet_runtime::watchhub::WatchHub::start(
                m.etcd.clone(),
                root,
                Default::default(),
                agent_stop.clone(),
            )
        })
        .collect::<Vec<_>>();
        let graph = crate::nodeapi::graph::NodeGraph::start(
            m.etcd.clone(),
            keys.clone(),
            &hubs,
            metrics.registry(),
            agent_stop.clone(),
        )
        .context("registering the node API's metrics")?;
        api_routes = api_routes.merge(crate::nodeapi::router(
            m.etcd.clone(),
            keys.clone(),
            roles.clone(),
            agent.revocations.clone(),
            secret_keys,
            hubs,
            graph,
        ));
        if let Some(ca) = m.ca.clone() {
            api_routes = api_routes.merge(crate::nodeapi::certs::router(
                m.etcd.clone(),
                keys.clone(),
                roles.clone(),
                ca,
                cert_lifetime,
            ));
        }
    }
    api_routes = api_routes
        .merge(crate::pods::http::router(agent.pods.clone()))
        .merge(crate::pods::access::router(agent.pods.clone()))
        .merge(agent.pods.http_source().router());
    Ok(Some(Running {
        client: etcd,
        events,
        api_routes,
        token,
        api_tls,
        api_client_ca,
        api_tls_reload,
        roles,
        node,
        etcd_tls,
        api_url,
        endpoints,
        agent,
        member,
        worker,
        registration,
        registration_stop,
        revoked,
    }))
}

/// Records this member's own certificate serials under `/hostlet/certs/<node>`, retrying until it can.
async fn record_own_serials(
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    serials: Vec<String>,
    shutdown: CancellationToken,
) {
    if serials.is_empty() {
        return;
    }
    loop {
        let done = crate::etcd_member::revocation::update(&etcd, &keys, &node, |r| {
            if !serials.iter().any(|s| r.revoked.contains(s)) {
                r.issue(serials.clone())
            }
        })
        .await;
        match done {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "cannot record this node's certificate serials yet")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

impl Running {
    /// Once [`Running::revoked`] has fired: waits for the controllers, then ends the node's lease (without
    /// writing the record again).
    pub async fn stop_revoked(&mut self) {
        let left = self.agent.drain(DRAIN).await;
        if !left.is_empty() {
            tracing::warn!(controllers = ?left, "controllers still busy after {DRAIN:?}: cut off");
        }
        self.registration_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(3), &mut self.registration).await;
    }

    /// The revoked certificates of deleted nodes, for the API's callers.
    pub fn revocations(&self) -> crate::etcd_member::revocation::Revocations {
        self.agent.revocations.clone()
    }

    /// Stops the agent once `shutdown` (given to [`boot`]) has fired: the controllers finish the
    /// reconciles they are in (at most [`DRAIN`]), then the node's lease is revoked, then the member
    /// stops. Says whether the agent is to start again as a joiner.
    pub async fn stop(mut self) -> Ended {
        let left = self.agent.drain(DRAIN).await;
        if !left.is_empty() {
            tracing::warn!(controllers = ?left, "controllers still busy after {DRAIN:?}: cut off at exit");
        }
        self.registration_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(3), self.registration).await;
        if let Some(m) = self.member.take() {
            m.stop().await;
        }
        // A worker asked to become a member starts again as a joiner, through the leader's API.
        if let Some(req) = self.agent.member_request().await {
            let token = self
                .worker
                .as_ref()
                .map(|w| w.token.to_string())
                .unwrap_or_default();
            return Ended::Rejoin(RejoinTarget {
                server: req.server,
                token,
            });
        }
        // The rejoin, if that is what stopped the agent.
        match self.agent.rejoin_target().await {
            Some(t) => Ended::Rejoin(t),
            None => Ended::Stopped,
        }
    }
}

/// Once the local member serves: `voters` becomes the cluster policy unless one exists, and a member
/// request that brought this host here is done.
fn seed_policy_and_clear_request(etcd: &Etcd, keys: &KeyLayout, node: &str, voters: Option<u8>) {
    let (etcd, keys, node) = (etcd.clone(), keys.clone(), node.to_string());
    tokio::spawn(async move {
        if let Some(v) = voters {
            let key = keys.cluster_policy();
            let value = serde_json::to_vec(&ClusterPolicy { voters: Some(v) }).unwrap_or_default();
            let txn = Txn::new()
                .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), value, None)]);
            match etcd.txn(txn).await {
                Ok(r) if r.succeeded() => {
                    tracing::info!(voters = v, "{key} written from --etcd-voters")
                }
                Ok(_) => tracing::info!("{key} exists: --etcd-voters left it as it is"),
                Err(e) => tracing::warn!(error = %e, "cannot write {key} from --etcd-voters"),
            }
        }
        if let Err(e) = etcd.delete(keys.member_request(&node)).await {
            tracing::warn!(error = %e, "cannot delete this node's member request");
        }
    });
}

/// The node's server certificate and key, for the API's HTTPS.
fn server_cert(layout: &MemberLayout) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let tls = layout.tls();
    let load = |p: PathBuf| std::fs::read(&p).with_context(|| format!("reading {}", p.display()));
    Ok((
        load(tls.cert(CertRole::Server))?,
        load(tls.key(CertRole::Server))?,
    ))
}

/// The CAs whose client certificates name the API's callers: the cluster CA (members, admins) and the
/// node CA (workers).
fn client_ca(layout: &MemberLayout) -> anyhow::Result<Vec<u8>> {
    Ok(layout.tls().client_cas()?)
}

/// When this node's member was created: its name file is written once, when the member is made.
fn member_since(layout: &MemberLayout) -> Option<Timestamp> {
    let modified = std::fs::metadata(layout.name_file())
        .ok()?
        .modified()
        .ok()?;
    Some(Timestamp(modified))
}

/// Keeps `hostlet_etcd_version_info` on what the local member's `/version` says (a local HTTP request to
/// its own etcd, not a read of the keyspace).
async fn follow_version_info(
    metrics: MemberMetrics,
    member: String,
    client_url: String,
    tls: Option<TlsFiles>,
    shutdown: CancellationToken,
) {
    loop {
        let asked =
            etcd_member::gate::member_versions(std::slice::from_ref(&client_url), tls.as_ref())
                .await
                .pop()
                .flatten();
        if let Some(v) = asked {
            metrics.set_version_info(
                &member,
                &v.server.map(|x| x.to_string()).unwrap_or_default(),
                &v.cluster.map(|x| x.minor_text()).unwrap_or_default(),
            );
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(VERSION_INFO_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejoined(reason: &str, resumed: bool) -> Rejoined {
        Rejoined {
            backup: PathBuf::from("/d/db/member.tombstoned-1"),
            previous_name: Some("n1-a1".into()),
            reason: reason.into(),
            server: "https://10.0.0.1:10250".into(),
            resumed,
        }
    }

    #[test]
    fn arrival_events_and_the_tombstone_count_by_how_the_host_arrived() {
        let r = rejoined("disk replaced", false);
        let blank = rejoined("", true);
        let member = Arrival::Member {
            name: "n1-b2",
            was_worker: false,
        };
        let promoted = Arrival::Member {
            name: "n1-b2",
            was_worker: true,
        };
        type Row<'a> = (
            Arrival<'a>,
            Option<&'a Rejoined>,
            Vec<&'a str>,
            Option<&'a str>,
        );
        let cases: Vec<Row<'_>> = vec![
            (member, None, vec![], None),
            (promoted, None, vec!["BecameMember"], Some("this worker started etcd member n1-b2")),
            (Arrival::Worker, None, vec!["JoinedAsWorker"], Some("runs no etcd member")),
            (
                member,
                Some(&r),
                vec!["Rejoined"],
                Some("tombstone (disk replaced): member n1-a1 backed up to /d/db/member.tombstoned-1; rejoined through https://10.0.0.1:10250 as member n1-b2"),
            ),
            (
                Arrival::Worker,
                Some(&blank),
                vec!["Rejoined", "JoinedAsWorker"],
                Some("tombstone (no reason given): member n1-a1 backed up to /d/db/member.tombstoned-1; rejoined through https://10.0.0.1:10250 as a worker (the voter target is full)"),
            ),
        ];
        for (arrival, rejoined, reasons, first) in cases {
            let got = arrival_events(arrival, rejoined);
            let got_reasons: Vec<&str> = got
                .iter()
                .map(|e| match e {
                    ArrivalEvent::Rejoined(_) => "Rejoined",
                    ArrivalEvent::JoinedAsWorker(_) => "JoinedAsWorker",
                    ArrivalEvent::BecameMember(_) => "BecameMember",
                })
                .collect();
            assert_eq!(got_reasons, reasons, "{arrival:?}");
            if let Some(first) = first {
                assert!(
                    got[0].message().starts_with(first),
                    "{arrival:?}: {:?}",
                    got[0]
                );
            }
        }
        assert!(counts_tombstone(Some(&r)));
        assert!(
            !counts_tombstone(Some(&blank)),
            "a resumed rejoin was counted by its first process"
        );
        assert!(!counts_tombstone(None));
    }
}
