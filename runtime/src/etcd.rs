//! The one place that builds etcd clients.
//!
//! [`Etcd`] talks to one endpoint at a time over a plain channel, so a dead endpoint fails fast instead of
//! being retried forever inside a balancer. A request that fails with a transport error or `Unavailable`
//! moves the client to the next endpoint and is retried there ([`Etcd::with_retry`]). Learners are kept out
//! of the endpoint list ([`Etcd::set_endpoints`], [`Etcd::sync_endpoints`]): they refuse most requests.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, DeleteOptions, GetOptions, KeyValue, Member, PutOptions,
    StatusResponse, Txn, TxnResponse, WatchOptions, WatchStream, Watcher,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

/// Largest response this client decodes (lists and watch batches of big prefixes exceed gRPC's 4 MiB default).
const MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;
/// Keys per page when listing a prefix; keeps each response well under the decoding limit.
pub const LIST_PAGE_SIZE: i64 = 1000;
/// How often [`Etcd::move_leader`] asks the old leader whether leadership has moved.
const MOVE_LEADER_LOOK: Duration = Duration::from_millis(10);
/// Pause between two full rounds over the endpoints.
const ROUND_PAUSE: Duration = Duration::from_millis(200);
/// Full rounds over the endpoints before a request gives up.
const ROUNDS: usize = 2;

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs (`http://host:2379`, `https://host:2379`, or `host:2379`, which takes its scheme from `tls`).
    pub endpoints: Vec<String>,
    /// Client certificate authentication; `None` for plain HTTP.
    pub tls: Option<TlsFiles>,
    pub connect_timeout: Duration,
    /// Deadline of one attempt of one unary request (watches are not limited).
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// Plain-HTTP config with the default timeouts (connect 5 s, request 10 s).
    ///
    /// ```
    /// let cfg = hostlet_runtime::EtcdConfig::new(["http://127.0.0.1:2379"]);
    /// assert_eq!(cfg.endpoints.len(), 1);
    /// ```
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }

    #[must_use]
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// PEM files for TLS with client certificate authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server certificates.
    pub ca: PathBuf,
    /// This client's certificate and key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoints given")]
    NoEndpoints,
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("cannot read TLS file {}: {source}", path.display())]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every endpoint was tried and none answered; `source` is the last failure.
    #[error("etcd unavailable (tried {endpoints}): {source}")]
    Unavailable {
        endpoints: String,
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// The revision asked for is older than the last compaction.
    #[error("etcd revision {revision} has been compacted")]
    Compacted {
        revision: i64,
        #[source]
        source: Box<etcd_client::Error>,
    },
    #[error("etcd lease {0:x} has expired")]
    LeaseExpired(i64),
    #[error("no etcd member reports a leader")]
    NoLeader,
    /// etcd answered, with an error that retrying elsewhere would not change.
    #[error("etcd request failed: {0}")]
    Request(#[source] Box<etcd_client::Error>),
}

impl EtcdError {
    /// The endpoint(s) could not serve.
    pub fn unavailable(endpoints: impl Into<String>, source: etcd_client::Error) -> Self {
        EtcdError::Unavailable {
            endpoints: endpoints.into(),
            source: Box::new(source),
        }
    }

    /// An answer that retrying elsewhere would not change (a compacted revision is told apart).
    pub fn request(source: etcd_client::Error) -> Self {
        classify(source, 0)
    }

    /// The gRPC status code etcd answered with, if it answered.
    pub fn code(&self) -> Option<Code> {
        match self {
            EtcdError::Unavailable { source, .. }
            | EtcdError::Compacted { source, .. }
            | EtcdError::Request(source) => grpc_code(source),
            _ => None,
        }
    }

    /// A connection problem: worth retrying later, perhaps elsewhere.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EtcdError::Unavailable { .. })
    }

    pub fn is_compacted(&self) -> bool {
        matches!(self, EtcdError::Compacted { .. })
    }

    /// The endpoint's host refused the TCP connection: nothing listens there. Unlike a timeout, this is an
    /// answer from the host itself.
    pub fn is_connection_refused(&self) -> bool {
        let source = match self {
            EtcdError::Unavailable { source, .. } | EtcdError::Request(source) => source.as_ref(),
            _ => return false,
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match source {
            etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
            etcd_client::Error::TransportError(t) => Some(t),
            etcd_client::Error::IoError(io) => Some(io),
            _ => None,
        };
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return true;
                }
            }
            cause = c.source();
        }
        false
    }

    /// The message etcd gave (e.g. `etcdserver: too many learner members in cluster`), if it answered.
    pub fn server_message(&self) -> Option<&str> {
        match self {
            EtcdError::Unavailable { source, .. }
            | EtcdError::Compacted { source, .. }
            | EtcdError::Request(source) => match source.as_ref() {
                etcd_client::Error::GRpcStatus(s) => Some(s.message()),
                _ => None,
            },
            _ => None,
        }
    }
}

