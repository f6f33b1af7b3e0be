//! A cluster in memory behind [`UpgradeEffects`], shared by the agents of its members, and the upgrade
//! controller's tests on it: every step each agent takes, in the order it takes them, on tokio's paused
//! clock.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{
    EtcdUpgradeState, SnapshotRecord, SnapshotStatus, Timestamp, UpgradePhase,
};
use hostlet_runtime::EtcdError;
use tokio::time::Instant;

use super::effects::{Fingerprint, Members, UpgradeEffects};
use super::plan::{MemberState, MemberView, CAUGHT_UP_LAG};
use crate::etcd_member::version::EtcdVersion;
use crate::events::EventKind;
use crate::upkeep::HeldLock;

/// How long a fresh look at the members takes (it waits for a look that begins after it is asked).
pub const LOOK_TAKES: Duration = Duration::from_millis(20);
/// How long a member restarted on a binary that works does not serve.
pub const DOWN_FOR: Duration = Duration::from_millis(800);

/// What the supervisor's restart of a member does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// The new run serves the binary's release, caught up with the leader.
    Back,
    /// The supervisor answers this error; the old run serves on.
    Fails(String),
    /// The new run served once, then stopped answering.
    Silent,
    /// The new run serves the binary's release but stays far behind the leader.
    Behind,
}

/// One agent's side of the world: its host's binary and its member's supervisor.
#[derive(Debug, Clone)]
pub struct Side {
    /// The release of the binary on disk; `None` while it cannot be read.
    pub binary: Option<EtcdVersion>,
    /// Bumped by each replacement of the binary (its inode).
    pub replaced: u64,
    pub restart: Restart,
    /// The member's own version gate, when it has one.
    pub gate: Option<Result<(), String>>,
}

/// One call an agent made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Probe,
    Look { fresh: bool },
    Gate,
    Alarms,
    Lock(String),
    LockRefused(String),
    Release,
    SnapshotRecords,
    Snapshot(String),
    MoveLeader(u64),
    Restart,
    Publish(UpgradePhase, String),
    Event(String),
}

impl Call {
    /// A call that changes the world (the reads and the record's writes left out).
    fn acts(&self) -> bool {
        matches!(
            self,
            Call::Lock(_)
                | Call::Release
                | Call::Snapshot(_)
                | Call::MoveLeader(_)
                | Call::Restart
                | Call::Event(_)
        )
    }
}

/// The cluster, what its agents' hosts hold, and what was done to it.
#[derive(Debug)]
pub struct World {
    pub members: Vec<MemberView>,
    /// Member name → its agent's upgrade record.
    pub records: BTreeMap<String, EtcdUpgradeState>,
    pub alarms: Vec<String>,
    /// The maintenance lock: (holder, operation).
    pub lock: Option<(String, String)>,
    pub cluster_version: Option<EtcdVersion>,
    pub snapshots: Vec<SnapshotRecord>,
    /// The next snapshots fail with this.
    pub snapshot_error: Option<String>,
    /// Whether a leadership move takes effect.
    pub leadership_moves: bool,
    /// Node → its side.
    pub sides: BTreeMap<String, Side>,
    /// (node, call), in order.
    pub calls: Vec<(String, Call)>,
    /// (node, reason, message), in order.
    pub events: Vec<(String, String, String)>,
    origin: (Instant, SystemTime),
}

pub fn v(s: &str) -> EtcdVersion {
    EtcdVersion::parse(s).unwrap()
}

/// A voter `m<id>` on `version`, following `leader`, at raft index 100.
pub fn voter(id: u64, leader: u64, version: &str) -> MemberView {
    MemberView {
        id,
        name: format!("m{id}"),
        is_learner: false,
        status: Some(MemberState {
            version: Some(v(version)),
            leader,
            raft_index: 100,
        }),
    }
}

impl World {
    /// `n` voters `m1..mn` on `version`, led by `m<leader>`, each run by the agent of node `n<id>` whose
    /// binary holds `version`.
    pub fn cluster(n: u64, leader: u64, version: &str) -> World {
        World {
            members: (1..=n).map(|i| voter(i, leader, version)).collect(),
            records: BTreeMap::new(),
            alarms: Vec::new(),
            lock: None,
            cluster_version: Some(EtcdVersion::new(v(version).major, v(version).minor, 0)),
            snapshots: Vec::new(),
            snapshot_error: None,
            leadership_moves: true,
            sides: (1..=n)
                .map(|i| {
                    let side = Side {
                        binary: Some(v(version)),
                        replaced: 0,
                        restart: Restart::Back,
                        gate: None,
                    };
                    (format!("n{i}"), side)
                })
                .collect(),
            calls: Vec::new(),
            events: Vec::new(),
            origin: (Instant::now(), SystemTime::now()),
        }
    }

