//! Pod status and events: built from (desired, observed, memory, probe results), written to etcd by a
//! background writer so that a slow or absent etcd never holds up a reconcile.
//!
//! Statuses are latest-wins per pod and written only when they changed (ignoring `updatedAt`); a failed
//! write is retried with backoff until etcd answers. Events go through the agent's one
//! [`EventRecorder`] (aggregated, capped per node).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hostlet_api::manifest::{PodManifest, RestartPolicy};
use hostlet_api::objects::{ContainerState, ContainerStatus, PodPhase, PodStatus, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, ExponentialBackoff};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventKind, EventRecorder};

use super::planner::{should_restart, ObservedPod, PodRuntimeState, StopReason};
use super::probe_results::ProbeResults;
use super::runtime::{ContainerInfo, RunState};

const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The reason a terminated container shows.
pub fn termination_reason(state: &RunState) -> &'static str {
    match state {
        RunState::Exited {
            oom_killed: true, ..
        } => "OOMKilled",
        RunState::Exited { error: Some(_), .. } => "ContainerCannotRun",
        RunState::Exited { exit_code: 0, .. } => "Completed",
        _ => "Error",
    }
}

fn terminated(c: &ContainerInfo) -> Option<ContainerState> {
    match &c.state {
        RunState::Exited {
            exit_code,
            finished_at,
            ..
        } => Some(ContainerState::Terminated {
            exit_code: *exit_code,
            reason: termination_reason(&c.state).to_string(),
            finished_at: finished_at.map(Timestamp),
        }),
        _ => None,
    }
}

