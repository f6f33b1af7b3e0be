//! Who a request to the agent's API comes from, by its client certificate, and the node API a voter serves
//! on it: `/node/v1/kv`, etcd's keys as [`hostlet_api::authz::authorize`] lets the caller have them.
//!
//! A client certificate from the cluster CA names a node: a `client` certificate by its common name
//! `<node>-client` (it has no server use), a `server` or `peer` one by `<node>`. The node is a voter while
//! its record names an etcd member that votes; otherwise it is a worker and acts for itself alone. An
//! admin's certificate (`hostlet cert admin`) is `admin:<name>`.
//!
//! - `GET /node/v1/kv?key=K`: `{"key", "value", "modRevision"}`, 404 when absent;
//! - `GET /node/v1/kv?prefix=P`: `{"revision", "items": [{"key", "value", "modRevision"}]}`;
//! - `PUT /node/v1/kv?key=K[&lease=L]` with the value as the body: `{"revision"}`; with `&ttl=S` (5 s to
//!   48 h) instead, the key goes with a new lease granted for it: `{"revision", "lease"}`;
//! - `DELETE /node/v1/kv?key=K`: `{"deleted"}` (0 or 1);
//! - `GET /node/v1/list?prefix=P&revision=R[&from=F]` and `GET /node/v1/watch?prefix=P&revision=R` (or
//!   `key=K` for one key): what an informer lists and watches, as `hostlet_runtime::nodeapi` reads it (410
//!   for a compacted revision; an empty line of events every 30 s while nothing changes; at most
//!   [`MAX_WATCHES_PER_NODE`] open watches per node, 429 beyond). A node's list or watch of every
//!   ConfigMap or Secret (their prefixes) holds the ones the rules let it read now: those its pods use;
//! - `POST /node/v1/lease/keepalive?id=L` (404 once the lease is gone); `DELETE /node/v1/lease?id=L`. A
//!   node uses a lease only when this voter granted it to that node, or it holds nothing but keys that
//!   node may write.
//!
//! A watch of a node whose certificate is revoked ends; the next request is refused.
//!
//! Without a certificate: 401. A request the rules deny: 403 with the rule. Values are UTF-8 text, as every
//! value hostlet keeps is.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use hostlet_api::authz::{authorize, Decision, Identity, PodGraph, Target, Verb};
use hostlet_api::manifest::ConfigKind;
use hostlet_api::objects::NodeInfo;
use hostlet_api::{routes, KeyLayout};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, Members, Store};
use serde::Deserialize;

use crate::pki::{CertIdentity, PeerNode, Revocations};
use crate::routes::serve;

/// Whether a node is a voter, from the node records and the members.
#[derive(Clone)]
pub struct NodeRoles {
    keys: KeyLayout,
    nodes: Store<String, Object<NodeInfo>>,
    /// `None` on a worker, which sees no member list: there a record that names a member is a voter's
    /// (only voters write such records).
    members: Option<Members>,
}

impl NodeRoles {
    pub fn new(
        keys: KeyLayout,
        nodes: Store<String, Object<NodeInfo>>,
        members: Option<Members>,
    ) -> Self {
        NodeRoles {
            keys,
            nodes,
            members,
        }
    }

    /// The identity a certificate carries now.
    pub fn identity(&self, who: &CertIdentity) -> Identity {
        let node = match who {
            CertIdentity::Admin(name) => return Identity::Admin(name.clone()),
            CertIdentity::Node(node) => node.as_str(),
        };
        let key = self.keys.node(node);
        let member = self
            .nodes
            .state()
            .iter()
            .find(|o| o.key == key)
            .and_then(|o| o.valid().and_then(|n| n.member_name.clone()));
        let votes = member.is_some_and(|name| match &self.members {
            Some(members) => members
                .list()
                .iter()
                .any(|m| m.name == name && !m.is_learner),
            None => true,
        });
        if votes {
            Identity::Voter(node.to_string())
        } else {
            Identity::Node(node.to_string())
        }
    }
}

