//! The observed state of this node's containers: one list at start, then Docker's event stream, with a slow
//! safety relist. Never one list per container, and nothing polled per pod.
//!
//! Ordering: the event stream is opened with `since` = the time just before the list, so nothing falls in
//! a gap; events older than that list are ignored (the list already holds their effect). The executor also
//! writes its own results through ([`ObservedCache::record_created`] and friends) so that the next reconcile
//! does not act on a cache that lags its own actions; those writes only move a container forward
//! (created → running → exited), so a late write never undoes an event. When Docker is unreachable the
//! cache keeps what it knew: running pods are left alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use hostlet_api::naming::Role;
use hostlet_runtime::ExponentialBackoff;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::PodMetrics;
use super::planner::ObservedPod;
use super::runtime::{ContainerInfo, ContainerRuntime, RunState, RuntimeEvent, RuntimeEventKind};

/// The safety relist period.
pub const RELIST_PERIOD: Duration = Duration::from_secs(60);
const RETRY_INITIAL: Duration = Duration::from_millis(500);
/// Short, so that the agent is back to normal within seconds of Docker answering again (a failed list of
/// an absent daemon costs one refused connect).
const RETRY_MAX: Duration = Duration::from_secs(4);
/// How long a removed container's id is remembered, so that its late events do not bring it back.
const TOMBSTONE_TTL: Duration = Duration::from_secs(300);

/// Called with a pod id whenever one of its containers changed.
pub type PodChanged = Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
struct Data {
    /// By container id.
    containers: HashMap<String, Entry>,
    /// Removed ids and when, until their destroy event (or the TTL).
    tombstones: HashMap<String, SystemTime>,
}

struct Entry {
    info: ContainerInfo,
    /// An OOM event came before the die event.
    oom: bool,
    /// When hostlet last learned about this container (to keep entries newer than a relist).
    updated: SystemTime,
}

fn rank(s: &RunState) -> u8 {
    match s {
        RunState::Created => 0,
        RunState::Running { .. } => 1,
        RunState::Exited { .. } => 2,
    }
}

/// The cache. Cheap to clone.
#[derive(Clone)]
pub struct ObservedCache {
    data: Arc<RwLock<Data>>,
    synced: watch::Sender<bool>,
    reachable: watch::Sender<bool>,
}

impl Default for ObservedCache {
    fn default() -> Self {
        ObservedCache {
            data: Arc::default(),
            synced: watch::channel(false).0,
            reachable: watch::channel(false).0,
        }
    }
}