/// The status of a pod that runs (or is meant to).
pub fn build_status(
    node: &str,
    manifest: &PodManifest,
    observed: &ObservedPod,
    memory: &PodRuntimeState,
    probes: &ProbeResults,
    now: Instant,
) -> PodStatus {
    let policy = manifest.effective_restart_policy();
    let mut containers = Vec::new();
    let mut messages: Vec<String> = memory
        .containers
        .get(hostlet_api::naming::INFRA_CONTAINER_NAME)
        .and_then(|m| m.start_error.as_ref())
        .map(|e| format!("pod infra container did not start: {e}"))
        .into_iter()
        .collect();
    let (mut any_running, mut any_restarting, mut all_finished, mut all_zero) =
        (false, false, true, true);
    let (init_containers, init) =
        init_statuses(manifest, observed, memory, probes, now, &mut messages);
    for c in &manifest.containers {
        let cur = observed.current(&c.name);
        let mem = memory.containers.get(&c.name);
        let probe = cur.map(|k| probes.get(&k.id)).unwrap_or_default();
        let mut last_state = mem.and_then(|m| m.last_termination.clone());
        let state = match cur.map(|k| (k, &k.state)) {
            None | Some((_, RunState::Created)) => {
                all_finished = false;
                match mem.and_then(|m| m.pull.as_ref()) {
                    _ if mem.and_then(|m| m.config_error.as_ref()).is_some() => {
                        let why = mem.and_then(|m| m.config_error.clone()).unwrap_or_default();
                        messages.push(format!("{}: {why}", c.name));
                        ContainerState::Waiting {
                            reason: "CreateContainerConfigError".into(),
                            message: why,
                        }
                    }
                    Some(p) => {
                        messages.push(format!("{}: {}", c.name, p.message));
                        ContainerState::Waiting {
                            reason: if p.failures > 1 {
                                "ImagePullBackOff"
                            } else {
                                "ErrImagePull"
                            }
                            .into(),
                            message: p.message.clone(),
                        }
                    }
                    None => ContainerState::Waiting {
                        reason: if init == InitProgress::Done {
                            "ContainerCreating"
                        } else {
                            "PodInitializing"
                        }
                        .into(),
                        message: String::new(),
                    },
                }
            }
            Some((_, RunState::Running { started_at })) => {
                any_running = true;
                all_finished = false;
                ContainerState::Running {
                    started_at: Timestamp(*started_at),
                }
            }
            Some((k, RunState::Exited { exit_code, .. })) => {
                let unhealthy = memory
                    .terminating
                    .get(&k.id)
                    .is_some_and(|t| t.reason == StopReason::Unhealthy);
                let backoff_until = mem
                    .and_then(|m| m.exit.as_ref())
                    .filter(|h| h.id == k.id)
                    .map(|h| h.restart_at);
                if should_restart(policy, *exit_code, unhealthy) {
                    any_restarting = true;
                    all_finished = false;
                    last_state = terminated(k);
                    match backoff_until.filter(|at| *at > now) {
                        Some(at) => ContainerState::Waiting {
                            reason: "CrashLoopBackOff".into(),
                            message: format!(
                                "back-off {}s restarting failed container {}",
                                at.saturating_duration_since(now).as_secs().max(1),
                                c.name
                            ),
                        },
                        None => ContainerState::Waiting {
                            reason: "ContainerCreating".into(),
                            message: String::new(),
                        },
                    }
                } else {
                    all_zero &= *exit_code == 0;
                    terminated(k).unwrap_or(ContainerState::Waiting {
                        reason: "Unknown".into(),
                        message: String::new(),
                    })
                }
            }
        };
        let has_readiness = c.readiness_probe.is_some();
        let running = matches!(state, ContainerState::Running { .. });
        containers.push(ContainerStatus {
            name: c.name.clone(),
            ready: running && probe.started && (!has_readiness || probe.ready),
            state,
            last_state,
            restart_count: cur.map(|k| k.labels.restart_count).unwrap_or(0),
            image: c.image.clone(),
            container_id: cur.map(|k| k.id.clone()),
            probes: probe.last,
        });
    }
    let phase = if init == InitProgress::Failed {
        PodPhase::Failed
    } else if init == InitProgress::Running {
        PodPhase::Pending
    } else if all_finished && !containers.is_empty() {
        if all_zero {
            PodPhase::Succeeded
        } else {
            PodPhase::Failed
        }
    } else if any_running || any_restarting {
        PodPhase::Running
    } else {
        PodPhase::Pending
    };
    PodStatus {
        id: manifest.id.clone(),
        node: node.to_string(),
        phase,
        source: Some("etcd-key".into()),
        manifest: None,
        message: messages.join("; "),
        // As in Kubernetes, a pod is ready when its app containers and its sidecars are.
        ready: phase == PodPhase::Running
            && containers.iter().all(|c| c.ready)
            && manifest
                .init_containers
                .iter()
                .zip(&init_containers)
                .all(|(c, s)| !c.is_sidecar() || s.ready),
        init_containers,
        containers,
        started_at: observed
            .containers
            .iter()
            .filter(|c| c.labels.role == hostlet_api::naming::Role::Infra)
            .filter_map(|c| match c.state {
                RunState::Running { started_at } => Some(Timestamp(started_at)),
                _ => None,
            })
            .max(),
        revision_hash: manifest
            .annotations
            .get(hostlet_api::podset::HASH)
            .filter(|_| runs_this_spec(manifest, observed))
            .cloned(),
        updated_at: Timestamp::now(),
    }
}

/// Whether every container the manifest lists that exists was made from the manifest as it is now: a
/// status that says the new template's hash while the old containers still run (the moment between a
/// manifest change and their replacement) would tell a pod set's rollout that the node already runs it.
/// Init containers count where they still exist (a completed one may have been collected).
fn runs_this_spec(manifest: &PodManifest, observed: &ObservedPod) -> bool {
    let made_from = |c: &hostlet_api::manifest::Container, k: &ContainerInfo| {
        k.labels.spec_hash == hostlet_api::naming::container_spec_hash(manifest, c)
    };
    manifest
        .containers
        .iter()
        .all(|c| observed.current(&c.name).is_some_and(|k| made_from(c, k)))
        && manifest.init_containers.iter().all(|c| {
            observed
                .current_init(&c.name)
                .is_none_or(|k| made_from(c, k))
        })
}

/// Where a pod's init containers stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitProgress {
    /// Every one has completed (or there are none).
    Done,
    Running,
    /// One failed and the pod restarts nothing.
    Failed,
}

