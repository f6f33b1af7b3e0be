//! A worker's side of voter placement: its caches (the voters' addresses; its member request key) and
//! the wait for a request. A worker reaches the cluster through the voters' node API and follows the
//! voters by their node records; one without TLS (`--etcd-insecure`) talks to etcd and follows the
//! member list. A request to join stops the agent, which starts again as a
//! joiner (its pods keep running and are adopted), the way a rejoin does.

use std::time::Duration;

use hostlet_api::objects::{MemberAction, MemberRequest, NodeInfo};
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::nodeapi::NodeApiClient;
use hostlet_runtime::{ClusterClient, Etcd, InformerFactory, MemberInformer, Members, Pace, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::etcd_member::bootstrap::write_endpoints;
use crate::etcd_member::MemberLayout;

/// The informer label of a node's member request cache.
pub const MEMBER_REQUEST_INFORMER: &str = "member-request";

/// How often a worker looks at the member list: it needs the voters' URLs only, and those change
/// rarely (a failed endpoint is retried on the others meanwhile).
pub const WORKER_LOOK: Duration = Duration::from_secs(30);

/// How long a prompted look may take.
const LOOK_WITHIN: Duration = Duration::from_secs(15);

/// The shared caches of a worker's agent.
#[derive(Clone)]
pub struct WorkerCaches {
    /// Identity only (no statuses): the voters' client URLs. `None` through the node API, where the
    /// node records name the voters.
    pub members: Option<Members>,
    /// This node's member request key.
    pub request: Store<String, Object<MemberRequest>>,
    /// The node records (the voters' addresses; who votes, for the API's callers).
    pub nodes: Store<String, Object<hostlet_api::objects::NodeInfo>>,
}

impl WorkerCaches {
    /// Builds the caches, starting their informers through `factory`; the voters' URLs go to `layout`'s
    /// `db/endpoints` as they change, for a restart and the CLI.
    pub fn start(
        factory: &InformerFactory,
        keys: &KeyLayout,
        node: &str,
        layout: MemberLayout,
    ) -> WorkerCaches {
        let shutdown = factory.feeders();
        let request = factory.key_store(
            MEMBER_REQUEST_INFORMER,
            keys.member_request(node),
            |_key, value| serde_json::from_slice::<MemberRequest>(value),
        );
        let nodes = crate::members::nodes_store(factory, keys);
        let etcd = match factory.client() {
            ClusterClient::Etcd(etcd) => etcd,
            ClusterClient::NodeApi(api) => {
                factory.spawn_feeder(
                    "voter API follower",
                    follow_voter_apis(
                        api.clone(),
                        nodes.clone(),
                        node.to_string(),
                        layout,
                        shutdown.clone(),
                    ),
                );
                return WorkerCaches {
                    members: None,
                    request,
                    nodes,
                };
            }
        };
        let informer = MemberInformer::new(etcd.clone())
            .identity_only()
            .with_pace(Pace {
                slow: WORKER_LOOK,
                fast: WORKER_LOOK,
                fast_for: Duration::ZERO,
            })
            .with_metrics(factory.metrics())
            .with_endpoint_sync();
        let members = informer.members();
        factory.spawn_feeder("member informer", informer.run(shutdown.clone()));
        factory.spawn_feeder(
            "endpoints recorder",
            record_endpoints(members.clone(), layout, shutdown.clone()),
        );
        factory.spawn_feeder(
            "voter follower",
            follow_voters(
                etcd.clone(),
                members.clone(),
                nodes.clone(),
                shutdown.clone(),
            ),
        );
        WorkerCaches {
            members: Some(members),
            request,
            nodes,
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

/// The API URLs in the node records of members other than `node` (the voters serve the node API),
/// sorted. A record may still name a member that is gone: the client passes over an agent that serves
/// no node API.
pub fn voter_api_urls(nodes: &Store<String, Object<NodeInfo>>, node: &str) -> Vec<String> {
    let mut urls: Vec<String> = nodes
        .state()
        .iter()
        .filter_map(|o| o.valid())
        .filter(|n| n.member_id.is_some() && n.name != node)
        .filter_map(|n| n.api_url.clone())
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

/// Keeps a worker's node API client on the voters as their node records come and go, and their URLs in
/// `db/voters` for a restart. The URLs last known stay while no record names a voter.
async fn follow_voter_apis(
    api: NodeApiClient,
    nodes: Store<String, Object<NodeInfo>>,
    node: String,
    layout: MemberLayout,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = nodes.wait_until_ready() => {}
    }
    let mut changes = nodes.subscribe();
    let mut clients = Vec::new();
    loop {
        let urls = voter_api_urls(&nodes, &node);
        if !urls.is_empty() && urls != api.urls() {
            tracing::info!(voters = ?urls, "following the voters' node API");
            api.set_urls(urls.clone());
            crate::etcd_member::worker::write_voters(&layout, &urls);
        }
        // The CLI beside the worker reads db/endpoints.
        let now = member_urls(&nodes);
        if !now.is_empty() && now != clients {
            write_endpoints(&layout, &now);
            clients = now;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            batch = changes.next_batch() => if batch.is_none() { return },
        }
    }
}

/// The client URLs in the node records of members, sorted.
fn member_urls(nodes: &Store<String, Object<NodeInfo>>) -> Vec<String> {
    let mut urls: Vec<String> = nodes
        .state()
        .iter()
        .filter_map(|o| o.valid())
        .filter(|n| n.member_id.is_some())
        .filter_map(|n| n.client_url.clone())
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

/// Keeps the worker's endpoints on the voters while they change under it. The member list is looked
/// at rarely, so a change in the members' node records (a member registering, a removed one coming
/// back as a worker) prompts a look at once; and when a look or any other request fails on every
/// endpoint (the voters it knew are gone), the client URLs in the members' node records, as last seen, are tried as well.
async fn follow_voters(
    etcd: Etcd,
    members: Members,
    nodes: Store<String, Object<NodeInfo>>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = nodes.wait_until_ready() => {}
    }
    let mut changes = nodes.subscribe();
    let mut seen = member_urls(&nodes);
    let mut unreachable = etcd.watch_unreachable();
    loop {
        let look_failed = tokio::select! {
            _ = shutdown.cancelled() => return,
            batch = changes.next_batch() => {
                if batch.is_none() {
                    return;
                }
                let now = member_urls(&nodes);
                if now == seen {
                    continue;
                }
                seen = now;
                !members.refresh(LOOK_WITHIN).await
            }
            ok = members.next_look() => !ok,
            // A request no endpoint could serve: say, the lease renewal after the last voter known left.
            changed = unreachable.changed() => {
                if changed.is_err() {
                    return;
                }
                true
            }
        };
        if !look_failed {
            continue;
        }
        let mut endpoints = etcd.endpoints();
        let before = endpoints.len();
        for url in member_urls(&nodes) {
            if !endpoints.contains(&url) {
                endpoints.push(url);
            }
        }
        if endpoints.len() == before {
            continue;
        }
        tracing::info!(endpoints = ?endpoints, "no voter answers: trying the client URLs of the members' node records too");
        if let Err(e) = etcd.set_endpoints(endpoints).await {
            tracing::warn!(error = %e, "cannot update the etcd endpoints");
            continue;
        }
        members.hurry();
    }
}

/// Waits for a valid request to join; then stops the agent (cancels `shutdown`) and hands the request
/// back. A value that does not parse, or asks for something else, is waited past, with one event for
/// each value written.
pub fn await_request(
    request: Store<String, Object<MemberRequest>>,
    events: crate::events::EventRecorder,
    shutdown: CancellationToken,
) -> JoinHandle<Option<MemberRequest>> {
    tokio::spawn(wait_for_request(request, events, shutdown))
}

/// [`await_request`] as a future, for an owner that runs it among its tasks.
pub async fn wait_for_request(
    request: Store<String, Object<MemberRequest>>,
    events: crate::events::EventRecorder,
    shutdown: CancellationToken,
) -> Option<MemberRequest> {
    {
        request.wait_until_ready().await;
        let mut changes = request.subscribe();
        // Per key: the revision last reported (the informer's prefix may hold more than one key).
        let mut reported: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
        loop {
            for o in request.state() {
                let why = match &o.value {
                    Ok(r) if r.action == MemberAction::Join && !r.server.is_empty() => {
                        tracing::info!(server = %r.server, reason = %r.reason, "asked to become an etcd member: starting again as a joiner");
                        shutdown.cancel();
                        return Some(r.clone());
                    }
                    Ok(MemberRequest {
                        action: MemberAction::Other(action),
                        ..
                    }) => {
                        format!("action {action:?} is not one this agent knows (only \"join\" is)")
                    }
                    Ok(_) => "server: required (the URL of the node to join through)".to_string(),
                    Err(e) => e.message(),
                };
                if reported.insert(o.key.clone(), o.mod_revision) != Some(o.mod_revision) {
                    let message = format!("{}: {why}; the request is ignored", o.key);
                    tracing::warn!("{message}");
                    events
                        .node_event(
                            crate::events::EventKind::Warning,
                            "InvalidMemberRequest",
                            message,
                        )
                        .await;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                batch = changes.next_batch() => { batch?; }
            }
        }
    }
}
