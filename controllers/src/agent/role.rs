//! The host's role, decided once: an external etcd cluster (from the configuration), else what the start
//! of the local member makes of the data dir (a member, started, joined or rejoined; or a worker, whose
//! data dir says so or whose join found the voter target full).

use anyhow::Context;
use hostlet_runtime::TlsFiles;
use tokio_util::sync::CancellationToken;

use super::arrival::counts_tombstone;
use super::common::Base;
use super::running::Datastore;
use crate::disk::DiskPressure;
use crate::etcd_member::{self, MemberError, StartedMember, WorkerStart};
use crate::tombstone::{self, Rejoined, TombstoneMetrics};

/// What this host is in the cluster.
pub(super) enum Role {
    /// Runs an etcd member (a voter, or a learner on its way to one) and holds the CAs.
    Member(MemberStart),
    /// Runs no etcd: reaches the cluster through the voters' node API.
    Worker(WorkerStart, Option<Rejoined>),
    /// Uses an etcd cluster hostlet does not run (`--etcd-endpoints`).
    External(ExternalEtcd),
}

/// A member that serves, and how it came to.
pub(super) struct MemberStart {
    pub started: Box<StartedMember>,
    pub rejoined: Option<Rejoined>,
    pub tombstones: TombstoneMetrics,
    /// This data dir was a worker's until this start.
    pub was_worker: bool,
}

/// `--etcd-endpoints` and how to reach them.
pub(super) struct ExternalEtcd {
    pub endpoints: Vec<String>,
    pub tls: Option<TlsFiles>,
    /// `--token`, else the data dir's token file.
    pub token: Option<String>,
}

impl Role {
    /// Decides the role, starting the local member where there is one. `Ok(None)`: asked to stop before
    /// the member served (say, while a join waited its turn).
    pub async fn decide(
        datastore: Datastore,
        base: &Base,
        disk: DiskPressure,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<Role>> {
        let mut mcfg = match datastore {
            Datastore::External {
                endpoints,
                tls,
                token,
            } => {
                return Ok(Some(Role::External(ExternalEtcd {
                    endpoints,
                    tls,
                    token,
                })))
            }
            Datastore::Member(mcfg) => mcfg,
        };
        // Read before the start, which turns a worker's data dir into a member's.
        let was_worker = etcd_member::worker::is_worker(&base.layout);
        mcfg.disk = Some(disk);
        let tm = TombstoneMetrics::register(base.metrics.registry())
            .context("registering the tombstone metrics")?;
        let started = tombstone::start_member(
            &mcfg,
            base.member_metrics.clone(),
            &base.readiness,
            shutdown,
        )
        .await;
        let (started, rejoined) = match started {
            Ok(s) => s,
            Err(tombstone::StartError::Member(MemberError::Cancelled)) => {
                tracing::info!("stopped before the etcd member served");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if counts_tombstone(rejoined.as_ref()) {
            tm.tombstones_total.inc();
        }
        tm.data_dir_backups
            .set(tombstone::datadir::backups(&base.layout.db_dir()).len() as i64);
        Ok(Some(match started {
            tombstone::Started::Worker(w) => Role::Worker(w, rejoined),
            tombstone::Started::Member(started) => Role::Member(MemberStart {
                started,
                rejoined,
                tombstones: tm,
                was_worker,
            }),
        }))
    }
}