fn grpc_code(e: &etcd_client::Error) -> Option<Code> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some(s.code()),
        _ => None,
    }
}

/// Whether a failure says "this endpoint cannot serve now" rather than "the request is wrong".
fn is_retryable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // A broken stream surfaces as a watch error from etcd-client.
        etcd_client::Error::WatchError(_) => true,
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            // Unknown is what a broken connection becomes; etcd itself answers with specific codes.
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => true,
            // tonic's own request timeout.
            Code::Cancelled => s.message().contains("Timeout expired"),
            _ => false,
        },
        _ => false,
    }
}

fn is_compaction(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == Code::OutOfRange || s.message().contains("required revision has been compacted"))
}

/// Maps a final (non-retried) failure into the error enum.
fn classify(e: etcd_client::Error, revision: i64) -> EtcdError {
    if is_compaction(&e) {
        EtcdError::Compacted {
            revision,
            source: Box::new(e),
        }
    } else {
        EtcdError::Request(Box::new(e))
    }
}

/// The failure a request that got no answer in time stands for.
fn timed_out(what: &str, after: Duration) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(format!(
        "{what}: no answer within {after:?}"
    )))
}

/// The client in use and the endpoint it talks to.
struct Active {
    endpoints: Vec<String>,
    index: usize,
    client: Client,
    /// Bumped on every switch, so concurrent failures of one client rotate only once.
    generation: u64,
}

/// How every client is built.
struct Settings {
    /// Built again from `tls_files` when the certificate is renewed ([`Etcd::reload_tls`]).
    tls: std::sync::RwLock<Option<ClientTlsConfig>>,
    tls_files: Option<TlsFiles>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

struct Inner {
    settings: Settings,
    active: Mutex<Active>,
    /// One client per endpoint for per-member calls (status, move-leader), built on first use.
    per_endpoint: Mutex<HashMap<String, Client>>,
    /// Counts requests that no endpoint could serve, for those that keep the endpoint list fresh.
    unreachable: tokio::sync::watch::Sender<u64>,
}

/// A cheap-to-clone handle on the etcd cluster.
///
/// ```no_run
/// # async fn demo() -> Result<(), hostlet_runtime::EtcdError> {
/// use hostlet_runtime::{Etcd, EtcdConfig};
/// let etcd = Etcd::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// etcd.put("/hostlet/nodes/n1", "{}").await?;
/// let kv = etcd.get("/hostlet/nodes/n1").await?;
/// assert!(kv.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.active();
        f.debug_struct("Etcd")
            .field("endpoints", &a.endpoints)
            .field("current", &a.endpoints.get(a.index))
            .finish()
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::TlsFile {
        path: path.to_path_buf(),
        source,
    })
}

