//! The cluster's members: list, add, promote, remove, update; each member's status; moving the leadership.

use std::time::Duration;

use etcd_client::{Member, StatusResponse};

use super::{Etcd, EtcdError};

/// How often [`Etcd::move_leader`] asks the old leader whether leadership has moved.
const MOVE_LEADER_LOOK: Duration = Duration::from_millis(10);

impl Etcd {
    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_list().await })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// Adds a learner with these peer URLs and returns it. Safe to repeat: a member already registered with
    /// the same peer URLs (say, by an attempt whose answer was lost) is returned instead of a second one.
    pub async fn member_add_as_learner(&self, peer_urls: &[String]) -> Result<Member, EtcdError> {
        let mut attempt = 0;
        self.with_retry(|mut c| {
            attempt += 1;
            let retry = attempt > 1;
            let urls = peer_urls.to_vec();
            async move {
                if retry {
                    let list = c.member_list().await?;
                    if let Some(m) = list
                        .members()
                        .iter()
                        .find(|m| same_urls(m.peer_urls(), &urls))
                    {
                        return Ok(m.clone());
                    }
                }
                let opts = etcd_client::MemberAddOptions::new().with_is_learner();
                let resp = c.member_add(urls, Some(opts)).await?;
                resp.member().cloned().ok_or_else(|| {
                    etcd_client::Error::InvalidArgs("member add answered without the member".into())
                })
            }
        })
        .await
    }

    /// Promotes a learner. etcd refuses until the learner has caught up (a `FailedPrecondition` whose
    /// message says it is not in sync); that error is returned for the caller to retry later.
    pub async fn member_promote(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_promote(id).await })
            .await?;
        Ok(resp.members().to_vec())
    }

    pub async fn member_remove(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_remove(id).await })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// Changes a member's peer URLs (never call it on a learner: some etcd versions clear the learner
    /// flag on update).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: &[String],
    ) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| {
                let urls = peer_urls.to_vec();
                async move { c.member_update(id, urls).await }
            })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// The member list as the member serving at `endpoint` knows it. One attempt, no rotation.
    pub async fn member_list_of(&self, endpoint: &str) -> Result<Vec<Member>, EtcdError> {
        let mut client = self.endpoint_client(endpoint).await?;
        self.attempt_at(endpoint, "member list", client.member_list())
            .await
            .map(|r| r.members().to_vec())
    }

    /// The status of the member serving at `endpoint` (learners answer this too). One attempt, no rotation:
    /// the point is to hear from that member.
    pub async fn status_of(&self, endpoint: &str) -> Result<StatusResponse, EtcdError> {
        let mut client = self.endpoint_client(endpoint).await?;
        self.attempt_at(endpoint, "status", client.status()).await
    }

    /// The status of every listed endpoint, asked concurrently.
    pub async fn status_all(&self) -> Vec<(String, Result<StatusResponse, EtcdError>)> {
        let endpoints = self.endpoints();
        let results = futures::future::join_all(endpoints.iter().map(|e| self.status_of(e))).await;
        endpoints.into_iter().zip(results).collect()
    }

    /// Hands leadership to `target`. The request must reach the current leader, so this finds it first
    /// among the members' client URLs.
    pub async fn move_leader(&self, target: u64) -> Result<(), EtcdError> {
        let members = self.member_list().await?;
        let urls: Vec<String> = members
            .iter()
            .filter(|m| !m.is_learner())
            .filter_map(|m| m.client_urls().first().cloned())
            .collect();
        let statuses = futures::future::join_all(urls.iter().map(|u| self.status_of(u))).await;
        let leader = statuses
            .iter()
            .flatten()
            .map(|s| s.leader())
            .find(|l| *l != 0)
            .ok_or(EtcdError::NoLeader)?;
        if leader == target {
            return Ok(());
        }
        let leader_url = members
            .iter()
            .find(|m| m.id() == leader)
            .and_then(|m| m.client_urls().first().cloned())
            .ok_or(EtcdError::NoLeader)?;
        let mut client = self.endpoint_client(&leader_url).await?;
        let request = self.attempt_at(&leader_url, "move leader", client.move_leader(target));
        // etcd answers only at a tick after the move (100 ms by default); the old leader's own status,
        // the figure etcd itself waits on, says so sooner.
        let moved = async {
            loop {
                tokio::time::sleep(MOVE_LEADER_LOOK).await;
                if self
                    .status_of(&leader_url)
                    .await
                    .is_ok_and(|s| s.leader() == target)
                {
                    return;
                }
            }
        };
        tokio::select! {
            result = request => result.map(|_| ()),
            () = moved => Ok(()),
        }
    }
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&str> = a.iter().map(|s| s.trim_end_matches('/')).collect();
    let mut b: Vec<&str> = b.iter().map(|s| s.trim_end_matches('/')).collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}
