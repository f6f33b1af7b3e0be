//! Every route of the agent's API (`--listen`) in one table: its method and path, who may call it, and how
//! large a body it takes. The agent's gate enforces the table before any handler runs: a route that is not
//! in it cannot be reached, and every route that is not marked open refuses a caller without a credential
//! or of the wrong kind. The node API's clients name their paths from here too, so its prefix lives in
//! this file alone.
//!
//! Pure data: the HTTP server and its handlers are in the controllers and the binary.

use std::fmt;

/// Who may call a route. The gate decides, before the handler runs and before the body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Anyone, with no credential: health and the CA a joiner checks against its token.
    Anyone,
    /// A joiner: the route checks the server token or a worker token itself (a worker token opens
    /// nothing else).
    Joiner,
    /// A node or an admin by its client certificate (never by a token), for itself: the handler
    /// decides per key (`authz::authorize`).
    Node,
    /// The agent's users: the cluster token, a voter's or an admin's certificate, or the certificate of
    /// the node this agent runs (another node's certificate is refused).
    AgentUser,
}

impl Caller {
    /// How the docs name it.
    pub fn describe(self) -> &'static str {
        match self {
            Caller::Anyone => "anyone",
            Caller::Joiner => "a joiner (server or worker token, checked by the route)",
            Caller::Node => "a node or an admin, by certificate, for itself",
            Caller::AgentUser => "the token, a voter, an admin, or this agent's own node",
        }
    }
}

/// An HTTP method of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
    Post,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    /// As the router matches it: `{name}` for a path segment.
    pub path: &'static str,
    pub caller: Caller,
    /// The largest request body the route takes; a larger one is answered 413 without being read past
    /// it, and a refusal reads and discards at most this much so that the client gets its answer.
    pub body_limit: usize,
    /// What it is for, as the reference says.
    pub purpose: &'static str,
}

/// A body no route that reads none needs more than: a client that sends one anyway gets its answer.
pub const SMALL_BODY: usize = 64 * 1024;
/// A manifest list, a join request or a key's value: etcd takes requests of 1.5 MiB at most.
pub const LARGE_BODY: usize = 2 * 1024 * 1024;

/// The prefix of the node API, which a voter serves to the nodes.
pub const NODE_API_PREFIX: &str = "/node/v1/";

const fn route(
    method: Method,
    path: &'static str,
    caller: Caller,
    body_limit: usize,
    purpose: &'static str,
) -> Route {
    Route {
        method,
        path,
        caller,
        body_limit,
        purpose,
    }
}

use Caller::{AgentUser, Anyone, Joiner, Node};
use Method::{Delete, Get, Post, Put};

pub const HEALTHZ: Route = route(
    Get,
    "/healthz",
    Anyone,
    SMALL_BODY,
    "`ok` while the API serves",
);
pub const CACERTS: Route = route(
    Get,
    "/cacerts",
    Anyone,
    SMALL_BODY,
    "the cluster CA, which a joiner checks against its token's fingerprint",
);
pub const DB_INFO: Route = route(
    Get,
    "/db/info",
    Joiner,
    SMALL_BODY,
    "the cluster a joiner is about to join (a voter)",
);
pub const DB_JOIN: Route = route(
    Post,
    "/db/join",
    Joiner,
    LARGE_BODY,
    "a join: the joiner's CSR in, its certificates and its role out (a voter)",
);
pub const PODS: Route = route(
    Get,
    "/pods",
    AgentUser,
    SMALL_BODY,
    "this node's pods and their statuses",
);
pub const POD: Route = route(
    Get,
    "/pods/{id}",
    AgentUser,
    SMALL_BODY,
    "one pod and its status",
);
pub const STATS: Route = route(
    Get,
    "/stats/{pod}/{container}",
    AgentUser,
    SMALL_BODY,
    "a container's resource use",
);
pub const POD_LOGS: Route = route(
    Get,
    "/pods/{id}/logs",
    AgentUser,
    SMALL_BODY,
    "a container's log (`container`, `follow`, `previous`, `tail`)",
);
pub const POD_EXEC: Route = route(
    Get,
    "/pods/{id}/exec",
    AgentUser,
    SMALL_BODY,
    "a command in a container, over an upgraded connection",
);
pub const POST_PODS: Route = route(
    Post,
    "/pods",
    AgentUser,
    LARGE_BODY,
    "the HTTP source: a manifest or a list replaces the set posted before",
);
pub const POST_CONTAINER: Route = route(
    Post,
    "/container",
    AgentUser,
    LARGE_BODY,
    "the HTTP source, as the 2014 agent named it",
);
pub const POST_CONTAINERS: Route = route(
    Post,
    "/containers",
    AgentUser,
    LARGE_BODY,
    "the HTTP source, as the 2014 agent named it",
);
pub const IMAGE_SAVE: Route = route(
    Get,
    "/images/save",
    Node,
    SMALL_BODY,
    "`docker save` of an image this node holds (`ref=`), for a node whose own pods name it (a voter checks) or an admin",
);
pub const IMAGE_CHECK: Route = route(
    Post,
    "/node/v1/image-check",
    Node,
    SMALL_BODY,
    "whether a node's own pods name an image (`node`, `image`), asked by a worker whose record lists the image (a voter)",
);
pub const NODE_KV_GET: Route = route(
    Get,
    "/node/v1/kv",
    Node,
    SMALL_BODY,
    "a key (`key=`) or the keys under a prefix (`prefix=`) (a voter)",
);
pub const NODE_KV_PUT: Route = route(
    Put,
    "/node/v1/kv",
    Node,
    LARGE_BODY,
    "a key's value (`key=`, with `lease=` or `ttl=`) (a voter)",
);
pub const NODE_KV_DELETE: Route = route(
    Delete,
    "/node/v1/kv",
    Node,
    SMALL_BODY,
    "a key (`key=`) (a voter)",
);
pub const NODE_LIST: Route = route(
    Get,
    "/node/v1/list",
    Node,
    SMALL_BODY,
    "what an informer lists (`prefix=`, `revision=`, `from=`) (a voter)",
);
pub const NODE_WATCH: Route = route(
    Get,
    "/node/v1/watch",
    Node,
    SMALL_BODY,
    "what an informer watches (`prefix=` or `key=`, `revision=`) (a voter)",
);
pub const NODE_LEASE_DELETE: Route = route(
    Delete,
    "/node/v1/lease",
    Node,
    SMALL_BODY,
    "a lease the node uses (`id=`) (a voter)",
);
pub const NODE_LEASE_KEEPALIVE: Route = route(
    Post,
    "/node/v1/lease/keepalive",
    Node,
    SMALL_BODY,
    "a lease the node uses, renewed (`id=`) (a voter)",
);
pub const NODE_CERTIFICATES: Route = route(
    Post,
    "/node/v1/certificates",
    Node,
    LARGE_BODY,
    "a worker's certificates issued again for a new key (a voter; voters and admins are refused)",
);
pub const NODE_TOKEN: Route = route(
    Post,
    "/node/v1/token",
    Node,
    LARGE_BODY,
    "a worker's own one-use token in place of the server token it kept (a voter)",
);