impl Etcd {
    /// Builds the client. Connections are made lazily: this fails only on a bad config, not on an etcd
    /// that is not up yet (the agent starts before its member serves).
    pub async fn connect(cfg: EtcdConfig) -> Result<Etcd, EtcdError> {
        let tls = cfg.tls.as_ref().map(tls_config).transpose()?;
        let settings = Settings {
            tls: std::sync::RwLock::new(tls),
            tls_files: cfg.tls.clone(),
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
        };
        let endpoints = normalise_endpoints(&cfg.endpoints, settings.uses_tls())?;
        let client = settings.build_client(&endpoints[0]).await?;
        Ok(Etcd {
            inner: Arc::new(Inner {
                settings,
                active: Mutex::new(Active {
                    endpoints,
                    index: 0,
                    client,
                    generation: 0,
                }),
                per_endpoint: Mutex::new(HashMap::new()),
                unreachable: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    fn active(&self) -> MutexGuard<'_, Active> {
        self.inner.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Presents the client certificate in its files again (it was renewed): every connection made from
    /// now on does; requests and watches under way finish on the connections they have.
    pub async fn reload_tls(&self) -> Result<(), EtcdError> {
        let Some(files) = &self.inner.settings.tls_files else {
            return Ok(());
        };
        let config = tls_config(files)?;
        *self
            .inner
            .settings
            .tls
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(config);
        self.inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let endpoint = self.current_endpoint();
        let client = self.inner.settings.build_client(&endpoint).await?;
        let mut a = self.active();
        a.client = client;
        a.generation += 1;
        Ok(())
    }

    /// The raw client for the endpoint in use, for calls this wrapper does not cover. It does not follow
    /// later endpoint switches; take a fresh one per operation.
    pub fn client(&self) -> Client {
        self.active().client.clone()
    }

    /// The endpoints requests may go to (voters only, once [`Etcd::sync_endpoints`] ran).
    pub fn endpoints(&self) -> Vec<String> {
        self.active().endpoints.clone()
    }

    /// Changes each time a request has failed on every endpoint (the endpoints known may all be gone).
    pub fn watch_unreachable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.unreachable.subscribe()
    }

    /// The endpoint requests go to now.
    pub fn current_endpoint(&self) -> String {
        let a = self.active();
        a.endpoints[a.index].clone()
    }

    /// The configured request deadline.
    pub fn request_timeout(&self) -> Duration {
        self.inner.settings.request_timeout
    }

    /// Replaces the endpoint list (give voting members only). The current endpoint is kept if it is still
    /// listed, so a healthy connection is not dropped.
    pub async fn set_endpoints<I, S>(&self, endpoints: I) -> Result<(), EtcdError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let wanted: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        let wanted = normalise_endpoints(&wanted, self.inner.settings.uses_tls())?;
        let switch_to = {
            let mut a = self.active();
            let current = a.endpoints[a.index].clone();
            if let Some(i) = wanted.iter().position(|e| *e == current) {
                a.endpoints = wanted;
                a.index = i;
                return Ok(());
            }
            wanted[0].clone()
        };
        let client = self.inner.settings.build_client(&switch_to).await?;
        let mut a = self.active();
        a.endpoints = wanted;
        a.index = 0;
        a.client = client;
        a.generation += 1;
        Ok(())
    }

    /// Points the client at the cluster's voting members, as `member_list` reports them.
    pub async fn sync_endpoints(&self) -> Result<Vec<String>, EtcdError> {
        let members = self.member_list().await?;
        let voters: Vec<String> = members
            .iter()
            .filter(|m| !m.is_learner())
            .filter_map(|m| m.client_urls().first().cloned())
            .collect();
        if !voters.is_empty() {
            self.set_endpoints(voters.clone()).await?;
        }
        Ok(voters)
    }

    /// Moves to the next endpoint, unless someone already moved away from the failed client.
    async fn rotate(&self, failed_generation: u64) {
        let next = {
            let a = self.active();
            if a.generation != failed_generation || a.endpoints.len() < 2 {
                return;
            }
            let index = (a.index + 1) % a.endpoints.len();
            (index, a.endpoints[index].clone())
        };
        let client = match self.inner.settings.build_client(&next.1).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(endpoint = %next.1, error = %e, "cannot build etcd client");
                return;
            }
        };
        let mut a = self.active();
        if a.generation == failed_generation && a.endpoints.get(next.0) == Some(&next.1) {
            tracing::debug!(endpoint = %next.1, "etcd: switching endpoint");
            a.index = next.0;
            a.client = client;
            a.generation += 1;
        }
    }

    /// Runs `op` with a client, moving to the next endpoint and retrying when the endpoint cannot serve
    /// (transport error, `Unavailable`, timeout). Other errors return at once. Use it for idempotent
    /// requests only: a retried request may have been applied by the endpoint that failed.
    ///
    /// ```no_run
    /// # async fn demo(etcd: hostlet_runtime::Etcd) -> Result<(), hostlet_runtime::EtcdError> {
    /// let resp = etcd.with_retry(|mut c| async move { c.status().await }).await?;
    /// println!("raft index {}", resp.raft_index());
    /// # Ok(()) }
    /// ```
    pub async fn with_retry<T, F, Fut>(&self, mut op: F) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.settings.request_timeout;
        let mut last = None;
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(ROUND_PAUSE).await;
            }
            let n = self.active().endpoints.len();
            for _ in 0..n {
                let (client, generation) = {
                    let a = self.active();
                    (a.client.clone(), a.generation)
                };
                let result = match tokio::time::timeout(timeout, op(client)).await {
                    Ok(r) => r,
                    Err(_) => Err(etcd_client::Error::GRpcStatus(
                        tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}")),
                    )),
                };
                match result {
                    Ok(v) => return Ok(v),
                    Err(e) if is_retryable(&e) => {
                        tracing::debug!(error = %e, "etcd request failed; trying the next endpoint");
                        last = Some(e);
                        self.rotate(generation).await;
                    }
                    Err(e) => return Err(classify(e, 0)),
                }
            }
        }
        self.inner.unreachable.send_modify(|n| *n += 1);
        Err(EtcdError::unavailable(
            self.endpoints().join(","),
            last.unwrap_or_else(|| {
                etcd_client::Error::InvalidArgs("no endpoint was tried".to_string())
            }),
        ))
    }

    /// One key, if present.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<KeyValue>, EtcdError> {
        let key = key.as_ref();
        let mut resp = self
            .with_retry(|mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// Every key under `prefix`, read page by page at one revision, and that revision.
    pub async fn get_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let prefix = prefix.as_ref();
        let mut out = Vec::new();
        let mut revision = 0;
        let mut from: Vec<u8> = prefix.to_vec();
        loop {
            let page = self
                .list_page(prefix, &from, revision, LIST_PAGE_SIZE)
                .await?;
            revision = page.revision;
            let more = page.more;
            if let Some(last) = page.kvs.last() {
                from = key_after(last.key());
            }
            out.extend(page.kvs);
            if !more {
                return Ok((out, revision));
            }
        }
    }

    /// The keys (no values) under `prefix`, in key order.
    pub async fn keys_with_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> Result<Vec<Vec<u8>>, EtcdError> {
        let prefix = prefix.as_ref();
        let end = prefix_end(prefix);
        let mut resp = self
            .with_retry(|c| {
                let end = end.clone();
                async move {
                    let opts = GetOptions::new().with_range(end).with_keys_only();
                    c.kv_client()
                        .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                        .get(prefix, Some(opts))
                        .await
                }
            })
            .await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .map(|kv| kv.key().to_vec())
            .collect())
    }

    /// One page of a prefix: keys in `[from, end of prefix)` at `revision` (0: the latest).
    pub async fn list_page(
        &self,
        prefix: &[u8],
        from: &[u8],
        revision: i64,
        limit: i64,
    ) -> Result<ListPage, EtcdError> {
        let end = prefix_end(prefix);
        let result = self
            .with_retry(|c| {
                let end = end.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_range(end)
                        .with_revision(revision)
                        .with_limit(limit);
                    c.kv_client()
                        .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                        .get(from, Some(opts))
                        .await
                }
            })
            .await;
        let mut resp = match result {
            Ok(r) => r,
            Err(EtcdError::Compacted { source, .. }) => {
                return Err(EtcdError::Compacted { revision, source })
            }
            Err(e) => return Err(e),
        };
        let rev = resp.header().map(|h| h.revision()).unwrap_or(revision);
        Ok(ListPage {
            revision: if revision > 0 { revision } else { rev },
            more: resp.more(),
            kvs: resp.take_kvs(),
        })
    }

    /// A transaction, tried on the next endpoint as [`Etcd::with_retry`] does: give guarded ones only
    /// (a compare that a second attempt, after an unseen success, fails instead of applying twice).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, EtcdError> {
        self.with_retry(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Writes a value; returns the revision of the write.
    pub async fn put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<i64, EtcdError> {
        self.put_opts(key.as_ref(), value.as_ref(), None).await
    }

    /// Writes a value attached to a lease (it goes when the lease expires).
    pub async fn put_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: i64,
    ) -> Result<i64, EtcdError> {
        self.put_opts(
            key.as_ref(),
            value.as_ref(),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
    }

    async fn put_opts(
        &self,
        key: &[u8],
        value: &[u8],
        opts: Option<PutOptions>,
    ) -> Result<i64, EtcdError> {
        let resp = self
            .with_retry(|mut c| {
                let opts = opts.clone();
                async move { c.put(key, value, opts).await }
            })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Deletes one key; returns how many keys went (0 or 1).
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64, EtcdError> {
        let key = key.as_ref();
        let resp = self
            .with_retry(|mut c| async move { c.delete(key, None).await })
            .await?;
        Ok(resp.deleted())
    }

    /// Deletes every key under `prefix`; returns how many went.
    pub async fn delete_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<i64, EtcdError> {
        let prefix = prefix.as_ref();
        let resp = self
            .with_retry(|mut c| async move {
                c.delete(prefix, Some(DeleteOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(resp.deleted())
    }

    /// Grants a lease of `ttl`; returns its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let secs = ttl.as_secs().max(1) as i64;
        let resp = self
            .with_retry(|mut c| async move { c.lease_grant(secs, None).await })
            .await?;
        Ok(resp.id())
    }

    pub async fn lease_revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.with_retry(|mut c| async move { c.lease_revoke(lease).await })
            .await?;
        Ok(())
    }

    /// The keys attached to a lease; `None` when the lease does not exist (expired or revoked).
    pub async fn lease_keys(&self, lease: i64) -> Result<Option<Vec<String>>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.lease_time_to_live(
                    lease,
                    Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
                )
                .await
            })
            .await?;
        if resp.ttl() < 0 {
            return Ok(None);
        }
        Ok(Some(
            resp.keys()
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
        ))
    }

    /// Renews a lease once. An expired (or revoked) lease is [`EtcdError::LeaseExpired`].
    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<(), EtcdError> {
        // Opening the keep-alive stream sends the first renewal and checks its answer.
        let result = self
            .with_retry(|mut c| async move { c.lease_keep_alive(lease).await.map(|_| ()) })
            .await;
        match result {
            Err(EtcdError::Request(e))
                if matches!(*e, etcd_client::Error::LeaseKeepAliveError(_)) =>
            {
                Err(EtcdError::LeaseExpired(lease))
            }
            other => other,
        }
    }

    /// Keeps a lease alive every `interval` until `cancel` fires (returns `Ok`) or the lease expires
    /// (returns [`EtcdError::LeaseExpired`]; grant a new one). Failed renewals are retried at the next tick:
    /// a short etcd outage must not end the caller's lease as long as the TTL covers it.
    pub async fn keep_lease_alive(
        &self,
        lease: i64,
        interval: Duration,
        cancel: CancellationToken,
    ) -> Result<(), EtcdError> {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            match self.lease_keep_alive_once(lease).await {
                Ok(_) => {}
                Err(e @ EtcdError::LeaseExpired(_)) => return Err(e),
                Err(e) => tracing::warn!(lease, error = %e, "lease renewal failed; retrying"),
            }
        }
    }

    /// Opens a watch on `prefix` from `start_revision` (inclusive). Keep the [`Watcher`]: dropping it ends
    /// the stream on the server side.
    pub async fn watch_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
        start_revision: i64,
    ) -> Result<(Watcher, WatchStream), EtcdError> {
        let prefix = prefix.as_ref();
        self.with_retry(|c| async move {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(start_revision);
            c.watch_client()
                .max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
                .watch(prefix, Some(opts))
                .await
        })
        .await
    }

    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_list().await })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// Adds a learner with these peer URLs and returns it. Safe to repeat: a member already registered with
    /// the same peer URLs (say, by an attempt whose answer was lost) is returned instead of a second one.
    pub async fn member_add_as_learner(&self, peer_urls: &[String]) -> Result<Member, EtcdError> {
        let mut attempt = 0;
        self.with_retry(|mut c| {
            attempt += 1;
            let retry = attempt > 1;
            let urls = peer_urls.to_vec();
            async move {
                if retry {
                    let list = c.member_list().await?;
                    if let Some(m) = list
                        .members()
                        .iter()
                        .find(|m| same_urls(m.peer_urls(), &urls))
                    {
                        return Ok(m.clone());
                    }
                }
                let opts = etcd_client::MemberAddOptions::new().with_is_learner();
                let resp = c.member_add(urls, Some(opts)).await?;
                resp.member().cloned().ok_or_else(|| {
                    etcd_client::Error::InvalidArgs("member add answered without the member".into())
                })
            }
        })
        .await
    }

    /// Promotes a learner. etcd refuses until the learner has caught up (a `FailedPrecondition` whose
    /// message says it is not in sync); that error is returned for the caller to retry later.
    pub async fn member_promote(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_promote(id).await })
            .await?;
        Ok(resp.members().to_vec())
    }

    pub async fn member_remove(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move { c.member_remove(id).await })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// Changes a member's peer URLs (never call it on a learner: some etcd versions clear the learner
    /// flag on update).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: &[String],
    ) -> Result<Vec<Member>, EtcdError> {
        let resp = self
            .with_retry(|mut c| {
                let urls = peer_urls.to_vec();
                async move { c.member_update(id, urls).await }
            })
            .await?;
        Ok(resp.members().to_vec())
    }

    /// The member list as the member serving at `endpoint` knows it. One attempt, no rotation.
    pub async fn member_list_of(&self, endpoint: &str) -> Result<Vec<Member>, EtcdError> {
        let mut client = self.endpoint_client(endpoint).await?;
        self.attempt_at(endpoint, "member list", client.member_list())
            .await
            .map(|r| r.members().to_vec())
    }

    /// A client for exactly this endpoint, never rotated (for per-member calls).
    async fn endpoint_client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        let endpoint = normalise_endpoint(endpoint, self.inner.settings.uses_tls())?;
        if let Some(c) = self
            .inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&endpoint)
        {
            return Ok(c.clone());
        }
        let client = self.inner.settings.build_client(&endpoint).await?;
        self.inner
            .per_endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint, client.clone());
        Ok(client)
    }

    /// The status of the member serving at `endpoint` (learners answer this too). One attempt, no rotation:
    /// the point is to hear from that member.
    pub async fn status_of(&self, endpoint: &str) -> Result<StatusResponse, EtcdError> {
        let mut client = self.endpoint_client(endpoint).await?;
        self.attempt_at(endpoint, "status", client.status()).await
    }

    /// One attempt at one endpoint, within the request deadline.
    async fn attempt_at<T>(
        &self,
        endpoint: &str,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        let timeout = self.inner.settings.request_timeout;
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if is_retryable(&e) => Err(EtcdError::unavailable(endpoint, e)),
            Ok(Err(e)) => Err(EtcdError::request(e)),
            Err(_) => Err(EtcdError::unavailable(endpoint, timed_out(what, timeout))),
        }
    }

    /// The status of every listed endpoint, asked concurrently.
    pub async fn status_all(&self) -> Vec<(String, Result<StatusResponse, EtcdError>)> {
        let endpoints = self.endpoints();
        let results = futures::future::join_all(endpoints.iter().map(|e| self.status_of(e))).await;
        endpoints.into_iter().zip(results).collect()
    }

    /// Hands leadership to `target`. The request must reach the current leader, so this finds it first
    /// among the members' client URLs.
    pub async fn move_leader(&self, target: u64) -> Result<(), EtcdError> {
        let members = self.member_list().await?;
        let urls: Vec<String> = members
            .iter()
            .filter(|m| !m.is_learner())
            .filter_map(|m| m.client_urls().first().cloned())
            .collect();
        let statuses = futures::future::join_all(urls.iter().map(|u| self.status_of(u))).await;
        let leader = statuses
            .iter()
            .flatten()
            .map(|s| s.leader())
            .find(|l| *l != 0)
            .ok_or(EtcdError::NoLeader)?;
        if leader == target {
            return Ok(());
        }
        let leader_url = members
            .iter()
            .find(|m| m.id() == leader)
            .and_then(|m| m.client_urls().first().cloned())
            .ok_or(EtcdError::NoLeader)?;
        let mut client = self.endpoint_client(&leader_url).await?;
        let request = self.attempt_at(&leader_url, "move leader", client.move_leader(target));
        // etcd answers only at a tick after the move (100 ms by default); the old leader's own status,
        // the figure etcd itself waits on, says so sooner.
        let moved = async {
            loop {
                tokio::time::sleep(MOVE_LEADER_LOOK).await;
                if self
                    .status_of(&leader_url)
                    .await
                    .is_ok_and(|s| s.leader() == target)
                {
                    return;
                }
            }
        };
        tokio::select! {
            result = request => result.map(|_| ()),
            () = moved => Ok(()),
        }
    }
}

