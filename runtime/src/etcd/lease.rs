//! Leases: grant, revoke, the keys attached, and keeping one alive.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Etcd, EtcdError};

impl Etcd {
    /// Grants a lease of `ttl`; returns its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let secs = ttl.as_secs().max(1) as i64;
        let resp = self
            .with_retry(|mut c| async move { c.lease_grant(secs, None).await })
            .await?;
        Ok(resp.id())
    }

    pub async fn lease_revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.with_retry(|mut c| async move { c.lease_revoke(lease).await })
            .await?;
        Ok(())
    }

    /// The keys attached to a lease; `None` when the lease does not exist (expired or revoked).
    pub async fn lease_keys(&self, lease: i64) -> Result<Option<Vec<String>>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.lease_time_to_live(
                    lease,
                    Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
                )
                .await
            })
            .await?;
        if resp.ttl() < 0 {
            return Ok(None);
        }
        Ok(Some(
            resp.keys()
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
        ))
    }

    /// Renews a lease once. An expired (or revoked) lease is [`EtcdError::LeaseExpired`].
    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<(), EtcdError> {
        // Opening the keep-alive stream sends the first renewal and checks its answer.
        let result = self
            .with_retry(|mut c| async move { c.lease_keep_alive(lease).await.map(|_| ()) })
            .await;
        match result {
            Err(EtcdError::Request(e))
                if matches!(*e, etcd_client::Error::LeaseKeepAliveError(_)) =>
            {
                Err(EtcdError::LeaseExpired(lease))
            }
            other => other,
        }
    }

    /// Keeps a lease alive every `interval` until `cancel` fires (returns `Ok`) or the lease expires
    /// (returns [`EtcdError::LeaseExpired`]; grant a new one). Failed renewals are retried at the next tick:
    /// a short etcd outage must not end the caller's lease as long as the TTL covers it.
    pub async fn keep_lease_alive(
        &self,
        lease: i64,
        interval: Duration,
        cancel: CancellationToken,
    ) -> Result<(), EtcdError> {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            match self.lease_keep_alive_once(lease).await {
                Ok(_) => {}
                Err(e @ EtcdError::LeaseExpired(_)) => return Err(e),
                Err(e) => tracing::warn!(lease, error = %e, "lease renewal failed; retrying"),
            }
        }
    }
}
