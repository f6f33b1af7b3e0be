//! [`UpgradeController`]: one work-queue key, looked at on a timer and on every change of the upgrade
//! records. When the binary at `--etcd-binary` no longer is what the member runs, it takes the member's
//! turn under the maintenance lock (the one upkeep uses): checks, a verified snapshot taken since the
//! change was noticed, leadership moved away, the restart, the wait until the member is back and caught up.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{
    EtcdUpgradeState, SnapshotRecord, SnapshotStatus, Timestamp, UpgradePhase,
};
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{
    Action, Controller, ErrorAction, Etcd, EtcdError, Members, Metrics, Run, Store,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::plan::{self, MemberState, MemberView, Observation};
use crate::etcd_member::gate::{self, ClusterView, Verdict};
use crate::etcd_member::version::{Capabilities, EtcdVersion};
use crate::etcd_member::MemberRestarter;
use crate::events::{EventKind, EventRecorder};
use crate::snapshots::scheduler::SnapshotScheduler;
use crate::upkeep::lock::MaintenanceLock;

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "etcd-upgrade";
/// The snapshot name the roll takes when none has been taken since the change.
pub const SNAPSHOT_NAME: &str = "pre-etcd-upgrade";
/// How long a restarted member may take to serve again and catch up.
const BACK_WITHIN: Duration = Duration::from_secs(120);
/// How long leadership may take to move.
const MOVE_WITHIN: Duration = Duration::from_secs(15);
/// Beyond one `stat`, how long a leader gives the other agents to notice a binary change (their
/// `--version`, their record's write).
const NOTICE_SLACK: Duration = Duration::from_secs(5);
/// Members that noticed the same release this close together are in the same roll (a package upgrade lands
/// on every host within minutes).
const SAME_ROLL: Duration = Duration::from_secs(600);
/// How long a fresh look at the members may take.
const FRESH_LOOK: Duration = Duration::from_secs(10);

/// How often the binary's metadata is read (a `stat`, nothing more): a replacement starts a look at once.
const STAT_EVERY: Duration = Duration::from_millis(250);

/// How the controller paces itself.
#[derive(Debug, Clone)]
pub struct UpgradeConfig {
    /// How often the whole look runs without a change seen (`--etcd-binary-check-interval`); a replaced
    /// file is seen within [`STAT_EVERY`] whatever this is.
    pub check_interval: Duration,
    /// Next look while a change waits for its turn.
    pub busy_interval: Duration,
    /// `--etcd-allow-single-member-upgrade`: restart even with fewer than 3 voters.
    pub allow_small: bool,
}

impl Default for UpgradeConfig {
    fn default() -> Self {
        UpgradeConfig {
            check_interval: Duration::from_secs(30),
            busy_interval: Duration::from_secs(1),
            allow_small: false,
        }
    }
}

/// The upgrade records of every voter's agent.
pub type UpgradeStore = Store<String, Object<EtcdUpgradeState>>;

/// What the controller works with.
pub struct UpgradeParts {
    pub etcd: Etcd,
    pub keys: KeyLayout,
    pub node: String,
    pub member_name: String,
    /// The local member's client URL (its `/version`).
    pub local_client_url: String,
    pub tls: Option<hostlet_runtime::TlsFiles>,
    pub binary: PathBuf,
    pub members: Members,
    pub records: UpgradeStore,
    pub restarter: MemberRestarter,
    /// The member's version gate, shared with its supervisor so that a refusal is reported once; `None`:
    /// the controller decides with the cluster version alone and reports its refusals itself.
    pub gate: Option<crate::etcd_member::supervisor::RestartGate>,
    pub snapshots: Arc<SnapshotScheduler>,
    pub events: EventRecorder,
    /// The maintenance lock's cache: its release starts a waiting turn at once.
    pub lock: crate::upkeep::LockStore,
}

/// The binary file as it was at the last look: a change of any of these means it was replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn fingerprint(path: &std::path::Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    })
}

