//! What the snapshot controller ([`super::controller`]) reads and does, behind [`SnapshotEffects`]: the
//! real one is the [`SnapshotScheduler`] (the local member's stream, the files, the records, object
//! storage, the request key in etcd); [`super::fake`] holds the controller's tests.

use std::future::Future;
use std::time::{Duration, SystemTime};

use hostlet_api::objects::{SnapshotRecord, SnapshotRequest};
use hostlet_runtime::etcd::EtcdError;

use super::policy::{EffectivePolicy, PolicyStore};
use super::remote::RemoteError;
use super::request::TakeProgress;
use super::scheduler::{SnapshotError, SnapshotScheduler};
use super::sync::SyncError;
use crate::events::EventKind;

/// The snapshot controller's world.
pub trait SnapshotEffects: Send + Sync + 'static {
    /// This node's name (its request key, its schedule offset).
    fn node(&self) -> &str;
    /// This node's request key.
    fn request_key(&self) -> String;
    /// The most a node's scheduled snapshots are shifted from the schedule's times.
    fn jitter(&self) -> Duration;
    fn now(&self) -> SystemTime;
    /// The policy in force.
    fn policy(&self) -> EffectivePolicy;
    /// Recomputes the policy in force from the two policy keys (a value that does not parse is reported
    /// and left out); true when it changed.
    fn refresh_policy(
        &self,
        cluster: &PolicyStore,
        node: &PolicyStore,
    ) -> impl Future<Output = bool> + Send;
    /// Makes files and records agree.
    fn reconcile_catalogue(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Counts the objects in the bucket; `None` without one.
    fn count_remote(&self) -> impl Future<Output = Result<Option<usize>, RemoteError>> + Send;
    /// Takes one snapshot now, then its object-storage pass and retention.
    fn take(
        &self,
        name: &str,
        on_demand: bool,
        progress: impl FnMut(TakeProgress) + Send,
    ) -> impl Future<Output = Result<SnapshotRecord, SnapshotError>> + Send;
    /// One object-storage pass.
    fn sync_remote(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
    ) -> impl Future<Output = Result<Vec<String>, SyncError>> + Send;
    /// Local retention.
    fn prune(&self, retention: u32) -> impl Future<Output = Result<Vec<String>, EtcdError>> + Send;
    /// Writes the request key.
    fn write_request(
        &self,
        req: &SnapshotRequest,
    ) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Deletes the request key.
    fn delete_request(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Counts a snapshot outcome the controller decided itself (`refused`, an interrupted `failure`).
    fn count(&self, result: &'static str);
    /// Records an event on this node.
    fn event(
        &self,
        kind: EventKind,
        reason: &'static str,
        message: String,
    ) -> impl Future<Output = ()> + Send;
}

impl SnapshotEffects for SnapshotScheduler {
    fn node(&self) -> &str {
        &self.settings.node
    }

    fn request_key(&self) -> String {
        self.settings.keys.snapshot_request(&self.settings.node)
    }

    fn jitter(&self) -> Duration {
        self.settings.jitter
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn policy(&self) -> EffectivePolicy {
        SnapshotScheduler::policy(self)
    }

    async fn refresh_policy(&self, cluster: &PolicyStore, node: &PolicyStore) -> bool {
        SnapshotScheduler::refresh_policy(self, cluster, node).await
    }

    async fn reconcile_catalogue(&self) -> Result<(), EtcdError> {
        SnapshotScheduler::reconcile_catalogue(self).await
    }

    async fn count_remote(&self) -> Result<Option<usize>, RemoteError> {
        SnapshotScheduler::count_remote(self).await
    }

    async fn take(
        &self,
        name: &str,
        on_demand: bool,
        progress: impl FnMut(TakeProgress) + Send,
    ) -> Result<SnapshotRecord, SnapshotError> {
        SnapshotScheduler::take(self, name, on_demand, progress).await
    }

    async fn sync_remote(
        &self,
        policy: &EffectivePolicy,
        upload: bool,
    ) -> Result<Vec<String>, SyncError> {
        SnapshotScheduler::sync_remote(self, policy, upload).await
    }

    async fn prune(&self, retention: u32) -> Result<Vec<String>, EtcdError> {
        SnapshotScheduler::prune(self, retention).await
    }

    async fn write_request(&self, req: &SnapshotRequest) -> Result<(), EtcdError> {
        self.etcd
            .put(
                &self.request_key(),
                serde_json::to_vec(req).unwrap_or_default(),
            )
            .await
            .map(|_| ())
    }

    async fn delete_request(&self) -> Result<(), EtcdError> {
        self.etcd.delete(&self.request_key()).await.map(|_| ())
    }

    fn count(&self, result: &'static str) {
        self.metrics.total.with_label_values(&[result]).inc();
    }

    async fn event(&self, kind: EventKind, reason: &'static str, message: String) {
        self.events.node_event(kind, reason, message).await
    }
}