/// Which agent routes a caller may use on this agent (the node API decides per key on its own).
pub fn may_use_agent(identity: &Identity, this_node: &str) -> Result<(), String> {
    match identity {
        Identity::Voter(_) | Identity::Admin(_) => Ok(()),
        Identity::Node(n) if n == this_node => Ok(()),
        Identity::Node(n) => Err(format!(
            "node {n} may use only its own agent's API (this is node {this_node}'s)"
        )),
    }
}

/// The pods of one node, read when a decision needs them: which ConfigMaps and Secrets they use.
struct NodePods(std::collections::BTreeSet<(ConfigKind, String)>);

impl PodGraph for NodePods {
    fn uses(&self, _node: &str, kind: ConfigKind, name: &str) -> bool {
        self.0.contains(&(kind, name.to_string()))
    }
}

#[derive(Clone)]
struct NodeApi {
    etcd: Etcd,
    keys: KeyLayout,
    roles: NodeRoles,
    watches: WatchSlots,
    /// The leases this voter granted, or found holding only a node's keys, by id: whose.
    leases: Arc<std::sync::Mutex<std::collections::HashMap<i64, String>>>,
    revocations: Revocations,
    /// Opens the secrets a node reads: workers hold no secret key.
    secret_keys: Option<crate::secrets::SecretKeys>,
    /// The shared watches nodes' watches are served from, so that etcd's watchers do not grow with the
    /// workers; a watch none of them can serve goes to etcd.
    hubs: Vec<hostlet_runtime::watchhub::WatchHub>,
    /// What each node's pods use, kept from the hubs: a decision about a ConfigMap or Secret reads no
    /// etcd.
    graph: graph::NodeGraph,
}

/// The shortest and longest lease a node may ask for (its events live two days).
const LEASE_TTL: std::ops::RangeInclusive<u64> = 5..=48 * 3600;

/// How many watches one node may hold open on one voter: each is an etcd watch.
pub const MAX_WATCHES_PER_NODE: usize = 64;

/// The watches each node holds open.
#[derive(Clone, Default)]
struct WatchSlots(Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>);

/// One open watch; its slot is given back when the watch ends.
struct WatchSlot {
    slots: WatchSlots,
    node: String,
}

impl WatchSlots {
    /// A slot for `node`, or `None` when it holds [`MAX_WATCHES_PER_NODE`] already.
    fn take(&self, node: &str) -> Option<WatchSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(node.to_string()).or_default();
        if *n >= MAX_WATCHES_PER_NODE {
            return None;
        }
        *n += 1;
        Some(WatchSlot {
            slots: self.clone(),
            node: node.to_string(),
        })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.node);
            }
        }
    }
}

impl NodeApi {
    /// What `node`'s pods use as of revision `at`, from the graph; from etcd when the graph has not
    /// reached `at` in time.
    async fn uses_at(&self, node: &str, at: i64) -> Result<NodePods, Response> {
        match self.graph.uses_at(node, at).await {
            Some(uses) => Ok(NodePods(uses)),
            None => {
                self.graph.fell_back();
                self.pods_of(node).await
            }
        }
    }

    /// What `node`'s pods (its pod keys and its 2014 list) use, read from etcd.
    async fn pods_of(&self, node: &str) -> Result<NodePods, Response> {
        let mut refs = std::collections::BTreeSet::new();
        let (kvs, _) = self
            .etcd
            .get_prefix(self.keys.pods_prefix(node))
            .await
            .map_err(unavailable)?;
        for kv in kvs {
            if let Ok(m) = hostlet_api::parse_manifest(kv.value()) {
                refs.extend(m.config_refs());
            }
        }
        if let Some(kv) = self
            .etcd
            .get(self.keys.legacy_pod_list(node))
            .await
            .map_err(unavailable)?
        {
            if let Ok(list) = hostlet_api::parse_manifest_list(kv.value()) {
                for m in list.into_iter().flatten() {
                    refs.extend(m.config_refs());
                }
            }
        }
        Ok(NodePods(refs))
    }
}