    /// Replaces the binary on `node` by one of `version`, as a package upgrade does.
    pub fn replace(&mut self, node: &str, version: &str) {
        let side = self.side(node);
        side.binary = Some(v(version));
        side.replaced += 1;
    }

    pub fn side(&mut self, node: &str) -> &mut Side {
        self.sides.get_mut(node).expect("no such node")
    }

    pub fn member(&mut self, id: u64) -> &mut MemberView {
        self.members
            .iter_mut()
            .find(|m| m.id == id)
            .expect("no such member")
    }

    pub fn now(&self) -> SystemTime {
        self.origin.1 + self.origin.0.elapsed()
    }

    /// What `node` did to the world, in order.
    pub fn acts(&self, node: &str) -> Vec<Call> {
        self.calls
            .iter()
            .filter(|(n, c)| n == node && c.acts())
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Every node's restarts, in order.
    pub fn restarts(&self) -> Vec<&str> {
        self.calls
            .iter()
            .filter(|(_, c)| *c == Call::Restart)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// `member`'s record's phase and message.
    pub fn phase(&self, member: &str) -> Option<(UpgradePhase, String)> {
        self.records
            .get(member)
            .map(|r| (r.phase, r.message.clone()))
    }

    /// `node`'s events as (reason, message).
    pub fn events_of(&self, node: &str) -> Vec<(&str, &str)> {
        self.events
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, r, m)| (r.as_str(), m.as_str()))
            .collect()
    }

    /// `node`'s events' reasons.
    pub fn reasons(&self, node: &str) -> Vec<&str> {
        self.events_of(node).into_iter().map(|(r, _)| r).collect()
    }

    fn leader(&self) -> u64 {
        self.members
            .iter()
            .filter_map(|m| m.status.map(|s| s.leader))
            .find(|l| *l != 0)
            .unwrap_or(0)
    }
}

/// A world shared by the agents.
pub type Shared = Arc<Mutex<World>>;

pub fn shared(world: World) -> Shared {
    Arc::new(Mutex::new(world))
}

pub fn lock(world: &Shared) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|p| p.into_inner())
}

/// The agent of node `n<id>`, whose member is `m<id>`.
pub struct FakeUpgrade {
    node: String,
    member: String,
    id: u64,
    world: Shared,
}

impl FakeUpgrade {
    pub fn new(world: &Shared, id: u64) -> FakeUpgrade {
        FakeUpgrade {
            node: format!("n{id}"),
            member: format!("m{id}"),
            id,
            world: world.clone(),
        }
    }

    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    fn call(&self, call: Call) {
        self.world().calls.push((self.node.clone(), call));
    }
}

pub struct FakeLock {
    node: String,
    world: Shared,
}

impl HeldLock for FakeLock {
    async fn release(self) {
        let mut w = lock(&self.world);
        w.lock = None;
        w.calls.push((self.node, Call::Release));
    }
}

impl UpgradeEffects for FakeUpgrade {
    type Lock = FakeLock;

    fn member_name(&self) -> &str {
        &self.member
    }

    fn binary(&self) -> &Path {
        Path::new("/usr/bin/etcd")
    }

    fn fingerprint(&self) -> Option<Fingerprint> {
        let mut w = self.world();
        let side = w.side(&self.node);
        side.binary.map(|_| Fingerprint {
            len: 1,
            modified: None,
            inode: side.replaced,
        })
    }

    async fn binary_version(&self) -> Result<EtcdVersion, String> {
        self.call(Call::Probe);
        self.world()
            .side(&self.node)
            .binary
            .ok_or_else(|| "etcd --version failed".to_string())
    }

    async fn members(&self, fresh: bool) -> Result<Members, String> {
        self.call(Call::Look { fresh });
        if fresh {
            tokio::time::sleep(LOOK_TAKES).await;
        }
        Ok(Members {
            local_id: self.id,
            members: self.world().members.clone(),
        })
    }

    fn records(&self) -> Vec<EtcdUpgradeState> {
        self.world().records.values().cloned().collect()
    }

