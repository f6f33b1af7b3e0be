//! What every role's start shares once the role is decided: the configuration left ([`Base`]), the task
//! set, and the steps each role takes in the same way (the certificate facts, the events, the node's
//! registration, the controllers, the running agent).

use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use anyhow::Context;
use hostlet_api::objects::{NodeInfo, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, ComponentHandle, Metrics, Readiness};
use tokio_util::sync::CancellationToken;

use super::arrival::{self, ArrivalEvent};
use super::running::{ApiTlsReload, BootConfig, Datastore, Held, MemberSettings, Running};
use super::tasks::{Stage, TaskSet};
use super::{Agent, AgentParts, MemberParts};
use crate::disk::DiskPressure;
use crate::etcd_member::{self, MemberLayout, MemberMetrics};
use crate::events::EventRecorder;
use crate::pki::{CertRole, ClusterToken};
use crate::pods::controller::PodControllerConfig;

/// The boot's configuration once the datastore is taken out, and the agent's task set.
pub(super) struct Base {
    pub node: String,
    pub keys: KeyLayout,
    pub data_dir: PathBuf,
    pub layout: MemberLayout,
    pub insecure: bool,
    pub voters: Option<u8>,
    pub cert_lifetime: std::time::Duration,
    pub node_info: NodeInfo,
    pub api_host_port: String,
    /// Taken by a member's controllers.
    pub settings: Option<MemberSettings>,
    /// Taken by the controllers.
    pub pods: Option<PodControllerConfig>,
    pub metrics: Metrics,
    pub member_metrics: MemberMetrics,
    pub readiness: Readiness,
    pub node_ready: Option<ComponentHandle>,
    /// The whole process's stop.
    pub shutdown: CancellationToken,
    pub tasks: TaskSet,
}

/// What a role's start hands to [`Base::finish`].
pub(super) struct Served {
    pub client: ClusterClient,
    pub events: EventRecorder,
    pub api_routes: axum::Router,
    pub token: Option<ClusterToken>,
    pub api_tls: Option<(Vec<u8>, Vec<u8>)>,
    pub api_client_ca: Option<Vec<u8>>,
    pub api_tls_reload: Option<ApiTlsReload>,
    pub roles: Option<crate::nodeapi::NodeRoles>,
    pub etcd_tls: bool,
    pub api_url: String,
    pub endpoints: Vec<String>,
    pub agent: Agent,
    pub held: Held,
    pub revoked: CancellationToken,
}

impl Base {
    /// Splits `cfg` into the base and what decides the role (the datastore, and the disk a member's
    /// start watches).
    pub fn new(cfg: BootConfig, shutdown: &CancellationToken) -> (Base, Datastore, DiskPressure) {
        let BootConfig {
            node,
            keys,
            data_dir,
            datastore,
            insecure,
            voters,
            cert_lifetime,
            node_info,
            api_host_port,
            member,
            pods,
            metrics,
            member_metrics,
            readiness,
            node_ready,
            disk,
        } = cfg;
        let base = Base {
            node,
            keys,
            layout: MemberLayout::new(&data_dir),
            data_dir,
            insecure,
            voters,
            cert_lifetime,
            node_info,
            api_host_port,
            settings: Some(member),
            pods: Some(pods),
            metrics,
            member_metrics,
            readiness,
            node_ready: Some(node_ready),
            shutdown: shutdown.clone(),
            tasks: TaskSet::new(shutdown),
        };
        (base, datastore, disk)
    }

