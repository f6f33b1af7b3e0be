//! The member informer: etcd has no watch on membership, so this polls `member_list` and every member's
//! `status` (one client per member) on a short period and feeds the differences into a [`Store`] keyed by
//! member id, with the same events as the key informers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, EtcdError};
use crate::metrics::{InformerMetrics, Metrics};
use crate::store::{Event, Store, Writer};

/// The default polling period.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(2);
/// How long one member's status may take; a member slower than this counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// One member as `member_list` and its own `status` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    /// Empty until the member has started.
    pub name: String,
    pub peer_urls: Vec<String>,
    /// Empty until the member has started.
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    /// What the member says of itself, or why it could not be asked.
    pub status: Result<MemberStatus, String>,
}

impl MemberInfo {
    /// Whether the member has started (it publishes its name and client URLs once it runs).
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }
}

/// A member's own status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub version: String,
    pub db_size: i64,
    /// The leader this member follows (0: none known).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub is_learner: bool,
    pub errors: Vec<String>,
}

impl From<&etcd_client::StatusResponse> for MemberStatus {
    fn from(s: &etcd_client::StatusResponse) -> Self {
        MemberStatus {
            version: s.version().to_string(),
            db_size: s.db_size(),
            leader: s.leader(),
            raft_term: s.raft_term(),
            raft_index: s.raft_index(),
            raft_applied_index: s.raft_applied_index(),
            is_learner: s.is_learner(),
            errors: s.errors().to_vec(),
        }
    }
}

/// The events that turn `old` into `new`: `Apply` for new and changed members, `Delete` for gone ones.
pub fn diff(
    old: &HashMap<u64, Arc<MemberInfo>>,
    new: &HashMap<u64, Arc<MemberInfo>>,
) -> Vec<Event<u64, MemberInfo>> {
    let mut events: Vec<Event<u64, MemberInfo>> = new
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

/// Keeps a store of the cluster's members.
///
/// ```no_run
/// # async fn demo(etcd: hostlet_runtime::Etcd, metrics: hostlet_runtime::Metrics) {
/// use hostlet_runtime::members::MemberInformer;
/// use tokio_util::sync::CancellationToken;
/// let informer = MemberInformer::new(etcd).with_metrics(&metrics).with_endpoint_sync();
/// let members = informer.store();
/// tokio::spawn(informer.run(CancellationToken::new()));
/// members.wait_until_ready().await;
/// let learners = members.state().into_iter().filter(|m| m.is_learner).count();
/// # }
/// ```
pub struct MemberInformer {
    etcd: Etcd,
    period: Duration,
    sync_endpoints: bool,
    writer: Writer<u64, MemberInfo>,
    metrics: InformerMetrics,
}

impl MemberInformer {
    /// The metrics' informer label.
    pub const NAME: &'static str = "members";

    pub fn new(etcd: Etcd) -> Self {
        MemberInformer {
            etcd,
            period: DEFAULT_PERIOD,
            sync_endpoints: false,
            writer: Writer::new(),
            metrics: Metrics::new().informer(Self::NAME),
        }
    }

    #[must_use]
    pub fn with_period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(10));
        self
    }

    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = metrics.informer(Self::NAME);
        self
    }

    /// After each poll, points the etcd client at the voting members, so learners stay out of it.
    #[must_use]
    pub fn with_endpoint_sync(mut self) -> Self {
        self.sync_endpoints = true;
        self
    }

    /// Adds a secondary index to the store (see [`Writer::with_index`]).
    #[must_use]
    pub fn with_index<F>(mut self, name: &str, values_of: F) -> Self
    where
        F: Fn(&u64, &MemberInfo) -> Vec<String> + Send + Sync + 'static,
    {
        self.writer = self.writer.with_index(name, values_of);
        self
    }

    pub fn store(&self) -> Store<u64, MemberInfo> {
        self.writer.store()
    }

    /// One look at the cluster.
    pub async fn poll(&self) -> Result<HashMap<u64, Arc<MemberInfo>>, EtcdError> {
        let members = self.etcd.member_list().await?;
        let statuses = futures::future::join_all(members.iter().map(|m| async move {
            let Some(url) = m.client_urls().first() else {
                return Err("not started".to_string());
            };
            match tokio::time::timeout(STATUS_TIMEOUT, self.etcd.status_of(url)).await {
                Ok(Ok(s)) => Ok(MemberStatus::from(&s)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no status within {STATUS_TIMEOUT:?}")),
            }
        }))
        .await;
        Ok(members
            .iter()
            .zip(statuses)
            .map(|(m, status)| {
                (
                    m.id(),
                    Arc::new(MemberInfo {
                        id: m.id(),
                        name: m.name().to_string(),
                        peer_urls: m.peer_urls().to_vec(),
                        client_urls: m.client_urls().to_vec(),
                        is_learner: m.is_learner(),
                        status,
                    }),
                )
            })
            .collect())
    }

    /// Polls every period until `shutdown` fires. A failed poll keeps the last known members.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut known: Option<HashMap<u64, Arc<MemberInfo>>> = None;
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let polled = tokio::select! {
                _ = shutdown.cancelled() => return,
                p = self.poll() => p,
            };
            let members = match polled {
                Ok(m) => m,
                Err(e) => {
                    self.metrics.error.inc();
                    tracing::warn!(error = %e, "cannot list etcd members");
                    continue;
                }
            };
            if self.sync_endpoints {
                self.sync_client(&members).await;
            }
            match &known {
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
            known = Some(members);
        }
    }

    async fn sync_client(&self, members: &HashMap<u64, Arc<MemberInfo>>) {
        let mut voters: Vec<&String> = members
            .values()
            .filter(|m| !m.is_learner)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, learner: bool, applied: u64) -> Arc<MemberInfo> {
        Arc::new(MemberInfo {
            id,
            name: format!("m{id}"),
            peer_urls: vec![format!("http://10.0.0.{id}:2380")],
            client_urls: vec![format!("http://10.0.0.{id}:2379")],
            is_learner: learner,
            status: Ok(MemberStatus {
                version: "3.4.23".into(),
                db_size: 1,
                leader: 1,
                raft_term: 2,
                raft_index: applied,
                raft_applied_index: applied,
                is_learner: learner,
                errors: vec![],
            }),
        })
    }

    fn map(ms: &[Arc<MemberInfo>]) -> HashMap<u64, Arc<MemberInfo>> {
        ms.iter().map(|m| (m.id, m.clone())).collect()
    }

    #[test]
    fn diff_reports_added_changed_and_removed_members_only() {
        let old = map(&[
            member(1, false, 10),
            member(2, true, 5),
            member(3, false, 10),
        ]);
        let new = map(&[
            member(1, false, 10),
            member(2, false, 9),
            member(4, true, 0),
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
