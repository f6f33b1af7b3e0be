//! Everything the upgrade controller ([`super::controller`]) reads from and does to the world, behind
//! [`UpgradeEffects`]; [`EtcdUpgrade`] is the real cluster, the binary on disk and the member's supervisor;
//! [`super::fake`] holds the controller's tests.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use hostlet_api::objects::{EtcdUpgradeState, SnapshotRecord};
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError, Members as MemberCache};

use super::plan::{MemberState, MemberView};
use crate::etcd_member::gate;
use crate::etcd_member::version::{Capabilities, EtcdVersion};
use crate::etcd_member::MemberRestarter;
use crate::events::{EventKind, EventRecorder};
use crate::snapshots::scheduler::SnapshotScheduler;
use crate::upkeep::{HeldLock, LockStore, MaintenanceLock};

/// How a fresh look at the members may take.
const FRESH_LOOK: Duration = Duration::from_secs(10);

/// How often the binary's metadata is read (a `stat`, nothing more): a replacement starts a look at once.
pub const STAT_EVERY: Duration = Duration::from_millis(250);

/// The upgrade records of every voter's agent.
pub type UpgradeStore = hostlet_runtime::Store<String, hostlet_runtime::Object<EtcdUpgradeState>>;

/// The binary file as it was at a look: a change of any of these means it was replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub len: u64,
    pub modified: Option<SystemTime>,
    pub inode: u64,
}

/// The membership and every member's status, as one look saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    /// The local member's id (0 when unknown).
    pub local_id: u64,
    pub members: Vec<MemberView>,
}

/// What the upgrade controller reads and does.
pub trait UpgradeEffects: Send + Sync + 'static {
    type Lock: HeldLock;
    /// The local member's name (its record's `member`, the messages).
    fn member_name(&self) -> &str;
    /// The binary at `--etcd-binary` (named in messages).
    fn binary(&self) -> &Path;
    /// The binary's metadata now (a `stat`); `None` when it cannot be read.
    fn fingerprint(&self) -> Option<Fingerprint>;
    /// The release the binary holds (its `--version`).
    fn binary_version(&self) -> impl Future<Output = Result<EtcdVersion, String>> + Send;
    /// The members and their statuses; `fresh`: from a look taken now, an error when none could be.
    fn members(&self, fresh: bool) -> impl Future<Output = Result<Members, String>> + Send;
    /// Every agent's upgrade record (this agent's too), as the shared cache holds them.
    fn records(&self) -> Vec<EtcdUpgradeState>;
    /// Writes this agent's upgrade record.
    fn publish(
        &self,
        record: &EtcdUpgradeState,
    ) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// The member's own version gate on the binary, when it has one (it reports its refusals itself):
    /// `Some(Err(message))` when it refuses; `None` without one.
    fn member_gate(&self) -> impl Future<Output = Option<Result<(), String>>> + Send;
    /// The cluster version the local member reports, when it answers.
    fn cluster_version(&self) -> impl Future<Output = Option<EtcdVersion>> + Send;
    /// The alarms raised on any member, as text.
    fn alarms(&self) -> impl Future<Output = Result<Vec<String>, EtcdError>> + Send;
    /// Takes the maintenance lock; `Ok(Err(holder))` when someone holds it.
    fn lock(
        &self,
        operation: &str,
    ) -> impl Future<Output = Result<Result<Self::Lock, String>, EtcdError>> + Send;
    /// The snapshot records that parse.
    fn snapshot_records(
        &self,
    ) -> impl Future<Output = Result<Vec<SnapshotRecord>, EtcdError>> + Send;
    /// Takes a verified snapshot of the local member now.
    fn take_snapshot(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<SnapshotRecord, String>> + Send;
    fn move_leader(&self, to: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Asks the member's supervisor to restart it on the binary on disk: `Ok(how long it did not serve)`
    /// once the new run serves.
    fn restart(&self) -> impl Future<Output = Result<Duration, String>> + Send;
    /// Records an event on this node.
    fn event(
        &self,
        kind: EventKind,
        reason: &'static str,
        message: String,
    ) -> impl Future<Output = ()> + Send;
    fn now(&self) -> SystemTime;
    /// Yields when the binary may have been replaced (none by default: the controller's timer alone).
    fn binary_changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::pending()
    }
    /// The caches whose changes start a look: the upgrade records and the maintenance lock (none by
    /// default).
    fn watched(&self) -> Option<(UpgradeStore, LockStore)> {
        None
    }
}

