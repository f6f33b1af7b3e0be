//! The boot on an etcd cluster hostlet does not run (`--etcd-endpoints`): no member, no CA, no node API;
//! the pod controller and the node's registration on that cluster.

use anyhow::Context;
use hostlet_runtime::ClusterClient;
use tokio_util::sync::CancellationToken;

use super::common::{self, Base, Served};
use super::role::ExternalEtcd;
use super::running::{Held, Running};
use crate::etcd_member;
use crate::pki::{CertRole, ClusterToken};

/// Connects to the external cluster and starts what an agent on it needs.
pub(super) async fn start(mut b: Base, x: ExternalEtcd) -> anyhow::Result<Running> {
    let ExternalEtcd {
        endpoints,
        tls,
        token: flag_token,
    } = x;
    let etcd_tls = tls.is_some();
    let client: ClusterClient = etcd_member::connect_external(
        &endpoints,
        tls,
        b.member_metrics.clone(),
        &b.readiness,
        b.shutdown.clone(),
    )
    .await?
    .into();
    let token = match flag_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => Some(ClusterToken::parse(t).context("--token")?),
        None => std::fs::read_to_string(b.layout.token_file())
            .ok()
            .and_then(|t| ClusterToken::parse(&t).ok()),
    };
    // An external cluster has no CA of ours: serve HTTPS only if this data dir holds node
    // certificates.
    let tls = b.layout.tls();
    let api_tls = match (
        std::fs::read(tls.cert(CertRole::Server)),
        std::fs::read(tls.key(CertRole::Server)),
    ) {
        (Ok(c), Ok(k)) if !b.insecure => Some((c, k)),
        _ => {
            tracing::warn!(
                "no node certificate in {}: the API serves plain HTTP",
                tls.dir.display()
            );
            None
        }
    };
    b.secret_keys(&client, token.as_ref());
    let events = b.announce(&client, Vec::new(), Vec::new());
    let api_url = b.api_url(api_tls.is_some());
    let endpoints = common::endpoints(Vec::new(), client.endpoints());
    b.register(&client);
    let agent = b.start_agent(&client, &events, None, None)?;
    Ok(b.finish(Served {
        client,
        events,
        api_routes: axum::Router::new(),
        token,
        api_tls,
        api_client_ca: None,
        api_tls_reload: None,
        roles: None,
        etcd_tls,
        api_url,
        endpoints,
        agent,
        held: Held::External,
        revoked: CancellationToken::new(),
    }))
}