/// Maintenance: compaction, defragmentation, alarms (the upkeep controller and `hostlet etcd`).
impl Etcd {
    /// The cluster's current revision, as the endpoint in use reports it.
    pub async fn revision(&self) -> Result<i64, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.get(&b"\0"[..], Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Compacts history up to `revision`; `physical` waits until the freed entries are gone from the backend.
    /// A revision already compacted is [`EtcdError::Compacted`].
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<(), EtcdError> {
        let result = self
            .with_retry(|mut c| async move {
                let opts = physical.then(|| etcd_client::CompactionOptions::new().with_physical());
                c.compact(revision, opts).await
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(EtcdError::Compacted { source, .. }) => {
                Err(EtcdError::Compacted { revision, source })
            }
            Err(e) => Err(e),
        }
    }

    /// Whether history is compacted up to `revision` (a read just before it answers "compacted"; the
    /// compaction revision itself stays readable). A read, so it works while etcd refuses writes.
    pub async fn is_compacted_to(&self, revision: i64) -> Result<bool, EtcdError> {
        let revision = revision - 1;
        if revision <= 0 {
            return Ok(true);
        }
        let result = self
            .with_retry(|mut c| async move {
                c.get(
                    &b"\0"[..],
                    Some(GetOptions::new().with_count_only().with_revision(revision)),
                )
                .await
            })
            .await;
        match result {
            Ok(_) => Ok(false),
            Err(EtcdError::Compacted { .. }) => Ok(true),
            Err(EtcdError::Request(e)) if is_compaction(&e) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The cluster's raised alarms: `(member id, alarm)`.
    pub async fn alarms(&self) -> Result<Vec<(u64, etcd_client::AlarmType)>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.alarm(
                    etcd_client::AlarmAction::Get,
                    etcd_client::AlarmType::None,
                    None,
                )
                .await
            })
            .await?;
        Ok(resp
            .alarms()
            .iter()
            .map(|a| (a.member_id(), a.alarm()))
            .collect())
    }

    /// Clears one member's alarm (etcd accepts this while it refuses writes).
    pub async fn alarm_disarm(
        &self,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.alarm_of(etcd_client::AlarmAction::Deactivate, member, alarm)
            .await
    }

    /// Raises an alarm for one member.
    pub async fn alarm_activate(
        &self,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.alarm_of(etcd_client::AlarmAction::Activate, member, alarm)
            .await
    }

    async fn alarm_of(
        &self,
        action: etcd_client::AlarmAction,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.with_retry(|mut c| async move {
            let mut opts = etcd_client::AlarmOptions::new();
            opts.with_member(member);
            c.alarm(action, alarm, Some(opts)).await
        })
        .await
        .map(|_| ())
    }

    /// Defragments the member serving at `endpoint`, waiting up to `timeout` (a large database takes longer
    /// than an ordinary request may). One attempt, no rotation: the point is that member.
    pub async fn defragment_at(&self, endpoint: &str, timeout: Duration) -> Result<(), EtcdError> {
        let endpoint = normalise_endpoint(endpoint, self.inner.settings.uses_tls())?;
        let settings = Settings {
            tls: std::sync::RwLock::new(self.inner.settings.tls()),
            tls_files: None,
            connect_timeout: self.inner.settings.connect_timeout,
            request_timeout: timeout,
        };
        let mut client = settings.build_client(&endpoint).await?;
        match tokio::time::timeout(timeout, client.defragment()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if is_retryable(&e) => Err(EtcdError::unavailable(endpoint, e)),
            Ok(Err(e)) => Err(EtcdError::request(e)),
            Err(_) => Err(EtcdError::unavailable(
                endpoint,
                timed_out("defragment", timeout),
            )),
        }
    }
}

/// One page of a prefix listing.
#[derive(Debug)]
pub struct ListPage {
    /// The revision the page was read at.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// More keys follow the last one.
    pub more: bool,
}

/// The client TLS configuration of `files`.
fn tls_config(files: &TlsFiles) -> Result<ClientTlsConfig, EtcdError> {
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read_pem(&files.ca)?))
        .identity(Identity::from_pem(
            read_pem(&files.cert)?,
            read_pem(&files.key)?,
        )))
}

