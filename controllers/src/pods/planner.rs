//! The pure half of a pod reconcile: (desired, observed, restart/probe state, now) → the steps to take.
//!
//! No I/O and no clock: the caller passes `now`, and every decision that must be remembered (a restart
//! backoff, a SIGTERM sent) comes back as a step for the executor to record. The rules, in order:
//! a pod that is gone is torn down (SIGTERM, the grace period, SIGKILL, removal); a pod without a healthy
//! infra container is rebuilt (its app containers stopped first, since they live in its network namespace);
//! otherwise each app container is checked alone — missing → created, spec hash changed → replaced,
//! liveness failed → stopped and restarted, exited → restarted per the restart policy after its
//! CrashLoopBackOff wait. A pod with init containers runs them first, one at a time in order, each to a
//! zero exit (a failed one is restarted per the restart policy, and under `Never` the pod fails); the app
//! containers start only when the last has completed in the current infra container's namespace.
//! A sidecar (an init container with `restartPolicy: Always`) counts as done in that order once it runs
//! (and passes its startup and readiness probes, if it has them); it keeps running and restarting beside
//! the app containers whatever the pod's policy, does not hold up a pod's completion, and stops after the
//! app containers, the last sidecar first.
//! A pod whose containers all match is left untouched: the plan is empty.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hostlet_api::manifest::{Container, PodManifest, PullPolicy, RestartPolicy};
use hostlet_api::naming::{self, Role, INFRA_CONTAINER_NAME};
use tokio::time::Instant;

use super::backoff::CrashLoopBackoff;
use super::runtime::{ContainerInfo, RunState};

/// The grace period for pods whose manifest is no longer known (orphans): kubelet's default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How soon to look again at a container that was sent SIGKILL and still shows as running.
const KILL_RECHECK: Duration = Duration::from_secs(1);

/// A valid manifest with the spec hashes its containers must carry.
#[derive(Debug, Clone)]
pub struct DesiredPod {
    pub manifest: PodManifest,
    pub pause_image: String,
    pub infra_hash: String,
    /// Container name → spec hash.
    pub hashes: BTreeMap<String, String>,
    /// hostDir volume name → the path as resolved and checked at admission: what is mounted.
    pub host_dirs: BTreeMap<String, std::path::PathBuf>,
}

impl DesiredPod {
    pub fn new(manifest: PodManifest, pause_image: &str) -> Self {
        let infra_hash = naming::infra_spec_hash(&manifest, pause_image);
        let hashes = manifest
            .all_containers()
            .map(|c| (c.name.clone(), naming::container_spec_hash(&manifest, c)))
            .collect();
        DesiredPod {
            manifest,
            pause_image: pause_image.to_string(),
            infra_hash,
            hashes,
            host_dirs: BTreeMap::new(),
        }
    }

    pub fn grace(&self) -> Duration {
        Duration::from_secs(
            self.manifest
                .effective_grace_period_seconds()
                .unsigned_abs(),
        )
    }
}

/// The pod's containers as the observed cache has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedPod {
    pub containers: Vec<ContainerInfo>,
}

impl ObservedPod {
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// The running infra container, if any.
    pub fn infra(&self) -> Option<&ContainerInfo> {
        newest(
            self.containers
                .iter()
                .filter(|c| c.labels.role == Role::Infra && c.state.is_running()),
        )
    }

    /// The newest instance of an app container (the one a restart created last).
    pub fn current(&self, name: &str) -> Option<&ContainerInfo> {
        self.current_of(Role::App, name)
    }

    /// The newest instance of an init container.
    pub fn current_init(&self, name: &str) -> Option<&ContainerInfo> {
        self.current_of(Role::Init, name)
    }

    fn current_of(&self, role: Role, name: &str) -> Option<&ContainerInfo> {
        newest(
            self.containers
                .iter()
                .filter(|c| c.labels.role == role && c.labels.container == name),
        )
    }
}

fn newest<'a>(it: impl Iterator<Item = &'a ContainerInfo>) -> Option<&'a ContainerInfo> {
    it.max_by(|a, b| {
        (a.labels.restart_count, a.created, &a.id).cmp(&(b.labels.restart_count, b.created, &b.id))
    })
}

/// Why hostlet stops a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The pod was deleted (or is an orphan).
    PodDeleted,
    /// Its spec changed: it is replaced.
    SpecChanged,
    /// Its liveness or startup probe failed: it is restarted.
    Unhealthy,
    /// The infra container is gone or changed: the whole pod is rebuilt.
    PodRebuild,
    /// An older instance or a container no longer in the manifest.
    Superseded,
    /// Every container of a pod that will not restart has finished: its infra container goes.
    PodFinished,
    /// An init container failed and the pod does not restart it: the pod has failed.
    InitFailed,
}

impl StopReason {
    pub fn message(self) -> &'static str {
        match self {
            StopReason::PodDeleted => "pod deleted",
            StopReason::SpecChanged => "container spec changed, will be replaced",
            StopReason::Unhealthy => "failed its probe, will be restarted",
            StopReason::PodRebuild => "pod infra container gone or changed, pod will be rebuilt",
            StopReason::Superseded => "not in the manifest or superseded by a newer instance",
            StopReason::PodFinished => "all containers finished",
            StopReason::InitFailed => "an init container failed and the pod restarts nothing",
        }
    }
}

/// A SIGTERM hostlet sent and when the grace period ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    pub at: Instant,
    pub grace: Duration,
    pub reason: StopReason,
}

/// An exit the backoff has accounted for, and when the container may start again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandledExit {
    pub id: String,
    pub restart_at: Instant,
}

/// Failed pulls of a container's image in a row, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    pub failures: u32,
    pub retry_at: Instant,
    pub message: String,
}

/// What hostlet remembers about one container of a pod (by name) between reconciles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerMemory {
    pub backoff: CrashLoopBackoff,
    pub exit: Option<HandledExit>,
    pub pull: Option<PullFailure>,
    /// How the previous instance ended (shown as `lastState` once it is removed).
    pub last_termination: Option<hostlet_api::objects::ContainerState>,
    /// Why the engine refused to start the last instance, until one starts.
    pub start_error: Option<String>,
    /// The ConfigMap, Secret or key the container waits for, until it is made.
    pub config_error: Option<String>,
}

/// What hostlet remembers about a pod between reconciles. Lost on restart, by design: adopted containers
/// start with a clean slate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRuntimeState {
    /// By container name (the infra container under [`INFRA_CONTAINER_NAME`]).
    pub containers: BTreeMap<String, ContainerMemory>,
    /// By container id: SIGTERMs sent.
    pub terminating: BTreeMap<String, Termination>,
    /// By container id: liveness or startup probe failed (the probe's message). Filled by the caller from
    /// the probe results before planning.
    pub unhealthy: BTreeMap<String, String>,
    /// By container id: sidecars whose startup probe has not passed or whose readiness probe does not
    /// pass (yet). Filled by the caller from the probe results before planning.
    pub not_ready: BTreeSet<String>,
    /// The grace period of the last manifest seen, for when the pod is deleted.
    pub grace: Option<Duration>,
    /// By container name: the containers of the last manifest run that have a `preStop` hook, for when
    /// they are stopped (the pod deleted or changed).
    pub pre_stop: BTreeMap<String, hostlet_api::manifest::Container>,
}

/// Which infra container an app container joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfraRef {
    Existing(String),
    /// The one a `CreateInfra` earlier in the same plan creates.
    Created,
}

/// Why an app container is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateReason {
    New,
    /// It exited, or failed its liveness probe, or the pod was rebuilt.
    Restart,
    /// Its spec changed.
    Replace,
}

