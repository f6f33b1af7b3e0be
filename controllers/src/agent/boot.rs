//! The agent's boot: which etcd this host talks through, decided once as its [`Role`], and what that role
//! starts. `hostlet run` hands it a [`BootConfig`] made from its flags and gets back a [`Running`] agent,
//! whose [`Running::stop`] drains every task it owns and says how it ended.

use tokio_util::sync::CancellationToken;

use super::common::Base;
use super::role::Role;
use super::running::{BootConfig, Running};
use super::{external, member, worker};

/// Boots the agent. `Ok(None)`: asked to stop before the member served (say, while a join waited its
/// turn).
///
/// 1. The role ([`Role::decide`]): `--etcd-endpoints` makes it external; otherwise the local member
///    starts (or joins, or rejoins after a tombstone) as the data dir says, and comes back a member or,
///    where the voter target is full or the data dir is a worker's, a worker.
/// 2. That role's start, in its own file, every task in the agent's task set:
///    - a member (`member.rs`): the join service, the node API and its watch hubs, the revocation list,
///      its own certificates' renewal and serials, the cluster policy seed, every controller;
///    - a worker (`worker.rs`): the watch for its own revocation and for a request to become a member,
///      its certificates' renewal through the voters, the pod controller;
///    - external (`external.rs`): the pod controller on that cluster.
///
///    Each then says how it arrived, registers the node, and serves the pods' routes.
pub async fn boot(
    cfg: BootConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Running>> {
    let (base, datastore, disk) = Base::new(cfg, shutdown);
    let Some(role) = Role::decide(datastore, &base, disk, shutdown).await? else {
        return Ok(None);
    };
    let running = match role {
        Role::Member(m) => member::start(base, m)?,
        Role::Worker(w, rejoined) => worker::start(base, w, rejoined)?,
        Role::External(x) => external::start(base, x).await?,
    };
    Ok(Some(running))
}
