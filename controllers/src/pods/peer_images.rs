//! Images from another node, for hosts without a registry: each node advertises the tagged images its
//! engine holds in its node record (`images`, name → id), and an image a pod needs that this host lacks and
//! cannot pull is fetched from a node that has it: `docker save` there, streamed over mutual TLS from its
//! agent's `GET /images/save`, into `docker load` here.
//!
//! The holder lets a node have an image only if that node's own pods name it, as the node API lets a node
//! read only the secrets its pods use: a voter reads the asker's pods from etcd to check; a worker, which
//! cannot see another node's pods, asks a voter (`POST /node/v1/image-check`, only of an image its own record
//! lists), and refuses when no voter says yes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use hostlet_api::image::ImageRef;
use hostlet_api::objects::NodeInfo;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use super::docker::DockerRuntime;
use super::image_dir::ImageLoader;
use super::images::{ImageEngine, ImageInfo};
use crate::pki::{CertIdentity, PeerNode};

/// At most this many names go in a node record.
pub const MAX_ADVERTISED: usize = 256;
/// How often the engine's images are listed for the node record.
pub const ADVERTISE_EVERY: Duration = Duration::from_secs(30);
/// A fetch that has not finished in this long is given up (a 1 GB image on a slow link fits).
const FETCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// The name Docker lists an image under (`busybox:latest`, `registry:5000/app:1`) for a pod's reference;
/// `None` for one pinned by digest (a fetch by name could bring other bytes).
pub fn listed_name(reference: &str) -> Option<String> {
    let r = ImageRef::parse(reference).ok()?;
    if r.digest.is_some() {
        return None;
    }
    let registry = r
        .registry
        .filter(|h| h != "docker.io" && h != "index.docker.io");
    let repository = match &registry {
        None => r
            .repository
            .strip_prefix("library/")
            .unwrap_or(&r.repository)
            .to_string(),
        Some(_) => r.repository.clone(),
    };
    let tag = r.tag.unwrap_or_else(|| "latest".to_string());
    Some(match registry {
        Some(h) => format!("{h}/{repository}:{tag}"),
        None => format!("{repository}:{tag}"),
    })
}

/// What a node record advertises: the engine's tagged images, name → id, at most [`MAX_ADVERTISED`].
pub fn advertised(images: &[ImageInfo]) -> BTreeMap<String, String> {
    images
        .iter()
        .flat_map(|i| i.tags.iter().map(move |t| (t.clone(), i.id.clone())))
        .take(MAX_ADVERTISED)
        .collect()
}

/// May node `asker` have image `name` (as Docker lists it)? Why not, when it may not or that cannot be known
/// (fail closed).
pub type MayHave =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What the route needs.
#[derive(Clone)]
pub struct ServeImages {
    pub runtime: Arc<DockerRuntime>,
    pub may_have: MayHave,
}

#[derive(serde::Deserialize)]
pub struct SaveQuery {
    #[serde(rename = "ref")]
    reference: String,
}

/// `GET /images/save?ref=`: the image as `docker save` writes it.
pub fn router(serve: ServeImages) -> Router {
    crate::routes::serve(Router::new(), &hostlet_api::routes::IMAGE_SAVE, save).with_state(serve)
}

async fn save(
    State(s): State<ServeImages>,
    Extension(peer): Extension<PeerNode>,
    Query(q): Query<SaveQuery>,
) -> Response {
    let Some(name) = listed_name(&q.reference) else {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "ref: {:?} is not an image name (by tag; a digest is not fetched from a node)\n",
                q.reference
            ),
        )
            .into_response();
    };
    match &peer.0 {
        Some(CertIdentity::Admin(_)) => {}
        Some(CertIdentity::Node(n)) => {
            if let Err(why) = (s.may_have)(n.clone(), name.clone()).await {
                return (StatusCode::FORBIDDEN, format!("{why}\n")).into_response();
            }
        }
        None => return crate::nodeapi::no_certificate(),
    }
    match s.runtime.image_id(&name).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                format!("this node has no image {name}\n"),
            )
                .into_response()
        }
        Err(e) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("docker: {e}\n")).into_response()
        }
    }
    let body = s.runtime.save_image(&name);
    tracing::info!(image = %name, to = ?peer.0, "sending an image to a node");
    axum::body::Body::from_stream(body).into_response()
}

