//! A worker's boot: no etcd member; the cluster through the voters' node API (or, joined by an earlier
//! version, their etcd). It watches for its own revocation and for a request to become a member, and
//! keeps its certificates fresh through the voters.

use tokio_util::sync::CancellationToken;

use super::arrival::{arrival_events, Arrival};
use super::common::{self, Base, Served};
use super::running::{Held, Running};
use super::tasks::Stage;
use crate::etcd_member::{self, WorkerStart};
use crate::tombstone::Rejoined;
use hostlet_runtime::ClusterClient;

/// Starts what a worker needs.
pub(super) fn start(
    mut b: Base,
    w: WorkerStart,
    rejoined: Option<Rejoined>,
) -> anyhow::Result<Running> {
    let client = w.client.clone();
    let etcd_tls = w.tls.is_some();
    let token = Some(w.token.clone());
    let (api_tls, api_client_ca) = if b.insecure {
        (None, None)
    } else {
        let ca = common::client_ca(&w.layout)?;
        (Some(common::server_cert(&w.layout)?), Some(ca))
    };
    b.readiness
        .register(etcd_member::READINESS_COMPONENT)
        .set_ready(format!(
            "worker: no local member; voters {}",
            client.endpoints().join(", ")
        ));
    let arrival = arrival_events(Arrival::Worker, rejoined.as_ref());
    let expiry = match api_client_ca {
        Some(_) => Some(b.certificate_facts()?),
        None => None,
    };
    b.secret_keys(&client, token.as_ref());
    let events = b.announce(&client, arrival, Vec::new());
    let api_url = b.api_url(api_tls.is_some());
    // The CLI beside a worker still reads etcd with the node's certificate: the voters' client URLs,
    // which the worker keeps in db/endpoints from their node records.
    let known = match &client {
        ClusterClient::NodeApi(_) => etcd_member::bootstrap::read_endpoints(&w.layout),
        ClusterClient::Etcd(_) => client.endpoints(),
    };
    let endpoints = common::endpoints(Vec::new(), known);
    let info = b.register(&client);
    let agent = b.start_agent(&client, &events, None, Some(w.layout.clone()))?;
    let revoked = CancellationToken::new();
    if etcd_tls {
        watch_revocation(&mut b, &w, &client, &agent, &revoked);
    }
    let mut api_tls_reload = None;
    if let (true, ClusterClient::NodeApi(api)) = (etcd_tls, &client) {
        api_tls_reload = Some(common::tls_reload(&w.layout, &info));
        let stop = b.tasks.token(Stage::Writers);
        b.tasks.spawn(
            Stage::Writers,
            "server token swap",
            crate::pki::drop_server_token(api.clone(), w.layout.token_file(), stop),
        );
        let stop = b.tasks.token(Stage::Writers);
        b.tasks.spawn(
            Stage::Writers,
            "certificate renewal",
            crate::pki::keep_certificates_fresh(
                api.clone(),
                crate::pki::RenewingNode {
                    name: b.node.clone(),
                    tls: w.layout.tls(),
                    info: info.clone(),
                    expiry,
                    stop,
                },
            ),
        );
    }
    let mut api_routes = axum::Router::new();
    if let Some(c) = agent.worker.as_ref() {
        api_routes = b.peer_images(
            &agent,
            &info,
            common::PeerImages {
                nodes: c.nodes.clone(),
                tls: etcd_tls.then(|| w.layout.tls()),
                may_have: match &client {
                    ClusterClient::NodeApi(api) => {
                        crate::pods::peer_images::may_have_through_voters(api.clone())
                    }
                    ClusterClient::Etcd(etcd) => {
                        crate::pods::peer_images::may_have_from_etcd(etcd.clone(), b.keys.clone())
                    }
                },
            },
        )?;
    }
    let roles = agent.worker.as_ref().map(|c| {
        crate::nodeapi::NodeRoles::new(b.keys.clone(), c.nodes.clone(), c.members.clone())
    });
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
        held: Held::Worker(w),
        revoked,
    }))
}

/// A deleted worker's agent stops at once (its controllers, through the controllers' token); its pods
/// run on as they are, and /readyz says why.
fn watch_revocation(
    b: &mut Base,
    w: &WorkerStart,
    client: &ClusterClient,
    agent: &super::Agent,
    revoked: &CancellationToken,
) {
    let client_cert = w.layout.tls().cert(crate::pki::CertRole::Client);
    let Some(serial) = std::fs::read(&client_cert)
        .ok()
        .and_then(|pem| crate::pki::serial_of(&pem))
    else {
        tracing::warn!(
            "cannot read this worker's certificate serial from {}: a revocation will not stop it",
            client_cert.display()
        );
        return;
    };
    let component = b.readiness.register("certificate");
    let agent_stop = b.tasks.token(Stage::Controllers);
    match client {
        ClusterClient::NodeApi(api) => b.tasks.spawn(
            Stage::Controllers,
            "revocation watch",
            crate::pki::stop_when_refused(
                api.clone(),
                b.node.clone(),
                serial,
                component,
                agent_stop,
                revoked.clone(),
            ),
        ),
        ClusterClient::Etcd(_) => b.tasks.spawn(
            Stage::Controllers,
            "revocation watch",
            crate::pki::stop_when_revoked(
                agent.revocations.clone(),
                b.node.clone(),
                serial,
                component,
                agent_stop,
                revoked.clone(),
            ),
        ),
    }
}
