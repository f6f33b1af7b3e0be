//! The agent's tasks: every task the boot starts is spawned here (or, started by a cache, handed here),
//! by name and [`Stage`]. The stop drains them stage by stage: the controllers first, then the writers
//! they may need (renewals, the revocation list, the serials in etcd), then the caches and watch hubs
//! everything reads, then the node's lease (before the member it is kept in stops). A task still running at the deadline is named, not aborted: it is one the runtime's
//! cut-off at exit would end.

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// When a task is told to stop, in drain order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The controllers and what watches for the agent's own end (a revocation, a rejoin, a member
    /// request). Their token is a child of the process's stop: they begin to stop with it.
    Controllers,
    /// What writes files or etcd on its own: certificate renewals, the revocation list, the node's serials,
    /// the arrival events.
    Writers,
    /// The informers, the caches' followers, the watch hubs, the version metric.
    Caches,
    /// The node's record and heartbeat: its lease is revoked once everything else is done with etcd.
    Lease,
}

impl Stage {
    /// Every stage, in drain order.
    pub const ALL: [Stage; 4] = [
        Stage::Controllers,
        Stage::Writers,
        Stage::Caches,
        Stage::Lease,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// How long the stage still gets after it is told to stop, when the stages before it used up the
    /// drain's time: a writer held up by a slow controller gets to finish its file, and the lease gets
    /// its revoke (one etcd request, with retries).
    fn floor(self) -> Duration {
        match self {
            Stage::Lease => LEASE_FLOOR,
            _ => STAGE_FLOOR,
        }
    }
}

const STAGE_FLOOR: Duration = Duration::from_millis(500);
const LEASE_FLOOR: Duration = Duration::from_secs(3);

struct StageTasks {
    token: CancellationToken,
    tasks: Vec<(String, JoinHandle<()>)>,
}

/// The tasks of one agent.
pub struct TaskSet {
    stages: [StageTasks; 4],
}

/// What a drain found: the tasks that finished, and those still running at the deadline.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    pub finished: Vec<String>,
    pub unfinished: Vec<String>,
}

impl TaskSet {
    /// The controllers' stage stops with `stop` (or its drain); the others only with their drain.
    pub fn new(stop: &CancellationToken) -> TaskSet {
        let stage = |token| StageTasks {
            token,
            tasks: Vec::new(),
        };
        TaskSet {
            stages: [
                stage(stop.child_token()),
                stage(CancellationToken::new()),
                stage(CancellationToken::new()),
                stage(CancellationToken::new()),
            ],
        }
    }

    /// What the tasks of `stage` stop with.
    pub fn token(&self, stage: Stage) -> CancellationToken {
        self.stages[stage.index()].token.clone()
    }

    /// Runs `task` until it ends; the drain of `stage` waits for it.
    pub fn spawn<F>(&mut self, stage: Stage, name: impl Into<String>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(task);
        self.adopt(stage, name, handle);
    }

    /// [`TaskSet::spawn`] for a task whose result its owner reads once it has ended.
    pub fn spawn_with_result<F, T>(
        &mut self,
        stage: Stage,
        name: impl Into<String>,
        task: F,
    ) -> oneshot::Receiver<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.spawn(stage, name, async move {
            let _ = tx.send(task.await);
        });
        rx
    }

    /// A task started elsewhere (an informer, a watch hub), waited for with `stage`.
    pub fn adopt(&mut self, stage: Stage, name: impl Into<String>, handle: JoinHandle<()>) {
        self.stages[stage.index()].tasks.push((name.into(), handle));
    }

    /// Every task's name, by stage, in the order started.
    pub fn names(&self) -> Vec<(Stage, String)> {
        Stage::ALL
            .iter()
            .flat_map(|s| {
                self.stages[s.index()]
                    .tasks
                    .iter()
                    .map(move |(n, _)| (*s, n.clone()))
            })
            .collect()
    }

    /// Tells each stage in turn to stop and waits for its tasks, all within `within` (each stage gets at
    /// least its floor after its token fires). Tasks that have not ended by then are named in a
    /// warning and left to the runtime. Draining again waits for nothing.
    pub async fn drain(&mut self, within: Duration) -> Drained {
        let deadline = Instant::now() + within;
        let mut out = Drained::default();
        for stage in Stage::ALL {
            let s = &mut self.stages[stage.index()];
            s.token.cancel();
            let until = deadline.max(Instant::now() + stage.floor());
            for (name, task) in std::mem::take(&mut s.tasks) {
                match tokio::time::timeout_at(until, task).await {
                    Ok(Ok(())) => out.finished.push(name),
                    Ok(Err(e)) => {
                        tracing::warn!(task = %name, error = %e, "agent task ended badly");
                        out.finished.push(name);
                    }
                    Err(_) => out.unfinished.push(name),
                }
            }
        }
        if !out.unfinished.is_empty() {
            tracing::warn!(
                tasks = ?out.unfinished,
                "agent tasks still running after {within:?}: the runtime's cut-off at exit ends them"
            );
        }
        out
    }
}

#[cfg(test)]
#[path = "tasks_tests.rs"]
mod tests;
