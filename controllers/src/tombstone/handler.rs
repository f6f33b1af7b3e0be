//! At run time: notice that this node's member was removed from the cluster, or that an operator asked
//! for a rejoin (`/hostlet/hosts/<node>/requests/tombstone`), and say why. The agent then writes the
//! tombstone, stops cleanly and starts again as a joiner (the start backs the member dir up).

use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, Members, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::standing::{self, Identity, Standing};

/// How often the other members are asked directly when nothing prompts it sooner (a member left behind
/// may still answer for itself with a stale member list).
const ASK_PEERS_EVERY: Duration = Duration::from_secs(120);
/// Least time between two rounds of asking the other members, whatever prompts them.
const ASK_PEERS_GAP: Duration = Duration::from_secs(10);
/// Between two looks or asks that must agree before a removal is believed.
const CONFIRM_AFTER: Duration = Duration::from_secs(1);
/// How long the confirming look at the members may take.
const FRESH_LOOK: Duration = Duration::from_secs(10);

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

/// What the other members said of this one, in one round of asking.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PeersSay {
    /// Serving members that do not list this one.
    Removed {
        by: String,
    },
    /// A member of this cluster serves a cluster made anew without this one.
    MadeAnew {
        by: String,
    },
    Nothing,
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
    /// The agent's shared member cache.
    pub members: Members,
    /// This node's tombstone request key, through the agent's shared cache.
    pub request: Store<String, Object<String>>,
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

    /// Whether the cached members, which hold some, leave this one out.
    fn left_out_of_cache(&self) -> bool {
        let store = self.members.store();
        store.is_ready()
            && !store.is_empty()
            && !store.state().iter().any(|m| self.me.is(m.id, &m.name))
    }

    /// Whether a member's last status names another cluster than the local member's: a sign of a reset
    /// elsewhere, worth asking the others about now.
    fn another_cluster_in_sight(&self) -> bool {
        let statuses = self.members.statuses();
        let Some(own) = statuses.local().map(|s| s.cluster_id).filter(|c| *c != 0) else {
            return false;
        };
        statuses
            .of
            .values()
            .flatten()
            .any(|s| s.cluster_id != 0 && s.cluster_id != own)
    }

    /// The cache left this member out: believed only when a fresh look a moment later agrees (the first
    /// may have come from a member still catching up). A look that fails proves nothing.
    async fn removed_from_list(&self) -> Option<RejoinCause> {
        if !self.left_out_of_cache() {
            return None;
        }
        tokio::time::sleep(CONFIRM_AFTER).await;
        if !self.members.refresh(FRESH_LOOK).await || !self.left_out_of_cache() {
            return None;
        }
        Some(RejoinCause::new(format!(
            "member {:x} was removed from the cluster",
            self.me.id
        )))
    }

    /// One round of asking the other members.
    async fn ask_peers(&self) -> PeersSay {
        let answers = standing::ask_all(&self.etcd, &self.peers(), &self.me).await;
        let own_cluster = self
            .members
            .statuses()
            .local()
            .map(|s| s.cluster_id)
            .unwrap_or(0);
        match (
            standing::judge(&answers),
            standing::judge_from_inside(&answers, own_cluster),
        ) {
            (Standing::Removed { by }, _) => PeersSay::Removed { by },
            (_, Standing::Removed { by }) => PeersSay::MadeAnew { by },
            _ => PeersSay::Nothing,
        }
    }

    /// Two rounds a moment apart that say the same: what the other members say of this one.
    async fn peers_say(&self) -> Option<RejoinCause> {
        let first = self.ask_peers().await;
        if first == PeersSay::Nothing {
            return None;
        }
        tokio::time::sleep(CONFIRM_AFTER).await;
        let second = self.ask_peers().await;
        match (first, second) {
            (PeersSay::Removed { .. }, PeersSay::Removed { by }) => Some(RejoinCause {
                reason: format!(
                    "the cluster serving at {by} no longer has member {:x}",
                    self.me.id
                ),
                by: Some(by),
            }),
            (PeersSay::MadeAnew { .. }, PeersSay::MadeAnew { by }) => Some(RejoinCause {
                reason: format!(
                    "the member at {by} serves a cluster made anew (another cluster id) \
                     without member {:x}: this member's cluster was left behind",
                    self.me.id
                ),
                by: Some(by),
            }),
            _ => None,
        }
    }

    /// Waits until this member must rejoin; returns why, or `None` on shutdown.
    ///
    /// Driven by the shared caches: the request key (a watch), and the member cache's looks. Removal is
    /// only believed from two looks that agree, and the other members' answers likewise from two rounds
    /// (serving members that do not list this one, or one of this cluster serving a cluster made anew);
    /// those are asked when a member's status shows another cluster, and every [`ASK_PEERS_EVERY`]
    /// besides. Silence never counts.
    pub async fn wait(&self, shutdown: CancellationToken) -> Option<RejoinCause> {
        let request_key = self.keys.tombstone_request(&self.node);
        let mut requests = self.request.subscribe();
        let mut identity = self.members.store().subscribe();
        let mut statuses = self.members.watch_statuses();
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = self.request.wait_until_ready() => {}
        }
        let mut next_ask = Instant::now() + ASK_PEERS_EVERY;
        let mut last_ask: Option<Instant> = None;
        loop {
            if !self.request.is_empty() {
                let _ = self.etcd.delete(&request_key).await;
                return Some(RejoinCause::new(format!(
                    "asked to rejoin through {request_key}"
                )));
            }
            if let Some(cause) = self.removed_from_list().await {
                return Some(cause);
            }
            let rested_at = last_ask.map(|t| t + ASK_PEERS_GAP);
            let rested = rested_at.is_none_or(|t| Instant::now() >= t);
            let prompted = self.another_cluster_in_sight();
            if rested && (prompted || Instant::now() >= next_ask) {
                last_ask = Some(Instant::now());
                next_ask = Instant::now() + ASK_PEERS_EVERY;
                if let Some(cause) = self.peers_say().await {
                    return Some(cause);
                }
            }
            // Prompted but asked only just now: again once the gap has passed.
            let wake = match rested_at {
                Some(t) if prompted && !rested => t.min(next_ask),
                _ => next_ask,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = self.removed.cancelled() => {
                    return Some(RejoinCause {
                        reason: "etcd exited saying the cluster removed this member".to_string(),
                        by: self.moved_on().await,
                    })
                }
                Some(_) = requests.next_batch() => {}
                Some(_) = identity.next_batch() => {}
                Ok(_) = statuses.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
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
