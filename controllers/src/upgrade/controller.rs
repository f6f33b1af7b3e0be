//! [`UpgradeController`]: one work-queue key, looked at on a timer and on every change of the upgrade
//! records. When the binary at `--etcd-binary` no longer is what the member runs, it takes the member's
//! turn under the maintenance lock (the one upkeep uses): checks, a verified snapshot taken since the
//! change was noticed, leadership moved away, the restart, the wait until the member is back and caught up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::objects::{EtcdUpgradeState, SnapshotStatus, Timestamp, UpgradePhase};
use hostlet_runtime::{Action, Controller, ErrorAction, EtcdError, Metrics, Run};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::effects::{Fingerprint, UpgradeEffects, STAT_EVERY};
use super::plan::{self, Observation};
use crate::etcd_member::gate::{self, ClusterView, Verdict};
use crate::etcd_member::version::EtcdVersion;
use crate::events::EventKind;
use crate::upkeep::HeldLock;

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
/// How often a restarted member is looked at until it is back.
const BACK_POLL: Duration = Duration::from_millis(100);

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

/// The upgrade controller of one agent.
pub struct UpgradeController<E> {
    fx: Arc<E>,
    cfg: UpgradeConfig,
    registry: Metrics,
    state: Mutex<State>,
}

impl<E: UpgradeEffects> UpgradeController<E> {
    pub fn new(fx: Arc<E>, cfg: UpgradeConfig, metrics: &Metrics) -> Self {
        UpgradeController {
            fx,
            cfg,
            registry: metrics.clone(),
            state: Mutex::new(State::default()),
        }
    }

    /// Reads the binary's version when the file changed since the last look.
    async fn look_at_binary(&self, st: &mut State) {
        let now = self.fx.fingerprint();
        if now.is_some() && now == st.seen && st.on_disk.is_some() {
            return;
        }
        match self.fx.binary_version().await {
            Ok(version) => {
                if st.on_disk != Some(version) {
                    tracing::info!(binary = %self.fx.binary().display(), %version, "etcd binary on disk");
                }
                st.on_disk = Some(version);
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
        let seen = self.fx.members(fresh).await?;
        let records = self
            .fx
            .records()
            .into_iter()
            .map(|v| {
                let waits = matches!(v.phase, UpgradePhase::Waiting | UpgradePhase::Upgrading);
                let view = plan::RecordView {
                    waits,
                    running: EtcdVersion::parse(&v.running),
                };
                (v.member, view)
            })
            .collect::<BTreeMap<_, _>>();
        Ok(Observation {
            local_id: seen.local_id,
            members: seen.members,
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
            member: self.fx.member_name().to_string(),
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
        self.fx.publish(&rec).await?;
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
                self.fx
                    .event(kind, "EtcdUpgradeRefused", message.to_string())
                    .await
            }
            _ => {
                tracing::info!("{message}");
                self.fx
                    .event(kind, "EtcdUpgradeWaiting", message.to_string())
                    .await
            }
        }
    }

    /// Why the version gate refuses the binary on disk, if it does, and whether the controller reports it:
    /// through the member's own gate (which reports the refusal) when there is one.
    async fn refusal(&self, obs: &Observation, on_disk: EtcdVersion) -> Option<(String, bool)> {
        if let Some(verdict) = self.fx.member_gate().await {
            return verdict.err().map(|m| (m, false));
        }
        match gate::decide(on_disk, &self.cluster_view(obs).await) {
            Verdict::Refuse(r) => Some((
                format!(
                    "member {} not upgraded to {}: {r}",
                    self.fx.member_name(),
                    self.fx.binary().display()
                ),
                true,
            )),
            Verdict::Start { .. } => None,
        }
    }

    /// The cluster version and the members' releases, for the gate.
    async fn cluster_view(&self, obs: &Observation) -> ClusterView {
        ClusterView {
            cluster: self.fx.cluster_version().await,
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
            st.noticed = Some(Timestamp(self.fx.now()));
            st.noticed_at = Some(Instant::now());
            tracing::info!(%running, %on_disk, "the etcd binary changed under the running member");
        }
        obs.since_noticed = st.noticed_at.map(|t| t.elapsed()).unwrap_or_default();
        if let Some((message, report)) = self.refusal(&obs, on_disk).await {
            self.publish(&mut st, running, on_disk, UpgradePhase::Refused, &message)
                .await?;
            if report {
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
        let operation = format!("etcd upgrade of {} to {on_disk}", self.fx.member_name());
        let lock = match self.fx.lock(&operation).await? {
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
                    self.fx.member_name(),
                    took.as_secs_f64()
                );
                tracing::info!("{message}");
                self.fx
                    .event(EventKind::Normal, "EtcdUpgraded", message)
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
            self.fx.member_name()
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
            .fx
            .alarms()
            .await
            .map_err(|e| format!("cannot read the alarms: {e}"))?;
        plan::ready_to_restart(&obs)?;
        let checked = began.elapsed();
        self.ensure_snapshot(st).await?;
        let snapshot = began.elapsed() - checked;
        if obs.local_leads() {
            let target = plan::leader_target(&obs, on_disk)
                .ok_or("no follower answers to take over leadership")?;
            self.fx
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
        let out = self.fx.restart().await?;
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
            tokio::time::sleep(BACK_POLL).await;
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
            .fx
            .members(false)
            .await?
            .members
            .into_iter()
            .map(|m| m.name)
            .collect();
        let target = st.on_disk.map(|v| v.to_string()).unwrap_or_default();
        let since = self
            .fx
            .records()
            .into_iter()
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
            .unwrap_or_else(|| Timestamp(self.fx.now()));
        let have = self
            .fx
            .snapshot_records()
            .await
            .map_err(|e| format!("cannot read the snapshot records: {e}"))?
            .into_iter()
            .find(|r| r.status == SnapshotStatus::Successful && r.created >= since);
        if let Some(r) = have {
            tracing::info!(file = %r.file, node = %r.node, "the etcd upgrade goes on after snapshot");
            return Ok(());
        }
        let rec = self
            .fx
            .take_snapshot(SNAPSHOT_NAME)
            .await
            .map_err(|e| format!("no snapshot before the restart: {e}"))?;
        tracing::info!(file = %rec.file, "snapshot taken before the etcd upgrade");
        Ok(())
    }
}

impl<E: UpgradeEffects> Run for UpgradeController<E> {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let retry = self.cfg.busy_interval.max(Duration::from_secs(1));
        let mut c = Controller::new(CONTROLLER, self.clone(), &self.registry)
            .triggers(futures::stream::iter([()]))
            .triggers(self.fx.binary_changes());
        if let Some((records, lock)) = self.fx.watched() {
            c = c
                .watches(&records, |_| Some(()))
                .watches(&lock, |_| Some(()));
        }
        c.run(
            |(), this: Arc<Self>| async move { this.reconcile().await },
            move |_, _, _| ErrorAction::Requeue(retry),
            shutdown,
        )
        .await;
    }
}