/// The node API's refusal of a caller without a certificate (the gate sends it before the handler runs).
pub fn no_certificate() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "the node API needs a node's or an admin's client certificate\n",
    )
        .into_response()
}

fn unavailable(e: hostlet_runtime::EtcdError) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("etcd did not answer: {e}\n"),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct KvQuery {
    key: Option<String>,
    prefix: Option<String>,
    /// A put's lease.
    lease: Option<i64>,
    /// A put's new lease, in seconds: granted, and the key put with it, in one request.
    ttl: Option<u64>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    key: String,
    value: String,
    mod_revision: i64,
}

/// `None` when the key or value is not UTF-8 text.
fn item(kv: &etcd_client::KeyValue) -> Option<Item> {
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).ok();
    Some(Item {
        key: text(kv.key())?,
        value: text(kv.value())?,
        mod_revision: kv.mod_revision(),
    })
}

fn not_text() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "a key or value is not UTF-8 text\n",
    )
        .into_response()
}

async fn kv(
    State(api): State<Arc<NodeApi>>,
    peer: Option<Extension<PeerNode>>,
    method: Method,
    Query(q): Query<KvQuery>,
    body: Bytes,
) -> Response {
    let (verb, target) = match (&method, q.key.as_deref(), q.prefix.as_deref()) {
        (&Method::GET, Some(k), None) => (Verb::Get, Target::Key(k)),
        (&Method::GET, None, Some(p)) => (Verb::List, Target::Prefix(p)),
        (&Method::PUT, Some(k), None) => (Verb::Put, Target::Key(k)),
        (&Method::DELETE, Some(k), None) => (Verb::Delete, Target::Key(k)),
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                "give one of key= (GET, PUT, DELETE) or prefix= (GET)\n",
            )
                .into_response()
        }
    };
    if (q.lease.is_some() || q.ttl.is_some()) && verb != Verb::Put {
        return (
            StatusCode::BAD_REQUEST,
            "lease= and ttl= go with PUT only\n",
        )
            .into_response();
    }
    if q.lease.is_some() && q.ttl.is_some() {
        return (StatusCode::BAD_REQUEST, "give lease= or ttl=, not both\n").into_response();
    }
    let identity = match decide(&api, peer, verb, target).await {
        Decided::Allowed(i) => i,
        Decided::Refused(r) => return r,
    };
    if let (Identity::Node(node), Verb::Put, Target::Key(k)) = (&identity, verb, target) {
        if let Some(refusal) = admit_node_write(&api.keys, node, k, &body) {
            return refusal;
        }
    }
    if let (Some(ttl), Target::Key(k)) = (q.ttl, target) {
        if !LEASE_TTL.contains(&ttl) {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "ttl: give seconds from {} to {}\n",
                    LEASE_TTL.start(),
                    LEASE_TTL.end()
                ),
            )
                .into_response();
        }
        let lease = match api
            .etcd
            .lease_grant(std::time::Duration::from_secs(ttl))
            .await
        {
            Ok(id) => id,
            Err(e) => return unavailable(e),
        };
        api.granted(&identity, lease);
        return match api.etcd.put_with_lease(k, &body, lease).await {
            Ok(revision) => {
                Json(serde_json::json!({ "revision": revision, "lease": lease })).into_response()
            }
            Err(e) => unavailable(e),
        };
    }
    if let Some(lease) = q.lease {
        if let Err(r) = api.may_use_lease(&identity, lease).await {
            return r;
        }
        let Target::Key(k) = target else {
            return (StatusCode::BAD_REQUEST, "lease= goes with key=\n").into_response();
        };
        return match api.etcd.put_with_lease(k, &body, lease).await {
            Ok(revision) => Json(serde_json::json!({ "revision": revision })).into_response(),
            Err(e) => unavailable(e),
        };
    }
    match (verb, target) {
        (Verb::Get, Target::Key(k)) => match api.etcd.get(k).await {
            Ok(Some(kv)) => match item(&kv) {
                Some(mut i) => {
                    let value = api.served(&identity, k, std::mem::take(&mut i.value).into_bytes());
                    match String::from_utf8(value) {
                        Ok(v) => {
                            i.value = v;
                            Json(i).into_response()
                        }
                        Err(_) => not_text(),
                    }
                }
                None => not_text(),
            },
            Ok(None) => (StatusCode::NOT_FOUND, format!("{k} does not exist\n")).into_response(),
            Err(e) => unavailable(e),
        },
        (Verb::List, Target::Prefix(p)) => match api.etcd.get_prefix(p).await {
            Ok((kvs, revision)) => {
                let items: Option<Vec<Item>> = kvs.iter().map(item).collect();
                match items {
                    Some(items) => Json(serde_json::json!({"revision": revision, "items": items}))
                        .into_response(),
                    None => not_text(),
                }
            }
            Err(e) => unavailable(e),
        },
        (Verb::Put, Target::Key(k)) => match api.etcd.put(k, &body).await {
            Ok(revision) => Json(serde_json::json!({ "revision": revision })).into_response(),
            Err(e) => unavailable(e),
        },
        (Verb::Delete, Target::Key(k)) => match api.etcd.delete(k).await {
            Ok(deleted) => Json(serde_json::json!({ "deleted": deleted })).into_response(),
            Err(e) => unavailable(e),
        },
        _ => (StatusCode::BAD_REQUEST, "not a node API request\n").into_response(),
    }
}