    /// The node's certificates' expiries and serials into the node record, and their expiry metric.
    pub fn certificate_facts(&mut self) -> anyhow::Result<prometheus::IntGaugeVec> {
        let expiries = self.layout.tls().expiries();
        self.node_info.cert_expires = expiries
            .iter()
            .filter(|(name, _)| *name != "ca")
            .map(|(_, at)| *at)
            .min()
            .map(Timestamp);
        self.node_info.cert_serials = self.layout.tls().serials();
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "hostlet_certificate_expiry_timestamp_seconds",
                "When each of this node's certificates expires (unix seconds)",
            ),
            &["certificate"],
        )
        .context("the certificate expiry metric")?;
        self.metrics
            .registry()
            .register(Box::new(gauge.clone()))
            .context("registering the certificate expiry metric")?;
        for (name, at) in expiries {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            gauge
                .with_label_values(&[name])
                .set(i64::try_from(secs).unwrap_or(i64::MAX));
        }
        Ok(gauge)
    }

    /// The keys that open secrets, for the pods and the node API. A worker holds no secret key: its voters
    /// open the secrets its pods use for it.
    pub fn secret_keys(
        &mut self,
        client: &ClusterClient,
        token: Option<&ClusterToken>,
    ) -> Option<crate::secrets::SecretKeys> {
        let secret_keys = crate::secrets::SecretKeys::for_node(&self.data_dir, token);
        if let Some(pods) = self.pods.as_mut() {
            pods.secret_keys = match client {
                ClusterClient::NodeApi(_) => None,
                ClusterClient::Etcd(_) => secret_keys.clone(),
            };
        }
        secret_keys
    }

    /// The agent's one event recorder (one aggregation and one per-node cap for every concern), which
    /// says `arrival` and `warnings` first.
    pub fn announce(
        &mut self,
        client: &ClusterClient,
        arrival: Vec<ArrivalEvent>,
        warnings: Vec<String>,
    ) -> EventRecorder {
        let events = EventRecorder::new(client.clone(), self.keys.clone(), self.node.clone());
        self.tasks.spawn(
            Stage::Writers,
            "arrival events",
            arrival::say(events.clone(), arrival, warnings),
        );
        events
    }

    /// The API's URL, in the node record too.
    pub fn api_url(&mut self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        let api_url = format!("{scheme}://{}", self.api_host_port);
        self.node_info.api_url = Some(api_url.clone());
        api_url
    }

    /// The node's record and heartbeat, in the drain's last stage: its lease is revoked (without
    /// writing the record again) once everything else is done with etcd, before etcd stops. The
    /// record's source, which renewals change.
    pub fn register(&mut self, client: &ClusterClient) -> tokio::sync::watch::Sender<NodeInfo> {
        let role = if self.node_info.member_id.is_some() {
            "voter"
        } else {
            "worker"
        };
        self.node_info
            .labels
            .insert(hostlet_api::labels::ROLE.to_string(), role.to_string());
        let (info, info_rx) = tokio::sync::watch::channel(self.node_info.clone());
        let stop = self.tasks.token(Stage::Lease);
        self.tasks.spawn(
            Stage::Lease,
            "registration",
            etcd_member::run_registration(
                client.clone(),
                self.keys.clone(),
                info_rx,
                self.node_ready.take(),
                stop,
            ),
        );
        info
    }

    /// Builds the caches and starts the controllers: a member's with `member`, a worker's caches with
    /// `worker`.
    pub fn start_agent(
        &mut self,
        client: &ClusterClient,
        events: &EventRecorder,
        member: Option<MemberParts<'_>>,
        worker: Option<MemberLayout>,
    ) -> anyhow::Result<Agent> {
        let parts = AgentParts {
            client: client.clone(),
            keys: self.keys.clone(),
            node: self.node.clone(),
            events: events.clone(),
            metrics: self.metrics.clone(),
            member,
            worker,
            pods: self
                .pods
                .take()
                .context("the agent's controllers are started once")?,
            process_stop: self.shutdown.clone(),
        };
        Ok(Agent::start(parts, &mut self.tasks)?)
    }

    /// The running agent: the pods' routes join the role's.
    pub fn finish(self, s: Served) -> Running {
        let api_routes = s
            .api_routes
            .merge(crate::pods::http::router(s.agent.pods.clone()))
            .merge(crate::pods::access::router(s.agent.pods.clone()))
            .merge(s.agent.pods.http_source().router());
        Running {
            client: s.client,
            events: s.events,
            api_routes,
            token: s.token,
            api_tls: s.api_tls,
            api_client_ca: s.api_client_ca,
            api_tls_reload: s.api_tls_reload,
            roles: s.roles,
            node: self.node,
            etcd_tls: s.etcd_tls,
            api_url: s.api_url,
            endpoints: s.endpoints,
            agent: s.agent,
            held: s.held,
            tasks: self.tasks,
            revoked: s.revoked,
        }
    }
}

