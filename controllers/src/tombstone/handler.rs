//! At run time: notice that this node's member was removed from the cluster, or that an operator asked
//! for a rejoin (`/hostlet/hosts/<node>/requests/tombstone`), and say why. The agent then writes the
//! tombstone, stops cleanly and starts again as a joiner (the start backs the member dir up).

use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::Etcd;
use tokio_util::sync::CancellationToken;

use super::standing::{self, Identity, Standing};

/// How often membership and the request key are checked.
pub const CHECK_PERIOD: Duration = Duration::from_secs(1);
/// Every this many checks the other members are asked directly (a member left behind may still answer
/// for itself with a stale member list).
const ASK_PEERS_EVERY: u32 = 5;

/// Why this member must rejoin, and which member told (when one did): the rejoin goes through that
/// member's cluster, not through one left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinCause {
    pub reason: String,
    /// The client URL of a member of the cluster that moved on without this one.
    pub by: Option<String>,
}

impl RejoinCause {
    fn new(reason: impl Into<String>) -> Self {
        RejoinCause {
            reason: reason.into(),
            by: None,
        }
    }
}

/// What the rejoin watch looks at.
pub struct RejoinWatch {
    pub etcd: Etcd,
    pub keys: KeyLayout,
    pub node: String,
    pub me: Identity,
    /// The local member's client URL (not asked about itself).
    pub local_url: String,
    /// Fired by the supervisor when etcd exited saying the cluster removed this member.
    pub removed: CancellationToken,
}

impl RejoinWatch {
    /// The other members of this cluster, as the agent's client knows them.
    fn peers(&self) -> Vec<String> {
        self.etcd
            .endpoints()
            .into_iter()
            .filter(|e| *e != self.local_url)
            .collect()
    }

    /// A member that serves a cluster without this one: where the cluster that removed it lives (after a
    /// reset elsewhere, the members left behind may still hold the old cluster).
    async fn moved_on(&self) -> Option<String> {
        standing::ask_all(&self.etcd, &self.peers(), &self.me)
            .await
            .into_iter()
            .find(|a| a.has_leader && !a.lists_us)
            .map(|a| a.endpoint)
    }

    /// Waits until this member must rejoin; returns why, or `None` on shutdown.
    ///
    /// Removal is only believed from a member list that answered and does not hold this member twice in
    /// a row, so a transient answer from a member that is still catching up cannot trigger it; the other
    /// members' answers likewise (serving members that do not list this one, or one of this cluster
    /// serving a cluster made anew) are believed when two asks in a row say so. Silence never counts.
    pub async fn wait(&self, shutdown: CancellationToken) -> Option<RejoinCause> {
        let request = self.keys.tombstone_request(&self.node);
        let mut missing = 0;
        let mut made_anew = 0;
        let mut removed = 0;
        let mut round = 0u32;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = self.removed.cancelled() => {
                    return Some(RejoinCause {
                        reason: "etcd exited saying the cluster removed this member".to_string(),
                        by: self.moved_on().await,
                    })
                }
                _ = tokio::time::sleep(CHECK_PERIOD) => {}
            }
            round = round.wrapping_add(1);
            if let Ok(Some(_)) = self.etcd.get(&request).await {
                let _ = self.etcd.delete(&request).await;
                return Some(RejoinCause::new(format!(
                    "asked to rejoin through {request}"
                )));
            }
            match self.etcd.member_list().await {
                Ok(members)
                    if !members.is_empty()
                        && !members.iter().any(|m| self.me.is(m.id(), m.name())) =>
                {
                    missing += 1;
                    if missing >= 2 {
                        return Some(RejoinCause::new(format!(
                            "member {:x} was removed from the cluster",
                            self.me.id
                        )));
                    }
                }
                _ => missing = 0,
            }
            if round % ASK_PEERS_EVERY == 0 {
                let answers = standing::ask_all(&self.etcd, &self.peers(), &self.me).await;
                let own_cluster = match self.etcd.status_of(&self.local_url).await {
                    Ok(s) => s.header().map(|h| h.cluster_id()).unwrap_or(0),
                    Err(_) => 0,
                };
                match (
                    standing::judge(&answers),
                    standing::judge_from_inside(&answers, own_cluster),
                ) {
                    (Standing::Removed { by }, _) => {
                        made_anew = 0;
                        removed += 1;
                        if removed >= 2 {
                            return Some(RejoinCause {
                                reason: format!(
                                    "the cluster serving at {by} no longer has member {:x}",
                                    self.me.id
                                ),
                                by: Some(by),
                            });
                        }
                    }
                    (_, Standing::Removed { by }) => {
                        removed = 0;
                        made_anew += 1;
                        if made_anew >= 2 {
                            return Some(RejoinCause {
                                reason: format!(
                                    "the member at {by} serves a cluster made anew (another cluster id) \
                                     without member {:x}: this member's cluster was left behind",
                                    self.me.id
                                ),
                                by: Some(by),
                            });
                        }
                    }
                    _ => {
                        removed = 0;
                        made_anew = 0;
                    }
                }
            }
        }
    }
}

