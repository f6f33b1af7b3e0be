//! The maintenance lock: `/hostlet/etcd/maintenance-lock`, created only when absent, on a lease kept alive
//! while its holder works. A holder that dies lets it go when the lease expires.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use hostlet_api::objects::Timestamp;
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// A cache of the maintenance lock key (its raw value).
pub type LockStore = hostlet_runtime::Store<String, hostlet_runtime::Object<Vec<u8>>>;

/// The lock's lease: a dead holder blocks the others this long at most.
pub const LOCK_TTL: Duration = Duration::from_secs(15);

/// What the lock's value says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// The node (or `cli@<host>`) holding it.
    pub holder: String,
    /// What it does: `defrag <member>`, `compact <revision>`.
    pub operation: String,
    pub since: Timestamp,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, since {})",
            self.holder,
            self.operation,
            humantime::format_rfc3339_seconds(self.since.0)
        )
    }
}

/// A held lock; [`MaintenanceLock::release`] it when done (dropping it only stops the renewals, and the
/// lease expires).
#[derive(Debug)]
pub struct MaintenanceLock {
    etcd: Etcd,
    lease: i64,
    renewals: CancellationToken,
}

impl Drop for MaintenanceLock {
    fn drop(&mut self) {
        self.renewals.cancel();
    }
}

impl MaintenanceLock {
    /// Takes the lock for `operation` if nobody holds it; `Err(holder)` when someone does.
    pub async fn acquire(
        etcd: &Etcd,
        keys: &KeyLayout,
        holder: &str,
        operation: &str,
    ) -> Result<Result<MaintenanceLock, String>, EtcdError> {
        let key = keys.maintenance_lock();
        let lease = etcd.lease_grant(LOCK_TTL).await?;
        let value = serde_json::to_vec(&LockHolder {
            holder: holder.to_string(),
            operation: operation.to_string(),
            since: Timestamp::now(),
        })
        .unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        // Not retried elsewhere: a put applied by an endpoint that then failed would read as "held by us"
        // on a retry, which the value tells apart anyway.
        let resp = etcd.txn(txn).await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                let _ = etcd.lease_revoke(lease).await;
                return Err(e);
            }
        };
        if !resp.succeeded() {
            let _ = etcd.lease_revoke(lease).await;
            let held_by = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    etcd_client::TxnOpResponse::Get(g) => {
                        g.kvs().first().map(|kv| describe(kv.value()))
                    }
                    _ => None,
                })
                .unwrap_or_else(|| "someone (the lock went meanwhile)".into());
            return Ok(Err(held_by));
        }
        let renewals = CancellationToken::new();
        {
            let (etcd, renewals) = (etcd.clone(), renewals.clone());
            tokio::spawn(async move {
                if let Err(e) = etcd.keep_lease_alive(lease, LOCK_TTL / 3, renewals).await {
                    tracing::warn!(error = %e, "the maintenance lock's lease expired");
                }
            });
        }
        Ok(Ok(MaintenanceLock {
            etcd: etcd.clone(),
            lease,
            renewals,
        }))
    }

    /// Lets the lock go (revokes its lease, which deletes the key).
    pub async fn release(self) {
        self.renewals.cancel();
        if let Err(e) = self.etcd.lease_revoke(self.lease).await {
            tracing::warn!(error = %e, "cannot release the maintenance lock; it expires with its lease");
        }
    }
}

/// Who holds the lock now: `None` when nobody does.
pub async fn holder(etcd: &Etcd, keys: &KeyLayout) -> Result<Option<String>, EtcdError> {
    Ok(etcd
        .get(keys.maintenance_lock())
        .await?
        .map(|kv| describe(kv.value())))
}

pub(crate) fn describe(value: &[u8]) -> String {
    match serde_json::from_slice::<LockHolder>(value) {
        Ok(h) => h.to_string(),
        Err(_) => format!(
            "an unreadable holder ({:?})",
            String::from_utf8_lossy(value)
        ),
    }
}
