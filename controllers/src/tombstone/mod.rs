//! Tombstones and cluster reset: a removed or broken member backs its data up and rejoins; a lost quorum is
//! recovered from the member's data or a snapshot. Data is moved, never deleted.

pub mod controller;
pub mod datadir;
pub mod effects;
#[cfg(test)]
mod fake;
pub mod handler;
pub mod quorum;
pub mod rejoin;
pub mod reset;
pub mod standing;
pub mod start;

use prometheus::{IntCounter, IntGauge, Registry};

pub use start::{start_member, Rejoined, StartError, Started};

/// `hostlet_tombstones_total`, `hostlet_data_dir_backups`, `hostlet_cluster_resets_total`.
#[derive(Clone)]
pub struct TombstoneMetrics {
    pub tombstones_total: IntCounter,
    pub data_dir_backups: IntGauge,
    pub cluster_resets_total: IntCounter,
}

impl TombstoneMetrics {
    pub fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = TombstoneMetrics {
            tombstones_total: IntCounter::new(
                "hostlet_tombstones_total",
                "Member dirs backed up because of a tombstone (this process).",
            )?,
            data_dir_backups: IntGauge::new(
                "hostlet_data_dir_backups",
                "db/etcd-backup-* dirs kept.",
            )?,
            cluster_resets_total: IntCounter::new(
                "hostlet_cluster_resets_total",
                "Cluster resets this node's data dir records (one line each in db/reset-flag).",
            )?,
        };
        r.register(Box::new(m.tombstones_total.clone()))?;
        r.register(Box::new(m.data_dir_backups.clone()))?;
        r.register(Box::new(m.cluster_resets_total.clone()))?;
        Ok(m)
    }
}