/// How long [`leave_cluster`] keeps trying.
const LEAVE_TRIES: u32 = 30;

/// Removes this node's member from the cluster before it rejoins. A member that is gone already counts as
/// left: the list that said it was still there may have come from this member itself, which is the last
/// to learn of its removal. etcd refuses removals for a few seconds after a member (re)connects
/// ("unhealthy cluster"): those are retried, a second apart.
pub async fn leave_cluster(etcd: &Etcd, member_id: u64) -> Result<(), hostlet_runtime::EtcdError> {
    let mut tries = 0;
    loop {
        match etcd.member_remove(member_id).await {
            Ok(_) => {
                tracing::info!(id = %format!("{member_id:x}"), "left the cluster");
                return Ok(());
            }
            Err(e) if is_gone(&e) => return Ok(()),
            Err(e)
                if tries < LEAVE_TRIES && crate::etcd_member::bootstrap::add_is_retryable(&e) =>
            {
                tries += 1;
                tracing::debug!(error = %e, "cannot leave the cluster yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_gone(e: &hostlet_runtime::EtcdError) -> bool {
    e.server_message()
        .is_some_and(|m| m.contains("member not found") || m.contains("member removed"))
}

/// Another node's API URL to rejoin through, from the node records: a node whose member is a voter that
/// has started comes first (it can admit a joiner), then any other node.
pub async fn rejoin_server(etcd: &Etcd, keys: &KeyLayout, node: &str) -> Option<String> {
    let (kvs, _) = etcd.get_prefix(keys.nodes_prefix()).await.ok()?;
    let voters: Vec<String> = etcd
        .member_list()
        .await
        .map(|ms| {
            ms.iter()
                .filter(|m| !m.is_learner() && !m.name().is_empty())
                .map(|m| m.name().to_string())
                .collect()
        })
        .unwrap_or_default();
    let records: Vec<NodeInfo> = kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .filter(|n| n.name != node && n.api_url.is_some())
        .collect();
    pick_server(&records, &voters)
}

/// The choice of [`rejoin_server`], on plain data.
fn pick_server(records: &[NodeInfo], voters: &[String]) -> Option<String> {
    let is_voter = |n: &&NodeInfo| {
        n.member_name
            .as_ref()
            .is_some_and(|name| voters.contains(name))
    };
    records
        .iter()
        .find(is_voter)
        .or_else(|| records.first())
        .and_then(|n| n.api_url.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlet_api::objects::Timestamp;

    fn record(name: &str, member: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            address: "127.0.0.1".into(),
            member_name: Some(member.into()),
            member_id: None,
            peer_url: None,
            client_url: None,
            api_url: Some(format!("https://{name}:10250")),
            version: "0".into(),
            started: Timestamp::now(),
        }
    }

    #[test]
    fn a_node_whose_member_votes_is_preferred() {
        let records = vec![record("n2", "n2-old"), record("n1", "n1-a")];
        assert_eq!(
            pick_server(&records, &["n1-a".to_string()]).as_deref(),
            Some("https://n1:10250")
        );
        assert_eq!(
            pick_server(&records, &[]).as_deref(),
            Some("https://n2:10250"),
            "without a voter among them, any node"
        );
        assert_eq!(pick_server(&[], &["n1-a".to_string()]), None);
    }
}
