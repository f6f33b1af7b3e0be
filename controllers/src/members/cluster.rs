//! The seam between the membership controllers and etcd: the [`Cluster`] trait, and [`EtcdCluster`], its
//! implementation over the real cluster.
//!
//! The learner manager and member removal decide on plain data ([`ClusterView`], [`LearnerObservation`]);
//! everything they do to the cluster goes through this trait, so unit tests run them against a fake and the
//! integration tests against real etcd.

use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use hostlet_api::objects::LearnerProgress;
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError, Member, Members, TlsFiles};

use super::etcd_metrics::SentToPeer;
use crate::events::{EventKind, EventRecorder};

/// The membership and its leader, as the local member sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The local member's id.
    pub local_id: u64,
    /// The leader's id; 0 when the local member knows no leader.
    pub leader_id: u64,
    pub members: Vec<Member>,
}

impl ClusterView {
    /// Whether the local member leads: the membership controllers act only there.
    pub fn local_is_leader(&self) -> bool {
        self.leader_id != 0 && self.leader_id == self.local_id
    }

    pub fn member(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    pub fn learners(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.is_learner)
    }

    pub fn voters(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.is_voter())
    }
}

/// How far a learner got: its own status, and the leader's count of what it sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearnerObservation {
    /// Its raft applied index; `None` while it does not answer (not started, or still catching up).
    pub applied_index: Option<u64>,
    /// What the leader's metrics say about it; `None` when they could not be read.
    pub sent: Option<SentToPeer>,
}

/// What etcd answered to a promote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromoteOutcome {
    Promoted,
    /// "can only promote a learner member which is in sync with leader": not caught up yet.
    NotInSync,
    /// It is a voter already (promoted by an attempt whose answer was lost, or by an operator).
    AlreadyVoter,
    /// No such member (removed meanwhile).
    NotFound,
}

/// What can go wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("the local etcd member at {endpoint} does not answer: {source}")]
    LocalMember {
        endpoint: String,
        #[source]
        source: EtcdError,
    },
    #[error("the local etcd member at {endpoint} did not answer the last look at the cluster")]
    LocalSilent { endpoint: String },
    #[error("no fresh look at the cluster's members within {0:?}")]
    NoFreshLook(Duration),
    #[error("the learner progress record changed under us (another leader wrote it)")]
    ProgressConflict,
}

/// Everything the membership controllers do to the cluster, and their clock.
pub trait Cluster: Send + Sync + 'static {
    /// The node this agent runs on.
    fn node(&self) -> &str;
    /// Members, the local member and the leader, as last seen (the shared member cache).
    fn view(&self) -> impl Future<Output = Result<ClusterView, ClusterError>> + Send;
    /// The same from a look taken after this call: for a decision that must not rest on old data.
    fn fresh_view(&self) -> impl Future<Output = Result<ClusterView, ClusterError>> + Send;
    /// The members alone, from a fresh look through any voter: works when the local member is gone.
    fn members(&self) -> impl Future<Output = Result<Vec<Member>, ClusterError>> + Send;
    /// Yields when the members or the leadership may have changed: once at the start, then at every
    /// change the shared member cache sees.
    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static;
    /// A learner's raft applied index; `None` when it does not answer (never started, down, unreachable).
    fn learner_applied_index(&self, member: &Member) -> impl Future<Output = Option<u64>> + Send;
    /// What the local member (the leader) has sent member `id`, from its own metrics; `None` when they
    /// cannot be read.
    fn sent_to(&self, id: u64) -> impl Future<Output = Option<SentToPeer>> + Send;
    fn promote(&self, id: u64)
        -> impl Future<Output = Result<PromoteOutcome, ClusterError>> + Send;
    fn remove(&self, id: u64) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Hands leadership to voter `to`.
    fn move_leader(&self, to: u64) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// The learner progress record and its mod revision (0: absent). A value that does not decode reads as
    /// empty (logged): the record is only bookkeeping, the next write replaces it.
    fn load_progress(
        &self,
    ) -> impl Future<Output = Result<(LearnerProgress, i64), ClusterError>> + Send;
    /// Writes the record if it is still at `revision` (0: absent); returns the new revision, or
    /// [`ClusterError::ProgressConflict`]. An empty record deletes the key.
    fn store_progress(
        &self,
        progress: &LearnerProgress,
        revision: i64,
    ) -> impl Future<Output = Result<i64, ClusterError>> + Send;
    /// Records an event on this node (and logs it).
    fn event(
        &self,
        kind: EventKind,
        reason: &str,
        message: String,
    ) -> impl Future<Output = ()> + Send;
    /// Wall-clock now: the progress record is read by whichever member leads next, on another host.
    fn now(&self) -> SystemTime;
}

