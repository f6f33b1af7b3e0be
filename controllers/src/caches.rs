//! The agent's shared caches, built once per agent by [`Caches::start`]: each has one writer, and every
//! controller that needs one gets a reader clone. Nothing else in the agent asks etcd for what these
//! hold.
//!
//! - `members`: the etcd members (identity apart from status; leadership as its own watchable value),
//!   the one place that polls etcd's membership (etcd cannot watch it): slowly while nothing changes,
//!   fast while a learner exists or a membership change is under way;
//! - `nodes`: the node records (`/hostlet/nodes/`);
//! - `learner_progress`: the learner progress record. The node that adds a learner writes it, so its
//!   changes tell every agent's member cache to look now rather than at its next slow look;
//! - `tombstone_request`: this node's rejoin request key (`/hostlet/hosts/<node>/requests/tombstone`);
//! - `snapshot_policy`, `snapshot_node_policy`, `snapshot_requests`: the cluster's and this node's
//!   snapshot policy keys and this node's snapshot request key, read by the snapshot scheduler.

use hostlet_api::objects::{ClusterPolicy, LearnerProgress, MemberRequest, NodeInfo};
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{InformerFactory, MemberInformer, Members, Store};
use tokio_util::sync::CancellationToken;

pub use crate::snapshots::controller::{
    PolicyStore, SnapshotCaches, SNAPSHOT_NODE_POLICY_INFORMER, SNAPSHOT_POLICY_INFORMER,
    SNAPSHOT_REQUESTS_INFORMER,
};
use crate::snapshots::request::SnapshotRequest;

/// The informer label of the learner progress record's cache.
pub const LEARNER_PROGRESS_INFORMER: &str = "learner-progress";
/// The informer label of this node's tombstone request cache.
pub const TOMBSTONE_REQUEST_INFORMER: &str = "tombstone-request";
/// The informer label of the cluster policy's cache.
pub const CLUSTER_POLICY_INFORMER: &str = "cluster-policy";
/// The informer label of the heartbeats' cache.
pub const LEASES_INFORMER: &str = "leases";
/// The informer label of the leader's member request record.
pub const MEMBER_REQUEST_RECORD_INFORMER: &str = "member-request-record";
/// The shared caches of one agent.
#[derive(Clone)]
pub struct Caches {
    pub members: Members,
    pub nodes: Store<String, Object<NodeInfo>>,
    pub learner_progress: Store<String, Object<LearnerProgress>>,
    /// The value is kept as text: any value asks for the rejoin.
    pub tombstone_request: Store<String, Object<String>>,
    pub snapshot_policy: PolicyStore,
    pub snapshot_node_policy: PolicyStore,
    pub snapshot_requests: Store<String, Object<SnapshotRequest>>,
    /// `/hostlet/config/cluster`: the voter target.
    pub cluster_policy: Store<String, Object<ClusterPolicy>>,
    /// `/hostlet/leases/`: the nodes' heartbeats (the value is not read; presence is the heartbeat).
    pub leases: Store<String, Object<String>>,
    /// `/hostlet/etcd/member-request`: the one pending request to a worker.
    pub member_request_record: Store<String, Object<MemberRequest>>,
    /// Voters of deleted nodes, from member removal to voter placement (kept in memory).
    pub handoff: crate::members::Handoff,
    /// `/hostlet/node-labels/`: an admin's labels and cordons.
    pub node_labels: Store<String, Object<hostlet_api::labels::AdminLabels>>,
    /// `/hostlet/podsets/`: the pod sets, their revisions and statuses.
    pub podsets: Store<String, Object<crate::podsets::PodSetEntry>>,
    /// `/hostlet/hosts/`: every node's pod keys and statuses, as much as pod sets read of them.
    pub hosts: Store<String, Object<crate::podsets::HostEntry>>,
}