enum Decided {
    Allowed(Identity),
    Refused(Response),
}

/// Who calls, by certificate (`None`: 401).
fn caller(api: &NodeApi, peer: Option<Extension<PeerNode>>) -> Option<Identity> {
    peer.and_then(|Extension(p)| p.0)
        .map(|who| api.roles.identity(&who))
}

/// Whether the caller may do `verb` on `target`: its identity, or the refusal (401 without a
/// certificate, 403 naming the rule). A node's pods are read only for the keys they decide.
async fn decide(
    api: &NodeApi,
    peer: Option<Extension<PeerNode>>,
    verb: Verb,
    target: Target<'_>,
) -> Decided {
    let Some(identity) = caller(api, peer) else {
        return Decided::Refused(no_certificate());
    };
    let needs_graph = matches!(
        target,
        Target::Key(k) if matches!(
            api.keys.parse(k),
            Some(hostlet_api::Key::ConfigMap { .. } | hostlet_api::Key::Secret { .. })
        )
    );
    let graph = match (&identity, needs_graph) {
        // A single key: as fresh as the graph is now (nodes read ConfigMaps and Secrets by list and
        // watch, which wait for the revision they read).
        (Identity::Node(node), true) => match api.uses_at(node, api.graph.applied()).await {
            Ok(g) => g,
            Err(r) => return Decided::Refused(r),
        },
        _ => NodePods(Default::default()),
    };
    match authorize(&api.keys, &identity, verb, target, &graph) {
        Decision::Allow => Decided::Allowed(identity),
        Decision::Deny(rule) => {
            Decided::Refused((StatusCode::FORBIDDEN, format!("{rule}\n")).into_response())
        }
    }
}

/// For a node's list or watch of every ConfigMap or every Secret: that node. It gets what the rules let
/// it read of each (what its pods use), never the prefix as such.
fn config_reader<'a>(api: &NodeApi, identity: &'a Identity, prefix: &str) -> Option<&'a str> {
    match identity {
        Identity::Node(node)
            if prefix == api.keys.config_maps_prefix() || prefix == api.keys.secrets_prefix() =>
        {
            Some(node)
        }
        _ => None,
    }
}

/// Whether `node` may read the key `key` with `graph` its pods' references.
fn may_read(api: &NodeApi, node: &str, key: &str, graph: &NodePods) -> bool {
    authorize(
        &api.keys,
        &Identity::Node(node.to_string()),
        Verb::Get,
        Target::Key(key),
        graph,
    ) == Decision::Allow
}

