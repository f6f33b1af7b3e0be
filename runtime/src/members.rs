//! The member informer: etcd has no watch on membership, so this polls `member_list` and every member's
//! `status` and feeds the differences into a [`Store`] keyed by member id, with the same events as the
//! key informers.
//!
//! The store holds identity only ([`Member`]: id, name, URLs, learner flag): a poll that only moves raft
//! indexes or db sizes does not wake its readers. Statuses and the leadership are published apart, each as
//! a watchable value that changes only when its content does ([`Members::watch_statuses`],
//! [`Members::watch_leadership`]).
//!
//! It polls slowly while nothing happens ([`Pace::slow`]) and fast while a learner exists or for a while
//! after someone asked it to hurry ([`Members::hurry`]: a join is under way, a controller needs a fresh
//! look). [`Members::refresh`] waits for a look that began after the call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, EtcdError};
use crate::metrics::{InformerMetrics, Metrics};
use crate::store::{Event, Store, Writer};

/// How long a voter's status may take; one slower than this counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a learner's status may take: a learner lists its client URL before it serves it, and until
/// then a request hangs; the poll must not wait on it.
const LEARNER_STATUS_TIMEOUT: Duration = Duration::from_millis(300);

/// One member's identity, as `member_list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// Empty until the member has started.
    pub name: String,
    pub peer_urls: Vec<String>,
    /// Empty until the member has started.
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl Member {
    /// Whether the member has started (it publishes its name and client URLs once it runs).
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    pub fn is_voter(&self) -> bool {
        !self.is_learner
    }

    /// Whether one of its peer URLs is `url` (a trailing `/` aside).
    pub fn has_peer_url(&self, url: &str) -> bool {
        let url = url.trim_end_matches('/');
        self.peer_urls
            .iter()
            .any(|u| u.trim_end_matches('/') == url)
    }
}

impl From<&etcd_client::Member> for Member {
    fn from(m: &etcd_client::Member) -> Self {
        Member {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
        }
    }
}

/// A member's own status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub version: String,
    pub db_size: i64,
    pub db_size_in_use: i64,
    /// The leader this member follows (0: none known).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub is_learner: bool,
    pub errors: Vec<String>,
    /// From the answer's header: the cluster this member serves, and its revision.
    pub cluster_id: u64,
    pub revision: i64,
}

impl From<&etcd_client::StatusResponse> for MemberStatus {
    fn from(s: &etcd_client::StatusResponse) -> Self {
        MemberStatus {
            version: s.version().to_string(),
            db_size: s.db_size(),
            db_size_in_use: s.raft_used_db_size(),
            leader: s.leader(),
            raft_term: s.raft_term(),
            raft_index: s.raft_index(),
            raft_applied_index: s.raft_applied_index(),
            is_learner: s.is_learner(),
            errors: s.errors().to_vec(),
            cluster_id: s.header().map(|h| h.cluster_id()).unwrap_or(0),
            revision: s.header().map(|h| h.revision()).unwrap_or(0),
        }
    }
}

/// Every member's status at the last look: what it says of itself, or why it could not be asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Statuses {
    pub of: HashMap<u64, Result<MemberStatus, String>>,
    /// The local member's id, when a local member was asked and answered.
    pub local_id: Option<u64>,
}

impl Statuses {
    /// The status of member `id`, when it answered.
    pub fn get(&self, id: u64) -> Option<&MemberStatus> {
        self.of.get(&id).and_then(|s| s.as_ref().ok())
    }

    /// The local member's status, when it answered.
    pub fn local(&self) -> Option<&MemberStatus> {
        self.local_id.and_then(|id| self.get(id))
    }
}

/// Who leads, as the local member sees it (or, without a local member, the first voter that answered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leadership {
    /// The local member's id; 0 when there is none or it did not answer.
    pub local_id: u64,
    /// 0 when no leader is known.
    pub leader_id: u64,
    /// The cluster id the answer came from; 0 when none answered.
    pub cluster_id: u64,
}

impl Leadership {
    pub fn local_leads(&self) -> bool {
        self.leader_id != 0 && self.leader_id == self.local_id
    }
}

/// How often the membership is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// While nothing happens.
    pub slow: Duration,
    /// While a learner exists, and for [`Pace::fast_for`] after a hurry.
    pub fast: Duration,
    pub fast_for: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            slow: Duration::from_secs(20),
            fast: Duration::from_millis(250),
            fast_for: Duration::from_secs(10),
        }
    }
}

