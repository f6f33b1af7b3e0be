//! An in-memory container engine for the pod controller's tests: containers move through the states a
//! real engine gives them, every change is an event on the stream (replayed from `since`, as Docker does),
//! and a test can make a process exit, hold a start, or make the engine unreachable. The Docker
//! implementation is proven against the real engine in `tests/pods_*.rs`; this one lets the controller's
//! sequencing be tested without it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures::channel::mpsc;
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::Notify;

use super::runtime::{
    ContainerInfo, ContainerLabels, ContainerRuntime, ContainerSpec, ContainerStats, RunState,
    RuntimeError, RuntimeEvent, RuntimeEventKind,
};
use hostlet_api::naming;

/// One operation the controller asked of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create { name: String },
    Start { id: String },
    Stop { id: String, grace: Duration },
    Signal { id: String, signal: String },
    Remove { id: String },
    Pull { image: String },
}

#[derive(Default)]
struct State {
    containers: BTreeMap<String, (ContainerInfo, ContainerSpec)>,
    images: BTreeSet<String>,
    next_id: u64,
    reachable: bool,
    ops: Vec<(std::time::Instant, Op)>,
    /// Every event so far, for the replay of a new stream.
    log: Vec<RuntimeEvent>,
    subscribers: Vec<mpsc::UnboundedSender<Result<RuntimeEvent, RuntimeError>>>,
    /// Containers (by their `io.hostlet.container` name) whose start waits for [`FakeRuntime::release_starts`].
    held: BTreeSet<String>,
    /// Containers (by name) whose process ignores SIGTERM, as a shell script without a trap does.
    ignore_term: BTreeSet<String>,
    /// Containers (by name) whose next start starts them and answers an error, as an engine that times
    /// out on its own under load.
    start_errors: BTreeSet<String>,
    errors_released: bool,
    /// Lists wait for [`FakeRuntime::release_lists`].
    lists_held: bool,
    /// How many lists have waited so far.
    lists_waited: usize,
}

/// The fake engine, scoped to one node like the Docker runtime. Cheap to clone; clones share the engine.
#[derive(Clone)]
pub struct FakeRuntime {
    node: String,
    state: Arc<Mutex<State>>,
    released: Arc<Notify>,
}

impl FakeRuntime {
    /// An engine that answers, with these images present.
    pub fn new(node: &str, images: &[&str]) -> FakeRuntime {
        FakeRuntime {
            node: node.to_string(),
            state: Arc::new(Mutex::new(State {
                images: images.iter().map(|i| i.to_string()).collect(),
                reachable: true,
                ..State::default()
            })),
            released: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The operations asked so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().ops.iter().map(|(_, o)| o.clone()).collect()
    }

    /// When `op` was asked (its first time).
    pub fn asked_at(&self, op: &Op) -> Option<std::time::Instant> {
        self.lock()
            .ops
            .iter()
            .find(|(_, o)| o == op)
            .map(|(t, _)| *t)
    }

    /// Containers named `name` (any pod) go on running after SIGTERM; SIGKILL ends them.
    pub fn ignore_sigterm(&self, name: &str) {
        self.lock().ignore_term.insert(name.to_string());
    }

    fn record(s: &mut State, op: Op) {
        s.ops.push((std::time::Instant::now(), op));
    }

    /// Every container of `pod`, oldest first.
    pub fn pod(&self, pod: &str) -> Vec<ContainerInfo> {
        let mut v: Vec<ContainerInfo> = self
            .lock()
            .containers
            .values()
            .filter(|(c, _)| c.labels.pod == pod)
            .map(|(c, _)| c.clone())
            .collect();
        v.sort_by_key(|c| (c.created, c.id.clone()));
        v
    }

    /// The spec `id` was created with.
    pub fn spec(&self, id: &str) -> Option<ContainerSpec> {
        self.lock().containers.get(id).map(|(_, s)| s.clone())
    }

    /// Makes the engine unreachable (every call fails, the event streams end) or reachable again.
    pub fn set_reachable(&self, up: bool) {
        let mut s = self.lock();
        s.reachable = up;
        if !up {
            s.subscribers.clear();
        }
    }

    /// The process of a running container exits with `code`, as if on its own.
    pub fn exit(&self, id: &str, code: i64) {
        let mut s = self.lock();
        Self::die(&mut s, id, code);
    }

    /// The next start of container `name` (any pod) waits until [`FakeRuntime::release_starts`].
    pub fn hold_starts(&self, name: &str) {
        self.lock().held.insert(name.to_string());
    }

    /// The next start of container `name` (any pod) starts it and answers an error, once
    /// [`FakeRuntime::release_errors`] lets it.
    pub fn start_answers_error(&self, name: &str) {
        self.lock().start_errors.insert(name.to_string());
    }

    pub fn release_errors(&self) {
        self.lock().errors_released = true;
        self.released.notify_waiters();
    }

    /// Lists wait until [`FakeRuntime::release_lists`], as an engine slow to answer.
    pub fn hold_lists(&self) {
        self.lock().lists_held = true;
    }

    /// How many lists have waited for [`FakeRuntime::release_lists`] so far.
    pub fn lists_waited(&self) -> usize {
        self.lock().lists_waited
    }

    /// Returns once `ready` holds of the state, looked at again at every release.
    async fn wait_until(&self, mut ready: impl FnMut(&mut State) -> bool) {
        loop {
            let released = self.released.notified();
            if ready(&mut self.lock()) {
                return;
            }
            released.await;
        }
    }

    pub fn release_lists(&self) {
        self.lock().lists_held = false;
        self.released.notify_waiters();
    }

    pub fn release_starts(&self) {
        self.lock().held.clear();
        self.released.notify_waiters();
    }

    fn emit(s: &mut State, id: &str, kind: RuntimeEventKind) {
        let Some((info, _)) = s.containers.get(id) else {
            return;
        };
        let ev = RuntimeEvent {
            kind,
            id: id.to_string(),
            labels: Some(info.labels.clone()),
            image: Some(info.image.clone()),
            name: Some(info.name.clone()),
            time: SystemTime::now(),
        };
        s.log.push(ev.clone());
        s.subscribers
            .retain(|tx| tx.unbounded_send(Ok(ev.clone())).is_ok());
    }

    fn die(s: &mut State, id: &str, code: i64) {
        let Some((info, _)) = s.containers.get_mut(id) else {
            return;
        };
        let RunState::Running { started_at } = info.state else {
            return;
        };
        info.state = RunState::Exited {
            exit_code: code,
            started_at: Some(started_at),
            finished_at: Some(SystemTime::now()),
            oom_killed: false,
            error: None,
        };
        Self::emit(
            s,
            id,
            RuntimeEventKind::Die {
                exit_code: Some(code),
            },
        );
    }

    fn answering(&self) -> Result<MutexGuard<'_, State>, RuntimeError> {
        let s = self.lock();
        if s.reachable {
            Ok(s)
        } else {
            Err(RuntimeError::Unreachable("the fake engine is down".into()))
        }
    }

