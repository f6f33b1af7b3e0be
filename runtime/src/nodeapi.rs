//! The informer's [`ListWatch`] over a voter's node API instead of etcd: what a worker's informers use to
//! reach the cluster through the voters. The voter lists and watches etcd for it (after deciding whether
//! the calling node may), and this side turns its answers back into the informer's pages and events, so an
//! informer cannot tell the two apart.
//!
//! - `GET /node/v1/list?prefix=P&revision=R[&from=F]`: one page, [`WirePage`]; 410 when `R` is compacted;
//! - `GET /node/v1/watch?prefix=P&revision=R`: one [`WireItem`] per line (JSON), as etcd's watch answers,
//!   and an empty one every [`HEARTBEAT`] while nothing changes;
//! - `key=K` instead of `prefix=P`: that key alone.
//!
//! Keys and values travel as base64 (a value may be any bytes). A failed request goes to the next voter
//! the next time; a watch resumes there from its revision.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use futures::stream::BoxStream;
use futures::StreamExt;
use hostlet_api::routes;
use serde::{Deserialize, Serialize};

use crate::etcd::EtcdError;
use crate::informer::{ListWatch, Page, RawEvent, RawKv, WatchItem};

/// How often a watch with nothing to say sends an empty line.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(30);
/// A watch silent for this long is given up (its voter may be gone without a word) and opened again.
pub const WATCH_IDLE: std::time::Duration = std::time::Duration::from_secs(95);

