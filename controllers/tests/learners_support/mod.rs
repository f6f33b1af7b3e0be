//! Shared by the learner and member tests: agents (learner manager + member removal) run in-process against
//! real etcd members, and learners added by hand that start when the test says.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::objects::{Event, NodeInfo, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_controllers::caches::Caches;
use hostlet_controllers::learners::{self, LearnerConfig};
use hostlet_controllers::members::{self, EtcdCluster};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, EtcdConfig, Metrics, Store};
use tempfile::TempDir;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One agent's membership controllers, on the member serving at `local`.
pub struct Agent {
    pub node: String,
    pub metrics: Metrics,
    pub etcd: Etcd,
    /// Its cache of the node records.
    pub nodes: Store<String, Object<NodeInfo>>,
    shutdown: CancellationToken,
}

impl Agent {
    /// Starts the learner manager and member removal of node `node`, whose member serves at `local`;
    /// `endpoints` are the voters the agent's client may use.
    pub async fn start(
        node: &str,
        endpoints: Vec<String>,
        local: &str,
        cfg: LearnerConfig,
    ) -> Agent {
        let mut ecfg = EtcdConfig::new(endpoints);
        ecfg.connect_timeout = Duration::from_secs(1);
        ecfg.request_timeout = Duration::from_secs(3);
        let etcd = Etcd::connect(ecfg).await.unwrap();
        let keys = KeyLayout::default();
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        // The agent's shared caches, as `hostlet run` builds them.
        let informers =
            hostlet_runtime::InformerFactory::new(etcd.clone(), metrics.clone(), shutdown.clone());
        let caches = Caches::start(&informers, &keys, node, Some(local));
        let nodes = caches.nodes.clone();
        let cluster = Arc::new(
            EtcdCluster::new(
                etcd.clone(),
                caches.members.clone(),
                keys.clone(),
                node,
                local,
                None,
            )
            .unwrap(),
        );
        // Started the way the agent starts every controller.
        let manager = learners::LearnerManager::new(cluster.clone(), cfg, &metrics).unwrap();
        hostlet_runtime::spawn(Arc::new(manager), shutdown.clone());
        let removal = members::MemberRemoval::new(cluster, keys, nodes.clone(), &metrics).unwrap();
        hostlet_runtime::spawn(Arc::new(removal), shutdown.clone());
        Agent {
            node: node.to_string(),
            metrics,
            etcd,
            nodes,
            shutdown,
        }
    }

    /// Waits until its node cache holds the record of every node in `nodes`.
    pub async fn wait_nodes_cached(&self, nodes: &[&str]) {
        let keys = KeyLayout::default();
        eventually("node records cached", Duration::from_secs(10), || async {
            nodes.iter().all(|n| self.nodes.contains(&keys.node(n)))
        })
        .await;
    }

    /// The agent dies: its controllers stop at once.
    pub fn kill(&self) {
        self.shutdown.cancel();
    }