/// The images `node`'s own pods name (init containers included), read from etcd at the time of asking
/// (its pod keys and its 2014 list).
async fn pod_images(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
    node: &str,
) -> Result<Vec<String>, String> {
    let failed =
        |e: hostlet_runtime::EtcdError| format!("cannot read node {node}'s pods to check: {e}");
    let (kvs, _) = etcd
        .get_prefix(keys.pods_prefix(node))
        .await
        .map_err(failed)?;
    let mut out = Vec::new();
    for kv in &kvs {
        if let Ok(m) = hostlet_api::parse_manifest(kv.value()) {
            out.extend(m.all_containers().map(|c| c.image.clone()));
        }
    }
    if let Some(kv) = etcd.get(keys.legacy_pod_list(node)).await.map_err(failed)? {
        let items = hostlet_api::parse_manifest_list(kv.value()).unwrap_or_default();
        for m in items.into_iter().flatten() {
            out.extend(m.all_containers().map(|c| c.image.clone()));
        }
    }
    Ok(out)
}

/// A voter's answer: the asker's pods, read from etcd.
pub fn may_have_from_etcd(etcd: hostlet_runtime::Etcd, keys: hostlet_api::KeyLayout) -> MayHave {
    Arc::new(move |asker: String, name: String| {
        let etcd = etcd.clone();
        let keys = keys.clone();
        Box::pin(async move {
            let images = pod_images(&etcd, &keys, &asker).await?;
            if images
                .iter()
                .any(|i| listed_name(i).as_deref() == Some(name.as_str()))
            {
                Ok(())
            } else {
                Err(format!(
                    "no pod of node {asker} names image {name}: a node fetches only the images its own pods name"
                ))
            }
        })
    })
}

/// A worker's answer: a voter's, through the node API; no answer is a refusal.
pub fn may_have_through_voters(api: hostlet_runtime::nodeapi::NodeApiClient) -> MayHave {
    Arc::new(move |asker: String, name: String| {
        let api = api.clone();
        Box::pin(async move {
            let answer: CheckAnswer = api
                .post_json(
                    hostlet_api::routes::IMAGE_CHECK.path,
                    &CheckRequest {
                        node: asker.clone(),
                        image: name.clone(),
                    },
                )
                .await
                .map_err(|e| {
                    format!("cannot ask a voter whether node {asker} may have {name}: {e}")
                })?;
            match answer.refused {
                None => Ok(()),
                Some(why) => Err(why),
            }
        })
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CheckRequest {
    node: String,
    image: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CheckAnswer {
    /// Why not; absent when it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

#[derive(Clone)]
struct CheckState {
    etcd: hostlet_runtime::Etcd,
    keys: hostlet_api::KeyLayout,
    may_have: MayHave,
}

/// A voter's `POST /node/v1/image-check`: may node `node` have `image`? Asked by a worker that holds the
/// image (its own record must list it: a node cannot probe for images it does not have) or an admin.
pub fn check_router(etcd: hostlet_runtime::Etcd, keys: hostlet_api::KeyLayout) -> Router {
    let state = CheckState {
        may_have: may_have_from_etcd(etcd.clone(), keys.clone()),
        etcd,
        keys,
    };
    crate::routes::serve(Router::new(), &hostlet_api::routes::IMAGE_CHECK, check).with_state(state)
}

async fn check(
    State(s): State<CheckState>,
    Extension(peer): Extension<PeerNode>,
    body: Bytes,
) -> Response {
    // The node API's client sends JSON without naming its type.
    let req: CheckRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("body: {e}\n")).into_response(),
    };
    let Some(name) = listed_name(&req.image) else {
        return (StatusCode::BAD_REQUEST, "image: not an image name by tag\n").into_response();
    };
    match &peer.0 {
        Some(CertIdentity::Admin(_)) => {}
        Some(CertIdentity::Node(asker)) => {
            let record = match s.etcd.get(s.keys.node(asker)).await {
                Ok(r) => r,
                Err(e) => {
                    return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
                }
            };
            let holds = record
                .and_then(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
                .is_some_and(|info| info.images.contains_key(&name));
            if !holds {
                return (
                    StatusCode::FORBIDDEN,
                    format!("node {asker} may ask only about images its own record lists, and it does not list {name}\n"),
                )
                    .into_response();
            }
        }
        None => return crate::nodeapi::no_certificate(),
    }
    let refused = (s.may_have)(req.node, name).await.err();
    axum::Json(CheckAnswer { refused }).into_response()
}

/// The fetches' metrics.
#[derive(Clone)]
pub struct PeerImageMetrics {
    fetches: IntCounterVec,
    bytes: IntCounter,
    seconds: Histogram,
}

impl PeerImageMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = PeerImageMetrics {
            fetches: IntCounterVec::new(
                Opts::new(
                    "hostlet_peer_image_fetches_total",
                    "Images fetched from another node, by result: ok, failed (no node that holds it gave it)",
                ),
                &["result"],
            )?,
            bytes: IntCounter::new(
                "hostlet_peer_image_fetch_bytes_total",
                "Bytes of `docker save` received from other nodes",
            )?,
            seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hostlet_peer_image_fetch_duration_seconds",
                    "How long a successful fetch from another node took, to the image loaded",
                )
                .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
            )?,
        };
        for r in ["ok", "failed"] {
            m.fetches.with_label_values(&[r]);
        }
        registry.register(Box::new(m.fetches.clone()))?;
        registry.register(Box::new(m.bytes.clone()))?;
        registry.register(Box::new(m.seconds.clone()))?;
        Ok(m)
    }
}