impl NodeApi {
    /// Remembers that `lease` is a node's (granted to it here, or holding only its keys).
    fn granted(&self, identity: &Identity, lease: i64) {
        if let Identity::Node(node) = identity {
            let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            // Leases live minutes to days; past a bound the memory starts again (a lease that holds
            // the node's keys is still recognised by them).
            if leases.len() >= 4096 {
                leases.clear();
            }
            leases.insert(lease, node.clone());
        }
    }

    /// A value as a node gets it: a sealed Secret opened (over the node's mTLS connection, as an API
    /// server hands a kubelet its secrets), anything else as it is. One this voter cannot open goes as it
    /// is, and the node says it cannot open it.
    fn served(&self, identity: &Identity, key: &str, value: Vec<u8>) -> Vec<u8> {
        if !matches!(identity, Identity::Node(_)) {
            return value;
        }
        let (Some(hostlet_api::Key::Secret { .. }), Some(keys)) =
            (self.keys.parse(key), &self.secret_keys)
        else {
            return value;
        };
        let opened = hostlet_api::configs::Secret::parse(&value)
            .ok()
            .filter(|s| s.encrypted.is_some())
            .and_then(|s| keys.open(&s).ok())
            .and_then(|s| serde_json::to_vec(&s).ok());
        opened.unwrap_or(value)
    }

    /// Whether `identity` may renew, end or put with `lease`: voters and admins may; a node when this
    /// voter granted the lease to it, or when the lease holds only keys that node may write (a lease
    /// granted by another voter, since gone).
    async fn may_use_lease(&self, identity: &Identity, lease: i64) -> Result<(), Response> {
        let Identity::Node(node) = identity else {
            return Ok(());
        };
        let granted_here = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lease)
            .is_some_and(|n| n == node);
        if granted_here {
            return Ok(());
        }
        let keys = match self.etcd.lease_keys(lease).await {
            Ok(Some(keys)) => keys,
            Ok(None) => {
                return Err((
                    StatusCode::NOT_FOUND,
                    format!("lease {lease:x} does not exist\n"),
                )
                    .into_response())
            }
            Err(e) => return Err(unavailable(e)),
        };
        let none = NodePods(Default::default());
        let foreign = keys.iter().find(|k| {
            authorize(&self.keys, identity, Verb::Put, Target::Key(k), &none) != Decision::Allow
        });
        let why = match (foreign, keys.is_empty()) {
            (Some(k), _) => format!("it holds {k}, which node {node} may not write"),
            (None, true) => {
                "it holds no key of this node's and this voter did not grant it to this node".into()
            }
            (None, false) => {
                // Known from now on: the node's next renewal here needs no look at the lease.
                self.granted(identity, lease);
                return Ok(());
            }
        };
        Err((
            StatusCode::FORBIDDEN,
            format!("node {node} may not use lease {lease:x}: {why}\n"),
        )
            .into_response())
    }
}

#[derive(Debug, Deserialize)]
struct LeaseQuery {
    id: Option<i64>,
}

/// `POST /node/v1/lease/keepalive?id=L` and `DELETE /node/v1/lease?id=L`.
async fn lease_use(
    State(api): State<Arc<NodeApi>>,
    peer: Option<Extension<PeerNode>>,
    method: Method,
    Query(q): Query<LeaseQuery>,
) -> Response {
    let Some(identity) = caller(&api, peer) else {
        return no_certificate();
    };
    let Some(id) = q.id else {
        return (StatusCode::BAD_REQUEST, "id: give the lease's id\n").into_response();
    };
    if let Err(r) = api.may_use_lease(&identity, id).await {
        return r;
    }
    let done = if method == Method::DELETE {
        api.etcd.lease_revoke(id).await
    } else {
        api.etcd.lease_keep_alive_once(id).await
    };
    match done {
        Ok(()) => Json(serde_json::json!({ "id": id })).into_response(),
        Err(hostlet_runtime::EtcdError::LeaseExpired(_)) => (
            StatusCode::NOT_FOUND,
            format!("lease {id:x} does not exist\n"),
        )
            .into_response(),
        Err(e) => unavailable(e),
    }
}