impl ObservedCache {
    fn read(&self) -> RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Data> {
        self.data.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A pod's containers.
    pub fn pod(&self, pod: &str) -> ObservedPod {
        let mut containers: Vec<ContainerInfo> = self
            .read()
            .containers
            .values()
            .filter(|e| e.info.labels.pod == pod)
            .map(|e| e.info.clone())
            .collect();
        containers.sort_by(|a, b| a.id.cmp(&b.id));
        ObservedPod { containers }
    }

    /// Every pod id that has a container.
    pub fn pod_ids(&self) -> HashSet<String> {
        self.read()
            .containers
            .values()
            .map(|e| e.info.labels.pod.clone())
            .collect()
    }

    /// Every pod with a container, and when its first container was created (unix nanos): when the pod
    /// was admitted, as far as the host can tell.
    pub fn admission_times(&self) -> BTreeMap<String, u128> {
        let mut out: BTreeMap<String, u128> = BTreeMap::new();
        for e in self.read().containers.values() {
            let t = e
                .info
                .created
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            out.entry(e.info.labels.pod.clone())
                .and_modify(|v| *v = (*v).min(t))
                .or_insert(t);
        }
        out
    }

    pub fn container(&self, id: &str) -> Option<ContainerInfo> {
        self.read().containers.get(id).map(|e| e.info.clone())
    }

    /// Whether the first list is in.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether the last list or event stream succeeded.
    pub fn docker_reachable(&self) -> bool {
        *self.reachable.borrow()
    }

    /// A receiver of the reachability flag (it changes when a list or the event stream fails or works).
    pub fn reachability(&self) -> watch::Receiver<bool> {
        self.reachable.subscribe()
    }

    fn set_reachable(&self, reachable: bool) {
        self.reachable
            .send_if_modified(|r| std::mem::replace(r, reachable) != reachable);
    }

    /// (pods with a running infra container, running app containers).
    pub fn running_counts(&self) -> (usize, usize) {
        let d = self.read();
        let mut pods = HashSet::new();
        let mut apps = 0;
        for e in d.containers.values().filter(|e| e.info.state.is_running()) {
            match e.info.labels.role {
                Role::Infra => {
                    pods.insert(e.info.labels.pod.as_str());
                }
                Role::App | Role::Init => apps += 1,
            }
        }
        (pods.len(), apps)
    }

    /// The executor created a container.
    pub fn record_created(&self, info: ContainerInfo) {
        let mut d = self.write();
        if d.tombstones.contains_key(&info.id) {
            return;
        }
        let now = SystemTime::now();
        match d.containers.get_mut(&info.id) {
            // Its events came first: they know its state, not which infra container it joined.
            Some(e) => {
                if e.info.joined_to.is_none() {
                    e.info.joined_to = info.joined_to;
                }
            }
            None => {
                d.containers.insert(
                    info.id.clone(),
                    Entry {
                        info,
                        oom: false,
                        updated: now,
                    },
                );
            }
        }
    }

    /// The executor learned a container's state (after starting it, or from an inspect): applied only
    /// when it moves the container forward.
    pub fn record_state(&self, id: &str, state: RunState) {
        let mut d = self.write();
        if let Some(e) = d.containers.get_mut(id) {
            if rank(&state) > rank(&e.info.state) {
                e.info.state = state;
                e.updated = SystemTime::now();
            }
        }
    }

    /// The executor removed a container.
    pub fn record_removed(&self, id: &str) {
        let mut d = self.write();
        d.containers.remove(id);
        d.tombstones.insert(id.to_string(), SystemTime::now());
    }

    /// Applies one event; returns the pod it concerns when something changed.
    fn apply_event(&self, ev: &RuntimeEvent) -> Option<String> {
        let labels = ev.labels.clone()?;
        let mut d = self.write();
        if matches!(ev.kind, RuntimeEventKind::Destroy) {
            // Reported even when the executor already dropped it: the pod's last removal must wake its
            // reconcile (to clean up a deleted pod).
            d.tombstones.remove(&ev.id);
            d.containers.remove(&ev.id);
            return Some(labels.pod);
        }
        if d.tombstones.contains_key(&ev.id) {
            return None;
        }
        let pod = labels.pod.clone();
        let entry = d.containers.entry(ev.id.clone()).or_insert_with(|| Entry {
            info: ContainerInfo {
                id: ev.id.clone(),
                name: ev.name.clone().unwrap_or_default(),
                labels,
                image: ev.image.clone().unwrap_or_default(),
                created: ev.time,
                state: RunState::Created,
                ip: None,
                joined_to: None,
            },
            oom: false,
            updated: ev.time,
        });
        entry.updated = entry.updated.max(ev.time);
        match &ev.kind {
            RuntimeEventKind::Create | RuntimeEventKind::Other(_) | RuntimeEventKind::Destroy => {}
            RuntimeEventKind::Start => {
                entry.oom = false;
                entry.info.state = RunState::Running {
                    started_at: ev.time,
                };
            }
            RuntimeEventKind::Oom => {
                entry.oom = true;
                if let RunState::Exited { oom_killed, .. } = &mut entry.info.state {
                    *oom_killed = true;
                }
            }
            RuntimeEventKind::Die { exit_code } => {
                let started_at = match &entry.info.state {
                    RunState::Running { started_at } => Some(*started_at),
                    _ => None,
                };
                entry.info.state = RunState::Exited {
                    exit_code: exit_code.unwrap_or(-1),
                    started_at,
                    finished_at: Some(ev.time),
                    oom_killed: entry.oom,
                    error: None,
                };
            }
        }
        Some(pod)
    }

    /// Replaces the cache with a list taken at `listed_at`, keeping what the cache knows better (exact
    /// times, exit details) and entries learned after the list began. Returns the pods that changed and
    /// the exited containers it knows nothing about yet (to inspect).
    fn apply_list(
        &self,
        list: Vec<ContainerInfo>,
        listed_at: SystemTime,
    ) -> (HashSet<String>, Vec<String>) {
        let mut d = self.write();
        let mut changed = HashSet::new();
        let mut to_inspect = Vec::new();
        let listed: HashSet<String> = list.iter().map(|c| c.id.clone()).collect();
        let gone: Vec<String> = d
            .containers
            .iter()
            .filter(|(id, e)| !listed.contains(*id) && e.updated < listed_at)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(e) = d.containers.remove(&id) {
                changed.insert(e.info.labels.pod);
            }
        }
        let now = SystemTime::now();
        d.tombstones
            .retain(|_, at| now.duration_since(*at).unwrap_or_default() < TOMBSTONE_TTL);
        for mut c in list {
            if d.tombstones.contains_key(&c.id) {
                continue;
            }
            match d.containers.get_mut(&c.id) {
                Some(e) => {
                    let same_phase = rank(&e.info.state) == rank(&c.state);
                    if e.updated >= listed_at || same_phase {
                        // The cache's own knowledge is at least as good (exact start/finish times).
                        if e.info.ip.is_none() && c.ip.is_some() {
                            e.info.ip = c.ip;
                        }
                        if e.info.joined_to.is_none() {
                            e.info.joined_to = c.joined_to.take();
                        }
                        continue;
                    }
                    if c.state.is_exited() {
                        to_inspect.push(c.id.clone());
                    }
                    changed.insert(c.labels.pod.clone());
                    e.info = c;
                    e.updated = listed_at;
                }
                None => {
                    if c.state.is_exited() {
                        to_inspect.push(c.id.clone());
                    }
                    changed.insert(c.labels.pod.clone());
                    d.containers.insert(
                        c.id.clone(),
                        Entry {
                            info: c,
                            oom: false,
                            updated: listed_at,
                        },
                    );
                }
            }
        }
        (changed, to_inspect)
    }

