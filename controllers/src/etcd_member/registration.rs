//! The node's presence in etcd: `/hostlet/nodes/<node>` (NodeInfo, persistent) and `/hostlet/leases/<node>`
//! (a heartbeat on a 40 s lease, kept alive while the agent runs, revoked when it stops cleanly).

use std::time::Duration;

use hostlet_api::objects::{NodeInfo, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, EtcdError};
use tokio_util::sync::CancellationToken;

/// TTL of the heartbeat lease.
pub const LEASE_TTL: Duration = Duration::from_secs(40);
/// Renewal period: three chances per TTL.
const RENEW_EVERY: Duration = Duration::from_secs(13);
/// A worker's renewal period: each renewal is a request to a voter and one to etcd from there, for every
/// worker, so half the TTL (two chances, and a failed renewal is tried again every [`RETRY`], at every
/// voter, until one takes it).
const WORKER_RENEW_EVERY: Duration = Duration::from_secs(20);
/// Retry period while etcd cannot take the registration.
const RETRY: Duration = Duration::from_secs(2);

/// The heartbeat value.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub node: String,
    pub since: Timestamp,
}

/// Writes the node record, then keeps the lease alive until `cancel` fires, re-registering after an
/// expiry; writes the record again whenever `info` changes (renewed certificates). Revokes the lease on
/// the way out, so a clean stop shows at once.
pub async fn run_registration(
    etcd: ClusterClient,
    keys: KeyLayout,
    mut info: tokio::sync::watch::Receiver<NodeInfo>,
    registered: Option<hostlet_runtime::ComponentHandle>,
    cancel: CancellationToken,
) {
    let name = info.borrow().name.clone();
    let node_key = keys.node(&name);
    let lease_key = keys.lease(&name);
    let encode = |info: &NodeInfo| match serde_json::to_string(info) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the node record");
            None
        }
    };
    let heartbeat = serde_json::to_string(&Heartbeat {
        node: name.clone(),
        since: Timestamp::now(),
    })
    .unwrap_or_default();
    loop {
        let Some(record) = encode(&info.borrow_and_update()) else {
            return;
        };
        let lease = tokio::select! {
            _ = cancel.cancelled() => return,
            r = register(&etcd, &node_key, &record, &lease_key, &heartbeat) => r,
        };
        let lease = match lease {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register the node; retrying");
                if let Some(r) = &registered {
                    r.set_not_ready(format!("cannot register the node: {e}"));
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => continue,
                }
            }
        };
        tracing::info!(node = %name, lease = %format!("{lease:x}"), "node registered");
        if let Some(r) = &registered {
            r.set_ready(format!("{node_key} written; lease {lease:x}"));
        }
        let every = match &etcd {
            ClusterClient::NodeApi(_) => WORKER_RENEW_EVERY,
            ClusterClient::Etcd(_) => RENEW_EVERY,
        };
        let keep = etcd.keep_lease_alive_retrying(lease, every, RETRY, cancel.clone());
        tokio::pin!(keep);
        // A changed record that could not be written yet.
        let mut unwritten = false;
        // The sender is gone: nothing will change any more.
        let mut settled = false;
        let ended = loop {
            tokio::select! {
                r = &mut keep => break r,
                changed = info.changed(), if !unwritten && !settled => match changed {
                    Ok(()) => unwritten = true,
                    Err(_) => settled = true,
                },
                _ = tokio::time::sleep(RETRY), if unwritten => {}
            }
            if unwritten {
                let Some(record) = encode(&info.borrow_and_update()) else {
                    continue;
                };
                match etcd.put(&node_key, record.as_bytes()).await {
                    Ok(_) => unwritten = false,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot write the node record again; retrying")
                    }
                }
            }
        };
        match ended {
            Ok(()) => {
                // Stopping: drop the heartbeat now rather than 40 s later.
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), etcd.lease_revoke(lease)).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the node's lease ended; registering again");
                if let Some(r) = &registered {
                    r.set_not_ready("lease expired; registering again");
                }
            }
        }
    }
}

async fn register(
    etcd: &ClusterClient,
    node_key: &str,
    record: &str,
    lease_key: &str,
    heartbeat: &str,
) -> Result<i64, EtcdError> {
    etcd.put(node_key, record.as_bytes()).await?;
    etcd.put_with_new_lease(lease_key, heartbeat.as_bytes(), LEASE_TTL)
        .await
}
