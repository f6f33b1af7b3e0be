//! [`ClusterClient`]: what an agent's writers (its node record and lease, its events, its pods'
//! statuses) write through. An agent that may use etcd writes there; a worker writes through the voters'
//! node API, which checks each key against what that node may do. The writers cannot tell the two apart.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, EtcdError};
use crate::nodeapi::NodeApiClient;

/// etcd itself, or the voters' node API.
#[derive(Clone, Debug)]
pub enum ClusterClient {
    Etcd(Etcd),
    NodeApi(NodeApiClient),
}

impl From<Etcd> for ClusterClient {
    fn from(e: Etcd) -> Self {
        ClusterClient::Etcd(e)
    }
}

impl From<&Etcd> for ClusterClient {
    fn from(e: &Etcd) -> Self {
        ClusterClient::Etcd(e.clone())
    }
}

impl From<NodeApiClient> for ClusterClient {
    fn from(c: NodeApiClient) -> Self {
        ClusterClient::NodeApi(c)
    }
}

impl ClusterClient {
    /// etcd, when this client writes there.
    pub fn etcd(&self) -> Option<&Etcd> {
        match self {
            ClusterClient::Etcd(e) => Some(e),
            ClusterClient::NodeApi(_) => None,
        }
    }

    /// Where requests go: etcd's endpoints or the voters' API URLs.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            ClusterClient::Etcd(e) => e.endpoints(),
            ClusterClient::NodeApi(c) => c.urls(),
        }
    }

    /// Ticks each time a request found nothing to answer it.
    pub fn watch_unreachable(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            ClusterClient::Etcd(e) => e.watch_unreachable(),
            ClusterClient::NodeApi(c) => c.watch_unreachable(),
        }
    }

    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<i64, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.put(key, value.into()).await,
            ClusterClient::NodeApi(c) => c.put(key, value).await,
        }
    }

    pub async fn put_with_lease(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<i64, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.put_with_lease(key, value.into(), lease).await,
            ClusterClient::NodeApi(c) => c.put_with_lease(key, value, lease).await,
        }
    }

    /// Deletes one key; how many went (0 or 1).
    pub async fn delete(&self, key: &str) -> Result<i64, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.delete(key).await,
            ClusterClient::NodeApi(c) => c.delete(key).await,
        }
    }

    /// The keys under `prefix`.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<Vec<u8>>, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.keys_with_prefix(prefix).await,
            ClusterClient::NodeApi(c) => Ok(c
                .list(prefix)
                .await?
                .0
                .into_iter()
                .map(|kv| kv.key.into_bytes())
                .collect()),
        }
    }

    /// The keys and values under `prefix`.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => Ok(e
                .get_prefix(prefix)
                .await?
                .0
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.value().to_vec(),
                    )
                })
                .collect()),
            ClusterClient::NodeApi(c) => Ok(c
                .list(prefix)
                .await?
                .0
                .into_iter()
                .map(|kv| (kv.key, kv.value))
                .collect()),
        }
    }

    /// Writes `key` attached to a new lease of `ttl`; the lease. Through the node API this is one request,
    /// so a lease is never granted by one voter and used at another before it holds a key.
    pub async fn put_with_new_lease(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        ttl: Duration,
    ) -> Result<i64, EtcdError> {
        match self {
            ClusterClient::Etcd(e) => {
                let lease = e.lease_grant(ttl).await?;
                e.put_with_lease(key, value.into(), lease).await?;
                Ok(lease)
            }
            ClusterClient::NodeApi(c) => c.put_with_new_lease(key, value, ttl).await,
        }
    }

    pub async fn lease_revoke(&self, lease: i64) -> Result<(), EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.lease_revoke(lease).await,
            ClusterClient::NodeApi(c) => c.lease_revoke(lease).await,
        }
    }

    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<(), EtcdError> {
        match self {
            ClusterClient::Etcd(e) => e.lease_keep_alive_once(lease).await,
            ClusterClient::NodeApi(c) => c.lease_keep_alive_once(lease).await,
        }
    }

    /// Keeps a lease alive every `interval` until `cancel` fires (`Ok`) or the lease expires
    /// ([`EtcdError::LeaseExpired`]). A failed renewal is tried again after `retry` until one succeeds: a
    /// short outage must not end the lease while its TTL covers it.
    pub async fn keep_lease_alive_retrying(
        &self,
        lease: i64,
        interval: Duration,
        retry: Duration,
        cancel: CancellationToken,
    ) -> Result<(), EtcdError> {
        let mut wait = interval;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
            wait = match self.lease_keep_alive_once(lease).await {
                Ok(_) => interval,
                Err(e @ EtcdError::LeaseExpired(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(lease, error = %e, "lease renewal failed; retrying");
                    retry
                }
            };
        }
    }
}