/// The init containers' statuses, in order, and where they stand together.
fn init_statuses(
    manifest: &PodManifest,
    observed: &ObservedPod,
    memory: &PodRuntimeState,
    probes: &ProbeResults,
    now: Instant,
    messages: &mut Vec<String>,
) -> (Vec<ContainerStatus>, InitProgress) {
    let policy = manifest.effective_restart_policy();
    let mut progress = InitProgress::Done;
    let mut out = Vec::new();
    for c in &manifest.init_containers {
        let cur = observed.current_init(&c.name);
        let mem = memory.containers.get(&c.name);
        if c.is_sidecar() {
            let (status, done) = sidecar_status(manifest, c, observed, mem, probes, now);
            if !done && progress == InitProgress::Done {
                progress = InitProgress::Running;
            }
            out.push(status);
            continue;
        }
        let mut last_state = mem.and_then(|m| m.last_termination.clone());
        let waiting = |reason: &str, message: String| ContainerState::Waiting {
            reason: reason.into(),
            message,
        };
        let state = match cur.map(|k| (k, &k.state)) {
            Some((k, RunState::Exited { exit_code: 0, .. })) => {
                terminated(k).unwrap_or_else(|| waiting("Unknown", String::new()))
            }
            Some((k, RunState::Exited { exit_code, .. })) => {
                messages.push(format!(
                    "init container {} exited with code {exit_code}",
                    c.name
                ));
                if policy == RestartPolicy::Never {
                    progress = InitProgress::Failed;
                    terminated(k).unwrap_or_else(|| waiting("Unknown", String::new()))
                } else {
                    last_state = terminated(k);
                    let until = mem
                        .and_then(|m| m.exit.as_ref())
                        .filter(|h| h.id == k.id && h.restart_at > now)
                        .map(|h| h.restart_at);
                    match until {
                        Some(at) => waiting(
                            "CrashLoopBackOff",
                            format!(
                                "back-off {}s restarting failed init container {}",
                                at.saturating_duration_since(now).as_secs().max(1),
                                c.name
                            ),
                        ),
                        None => waiting("PodInitializing", String::new()),
                    }
                }
            }
            Some((_, RunState::Running { started_at })) => ContainerState::Running {
                started_at: Timestamp(*started_at),
            },
            None | Some((_, RunState::Created)) => match mem.and_then(|m| m.pull.as_ref()) {
                _ if mem.and_then(|m| m.config_error.as_ref()).is_some() => {
                    let why = mem.and_then(|m| m.config_error.clone()).unwrap_or_default();
                    messages.push(format!("{}: {why}", c.name));
                    waiting("CreateContainerConfigError", why)
                }
                Some(p) => {
                    messages.push(format!("{}: {}", c.name, p.message));
                    waiting("ErrImagePull", p.message.clone())
                }
                None => waiting("PodInitializing", String::new()),
            },
        };
        let completed = matches!(state, ContainerState::Terminated { exit_code: 0, .. });
        if !completed && progress == InitProgress::Done {
            progress = InitProgress::Running;
        }
        out.push(ContainerStatus {
            name: c.name.clone(),
            ready: completed,
            state,
            last_state,
            restart_count: cur.map(|k| k.labels.restart_count).unwrap_or(0),
            image: c.image.clone(),
            container_id: cur.map(|k| k.id.clone()),
            probes: BTreeMap::new(),
        });
    }
    (out, progress)
}