    /// Replaces one container's details from an inspect (exited containers found by a list).
    fn apply_inspect(&self, info: ContainerInfo) -> Option<String> {
        let mut d = self.write();
        let e = d.containers.get_mut(&info.id)?;
        if rank(&info.state) >= rank(&e.info.state) {
            let pod = info.labels.pod.clone();
            e.info = ContainerInfo {
                ip: info.ip.or(e.info.ip),
                ..info
            };
            return Some(pod);
        }
        None
    }

    fn set_ip(&self, id: &str, ip: Option<std::net::IpAddr>) {
        if let Some(e) = self.write().containers.get_mut(id) {
            e.info.ip = ip.or(e.info.ip);
        }
    }

    fn set_synced(&self) {
        self.synced.send_replace(true);
    }

    /// Every container, grouped by pod (for status pages and tests).
    pub fn snapshot(&self) -> BTreeMap<String, Vec<ContainerInfo>> {
        let mut out: BTreeMap<String, Vec<ContainerInfo>> = BTreeMap::new();
        for e in self.read().containers.values() {
            out.entry(e.info.labels.pod.clone())
                .or_default()
                .push(e.info.clone());
        }
        out
    }
}

/// Keeps `cache` in step with the runtime until `shutdown`: list, then events, relisting every
/// `relist_period` and after every lost connection, with backoff while the engine is unreachable.
pub async fn run_observer<R: ContainerRuntime>(
    rt: Arc<R>,
    cache: ObservedCache,
    changed: PodChanged,
    metrics: Option<PodMetrics>,
    relist_period: Duration,
    shutdown: CancellationToken,
) {
    let mut backoff = ExponentialBackoff::new(RETRY_INITIAL, RETRY_MAX);
    loop {
        let listed_at = SystemTime::now();
        let mut events = rt.events(listed_at);
        match relist(rt.as_ref(), &cache, &changed, metrics.as_ref(), listed_at).await {
            Ok(()) => {
                backoff.reset();
                cache.set_reachable(true);
            }
            Err(e) => {
                cache.set_reachable(false);
                let retry = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?retry, "listing containers failed; pods are left as they are");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                continue;
            }
        }
        let mut last_list = listed_at;
        let mut relist_tick =
            tokio::time::interval_at(tokio::time::Instant::now() + relist_period, relist_period);
        relist_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = relist_tick.tick() => {
                    let at = SystemTime::now();
                    match relist(rt.as_ref(), &cache, &changed, metrics.as_ref(), at).await {
                        Ok(()) => last_list = at,
                        Err(e) => {
                            cache.set_reachable(false);
                            tracing::warn!(error = %e, "safety relist failed");
                            break;
                        }
                    }
                }
                ev = events.next() => match ev {
                    Some(Ok(ev)) => {
                        if let Some(m) = &metrics {
                            m.docker_events.with_label_values(&[ev.kind.label()]).inc();
                        }
                        if ev.time < last_list {
                            continue;
                        }
                        let infra_started = matches!(ev.kind, RuntimeEventKind::Start)
                            && ev.labels.as_ref().is_some_and(|l| l.role == Role::Infra);
                        if infra_started {
                            // The pod's address, for the probes: one inspect per infra start.
                            if let Ok(info) = rt.inspect(&ev.id).await {
                                cache.set_ip(&ev.id, info.ip);
                            }
                        }
                        if let Some(pod) = cache.apply_event(&ev) {
                            changed(&pod);
                        }
                    }
                    Some(Err(e)) => {
                        cache.set_reachable(false);
                        tracing::warn!(error = %e, "Docker event stream failed; relisting");
                        break;
                    }
                    None => {
                        tracing::warn!("Docker event stream ended; relisting");
                        break;
                    }
                },
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

async fn relist<R: ContainerRuntime>(
    rt: &R,
    cache: &ObservedCache,
    changed: &PodChanged,
    metrics: Option<&PodMetrics>,
    listed_at: SystemTime,
) -> Result<(), super::runtime::RuntimeError> {
    let start = tokio::time::Instant::now();
    let list = rt.list().await?;
    let (mut pods, to_inspect) = cache.apply_list(list, listed_at);
    for id in to_inspect {
        match rt.inspect(&id).await {
            Ok(info) => {
                if let Some(p) = cache.apply_inspect(info) {
                    pods.insert(p);
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(m) = metrics {
        m.relist_duration.observe(start.elapsed().as_secs_f64());
    }
    cache.set_synced();
    for p in pods {
        changed(&p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::runtime::ContainerLabels;

    fn info(id: &str, state: RunState) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: id.into(),
            labels: ContainerLabels {
                node: "n".into(),
                pod: "p".into(),
                container: "a".into(),
                role: Role::App,
                spec_hash: "h".into(),
                restart_count: 0,
                sidecar: None,
            },
            image: "busybox".into(),
            created: UNIX_EPOCH,
            state,
            ip: None,
            joined_to: None,
        }
    }

    fn event(id: &str, kind: RuntimeEventKind, secs: u64) -> RuntimeEvent {
        RuntimeEvent {
            kind,
            id: id.into(),
            labels: Some(info(id, RunState::Created).labels),
            image: None,
            name: None,
            time: UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_late_write_from_the_executor_never_undoes_an_event() {
        let c = ObservedCache::default();
        c.record_created(info("x", RunState::Created));
        c.apply_event(&event("x", RuntimeEventKind::Start, 10));
        c.apply_event(&event(
            "x",
            RuntimeEventKind::Die { exit_code: Some(1) },
            11,
        ));
        c.record_state(
            "x",
            RunState::Running {
                started_at: UNIX_EPOCH,
            },
        );
        assert!(c.container("x").unwrap().state.is_exited());
    }

    #[test]
    fn the_executor_says_which_infra_a_container_joined_though_its_events_came_first() {
        let c = ObservedCache::default();
        c.apply_event(&event("x", RuntimeEventKind::Start, 10));
        let mut made = info("x", RunState::Created);
        made.joined_to = Some("infra".into());
        c.record_created(made);
        let got = c.container("x").unwrap();
        assert_eq!(got.joined_to.as_deref(), Some("infra"));
        assert!(got.state.is_running(), "{got:?}");
    }

    #[test]
    fn oom_before_die_marks_the_exit() {
        let c = ObservedCache::default();
        c.apply_event(&event("x", RuntimeEventKind::Start, 10));
        c.apply_event(&event("x", RuntimeEventKind::Oom, 11));
        c.apply_event(&event(
            "x",
            RuntimeEventKind::Die {
                exit_code: Some(137),
            },
            11,
        ));
        match c.container("x").unwrap().state {
            RunState::Exited {
                oom_killed,
                exit_code,
                finished_at,
                started_at,
                ..
            } => {
                assert!(oom_killed);
                assert_eq!(exit_code, 137);
                assert_eq!(started_at, Some(UNIX_EPOCH + Duration::from_secs(10)));
                assert_eq!(finished_at, Some(UNIX_EPOCH + Duration::from_secs(11)));
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn removed_containers_do_not_come_back_from_late_events() {
        let c = ObservedCache::default();
        c.apply_event(&event("x", RuntimeEventKind::Start, 10));
        c.record_removed("x");
        assert_eq!(
            c.apply_event(&event(
                "x",
                RuntimeEventKind::Die { exit_code: Some(0) },
                11
            )),
            None
        );
        assert!(c.container("x").is_none());
        c.apply_event(&event("x", RuntimeEventKind::Destroy, 12));
        assert!(c.pod("p").is_empty());
    }

    #[test]
    fn a_relist_drops_vanished_containers_but_keeps_newer_knowledge() {
        let c = ObservedCache::default();
        c.apply_event(&event("old", RuntimeEventKind::Start, 10));
        c.apply_event(&event("kept", RuntimeEventKind::Start, 10));
        c.apply_event(&event("new", RuntimeEventKind::Start, 30));
        let listed_at = UNIX_EPOCH + Duration::from_secs(20);
        let (changed, inspect) = c.apply_list(
            vec![
                info(
                    "kept",
                    RunState::Running {
                        started_at: UNIX_EPOCH,
                    },
                ),
                info(
                    "found",
                    RunState::Exited {
                        exit_code: 1,
                        started_at: None,
                        finished_at: None,
                        oom_killed: false,
                        error: None,
                    },
                ),
            ],
            listed_at,
        );
        assert!(c.container("old").is_none(), "gone from the list");
        assert!(c.container("new").is_some(), "learned after the list began");
        assert_eq!(
            c.container("kept").unwrap().state,
            RunState::Running {
                started_at: UNIX_EPOCH + Duration::from_secs(10)
            },
            "the event's exact start time is kept"
        );
        assert_eq!(inspect, ["found"]);
        assert!(changed.contains("p"));
    }
}