    /// The value of one series in this agent's metrics (`name{labels}` as printed), if present.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics.encode_text().lines().find_map(|l| {
            let (s, v) = l.rsplit_once(' ')?;
            (s == series).then(|| v.parse().ok())?
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A node record naming member `name` at `peer_url`, as the agent writes it at start.
pub fn node_record(node: &str, name: &str, peer_url: &str, client_url: &str) -> NodeInfo {
    NodeInfo {
        name: node.to_string(),
        address: "127.0.0.1".to_string(),
        member_name: Some(name.to_string()),
        member_id: None,
        peer_url: Some(peer_url.to_string()),
        client_url: Some(client_url.to_string()),
        api_url: None,
        version: "test".to_string(),
        started: Timestamp::now(),
        role: None,
        failure_domain: None,
        member_since: None,
        cert_expires: None,
        cert_serials: Vec::new(),
        labels: Default::default(),
        images: Default::default(),
    }
}

pub async fn put_node(etcd: &Etcd, info: &NodeInfo) {
    etcd.put(
        KeyLayout::default().node(&info.name),
        serde_json::to_vec(info).unwrap(),
    )
    .await
    .unwrap();
}

/// Writes about `mb` MiB in 100 KiB values.
pub async fn fill(etcd: &Etcd, mb: usize) {
    let value: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    let client = etcd.client();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let mut c = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..mb * 10).step_by(4) {
                c.put(format!("/fill/{i:06}"), value.clone(), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Writes about `mb` MiB as 1 KiB values, 128 to a transaction: many small keys, slow to apply, as a
/// real cluster's data is.
pub async fn fill_small(etcd: &Etcd, mb: usize) {
    use etcd_client::{Txn, TxnOp};
    let value: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
    let txns = mb * 1024 / 128;
    let client = etcd.client();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let mut c = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for t in (w..txns).step_by(4) {
                let ops: Vec<TxnOp> = (0..128)
                    .map(|i| TxnOp::put(format!("/small/{t:06}/{i:03}"), value.clone(), None))
                    .collect();
                c.txn(Txn::new().and_then(ops)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// The suite's one wait: asks a condition until it holds, fails naming what it waited for.
#[allow(unused_imports)]
pub use hostlet_runtime::testkit::eventually;

/// Every event of every node with this reason.
pub async fn events(etcd: &Etcd, reason: &str) -> Vec<Event> {
    let (kvs, _) = etcd
        .get_prefix(KeyLayout::default().all_events_prefix())
        .await
        .unwrap();
    kvs.iter()
        .filter_map(|kv| serde_json::from_slice::<Event>(kv.value()).ok())
        .filter(|e| e.reason == reason)
        .collect()
}

/// Whether member `id` is listed, and as a learner.
pub async fn membership(etcd: &Etcd, id: u64) -> Option<bool> {
    etcd.member_list()
        .await
        .ok()?
        .iter()
        .find(|m| m.id() == id)
        .map(|m| m.is_learner())
}

use hostlet_runtime::testkit::free_port;

/// A learner added through the API that starts only when told (or never).
pub struct LateLearner {
    pub id: u64,
    pub name: String,
    pub peer_url: String,
    pub client_url: String,
    initial_cluster: String,
    dir: TempDir,
    child: Option<Child>,
}

impl LateLearner {
    /// Adds the learner to the cluster `etcd` talks to; does not start it.
    pub async fn add(etcd: &Etcd) -> LateLearner {
        let name = format!("late-{}-{:04x}", std::process::id(), rand::random::<u16>());
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        // A cluster that just started refuses additions for a few seconds ("unhealthy cluster").
        let deadline = Instant::now() + Duration::from_secs(20);
        let resp = loop {
            match etcd
                .client()
                .member_add(
                    [peer_url.clone()],
                    Some(etcd_client::MemberAddOptions::new().with_is_learner()),
                )
                .await
            {
                Ok(r) => break r,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("member add: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("member add: {e}"),
            }
        };
        let id = resp.member().unwrap().id();
        // As a joining agent does: the record tells every agent's member cache to look now.
        learners::record_learner_added(
            etcd,
            &KeyLayout::default(),
            id,
            std::time::SystemTime::now(),
        )
        .await;
        let initial_cluster = resp
            .member_list()
            .iter()
            .map(|m| {
                let n = if m.id() == id {
                    name.as_str()
                } else {
                    m.name()
                };
                format!("{n}={}", m.peer_urls()[0])
            })
            .collect::<Vec<_>>()
            .join(",");
        let dir = tempfile::Builder::new()
            .prefix("hostlet-late-")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        LateLearner {
            id,
            name,
            peer_url,
            client_url: format!("http://127.0.0.1:{}", free_port()),
            initial_cluster,
            dir,
            child: None,
        }
    }

    /// Starts its etcd process (does not wait for it).
    pub fn start(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let child = Command::new(hostlet_runtime::testkit::etcd_binary())
            .args([
                format!("--name={}", self.name),
                format!("--data-dir={}", self.dir.path().join("data").display()),
                format!("--listen-client-urls={}", self.client_url),
                format!("--advertise-client-urls={}", self.client_url),
                format!("--listen-peer-urls={}", self.peer_url),
                format!("--initial-advertise-peer-urls={}", self.peer_url),
                format!("--initial-cluster={}", self.initial_cluster),
                "--initial-cluster-state=existing".to_string(),
                "--log-level=warn".to_string(),
                "--logger=zap".to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// The node record its agent would write at start.
    /// Sends `sig` (e.g. `STOP`, `CONT`) to its etcd process, if started.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
        }
    }

    pub fn node_record(&self, node: &str) -> NodeInfo {
        node_record(node, &self.name, &self.peer_url, &self.client_url)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for LateLearner {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Which member leads, asked of the members at `endpoints`.
pub async fn leader_of(etcd: &Etcd, endpoints: &[String]) -> Option<u64> {
    for e in endpoints {
        if let Ok(s) = etcd.status_of(e).await {
            if s.leader() != 0 {
                return Some(s.leader());
            }
        }
    }
    None
}
