//! A cluster in memory for the controllers' unit tests: several agents (one [`FakeCluster`] each, by local
//! member id) share one [`FakeState`]. Time is tokio's, so tests run on paused time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{LearnerProgress, Timestamp};
use hostlet_runtime::Member;
use tokio::time::Instant;

use super::cluster::{Cluster, ClusterError, ClusterView, PromoteOutcome};
use super::etcd_metrics::SentToPeer;
use crate::events::EventKind;

/// The whole fake cluster.
#[derive(Debug, Default)]
pub struct FakeState {
    pub members: Vec<Member>,
    pub leader: u64,
    /// Learners' applied index; absent: the learner does not answer.
    pub applied: HashMap<u64, u64>,
    /// What the leader's metrics say it sent each member.
    pub sent: HashMap<u64, SentToPeer>,
    /// Learners etcd would promote now.
    pub in_sync: HashSet<u64>,
    pub progress: LearnerProgress,
    pub progress_revision: i64,
    pub progress_writes: usize,
    pub promote_attempts: HashMap<u64, usize>,
    pub removed: Vec<u64>,
    pub leader_moves: Vec<u64>,
    /// `(agent, reason, message)`.
    pub events: Vec<(u64, String, String)>,
    /// Views fail (the local member is down) for these agents.
    pub unreachable: HashSet<u64>,
    /// What the shared member cache shows when it is behind (`view`); `fresh_view` reads `members`.
    pub cached_members: Option<Vec<Member>>,
}

/// The shared state and the fake clock's origin.
#[derive(Debug, Clone)]
pub struct FakeWorld {
    pub state: Arc<Mutex<FakeState>>,
    origin: (Instant, SystemTime),
}

impl FakeWorld {
    pub fn new(members: Vec<Member>, leader: u64) -> Self {
        FakeWorld {
            state: Arc::new(Mutex::new(FakeState {
                members,
                leader,
                ..Default::default()
            })),
            origin: (Instant::now(), Timestamp::from_unix(1_800_000_000).0),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// The agent on member `local`.
    pub fn agent(&self, local: u64) -> Arc<FakeCluster> {
        Arc::new(FakeCluster {
            world: self.clone(),
            local,
            node: format!("node{local}"),
        })
    }

    pub fn now(&self) -> SystemTime {
        self.origin.1 + self.origin.0.elapsed()
    }

    pub fn reasons(&self) -> Vec<String> {
        self.lock().events.iter().map(|e| e.1.clone()).collect()
    }
}

pub fn voter(id: u64) -> Member {
    Member {
        id,
        name: format!("n{id}"),
        peer_urls: vec![format!("http://127.0.0.{id}:2380")],
        client_urls: vec![format!("http://127.0.0.{id}:2379")],
        is_learner: false,
    }
}

pub fn learner(id: u64, started: bool) -> Member {
    Member {
        is_learner: true,
        name: if started {
            format!("n{id}")
        } else {
            String::new()
        },
        client_urls: if started {
            vec![format!("http://127.0.0.{id}:2379")]
        } else {
            vec![]
        },
        ..voter(id)
    }
}

/// One agent's view of the fake cluster.
#[derive(Debug)]
pub struct FakeCluster {
    world: FakeWorld,
    local: u64,
    node: String,
}

impl FakeCluster {
    /// The view from the shared cache (which may be behind: `cached_members`), or a fresh look.
    fn look(&self, fresh: bool) -> Result<ClusterView, ClusterError> {
        let s = self.world.lock();
        if s.unreachable.contains(&self.local) {
            return Err(ClusterError::ProgressConflict);
        }
        let members = match (&s.cached_members, fresh) {
            (Some(cached), false) => cached.clone(),
            _ => s.members.clone(),
        };
        Ok(ClusterView {
            local_id: self.local,
            leader_id: s.leader,
            members,
        })
    }
}

impl Cluster for FakeCluster {
    fn node(&self) -> &str {
        &self.node
    }

    async fn members(&self) -> Result<Vec<Member>, ClusterError> {
        Ok(self.world.lock().members.clone())
    }

    async fn view(&self) -> Result<ClusterView, ClusterError> {
        self.look(false)
    }

    async fn fresh_view(&self) -> Result<ClusterView, ClusterError> {
        self.look(true)
    }

    /// The shared cache's fast looks, every 250 ms (the fake world changes without telling).
    fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            Some(((), ()))
        })
    }

    async fn learner_applied_index(&self, member: &Member) -> Option<u64> {
        self.world.lock().applied.get(&member.id).copied()
    }

    async fn sent_to(&self, id: u64) -> Option<SentToPeer> {
        Some(self.world.lock().sent.get(&id).copied().unwrap_or_default())
    }

    async fn promote(&self, id: u64) -> Result<PromoteOutcome, ClusterError> {
        let mut s = self.world.lock();
        *s.promote_attempts.entry(id).or_default() += 1;
        let in_sync = s.in_sync.contains(&id);
        let Some(m) = s.members.iter_mut().find(|m| m.id == id) else {
            return Ok(PromoteOutcome::NotFound);
        };
        if !m.is_learner {
            return Ok(PromoteOutcome::AlreadyVoter);
        }
        if !in_sync {
            return Ok(PromoteOutcome::NotInSync);
        }
        m.is_learner = false;
        Ok(PromoteOutcome::Promoted)
    }

    async fn remove(&self, id: u64) -> Result<(), ClusterError> {
        let mut s = self.world.lock();
        s.members.retain(|m| m.id != id);
        s.removed.push(id);
        Ok(())
    }

    async fn move_leader(&self, to: u64) -> Result<(), ClusterError> {
        let mut s = self.world.lock();
        s.leader = to;
        s.leader_moves.push(to);
        Ok(())
    }

    async fn load_progress(&self) -> Result<(LearnerProgress, i64), ClusterError> {
        let s = self.world.lock();
        Ok((s.progress.clone(), s.progress_revision))
    }

    async fn store_progress(
        &self,
        progress: &LearnerProgress,
        revision: i64,
    ) -> Result<i64, ClusterError> {
        let mut s = self.world.lock();
        if s.progress_revision != revision {
            return Err(ClusterError::ProgressConflict);
        }
        s.progress = progress.clone();
        s.progress_revision = if progress.learners.is_empty() {
            0
        } else {
            revision.max(0) + 1 + s.progress_writes as i64
        };
        s.progress_writes += 1;
        Ok(s.progress_revision)
    }

    async fn event(&self, _kind: EventKind, reason: &str, message: String) {
        self.world
            .lock()
            .events
            .push((self.local, reason.to_string(), message));
    }

    fn now(&self) -> SystemTime {
        self.world.now()
    }
}