/// A key-value on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireKv {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl From<&RawKv> for WireKv {
    fn from(kv: &RawKv) -> Self {
        WireKv {
            key: kv.key.clone(),
            value: B64.encode(&kv.value),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

impl WireKv {
    fn raw(self) -> Result<RawKv, String> {
        Ok(RawKv {
            value: B64
                .decode(&self.value)
                .map_err(|e| format!("{}: value: {e}", self.key))?,
            key: self.key,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        })
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WirePage {
    pub revision: i64,
    pub kvs: Vec<WireKv>,
    /// Where the next page starts (base64), if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl From<&Page> for WirePage {
    fn from(p: &Page) -> Self {
        WirePage {
            revision: p.revision,
            kvs: p.kvs.iter().map(WireKv::from).collect(),
            next: p.next.as_ref().map(|n| B64.encode(n)),
        }
    }
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum WireEvent {
    Put { kv: WireKv },
    Delete { key: String, revision: i64 },
}

/// One line of a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum WireItem {
    Events {
        events: Vec<WireEvent>,
    },
    Compacted {
        revision: i64,
    },
    /// List again: what the node may read changed.
    Relist,
}

impl From<&WatchItem> for WireItem {
    fn from(w: &WatchItem) -> Self {
        match w {
            WatchItem::Events(events) => WireItem::Events {
                events: events
                    .iter()
                    .map(|e| match e {
                        RawEvent::Put(kv) => WireEvent::Put { kv: kv.into() },
                        RawEvent::Delete { key, revision } => WireEvent::Delete {
                            key: key.clone(),
                            revision: *revision,
                        },
                    })
                    .collect(),
            },
            WatchItem::Compacted(r) => WireItem::Compacted { revision: *r },
            WatchItem::Relist => WireItem::Relist,
        }
    }
}

impl WireItem {
    fn item(self) -> Result<WatchItem, String> {
        Ok(match self {
            WireItem::Compacted { revision } => WatchItem::Compacted(revision),
            WireItem::Relist => WatchItem::Relist,
            WireItem::Events { events } => WatchItem::Events(
                events
                    .into_iter()
                    .map(|e| {
                        Ok(match e {
                            WireEvent::Put { kv } => RawEvent::Put(kv.raw()?),
                            WireEvent::Delete { key, revision } => {
                                RawEvent::Delete { key, revision }
                            }
                        })
                    })
                    .collect::<Result<_, String>>()?,
            ),
        })
    }
}

fn failed(url: &str, why: impl std::fmt::Display) -> EtcdError {
    EtcdError::unavailable(url, etcd_client::Error::InvalidArgs(why.to_string()))
}

/// A refusal: the same on every voter, so never retried elsewhere.
fn refused(status: reqwest::StatusCode, body: &str) -> EtcdError {
    EtcdError::request(etcd_client::Error::InvalidArgs(format!(
        "the node API refused ({status}): {}",
        body.trim()
    )))
}

/// How long a request other than a watch may take at one voter, its answer read.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The header a voter sets on the answer that refuses a revoked certificate.
pub const REVOKED_HEADER: &str = "hostlet-certificate-revoked";
/// The header on every answer of a voter's node API: a 404 without it comes from an agent that serves
/// none (a node record can still name a member that is gone), and the request goes to the next voter.
pub const NODE_API_HEADER: &str = "hostlet-node-api";

/// The voters' API URLs one node's requests go to, shared by its client and every list-watch of it.
struct Voters {
    urls: std::sync::RwLock<Vec<String>>,
    /// The voter tried first.
    next: AtomicUsize,
    /// Counts the requests that no voter answered.
    unreachable: tokio::sync::watch::Sender<u64>,
    /// Set once a voter refuses this node's certificate as revoked: why.
    revoked: tokio::sync::watch::Sender<Option<String>>,
}

/// A node's client of the voters' node API: the keys it may read and write, its leases, and the
/// list-watches of its informers. A request that a voter cannot serve goes to the next one; a refusal
/// is final.
#[derive(Clone)]
pub struct NodeApiClient {
    /// Built again when the node's certificate is renewed: requests from then on present the new one.
    http: Arc<std::sync::RwLock<reqwest::Client>>,
    voters: Arc<Voters>,
}

impl std::fmt::Debug for NodeApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApiClient")
            .field("voters", &self.urls())
            .finish()
    }
}

#[derive(Deserialize)]
struct KvItem {
    value: String,
}

#[derive(Deserialize)]
struct Revision {
    revision: i64,
}

#[derive(Deserialize)]
struct Deleted {
    deleted: i64,
}

#[derive(Deserialize)]
struct LeaseId {
    lease: i64,
}

impl NodeApiClient {
    /// `http` carries the node's certificate and trusts the cluster CA; `urls` are the voters' API URLs.
    pub fn new(http: reqwest::Client, urls: Vec<String>) -> Self {
        NodeApiClient {
            http: Arc::new(std::sync::RwLock::new(http)),
            voters: Arc::new(Voters {
                urls: std::sync::RwLock::new(urls),
                next: AtomicUsize::new(0),
                unreachable: tokio::sync::watch::Sender::new(0),
                revoked: tokio::sync::watch::Sender::new(None),
            }),
        }
    }

    /// A client presenting the certificate and key of `tls`, trusting its CA only.
    pub fn from_files(tls: &crate::etcd::TlsFiles, urls: Vec<String>) -> Result<Self, EtcdError> {
        Ok(NodeApiClient::new(Self::http_from_files(tls)?, urls))
    }

    /// Presents the certificate and key of `tls` from now on (they were renewed); requests under way
    /// finish as they began.
    pub fn reload(&self, tls: &crate::etcd::TlsFiles) -> Result<(), EtcdError> {
        let http = Self::http_from_files(tls)?;
        *self.http.write().unwrap_or_else(|p| p.into_inner()) = http;
        Ok(())
    }

    fn http(&self) -> reqwest::Client {
        self.http.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn http_from_files(tls: &crate::etcd::TlsFiles) -> Result<reqwest::Client, EtcdError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| EtcdError::TlsFile {
                path: path.to_path_buf(),
                source,
            })
        };
        let mut identity = read(&tls.cert)?;
        identity.extend_from_slice(&read(&tls.key)?);
        let bad = |path: &std::path::Path, e: reqwest::Error| EtcdError::InvalidEndpoint {
            endpoint: path.display().to_string(),
            reason: e.to_string(),
        };
        let http = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(&read(&tls.ca)?).map_err(|e| bad(&tls.ca, e))?,
            )
            .identity(reqwest::Identity::from_pem(&identity).map_err(|e| bad(&tls.cert, e))?)
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| bad(&tls.cert, e))?;
        Ok(http)
    }

    /// The voters' API URLs it uses.
    pub fn urls(&self) -> Vec<String> {
        self.voters
            .urls
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Uses `urls` from now on (an empty list is ignored: the last voters known are better than none). The
    /// voter in use stays first while it is in the list.
    pub fn set_urls(&self, urls: Vec<String>) {
        if urls.is_empty() {
            return;
        }
        let mut cur = self.voters.urls.write().unwrap_or_else(|p| p.into_inner());
        if *cur == urls {
            return;
        }
        let in_use = cur.get(self.voters.next.load(Ordering::Relaxed) % cur.len().max(1));
        let next = in_use
            .and_then(|u| urls.iter().position(|n| n == u))
            .unwrap_or(0);
        *cur = urls;
        self.voters.next.store(next, Ordering::Relaxed);
    }

    /// Ticks each time a request found no voter to answer it.
    pub fn watch_unreachable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.voters.unreachable.subscribe()
    }

    /// Holds why once a voter refused this node's certificate as revoked.
    pub fn revoked(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.voters.revoked.subscribe()
    }

    /// The list-watch of the keys under `prefix`.
    pub fn list_watch(&self, prefix: impl Into<String>) -> NodeApiListWatch {
        NodeApiListWatch {
            client: self.clone(),
            scope: ("prefix", prefix.into()),
            relist: None,
        }
    }

    /// The list-watch of one key (a node may read some keys but no prefix around them).
    pub fn key_watch(&self, key: impl Into<String>) -> NodeApiListWatch {
        NodeApiListWatch {
            client: self.clone(),
            scope: ("key", key.into()),
            relist: None,
        }
    }

    /// Sends one request to each voter in turn until one serves it: a voter that cannot be reached or
    /// fails on its side (5xx) is passed over; any other answer is the answer.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<reqwest::Response, EtcdError> {
        let urls = self.urls();
        if urls.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        let first = self.voters.next.load(Ordering::Relaxed);
        let mut last = None;
        let http = self.http();
        for i in 0..urls.len() {
            let n = (first + i) % urls.len();
            let base = &urls[n];
            let mut req = http
                .request(method.clone(), format!("{base}{path}"))
                .query(query);
            // A watch's answer lasts as long as the watch; anything else that takes longer than this is a
            // voter that hangs, and the next one is asked.
            if path != routes::NODE_WATCH.path {
                req = req.timeout(REQUEST_TIMEOUT);
            }
            if let Some(b) = &body {
                req = req.body(b.clone());
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    last = Some(failed(base, e));
                    continue;
                }
            };
            let status = resp.status();
            if status == reqwest::StatusCode::NOT_FOUND
                && !resp.headers().contains_key(NODE_API_HEADER)
            {
                last = Some(failed(base, "this agent serves no node API (not a voter)"));
                continue;
            }
            if status.is_server_error() {
                let text = resp.text().await.unwrap_or_default();
                last = Some(failed(base, format!("{status}: {}", text.trim())));
                continue;
            }
            // The voter that answered is asked first next time.
            self.voters.next.store(n, Ordering::Relaxed);
            if status == reqwest::StatusCode::GONE {
                let revision = query
                    .iter()
                    .find(|(k, _)| *k == "revision")
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                return Err(EtcdError::Compacted {
                    revision,
                    source: Box::new(etcd_client::Error::InvalidArgs("compacted".into())),
                });
            }
            if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
                return Ok(resp);
            }
            let revoked = resp.headers().contains_key(REVOKED_HEADER);
            let text = resp.text().await.unwrap_or_default();
            if revoked {
                let why = text.trim().to_string();
                self.voters.revoked.send_if_modified(|cur| {
                    let first = cur.is_none();
                    if first {
                        *cur = Some(why);
                    }
                    first
                });
            }
            return Err(refused(status, &text));
        }
        self.voters
            .next
            .store((first + 1) % urls.len(), Ordering::Relaxed);
        self.voters.unreachable.send_modify(|n| *n += 1);
        Err(last.unwrap_or(EtcdError::NoEndpoints))
    }

    /// `POST path` with `body` as JSON, to the first voter that serves it; its JSON answer. A 404 is an
    /// error here (the voters do not serve `path`).
    pub async fn post_json<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, EtcdError> {
        let bytes = serde_json::to_vec(body).map_err(|e| failed(path, e))?;
        let resp = self
            .send(reqwest::Method::POST, path, &[], Some(bytes))
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            let url = resp.url().to_string();
            let text = resp.text().await.unwrap_or_default();
            let why = match text.trim() {
                "" => "no such route: the voter most likely runs an earlier hostlet version",
                t => t,
            };
            return Err(failed(&url, format!("404: {why}")));
        }
        Self::json(resp).await
    }

    async fn json<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, EtcdError> {
        let url = resp.url().to_string();
        resp.json().await.map_err(|e| failed(&url, e))
    }

    /// The value of `key`, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let resp = self
            .send(
                reqwest::Method::GET,
                routes::NODE_KV_GET.path,
                &[("key", key.to_string())],
                None,
            )
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let item: KvItem = Self::json(resp).await?;
        Ok(Some(item.value.into_bytes()))
    }

    /// Every key and value under `prefix`, read page by page at one revision, and that revision.
    pub async fn list(&self, prefix: &str) -> Result<(Vec<RawKv>, i64), EtcdError> {
        let lw = self.list_watch(prefix);
        let mut out = Vec::new();
        let mut from: Option<Vec<u8>> = None;
        let mut revision = 0;
        loop {
            let page = lw.list(from.as_deref(), revision).await?;
            revision = page.revision;
            out.extend(page.kvs);
            match page.next {
                Some(n) => from = Some(n),
                None => return Ok((out, revision)),
            }
        }
    }

    /// Writes `key`; the revision it made.
    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<i64, EtcdError> {
        let resp = self
            .send(
                reqwest::Method::PUT,
                routes::NODE_KV_PUT.path,
                &[("key", key.to_string())],
                Some(value.into()),
            )
            .await?;
        Ok(Self::json::<Revision>(resp).await?.revision)
    }

    /// Writes `key` attached to one of this node's leases.
    pub async fn put_with_lease(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<i64, EtcdError> {
        let resp = self
            .send(
                reqwest::Method::PUT,
                routes::NODE_KV_PUT.path,
                &[("key", key.to_string()), ("lease", lease.to_string())],
                Some(value.into()),
            )
            .await?;
        Ok(Self::json::<Revision>(resp).await?.revision)
    }

    /// Deletes `key`; how many keys went (0 or 1).
    pub async fn delete(&self, key: &str) -> Result<i64, EtcdError> {
        let resp = self
            .send(
                reqwest::Method::DELETE,
                routes::NODE_KV_DELETE.path,
                &[("key", key.to_string())],
                None,
            )
            .await?;
        Ok(Self::json::<Deleted>(resp).await?.deleted)
    }

    /// Writes `key` attached to a new lease of `ttl`, granted by the voter that writes it; the lease.
    pub async fn put_with_new_lease(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
        ttl: std::time::Duration,
    ) -> Result<i64, EtcdError> {
        let resp = self
            .send(
                reqwest::Method::PUT,
                routes::NODE_KV_PUT.path,
                &[
                    ("key", key.to_string()),
                    ("ttl", ttl.as_secs().max(1).to_string()),
                ],
                Some(value.into()),
            )
            .await?;
        Ok(Self::json::<LeaseId>(resp).await?.lease)
    }

    /// Renews one of this node's leases once; [`EtcdError::LeaseExpired`] when it is gone.
    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<(), EtcdError> {
        let resp = self
            .send(
                reqwest::Method::POST,
                routes::NODE_LEASE_KEEPALIVE.path,
                &[("id", lease.to_string())],
                None,
            )
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(EtcdError::LeaseExpired(lease));
        }
        Ok(())
    }

    /// Ends one of this node's leases and the keys attached to it.
    pub async fn lease_revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.send(
            reqwest::Method::DELETE,
            routes::NODE_LEASE_DELETE.path,
            &[("id", lease.to_string())],
            None,
        )
        .await?;
        Ok(())
    }
}