#[derive(Default)]
struct State {
    seen: Option<Fingerprint>,
    on_disk: Option<EtcdVersion>,
    noticed: Option<Timestamp>,
    /// When the last roll this member went through was noticed: its record keeps it, so that an agent
    /// whose turn comes later still dates the roll from the first notice.
    rolled_from: Option<Timestamp>,
    noticed_at: Option<Instant>,
    published: Option<EtcdUpgradeState>,
    /// The last reason recorded as an event (waiting or refused), so that each is said once.
    said: String,
}

pub struct UpgradeController {
    parts: UpgradeParts,
    cfg: UpgradeConfig,
    registry: Metrics,
    state: Mutex<State>,
}

impl UpgradeController {
    pub fn new(parts: UpgradeParts, cfg: UpgradeConfig, metrics: &Metrics) -> Self {
        UpgradeController {
            parts,
            cfg,
            registry: metrics.clone(),
            state: Mutex::new(State::default()),
        }
    }

    /// Reads the binary's version when the file changed since the last look.
    async fn look_at_binary(&self, st: &mut State) {
        let now = fingerprint(&self.parts.binary);
        if now.is_some() && now == st.seen && st.on_disk.is_some() {
            return;
        }
        match Capabilities::probe(&self.parts.binary).await {
            Ok(caps) => {
                if st.on_disk != Some(caps.version) {
                    tracing::info!(binary = %self.parts.binary.display(), version = %caps.version, "etcd binary on disk");
                }
                st.on_disk = Some(caps.version);
                st.seen = now;
            }
            Err(e) => {
                // A package manager may be halfway through replacing it: nothing is rolled on a binary
                // whose release is unknown; look again next time.
                tracing::warn!(error = %e, "cannot read the etcd binary's version");
                st.seen = None;
                st.on_disk = None;
            }
        }
    }

    /// The members as the shared cache saw them last (after a fresh look when `fresh`).
    async fn observe(&self, fresh: bool) -> Result<Observation, String> {
        let m = &self.parts.members;
        if fresh && !m.refresh(FRESH_LOOK).await {
            return Err("no fresh look at the members".into());
        }
        let statuses = m.statuses();
        let local_id = statuses.local_id.unwrap_or(0);
        let members = m
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
            .collect();
        let records = self
            .parts
            .records
            .state()
            .iter()
            .filter_map(|r| r.value.as_ref().ok())
            .map(|v| {
                let waits = matches!(v.phase, UpgradePhase::Waiting | UpgradePhase::Upgrading);
                let view = plan::RecordView {
                    waits,
                    running: EtcdVersion::parse(&v.running),
                };
                (v.member.clone(), view)
            })
            .collect::<BTreeMap<_, _>>();
        Ok(Observation {
            local_id,
            members,
            records,
            alarms: Vec::new(),
            allow_small: self.cfg.allow_small,
            since_noticed: Duration::ZERO,
            notice_window: STAT_EVERY + NOTICE_SLACK,
        })
    }

    /// Writes this node's record when it changed.
    async fn publish(
        &self,
        st: &mut State,
        running: EtcdVersion,
        on_disk: EtcdVersion,
        phase: UpgradePhase,
        message: &str,
    ) -> Result<(), EtcdError> {
        let rec = EtcdUpgradeState {
            member: self.parts.member_name.clone(),
            running: running.to_string(),
            on_disk: on_disk.to_string(),
            phase,
            message: message.to_string(),
            noticed: st.noticed.or(st.rolled_from),
        };
        // A message that differs only in its figures is not worth a write.
        let shape = |r: &EtcdUpgradeState| {
            let mut r = r.clone();
            r.message.retain(|c| !c.is_ascii_digit());
            r
        };
        if st.published.as_ref().map(shape) == Some(shape(&rec)) {
            return Ok(());
        }
        let value = serde_json::to_vec(&rec).unwrap_or_default();
        self.parts
            .etcd
            .put(self.parts.keys.etcd_upgrade(&self.parts.node), value)
            .await?;
        st.published = Some(rec);
        Ok(())
    }