/// The readers' side of the member informer: the identity store, the statuses, the leadership, and a way
/// to ask for a look now. Cheap to clone; every clone reads the same informer.
#[derive(Clone)]
pub struct Members {
    store: Store<u64, Member>,
    statuses: watch::Receiver<Arc<Statuses>>,
    leadership: watch::Receiver<Leadership>,
    /// Looks begun, finished and last succeeded, by number: a refresh waits for a look begun after it
    /// was asked.
    looks: watch::Receiver<Looks>,
    hurry: Arc<Notify>,
}

impl Members {
    /// A reader of what these feed (the member informer's, or a hand-fed cache's).
    fn reading(
        writer: &Writer<u64, Member>,
        statuses: &watch::Sender<Arc<Statuses>>,
        leadership: &watch::Sender<Leadership>,
        looks: &watch::Sender<Looks>,
        hurry: &Arc<Notify>,
    ) -> Members {
        Members {
            store: writer.store(),
            statuses: statuses.subscribe(),
            leadership: leadership.subscribe(),
            looks: looks.subscribe(),
            hurry: hurry.clone(),
        }
    }

    pub fn store(&self) -> &Store<u64, Member> {
        &self.store
    }

    /// The members now, by id order.
    pub fn list(&self) -> Vec<Arc<Member>> {
        let mut v = self.store.state();
        v.sort_by_key(|m| m.id);
        v
    }

    pub fn leadership(&self) -> Leadership {
        *self.leadership.borrow()
    }

    /// Changes only when who leads (or the local member's id) changes.
    pub fn watch_leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    pub fn statuses(&self) -> Arc<Statuses> {
        self.statuses.borrow().clone()
    }

    /// Changes when a member's status does (raft index, db size, leader, errors).
    pub fn watch_statuses(&self) -> watch::Receiver<Arc<Statuses>> {
        self.statuses.clone()
    }

    /// Asks for a look now, and fast looks for a while.
    pub fn hurry(&self) {
        self.hurry.notify_one();
    }

    /// Waits for the next look to finish (one under way counts); true when it succeeded. False at once
    /// if the informer has stopped.
    pub async fn next_look(&self) -> bool {
        let mut looks = self.looks.clone();
        let done = looks.borrow_and_update().done;
        let ok = match looks.wait_for(|l| l.done > done).await {
            Ok(l) => l.succeeded == l.done,
            Err(_) => false,
        };
        ok
    }

    /// Asks for a look now and waits until one that began after this call has finished; true when it
    /// succeeded (the store, statuses and leadership are then that fresh), false when it failed or none
    /// finished within `within`.
    pub async fn refresh(&self, within: Duration) -> bool {
        let mut looks = self.looks.clone();
        let asked_at = looks.borrow().begun;
        self.hurry();
        let looked = tokio::time::timeout(within, looks.wait_for(|l| l.done > asked_at))
            .await
            .ok()
            .and_then(|r| r.ok().map(|l| l.succeeded > asked_at));
        looked.unwrap_or(false)
    }
}

/// The member informer's looks, by number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Looks {
    begun: u64,
    done: u64,
    succeeded: u64,
}

/// Keeps the shared cache of the cluster's members.
///
/// ```no_run
/// # async fn demo(etcd: hostlet_runtime::Etcd, metrics: hostlet_runtime::Metrics) {
/// use hostlet_runtime::members::MemberInformer;
/// use tokio_util::sync::CancellationToken;
/// let informer = MemberInformer::new(etcd)
///     .with_local("http://127.0.0.1:2379")
///     .with_metrics(&metrics)
///     .with_endpoint_sync();
/// let members = informer.members();
/// tokio::spawn(informer.run(CancellationToken::new()));
/// members.store().wait_until_ready().await;
/// let learners = members.list().iter().filter(|m| m.is_learner).count();
/// let leads = members.leadership().local_leads();
/// # }
/// ```
pub struct MemberInformer {
    etcd: Etcd,
    local: Option<String>,
    pace: Pace,
    sync_endpoints: bool,
    ask_statuses: bool,
    writer: Writer<u64, Member>,
    statuses: watch::Sender<Arc<Statuses>>,
    leadership: watch::Sender<Leadership>,
    looks: watch::Sender<Looks>,
    hurry: Arc<Notify>,
    metrics: InformerMetrics,
}