impl Caches {
    /// Builds the caches, starting their informers through `factory` (they stop with its shutdown).
    /// `local_client_url` is the local member's client URL on an agent that runs one: its status tells who
    /// leads.
    pub fn start(
        factory: &InformerFactory,
        keys: &KeyLayout,
        node: &str,
        local_client_url: Option<&str>,
    ) -> Caches {
        let shutdown = factory.feeders();
        let etcd = factory
            .etcd()
            .expect("a member's caches are built over etcd, never through the node API");
        let mut informer = MemberInformer::new(etcd.clone())
            .with_metrics(factory.metrics())
            .with_endpoint_sync();
        if let Some(url) = local_client_url {
            informer = informer.with_local(url);
        }
        let members = informer.members();
        factory.spawn_feeder("member informer", informer.run(shutdown.clone()));

        let nodes = crate::members::nodes_store(factory, keys);
        let learner_progress = factory.store(
            LEARNER_PROGRESS_INFORMER,
            keys.learner_progress(),
            |_key, value| serde_json::from_slice::<LearnerProgress>(value),
        );
        factory.spawn_feeder(
            "learner progress follower",
            hurry_on_changes(learner_progress.clone(), members.clone(), shutdown.clone()),
        );
        let tombstone_request = factory.store(
            TOMBSTONE_REQUEST_INFORMER,
            keys.tombstone_request(node),
            |_key, value| {
                Ok::<_, std::convert::Infallible>(String::from_utf8_lossy(value).into_owned())
            },
        );
        let snapshots = SnapshotCaches::start(factory, keys, node);
        let cluster_policy = factory.store(
            CLUSTER_POLICY_INFORMER,
            keys.cluster_policy(),
            |_key, value| ClusterPolicy::parse(value),
        );
        let leases = factory.store(LEASES_INFORMER, keys.leases_prefix(), |_key, value| {
            Ok::<_, std::convert::Infallible>(String::from_utf8_lossy(value).into_owned())
        });
        let member_request_record = factory.store(
            MEMBER_REQUEST_RECORD_INFORMER,
            keys.member_request_record(),
            |_key, value| serde_json::from_slice::<MemberRequest>(value),
        );

        let node_labels = factory.store(
            crate::podsets::NODE_LABELS_INFORMER,
            keys.node_labels_prefix(),
            |_key, value| serde_json::from_slice::<hostlet_api::labels::AdminLabels>(value),
        );
        let k = keys.clone();
        let podsets = factory.store(
            crate::podsets::PODSETS_INFORMER,
            keys.podsets_prefix(),
            move |key, value| crate::podsets::PodSetEntry::decode(&k, key, value),
        );
        let k = keys.clone();
        let hosts = factory.store(
            crate::podsets::HOSTS_INFORMER,
            format!("{}/hosts/", keys.prefix()),
            move |key, value| {
                Ok::<_, std::convert::Infallible>(crate::podsets::HostEntry::decode(&k, key, value))
            },
        );

        Caches {
            node_labels,
            podsets,
            hosts,
            members,
            nodes,
            learner_progress,
            tombstone_request,
            snapshot_policy: snapshots.policy,
            snapshot_node_policy: snapshots.node_policy,
            snapshot_requests: snapshots.requests,
            leases,
            handoff: crate::members::Handoff::new(cluster_policy.clone()),
            cluster_policy,
            member_request_record,
        }
    }

    /// Reader clones of what voter placement reads.
    pub fn placement(&self) -> crate::placement::PlacementCaches {
        crate::placement::PlacementCaches {
            members: self.members.clone(),
            nodes: self.nodes.clone(),
            leases: self.leases.clone(),
            policy: self.cluster_policy.clone(),
            request: self.member_request_record.clone(),
            handoff: self.handoff.clone(),
        }
    }

    /// Reader clones of what the pod set controller reads.
    pub fn podsets(&self) -> crate::podsets::PodSetCaches {
        crate::podsets::PodSetCaches {
            members: self.members.clone(),
            nodes: self.nodes.clone(),
            node_labels: self.node_labels.clone(),
            podsets: self.podsets.clone(),
            hosts: self.hosts.clone(),
        }
    }

    /// Reader clones of the snapshot scheduler's caches.
    pub fn snapshots(&self) -> SnapshotCaches {
        SnapshotCaches {
            policy: self.snapshot_policy.clone(),
            node_policy: self.snapshot_node_policy.clone(),
            requests: self.snapshot_requests.clone(),
        }
    }
}

/// Asks the member cache for a look at every change of `store` after its first listing.
async fn hurry_on_changes<V: Send + Sync + 'static>(
    store: Store<String, V>,
    members: Members,
    shutdown: CancellationToken,
) {
    store.wait_until_ready().await;
    let mut changes = store.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            batch = changes.next_batch() => match batch {
                Some(_) => members.hurry(),
                None => return,
            },
        }
    }
}