    /// Records `reason` with `message` unless it is what was said last. Figures in the message (raft
    /// indexes, times) do not make it another one: a lagging member would otherwise say it every look.
    async fn say(&self, st: &mut State, kind: EventKind, reason: &str, message: &str) {
        let said: String = format!("{reason}: {message}")
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        if st.said == said {
            return;
        }
        st.said = said;
        match reason {
            "EtcdUpgradeRefused" => {
                tracing::error!("{message}");
                self.parts
                    .events
                    .node_event(kind, "EtcdUpgradeRefused", message)
                    .await
            }
            _ => {
                tracing::info!("{message}");
                self.parts
                    .events
                    .node_event(kind, "EtcdUpgradeWaiting", message)
                    .await
            }
        }
    }

    /// Why the version gate refuses the binary on disk, if it does: through the member's own gate (which
    /// reports the refusal) when there is one.
    async fn refusal(&self, obs: &Observation, on_disk: EtcdVersion) -> Option<String> {
        if let Some(gate) = &self.parts.gate {
            return gate().await.err();
        }
        match gate::decide(on_disk, &self.cluster_view(obs).await) {
            Verdict::Refuse(r) => Some(format!(
                "member {} not upgraded to {}: {r}",
                self.parts.member_name,
                self.parts.binary.display()
            )),
            Verdict::Start { .. } => None,
        }
    }

    /// The cluster version and the members' releases, for the gate.
    async fn cluster_view(&self, obs: &Observation) -> ClusterView {
        let asked = gate::member_versions(
            std::slice::from_ref(&self.parts.local_client_url),
            self.parts.tls.as_ref(),
        )
        .await;
        ClusterView {
            cluster: asked.into_iter().flatten().find_map(|v| v.cluster),
            members: obs
                .members
                .iter()
                .filter(|m| m.id != obs.local_id)
                .filter_map(|m| Some((m.name.clone(), m.status?.version?)))
                .collect(),
        }
    }

    pub async fn reconcile(&self) -> Result<Action, EtcdError> {
        let mut st = self.state.lock().await;
        let idle = Action::Requeue(self.cfg.check_interval);
        let busy = Action::Requeue(self.cfg.busy_interval);
        self.look_at_binary(&mut st).await;
        let Some(on_disk) = st.on_disk else {
            return Ok(idle);
        };
        let Ok(mut obs) = self.observe(false).await else {
            return Ok(busy);
        };
        let running = obs
            .members
            .iter()
            .find(|m| m.id == obs.local_id && obs.local_id != 0)
            .and_then(|m| m.status)
            .and_then(|s| s.version);
        let Some(running) = running else {
            // The member is not serving (restarting, or not yet looked at): its own supervisor sees to it.
            return Ok(busy);
        };
        if running == on_disk {
            if st.noticed.take().is_some() {
                st.said.clear();
            }
            st.noticed_at = None;
            self.publish(&mut st, running, on_disk, UpgradePhase::Current, "")
                .await?;
            return Ok(idle);
        }
        if st.noticed.is_none() {
            st.noticed = Some(Timestamp::now());
            st.noticed_at = Some(Instant::now());
            tracing::info!(%running, %on_disk, "the etcd binary changed under the running member");
        }
        obs.since_noticed = st.noticed_at.map(|t| t.elapsed()).unwrap_or_default();
        if let Some(message) = self.refusal(&obs, on_disk).await {
            self.publish(&mut st, running, on_disk, UpgradePhase::Refused, &message)
                .await?;
            if self.parts.gate.is_none() {
                self.say(&mut st, EventKind::Warning, "EtcdUpgradeRefused", &message)
                    .await;
            }
            return Ok(idle);
        }
        // Said at once, so that the others (the leader, the snapshot's date) see this agent in the roll;
        // once only (a wait's reason, written below, is not overwritten every look).
        let said = st.published.as_ref().map(|r| r.phase);
        if !matches!(said, Some(UpgradePhase::Waiting | UpgradePhase::Upgrading)) {
            self.publish(&mut st, running, on_disk, UpgradePhase::Waiting, "its turn")
                .await?;
        }
        if let Err(why) = plan::turn(&obs, on_disk) {
            self.wait(&mut st, running, on_disk, &why).await?;
            return Ok(busy);
        }
        let operation = format!("etcd upgrade of {} to {on_disk}", self.parts.member_name);
        let lock = match MaintenanceLock::acquire(
            &self.parts.etcd,
            &self.parts.keys,
            &self.parts.node,
            &operation,
        )
        .await?
        {
            Ok(l) => l,
            Err(holder) => {
                let why = format!("waiting for the maintenance lock, held by {holder}");
                self.wait(&mut st, running, on_disk, &why).await?;
                return Ok(busy);
            }
        };
        let turn = self.take_turn(&mut st, running, on_disk).await;
        lock.release().await;
        match turn {
            Ok(took) => {
                let message = format!(
                    "member {} now runs etcd {on_disk} (was {running}); it was not serving for {:.2}s",
                    self.parts.member_name,
                    took.as_secs_f64()
                );
                tracing::info!("{message}");
                self.parts
                    .events
                    .node_event(EventKind::Normal, "EtcdUpgraded", message)
                    .await;
                st.rolled_from = st.noticed.take();
                st.noticed_at = None;
                st.said.clear();
                self.publish(&mut st, on_disk, on_disk, UpgradePhase::Current, "")
                    .await?;
                Ok(busy)
            }
            Err(why) => {
                self.wait(&mut st, running, on_disk, &why).await?;
                Ok(busy)
            }
        }
    }

