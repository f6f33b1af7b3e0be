//! The rejoin itself: once the rejoin controller ([`super::controller`]) has found that this member must
//! rejoin, leave the cluster (when still in it), write the tombstone, say so in events, and hand back where
//! to join. The agent then stops cleanly
//! and starts again as a joiner; the start backs the member dir up.

use std::path::PathBuf;

use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, TlsFiles};

use super::handler::{leave_cluster, rejoin_server, RejoinCause};
use super::{datadir, standing};
use crate::events::{EventKind, EventRecorder};

/// Where the agent joins again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinTarget {
    /// The API URL of a node of the cluster to join.
    pub server: String,
    pub token: String,
}

/// What the rejoin needs besides what it watches.
pub struct Rejoin {
    pub etcd: Etcd,
    pub keys: KeyLayout,
    pub node: String,
    pub events: EventRecorder,
    /// The local member's id (hex in events).
    pub member_id: u64,
    /// `--server` and `--token`, when given.
    pub server: Option<String>,
    pub token: Option<String>,
    /// The member dir the tombstone goes into, and the token file written at the first start.
    pub member_dir: PathBuf,
    pub token_file: PathBuf,
    /// The client certificate, to ask a member of the cluster that moved on (`None`: plain HTTP).
    pub peer_tls: Option<TlsFiles>,
}

impl Rejoin {
    /// Prepares the rejoin `cause` calls for; `Some` when the agent should stop and join `server`. `None`
    /// when it cannot rejoin by itself (said in an event).
    pub async fn perform(&self, cause: RejoinCause) -> Option<RejoinTarget> {
        let reason = cause.reason;
        // Through the cluster that moved on when a member of it told; then --server; then the node
        // records of this member's own cluster.
        let mut through = None;
        if let Some(by) = &cause.by {
            if let Some(peer) =
                standing::peer_client(std::slice::from_ref(by), self.peer_tls.clone()).await
            {
                through = rejoin_server(&peer, &self.keys, &self.node).await;
            }
        }
        let server = match through.or(self.server.clone()) {
            Some(s) => Some(s),
            None => rejoin_server(&self.etcd, &self.keys, &self.node).await,
        };
        // The token the node keeps first: its joins replace it (a member keeps the server token, which the
        // token it was started with may not be).
        let token = std::fs::read_to_string(&self.token_file)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .or_else(|| self.token.clone());
        let (Some(server), Some(token)) = (server, token) else {
            self.events
                .node_event(
                    EventKind::Warning,
                    "MemberRemoved",
                    format!("{reason}; cannot rejoin by itself: no other node's API URL is known; restart with --server and --token"),
                )
                .await;
            return None;
        };
        // Asked to rejoin while still a member: leave the cluster first, so the join can add us anew.
        // Should that fail, the rejoin goes on all the same: the join replaces this node's old member.
        if let Err(e) = leave_cluster(&self.etcd, self.member_id).await {
            self.events
                .node_event(
                    EventKind::Warning,
                    "LeaveFailed",
                    format!("{reason}; cannot leave the cluster first ({e}); the join will replace the old member"),
                )
                .await;
        }
        if let Err(e) = datadir::write_tombstone(&self.member_dir, &reason) {
            tracing::error!(error = %e, "cannot write the tombstone");
            return None;
        }
        self.events
            .node_event(
                EventKind::Warning,
                "Tombstone",
                format!(
                    "{reason}: member data will be backed up and the node rejoins through {server}"
                ),
            )
            .await;
        tracing::warn!(%reason, %server, "this member must rejoin: stopping, backing up and joining again");
        Some(RejoinTarget { server, token })
    }
}
