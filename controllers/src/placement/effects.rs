//! What voter placement does to the cluster, behind [`VoterChanges`]: the real one on etcd, and
//! [`super::fake`] for the controller's tests.

use std::future::Future;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::objects::MemberRequest;
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError};

use crate::events::{EventKind, EventRecorder};

/// Placement's writes. Everything it reads comes from the shared caches.
pub trait VoterChanges: Send + Sync + 'static {
    /// Writes the request to the worker's key and to the leader's record, both or neither, and only while no
    /// other request is pending; false when one is.
    fn request_join(
        &self,
        request: &MemberRequest,
    ) -> impl Future<Output = Result<bool, EtcdError>> + Send;
    /// Withdraws the request to `node` (its key and the record).
    fn cancel_request(&self, node: &str) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Hands leadership to voter `to`.
    fn move_leader(&self, to: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn remove_member(&self, id: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Records an event on this node without waiting for it to be written.
    fn event(&self, kind: EventKind, reason: &'static str, message: String);
}

/// [`VoterChanges`] on etcd.
pub struct EtcdVoterChanges {
    pub etcd: Etcd,
    pub keys: KeyLayout,
    pub events: EventRecorder,
}

impl VoterChanges for EtcdVoterChanges {
    async fn request_join(&self, request: &MemberRequest) -> Result<bool, EtcdError> {
        let value = serde_json::to_vec(request).unwrap_or_default();
        let record = self.keys.member_request_record();
        let txn = Txn::new()
            .when([Compare::version(record.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(record.as_str(), value.clone(), None),
                TxnOp::put(self.keys.member_request(&request.node), value, None),
            ]);
        Ok(self.etcd.txn(txn).await?.succeeded())
    }

    async fn cancel_request(&self, node: &str) -> Result<(), EtcdError> {
        let txn = Txn::new().and_then([
            TxnOp::delete(self.keys.member_request_record(), None),
            TxnOp::delete(self.keys.member_request(node), None),
        ]);
        self.etcd.txn(txn).await?;
        Ok(())
    }

    async fn move_leader(&self, to: u64) -> Result<(), EtcdError> {
        self.etcd.move_leader(to).await
    }

    async fn remove_member(&self, id: u64) -> Result<(), EtcdError> {
        self.etcd.member_remove(id).await.map(|_| ())
    }

    fn event(&self, kind: EventKind, reason: &'static str, message: String) {
        let events = self.events.clone();
        tokio::spawn(async move { events.node_event(kind, reason, message).await });
    }
}
