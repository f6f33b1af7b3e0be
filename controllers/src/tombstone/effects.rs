//! What the rejoin controller reads and does, behind [`RejoinEffects`]: the real one on etcd, the shared
//! member cache and the data dir ([`EtcdRejoin`]), and [`super::fake`] for the controller's tests.

use std::future::Future;

use futures::{Stream, StreamExt};
use hostlet_runtime::informer::Object;
use hostlet_runtime::Store;

use super::handler::{another_cluster, PeersSay, RejoinCause, RejoinWatch};
use super::rejoin::{Rejoin, RejoinTarget};

/// The rejoin controller's view of the world and its one act.
pub trait RejoinEffects: Send + Sync + 'static {
    /// The local member's id.
    fn member_id(&self) -> u64;
    /// This node's tombstone request key, through the shared cache: the one store the controller waits
    /// for before its first reconcile.
    fn request_store(&self) -> Store<String, Object<String>>;
    /// Yields when something the decision reads may have changed (besides the request key): the member
    /// cache's members, a status naming another cluster, the supervisor's signal.
    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static;
    /// A rejoin asked for through the request key.
    fn requested(&self) -> impl Future<Output = Option<RejoinCause>> + Send;
    /// The supervisor saw etcd exit saying the cluster removed this member.
    fn removed_by_etcd(&self) -> impl Future<Output = Option<RejoinCause>> + Send;
    /// The member cache, which holds some members, leaves this one out.
    fn left_out_of_cache(&self) -> bool;
    /// A member's last status names another cluster than the local member's.
    fn another_cluster_in_sight(&self) -> bool;
    /// A fresh look at the members agrees that this one is left out; a look that fails proves nothing.
    fn confirm_removed_from_list(&self) -> impl Future<Output = Option<RejoinCause>> + Send;
    /// One round of asking the other members.
    fn ask_peers(&self) -> impl Future<Output = PeersSay> + Send;
    /// Leaves the cluster, writes the tombstone and says so; where to join, or `None` when it cannot
    /// rejoin by itself yet.
    fn perform(&self, cause: RejoinCause) -> impl Future<Output = Option<RejoinTarget>> + Send;
    /// Deletes the request key once the rejoin is prepared.
    fn clear_request(&self) -> impl Future<Output = ()> + Send;
}

/// [`RejoinEffects`] on etcd, the agent's caches and the data dir.
pub struct EtcdRejoin {
    pub watch: RejoinWatch,
    pub rejoin: Rejoin,
}

impl RejoinEffects for EtcdRejoin {
    fn member_id(&self) -> u64 {
        self.watch.me.id
    }

    fn request_store(&self) -> Store<String, Object<String>> {
        self.watch.request.clone()
    }

    fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let members = self.watch.members.clone();
        // The member store is a trigger but no gate: the supervisor's signal must be taken up even when
        // the cache has not looked yet.
        let identity = futures::stream::unfold(members.store().subscribe(), |mut c| async move {
            c.next_batch().await.map(|_| ((), c))
        });
        let statuses = futures::stream::unfold(members.watch_statuses(), |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if another_cluster(&rx.borrow_and_update()) {
                    return Some(((), rx));
                }
            }
        });
        let removed = self.watch.removed.clone();
        let removed = futures::stream::once(async move { removed.cancelled_owned().await });
        futures::stream::select(identity, futures::stream::select(statuses, removed)).boxed()
    }

    async fn requested(&self) -> Option<RejoinCause> {
        self.watch.requested().await
    }

    async fn removed_by_etcd(&self) -> Option<RejoinCause> {
        self.watch.removed_by_etcd().await
    }

    fn left_out_of_cache(&self) -> bool {
        self.watch.left_out_of_cache()
    }

    fn another_cluster_in_sight(&self) -> bool {
        self.watch.another_cluster_in_sight()
    }

    async fn confirm_removed_from_list(&self) -> Option<RejoinCause> {
        self.watch.confirm_removed_from_list().await
    }

    async fn ask_peers(&self) -> PeersSay {
        self.watch.ask_peers().await
    }

    async fn perform(&self, cause: RejoinCause) -> Option<RejoinTarget> {
        self.rejoin.perform(cause).await
    }

    async fn clear_request(&self) {
        self.watch.clear_request().await
    }
}
