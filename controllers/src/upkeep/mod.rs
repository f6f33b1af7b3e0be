//! etcd upkeep: compaction, rolling defragmentation, and NOSPACE healed without an operator.
//!
//! etcd keeps every revision until compacted and returns freed pages to the disk only when defragmented; at
//! its quota it raises NOSPACE and refuses every write. One [`UpkeepController`] runs on every agent that
//! runs a member. Each reads the same figures — the membership, every member's status (db size, in use,
//! leader), the alarms, the maintenance lock (`/hostlet/etcd/maintenance-lock`) — and [`plan::plan`]
//! decides, on plain data, what this agent does:
//!
//! - **Compaction** (`--etcd-compaction-retention`), on the leader only, physical, under the lock.
//! - **Defragmentation**, rolling: each agent defragments only its own member, when the figures name it
//!   next — followers first by id, the leader last, after handing leadership to a follower — under the
//!   lock, never while a learner catches up or a snapshot of that member is being taken (the snapshot
//!   scheduler's own flag), and not while any member is silent.
//! - **NOSPACE**: the leader compacts up to the current revision, the members defragment in the same
//!   order, and the leader disarms once every member fits; if the live data does not fit, it says so
//!   (event, `hostlet_etcd_space_exhausted`, log) and stops. etcd refuses the lock's write then, so the
//!   order named by the figures is what keeps it to one member at a time; events are kept and written once
//!   etcd takes writes again, with the time they happened.
//!
//! Caches: the maintenance lock key ([`lock_store`]): its release wakes the controller, so the next
//! member's turn starts at once. etcd membership, status and alarms cannot be watched: the controller polls
//! them through its own queue (`Action::Requeue`), every 5 s, every 1 s while something is under way.
//! Effects go through [`effects::Upkeep`] ([`effects::EtcdUpkeep`] on the real cluster).

pub mod controller;
pub mod effects;
#[cfg(test)]
mod fake;
pub mod lock;
pub mod metrics;
pub mod plan;

pub use controller::{UpkeepConfig, UpkeepController, DEFAULT_QUOTA};
pub use effects::{EtcdUpkeep, HeldLock, SnapshotProbe, Upkeep};
pub use lock::{LockStore, MaintenanceLock};
pub use metrics::UpkeepMetrics;
pub use plan::{Retention, Threshold};

/// The shared cache of the maintenance lock key (informer `maintenance-lock`), through the agent's
/// `factory`: the upkeep controller's trigger.
pub fn lock_store(
    factory: &hostlet_runtime::InformerFactory,
    keys: &hostlet_api::KeyLayout,
) -> LockStore {
    factory.store(
        "maintenance-lock",
        keys.maintenance_lock(),
        |_key, value: &[u8]| Ok::<_, std::convert::Infallible>(value.to_vec()),
    )
}