impl MemberInformer {
    /// The metrics' informer label.
    pub const NAME: &'static str = "members";

    pub fn new(etcd: Etcd) -> Self {
        MemberInformer {
            etcd,
            local: None,
            pace: Pace::default(),
            sync_endpoints: false,
            ask_statuses: true,
            writer: Writer::new(),
            statuses: watch::Sender::new(Arc::new(Statuses::default())),
            leadership: watch::Sender::new(Leadership::default()),
            looks: watch::Sender::new(Looks::default()),
            hurry: Arc::new(Notify::new()),
            metrics: Metrics::new().informer(Self::NAME),
        }
    }

    /// The local member's client URL: its status gives the leadership.
    #[must_use]
    pub fn with_local(mut self, url: impl Into<String>) -> Self {
        self.local = Some(url.into());
        self
    }

    #[must_use]
    pub fn with_pace(mut self, pace: Pace) -> Self {
        let floor = Duration::from_millis(10);
        self.pace = Pace {
            slow: pace.slow.max(floor),
            fast: pace.fast.max(floor),
            fast_for: pace.fast_for,
        };
        self
    }

    /// One period for every look, fast or slow (tests).
    #[must_use]
    pub fn with_period(self, period: Duration) -> Self {
        self.with_pace(Pace {
            slow: period,
            fast: period,
            fast_for: Duration::ZERO,
        })
    }

    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = metrics.informer(Self::NAME);
        self
    }

    /// After each look, points the etcd client at the voting members, so learners stay out of it.
    #[must_use]
    pub fn with_endpoint_sync(mut self) -> Self {
        self.sync_endpoints = true;
        self
    }

    /// Looks at the member list only, asking no member for its status (a worker, which only needs the
    /// voters' URLs): no statuses, no leadership.
    #[must_use]
    pub fn identity_only(mut self) -> Self {
        self.ask_statuses = false;
        self
    }

    /// Adds a secondary index to the store (see [`Writer::with_index`]).
    #[must_use]
    pub fn with_index<F>(mut self, name: &str, values_of: F) -> Self
    where
        F: Fn(&u64, &Member) -> Vec<String> + Send + Sync + 'static,
    {
        self.writer = self.writer.with_index(name, values_of);
        self
    }

    /// The readers' handle; clone it for every controller that reads the members.
    pub fn members(&self) -> Members {
        Members::reading(
            &self.writer,
            &self.statuses,
            &self.leadership,
            &self.looks,
            &self.hurry,
        )
    }

    /// One look at the cluster: the members, and every member's status (the local member's through its
    /// local URL).
    pub async fn poll(&self) -> Result<(HashMap<u64, Arc<Member>>, Statuses), EtcdError> {
        let list = self.etcd.member_list().await?;
        let mut statuses = Statuses::default();
        if let Some(url) = &self.local {
            match tokio::time::timeout(STATUS_TIMEOUT, self.etcd.status_of(url)).await {
                Ok(Ok(s)) => {
                    if let Some(id) = s.header().map(|h| h.member_id()) {
                        statuses.local_id = Some(id);
                        statuses.of.insert(id, Ok(MemberStatus::from(&s)));
                    }
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "the local member does not answer"),
                Err(_) => tracing::debug!("the local member does not answer in time"),
            }
        }
        let local_id = statuses.local_id;
        let ask = |m: &&etcd_client::Member| self.ask_statuses && Some(m.id()) != local_id;
        let asked = futures::future::join_all(list.iter().filter(ask).map(|m| async move {
            let status = match m.client_urls().first() {
                None => Err("not started".to_string()),
                Some(url) => {
                    let limit = if m.is_learner() {
                        LEARNER_STATUS_TIMEOUT
                    } else {
                        STATUS_TIMEOUT
                    };
                    match tokio::time::timeout(limit, self.etcd.status_of(url)).await {
                        Ok(Ok(s)) => Ok(MemberStatus::from(&s)),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no status within {limit:?}")),
                    }
                }
            };
            (m.id(), status)
        }))
        .await;
        statuses.of.extend(asked);
        let members = list
            .iter()
            .map(|m| (m.id(), Arc::new(Member::from(m))))
            .collect();
        Ok((members, statuses))
    }

    /// Who leads, from the statuses of `members`.
    fn leadership_of(members: &HashMap<u64, Arc<Member>>, statuses: &Statuses) -> Leadership {
        if let Some(id) = statuses.local_id {
            let s = statuses.get(id);
            return Leadership {
                local_id: id,
                leader_id: s.map(|s| s.leader).unwrap_or(0),
                cluster_id: s.map(|s| s.cluster_id).unwrap_or(0),
            };
        }
        let mut voters: Vec<&u64> = members
            .iter()
            .filter(|(_, m)| m.is_voter())
            .map(|(id, _)| id)
            .collect();
        voters.sort();
        voters
            .into_iter()
            .filter_map(|id| statuses.get(*id))
            .find(|s| s.leader != 0)
            .map(|s| Leadership {
                local_id: 0,
                leader_id: s.leader,
                cluster_id: s.cluster_id,
            })
            .unwrap_or_default()
    }

    /// Looks until `shutdown` fires. A failed look keeps the last known members.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut known: Option<HashMap<u64, Arc<Member>>> = None;
        let mut fast_until: Option<Instant> = None;
        let mut first = true;
        loop {
            if !first {
                let learners = known
                    .as_ref()
                    .is_some_and(|k| k.values().any(|m| m.is_learner));
                let hurried = fast_until.is_some_and(|t| Instant::now() < t);
                let period = if learners || hurried {
                    self.pace.fast
                } else {
                    self.pace.slow
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                    _ = self.hurry.notified() => {
                        fast_until = Some(Instant::now() + self.pace.fast_for);
                    }
                }
            }
            first = false;
            let look = self.looks.borrow().begun + 1;
            self.looks.send_modify(|l| l.begun = look);
            let polled = tokio::select! {
                _ = shutdown.cancelled() => return,
                p = self.poll() => p,
            };
            let ok = polled.is_ok();
            match polled {
                Ok((members, statuses)) => {
                    if self.sync_endpoints {
                        self.sync_client(&members).await;
                    }
                    let leadership = Self::leadership_of(&members, &statuses);
                    // Statuses and leadership first: a reader woken by the store sees them as fresh.
                    self.statuses.send_if_modified(|s| {
                        let changed = **s != statuses;
                        if changed {
                            *s = Arc::new(statuses);
                        }
                        changed
                    });
                    self.leadership.send_if_modified(|l| {
                        let changed = *l != leadership;
                        *l = leadership;
                        changed
                    });
                    self.apply(&mut known, members);
                }
                Err(e) => {
                    self.metrics.error.inc();
                    tracing::warn!(error = %e, "cannot list etcd members");
                }
            }
            self.looks.send_modify(|l| {
                l.done = look;
                if ok {
                    l.succeeded = look;
                }
            });
        }
    }

    fn apply(
        &mut self,
        known: &mut Option<HashMap<u64, Arc<Member>>>,
        members: HashMap<u64, Arc<Member>>,
    ) {
        match known {
            None => {
                self.metrics.init.inc();
                self.writer.apply(Event::Init);
                for (id, m) in &members {
                    self.metrics.init_apply.inc();
                    self.writer.apply(Event::InitApply(*id, m.clone()));
                }
                self.metrics.init_done.inc();
                self.writer.apply(Event::InitDone);
            }
            Some(old) => {
                for ev in diff(old, &members) {
                    match &ev {
                        Event::Delete(_) => self.metrics.delete.inc(),
                        _ => self.metrics.apply.inc(),
                    }
                    self.writer.apply(ev);
                }
            }
        }
        *known = Some(members);
    }

    async fn sync_client(&self, members: &HashMap<u64, Arc<Member>>) {
        let mut voters: Vec<&String> = members
            .values()
            .filter(|m| m.is_voter())
            .filter_map(|m| m.client_urls.first())
            .collect();
        voters.sort();
        if voters.is_empty() {
            return;
        }
        if let Err(e) = self.etcd.set_endpoints(voters.into_iter().cloned()).await {
            tracing::warn!(error = %e, "cannot update the etcd endpoints");
        }
    }
}

