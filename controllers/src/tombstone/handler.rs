//! At run time: what the rejoin controller ([`super::controller`]) looks at to notice that this node's
//! member was removed from the cluster, or that an operator asked for a rejoin
//! (`/hostlet/hosts/<node>/requests/tombstone`), and say why. The agent then writes the tombstone, stops
//! cleanly and starts again as a joiner (the start backs the member dir up).

use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::members::Statuses;
use hostlet_runtime::{Etcd, Members, Store};
use tokio_util::sync::CancellationToken;

use super::standing::{self, Identity, Standing};

/// How long the confirming look at the members may take.
pub(super) const FRESH_LOOK: Duration = Duration::from_secs(10);

/// Why this member must rejoin, and which member told (when one did): the rejoin goes through that
/// member's cluster, not through one left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinCause {
    pub reason: String,
    /// The client URL of a member of the cluster that moved on without this one.
    pub by: Option<String>,
}

impl RejoinCause {
    pub(super) fn new(reason: impl Into<String>) -> Self {
        RejoinCause {
            reason: reason.into(),
            by: None,
        }
    }
}

/// What the other members said of this one, in one round of asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeersSay {
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

/// Two rounds of asking a moment apart: a cause only when both say the same thing. Anything else (one
/// round silent, the two differing) proves nothing.
pub(super) fn confirmed_by_peers(
    first: &PeersSay,
    second: PeersSay,
    member_id: u64,
) -> Option<RejoinCause> {
    match (first, second) {
        (PeersSay::Removed { .. }, PeersSay::Removed { by }) => Some(RejoinCause {
            reason: format!("the cluster serving at {by} no longer has member {member_id:x}"),
            by: Some(by),
        }),
        (PeersSay::MadeAnew { .. }, PeersSay::MadeAnew { by }) => Some(RejoinCause {
            reason: format!(
                "the member at {by} serves a cluster made anew (another cluster id) \
                 without member {member_id:x}: this member's cluster was left behind"
            ),
            by: Some(by),
        }),
        _ => None,
    }
}

/// Whether a member's last status names another cluster than the local member's: a sign of a reset
/// elsewhere, worth asking the others about now.
pub(super) fn another_cluster(statuses: &Statuses) -> bool {
    let Some(own) = statuses.local().map(|s| s.cluster_id).filter(|c| *c != 0) else {
        return false;
    };
    statuses
        .of
        .values()
        .flatten()
        .any(|s| s.cluster_id != 0 && s.cluster_id != own)
}