/// `first`, then those of `known` not in it.
pub(super) fn endpoints(mut first: Vec<String>, known: Vec<String>) -> Vec<String> {
    for e in known {
        if !first.contains(&e) {
            first.push(e);
        }
    }
    first
}

/// Where the API's certificate is read again after a renewal, and the record whose change says so.
pub(super) fn tls_reload(
    layout: &MemberLayout,
    info: &tokio::sync::watch::Sender<NodeInfo>,
) -> ApiTlsReload {
    let tls = layout.tls();
    ApiTlsReload {
        cert: tls.cert(CertRole::Server),
        key: tls.key(CertRole::Server),
        renewed: info.subscribe(),
    }
}

/// The node's server certificate and key, for the API's HTTPS.
pub(super) fn server_cert(layout: &MemberLayout) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let tls = layout.tls();
    let load = |p: PathBuf| std::fs::read(&p).with_context(|| format!("reading {}", p.display()));
    Ok((
        load(tls.cert(CertRole::Server))?,
        load(tls.key(CertRole::Server))?,
    ))
}

/// The CAs whose client certificates name the API's callers: the cluster CA (members, admins) and the
/// node CA (workers).
pub(super) fn client_ca(layout: &MemberLayout) -> anyhow::Result<Vec<u8>> {
    Ok(layout.tls().client_cas()?)
}

/// Where a node's images go between nodes: its record advertises the engine's images, its pods fetch what
/// they cannot pull from a node that has it (with TLS: the node's certificate is the credential), and
/// its API serves its images to the nodes whose pods name them (`may_have` says which those are).
pub(super) struct PeerImages {
    pub nodes: hostlet_runtime::Store<String, hostlet_runtime::Object<NodeInfo>>,
    pub tls: Option<crate::pki::TlsDir>,
    pub may_have: crate::pods::peer_images::MayHave,
}

impl Base {
    /// Starts the advertisement and the fetches; the route that serves this node's images.
    pub fn peer_images(
        &mut self,
        agent: &Agent,
        info: &tokio::sync::watch::Sender<NodeInfo>,
        p: PeerImages,
    ) -> anyhow::Result<axum::Router> {
        use crate::pods::peer_images as peer;
        let rt = agent.pods.runtime().clone();
        let stop = self.tasks.token(Stage::Writers);
        self.tasks.spawn(
            Stage::Writers,
            "image advertisement",
            advertise_images(rt.clone(), info.clone(), stop),
        );
        let metrics = peer::PeerImageMetrics::register(self.metrics.registry())
            .context("registering the peer image metrics")?;
        if let Some(tls) = p.tls.filter(|t| peer::PeerFetcher::client(t).is_some()) {
            let nodes = p.nodes.clone();
            let fetcher = peer::PeerFetcher {
                node: self.node.clone(),
                tls,
                nodes: std::sync::Arc::new(move || {
                    nodes
                        .state()
                        .iter()
                        .filter_map(|o| o.value.as_ref().ok().cloned().map(std::sync::Arc::new))
                        .collect()
                }),
                metrics,
            };
            let loader = rt.clone();
            agent
                .pods
                .set_peer_fetch(std::sync::Arc::new(move |image: String| {
                    let fetcher = fetcher.clone();
                    let loader = loader.clone();
                    Box::pin(async move { fetcher.fetch(&*loader, &image).await })
                }));
        }
        Ok(peer::router(peer::ServeImages {
            runtime: rt,
            may_have: p.may_have,
        }))
    }
}

/// Keeps the node record's `images` as the engine's images are, looked at every
/// [`crate::pods::peer_images::ADVERTISE_EVERY`].
async fn advertise_images(
    rt: std::sync::Arc<crate::pods::docker::DockerRuntime>,
    info: tokio::sync::watch::Sender<NodeInfo>,
    stop: CancellationToken,
) {
    use crate::pods::images::ImageEngine;
    loop {
        if let Ok(images) = rt.images().await {
            let held = crate::pods::peer_images::advertised(&images);
            info.send_if_modified(|i| {
                let changed = i.images != held;
                if changed {
                    i.images = held;
                }
                changed
            });
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(crate::pods::peer_images::ADVERTISE_EVERY) => {}
        }
    }
}