/// A member cache fed by hand, for controller tests on a fake cluster: what it is given is what every
/// [`Members`] handle of it reads, and a [`Members::refresh`] succeeds at once while it answers.
pub struct MembersFeed {
    writer: Writer<u64, Member>,
    statuses: watch::Sender<Arc<Statuses>>,
    leadership: watch::Sender<Leadership>,
    looks: watch::Sender<Looks>,
    hurry: Arc<Notify>,
    answering: Arc<std::sync::atomic::AtomicBool>,
    responder: tokio::task::JoinHandle<()>,
}

impl MembersFeed {
    /// An empty, ready cache. Spawns the task that answers refreshes: call it inside a tokio runtime.
    pub fn new() -> Self {
        let mut writer = Writer::new();
        writer.apply_all([Event::Init, Event::InitDone]);
        let looks = watch::Sender::new(Looks::default());
        let hurry = Arc::new(Notify::new());
        let answering = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let responder = tokio::spawn({
            let looks = looks.clone();
            let hurry = hurry.clone();
            let answering = answering.clone();
            async move {
                loop {
                    hurry.notified().await;
                    let ok = answering.load(std::sync::atomic::Ordering::SeqCst);
                    looks.send_modify(|l| {
                        l.begun += 1;
                        l.done += 1;
                        if ok {
                            l.succeeded = l.done;
                        }
                    });
                }
            }
        });
        MembersFeed {
            writer,
            statuses: watch::Sender::new(Arc::new(Statuses::default())),
            leadership: watch::Sender::new(Leadership::default()),
            looks,
            hurry,
            answering,
            responder,
        }
    }