/// The table, grouped by who may call.
pub const ROUTES: &[Route] = &[
    HEALTHZ,
    CACERTS,
    DB_INFO,
    DB_JOIN,
    PODS,
    POD,
    STATS,
    POD_LOGS,
    POD_EXEC,
    POST_PODS,
    POST_CONTAINER,
    POST_CONTAINERS,
    IMAGE_SAVE,
    NODE_KV_GET,
    NODE_KV_PUT,
    NODE_KV_DELETE,
    NODE_LIST,
    NODE_WATCH,
    NODE_LEASE_DELETE,
    NODE_LEASE_KEEPALIVE,
    NODE_CERTIFICATES,
    NODE_TOKEN,
    IMAGE_CHECK,
];

/// What the gate knows of a request's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Found(&'static Route),
    /// The path is in the table for other methods.
    WrongMethod,
    NotFound,
}

/// The entry for `method` on `path`, where `path` is the route's pattern as the router matched it.
pub fn find(method: &str, path: &str) -> Lookup {
    let mut path_known = false;
    for r in ROUTES {
        if r.path == path {
            if r.method.as_str() == method {
                return Lookup::Found(r);
            }
            path_known = true;
        }
    }
    if path_known {
        Lookup::WrongMethod
    } else {
        Lookup::NotFound
    }
}

/// The methods the table has for `path` (a 405's `Allow`).
pub fn methods_of(path: &str) -> Vec<&'static str> {
    ROUTES
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.method.as_str())
        .collect()
}

/// The rows docs/reference.md shows under "Routes": method, path, who may call, body limit, purpose.
pub fn route_rows() -> Vec<[String; 5]> {
    ROUTES
        .iter()
        .map(|r| {
            [
                r.method.to_string(),
                r.path.to_string(),
                r.caller.describe().to_string(),
                human_size(r.body_limit),
                r.purpose.to_string(),
            ]
        })
        .collect()
}

fn human_size(n: usize) -> String {
    if n % (1024 * 1024) == 0 {
        format!("{} MiB", n / (1024 * 1024))
    } else {
        format!("{} KiB", n / 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_and_path_is_in_the_table_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
        }
    }

    #[test]
    fn only_health_and_the_ca_are_open_and_the_node_api_takes_nodes_only() {
        for r in ROUTES {
            let open = r.caller == Caller::Anyone;
            assert_eq!(
                open,
                r.method == Method::Get && matches!(r.path, "/healthz" | "/cacerts"),
                "{} {}",
                r.method,
                r.path
            );
            // Nodes call the node API, and one route besides that every agent serves them: its images.
            assert_eq!(
                r.path.starts_with(NODE_API_PREFIX) || *r == IMAGE_SAVE,
                r.caller == Caller::Node,
                "{} {}",
                r.method,
                r.path
            );
        }
    }

    #[test]
    fn lookups_tell_an_unknown_path_from_a_wrong_method() {
        assert_eq!(find("PUT", "/node/v1/kv"), Lookup::Found(&NODE_KV_PUT));
        assert_eq!(find("POST", "/node/v1/kv"), Lookup::WrongMethod);
        assert_eq!(find("GET", "/pods/{id}/logs"), Lookup::Found(&POD_LOGS));
        // A pattern, not a request path: the router's match is what the gate looks up.
        assert_eq!(find("GET", "/pods/web/logs"), Lookup::NotFound);
        assert_eq!(find("GET", "/anything-new"), Lookup::NotFound);
        assert_eq!(methods_of("/pods"), vec!["GET", "POST"]);
    }

    #[test]
    fn the_rows_name_every_route_with_its_limit() {
        let rows = route_rows();
        assert_eq!(rows.len(), ROUTES.len());
        assert!(rows.contains(&[
            "PUT".to_string(),
            "/node/v1/kv".to_string(),
            Caller::Node.describe().to_string(),
            "2 MiB".to_string(),
            NODE_KV_PUT.purpose.to_string(),
        ]));
        assert_eq!(human_size(SMALL_BODY), "64 KiB");
    }
}