/// Asks a list-watch for a fresh list (its watch ends as a compacted one would): what a node may read
/// under a prefix changed although no key there did (a pod of its own began or stopped using a Secret).
#[derive(Clone, Default)]
pub struct Relist(Option<Arc<tokio::sync::Notify>>);

impl Relist {
    /// A handle that asks nothing (a list-watch of etcd sees every key anyway).
    pub fn none() -> Self {
        Relist(None)
    }

    /// Relists now (or as soon as the watch is open).
    pub fn now(&self) {
        if let Some(n) = &self.0 {
            n.notify_one();
        }
    }
}

/// [`ListWatch`] of one prefix (or key) through the voters' node API.
pub struct NodeApiListWatch {
    client: NodeApiClient,
    /// `prefix` or `key`, and its value.
    scope: (&'static str, String),
    relist: Option<Arc<tokio::sync::Notify>>,
}

impl NodeApiListWatch {
    /// The same list-watch, and the handle that makes it relist.
    pub fn relisting(mut self) -> (Self, Relist) {
        let n = Arc::new(tokio::sync::Notify::new());
        self.relist = Some(n.clone());
        (self, Relist(Some(n)))
    }
}

impl ListWatch for NodeApiListWatch {
    type Watch = BoxStream<'static, Result<WatchItem, EtcdError>>;

