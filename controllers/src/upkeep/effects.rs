//! Everything the upkeep controller reads from and does to etcd, behind [`Upkeep`]; [`EtcdUpkeep`] is the
//! real cluster.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use hostlet_api::objects::Timestamp;
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError, Members as MemberCache};

use super::lock::{LockStore, MaintenanceLock};
use super::plan::{AlarmKind, LockState, MemberObs, MemberStatus};
use crate::events::{EventKind, EventRecorder};

/// A member's status may take this long; one that answers later counts as silent (and stops the plan).
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a fresh look through the shared member cache may take.
const FRESH_LOOK: Duration = Duration::from_secs(10);

/// The membership and every member's figures, as the local member sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    pub local_id: u64,
    pub members: Vec<MemberObs>,
}

/// A held maintenance lock.
pub trait HeldLock: Send + 'static {
    /// Gives the lock back at once (dropped without this, it lapses with its lease).
    fn release(self) -> impl Future<Output = ()> + Send;
}

impl HeldLock for MaintenanceLock {
    async fn release(self) {
        MaintenanceLock::release(self).await
    }
}

/// What the controller does to the cluster.
pub trait Upkeep: Send + Sync + 'static {
    type Lock: HeldLock;
    /// The node this agent runs on (the lock's holder name).
    fn node(&self) -> &str;
    /// `fresh`: from a look taken now, not the last one the shared cache took (while acting, the
    /// figures must show what the last step did).
    fn members(&self, fresh: bool) -> impl Future<Output = Result<Members, EtcdError>> + Send;
    fn alarms(&self) -> impl Future<Output = Result<Vec<(u64, AlarmKind)>, EtcdError>> + Send;
    fn lock_state(&self) -> impl Future<Output = Result<LockState, EtcdError>> + Send;
    /// Takes the maintenance lock; `Ok(Err(holder))` when someone holds it.
    fn lock(
        &self,
        operation: &str,
    ) -> impl Future<Output = Result<Result<Self::Lock, String>, EtcdError>> + Send;
    fn revision(&self) -> impl Future<Output = Result<i64, EtcdError>> + Send;
    fn is_compacted_to(
        &self,
        revision: i64,
    ) -> impl Future<Output = Result<bool, EtcdError>> + Send;
    /// Physical compaction up to `revision`.
    fn compact(&self, revision: i64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn defragment_local(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn move_leader(&self, to: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn disarm_nospace(&self, member: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn raise_nospace(&self, member: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn snapshot_in_progress(&self) -> bool;
    /// Writes an event that happened at `at`; an error when etcd refuses it (the caller keeps it).
    fn event(
        &self,
        kind: EventKind,
        reason: &str,
        message: &str,
        at: Timestamp,
    ) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn now(&self) -> SystemTime;
    /// Yields when what [`Upkeep::members`] reads may have changed (none by default: the controller's
    /// timer alone).
    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::pending()
    }
}

/// Whether a snapshot of the local member is being taken.
pub type SnapshotProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// [`Upkeep`] over the real cluster.
#[derive(Clone)]
pub struct EtcdUpkeep {
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    local_endpoint: String,
    events: EventRecorder,
    snapshots: SnapshotProbe,
    defrag_timeout: Duration,
    /// The agent's shared member cache and maintenance lock cache, when given: read instead of asking.
    members: Option<MemberCache>,
    lock: Option<LockStore>,
}

impl EtcdUpkeep {
    /// `local_endpoint`: the local member's client URL (its status, its defragmentation).
    pub fn new(
        etcd: Etcd,
        keys: KeyLayout,
        node: &str,
        local_endpoint: impl Into<String>,
        snapshots: SnapshotProbe,
        defrag_timeout: Duration,
    ) -> Self {
        EtcdUpkeep {
            events: EventRecorder::new(etcd.clone(), keys.clone(), node),
            etcd,
            keys,
            node: node.to_string(),
            local_endpoint: local_endpoint.into(),
            snapshots,
            defrag_timeout,
            members: None,
            lock: None,
        }
    }

    /// Records events through the agent's one recorder (one aggregation, one per-node cap).
    #[must_use]
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = events;
        self
    }

    /// Reads the members, their figures and the maintenance lock from the agent's shared caches.
    #[must_use]
    pub fn with_caches(mut self, members: MemberCache, lock: LockStore) -> Self {
        self.members = Some(members);
        self.lock = Some(lock);
        self
    }
}

/// The members and their figures as the shared member cache last saw them.
fn cached_figures(cache: &MemberCache) -> Members {
    let statuses = cache.statuses();
    Members {
        local_id: statuses.local_id.unwrap_or(0),
        members: cache
            .list()
            .iter()
            .map(|m| MemberObs {
                id: m.id,
                name: if m.name.is_empty() {
                    format!("{:x}", m.id)
                } else {
                    m.name.clone()
                },
                is_learner: m.is_learner,
                status: statuses.get(m.id).map(|s| MemberStatus {
                    db_size: s.db_size.max(0) as u64,
                    in_use: s.db_size_in_use.max(0) as u64,
                    leader: s.leader,
                    raft_index: s.raft_index,
                }),
            })
            .collect(),
    }
}

/// Every member's status, asked concurrently at its own client URL; `None` for those that do not answer.
pub async fn member_figures(etcd: &Etcd, members: &[etcd_client::Member]) -> Vec<MemberObs> {
    let asks = members.iter().map(|m| async move {
        let status = match m.client_urls().first() {
            Some(url) => match tokio::time::timeout(STATUS_TIMEOUT, etcd.status_of(url)).await {
                Ok(Ok(s)) => Some(MemberStatus {
                    db_size: s.db_size().max(0) as u64,
                    in_use: s.raft_used_db_size().max(0) as u64,
                    leader: s.leader(),
                    raft_index: s.raft_index(),
                }),
                _ => None,
            },
            None => None,
        };
        MemberObs {
            id: m.id(),
            name: if m.name().is_empty() {
                format!("{:x}", m.id())
            } else {
                m.name().to_string()
            },
            is_learner: m.is_learner(),
            status,
        }
    });
    futures::future::join_all(asks).await
}

/// etcd's alarm list as the plan reads it.
pub fn alarm_kinds(alarms: &[(u64, etcd_client::AlarmType)]) -> Vec<(u64, AlarmKind)> {
    alarms
        .iter()
        .filter_map(|(m, a)| match a {
            etcd_client::AlarmType::Nospace => Some((*m, AlarmKind::NoSpace)),
            etcd_client::AlarmType::Corrupt => Some((*m, AlarmKind::Corrupt)),
            _ => None,
        })
        .collect()
}

impl Upkeep for EtcdUpkeep {
    type Lock = MaintenanceLock;

    fn node(&self) -> &str {
        &self.node
    }

    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let cache = self.members.clone();
        let statuses = cache.as_ref().map(|c| c.watch_statuses());
        let identity = cache.as_ref().map(|c| c.store().subscribe());
        let statuses = futures::stream::unfold(statuses, |s| async move {
            let mut s = s?;
            s.changed().await.ok()?;
            Some(((), Some(s)))
        });
        let identity = futures::stream::unfold(identity, |c| async move {
            let mut c = c?;
            c.next_batch().await?;
            Some(((), Some(c)))
        });
        futures::stream::select(statuses, identity)
    }

    async fn members(&self, fresh: bool) -> Result<Members, EtcdError> {
        if let Some(cache) = &self.members {
            if !fresh || cache.refresh(FRESH_LOOK).await {
                return Ok(cached_figures(cache));
            }
            // No fresh look through the cache: ask directly, which says why it fails.
        }
        let local = self.etcd.status_of(&self.local_endpoint).await?;
        let list = self.etcd.member_list().await?;
        Ok(Members {
            local_id: local.header().map(|h| h.member_id()).unwrap_or(0),
            members: member_figures(&self.etcd, &list).await,
        })
    }

    async fn alarms(&self) -> Result<Vec<(u64, AlarmKind)>, EtcdError> {
        Ok(alarm_kinds(&self.etcd.alarms().await?))
    }

    async fn lock_state(&self) -> Result<LockState, EtcdError> {
        if let Some(store) = &self.lock {
            return Ok(match store.get(&self.keys.maintenance_lock()) {
                Some(obj) => match obj.valid() {
                    Some(v) => LockState::Held(super::lock::describe(v)),
                    None => LockState::Held("an unreadable holder".to_string()),
                },
                None => LockState::Free,
            });
        }
        Ok(match super::lock::holder(&self.etcd, &self.keys).await? {
            Some(h) => LockState::Held(h),
            None => LockState::Free,
        })
    }

    async fn lock(&self, operation: &str) -> Result<Result<MaintenanceLock, String>, EtcdError> {
        MaintenanceLock::acquire(&self.etcd, &self.keys, &self.node, operation).await
    }

    async fn revision(&self) -> Result<i64, EtcdError> {
        self.etcd.revision().await
    }

    async fn is_compacted_to(&self, revision: i64) -> Result<bool, EtcdError> {
        self.etcd.is_compacted_to(revision).await
    }

    async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        self.etcd.compact(revision, true).await
    }

    async fn defragment_local(&self) -> Result<(), EtcdError> {
        self.etcd
            .defragment_at(&self.local_endpoint, self.defrag_timeout)
            .await
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        self.etcd.move_leader(to).await
    }

    async fn disarm_nospace(&self, member: u64) -> Result<(), EtcdError> {
        self.etcd
            .alarm_disarm(member, etcd_client::AlarmType::Nospace)
            .await
    }

    async fn raise_nospace(&self, member: u64) -> Result<(), EtcdError> {
        self.etcd
            .alarm_activate(member, etcd_client::AlarmType::Nospace)
            .await
    }

    fn snapshot_in_progress(&self) -> bool {
        (self.snapshots)()
    }

    async fn event(
        &self,
        kind: EventKind,
        reason: &str,
        message: &str,
        at: Timestamp,
    ) -> Result<(), EtcdError> {
        self.events.node_event_at(kind, reason, message, at).await
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The quota a member runs with, from its own `/metrics` (`etcd_server_quota_backend_bytes`); `None` when
/// they cannot be read.
pub async fn quota_of(client_url: &str, tls: Option<&hostlet_runtime::TlsFiles>) -> Option<u64> {
    let mut http = reqwest::Client::builder().timeout(STATUS_TIMEOUT);
    if let Some(tls) = tls {
        let mut identity = std::fs::read(&tls.cert).ok()?;
        identity.push(b'\n');
        identity.extend(std::fs::read(&tls.key).ok()?);
        http = http
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&tls.ca).ok()?).ok()?,
            )
            .identity(reqwest::Identity::from_pem(&identity).ok()?);
    }
    let url = format!("{}/metrics", client_url.trim_end_matches('/'));
    let text = http
        .build()
        .ok()?
        .get(url)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_server_quota_backend_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}
