//! A member's boot: the local etcd member serves; this host holds the CAs, answers joins, serves the
//! node API and its watch hubs to workers, keeps the revocation list and its own certificates fresh, and
//! runs every controller.

use std::time::Duration;

use anyhow::Context;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::objects::{ClusterPolicy, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, Etcd, TlsFiles};
use tokio_util::sync::CancellationToken;

use super::arrival::{arrival_events, Arrival};
use super::common::{self, Base, Served};
use super::role::MemberStart;
use super::running::{Held, Running};
use super::tasks::Stage;
use super::MemberParts;
use crate::etcd_member::{self, JoinService, MemberLayout, MemberMetrics};

/// How often the local member's `/version` is asked again: the cluster version moves only when the last
/// member of an upgrade restarts.
const VERSION_INFO_EVERY: Duration = Duration::from_secs(60);

/// Starts what a member needs around its serving etcd member.
pub(super) fn start(mut b: Base, s: MemberStart) -> anyhow::Result<Running> {
    let MemberStart {
        started,
        rejoined,
        tombstones,
        was_worker,
    } = s;
    let m = *started;
    let client: ClusterClient = m.etcd.clone().into();
    // The member serves after a reset: the reset is done, and a later one on purpose is allowed.
    match crate::tombstone::datadir::retire_reset_flag(&b.layout.db_dir()) {
        Ok(true) => tracing::info!(
            "the member serves after a cluster reset: db/reset-flag moved to db/reset-history"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cannot retire db/reset-flag"),
    }
    tombstones
        .cluster_resets_total
        .inc_by(crate::tombstone::reset::resets_recorded(&b.layout.db_dir()));
    let token = Some(m.token.clone());
    let (api_tls, api_client_ca) = if b.insecure {
        (None, None)
    } else {
        let ca = common::client_ca(&m.layout)?;
        (Some(common::server_cert(&m.layout)?), Some(ca))
    };
    let mut api_routes = axum::Router::new().merge(
        JoinService::new(
            m.token.clone(),
            m.ca.clone(),
            m.etcd.clone(),
            b.keys.clone(),
            b.cert_lifetime,
        )
        .router(),
    );
    describe_member(&mut b, &m);
    b.tasks.spawn(
        Stage::Writers,
        "cluster policy seed",
        seed_policy_and_clear_request(m.etcd.clone(), b.keys.clone(), b.node.clone(), b.voters),
    );
    let arrival = arrival_events(
        Arrival::Member {
            name: &m.member_name,
            was_worker,
        },
        rejoined.as_ref(),
    );
    let expiry = match api_client_ca {
        Some(_) => {
            let gauge = b.certificate_facts()?;
            // A member issues its own certificates (the first node, new addresses): it records them, so
            // that `hostlet node certs` tells them from certificates nobody recorded.
            b.tasks.spawn(
                Stage::Writers,
                "own serials record",
                record_own_serials(
                    m.etcd.clone(),
                    b.keys.clone(),
                    b.node.clone(),
                    b.node_info.cert_serials.clone(),
                    b.tasks.token(Stage::Writers),
                ),
            );
            Some(gauge)
        }
        None => None,
    };
    let secret_keys = b.secret_keys(&client, token.as_ref());
    let warnings = m
        .version_warnings
        .iter()
        .map(|w| {
            b.member_metrics
                .version_warning
                .with_label_values(&[w.kind()])
                .set(1);
            w.to_string()
        })
        .collect();
    let events = b.announce(&client, arrival, warnings);
    let api_url = b.api_url(api_tls.is_some());
    let endpoints = common::endpoints(vec![m.local_client_url.clone()], client.endpoints());
    let info = b.register(&client);
    let parts = MemberParts {
        member: &m,
        tls: !b.insecure,
        settings: b
            .settings
            .take()
            .ok_or_else(|| anyhow::anyhow!("the member's controller settings are taken once"))?,
        db_size: b.member_metrics.db_size_bytes.clone(),
    };
    let agent = b.start_agent(&client, &events, Some(parts), None)?;
    let mut api_tls_reload = None;
    if api_client_ca.is_some() {
        api_tls_reload = Some(common::tls_reload(&m.layout, &info));
        let stop = b.tasks.token(Stage::Writers);
        b.tasks.spawn(
            Stage::Writers,
            "certificate renewal",
            crate::pki::keep_member_certificates_fresh(
                m.etcd.clone(),
                b.keys.clone(),
                b.cert_lifetime,
                crate::pki::RenewingNode {
                    name: b.node.clone(),
                    tls: m.layout.tls(),
                    info: info.clone(),
                    expiry,
                    stop,
                },
            ),
        );
    }
    api_routes = api_routes.merge(member_peer_images(&mut b, &m, &agent, &info)?);
    let roles = agent.caches.as_ref().map(|c| {
        crate::nodeapi::NodeRoles::new(b.keys.clone(), c.nodes.clone(), Some(c.members.clone()))
    });
    if let Some(roles) = &roles {
        api_routes = api_routes.merge(node_api(&mut b, &m, roles, &agent, secret_keys)?);
    }
    let etcd_tls = !b.insecure;
    Ok(b.finish(Served {
        client,
        events,
        api_routes,
        token,
        api_tls,
        api_client_ca,
        api_tls_reload,
        roles,
        etcd_tls,
        api_url,
        endpoints,
        agent,
        held: Held::Member(Box::new(m)),
        revoked: CancellationToken::new(),
    }))
}

/// Images between nodes on a member: it serves a node the images that node's pods name, read from etcd,
/// and answers the workers that ask the same of it.
fn member_peer_images(
    b: &mut Base,
    m: &crate::etcd_member::StartedMember,
    agent: &crate::agent::Agent,
    info: &tokio::sync::watch::Sender<hostlet_api::objects::NodeInfo>,
) -> anyhow::Result<axum::Router> {
    let Some(c) = agent.caches.as_ref() else {
        return Ok(axum::Router::new());
    };
    let images = b.peer_images(
        agent,
        info,
        common::PeerImages {
            nodes: c.nodes.clone(),
            tls: (!b.insecure).then(|| m.layout.tls()),
            may_have: crate::pods::peer_images::may_have_from_etcd(m.etcd.clone(), b.keys.clone()),
        },
    )?;
    Ok(images.merge(crate::pods::peer_images::check_router(
        m.etcd.clone(),
        b.keys.clone(),
    )))
}

/// The member's part of the node record, and the task that keeps `hostlet_etcd_version_info`.
fn describe_member(b: &mut Base, m: &crate::etcd_member::StartedMember) {
    let tls = (!b.insecure).then(|| crate::pki::client_tls_files(&m.layout.tls()));
    b.tasks.spawn(
        Stage::Caches,
        "etcd version metric",
        follow_version_info(
            b.member_metrics.clone(),
            m.member_name.clone(),
            m.client_url.clone(),
            tls,
            b.tasks.token(Stage::Caches),
        ),
    );
    b.node_info.member_since = member_since(&m.layout);
    b.node_info.member_name = Some(m.member_name.clone());
    b.node_info.member_id = Some(m.member_id.clone());
    b.node_info.peer_url = Some(m.peer_url.clone());
    b.node_info.client_url = Some(m.client_url.clone());
}

/// The node API a voter serves to the nodes: its two shared watches (workers' watches come from them, not
/// one etcd watch each), the node authoriser's graph fed from them, and the certificate routes where this
/// voter holds the CA.
fn node_api(
    b: &mut Base,
    m: &crate::etcd_member::StartedMember,
    roles: &crate::nodeapi::NodeRoles,
    agent: &crate::agent::Agent,
    secret_keys: Option<crate::secrets::SecretKeys>,
) -> anyhow::Result<axum::Router> {
    let hubs = [
        format!("{}/", b.keys.prefix()),
        format!("{}/", hostlet_api::keys::LEGACY_REGISTRY_PREFIX),
    ]
    .into_iter()
    .map(|root| {
        let (hub, task) = hostlet_runtime::watchhub::WatchHub::start_owned(
            m.etcd.clone(),
            root.clone(),
            Default::default(),
            b.tasks.token(Stage::Caches),
        );
        b.tasks
            .adopt(Stage::Caches, format!("watch hub {root}"), task);
        hub
    })
    .collect::<Vec<_>>();
    let (graph, feeders) = crate::nodeapi::graph::NodeGraph::start(
        m.etcd.clone(),
        b.keys.clone(),
        &hubs,
        b.metrics.registry(),
        b.tasks.token(Stage::Caches),
    )
    .context("registering the node API's metrics")?;
    for (name, feeder) in feeders {
        b.tasks.spawn(Stage::Caches, name, feeder);
    }
    let mut routes = crate::nodeapi::router(
        m.etcd.clone(),
        b.keys.clone(),
        roles.clone(),
        agent.revocations.clone(),
        secret_keys,
        hubs,
        graph,
    );
    if let Some(ca) = m.ca.clone() {
        routes = routes.merge(crate::nodeapi::certs::router(
            m.etcd.clone(),
            b.keys.clone(),
            roles.clone(),
            ca,
            b.cert_lifetime,
        ));
    }
    Ok(routes)
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
        let done = crate::pki::update_certificates(&etcd, &keys, &node, |r| {
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

/// Once the local member serves: `voters` becomes the cluster policy unless one exists, and a member
/// request that brought this host here is done.
async fn seed_policy_and_clear_request(
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    voters: Option<u8>,
) {
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