/// How long a learner's status may take. The leader lists a learner's client URL as soon as the learner
/// has proposed it, but the learner serves that port only once it has caught up; until then a request
/// hangs. The reconcile waits for this, so it is short: one that does not answer quickly is as good as
/// silent, and the leader's own figures tell the rest.
const LEARNER_STATUS_TIMEOUT: Duration = Duration::from_millis(100);
/// How long the local member's metrics may take.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a fresh look at the members may take.
const FRESH_LOOK: Duration = Duration::from_secs(10);

/// [`Cluster`] over the real etcd.
#[derive(Clone)]
pub struct EtcdCluster {
    etcd: Etcd,
    members: Members,
    keys: KeyLayout,
    node: String,
    local_endpoint: String,
    http: reqwest::Client,
    events: EventRecorder,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("local_endpoint", &self.local_endpoint)
            .finish_non_exhaustive()
    }
}

/// Why the HTTP client for learners' metrics could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics client: {0}")]
    Http(#[from] reqwest::Error),
}

impl EtcdCluster {
    /// `local_endpoint` is the local member's client URL (its status says who leads, its metrics what it
    /// sent each learner); `tls` the client certificate, which `/metrics` asks for too under client-cert
    /// auth; `members` the agent's shared member cache.
    pub fn new(
        etcd: Etcd,
        members: Members,
        keys: KeyLayout,
        node: &str,
        local_endpoint: impl Into<String>,
        tls: Option<&TlsFiles>,
    ) -> Result<Self, SetupError> {
        let mut http = reqwest::Client::builder()
            .timeout(METRICS_TIMEOUT)
            .connect_timeout(METRICS_TIMEOUT);
        if let Some(tls) = tls {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|source| SetupError::Read {
                    path: p.to_path_buf(),
                    source,
                })
            };
            let mut identity = read(&tls.cert)?;
            identity.push(b'\n');
            identity.extend(read(&tls.key)?);
            http = http
                .add_root_certificate(reqwest::Certificate::from_pem(&read(&tls.ca)?)?)
                .identity(reqwest::Identity::from_pem(&identity)?);
        }
        Ok(EtcdCluster {
            events: EventRecorder::new(etcd.clone(), keys.clone(), node),
            node: node.to_string(),
            etcd,
            members,
            keys,
            local_endpoint: local_endpoint.into(),
            http: http.build()?,
        })
    }

    /// The same cluster, recording events through the agent's one recorder.
    #[must_use]
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = events;
        self
    }

    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    fn cached_members(&self) -> Vec<Member> {
        self.members
            .list()
            .iter()
            .map(|m| m.as_ref().clone())
            .collect()
    }
}

impl Cluster for EtcdCluster {
    fn node(&self) -> &str {
        &self.node
    }

    async fn members(&self) -> Result<Vec<Member>, ClusterError> {
        if !self.members.refresh(FRESH_LOOK).await {
            return Err(ClusterError::NoFreshLook(FRESH_LOOK));
        }
        Ok(self.cached_members())
    }

    async fn view(&self) -> Result<ClusterView, ClusterError> {
        let leadership = self.members.leadership();
        if leadership.local_id == 0 {
            return Err(ClusterError::LocalSilent {
                endpoint: self.local_endpoint.clone(),
            });
        }
        Ok(ClusterView {
            local_id: leadership.local_id,
            leader_id: leadership.leader_id,
            members: self.cached_members(),
        })
    }