    fn existing<'a>(
        s: &'a mut MutexGuard<'_, State>,
        id: &str,
    ) -> Result<&'a mut ContainerInfo, RuntimeError> {
        s.containers
            .get_mut(id)
            .map(|(c, _)| c)
            .ok_or_else(|| RuntimeError::NotFound(format!("no such container: {id}")))
    }
}

impl ContainerRuntime for FakeRuntime {
    fn node(&self) -> &str {
        &self.node
    }

    async fn ping(&self) -> Result<(), RuntimeError> {
        self.answering().map(|_| ())
    }

    async fn list(&self) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let mut counted = false;
        self.wait_until(|s| {
            if s.lists_held && !counted {
                s.lists_waited += 1;
                counted = true;
            }
            !s.lists_held
        })
        .await;
        let s = self.answering()?;
        Ok(s.containers
            .values()
            .map(|(c, _)| c.clone())
            .filter(|c| c.labels.node == self.node)
            .collect())
    }

    async fn inspect(&self, id: &str) -> Result<ContainerInfo, RuntimeError> {
        let mut s = self.answering()?;
        Self::existing(&mut s, id).map(|c| c.clone())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let mut s = self.answering()?;
        Self::record(
            &mut s,
            Op::Create {
                name: spec.name.clone(),
            },
        );
        let labels = spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let labels = ContainerLabels::from_map(&labels)
            .filter(|l| l.node == self.node)
            .ok_or_else(|| {
                RuntimeError::Other(format!("refusing {} without this node's labels", spec.name))
            })?;
        // As Docker: a name is one container's.
        if s.containers.values().any(|(c, _)| c.name == spec.name) {
            return Err(RuntimeError::Conflict(format!(
                "the name {} is already in use",
                spec.name
            )));
        }
        if !s.images.contains(&spec.image) {
            return Err(RuntimeError::NotFound(format!(
                "no such image: {}",
                spec.image
            )));
        }
        s.next_id += 1;
        let id = format!("{:064x}", s.next_id);
        let info = ContainerInfo::created(&id, spec, labels);
        s.containers.insert(id.clone(), (info, spec.clone()));
        Self::emit(&mut s, &id, RuntimeEventKind::Create);
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        let name = {
            let mut s = self.answering()?;
            Self::existing(&mut s, id)?.labels.container.clone()
        };
        self.wait_until(|s| !s.held.contains(&name)).await;
        {
            let mut s = self.answering()?;
            Self::record(&mut s, Op::Start { id: id.to_string() });
            // An app joins its infra container's network namespace, which must be running.
            if let Some(infra) = Self::existing(&mut s, id)?.joined_to.clone() {
                let up = s
                    .containers
                    .get(&infra)
                    .is_some_and(|(c, _)| c.state.is_running());
                if !up {
                    return Err(RuntimeError::Conflict(format!(
                        "cannot join the network of {infra}: not running"
                    )));
                }
            }
            let c = Self::existing(&mut s, id)?;
            match c.state {
                RunState::Created => {
                    c.state = RunState::Running {
                        started_at: SystemTime::now(),
                    };
                    if c.labels.role == naming::Role::Infra {
                        c.ip = Some(std::net::IpAddr::from([10, 88, 0, 2]));
                    }
                    Self::emit(&mut s, id, RuntimeEventKind::Start);
                    if !s.start_errors.remove(&name) {
                        return Ok(());
                    }
                }
                RunState::Running { .. } => return Ok(()),
                RunState::Exited { .. } => {
                    return Err(RuntimeError::Conflict(format!(
                        "{id} has exited; hostlet never starts a container twice"
                    )))
                }
            }
        }
        // The error comes late, once the test lets it: after the container's start event.
        self.wait_until(|s| s.errors_released).await;
        Err(RuntimeError::Api {
            status: 500,
            message: "context deadline exceeded".into(),
        })
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let mut s = self.answering()?;
        Self::record(
            &mut s,
            Op::Stop {
                id: id.to_string(),
                grace,
            },
        );
        let name = Self::existing(&mut s, id)?.labels.container.clone();
        // SIGTERM, and SIGKILL once the grace is over for a process that ignores it.
        let code = if s.ignore_term.contains(&name) {
            137
        } else {
            143
        };
        Self::die(&mut s, id, code);
        Ok(())
    }

    async fn signal(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        let mut s = self.answering()?;
        Self::record(
            &mut s,
            Op::Signal {
                id: id.to_string(),
                signal: signal.to_string(),
            },
        );
        let c = Self::existing(&mut s, id)?;
        if !c.state.is_running() {
            return Err(RuntimeError::Conflict(format!("{id} is not running")));
        }
        let name = c.labels.container.clone();
        match signal {
            "SIGKILL" => Self::die(&mut s, id, 137),
            _ if s.ignore_term.contains(&name) => {}
            _ => Self::die(&mut s, id, 143),
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let mut s = self.answering()?;
        Self::record(&mut s, Op::Remove { id: id.to_string() });
        Self::existing(&mut s, id)?;
        Self::die(&mut s, id, 137);
        Self::emit(&mut s, id, RuntimeEventKind::Destroy);
        s.containers.remove(id);
        Ok(())
    }

    fn events(&self, since: SystemTime) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        let mut s = self.lock();
        if !s.reachable {
            let down = RuntimeError::Unreachable("the fake engine is down".into());
            return futures::stream::iter([Err(down)]).boxed();
        }
        let (tx, rx) = mpsc::unbounded();
        for ev in s.log.iter().filter(|e| e.time >= since) {
            let _ = tx.unbounded_send(Ok(ev.clone()));
        }
        s.subscribers.push(tx);
        rx.boxed()
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        let mut s = self.answering()?;
        Self::record(
            &mut s,
            Op::Pull {
                image: image.to_string(),
            },
        );
        // No registry: an image is there or it is not.
        if s.images.contains(image) {
            Ok(())
        } else {
            Err(RuntimeError::Api {
                status: 404,
                message: format!("pull access denied for {image}"),
            })
        }
    }

    async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
        Ok(self.answering()?.images.contains(image))
    }

    async fn cgroup_driver(&self) -> Result<(String, String), RuntimeError> {
        drop(self.answering()?);
        Ok(("cgroupfs".into(), "2".into()))
    }

    async fn runtimes(&self) -> Result<Vec<String>, RuntimeError> {
        drop(self.answering()?);
        Ok(vec!["runc".into()])
    }

    async fn image_user(&self, _image: &str) -> Result<String, RuntimeError> {
        drop(self.answering()?);
        Ok(String::new())
    }

    fn exec(
        &self,
        id: &str,
        _command: &[String],
        _timeout: Duration,
    ) -> impl Future<Output = Result<i64, RuntimeError>> + Send {
        let running = self
            .answering()
            .and_then(|mut s| Self::existing(&mut s, id).map(|c| c.state.is_running()));
        async move {
            match running {
                Ok(true) => Ok(0),
                Ok(false) => Err(RuntimeError::Conflict("not running".into())),
                Err(e) => Err(e),
            }
        }
    }

    async fn stats(&self, id: &str) -> Result<ContainerStats, RuntimeError> {
        let mut s = self.answering()?;
        Self::existing(&mut s, id)?;
        Ok(ContainerStats {
            cpu_percent: 0.0,
            cpu_total_nanos: 0,
            memory_usage_bytes: 0,
            memory_limit_bytes: None,
        })
    }
}
