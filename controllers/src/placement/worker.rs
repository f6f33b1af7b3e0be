//! A worker's side of voter placement: its caches (the member list, for the voters' URLs; its member
//! request key) and the wait for a request. A request to join stops the agent, which starts again as a
//! joiner (its pods keep running and are adopted), the way a rejoin does.

use std::time::Duration;

use hostlet_api::objects::MemberRequest;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, Informer, MemberInformer, Members, Metrics, Pace, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::etcd_member::bootstrap::write_endpoints;
use crate::etcd_member::MemberLayout;

/// The informer label of a node's member request cache.
pub const MEMBER_REQUEST_INFORMER: &str = "member-request";

/// How often a worker looks at the member list: it needs the voters' URLs only, and those change
/// rarely (a failed endpoint is retried on the others meanwhile).
pub const WORKER_LOOK: Duration = Duration::from_secs(30);

/// The shared caches of a worker's agent.
#[derive(Clone)]
pub struct WorkerCaches {
    /// Identity only (no statuses): the voters' client URLs.
    pub members: Members,
    /// This node's member request key.
    pub request: Store<String, Object<MemberRequest>>,
}

impl WorkerCaches {
    /// Builds the caches and starts their informers; the voters' URLs go to `layout`'s `db/endpoints`
    /// as they change, for a restart and the CLI.
    pub fn start(
        etcd: &Etcd,
        keys: &KeyLayout,
        node: &str,
        layout: MemberLayout,
        metrics: &Metrics,
        shutdown: &CancellationToken,
    ) -> WorkerCaches {
        let informer = MemberInformer::new(etcd.clone())
            .identity_only()
            .with_pace(Pace {
                slow: WORKER_LOOK,
                fast: WORKER_LOOK,
                fast_for: Duration::ZERO,
            })
            .with_metrics(metrics)
            .with_endpoint_sync();
        let members = informer.members();
        tokio::spawn(informer.run(shutdown.clone()));
        tokio::spawn(record_endpoints(members.clone(), layout, shutdown.clone()));
        let request = Informer::new(
            MEMBER_REQUEST_INFORMER,
            etcd.clone(),
            keys.member_request(node),
            |_key, value| serde_json::from_slice::<MemberRequest>(value),
        )
        .with_metrics(metrics);
        let store = request.store();
        tokio::spawn(request.run(shutdown.clone()));
        WorkerCaches {
            members,
            request: store,
        }
    }
}

async fn record_endpoints(members: Members, layout: MemberLayout, shutdown: CancellationToken) {
    members.store().wait_until_ready().await;
    let mut changes = members.store().subscribe();
    let mut last = Vec::new();
    loop {
        let mut voters: Vec<String> = members
            .list()
            .iter()
            .filter(|m| m.is_voter())
            .filter_map(|m| m.client_urls.first().cloned())
            .collect();
        voters.sort();
        if !voters.is_empty() && voters != last {
            write_endpoints(&layout, &voters);
            last = voters;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            batch = changes.next_batch() => if batch.is_none() { return },
        }
    }
}

/// Waits for a valid request to join; then stops the agent (cancels `shutdown`) and hands the request
/// back. A value that does not parse is logged and waited past.
pub fn await_request(
    request: Store<String, Object<MemberRequest>>,
    shutdown: CancellationToken,
) -> JoinHandle<Option<MemberRequest>> {
    tokio::spawn(async move {
        request.wait_until_ready().await;
        let mut changes = request.subscribe();
        loop {
            for o in request.state() {
                match &o.value {
                    Ok(r) if r.action == "join" && !r.server.is_empty() => {
                        tracing::info!(server = %r.server, reason = %r.reason, "asked to become an etcd member: starting again as a joiner");
                        shutdown.cancel();
                        return Some(r.clone());
                    }
                    Ok(r) => {
                        tracing::warn!(key = %o.key, action = %r.action, "member request with an unknown action (only join is)")
                    }
                    Err(e) => {
                        tracing::warn!(key = %o.key, error = ?e, "member request does not parse")
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                batch = changes.next_batch() => { batch?; }
            }
        }
    })
}