    async fn list(&self, from: Option<&[u8]>, revision: i64) -> Result<Page, EtcdError> {
        let mut query = vec![
            (self.scope.0, self.scope.1.clone()),
            ("revision", revision.to_string()),
        ];
        if let Some(f) = from {
            query.push(("from", B64.encode(f)));
        }
        let resp = self
            .client
            .send(reqwest::Method::GET, routes::NODE_LIST.path, &query, None)
            .await?;
        let base = resp.url().to_string();
        let page: WirePage = resp.json().await.map_err(|e| failed(&base, e))?;
        Ok(Page {
            revision: page.revision,
            kvs: page
                .kvs
                .into_iter()
                .map(WireKv::raw)
                .collect::<Result<_, _>>()
                .map_err(|e| failed(&base, e))?,
            next: match page.next {
                Some(n) => Some(B64.decode(n).map_err(|e| failed(&base, e))?),
                None => None,
            },
        })
    }

    async fn watch(&self, start_revision: i64) -> Result<Self::Watch, EtcdError> {
        let query = [
            (self.scope.0, self.scope.1.clone()),
            ("revision", start_revision.to_string()),
        ];
        let resp = self
            .client
            .send(reqwest::Method::GET, routes::NODE_WATCH.path, &query, None)
            .await?;
        let base = resp.url().to_string();
        let bytes = resp.bytes_stream();
        let relist = self.relist.clone();
        // Lines may arrive split across chunks: keep the unfinished one.
        let lines = futures::stream::unfold(
            (bytes, Vec::<u8>::new(), base, relist),
            move |(mut bytes, mut buf, base, relist)| async move {
                loop {
                    if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=i).collect();
                        let item = serde_json::from_slice::<WireItem>(&line)
                            .map_err(|e| e.to_string())
                            .and_then(WireItem::item)
                            .map_err(|e| failed(&base, e));
                        return Some((item, (bytes, buf, base, relist)));
                    }
                    let asked = async {
                        match &relist {
                            Some(n) => n.notified().await,
                            None => std::future::pending().await,
                        }
                    };
                    let next = tokio::select! {
                        next = tokio::time::timeout(WATCH_IDLE, bytes.next()) => next,
                        () = asked => {
                            // What may be read changed: a relist, as after a compaction.
                            return Some((Ok(WatchItem::Relist), (bytes, Vec::new(), base, relist)));
                        }
                    };
                    match next {
                        Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
                        Ok(Some(Err(e))) => {
                            let e = failed(&base, e);
                            return Some((Err(e), (bytes, Vec::new(), base, relist)));
                        }
                        Ok(None) => return None,
                        Err(_) => {
                            let e = failed(&base, "the watch was silent past its heartbeat");
                            return Some((Err(e), (bytes, Vec::new(), base, relist)));
                        }
                    }
                }
            },
        );
        Ok(lines.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_items_survive_the_wire_with_any_bytes() {
        let kv = RawKv {
            key: "/hostlet/hosts/w1/pods/a".into(),
            value: vec![0, 159, 146, 150, b'\n'],
            create_revision: 3,
            mod_revision: 5,
            version: 2,
            lease: 7,
        };
        let page = Page {
            revision: 9,
            kvs: vec![kv.clone()],
            next: Some(b"/hostlet/hosts/w1/pods/a\0".to_vec()),
        };
        let wire = serde_json::to_string(&WirePage::from(&page)).unwrap();
        let back: WirePage = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.kvs[0].clone().raw().unwrap(), kv);
        assert_eq!(B64.decode(back.next.unwrap()).unwrap(), page.next.unwrap());
        for item in [
            WatchItem::Events(vec![
                RawEvent::Put(kv),
                RawEvent::Delete {
                    key: "/k".into(),
                    revision: 10,
                },
            ]),
            WatchItem::Compacted(4),
            WatchItem::Relist,
        ] {
            let line = serde_json::to_string(&WireItem::from(&item)).unwrap();
            assert!(!line.contains('\n'));
            let back: WireItem = serde_json::from_str(&line).unwrap();
            assert_eq!(back.item().unwrap(), item);
        }
    }
}