/// A sidecar's status, and whether it is past its start: running (and started and ready, if probed), or
/// with the app containers made beside it.
fn sidecar_status(
    manifest: &PodManifest,
    c: &hostlet_api::manifest::Container,
    observed: &ObservedPod,
    mem: Option<&crate::pods::planner::ContainerMemory>,
    probes: &ProbeResults,
    now: Instant,
) -> (ContainerStatus, bool) {
    let cur = observed.current_init(&c.name);
    let mut last_state = mem.and_then(|m| m.last_termination.clone());
    let waiting = |reason: &str, message: String| ContainerState::Waiting {
        reason: reason.into(),
        message,
    };
    let past = cur.is_some_and(|k| {
        manifest.containers.iter().any(|a| {
            observed
                .current(&a.name)
                .is_some_and(|app| app.joined_to.is_some() && app.joined_to == k.joined_to)
        })
    });
    let ready = cur.is_some_and(|k| {
        k.state.is_running()
            && probes.started_and_ready(
                &k.id,
                c.readiness_probe.is_some(),
                c.startup_probe.is_some(),
            )
    });
    let state = match cur.map(|k| (k, &k.state)) {
        Some((_, RunState::Running { started_at })) => ContainerState::Running {
            started_at: Timestamp(*started_at),
        },
        // Restarted whatever the pod's policy, unless the pod has finished and it was stopped.
        Some((k, RunState::Exited { .. })) => match mem.and_then(|m| m.exit.as_ref()) {
            Some(h) if h.id == k.id => {
                last_state = terminated(k);
                if h.restart_at > now {
                    waiting(
                        "CrashLoopBackOff",
                        format!(
                            "back-off {}s restarting failed sidecar {}",
                            h.restart_at.saturating_duration_since(now).as_secs().max(1),
                            c.name
                        ),
                    )
                } else {
                    waiting("ContainerCreating", String::new())
                }
            }
            _ => terminated(k).unwrap_or_else(|| waiting("Unknown", String::new())),
        },
        None | Some((_, RunState::Created)) => match mem {
            Some(m) if m.config_error.is_some() => waiting(
                "CreateContainerConfigError",
                m.config_error.clone().unwrap_or_default(),
            ),
            Some(m) if m.pull.is_some() => waiting(
                "ErrImagePull",
                m.pull
                    .as_ref()
                    .map(|p| p.message.clone())
                    .unwrap_or_default(),
            ),
            _ => waiting("PodInitializing", String::new()),
        },
    };
    let status = ContainerStatus {
        name: c.name.clone(),
        ready,
        state,
        last_state,
        restart_count: cur.map(|k| k.labels.restart_count).unwrap_or(0),
        image: c.image.clone(),
        container_id: cur.map(|k| k.id.clone()),
        probes: cur.map(|k| probes.get(&k.id).last).unwrap_or_default(),
    };
    (status, ready || past)
}

/// The status of a pod that will not run.
pub fn rejected_status(node: &str, pod: &str, message: &str) -> PodStatus {
    PodStatus {
        id: pod.to_string(),
        node: node.to_string(),
        phase: PodPhase::Rejected,
        source: Some("etcd-key".into()),
        manifest: None,
        message: message.to_string(),
        ready: false,
        init_containers: Vec::new(),
        containers: Vec::new(),
        started_at: None,
        revision_hash: None,
        updated_at: Timestamp::now(),
    }
}

/// Two statuses that differ only in `updatedAt` are the same.
fn same(a: &PodStatus, b: &PodStatus) -> bool {
    PodStatus {
        updated_at: b.updated_at,
        ..a.clone()
    } == *b
}

#[derive(Default)]
struct WriterState {
    /// Pod → status to write (`None`: delete), not yet written.
    pending: BTreeMap<String, Option<PodStatus>>,
    /// What etcd holds as far as this writer knows (what was last written successfully).
    written: HashMap<String, PodStatus>,
    /// What hostlet last asked for, written or not (for the HTTP API).
    latest: HashMap<String, PodStatus>,
}

/// The handle reconciles and probes use. Cheap to clone; never blocks on etcd.
#[derive(Clone)]
pub struct StatusWriter {
    node: String,
    layout: KeyLayout,
    state: Arc<Mutex<WriterState>>,
    wake: Arc<Notify>,
    events: Option<EventRecorder>,
}

impl StatusWriter {
    pub fn new(node: &str, layout: KeyLayout) -> Self {
        StatusWriter {
            node: node.to_string(),
            layout,
            state: Arc::default(),
            wake: Arc::new(Notify::new()),
            events: None,
        }
    }