/// One thing to do, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make the image present according to the pull policy.
    EnsureImage {
        container: String,
        image: String,
        policy: PullPolicy,
    },
    /// Create the pod's emptyDir directories.
    PrepareVolumes,
    /// Create and start the infra container.
    CreateInfra {
        restart_count: u32,
    },
    /// Create and start an app container.
    CreateApp {
        container: String,
        infra: InfraRef,
        restart_count: u32,
        reason: CreateReason,
    },
    /// Create and start an init container (created one at a time, in order).
    CreateInit {
        container: String,
        infra: InfraRef,
        restart_count: u32,
        reason: CreateReason,
    },
    /// Start a container that was created but never started.
    Start {
        id: String,
        container: String,
    },
    /// SIGTERM; the executor records the [`Termination`].
    Terminate {
        id: String,
        container: String,
        grace: Duration,
        reason: StopReason,
    },
    Kill {
        id: String,
        container: String,
        reason: StopReason,
    },
    Remove {
        id: String,
        container: String,
    },
    /// Remember an exit: the backoff state after it and when the container may start again.
    RecordExit {
        container: String,
        exited_id: String,
        backoff: CrashLoopBackoff,
        restart_at: Instant,
        wait: Duration,
    },
    /// The pod is gone and so are its containers: delete its status and its directory.
    Cleanup,
}

/// The steps and when to look again (a backoff or a grace period ending), if nothing else happens first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub requeue_after: Option<Duration>,
}

/// Whether a container that exited with `exit_code` starts again.
pub fn should_restart(policy: RestartPolicy, exit_code: i64, killed_unhealthy: bool) -> bool {
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => exit_code != 0 || killed_unhealthy,
        RestartPolicy::Never => false,
    }
}

/// The plan for one pod. `desired` is `None` for a pod that must not exist (deleted, rejected, orphan).
pub fn plan(
    desired: Option<&DesiredPod>,
    observed: &ObservedPod,
    state: &PodRuntimeState,
    now: Instant,
) -> Plan {
    let mut p = Planner {
        state,
        now,
        steps: Vec::new(),
        wake: None,
        volumes_prepared: false,
    };
    match desired {
        None => {
            let grace = state.grace.unwrap_or(DEFAULT_GRACE);
            let all: Vec<&ContainerInfo> = observed.containers.iter().collect();
            p.tear_down(&all, grace, StopReason::PodDeleted);
            if observed.is_empty() {
                p.steps.push(Step::Cleanup);
            }
        }
        Some(d) => p.run(d, observed),
    }
    Plan {
        requeue_after: p.wake.map(|w| w.saturating_duration_since(now)),
        steps: p.steps,
    }
}

struct Planner<'a> {
    state: &'a PodRuntimeState,
    now: Instant,
    steps: Vec<Step>,
    wake: Option<Instant>,
    volumes_prepared: bool,
}