    async fn fresh_view(&self) -> Result<ClusterView, ClusterError> {
        if !self.members.refresh(FRESH_LOOK).await {
            return Err(ClusterError::NoFreshLook(FRESH_LOOK));
        }
        self.view().await
    }

    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let store = self.members.store().clone();
        let ready = store.clone();
        let identity = futures::stream::unfold(store.subscribe(), |mut c| async move {
            c.next_batch().await.map(|_| ((), c))
        });
        let leadership =
            futures::stream::unfold(self.members.watch_leadership(), |mut l| async move {
                l.changed().await.ok().map(|_| ((), l))
            });
        futures::stream::once(async move { ready.wait_until_ready().await })
            .chain(futures::stream::select(identity, leadership))
    }

    async fn learner_applied_index(&self, member: &Member) -> Option<u64> {
        // Before it has proposed its client URL there is nothing to ask.
        let url = member.client_urls.first()?;
        match tokio::time::timeout(LEARNER_STATUS_TIMEOUT, self.etcd.status_of(url)).await {
            Ok(Ok(s)) => Some(s.raft_applied_index()),
            Ok(Err(e)) => {
                tracing::debug!(member = %member.name, error = %e, "learner status unavailable");
                None
            }
            Err(_) => None,
        }
    }

    async fn sent_to(&self, id: u64) -> Option<SentToPeer> {
        let url = format!("{}/metrics", self.local_endpoint.trim_end_matches('/'));
        let text = match self.http.get(&url).send().await {
            Ok(r) if r.status().is_success() => r.text().await.ok()?,
            Ok(r) => {
                tracing::debug!(%url, status = %r.status(), "local member's metrics refused");
                return None;
            }
            Err(e) => {
                tracing::debug!(%url, error = %e, "local member's metrics unreachable");
                return None;
            }
        };
        Some(SentToPeer::parse(&text, &format!("{id:x}")))
    }

    async fn promote(&self, id: u64) -> Result<PromoteOutcome, ClusterError> {
        match self.etcd.member_promote(id).await {
            Ok(_) => Ok(PromoteOutcome::Promoted),
            Err(e) => match e.server_message().map(classify_promote_refusal) {
                Some(Some(outcome)) => Ok(outcome),
                _ => Err(e.into()),
            },
        }
    }

    async fn remove(&self, id: u64) -> Result<(), ClusterError> {
        match self.etcd.member_remove(id).await {
            Ok(_) => Ok(()),
            // Removed by an attempt whose answer was lost: done all the same.
            Err(e)
                if e.server_message()
                    .is_some_and(|m| m.contains("member not found")) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn move_leader(&self, to: u64) -> Result<(), ClusterError> {
        Ok(self.etcd.move_leader(to).await?)
    }

    async fn load_progress(&self) -> Result<(LearnerProgress, i64), ClusterError> {
        let key = self.keys.learner_progress();
        let Some(kv) = self.etcd.get(&key).await? else {
            return Ok((LearnerProgress::default(), 0));
        };
        let progress = serde_json::from_slice(kv.value()).unwrap_or_else(|e| {
            tracing::warn!(%key, error = %e, "learner progress record does not decode; starting afresh");
            LearnerProgress::default()
        });
        Ok((progress, kv.mod_revision()))
    }

    async fn store_progress(
        &self,
        progress: &LearnerProgress,
        revision: i64,
    ) -> Result<i64, ClusterError> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let key = self.keys.learner_progress();
        let value = serde_json::to_vec(progress).unwrap_or_default();
        let write = if progress.learners.is_empty() {
            TxnOp::delete(key.as_str(), None)
        } else {
            TxnOp::put(key.as_str(), value, None)
        };
        // Compare-and-swap: a leader that lost its place must not overwrite its successor's clock.
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([write]);
        let resp = self.etcd.txn(txn).await?;
        if !resp.succeeded() {
            return Err(ClusterError::ProgressConflict);
        }
        Ok(if progress.learners.is_empty() {
            0
        } else {
            resp.header().map(|h| h.revision()).unwrap_or(0)
        })
    }

    async fn event(&self, kind: EventKind, reason: &str, message: String) {
        self.events.node_event(kind, reason, message).await;
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Reads etcd's refusal of a promote; `None` for an error that is not about the learner.
pub fn classify_promote_refusal(message: &str) -> Option<PromoteOutcome> {
    if message.contains("in sync with leader") {
        Some(PromoteOutcome::NotInSync)
    } else if message.contains("can only promote a learner member") {
        Some(PromoteOutcome::AlreadyVoter)
    } else if message.contains("member not found") {
        Some(PromoteOutcome::NotFound)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promote_refusals_as_etcd_words_them() {
        let cases = [
            (
                "etcdserver: can only promote a learner member which is in sync with leader",
                Some(PromoteOutcome::NotInSync),
            ),
            (
                "etcdserver: can only promote a learner member",
                Some(PromoteOutcome::AlreadyVoter),
            ),
            (
                "etcdserver: member not found",
                Some(PromoteOutcome::NotFound),
            ),
            ("etcdserver: request timed out", None),
        ];
        for (msg, want) in cases {
            assert_eq!(classify_promote_refusal(msg), want, "{msg}");
        }
    }

    #[test]
    fn only_the_leader_leads() {
        let v = ClusterView {
            local_id: 1,
            leader_id: 1,
            members: vec![],
        };
        assert!(v.local_is_leader());
        let follower = ClusterView {
            leader_id: 2,
            ..v.clone()
        };
        assert!(!follower.local_is_leader());
        let no_leader = ClusterView {
            local_id: 0,
            leader_id: 0,
            members: vec![],
        };
        assert!(!no_leader.local_is_leader());
    }
}
