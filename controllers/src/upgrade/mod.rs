//! The rolling etcd upgrade: a new etcd binary rolled through the cluster one member at a time.
//!
//! One [`UpgradeController`] runs on every agent that runs a member. It reads the metadata of the binary
//! at `--etcd-binary` every 250 ms (its size, time and inode; `--version` only when they change, and at
//! least every `--etcd-binary-check-interval`) and publishes what it sees in `/hostlet/etcd/upgrades/<node>` (the release the member runs,
//! the one on disk, and where the upgrade stands). When the two differ, the agent:
//!
//! 1. passes the version gate (the new release against the cluster version; a refusal leaves the member
//!    running as it is, with an `EtcdUpgradeRefused` event);
//! 2. waits for its turn: the leader goes last, while another voter's record says it waits;
//! 3. takes the maintenance lock (the one upkeep's compaction and defragmentation take), so one member
//!    restarts at a time in the whole cluster;
//! 4. checks, on a fresh look, that the cluster can lose this member: at least 3 voters (or
//!    `--etcd-allow-single-member-upgrade`), every voter started and answering, no alarm, no learner, every
//!    voter (this member too) caught up with the leader ([`plan::ready_to_restart`]); anything else waits, with an
//!    `EtcdUpgradeWaiting` event per distinct reason;
//! 5. makes sure a verified snapshot was taken since the change was first noticed by any agent, taking one
//!    of its own member (`pre-etcd-upgrade`) if not;
//! 6. hands leadership to another voter if it leads;
//! 7. restarts its member on the new binary (the supervisor's restart passes the version gate again),
//!    waits until it serves the new release and has caught up, records `EtcdUpgraded` and lets the lock go.
//!
//! Workers run no member and no upgrade controller. Effects go through [`effects::UpgradeEffects`]
//! ([`effects::EtcdUpgrade`] on the real cluster).

pub mod controller;
pub mod effects;
#[cfg(test)]
mod fake;
pub mod plan;

pub use controller::{UpgradeConfig, UpgradeController};
pub use effects::{EtcdUpgrade, UpgradeEffects, UpgradeStore};

/// The informer label of the upgrade records' cache.
pub const UPGRADES_INFORMER: &str = "etcd-upgrades";

/// The shared cache of every agent's upgrade record.
pub fn records_store(
    factory: &hostlet_runtime::InformerFactory,
    keys: &hostlet_api::KeyLayout,
) -> UpgradeStore {
    factory.store(
        UPGRADES_INFORMER,
        keys.etcd_upgrades_prefix(),
        |_key, value| serde_json::from_slice::<hostlet_api::objects::EtcdUpgradeState>(value),
    )
}