/// What the rejoin controller looks at.
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
    pub(super) async fn moved_on(&self) -> Option<String> {
        standing::ask_all(&self.etcd, &self.peers(), &self.me)
            .await
            .into_iter()
            .find(|a| a.has_leader && !a.lists_us)
            .map(|a| a.endpoint)
    }

    /// Whether the cached members, which hold some, leave this one out.
    pub(super) fn left_out_of_cache(&self) -> bool {
        let store = self.members.store();
        store.is_ready()
            && !store.is_empty()
            && !store.state().iter().any(|m| self.me.is(m.id, &m.name))
    }

    pub(super) fn another_cluster_in_sight(&self) -> bool {
        another_cluster(&self.members.statuses())
    }

    /// The cache left this member out a moment ago: believed only when a fresh look now agrees (the
    /// first may have come from a member still catching up). A look that fails proves nothing.
    pub(super) async fn confirm_removed_from_list(&self) -> Option<RejoinCause> {
        if !self.members.refresh(FRESH_LOOK).await || !self.left_out_of_cache() {
            return None;
        }
        Some(RejoinCause::new(format!(
            "member {:x} was removed from the cluster",
            self.me.id
        )))
    }

    /// One round of asking the other members.
    pub(super) async fn ask_peers(&self) -> PeersSay {
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

    /// A rejoin asked for through the request key, which is deleted so it is not taken up twice.
    pub(super) async fn requested(&self) -> Option<RejoinCause> {
        if self.request.is_empty() {
            return None;
        }
        let request_key = self.keys.tombstone_request(&self.node);
        Some(RejoinCause::new(format!(
            "asked to rejoin through {request_key}"
        )))
    }

    /// Once the rejoin is prepared: the request key goes, so that the agent started again does not
    /// rejoin a second time. Tried a few times; a key left behind costs one more rejoin, never a loss.
    pub(super) async fn clear_request(&self) {
        if self.request.is_empty() {
            return;
        }
        let request_key = self.keys.tombstone_request(&self.node);
        for _ in 0..5 {
            match self.etcd.delete(&request_key).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, key = %request_key, "cannot delete the rejoin request yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The supervisor saw etcd exit saying the cluster removed this member.
    pub(super) async fn removed_by_etcd(&self) -> Option<RejoinCause> {
        if !self.removed.is_cancelled() {
            return None;
        }
        Some(RejoinCause {
            reason: "etcd exited saying the cluster removed this member".to_string(),
            by: self.moved_on().await,
        })
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
            role: None,
            failure_domain: None,
            member_since: None,
            cert_expires: None,
            cert_serials: Vec::new(),
            labels: Default::default(),
            images: Default::default(),
        }
    }

    #[test]
    fn only_two_rounds_that_agree_are_believed() {
        let removed = |by: &str| PeersSay::Removed { by: by.into() };
        let anew = |by: &str| PeersSay::MadeAnew { by: by.into() };
        let cases = [
            (removed("a"), removed("b"), Some("b")),
            (anew("a"), anew("a"), Some("a")),
            (removed("a"), PeersSay::Nothing, None),
            (anew("a"), PeersSay::Nothing, None),
            (removed("a"), anew("a"), None),
            (anew("a"), removed("a"), None),
            (PeersSay::Nothing, removed("a"), None),
            (PeersSay::Nothing, PeersSay::Nothing, None),
        ];
        for (first, second, by) in cases {
            let what = format!("{first:?} then {second:?}");
            let cause = confirmed_by_peers(&first, second, 0xab);
            assert_eq!(cause.as_ref().and_then(|c| c.by.as_deref()), by, "{what}");
            if let Some(c) = cause {
                assert!(c.reason.contains("member ab"), "{what}: {}", c.reason);
            }
        }
    }

    #[test]
    fn another_cluster_is_seen_only_beside_a_known_own_one() {
        use hostlet_runtime::MemberStatus;
        let status = |cluster_id| MemberStatus {
            version: "3.5".into(),
            db_size: 0,
            db_size_in_use: 0,
            leader: 1,
            raft_term: 1,
            raft_index: 1,
            raft_applied_index: 1,
            is_learner: false,
            errors: Vec::new(),
            cluster_id,
            revision: 1,
        };
        let statuses =
            |local: Option<u64>, of: Vec<(u64, Result<MemberStatus, String>)>| Statuses {
                of: of.into_iter().collect(),
                local_id: local,
            };
        let cases = [
            (
                "all one cluster",
                statuses(Some(1), vec![(1, Ok(status(7))), (2, Ok(status(7)))]),
                false,
            ),
            (
                "a member serving another",
                statuses(Some(1), vec![(1, Ok(status(7))), (2, Ok(status(8)))]),
                true,
            ),
            (
                "own cluster unknown",
                statuses(None, vec![(1, Ok(status(7))), (2, Ok(status(8)))]),
                false,
            ),
            (
                "own cluster 0",
                statuses(Some(1), vec![(1, Ok(status(0))), (2, Ok(status(8)))]),
                false,
            ),
            (
                "silent members say nothing",
                statuses(
                    Some(1),
                    vec![(1, Ok(status(7))), (2, Err("timeout".into()))],
                ),
                false,
            ),
        ];
        for (what, s, want) in cases {
            assert_eq!(another_cluster(&s), want, "{what}");
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