    async fn publish(&self, record: &EtcdUpgradeState) -> Result<(), EtcdError> {
        let mut w = self.world();
        let call = Call::Publish(record.phase, record.message.clone());
        w.calls.push((self.node.clone(), call));
        w.records.insert(record.member.clone(), record.clone());
        Ok(())
    }

    async fn member_gate(&self) -> Option<Result<(), String>> {
        self.call(Call::Gate);
        self.world().side(&self.node).gate.clone()
    }

    async fn cluster_version(&self) -> Option<EtcdVersion> {
        self.world().cluster_version
    }

    async fn alarms(&self) -> Result<Vec<String>, EtcdError> {
        self.call(Call::Alarms);
        Ok(self.world().alarms.clone())
    }

    async fn lock(&self, operation: &str) -> Result<Result<FakeLock, String>, EtcdError> {
        let mut w = self.world();
        if let Some((holder, op)) = &w.lock {
            let held = format!("{holder} ({op})");
            w.calls
                .push((self.node.clone(), Call::LockRefused(held.clone())));
            return Ok(Err(held));
        }
        w.lock = Some((self.node.clone(), operation.to_string()));
        w.calls
            .push((self.node.clone(), Call::Lock(operation.to_string())));
        Ok(Ok(FakeLock {
            node: self.node.clone(),
            world: self.world.clone(),
        }))
    }

    async fn snapshot_records(&self) -> Result<Vec<SnapshotRecord>, EtcdError> {
        self.call(Call::SnapshotRecords);
        Ok(self.world().snapshots.clone())
    }

    async fn take_snapshot(&self, name: &str) -> Result<SnapshotRecord, String> {
        let mut w = self.world();
        w.calls
            .push((self.node.clone(), Call::Snapshot(name.to_string())));
        if let Some(e) = &w.snapshot_error {
            return Err(e.clone());
        }
        let rec = SnapshotRecord {
            name: name.to_string(),
            node: self.node.clone(),
            file: format!("{name}-{}.db", self.node),
            size: 4096,
            sha256: String::new(),
            revision: 42,
            created: Timestamp(w.now()),
            duration_seconds: 0.1,
            compressed: false,
            encrypted: false,
            on_demand: true,
            status: SnapshotStatus::Successful,
            error: None,
            local: true,
            remote: None,
        };
        w.snapshots.push(rec.clone());
        Ok(rec)
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        let mut w = self.world();
        w.calls.push((self.node.clone(), Call::MoveLeader(to)));
        if w.leadership_moves {
            for s in w.members.iter_mut().filter_map(|m| m.status.as_mut()) {
                s.leader = to;
            }
        }
        Ok(())
    }

    async fn restart(&self) -> Result<Duration, String> {
        let (how, binary) = {
            let mut w = self.world();
            assert_eq!(
                w.lock.as_ref().map(|(h, _)| h.as_str()),
                Some(self.node.as_str()),
                "restarted without the maintenance lock"
            );
            w.calls.push((self.node.clone(), Call::Restart));
            let side = w.side(&self.node).clone();
            if !matches!(side.restart, Restart::Fails(_)) {
                w.member(self.id).status = None;
            }
            (side.restart, side.binary)
        };
        if let Restart::Fails(e) = how {
            return Err(e);
        }
        tokio::time::sleep(DOWN_FOR).await;
        let mut w = self.world();
        let leader = w.leader();
        let lead_index = w
            .members
            .iter()
            .filter_map(|m| m.status)
            .map(|s| s.raft_index)
            .max()
            .unwrap_or(0);
        if how == Restart::Behind {
            // A busy cluster moved on while it was down, further than it catches up with.
            for s in w.members.iter_mut().filter_map(|m| m.status.as_mut()) {
                s.raft_index += 2 * CAUGHT_UP_LAG;
            }
        }
        let status = match how {
            Restart::Silent | Restart::Fails(_) => None,
            Restart::Back | Restart::Behind => Some(MemberState {
                version: binary,
                leader,
                raft_index: lead_index,
            }),
        };
        w.member(self.id).status = status;
        Ok(DOWN_FOR)
    }

    async fn event(&self, _kind: EventKind, reason: &'static str, message: String) {
        let mut w = self.world();
        w.calls
            .push((self.node.clone(), Call::Event(reason.to_string())));
        w.events
            .push((self.node.clone(), reason.to_string(), message));
    }

    fn now(&self) -> SystemTime {
        self.world().now()
    }
}

#[cfg(test)]
#[path = "fake_tests.rs"]
mod tests;