impl Settings {
    fn tls(&self) -> Option<ClientTlsConfig> {
        self.tls.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn uses_tls(&self) -> bool {
        self.tls_files.is_some() || self.tls().is_some()
    }

    async fn build_client(&self, endpoint: &str) -> Result<Client, EtcdError> {
        let invalid = |reason: String| EtcdError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let mut ep = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .tcp_nodelay(true)
            // Finds a peer that vanished without closing the connection (watches would hang forever).
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = self.tls() {
            ep = ep.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        let channel = etcd_client::Channel::Tonic(ep.connect_lazy());
        // Without a leader a member cannot serve current data: make it say so instead of hanging.
        let opts = ConnectOptions::new().with_require_leader(true);
        Client::from_channel(channel, Some(opts))
            .await
            .map_err(EtcdError::request)
    }
}

fn normalise_endpoint(e: &str, tls: bool) -> Result<String, EtcdError> {
    let e = e.trim().trim_end_matches('/');
    if e.is_empty() {
        return Err(EtcdError::InvalidEndpoint {
            endpoint: e.to_string(),
            reason: "empty".to_string(),
        });
    }
    if e.starts_with("http://") || e.starts_with("https://") {
        if tls && e.starts_with("http://") {
            return Err(EtcdError::InvalidEndpoint {
                endpoint: e.to_string(),
                reason: "plain http with TLS configured".to_string(),
            });
        }
        return Ok(e.to_string());
    }
    Ok(format!("{}://{e}", if tls { "https" } else { "http" }))
}

fn normalise_endpoints(endpoints: &[String], tls: bool) -> Result<Vec<String>, EtcdError> {
    let mut out: Vec<String> = Vec::new();
    for e in endpoints {
        let e = normalise_endpoint(e, tls)?;
        if !out.contains(&e) {
            out.push(e);
        }
    }
    if out.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    Ok(out)
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&str> = a.iter().map(|s| s.trim_end_matches('/')).collect();
    let mut b: Vec<&str> = b.iter().map(|s| s.trim_end_matches('/')).collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// The end of the key range of `prefix` (etcd's `--prefix`): the prefix with its last byte incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// The smallest key greater than `key`.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_their_scheme_from_tls() {
        assert_eq!(
            normalise_endpoint("127.0.0.1:2379", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            normalise_endpoint("127.0.0.1:2379", true).unwrap(),
            "https://127.0.0.1:2379"
        );
        assert_eq!(
            normalise_endpoint("https://h:1/", true).unwrap(),
            "https://h:1"
        );
        assert!(normalise_endpoint("http://h:1", true).is_err());
        assert!(matches!(
            normalise_endpoints(&[], false),
            Err(EtcdError::NoEndpoints)
        ));
        assert_eq!(
            normalise_endpoints(&["a:1".into(), "http://a:1".into()], false).unwrap(),
            vec!["http://a:1"]
        );
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(key_after(b"k"), b"k\0".to_vec());
    }

    #[test]
    fn transport_failures_are_retryable_and_answers_are_not() {
        let s = |c: Code, m: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(c, m));
        assert!(is_retryable(&s(Code::Unavailable, "etcdserver: no leader")));
        assert!(is_retryable(&s(Code::Unknown, "transport error")));
        assert!(is_retryable(&s(Code::Cancelled, "Timeout expired")));
        assert!(!is_retryable(&s(Code::Cancelled, "context canceled")));
        assert!(!is_retryable(&s(Code::InvalidArgument, "bad")));
        assert!(is_compaction(&s(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )));
    }
}