    pub fn members(&self) -> Members {
        Members::reading(
            &self.writer,
            &self.statuses,
            &self.leadership,
            &self.looks,
            &self.hurry,
        )
    }

    /// Replaces the members, their statuses and the leadership, as one look would.
    pub fn set(&mut self, members: Vec<Member>, statuses: Statuses, leadership: Leadership) {
        let old: HashMap<u64, Arc<Member>> = self.writer.store().entries().into_iter().collect();
        let new: HashMap<u64, Arc<Member>> =
            members.into_iter().map(|m| (m.id, Arc::new(m))).collect();
        self.writer.apply_all(diff(&old, &new));
        self.statuses.send_if_modified(|s| {
            let changed = **s != statuses;
            *s = Arc::new(statuses);
            changed
        });
        self.leadership.send_if_modified(|l| {
            let changed = *l != leadership;
            *l = leadership;
            changed
        });
    }

    /// Whether refreshes succeed (a look that fails: etcd down).
    pub fn answer_refreshes(&self, answering: bool) {
        self.answering
            .store(answering, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Default for MembersFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for MembersFeed {
    fn drop(&mut self) {
        self.responder.abort();
    }
}

/// The events that turn `old` into `new`: `Apply` for new and changed members, `Delete` for gone ones.
pub fn diff(
    old: &HashMap<u64, Arc<Member>>,
    new: &HashMap<u64, Arc<Member>>,
) -> Vec<Event<u64, Member>> {
    let mut events: Vec<Event<u64, Member>> = new
        .iter()
        .filter(|(id, m)| old.get(id).is_none_or(|o| o != *m))
        .map(|(id, m)| Event::Apply(*id, m.clone()))
        .collect();
    events.extend(
        old.keys()
            .filter(|id| !new.contains_key(id))
            .map(|id| Event::Delete(*id)),
    );
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, learner: bool, name: &str) -> Arc<Member> {
        Arc::new(Member {
            id,
            name: name.to_string(),
            peer_urls: vec![format!("http://10.0.0.{id}:2380")],
            client_urls: vec![format!("http://10.0.0.{id}:2379")],
            is_learner: learner,
        })
    }

    fn map(ms: &[Arc<Member>]) -> HashMap<u64, Arc<Member>> {
        ms.iter().map(|m| (m.id, m.clone())).collect()
    }

    #[test]
    fn diff_reports_added_changed_and_removed_members_only() {
        let old = map(&[
            member(1, false, "m1"),
            member(2, true, "m2"),
            member(3, false, "m3"),
        ]);
        let new = map(&[
            member(1, false, "m1"),
            member(2, false, "m2"),
            member(4, true, ""),
        ]);
        let mut applied: Vec<u64> = Vec::new();
        let mut deleted: Vec<u64> = Vec::new();
        for ev in diff(&old, &new) {
            match ev {
                Event::Apply(id, m) => {
                    assert_eq!(m.id, id);
                    applied.push(id)
                }
                Event::Delete(id) => deleted.push(id),
                other => panic!("unexpected {other:?}"),
            }
        }
        applied.sort();
        assert_eq!(applied, vec![2, 4]);
        assert_eq!(deleted, vec![3]);
        assert!(diff(&new, &new).is_empty());
    }
}