    async fn wait(
        &self,
        st: &mut State,
        running: EtcdVersion,
        on_disk: EtcdVersion,
        why: &str,
    ) -> Result<(), EtcdError> {
        let message = format!(
            "member {} waits to move from etcd {running} to {on_disk}: {why}",
            self.parts.member_name
        );
        self.publish(st, running, on_disk, UpgradePhase::Waiting, why)
            .await?;
        self.say(st, EventKind::Normal, "EtcdUpgradeWaiting", &message)
            .await;
        Ok(())
    }

    /// Under the maintenance lock: the checks, the snapshot, leadership away, the restart and the wait
    /// until the member is back. Returns how long the member did not serve (from its stop until the new run
    /// served).
    async fn take_turn(
        &self,
        st: &mut State,
        running: EtcdVersion,
        on_disk: EtcdVersion,
    ) -> Result<Duration, String> {
        let began = Instant::now();
        let mut obs = self.observe(true).await?;
        obs.alarms = self
            .parts
            .etcd
            .alarms()
            .await
            .map_err(|e| format!("cannot read the alarms: {e}"))?
            .into_iter()
            .map(|(id, a)| format!("{a:?} on {id:x}"))
            .collect();
        plan::ready_to_restart(&obs)?;
        let checked = began.elapsed();
        self.ensure_snapshot(st).await?;
        let snapshot = began.elapsed() - checked;
        if obs.local_leads() {
            let target = plan::leader_target(&obs, on_disk)
                .ok_or("no follower answers to take over leadership")?;
            self.parts
                .etcd
                .move_leader(target)
                .await
                .map_err(|e| format!("cannot move leadership to {target:x}: {e}"))?;
            let moved_by = Instant::now() + MOVE_WITHIN;
            loop {
                let o = self.observe(true).await?;
                if o.leader() != 0 && !o.local_leads() {
                    tracing::info!(to = %format!("{:x}", o.leader()), "leadership moved away before the etcd restart");
                    break;
                }
                if Instant::now() >= moved_by {
                    return Err("leadership did not move away".into());
                }
            }
        }
        let leadership = began.elapsed() - checked - snapshot;
        self.publish(st, running, on_disk, UpgradePhase::Upgrading, "")
            .await
            .map_err(|e| format!("cannot record the upgrade: {e}"))?;
        let down = Instant::now();
        let out = self.parts.restarter.restart().await?;
        let serving = down.elapsed();
        let back_by = Instant::now() + BACK_WITHIN;
        loop {
            let why = match self.observe(true).await {
                Ok(o) => match plan::back(&o, on_disk) {
                    Ok(()) => {
                        // Where a turn's time goes, for whoever tunes the roll.
                        tracing::info!(
                            checks = ?checked,
                            snapshot = ?snapshot,
                            leadership = ?leadership,
                            restart = ?serving,
                            not_serving = ?out,
                            caught_up = ?(down.elapsed() - serving),
                            "etcd upgrade turn done"
                        );
                        return Ok(out);
                    }
                    Err(why) => why,
                },
                Err(why) => why,
            };
            if Instant::now() >= back_by {
                return Err(format!("the member is not back on {on_disk}: {why}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A verified snapshot taken since the change was first noticed (by any agent of the roll), or one
    /// taken now of the local member. The notice is the earliest of the agents that still wait (so an agent
    /// whose turn came later still counts the first agent's snapshot).
    async fn ensure_snapshot(&self, st: &State) -> Result<(), String> {
        // Only the records of this roll: members of the cluster now that wait for the change or already
        // run its release (a deleted node's record stays behind, and an old notice must not let an older
        // snapshot count).
        let members: std::collections::HashSet<String> = self
            .parts
            .members
            .list()
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let target = st.on_disk.map(|v| v.to_string()).unwrap_or_default();
        let since = self
            .parts
            .records
            .state()
            .iter()
            .filter_map(|r| r.value.as_ref().ok())
            .filter(|v| members.contains(&v.member))
            .filter(|v| match v.phase {
                UpgradePhase::Waiting | UpgradePhase::Upgrading => true,
                // Already on this release, from a notice close to this agent's own: the same roll (a
                // member upgraded long before is another story, and its snapshot too old).
                UpgradePhase::Current => {
                    v.running == target
                        && v.noticed.zip(st.noticed).is_some_and(|(theirs, ours)| {
                            ours.0
                                .duration_since(theirs.0)
                                .map_or(true, |d| d <= SAME_ROLL)
                        })
                }
                UpgradePhase::Refused => false,
            })
            .filter_map(|v| v.noticed)
            .chain(st.noticed)
            .min()
            .unwrap_or_else(Timestamp::now);
        let (kvs, _) = self
            .parts
            .etcd
            .get_prefix(self.parts.keys.snapshots_prefix())
            .await
            .map_err(|e| format!("cannot read the snapshot records: {e}"))?;
        let have = kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<SnapshotRecord>(kv.value()).ok())
            .find(|r| r.status == SnapshotStatus::Successful && r.created >= since);
        if let Some(r) = have {
            tracing::info!(file = %r.file, node = %r.node, "the etcd upgrade goes on after snapshot");
            return Ok(());
        }
        let rec = self
            .parts
            .snapshots
            .take(SNAPSHOT_NAME, true, |_| {})
            .await
            .map_err(|e| format!("no snapshot before the restart: {e}"))?;
        tracing::info!(file = %rec.file, "snapshot taken before the etcd upgrade");
        Ok(())
    }
}

/// Yields when the file at `path` is replaced or changed (its size, time or inode), seen by a `stat`
/// every [`STAT_EVERY`].
fn binary_changes(path: PathBuf) -> impl futures::Stream<Item = ()> + Send + 'static {
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

impl Run for UpgradeController {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let retry = self.cfg.busy_interval.max(Duration::from_secs(1));
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .triggers(futures::stream::iter([()]))
            .triggers(binary_changes(self.parts.binary.clone()))
            .watches(&self.parts.records, |_| Some(()))
            .watches(&self.parts.lock, |_| Some(()))
            .run(
                |(), this: Arc<Self>| async move { this.reconcile().await },
                move |_, _, _| ErrorAction::Requeue(retry),
                shutdown,
            )
            .await;
    }
}