/// What an informer lists or watches: the keys under `prefix`, or the one `key`.
#[derive(Debug, Deserialize)]
struct ListWatchQuery {
    prefix: Option<String>,
    key: Option<String>,
    #[serde(default)]
    revision: i64,
    /// base64
    from: Option<String>,
}

impl ListWatchQuery {
    /// The etcd prefix to read, and the one key kept when it is a key's.
    /// `None` unless exactly one of the two is given.
    fn scope(&self) -> Option<(&str, Option<&str>)> {
        match (self.prefix.as_deref(), self.key.as_deref()) {
            (Some(p), None) => Some((p, None)),
            (None, Some(k)) => Some((k, Some(k))),
            _ => None,
        }
    }

    /// What the rules are asked: `on_key` of the key, or `on_prefix` of the prefix.
    fn asked(&self, on_prefix: Verb, on_key: Verb) -> Option<(Verb, Target<'_>)> {
        Some(match self.scope()? {
            (_, Some(k)) => (on_key, Target::Key(k)),
            (p, None) => (on_prefix, Target::Prefix(p)),
        })
    }
}

fn bad_scope() -> Response {
    (StatusCode::BAD_REQUEST, "give one of prefix= or key=\n").into_response()
}

/// Keeps what a key's list or watch may show: that key alone.
fn only_key(key: Option<&str>, kv_key: &str) -> bool {
    key.is_none_or(|k| k == kv_key)
}

fn etcd_failed(e: hostlet_runtime::EtcdError) -> Response {
    if let hostlet_runtime::EtcdError::Compacted { revision, .. } = e {
        return (
            StatusCode::GONE,
            format!("revision {revision} is compacted\n"),
        )
            .into_response();
    }
    unavailable(e)
}

/// Whether a list or watch of `prefix` (or of `key` under it) is allowed: `Some(node)` for a node's list
/// or watch of every ConfigMap or Secret, which is filtered by what its pods use at each revision served;
/// `None` when the rules allow it whole; the refusal otherwise.
async fn admit_scope(
    api: &NodeApi,
    peer: Option<Extension<PeerNode>>,
    identity: &Identity,
    prefix: &str,
    key: Option<&str>,
    verb: Verb,
    target: Target<'_>,
) -> Result<Option<String>, Response> {
    let configs = config_reader(api, identity, prefix)
        .filter(|_| key.is_none())
        .map(str::to_string);
    if configs.is_none() {
        if let Decided::Refused(r) = decide(api, peer, verb, target).await {
            return Err(r);
        }
    }
    Ok(configs)
}

async fn list(
    State(api): State<Arc<NodeApi>>,
    peer: Option<Extension<PeerNode>>,
    Query(q): Query<ListWatchQuery>,
) -> Response {
    use base64::Engine;
    use hostlet_runtime::informer::ListWatch;
    let (Some((prefix, key)), Some((verb, target))) = (q.scope(), q.asked(Verb::List, Verb::Get))
    else {
        return bad_scope();
    };
    let Some(identity) = caller(&api, peer.clone()) else {
        return no_certificate();
    };
    let configs = match admit_scope(&api, peer, &identity, prefix, key, verb, target).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let from = match q
        .from
        .as_deref()
        .map(|f| base64::engine::general_purpose::STANDARD.decode(f))
    {
        None => None,
        // A page starts inside the prefix: the range runs from `from` to the prefix's end, and one that
        // began before the prefix would read keys the caller was not allowed.
        Some(Ok(f)) if f.starts_with(prefix.as_bytes()) => Some(f),
        Some(Ok(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "from: not a key under the prefix\n",
            )
                .into_response();
        }
        Some(Err(e)) => {
            return (StatusCode::BAD_REQUEST, format!("from: {e}\n")).into_response();
        }
    };
    let lw = hostlet_runtime::informer::EtcdListWatch::new(api.etcd.clone(), prefix);
    match lw.list(from.as_deref(), q.revision).await {
        Ok(mut page) => {
            if key.is_some() {
                // The key sorts first among those it is a prefix of: one page holds it.
                page.kvs.retain(|kv| only_key(key, &kv.key));
                page.next = None;
            }
            if let Some(node) = &configs {
                let graph = match api.uses_at(node, page.revision).await {
                    Ok(g) => g,
                    Err(r) => return r,
                };
                page.kvs.retain(|kv| may_read(&api, node, &kv.key, &graph));
            }
            for kv in &mut page.kvs {
                kv.value = api.served(&identity, &kv.key, std::mem::take(&mut kv.value));
            }
            Json(hostlet_runtime::nodeapi::WirePage::from(&page)).into_response()
        }
        Err(e) => etcd_failed(e),
    }
}