    /// The same writer, recording events through `events` (without one, events are only logged).
    #[must_use]
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = Some(events);
        self
    }

    fn lock(&self) -> MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for `status` to be written; returns whether it differs from what was last asked for.
    pub fn set(&self, status: PodStatus) -> bool {
        let mut st = self.lock();
        let changed = st.latest.get(&status.id).is_none_or(|l| !same(l, &status));
        st.latest.insert(status.id.clone(), status.clone());
        let needed = st.written.get(&status.id).is_none_or(|w| !same(w, &status));
        if needed {
            st.pending.insert(status.id.clone(), Some(status));
        } else {
            st.pending.remove(&status.id);
        }
        drop(st);
        if needed {
            self.wake.notify_one();
        }
        changed
    }

    /// Asks for the pod's status key to be deleted.
    pub fn delete(&self, pod: &str) {
        let mut st = self.lock();
        st.latest.remove(pod);
        st.pending.insert(pod.to_string(), None);
        drop(st);
        self.wake.notify_one();
    }

    /// The status last asked for.
    pub fn get(&self, pod: &str) -> Option<PodStatus> {
        self.lock().latest.get(pod).cloned()
    }

    /// Records an event (`warning` for Warning, else Normal); repeats aggregate into one event.
    pub fn event(
        &self,
        pod: &str,
        container: Option<&str>,
        reason: &str,
        message: &str,
        warning: bool,
    ) {
        let kind = if warning {
            EventKind::Warning
        } else {
            EventKind::Normal
        };
        match &self.events {
            Some(rec) => {
                rec.record_now(Some(pod), container, kind, reason, message);
            }
            None if warning => tracing::warn!(pod, container, reason, message, "event"),
            None => tracing::info!(pod, container, reason, message, "event"),
        }
    }

    /// Whether everything asked for has been written.
    pub fn is_flushed(&self) -> bool {
        self.lock().pending.is_empty() && self.events.as_ref().is_none_or(|e| e.is_flushed())
    }

    /// Writes what is pending to etcd until `shutdown`, retrying with backoff while etcd is away.
    pub async fn run(self, etcd: ClusterClient, shutdown: CancellationToken) {
        let mut backoff = ExponentialBackoff::new(RETRY_INITIAL, RETRY_MAX);
        loop {
            let ok = self.flush(&etcd).await;
            if ok {
                backoff.reset();
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.wake.notified() => {}
                }
            } else {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }

    /// One pass over what is pending; false when etcd failed (the rest stays pending).
    async fn flush(&self, etcd: &ClusterClient) -> bool {
        loop {
            let next = {
                let mut st = self.lock();
                let first = st.pending.keys().next().cloned();
                first.and_then(|k| st.pending.remove(&k).map(|v| (k, v)))
            };
            let Some((pod, want)) = next else { break };
            let key = self.layout.pod_status(&self.node, &pod);
            let result = match &want {
                Some(status) => match serde_json::to_vec(status) {
                    Ok(bytes) => etcd.put(&key, bytes).await.map(|_| ()),
                    Err(e) => {
                        tracing::error!(pod, error = %e, "status does not serialise");
                        continue;
                    }
                },
                None => etcd.delete(&key).await.map(|_| ()),
            };
            let mut st = self.lock();
            match result {
                Ok(()) => match want {
                    Some(s) => {
                        st.written.insert(pod, s);
                    }
                    None => {
                        st.written.remove(&pod);
                    }
                },
                Err(e) => {
                    tracing::warn!(pod, error = %e, "writing pod status failed; will retry");
                    // A newer request for the same pod wins over the failed one.
                    st.pending.entry(pod).or_insert(want);
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::planner::{ContainerMemory, HandledExit};
    use crate::pods::runtime::ContainerLabels;
    use hostlet_api::naming::Role;
    use hostlet_api::parse_manifest;
    use std::time::UNIX_EPOCH;

    fn info(id: &str, name: &str, role: Role, rc: u32, state: RunState) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: id.into(),
            labels: ContainerLabels {
                node: "n".into(),
                pod: "web".into(),
                container: name.into(),
                role,
                spec_hash: "h".into(),
                restart_count: rc,
                sidecar: None,
            },
            image: "busybox".into(),
            created: UNIX_EPOCH,
            state,
            ip: None,
            joined_to: None,
        }
    }

    fn manifest(policy: &str) -> PodManifest {
        parse_manifest(
            format!(
                "version: v1beta1\nid: web\nrestartPolicy: {policy}\ncontainers:\n- name: a\n  image: busybox\n\
                 - name: b\n  image: busybox\n  readinessProbe: {{exec: {{command: [true]}}}}\n"
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn running() -> RunState {
        RunState::Running {
            started_at: UNIX_EPOCH + Duration::from_secs(5),
        }
    }

    fn exited(code: i64) -> RunState {
        RunState::Exited {
            exit_code: code,
            started_at: None,
            finished_at: Some(UNIX_EPOCH + Duration::from_secs(9)),
            oom_killed: false,
            error: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_template_hash_is_told_only_once_the_containers_run_that_template() {
        let mut m = manifest("Always");
        m.annotations
            .insert(hostlet_api::podset::HASH.into(), "abc".into());
        let probes = ProbeResults::default();
        probes.set_ready("b0", true);
        let mem = PodRuntimeState::default();
        let made = |hash_of: &PodManifest| {
            let mut pod = ObservedPod {
                containers: vec![
                    info("i", "net", Role::Infra, 0, running()),
                    info("a0", "a", Role::App, 0, running()),
                    info("b0", "b", Role::App, 0, running()),
                ],
            };
            for (k, c) in pod.containers.iter_mut().skip(1).zip(&hash_of.containers) {
                k.labels.spec_hash = hostlet_api::naming::container_spec_hash(hash_of, c);
            }
            pod
        };
        // The old template's containers, still running and ready, under the new manifest.
        let mut old = m.clone();
        old.containers[0].image = "busybox:old".into();
        let s = build_status("n", &m, &made(&old), &mem, &probes, Instant::now());
        assert!(s.ready);
        assert_eq!(s.revision_hash, None);
        let s = build_status("n", &m, &made(&m), &mem, &probes, Instant::now());
        assert_eq!(s.revision_hash.as_deref(), Some("abc"));
    }

    #[tokio::test(start_paused = true)]
    async fn phases_and_readiness() {
        let now = Instant::now();
        let probes = ProbeResults::default();
        let mem = PodRuntimeState::default();
        let empty = ObservedPod::default();
        let s = build_status("n", &manifest("Always"), &empty, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Pending);
        assert!(
            matches!(&s.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "ContainerCreating")
        );

        let up = ObservedPod {
            containers: vec![
                info("i", "net", Role::Infra, 0, running()),
                info("a1", "a", Role::App, 1, running()),
                info("b0", "b", Role::App, 0, running()),
            ],
        };
        let s = build_status("n", &manifest("Always"), &up, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Running);
        assert_eq!(s.containers[0].restart_count, 1);
        assert!(
            s.containers[0].ready,
            "no readiness probe: ready when running"
        );
        assert!(
            !s.containers[1].ready,
            "a readiness probe that has not passed yet"
        );
        assert!(!s.ready);
        probes.set_ready("b0", true);
        assert!(build_status("n", &manifest("Always"), &up, &mem, &probes, now).ready);

        let done = ObservedPod {
            containers: vec![
                info("a0", "a", Role::App, 0, exited(0)),
                info("b0", "b", Role::App, 0, exited(3)),
            ],
        };
        let s = build_status("n", &manifest("Never"), &done, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Failed);
        assert!(
            matches!(&s.containers[1].state, ContainerState::Terminated { exit_code: 3, reason, .. } if reason == "Error")
        );
        let ok = ObservedPod {
            containers: vec![
                info("a0", "a", Role::App, 0, exited(0)),
                info("b0", "b", Role::App, 0, exited(0)),
            ],
        };
        assert_eq!(
            build_status("n", &manifest("OnFailure"), &ok, &mem, &probes, now).phase,
            PodPhase::Succeeded
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_waiting_for_its_restart_shows_crash_loop_back_off() {
        let now = Instant::now();
        let mut mem = PodRuntimeState::default();
        mem.containers.insert(
            "a".into(),
            ContainerMemory {
                exit: Some(HandledExit {
                    id: "a2".into(),
                    restart_at: now + Duration::from_secs(20),
                }),
                ..Default::default()
            },
        );
        let observed = ObservedPod {
            containers: vec![
                info("i", "net", Role::Infra, 0, running()),
                info("a2", "a", Role::App, 2, exited(1)),
                info("b0", "b", Role::App, 0, running()),
            ],
        };
        let s = build_status(
            "n",
            &manifest("Always"),
            &observed,
            &mem,
            &ProbeResults::default(),
            now,
        );
        assert_eq!(s.phase, PodPhase::Running);
        match &s.containers[0].state {
            ContainerState::Waiting { reason, message } => {
                assert_eq!(reason, "CrashLoopBackOff");
                assert!(message.contains("20s"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            s.containers[0].last_state,
            Some(ContainerState::Terminated { exit_code: 1, .. })
        ));
        assert_eq!(s.containers[0].restart_count, 2);
    }

    #[test]
    fn unchanged_statuses_are_not_written_twice() {
        let w = StatusWriter::new("n", KeyLayout::default());
        let s = rejected_status("n", "web", "bad");
        assert!(w.set(s.clone()));
        // Not written yet: still pending, and an equal status does not count as a change.
        let mut later = s.clone();
        later.updated_at = Timestamp::from_unix(5);
        assert!(!w.set(later));
        assert!(!w.is_flushed());
        w.lock().pending.clear();
        w.lock().written.insert("web".into(), s.clone());
        assert!(!w.set(s));
        assert!(w.is_flushed(), "what etcd holds is not written again");
    }

    #[tokio::test(start_paused = true)]
    async fn init_containers_show_in_order_and_hold_the_pod_pending() {
        let now = Instant::now();
        let probes = ProbeResults::default();
        let mem = PodRuntimeState::default();
        let pod = |policy: &str| {
            parse_manifest(
                format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  restartPolicy: {policy}\n  \
                     initContainers: [{{name: i1, image: busybox}}, {{name: i2, image: busybox}}]\n  \
                     containers: [{{name: a, image: busybox}}]\n"
                )
                .as_bytes(),
            )
            .unwrap()
        };
        let first_done = ObservedPod {
            containers: vec![
                info("i", "net", Role::Infra, 0, running()),
                info("i1", "i1", Role::Init, 0, exited(0)),
                info("i2", "i2", Role::Init, 0, running()),
            ],
        };
        let s = build_status("n", &pod("Always"), &first_done, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Pending);
        let names: Vec<&str> = s.init_containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["i1", "i2"]);
        assert!(
            matches!(&s.init_containers[0].state, ContainerState::Terminated { exit_code: 0, reason, .. } if reason == "Completed")
        );
        assert!(s.init_containers[0].ready);
        assert!(matches!(
            s.init_containers[1].state,
            ContainerState::Running { .. }
        ));
        assert!(
            matches!(&s.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "PodInitializing")
        );

        let all_done = ObservedPod {
            containers: vec![
                info("i", "net", Role::Infra, 0, running()),
                info("i1", "i1", Role::Init, 0, exited(0)),
                info("i2", "i2", Role::Init, 0, exited(0)),
                info("a0", "a", Role::App, 0, running()),
            ],
        };
        let s = build_status("n", &pod("Always"), &all_done, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Running);
        assert!(s.ready);

        // Failed: under Never the pod fails and says why; under Always it is retried.
        let failed = ObservedPod {
            containers: vec![info("i1", "i1", Role::Init, 0, exited(2))],
        };
        let s = build_status("n", &pod("Never"), &failed, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Failed);
        assert!(
            s.message.contains("init container i1 exited with code 2"),
            "{s:?}"
        );
        let s = build_status("n", &pod("Always"), &failed, &mem, &probes, now);
        assert_eq!(s.phase, PodPhase::Pending);
        assert!(s.init_containers[0].last_state.is_some());
    }
}