/// [`UpgradeEffects`] on the real cluster.
pub struct EtcdUpgrade {
    pub etcd: Etcd,
    pub keys: KeyLayout,
    pub node: String,
    pub member_name: String,
    /// The local member's client URL (its `/version`).
    pub local_client_url: String,
    pub tls: Option<hostlet_runtime::TlsFiles>,
    pub binary: PathBuf,
    pub members: MemberCache,
    pub records: UpgradeStore,
    pub restarter: MemberRestarter,
    /// The member's version gate, shared with its supervisor so that a refusal is reported once; `None`:
    /// the controller decides with the cluster version alone and reports its refusals itself.
    pub gate: Option<crate::etcd_member::supervisor::RestartGate>,
    pub snapshots: Arc<SnapshotScheduler>,
    pub events: EventRecorder,
    /// The maintenance lock's cache: its release starts a waiting turn at once.
    pub lock: LockStore,
}

/// The metadata of the file at `path`.
pub fn fingerprint(path: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    })
}

/// Yields when the file at `path` is replaced or changed (its size, time or inode), seen by a `stat`
/// every [`STAT_EVERY`].
fn stat_changes(path: PathBuf) -> impl Stream<Item = ()> + Send + 'static {
    let mut tick = tokio::time::interval(STAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let last = fingerprint(&path);
    futures::stream::unfold((tick, last), move |(mut tick, mut last)| {
        let path = path.clone();
        async move {
            loop {
                tick.tick().await;
                let now = fingerprint(&path);
                if now != last {
                    last = now;
                    return Some(((), (tick, last)));
                }
            }
        }
    })
}

impl UpgradeEffects for EtcdUpgrade {
    type Lock = MaintenanceLock;

    fn member_name(&self) -> &str {
        &self.member_name
    }

    fn binary(&self) -> &Path {
        &self.binary
    }

    fn fingerprint(&self) -> Option<Fingerprint> {
        fingerprint(&self.binary)
    }

    async fn binary_version(&self) -> Result<EtcdVersion, String> {
        Capabilities::probe(&self.binary)
            .await
            .map(|caps| caps.version)
            .map_err(|e| e.to_string())
    }

    async fn members(&self, fresh: bool) -> Result<Members, String> {
        let m = &self.members;
        if fresh && !m.refresh(FRESH_LOOK).await {
            return Err("no fresh look at the members".into());
        }
        let statuses = m.statuses();
        Ok(Members {
            local_id: statuses.local_id.unwrap_or(0),
            members: m
                .list()
                .iter()
                .map(|mem| MemberView {
                    id: mem.id,
                    name: mem.name.clone(),
                    is_learner: mem.is_learner,
                    status: statuses.get(mem.id).map(|s| MemberState {
                        version: EtcdVersion::parse(&s.version),
                        leader: s.leader,
                        raft_index: s.raft_index,
                    }),
                })
                .collect(),
        })
    }

    fn records(&self) -> Vec<EtcdUpgradeState> {
        self.records
            .state()
            .iter()
            .filter_map(|r| r.value.as_ref().ok().cloned())
            .collect()
    }

    async fn publish(&self, record: &EtcdUpgradeState) -> Result<(), EtcdError> {
        let value = serde_json::to_vec(record).unwrap_or_default();
        self.etcd
            .put(self.keys.etcd_upgrade(&self.node), value)
            .await
            .map(|_| ())
    }

    async fn member_gate(&self) -> Option<Result<(), String>> {
        match &self.gate {
            Some(gate) => Some(gate().await),
            None => None,
        }
    }

    async fn cluster_version(&self) -> Option<EtcdVersion> {
        let asked = gate::member_versions(
            std::slice::from_ref(&self.local_client_url),
            self.tls.as_ref(),
        )
        .await;
        asked.into_iter().flatten().find_map(|v| v.cluster)
    }

    async fn alarms(&self) -> Result<Vec<String>, EtcdError> {
        Ok(self
            .etcd
            .alarms()
            .await?
            .into_iter()
            .map(|(id, a)| format!("{a:?} on {id:x}"))
            .collect())
    }

    async fn lock(&self, operation: &str) -> Result<Result<MaintenanceLock, String>, EtcdError> {
        MaintenanceLock::acquire(&self.etcd, &self.keys, &self.node, operation).await
    }

    async fn snapshot_records(&self) -> Result<Vec<SnapshotRecord>, EtcdError> {
        let (kvs, _) = self.etcd.get_prefix(self.keys.snapshots_prefix()).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<SnapshotRecord>(kv.value()).ok())
            .collect())
    }

    async fn take_snapshot(&self, name: &str) -> Result<SnapshotRecord, String> {
        self.snapshots
            .take(name, true, |_| {})
            .await
            .map_err(|e| e.to_string())
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        self.etcd.move_leader(to).await
    }

    async fn restart(&self) -> Result<Duration, String> {
        self.restarter.restart().await
    }

    async fn event(&self, kind: EventKind, reason: &'static str, message: String) {
        self.events.node_event(kind, reason, message).await
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn binary_changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        stat_changes(self.binary.clone())
    }

    fn watched(&self) -> Option<(UpgradeStore, LockStore)> {
        Some((self.records.clone(), self.lock.clone()))
    }
}