async fn watch(
    State(api): State<Arc<NodeApi>>,
    peer: Option<Extension<PeerNode>>,
    Query(q): Query<ListWatchQuery>,
) -> Response {
    use futures::StreamExt;
    use hostlet_runtime::informer::{ListWatch, RawEvent, WatchItem};
    let (Some((prefix, key)), Some((verb, target))) =
        (q.scope(), q.asked(Verb::Watch, Verb::Watch))
    else {
        return bad_scope();
    };
    let serial = peer.as_ref().and_then(|Extension(p)| p.1.clone());
    let Some(identity) = caller(&api, peer.clone()) else {
        return no_certificate();
    };
    let configs = match admit_scope(&api, peer, &identity, prefix, key, verb, target).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    // Voters and admins are not counted: a node is, so that one node cannot hold the voter's etcd open.
    let slot = match &identity {
        Identity::Node(node) => match api.watches.take(node) {
            Some(slot) => Some(slot),
            None => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "node {node} holds {MAX_WATCHES_PER_NODE} watches on this voter already\n"
                    ),
                )
                    .into_response()
            }
        },
        _ => None,
    };
    let key = key.map(str::to_string);
    let shared = api.hubs.iter().find_map(|h| h.watch(prefix, q.revision));
    let stream = match shared {
        Some(s) => s,
        None => {
            let lw = hostlet_runtime::informer::EtcdListWatch::new(api.etcd.clone(), prefix);
            match lw.watch(q.revision).await {
                Ok(s) => s,
                Err(e) => return etcd_failed(e),
            }
        }
    };
    // One JSON line per answer of etcd's watch, and an empty one every HEARTBEAT while nothing changes
    // (the caller gives up on a silent voter); the stream ends where etcd's does (the caller resumes).
    // A revoked caller's watch ends (its next request is refused).
    let revoked = {
        let (revocations, serial) = (api.revocations.clone(), serial);
        move || {
            serial
                .as_deref()
                .is_some_and(|s| revocations.revoked(s).is_some())
        }
    };
    let revocation_changes = api.revocations.store().subscribe();
    let lines = futures::stream::unfold(Some((stream, slot, revocation_changes)), move |state| {
        let (key, api, configs, revoked, identity) = (
            key.clone(),
            api.clone(),
            configs.clone(),
            revoked.clone(),
            identity.clone(),
        );
        async move {
            let (mut stream, slot, mut revocation_changes) = state?;
            // One deadline per line: the revocation list changing (a node joining records its
            // certificates) must not put the heartbeat off.
            let heartbeat = tokio::time::Instant::now() + hostlet_runtime::nodeapi::HEARTBEAT;
            let item = loop {
                if revoked() {
                    return None;
                }
                tokio::select! {
                    next = stream.next() => break match next {
                        Some(Ok(WatchItem::Events(events))) => {
                            let mut events: Vec<RawEvent> = events
                                .into_iter()
                                .filter(|e| match e {
                                    RawEvent::Put(kv) => only_key(key.as_deref(), &kv.key),
                                    RawEvent::Delete { key: k, .. } => only_key(key.as_deref(), k),
                                })
                                .collect();
                            if let (Some(node), false) = (&configs, events.is_empty()) {
                                // What the node may read as of these events; unanswered, the watch
                                // ends (it resumes).
                                let at = events.iter().map(graph::revision_of).max().unwrap_or(0);
                                let graph = api.uses_at(node, at).await.ok()?;
                                events.retain(|e| match e {
                                    RawEvent::Put(kv) => may_read(&api, node, &kv.key, &graph),
                                    RawEvent::Delete { key: k, .. } => may_read(&api, node, k, &graph),
                                });
                            }
                            for e in &mut events {
                                if let RawEvent::Put(kv) = e {
                                    kv.value = api.served(&identity, &kv.key, std::mem::take(&mut kv.value));
                                }
                            }
                            WatchItem::Events(events)
                        }
                        Some(Ok(other)) => other,
                        Some(Err(_)) | None => return None,
                    },
                    _ = tokio::time::sleep_until(heartbeat) => break WatchItem::Events(Vec::new()),
                    batch = revocation_changes.next_batch() => { batch?; }
                }
            };
            let mut line =
                serde_json::to_vec(&hostlet_runtime::nodeapi::WireItem::from(&item)).ok()?;
            line.push(b'\n');
            Some((
                Ok::<_, std::io::Error>(Bytes::from(line)),
                Some((stream, slot, revocation_changes)),
            ))
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// What a node may write into the keys it may write, as NodeRestriction checks a kubelet's objects: its
/// record names itself and no etcd member (a voter is told by the member its record names, so a node that
/// could name one would pass for a voter). `Some` is the refusal.
fn admit_node_write(keys: &KeyLayout, node: &str, key: &str, body: &[u8]) -> Option<Response> {
    let Some(hostlet_api::Key::Node { .. }) = keys.parse(key) else {
        return None;
    };
    let record: NodeInfo = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return Some((StatusCode::BAD_REQUEST, format!("{key}: {e}\n")).into_response());
        }
    };
    let why = if record.name != node {
        Some(format!("its record names node {:?}", record.name))
    } else if record.member_name.is_some()
        || record.member_id.is_some()
        || record.peer_url.is_some()
        || record.client_url.is_some()
        || record.member_since.is_some()
    {
        Some("a node's record names an etcd member only when a voter writes it".to_string())
    } else if record
        .labels
        .get(hostlet_api::labels::ROLE)
        .is_some_and(|r| r != "worker")
    {
        Some("a node that writes its record through the node API is a worker".to_string())
    } else {
        hostlet_api::labels::node_may_set(node, &record.labels).err()
    };
    why.map(|why| {
        (
            StatusCode::FORBIDDEN,
            format!("node {node} may not put {key}: {why}\n"),
        )
            .into_response()
    })
}

/// The node API's routes (a voter's agent serves them).
pub fn router(
    etcd: Etcd,
    keys: KeyLayout,
    roles: NodeRoles,
    revocations: Revocations,
    secret_keys: Option<crate::secrets::SecretKeys>,
    hubs: Vec<hostlet_runtime::watchhub::WatchHub>,
    graph: graph::NodeGraph,
) -> Router {
    let r = serve(Router::new(), &routes::NODE_KV_GET, kv);
    let r = serve(r, &routes::NODE_KV_PUT, kv);
    let r = serve(r, &routes::NODE_KV_DELETE, kv);
    let r = serve(r, &routes::NODE_LIST, list);
    let r = serve(r, &routes::NODE_WATCH, watch);
    let r = serve(r, &routes::NODE_LEASE_DELETE, lease_use);
    serve(r, &routes::NODE_LEASE_KEEPALIVE, lease_use)
        .layer(axum::middleware::map_response(
            |mut r: Response| async move {
                r.headers_mut().insert(
                    hostlet_runtime::nodeapi::NODE_API_HEADER,
                    axum::http::HeaderValue::from_static("v1"),
                );
                r
            },
        ))
        .with_state(Arc::new(NodeApi {
            etcd,
            keys,
            roles,
            watches: WatchSlots::default(),
            leases: Default::default(),
            revocations,
            secret_keys,
            hubs,
            graph,
        }))
}

pub mod certs;
pub mod graph;

#[cfg(test)]
mod tests;