/// The node records this agent knows.
pub type KnownNodes = Arc<dyn Fn() -> Vec<Arc<NodeInfo>> + Send + Sync>;

/// Fetches images from other nodes; one per agent.
#[derive(Clone)]
pub struct PeerFetcher {
    pub node: String,
    /// The node's certificates, read at each fetch: a renewal replaces them, and the voters refuse the
    /// superseded ones.
    pub tls: crate::pki::TlsDir,
    pub nodes: KnownNodes,
    pub metrics: PeerImageMetrics,
}

impl PeerFetcher {
    /// The node's client certificate and the cluster CA: the fetcher every agent with TLS has.
    pub fn client(tls: &crate::pki::TlsDir) -> Option<reqwest::Client> {
        use crate::pki::CertRole;
        let mut pem = std::fs::read(tls.cert(CertRole::Client)).ok()?;
        pem.push(b'\n');
        pem.extend(std::fs::read(tls.key(CertRole::Client)).ok()?);
        let ca = std::fs::read(tls.ca_cert()).ok()?;
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).ok()?)
            .identity(reqwest::Identity::from_pem(&pem).ok()?)
            .connect_timeout(Duration::from_secs(5))
            .timeout(FETCH_TIMEOUT)
            // One large stream: HTTP/2's flow-control windows only slow it down.
            .http1_only()
            .build()
            .ok()
    }

    /// The nodes that advertise `name`, voters first (a worker cannot check the asker and refuses).
    fn holders(&self, name: &str) -> Vec<Arc<NodeInfo>> {
        let mut out: Vec<Arc<NodeInfo>> = (self.nodes)()
            .into_iter()
            .filter(|n| n.name != self.node && n.api_url.is_some() && n.images.contains_key(name))
            .collect();
        out.sort_by_key(|n| {
            (
                n.labels.get(hostlet_api::labels::ROLE).map(String::as_str) != Some("voter"),
                n.name.clone(),
            )
        });
        out
    }

    /// Fetches `reference` from a node that has it into `loader`; the node it came from, or why none gave it.
    pub async fn fetch<L: ImageLoader>(
        &self,
        loader: &L,
        reference: &str,
    ) -> Result<String, String> {
        let Some(name) = listed_name(reference) else {
            return Err(format!(
                "{reference} is pinned by digest: not fetched from a node"
            ));
        };
        let holders = self.holders(&name);
        if holders.is_empty() {
            self.metrics.fetches.with_label_values(&["failed"]).inc();
            return Err(format!("no other node advertises {name}"));
        }
        let mut why = Vec::new();
        for h in holders {
            let started = Instant::now();
            match self.fetch_from(loader, &h, &name).await {
                Ok(bytes) => {
                    self.metrics.fetches.with_label_values(&["ok"]).inc();
                    self.metrics.bytes.inc_by(bytes);
                    self.metrics
                        .seconds
                        .observe(started.elapsed().as_secs_f64());
                    tracing::info!(image = %name, from = %h.name, bytes, seconds = started.elapsed().as_secs_f64(), "image fetched from a node");
                    return Ok(h.name.clone());
                }
                Err(e) => why.push(format!("{}: {e}", h.name)),
            }
        }
        self.metrics.fetches.with_label_values(&["failed"]).inc();
        Err(format!("no node gave {name} ({})", why.join("; ")))
    }

    async fn fetch_from<L: ImageLoader>(
        &self,
        loader: &L,
        holder: &NodeInfo,
        name: &str,
    ) -> Result<u64, String> {
        let base = holder.api_url.as_deref().unwrap_or_default();
        let url = reqwest::Url::parse_with_params(&format!("{base}/images/save"), [("ref", name)])
            .map_err(|e| e.to_string())?;
        let client = Self::client(&self.tls)
            .ok_or_else(|| "the node's certificates cannot be read".to_string())?;
        let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("{status}: {}", text.trim()));
        }
        let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = counted.clone();
        // A cut-off transfer ends the stream early: the engine refuses the short archive.
        let body = resp
            .bytes_stream()
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(|r| futures::future::ready(r.ok()))
            .inspect(move |b: &Bytes| {
                c.fetch_add(b.len() as u64, std::sync::atomic::Ordering::Relaxed);
            })
            .boxed();
        loader
            .load(body)
            .await
            .map_err(|e| format!("loading it: {e}"))?;
        match loader.loaded_id(name).await {
            Ok(Some(_)) => Ok(counted.load(std::sync::atomic::Ordering::Relaxed)),
            Ok(None) => Err(format!("loaded, but the engine has no {name} after it")),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl DockerRuntime {
    /// `docker save` of one image, as a stream of bytes; an engine error ends it early.
    pub fn save_image(
        &self,
        name: &str,
    ) -> futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>> {
        let this = self.clone();
        let name = name.to_string();
        futures::stream::once(async move {
            let docker = this.long_client().await.map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>(docker.export_image(&name).map_err(std::io::Error::other))
        })
        .try_flatten()
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_s_reference_is_read_as_docker_lists_it() {
        assert_eq!(listed_name("busybox").as_deref(), Some("busybox:latest"));
        assert_eq!(
            listed_name("docker.io/library/busybox:1.36").as_deref(),
            Some("busybox:1.36")
        );
        assert_eq!(
            listed_name("reg:5000/team/app:2").as_deref(),
            Some("reg:5000/team/app:2")
        );
        assert_eq!(
            listed_name(
                "app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
            ),
            None
        );
    }

    #[test]
    fn a_record_advertises_tagged_images_up_to_the_cap() {
        let images: Vec<ImageInfo> = (0..300)
            .map(|i| ImageInfo {
                id: format!("sha256:{i}"),
                tags: vec![format!("app{i}:1")],
                size: 1,
                created: 0,
            })
            .chain([ImageInfo {
                id: "sha256:untagged".into(),
                tags: Vec::new(),
                size: 1,
                created: 0,
            }])
            .collect();
        let a = advertised(&images);
        assert_eq!(a.len(), MAX_ADVERTISED);
        assert!(a.values().all(|id| id != "sha256:untagged"));
    }
}