impl Planner<'_> {
    fn wake_at(&mut self, at: Instant) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    fn memory(&self, name: &str) -> ContainerMemory {
        self.state.containers.get(name).cloned().unwrap_or_default()
    }

    /// SIGTERM once, SIGKILL when the grace period is over.
    fn stop(&mut self, c: &ContainerInfo, grace: Duration, reason: StopReason) {
        let container = c.labels.container.clone();
        match self.state.terminating.get(&c.id) {
            None => {
                self.steps.push(Step::Terminate {
                    id: c.id.clone(),
                    container,
                    grace,
                    reason,
                });
                self.wake_at(self.now + grace);
            }
            Some(t) if self.now >= t.at + t.grace => {
                self.steps.push(Step::Kill {
                    id: c.id.clone(),
                    container,
                    reason: t.reason,
                });
                self.wake_at(self.now + KILL_RECHECK);
            }
            Some(t) => self.wake_at(t.at + t.grace),
        }
    }

    /// The infra container's process ignores SIGTERM (it is PID 1 without a handler): it is killed.
    fn kill(&mut self, c: &ContainerInfo, reason: StopReason) {
        self.steps.push(Step::Kill {
            id: c.id.clone(),
            container: c.labels.container.clone(),
            reason,
        });
        self.wake_at(self.now + KILL_RECHECK);
    }

    fn remove(&mut self, c: &ContainerInfo) {
        self.steps.push(Step::Remove {
            id: c.id.clone(),
            container: c.labels.container.clone(),
        });
    }

    /// Stops app containers (with grace), then the infra containers, removing whatever has stopped.
    /// Returns whether anything is still running.
    fn tear_down(
        &mut self,
        containers: &[&ContainerInfo],
        grace: Duration,
        reason: StopReason,
    ) -> bool {
        let mut app_running = false;
        for c in containers
            .iter()
            .filter(|c| c.labels.role != Role::Infra && c.labels.sidecar.is_none())
        {
            if c.state.is_running() {
                app_running = true;
                self.stop(c, grace, reason);
            } else {
                self.remove(c);
            }
        }
        let sidecars: Vec<&ContainerInfo> = containers
            .iter()
            .copied()
            .filter(|c| c.labels.role != Role::Infra && c.labels.sidecar.is_some())
            .collect();
        for c in sidecars.iter().filter(|c| !c.state.is_running()) {
            self.remove(c);
        }
        app_running |= self.stop_sidecars(&sidecars, !app_running, grace, reason);
        let mut infra_running = false;
        for c in containers.iter().filter(|c| c.labels.role == Role::Infra) {
            if c.state.is_running() {
                infra_running = true;
                if !app_running {
                    self.kill(c, reason);
                }
            } else {
                self.remove(c);
            }
        }
        app_running || infra_running
    }

    /// Sidecars stop after everything else and in reverse order: once `go`, the running one placed last
    /// is sent its signal (with what is left of the pod's grace period), and the next when it has gone.
    /// Returns whether any still runs.
    fn stop_sidecars(
        &mut self,
        sidecars: &[&ContainerInfo],
        go: bool,
        grace: Duration,
        reason: StopReason,
    ) -> bool {
        let running: Vec<&ContainerInfo> = sidecars
            .iter()
            .copied()
            .filter(|c| c.state.is_running())
            .collect();
        let Some(last) = running.iter().copied().max_by_key(|c| c.labels.sidecar) else {
            return false;
        };
        if go {
            let left = self.grace_left(grace);
            for c in &running {
                if c.id == last.id || self.state.terminating.contains_key(&c.id) {
                    self.stop(c, left, reason);
                }
            }
        }
        true
    }

    /// What is left of a pod's grace period once some of its containers were signalled: a sidecar stopped
    /// after them gets the rest, never less than the kubelet's 2 s floor.
    fn grace_left(&self, grace: Duration) -> Duration {
        let deadline = self
            .state
            .terminating
            .values()
            .map(|t| t.at + t.grace)
            .min();
        deadline.map_or(grace, |d| {
            d.saturating_duration_since(self.now)
                .max(Duration::from_secs(2))
                .min(grace)
        })
    }

    fn run(&mut self, d: &DesiredPod, observed: &ObservedPod) {
        let m = &d.manifest;
        let grace = d.grace();
        let policy = m.effective_restart_policy();

        // Containers that are not the current instance of a desired container go.
        let currents: BTreeMap<&str, &ContainerInfo> = m
            .containers
            .iter()
            .filter_map(|c| observed.current(&c.name).map(|cur| (c.name.as_str(), cur)))
            .collect();
        let inits: BTreeMap<&str, &ContainerInfo> = m
            .init_containers
            .iter()
            .filter_map(|c| {
                observed
                    .current_init(&c.name)
                    .map(|cur| (c.name.as_str(), cur))
            })
            .collect();
        let leftovers: Vec<&ContainerInfo> = observed
            .containers
            .iter()
            .filter(|c| {
                let wanted = match c.labels.role {
                    Role::Infra => return false,
                    Role::App => &currents,
                    Role::Init => &inits,
                };
                wanted
                    .get(c.labels.container.as_str())
                    .is_none_or(|cur| cur.id != c.id)
            })
            .collect();
        for c in &leftovers {
            if c.state.is_running() {
                self.stop(c, grace, StopReason::Superseded);
            } else {
                self.remove(c);
            }
        }

        let infra = observed
            .infra()
            .filter(|i| i.labels.spec_hash == d.infra_hash);
        let stale_infras: Vec<&ContainerInfo> = observed
            .containers
            .iter()
            .filter(|c| c.labels.role == Role::Infra && infra.is_none_or(|i| i.id != c.id))
            .collect();

        // Desired containers that exited and will not start again.
        let finished: BTreeSet<&str> = m
            .containers
            .iter()
            .filter(|c| {
                currents
                    .get(c.name.as_str())
                    .is_some_and(|cur| match &cur.state {
                        RunState::Exited { exit_code, .. } => {
                            cur.labels.spec_hash == d.hashes[&c.name]
                                && !should_restart(
                                    policy,
                                    *exit_code,
                                    self.killed_unhealthy(&cur.id),
                                )
                        }
                        _ => false,
                    })
            })
            .map(|c| c.name.as_str())
            .collect();
        // An init container that failed under `Never`: the pod has failed, nothing more will run.
        let init_failed = policy == RestartPolicy::Never
            && m.init_containers
                .iter()
                .filter(|c| !c.is_sidecar())
                .any(|c| {
                    inits.get(c.name.as_str()).is_some_and(|cur| {
                    cur.labels.spec_hash == d.hashes[&c.name]
                        && matches!(cur.state, RunState::Exited { exit_code, .. } if exit_code != 0)
                })
                });
        if finished.len() == m.containers.len() || init_failed {
            let why = if init_failed {
                StopReason::InitFailed
            } else {
                StopReason::PodFinished
            };
            // Nothing will run again: the sidecars go (their exits are kept, as the app containers'
            // are), then the network namespace, which is not needed any more.
            let sidecars: Vec<&ContainerInfo> = m
                .init_containers
                .iter()
                .filter(|c| c.is_sidecar())
                .filter_map(|c| inits.get(c.name.as_str()).copied())
                .collect();
            if self.stop_sidecars(&sidecars, true, grace, why) {
                return;
            }
            for i in infra.iter().chain(stale_infras.iter()) {
                if i.state.is_running() {
                    self.kill(i, why);
                } else {
                    self.remove(i);
                }
            }
            return;
        }

        match infra {
            Some(infra) => {
                for c in &stale_infras {
                    if c.state.is_running() {
                        self.kill(c, StopReason::PodRebuild);
                    } else {
                        self.remove(c);
                    }
                }
                // Once the app containers were made beside this infra container, the init containers
                // are done for it: only the sidecars are looked after, as app containers are.
                let apps_started = currents
                    .values()
                    .any(|cur| cur.joined_to.as_deref() == Some(infra.id.as_str()));
                if !apps_started && !self.init_done(d, &inits, &infra.id) {
                    return;
                }
                for c in m.init_containers.iter().filter(|c| c.is_sidecar()) {
                    let cur = inits.get(c.name.as_str()).copied();
                    self.container(d, c, cur, &infra.id, true);
                }
                for c in &m.containers {
                    let cur = currents.get(c.name.as_str()).copied();
                    self.container(d, c, cur, &infra.id, false);
                }
            }
            None => self.rebuild(d, &currents, &inits, &stale_infras, grace, &finished),
        }
    }

    /// Takes the init containers one step further in order; true once every one has exited 0 in the
    /// network namespace of `infra_id`.
    fn init_done(
        &mut self,
        d: &DesiredPod,
        inits: &BTreeMap<&str, &ContainerInfo>,
        infra_id: &str,
    ) -> bool {
        let grace = d.grace();
        let existing = InfraRef::Existing(infra_id.to_string());
        for c in &d.manifest.init_containers {
            let Some(cur) = inits.get(c.name.as_str()).copied() else {
                self.create_init(c, existing, 0, CreateReason::New);
                return false;
            };
            // One that ran for another infra container ran for another incarnation of the pod.
            let stale = cur.labels.spec_hash != d.hashes[&c.name]
                || cur.joined_to.as_deref().is_some_and(|j| j != infra_id);
            if stale {
                if cur.state.is_running() {
                    self.stop(cur, grace, StopReason::SpecChanged);
                } else {
                    self.remove(cur);
                    self.create_init(
                        c,
                        existing,
                        cur.labels.restart_count + 1,
                        CreateReason::Replace,
                    );
                }
                return false;
            }
            match &cur.state {
                RunState::Created => {
                    self.steps.push(Step::Start {
                        id: cur.id.clone(),
                        container: c.name.clone(),
                    });
                    return false;
                }
                RunState::Running { .. } => {
                    if let Some(t) = self.state.terminating.get(&cur.id) {
                        self.stop(cur, grace, t.reason);
                    } else if c.is_sidecar() && self.state.unhealthy.contains_key(&cur.id) {
                        self.stop(cur, grace, StopReason::Unhealthy);
                    } else if c.is_sidecar() && !self.state.not_ready.contains(&cur.id) {
                        // Started (and ready, if probed): the next one may go.
                        continue;
                    }
                    return false;
                }
                RunState::Exited { exit_code: 0, .. } if !c.is_sidecar() => continue,
                // A failure under `Never` ended the pod before this; any other policy tries again.
                RunState::Exited { .. } => {
                    if let Some(restart_at) = self.backoff_until(&c.name, cur) {
                        self.wake_at(restart_at);
                    } else {
                        self.remove(cur);
                        self.create_init(
                            c,
                            existing,
                            cur.labels.restart_count + 1,
                            CreateReason::Restart,
                        );
                    }
                    return false;
                }
            }
        }
        true
    }

    /// When an exited container may start again, recording the exit the first time it is seen; `None`
    /// when that time has come.
    fn backoff_until(&mut self, name: &str, cur: &ContainerInfo) -> Option<Instant> {
        let memory = self.memory(name);
        let restart_at = match memory.exit {
            Some(h) if h.id == cur.id => h.restart_at,
            _ => {
                let (wait, backoff) = memory.backoff.after_exit(self.now);
                let restart_at = self.now + wait;
                self.steps.push(Step::RecordExit {
                    container: name.to_string(),
                    exited_id: cur.id.clone(),
                    backoff,
                    restart_at,
                    wait,
                });
                restart_at
            }
        };
        (self.now < restart_at).then_some(restart_at)
    }

    fn killed_unhealthy(&self, id: &str) -> bool {
        self.state
            .terminating
            .get(id)
            .is_some_and(|t| t.reason == StopReason::Unhealthy)
    }

    /// No healthy infra container: stop every app container, then the old infra, then build the pod anew.
    fn rebuild(
        &mut self,
        d: &DesiredPod,
        currents: &BTreeMap<&str, &ContainerInfo>,
        inits: &BTreeMap<&str, &ContainerInfo>,
        stale_infras: &[&ContainerInfo],
        grace: Duration,
        finished: &BTreeSet<&str>,
    ) {
        let running_apps: Vec<&ContainerInfo> = currents
            .values()
            .chain(inits.values())
            .copied()
            .filter(|c| c.state.is_running())
            .collect();
        let mut busy = !running_apps.is_empty();
        for c in &running_apps {
            self.stop(c, grace, StopReason::PodRebuild);
        }
        for c in stale_infras.iter().filter(|c| c.state.is_running()) {
            busy = true;
            if running_apps.is_empty() {
                self.kill(c, StopReason::PodRebuild);
            }
        }
        if busy {
            return;
        }
        if let Some(retry_at) = self.pull_backoff(INFRA_CONTAINER_NAME) {
            self.wake_at(retry_at);
            return;
        }
        // An infra container that died (not one replaced because the pod's ports changed) comes back after
        // the same CrashLoopBackOff as an app container: a pod whose infra cannot run (its host port taken,
        // say) must not spin.
        let dead =
            newest(stale_infras.iter().copied()).filter(|i| i.labels.spec_hash == d.infra_hash);
        if let Some(dead) = dead {
            let memory = self.memory(INFRA_CONTAINER_NAME);
            let restart_at = match memory.exit {
                Some(h) if h.id == dead.id => h.restart_at,
                _ => {
                    let (wait, backoff) = memory.backoff.after_exit(self.now);
                    self.steps.push(Step::RecordExit {
                        container: INFRA_CONTAINER_NAME.to_string(),
                        exited_id: dead.id.clone(),
                        backoff,
                        restart_at: self.now + wait,
                        wait,
                    });
                    self.now + wait
                }
            };
            if self.now < restart_at {
                self.wake_at(restart_at);
                return;
            }
        }
        for c in stale_infras {
            self.remove(c);
        }
        let infra_restarts = stale_infras
            .iter()
            .map(|c| c.labels.restart_count + 1)
            .max()
            .unwrap_or(0);
        self.steps.push(Step::EnsureImage {
            container: INFRA_CONTAINER_NAME.to_string(),
            image: d.pause_image.clone(),
            policy: PullPolicy::IfNotPresent,
        });
        self.steps.push(Step::CreateInfra {
            restart_count: infra_restarts,
        });
        // A new incarnation of the pod runs its init containers again first; the app containers follow
        // when they have completed.
        if let Some(first) = d.manifest.init_containers.first() {
            for old in inits.values() {
                self.remove(old);
            }
            let (restart_count, reason) = match inits.get(first.name.as_str()) {
                Some(o) => (o.labels.restart_count + 1, CreateReason::Restart),
                None => (0, CreateReason::New),
            };
            self.create_init(first, InfraRef::Created, restart_count, reason);
            return;
        }
        for c in &d.manifest.containers {
            let old = currents.get(c.name.as_str()).copied();
            if finished.contains(c.name.as_str()) {
                continue;
            }
            let (restart_count, reason) = match old {
                Some(o) => {
                    self.remove(o);
                    (o.labels.restart_count + 1, CreateReason::Restart)
                }
                None => (0, CreateReason::New),
            };
            self.create_app(c, InfraRef::Created, restart_count, reason);
        }
    }

    fn pull_backoff(&self, name: &str) -> Option<Instant> {
        self.state
            .containers
            .get(name)?
            .pull
            .as_ref()
            .map(|p| p.retry_at)
            .filter(|at| *at > self.now)
    }

    fn create_init(
        &mut self,
        c: &Container,
        infra: InfraRef,
        restart_count: u32,
        reason: CreateReason,
    ) {
        if self.prepare(c) {
            self.steps.push(Step::CreateInit {
                container: c.name.clone(),
                infra,
                restart_count,
                reason,
            });
        }
    }

    fn create_app(
        &mut self,
        c: &Container,
        infra: InfraRef,
        restart_count: u32,
        reason: CreateReason,
    ) {
        if self.prepare(c) {
            self.steps.push(Step::CreateApp {
                container: c.name.clone(),
                infra,
                restart_count,
                reason,
            });
        }
    }

    /// The steps before a container is created (volumes, its image); false while its pull backs off.
    fn prepare(&mut self, c: &Container) -> bool {
        if let Some(retry_at) = self.pull_backoff(&c.name) {
            self.wake_at(retry_at);
            return false;
        }
        if !self.volumes_prepared {
            self.volumes_prepared = true;
            self.steps.push(Step::PrepareVolumes);
        }
        let policy = c.image_pull_policy.unwrap_or(PullPolicy::IfNotPresent);
        self.steps.push(Step::EnsureImage {
            container: c.name.clone(),
            image: c.image.clone(),
            policy,
        });
        true
    }

    /// One app container (or a sidecar, once the app containers were made) of a pod whose infra
    /// container is healthy.
    fn container(
        &mut self,
        d: &DesiredPod,
        c: &Container,
        current: Option<&ContainerInfo>,
        infra_id: &str,
        sidecar: bool,
    ) {
        let grace = d.grace();
        let create = |p: &mut Self, restart_count, reason| {
            let infra = InfraRef::Existing(infra_id.to_string());
            if sidecar {
                p.create_init(c, infra, restart_count, reason);
            } else {
                p.create_app(c, infra, restart_count, reason);
            }
        };
        let Some(cur) = current else {
            create(self, 0, CreateReason::New);
            return;
        };
        // Joined to another (dead) infra container: useless unless it has exited anyway, in which case the
        // restart policy decides and a restart joins the current one.
        let stale = cur.labels.spec_hash != d.hashes[&c.name]
            || (!cur.state.is_exited() && cur.joined_to.as_deref().is_some_and(|j| j != infra_id));
        if stale {
            if cur.state.is_running() {
                self.stop(cur, grace, StopReason::SpecChanged);
            } else {
                self.remove(cur);
                create(self, cur.labels.restart_count + 1, CreateReason::Replace);
            }
            return;
        }
        match &cur.state {
            RunState::Created => self.steps.push(Step::Start {
                id: cur.id.clone(),
                container: c.name.clone(),
            }),
            RunState::Running { .. } => {
                if let Some(t) = self.state.terminating.get(&cur.id) {
                    self.stop(cur, grace, t.reason);
                } else if self.state.unhealthy.contains_key(&cur.id) {
                    self.stop(cur, grace, StopReason::Unhealthy);
                }
            }
            RunState::Exited { exit_code, .. } => {
                // A sidecar always comes back, whatever the pod's policy.
                let policy = if sidecar {
                    RestartPolicy::Always
                } else {
                    d.manifest.effective_restart_policy()
                };
                if !should_restart(policy, *exit_code, self.killed_unhealthy(&cur.id)) {
                    return;
                }
                // Stopped when the pod was rebuilt, which waited for the init containers to run again:
                // it comes back at once, as a rebuild brings app containers back.
                let rebuilt = !d.manifest.init_containers.is_empty()
                    && cur.joined_to.as_deref().is_some_and(|j| j != infra_id);
                if rebuilt {
                    self.remove(cur);
                    create(self, cur.labels.restart_count + 1, CreateReason::Restart);
                    return;
                }
                let memory = self.memory(&c.name);
                let restart_at = match memory.exit {
                    Some(h) if h.id == cur.id => h.restart_at,
                    _ => {
                        let (wait, backoff) = memory.backoff.after_exit(self.now);
                        let restart_at = self.now + wait;
                        self.steps.push(Step::RecordExit {
                            container: c.name.clone(),
                            exited_id: cur.id.clone(),
                            backoff,
                            restart_at,
                            wait,
                        });
                        restart_at
                    }
                };
                if self.now >= restart_at {
                    self.remove(cur);
                    create(self, cur.labels.restart_count + 1, CreateReason::Restart);
                } else {
                    self.wake_at(restart_at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::pods::runtime::ContainerLabels;
    use hostlet_api::parse_manifest;

    const PAUSE: &str = "busybox:latest";

    fn pod(restart: &str) -> DesiredPod {
        let text = format!(
            "version: v1beta1\nid: web\nrestartPolicy: {restart}\nterminationGracePeriodSeconds: 5\n\
             containers:\n- name: a\n  image: busybox:latest\n  command: [sleep, '1000']\n\
             - name: b\n  image: busybox:latest\n  imagePullPolicy: Never\n"
        );
        DesiredPod::new(parse_manifest(text.as_bytes()).unwrap(), PAUSE)
    }

    fn info(
        id: &str,
        container: &str,
        role: Role,
        hash: &str,
        rc: u32,
        state: RunState,
    ) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: format!("k8s--{container}--web--0000000{rc}"),
            labels: ContainerLabels {
                node: "n1".into(),
                pod: "web".into(),
                container: container.into(),
                role,
                spec_hash: hash.into(),
                restart_count: rc,
                sidecar: None,
            },
            image: "busybox:latest".into(),
            created: UNIX_EPOCH + Duration::from_secs(1_000 + u64::from(rc)),
            state,
            ip: None,
            joined_to: (role == Role::App).then(|| "infra".to_string()),
        }
    }

    fn running() -> RunState {
        RunState::Running {
            started_at: SystemTime::now(),
        }
    }

    fn exited(code: i64) -> RunState {
        RunState::Exited {
            exit_code: code,
            started_at: None,
            finished_at: None,
            oom_killed: false,
            error: None,
        }
    }

    /// A pod whose containers all run with the right hashes.
    fn healthy(d: &DesiredPod) -> ObservedPod {
        ObservedPod {
            containers: vec![
                info("infra", "net", Role::Infra, &d.infra_hash, 0, running()),
                info("a0", "a", Role::App, &d.hashes["a"], 0, running()),
                info("b0", "b", Role::App, &d.hashes["b"], 0, running()),
            ],
        }
    }

    fn with(mut o: ObservedPod, id: &str, f: impl FnOnce(&mut ContainerInfo)) -> ObservedPod {
        f(o.containers.iter_mut().find(|c| c.id == id).unwrap());
        o
    }

    fn create(container: &str, infra: InfraRef, rc: u32, reason: CreateReason) -> Step {
        Step::CreateApp {
            container: container.into(),
            infra,
            restart_count: rc,
            reason,
        }
    }

    fn ensure(container: &str, policy: PullPolicy) -> Step {
        Step::EnsureImage {
            container: container.into(),
            image: "busybox:latest".into(),
            policy,
        }
    }

    fn remove(id: &str, container: &str) -> Step {
        Step::Remove {
            id: id.into(),
            container: container.into(),
        }
    }

    fn existing() -> InfraRef {
        InfraRef::Existing("infra".into())
    }

    #[tokio::test(start_paused = true)]
    async fn plans_for_the_usual_situations() {
        let now = Instant::now();
        let d = pod("Always");
        let none = PodRuntimeState::default();
        let mut terminating = PodRuntimeState::default();
        terminating.terminating.insert(
            "a0".into(),
            Termination {
                at: now - Duration::from_secs(6),
                grace: Duration::from_secs(5),
                reason: StopReason::PodDeleted,
            },
        );
        let mut unhealthy = PodRuntimeState::default();
        unhealthy.unhealthy.insert("a0".into(), "HTTP 500".into());

        let new_pod = vec![
            Step::EnsureImage {
                container: "net".into(),
                image: PAUSE.into(),
                policy: PullPolicy::IfNotPresent,
            },
            Step::CreateInfra { restart_count: 0 },
            Step::PrepareVolumes,
            ensure("a", PullPolicy::IfNotPresent),
            create("a", InfraRef::Created, 0, CreateReason::New),
            ensure("b", PullPolicy::Never),
            create("b", InfraRef::Created, 0, CreateReason::New),
        ];
        let mut changed = d.clone();
        changed.manifest.containers[1].command = vec!["true".into()];
        let changed = DesiredPod::new(changed.manifest, PAUSE);

        type Case<'a> = (
            &'a str,
            Option<&'a DesiredPod>,
            ObservedPod,
            &'a PodRuntimeState,
            Vec<Step>,
        );
        let table: Vec<Case> = vec![
            (
                "a new pod is created whole",
                Some(&d),
                ObservedPod::default(),
                &none,
                new_pod,
            ),
            (
                "an unchanged pod is not touched",
                Some(&d),
                healthy(&d),
                &none,
                vec![],
            ),
            (
                "a changed container is stopped, the other left alone",
                Some(&changed),
                healthy(&d),
                &none,
                vec![Step::Terminate {
                    id: "b0".into(),
                    container: "b".into(),
                    grace: Duration::from_secs(5),
                    reason: StopReason::SpecChanged,
                }],
            ),
            (
                "a changed container that stopped is replaced",
                Some(&changed),
                with(healthy(&d), "b0", |c| c.state = exited(143)),
                &none,
                vec![
                    remove("b0", "b"),
                    Step::PrepareVolumes,
                    ensure("b", PullPolicy::Never),
                    create("b", existing(), 1, CreateReason::Replace),
                ],
            ),
            (
                "a missing app container is created in the running pod",
                Some(&d),
                ObservedPod {
                    containers: healthy(&d)
                        .containers
                        .into_iter()
                        .filter(|c| c.id != "a0")
                        .collect(),
                },
                &none,
                vec![
                    Step::PrepareVolumes,
                    ensure("a", PullPolicy::IfNotPresent),
                    create("a", existing(), 0, CreateReason::New),
                ],
            ),
            (
                "a created container is started",
                Some(&d),
                with(healthy(&d), "a0", |c| c.state = RunState::Created),
                &none,
                vec![Step::Start {
                    id: "a0".into(),
                    container: "a".into(),
                }],
            ),
            (
                "a deleted pod gets SIGTERM first",
                None,
                healthy(&d),
                &none,
                vec![
                    Step::Terminate {
                        id: "a0".into(),
                        container: "a".into(),
                        grace: DEFAULT_GRACE,
                        reason: StopReason::PodDeleted,
                    },
                    Step::Terminate {
                        id: "b0".into(),
                        container: "b".into(),
                        grace: DEFAULT_GRACE,
                        reason: StopReason::PodDeleted,
                    },
                ],
            ),
            (
                "after the grace period SIGKILL",
                None,
                with(healthy(&d), "b0", |c| c.state = exited(0)),
                &terminating,
                vec![
                    Step::Kill {
                        id: "a0".into(),
                        container: "a".into(),
                        reason: StopReason::PodDeleted,
                    },
                    remove("b0", "b"),
                ],
            ),
            (
                "when the apps are gone the infra container is killed",
                None,
                with(
                    with(healthy(&d), "a0", |c| c.state = exited(137)),
                    "b0",
                    |c| c.state = exited(0),
                ),
                &none,
                vec![
                    remove("a0", "a"),
                    remove("b0", "b"),
                    Step::Kill {
                        id: "infra".into(),
                        container: "net".into(),
                        reason: StopReason::PodDeleted,
                    },
                ],
            ),
            (
                "a deleted pod with no containers left is cleaned up",
                None,
                ObservedPod::default(),
                &none,
                vec![Step::Cleanup],
            ),
            (
                "a liveness failure stops the container",
                Some(&d),
                healthy(&d),
                &unhealthy,
                vec![Step::Terminate {
                    id: "a0".into(),
                    container: "a".into(),
                    grace: Duration::from_secs(5),
                    reason: StopReason::Unhealthy,
                }],
            ),
            (
                "a dead infra container rebuilds the pod: apps stopped first",
                Some(&d),
                with(healthy(&d), "infra", |c| c.state = exited(137)),
                &none,
                vec![
                    Step::Terminate {
                        id: "a0".into(),
                        container: "a".into(),
                        grace: Duration::from_secs(5),
                        reason: StopReason::PodRebuild,
                    },
                    Step::Terminate {
                        id: "b0".into(),
                        container: "b".into(),
                        grace: Duration::from_secs(5),
                        reason: StopReason::PodRebuild,
                    },
                ],
            ),
            (
                "an older instance and a container no longer in the manifest go",
                Some(&d),
                ObservedPod {
                    containers: [
                        healthy(&d).containers,
                        vec![
                            info("a-old", "a", Role::App, &d.hashes["a"], 0, exited(1)),
                            info("x0", "x", Role::App, "h", 0, exited(0)),
                        ],
                    ]
                    .concat()
                    .into_iter()
                    .map(|mut c| {
                        if c.id == "a0" {
                            c.labels.restart_count = 1;
                        }
                        c
                    })
                    .collect(),
                },
                &none,
                vec![remove("a-old", "a"), remove("x0", "x")],
            ),
        ];
        for (name, desired, observed, state, want) in table {
            assert_eq!(plan(desired, &observed, state, now).steps, want, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_infra_with_stopped_apps_is_replaced_in_one_plan() {
        let d = pod("Always");
        let observed = with(
            with(
                with(healthy(&d), "infra", |c| c.state = exited(137)),
                "a0",
                |c| c.state = exited(137),
            ),
            "b0",
            |c| c.state = exited(0),
        );
        let steps = plan(
            Some(&d),
            &observed,
            &PodRuntimeState::default(),
            Instant::now(),
        )
        .steps;
        assert!(
            matches!(&steps[0], Step::RecordExit { container, wait, .. } if container == "net" && wait.is_zero())
        );
        assert_eq!(steps[1], remove("infra", "net"));
        assert!(steps.contains(&Step::CreateInfra { restart_count: 1 }));
        assert!(steps.contains(&create("a", InfraRef::Created, 1, CreateReason::Restart)));
        assert!(steps.contains(&remove("b0", "b")));
    }

    #[tokio::test(start_paused = true)]
    async fn an_infra_container_that_keeps_dying_backs_off() {
        let now = Instant::now();
        let d = pod("Always");
        let observed = ObservedPod {
            containers: vec![
                info("infra2", "net", Role::Infra, &d.infra_hash, 2, exited(128)),
                info("a0", "a", Role::App, &d.hashes["a"], 0, exited(137)),
            ],
        };
        let mut state = PodRuntimeState::default();
        let mut backoff = CrashLoopBackoff::default();
        backoff.started(now);
        backoff = backoff.after_exit(now).1;
        state.containers.insert(
            "net".into(),
            ContainerMemory {
                backoff,
                ..Default::default()
            },
        );
        let p = plan(Some(&d), &observed, &state, now);
        assert!(
            matches!(&p.steps[..], [Step::RecordExit { wait, .. }] if *wait == Duration::from_secs(10)),
            "{:?}",
            p.steps
        );
        assert_eq!(p.requeue_after, Some(Duration::from_secs(10)));
        // A finished container stays finished when the pod is rebuilt, even joined to the dead infra.
        let never = pod("Never");
        let observed = ObservedPod {
            containers: vec![
                info("infra", "net", Role::Infra, &never.infra_hash, 0, running()),
                info("a0", "a", Role::App, &never.hashes["a"], 0, exited(0)),
                info("b0", "b", Role::App, &never.hashes["b"], 0, running()),
            ],
        };
        let observed = with(observed, "a0", |c| c.joined_to = Some("old-infra".into()));
        assert_eq!(
            plan(Some(&never), &observed, &PodRuntimeState::default(), now).steps,
            vec![]
        );
    }

    /// Replays a crash loop on paused time: the first restart is immediate, then 10, 20, 40 … 300 s.
    #[tokio::test(start_paused = true)]
    async fn crash_loop_backoff_series_on_paused_time() {
        let d = pod("Always");
        let mut state = PodRuntimeState::default();
        let mut waits = Vec::new();
        for rc in 0..8u32 {
            let observed = with(healthy(&d), "a0", |c| {
                c.id = format!("a{rc}");
                c.labels.restart_count = rc;
                c.state = exited(1);
            });
            let id = format!("a{rc}");
            let crashed_at = Instant::now();
            let mut restarted = false;
            while !restarted {
                let p = plan(Some(&d), &observed, &state, Instant::now());
                for step in &p.steps {
                    match step {
                        Step::RecordExit {
                            container,
                            exited_id,
                            backoff,
                            restart_at,
                            ..
                        } => {
                            let m = state.containers.entry(container.clone()).or_default();
                            m.backoff = *backoff;
                            m.exit = Some(HandledExit {
                                id: exited_id.clone(),
                                restart_at: *restart_at,
                            });
                        }
                        Step::CreateApp {
                            restart_count,
                            reason,
                            ..
                        } => {
                            assert_eq!(*reason, CreateReason::Restart);
                            assert_eq!(*restart_count, rc + 1);
                            restarted = true;
                        }
                        Step::Remove { id: removed, .. } => assert_eq!(removed, &id),
                        _ => {}
                    }
                }
                if !restarted {
                    let after = p.requeue_after.expect("a backoff wait requeues");
                    tokio::time::advance(after).await;
                }
            }
            waits.push(Instant::now().duration_since(crashed_at).as_secs());
            state
                .containers
                .get_mut("a")
                .unwrap()
                .backoff
                .started(Instant::now());
            // It crashes again after 1 s of running.
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn restart_policies_and_pod_completion() {
        let now = Instant::now();
        let none = PodRuntimeState::default();
        let exits = |d: &DesiredPod, a: i64, b: Option<i64>| {
            let o = with(healthy(d), "a0", |c| c.state = exited(a));
            match b {
                Some(code) => with(o, "b0", |c| c.state = exited(code)),
                None => o,
            }
        };
        let never = pod("Never");
        assert_eq!(
            plan(Some(&never), &exits(&never, 1, None), &none, now).steps,
            vec![],
            "Never: b still runs"
        );
        assert_eq!(
            plan(Some(&never), &exits(&never, 1, Some(0)), &none, now).steps,
            vec![Step::Kill {
                id: "infra".into(),
                container: "net".into(),
                reason: StopReason::PodFinished
            }],
            "Never: all finished → only the infra container goes"
        );
        let on_failure = pod("OnFailure");
        let steps = plan(
            Some(&on_failure),
            &exits(&on_failure, 0, Some(2)),
            &none,
            now,
        )
        .steps;
        assert!(
            steps.contains(&create("b", existing(), 1, CreateReason::Restart)),
            "{steps:?}"
        );
        assert!(!steps
            .iter()
            .any(|s| matches!(s, Step::CreateApp { container, .. } if container == "a")));
        let mut killed = PodRuntimeState::default();
        killed.terminating.insert(
            "a0".into(),
            Termination {
                at: now,
                grace: Duration::from_secs(5),
                reason: StopReason::Unhealthy,
            },
        );
        let steps = plan(
            Some(&on_failure),
            &exits(&on_failure, 0, None),
            &killed,
            now,
        )
        .steps;
        assert!(
            steps.contains(&create("a", existing(), 1, CreateReason::Restart)),
            "OnFailure restarts a container its liveness probe killed, whatever its exit code: {steps:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pull_waits_for_its_backoff() {
        let now = Instant::now();
        let d = pod("Always");
        let mut state = PodRuntimeState::default();
        state.containers.entry("a".into()).or_default().pull = Some(PullFailure {
            failures: 1,
            retry_at: now + Duration::from_secs(10),
            message: "no registry".into(),
        });
        let observed = ObservedPod {
            containers: healthy(&d)
                .containers
                .into_iter()
                .filter(|c| c.id != "a0")
                .collect(),
        };
        let p = plan(Some(&d), &observed, &state, now);
        assert_eq!(p.steps, vec![]);
        assert_eq!(p.requeue_after, Some(Duration::from_secs(10)));
    }

    fn init_pod(restart: &str) -> DesiredPod {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  restartPolicy: {restart}\n  \
             initContainers:\n  - {{name: i1, image: busybox:latest}}\n  - {{name: i2, image: busybox:latest}}\n  \
             containers:\n  - {{name: a, image: busybox:latest}}\n"
        );
        DesiredPod::new(parse_manifest(text.as_bytes()).unwrap(), PAUSE)
    }

    fn init(d: &DesiredPod, id: &str, name: &str, rc: u32, state: RunState) -> ContainerInfo {
        let mut c = info(id, name, Role::Init, &d.hashes[name], rc, state);
        c.joined_to = Some("infra".into());
        c
    }

    /// What a plan creates, in order.
    fn creates(p: &Plan) -> Vec<String> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::CreateInfra { .. } => Some("infra".to_string()),
                Step::CreateInit { container, .. } => Some(format!("init {container}")),
                Step::CreateApp { container, .. } => Some(format!("app {container}")),
                _ => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn init_containers_run_one_at_a_time_in_order_before_the_apps() {
        let now = Instant::now();
        let d = init_pod("Always");
        let none = PodRuntimeState::default();
        let infra = info("infra", "net", Role::Infra, &d.infra_hash, 0, running());
        let observed = |more: Vec<ContainerInfo>| ObservedPod {
            containers: std::iter::once(infra.clone()).chain(more).collect(),
        };
        let nothing: Vec<String> = Vec::new();

        // A new pod: its infra container and its first init container, nothing else.
        let p = plan(Some(&d), &ObservedPod::default(), &none, now);
        assert_eq!(creates(&p), ["infra", "init i1"]);
        // The first one runs: wait for it.
        let one_runs = observed(vec![init(&d, "i1-0", "i1", 0, running())]);
        assert_eq!(plan(Some(&d), &one_runs, &none, now), Plan::default());
        // It completed: the second, still no app container.
        let one_done = observed(vec![init(&d, "i1-0", "i1", 0, exited(0))]);
        assert_eq!(creates(&plan(Some(&d), &one_done, &none, now)), ["init i2"]);
        // Both completed: the app container; the completed ones stay (their status is shown).
        let both_done = observed(vec![
            init(&d, "i1-0", "i1", 0, exited(0)),
            init(&d, "i2-0", "i2", 0, exited(0)),
        ]);
        let p = plan(Some(&d), &both_done, &none, now);
        assert_eq!(creates(&p), ["app a"]);
        assert!(
            !p.steps.iter().any(|s| matches!(s, Step::Remove { .. })),
            "{p:?}"
        );
        // And once the app runs, nothing to do.
        let mut all = both_done.clone();
        all.containers
            .push(info("a0", "a", Role::App, &d.hashes["a"], 0, running()));
        assert_eq!(plan(Some(&d), &all, &none, now), Plan::default());

        // The second fails: it alone is tried again (the first does not run again), after its backoff.
        let failed = observed(vec![
            init(&d, "i1-0", "i1", 0, exited(0)),
            init(&d, "i2-0", "i2", 0, exited(1)),
        ]);
        let p = plan(Some(&d), &failed, &none, now);
        assert!(
            p.steps
                .iter()
                .any(|s| matches!(s, Step::RecordExit { container, .. } if container == "i2")),
            "{p:?}"
        );
        assert_eq!(creates(&p), ["init i2"]);
        let mut backing_off = PodRuntimeState::default();
        backing_off.containers.insert(
            "i2".into(),
            ContainerMemory {
                exit: Some(HandledExit {
                    id: "i2-0".into(),
                    restart_at: now + Duration::from_secs(10),
                }),
                ..Default::default()
            },
        );
        let p = plan(Some(&d), &failed, &backing_off, now);
        assert_eq!(creates(&p), nothing);
        assert_eq!(p.requeue_after, Some(Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_init_container_fails_the_pod_under_never_and_a_rebuild_runs_them_again() {
        let now = Instant::now();
        let none = PodRuntimeState::default();
        let d = init_pod("Never");
        let infra = info("infra", "net", Role::Infra, &d.infra_hash, 0, running());
        let failed = ObservedPod {
            containers: vec![infra.clone(), init(&d, "i1-0", "i1", 0, exited(2))],
        };
        let p = plan(Some(&d), &failed, &none, now);
        assert_eq!(creates(&p), Vec::<String>::new());
        assert!(
            p.steps.iter().any(|s| matches!(
                s,
                Step::Kill { id, reason: StopReason::InitFailed, .. } if id == "infra"
            )),
            "{p:?}"
        );
        // Its infra container gone, the failed pod stays as it is: nothing is rebuilt.
        let over = ObservedPod {
            containers: vec![init(&d, "i1-0", "i1", 0, exited(2))],
        };
        assert_eq!(
            creates(&plan(Some(&d), &over, &none, now)),
            Vec::<String>::new()
        );

        // The infra container of a running pod died: the init containers run again, from the first,
        // in the new pod's namespace, before the app container comes back.
        let d = init_pod("Always");
        let mut dead_infra = info("infra", "net", Role::Infra, &d.infra_hash, 0, exited(137));
        dead_infra.state = exited(137);
        let o = ObservedPod {
            containers: vec![
                dead_infra,
                init(&d, "i1-0", "i1", 0, exited(0)),
                init(&d, "i2-0", "i2", 0, exited(0)),
                info("a0", "a", Role::App, &d.hashes["a"], 0, exited(137)),
            ],
        };
        let p = plan(Some(&d), &o, &none, now);
        assert_eq!(creates(&p), ["infra", "init i1"]);
        for id in ["i1-0", "i2-0"] {
            assert!(p.steps.contains(&remove(id, &id[..2])), "{id}: {p:?}");
        }
        // The first ran again in the new namespace ("infra2"); the second, which ran in the old one, is
        // replaced, and the app container waits.
        let mut infra2 = info("infra2", "net", Role::Infra, &d.infra_hash, 1, running());
        infra2.created += Duration::from_secs(5);
        let mut again = init(&d, "i1-1", "i1", 1, exited(0));
        again.joined_to = Some("infra2".into());
        let o = ObservedPod {
            containers: vec![
                infra2,
                again,
                info("a0", "a", Role::App, &d.hashes["a"], 0, exited(137)),
            ],
        };
        let p = plan(Some(&d), &o, &none, now);
        assert_eq!(creates(&p), ["init i2"]);
        // An init container's spec changed: the pod starts afresh (its infra hash covers them).
        let changed = init_pod("OnFailure");
        let mut edited = changed.manifest.clone();
        edited.init_containers[0].command = vec!["true".into()];
        let edited = DesiredPod::new(edited, PAUSE);
        assert_ne!(edited.infra_hash, changed.infra_hash);
        assert_eq!(
            naming::infra_spec_hash(&pod("Always").manifest, PAUSE),
            pod("Always").infra_hash,
            "pods without init containers keep their infra hash"
        );
    }

    /// i1 a sidecar with a readiness probe, i2 a plain init container, s3 a sidecar; one app container.
    fn sidecar_pod(restart: &str) -> DesiredPod {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  restartPolicy: {restart}\n  \
             terminationGracePeriodSeconds: 10\n  initContainers:\n  \
             - {{name: i1, image: busybox:latest, restartPolicy: Always, readinessProbe: {{exec: {{command: [true]}}}}}}\n  \
             - {{name: i2, image: busybox:latest}}\n  \
             - {{name: s3, image: busybox:latest, restartPolicy: Always}}\n  \
             containers:\n  - {{name: a, image: busybox:latest}}\n"
        );
        DesiredPod::new(parse_manifest(text.as_bytes()).unwrap(), PAUSE)
    }

    fn sidecar(d: &DesiredPod, id: &str, name: &str, rc: u32, state: RunState) -> ContainerInfo {
        let mut c = init(d, id, name, rc, state);
        c.labels.sidecar = d
            .manifest
            .init_containers
            .iter()
            .position(|i| i.name == name)
            .map(|i| i as u32);
        c
    }

    fn app(d: &DesiredPod, id: &str, rc: u32, state: RunState) -> ContainerInfo {
        let mut c = info(id, "a", Role::App, &d.hashes["a"], rc, state);
        c.joined_to = Some("infra".into());
        c
    }

    /// The containers a plan signals, in order.
    fn terminates(p: &Plan) -> Vec<String> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Terminate { container, .. } => Some(container.clone()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_sidecar_starts_in_order_and_must_be_ready_before_the_next_one() {
        let now = Instant::now();
        let d = sidecar_pod("Never");
        let infra = info("infra", "net", Role::Infra, &d.infra_hash, 0, running());
        let observed = |more: Vec<ContainerInfo>| ObservedPod {
            containers: std::iter::once(infra.clone()).chain(more).collect(),
        };
        let mut st = PodRuntimeState::default();
        assert_eq!(
            creates(&plan(Some(&d), &ObservedPod::default(), &st, now)),
            ["infra", "init i1"]
        );
        // Running but not ready: nothing else starts.
        let i1 = sidecar(&d, "i1-0", "i1", 0, running());
        st.not_ready.insert("i1-0".into());
        let p = plan(Some(&d), &observed(vec![i1.clone()]), &st, now);
        assert_eq!(creates(&p), Vec::<String>::new());
        // Ready: the plain init container goes, while the sidecar keeps running.
        st.not_ready.clear();
        let p = plan(Some(&d), &observed(vec![i1.clone()]), &st, now);
        assert_eq!(creates(&p), ["init i2"]);
        assert!(terminates(&p).is_empty());
        let i2 = init(&d, "i2-0", "i2", 0, exited(0));
        let p = plan(Some(&d), &observed(vec![i1.clone(), i2.clone()]), &st, now);
        assert_eq!(creates(&p), ["init s3"]);
        // A sidecar without probes counts once it runs: the app container follows.
        let s3 = sidecar(&d, "s3-0", "s3", 0, running());
        let all = vec![i1.clone(), i2.clone(), s3.clone()];
        assert_eq!(
            creates(&plan(Some(&d), &observed(all.clone()), &st, now)),
            ["app a"]
        );

        // Beside the app, a sidecar that exits comes back (after its backoff) though the pod says Never,
        // and a sidecar no longer ready holds nothing up.
        let a = app(&d, "a-0", 0, running());
        let dead_i1 = sidecar(&d, "i1-0", "i1", 0, exited(1));
        st.not_ready.insert("s3-0".into());
        let o = observed(vec![dead_i1, i2.clone(), s3.clone(), a.clone()]);
        let p = plan(Some(&d), &o, &st, now);
        assert!(p
            .steps
            .iter()
            .any(|s| matches!(s, Step::RecordExit { container, .. } if container == "i1")));
        for s in &p.steps {
            if let Step::RecordExit {
                container,
                exited_id,
                backoff,
                restart_at,
                ..
            } = s
            {
                st.containers.entry(container.clone()).or_default().exit = Some(HandledExit {
                    id: exited_id.clone(),
                    restart_at: *restart_at,
                });
                st.containers.entry(container.clone()).or_default().backoff = *backoff;
            }
        }
        let later = now + Duration::from_secs(400);
        assert_eq!(creates(&plan(Some(&d), &o, &st, later)), ["init i1"]);
        assert!(
            terminates(&plan(Some(&d), &o, &st, later)).is_empty(),
            "the app is left alone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_stop_after_the_apps_in_reverse_order_and_do_not_hold_up_completion() {
        let now = Instant::now();
        let d = sidecar_pod("Never");
        let infra = info("infra", "net", Role::Infra, &d.infra_hash, 0, running());
        let i1 = sidecar(&d, "i1-0", "i1", 0, running());
        let i2 = init(&d, "i2-0", "i2", 0, exited(0));
        let s3 = sidecar(&d, "s3-0", "s3", 0, running());
        let st = PodRuntimeState::default();

        // The app container finished under Never: the last sidecar is signalled, not the first, and the
        // infra container stays.
        let done = ObservedPod {
            containers: vec![
                infra.clone(),
                i1.clone(),
                i2.clone(),
                s3.clone(),
                app(&d, "a-0", 0, exited(0)),
            ],
        };
        let p = plan(Some(&d), &done, &st, now);
        assert_eq!(terminates(&p), ["s3"]);
        assert!(!p
            .steps
            .iter()
            .any(|s| matches!(s, Step::Kill { .. } | Step::Remove { .. })));
        // s3 has gone: i1 next; then the infra container; exits are kept.
        let s3_gone = sidecar(&d, "s3-0", "s3", 0, exited(143));
        let o = ObservedPod {
            containers: vec![
                infra.clone(),
                i1.clone(),
                i2.clone(),
                s3_gone.clone(),
                app(&d, "a-0", 0, exited(0)),
            ],
        };
        assert_eq!(terminates(&plan(Some(&d), &o, &st, now)), ["i1"]);
        let i1_gone = sidecar(&d, "i1-0", "i1", 0, exited(143));
        let o = ObservedPod {
            containers: vec![
                infra.clone(),
                i1_gone,
                i2.clone(),
                s3_gone,
                app(&d, "a-0", 0, exited(0)),
            ],
        };
        let p = plan(Some(&d), &o, &st, now);
        assert_eq!(
            p.steps,
            [Step::Kill {
                id: "infra".into(),
                container: "net".into(),
                reason: StopReason::PodFinished,
            }]
        );

        // Deleted: the app container first, the sidecars only once it has gone, the last first, with what
        // is left of the grace period.
        let running = ObservedPod {
            containers: vec![
                infra.clone(),
                i1.clone(),
                i2.clone(),
                s3.clone(),
                app(&d, "a-0", 0, running()),
            ],
        };
        let mut st = PodRuntimeState {
            grace: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let p = plan(None, &running, &st, now);
        assert_eq!(terminates(&p), ["a"]);
        st.terminating.insert(
            "a-0".into(),
            Termination {
                at: now,
                grace: Duration::from_secs(10),
                reason: StopReason::PodDeleted,
            },
        );
        let app_gone = ObservedPod {
            containers: vec![
                infra.clone(),
                i1.clone(),
                i2.clone(),
                s3.clone(),
                app(&d, "a-0", 0, exited(0)),
            ],
        };
        let later = now + Duration::from_secs(6);
        let p = plan(None, &app_gone, &st, later);
        let signalled: Vec<(String, Duration)> = p
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Terminate {
                    container, grace, ..
                } => Some((container.clone(), *grace)),
                _ => None,
            })
            .collect();
        assert_eq!(signalled, [("s3".to_string(), Duration::from_secs(4))]);
        assert!(!p.steps.iter().any(|s| matches!(s, Step::Kill { .. })));
    }
}
