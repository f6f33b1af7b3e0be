//! Real etcd processes for tests: each on free loopback ports, in its own temporary directory, killed when
//! dropped. Enabled by the `testkit` feature.
//!
//! ```no_run
//! # async fn demo() {
//! use hostlet_runtime::testkit::TestEtcd;
//! let mut etcd = TestEtcd::start().await;
//! let client = etcd.connect().await;
//! client.put("/k", "v").await.unwrap();
//! etcd.kill();
//! etcd.restart().await;
//! assert!(client.get("/k").await.unwrap().is_some());
//! # }
//! ```
//!
//! Helpers panic with a clear message when etcd cannot be started: they are for tests only.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tempfile::TempDir;

use crate::etcd::{Etcd, EtcdConfig, TlsFiles};

/// The directory of the etcd release the tests run (`etcd`, `etcdctl`, and `etcdutl` from 3.5 on):
/// `HOSTLET_TEST_ETCD_DIR`, or `None` for the distribution's etcd on `PATH`. A directory named but missing
/// its `etcd` fails the test: a run meant for another etcd version never falls back silently.
pub fn etcd_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("HOSTLET_TEST_ETCD_DIR").filter(|d| !d.is_empty())?);
    assert!(
        dir.join("etcd").is_file(),
        "HOSTLET_TEST_ETCD_DIR={} holds no etcd binary (hack/install-deps.sh --tests installs it)",
        dir.display()
    );
    Some(dir)
}

/// One of etcd's programs (`etcd`, `etcdctl`, `etcdutl`) for the tests: from [`etcd_dir`], else the bare
/// name (found on `PATH`).
pub fn etcd_program(name: &str) -> PathBuf {
    match etcd_dir() {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// The etcd binary the tests run: [`etcd_dir`]'s, else `HOSTLET_TEST_ETCD`, else `/usr/bin/etcd`.
pub fn etcd_binary() -> PathBuf {
    if let Some(d) = etcd_dir() {
        return d.join("etcd");
    }
    std::env::var_os("HOSTLET_TEST_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// How long a member may take to serve after its process starts.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// Attempts with fresh ports when etcd exits at once (another test took a port between probe and bind).
const START_ATTEMPTS: usize = 5;

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}-{}-{n}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Ports handed to tests come from here, below the kernel's ephemeral range (32768 and up by default):
/// outgoing connections take their local ports from that range, so a port found free there can be taken
/// by some connection before the test's server listens on it.
const TEST_PORTS: std::ops::Range<u16> = 15000..32000;
/// A claim older than this is stale (its test run is over).
const CLAIM_STALE: Duration = Duration::from_secs(30 * 60);

/// A loopback port nobody listens on, for a test's listener. Each port is claimed with a file under
/// `$TMPDIR/hostlet-test-ports/`, so that test processes running side by side never get the same one.
pub fn free_port() -> u16 {
    let dir = std::env::temp_dir().join("hostlet-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    for _ in 0..100_000 {
        let port = rand::random_range(TEST_PORTS);
        if claim(&dir.join(port.to_string())) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free test port in {TEST_PORTS:?}");
}

/// Claims a port's file: a new file, or one whose claim is stale.
fn claim(file: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
    {
        Ok(_) => true,
        Err(_) => {
            let stale = std::fs::metadata(file)
                .and_then(|m| m.modified())
                .map(|t| t.elapsed().unwrap_or_default() > CLAIM_STALE)
                .unwrap_or(false);
            stale
                && std::fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()))
                    .is_ok()
        }
    }
}

/// A temporary directory, on tmpfs when there is one: etcd fsyncs every write.
fn temp_dir() -> TempDir {
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("hostlet-etcd-");
        b
    };
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = builder.tempdir_in("/dev/shm") {
            return d;
        }
    }
    builder
        .tempdir()
        .expect("cannot create a temporary directory")
}

/// Certificates of a throwaway CA for TLS tests: the server's cover `127.0.0.1` and `localhost`.
#[derive(Debug, Clone)]
pub struct TestTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client: TlsFiles,
}

impl TestTls {
    /// Writes a fresh CA, server and client certificate into `dir`.
    pub fn generate(dir: &Path) -> TestTls {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("cannot write a test certificate");
            p
        };
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "hostlet test CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");

        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(names).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![usage];
            let cert = p.signed_by(&key, &ca, &ca_key).expect("certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "etcd",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(vec![], "hostlet", ExtendedKeyUsagePurpose::ClientAuth);
        let ca_path = write("ca.crt", ca.pem());
        TestTls {
            server_cert: write("server.crt", server_cert),
            server_key: write("server.key", server_key),
            client: TlsFiles {
                ca: ca_path.clone(),
                cert: write("client.crt", client_cert),
                key: write("client.key", client_key),
            },
            ca: ca_path,
        }
    }
}

/// One etcd member run by a test.
#[derive(Debug)]
pub struct TestEtcd {
    name: String,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
    /// `name=peerURL,…` of the cluster this member starts into.
    initial_cluster: String,
    initial_state: &'static str,
    cluster_token: String,
    tls: Option<TestTls>,
    child: Option<Child>,
}

impl TestEtcd {
    /// Starts a single-member cluster and waits until it serves.
    pub async fn start() -> TestEtcd {
        Self::start_with(false).await
    }

    /// Like [`TestEtcd::start`], with client TLS and client certificate authentication.
    pub async fn start_tls() -> TestEtcd {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> TestEtcd {
        for attempt in 1..=START_ATTEMPTS {
            let dir = temp_dir();
            let tls = tls.then(|| TestTls::generate(dir.path()));
            let name = unique_name("etcd");
            let peer_port = free_port();
            let mut m = TestEtcd {
                initial_cluster: format!("{name}=http://127.0.0.1:{peer_port}"),
                name,
                dir,
                client_port: free_port(),
                peer_port,
                initial_state: "new",
                cluster_token: unique_name("cluster"),
                tls,
                child: None,
            };
            m.spawn();
            match m.wait_serving().await {
                Ok(()) => return m,
                Err(e) if attempt < START_ATTEMPTS => {
                    eprintln!("test etcd did not start (attempt {attempt}): {e}; retrying");
                }
                Err(e) => panic!("test etcd did not start: {e}\n{}", m.log_tail()),
            }
        }
        unreachable!("the last attempt panics")
    }

    fn args(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let mut args = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data_dir().display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={}", self.peer_url()),
            format!("--initial-advertise-peer-urls={}", self.peer_url()),
            format!("--initial-cluster={}", self.initial_cluster),
            format!("--initial-cluster-state={}", self.initial_state),
            format!("--initial-cluster-token={}", self.cluster_token),
            "--logger=zap".to_string(),
            "--log-outputs=stderr".to_string(),
            "--log-level=warn".to_string(),
        ];
        if let Some(tls) = &self.tls {
            args.push(format!("--cert-file={}", tls.server_cert.display()));
            args.push(format!("--key-file={}", tls.server_key.display()));
            args.push(format!("--trusted-ca-file={}", tls.ca.display()));
            args.push("--client-cert-auth".to_string());
        }
        args
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("cannot open the etcd log");
        let child = Command::new(etcd_binary())
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", etcd_binary().display()));
        self.child = Some(child);
    }

    /// Waits until the member answers and knows a leader; fails early if the process exits.
    async fn wait_serving(&mut self) -> Result<(), String> {
        let etcd = self.connect_quietly().await?;
        let endpoint = self.endpoint();
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("etcd exited with {status}"));
                }
            }
            match etcd.status_of(&endpoint).await {
                Ok(s) if s.leader() != 0 => return Ok(()),
                _ if tokio::time::Instant::now() > deadline => {
                    return Err(format!("not serving after {START_DEADLINE:?}"))
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn connect_quietly(&self) -> Result<Etcd, String> {
        let mut cfg = self.config();
        cfg.connect_timeout = Duration::from_millis(500);
        cfg.request_timeout = Duration::from_secs(1);
        Etcd::connect(cfg).await.map_err(|e| e.to_string())
    }

    /// The member's name (unique per test run).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }

    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// The member's data directory (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// etcd's own log (stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The last lines of etcd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The certificates, when started with TLS.
    pub fn tls(&self) -> Option<&TestTls> {
        self.tls.as_ref()
    }

    /// A client config for this member (with the client certificate under TLS).
    pub fn config(&self) -> EtcdConfig {
        let mut cfg = EtcdConfig::new(self.endpoints());
        cfg.connect_timeout = Duration::from_secs(2);
        cfg.request_timeout = Duration::from_secs(5);
        cfg.tls = self.tls.as_ref().map(|t| t.client.clone());
        cfg
    }

    /// A client of this member.
    pub async fn connect(&self) -> Etcd {
        Etcd::connect(self.config())
            .await
            .expect("cannot build an etcd client")
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the process with SIGKILL (no clean shutdown) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same ports and data, and waits until it serves.
    pub async fn restart(&mut self) {
        self.kill();
        for attempt in 1..=START_ATTEMPTS {
            self.spawn();
            match self.wait_serving().await {
                Ok(()) => return,
                // The old process's ports may linger a moment after SIGKILL.
                Err(e) if attempt < START_ATTEMPTS => {
                    eprintln!("test etcd did not restart (attempt {attempt}): {e}; retrying");
                    self.kill();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("test etcd did not restart: {e}\n{}", self.log_tail()),
            }
        }
    }

    /// Adds a new member to this member's cluster (as a learner when `learner`) through the API, starts it,
    /// and waits until it serves. Returns the new member and its id.
    pub async fn join(&self, learner: bool) -> (TestEtcd, u64) {
        assert!(self.tls.is_none(), "join is for plain-HTTP clusters");
        let client = self.connect().await;
        let name = unique_name("etcd");
        let peer_port = free_port();
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut raw = client.client();
        let opts = learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
        let resp = raw
            .member_add([peer_url.clone()], opts)
            .await
            .expect("member add");
        let id = resp.member().map(|m| m.id()).expect("added member");
        let initial_cluster = resp
            .member_list()
            .iter()
            .map(|m| {
                let n = if m.id() == id {
                    name.as_str()
                } else {
                    m.name()
                };
                format!("{n}={}", m.peer_urls().first().cloned().unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut m = TestEtcd {
            name,
            dir: temp_dir(),
            client_port: free_port(),
            peer_port,
            initial_cluster,
            initial_state: "existing",
            cluster_token: self.cluster_token.clone(),
            tls: None,
            child: None,
        };
        m.spawn();
        if let Err(e) = m.wait_serving().await {
            panic!("joining etcd did not start: {e}\n{}", m.log_tail());
        }
        (m, id)
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of `n` voting members started together.
#[derive(Debug)]
pub struct TestCluster {
    pub members: Vec<TestEtcd>,
}

impl TestCluster {
    /// Starts `n` members as one new cluster and waits until each serves.
    pub async fn start(n: usize) -> TestCluster {
        assert!(n > 0);
        for attempt in 1..=START_ATTEMPTS {
            let token = unique_name("cluster");
            let specs: Vec<(String, u16, u16)> = (0..n)
                .map(|_| (unique_name("etcd"), free_port(), free_port()))
                .collect();
            let initial_cluster = specs
                .iter()
                .map(|(name, _, peer)| format!("{name}=http://127.0.0.1:{peer}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut members: Vec<TestEtcd> = specs
                .into_iter()
                .map(|(name, client_port, peer_port)| TestEtcd {
                    name,
                    dir: temp_dir(),
                    client_port,
                    peer_port,
                    initial_cluster: initial_cluster.clone(),
                    initial_state: "new",
                    cluster_token: token.clone(),
                    tls: None,
                    child: None,
                })
                .collect();
            for m in &mut members {
                m.spawn();
            }
            let mut failed = None;
            for m in &mut members {
                if let Err(e) = m.wait_serving().await {
                    failed = Some(format!("{e}\n{}", m.log_tail()));
                    break;
                }
            }
            match failed {
                None => return TestCluster { members },
                Some(e) if attempt < START_ATTEMPTS => {
                    eprintln!("test etcd cluster did not start (attempt {attempt}): {e}");
                }
                Some(e) => panic!("test etcd cluster did not start: {e}"),
            }
        }
        unreachable!("the last attempt panics")
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(TestEtcd::endpoint).collect()
    }

    /// A client over every member.
    pub async fn connect(&self) -> Etcd {
        let mut cfg = EtcdConfig::new(self.endpoints());
        cfg.connect_timeout = Duration::from_secs(2);
        cfg.request_timeout = Duration::from_secs(5);
        Etcd::connect(cfg)
            .await
            .expect("cannot build an etcd client")
    }
}

/// What a condition polled by [`eventually`] answers: it holds once it is `true`, or `Some(value)`.
pub trait Outcome {
    type Value;
    fn held(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    fn held(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn held(self) -> Option<T> {
        self
    }
}

/// How often [`eventually`] asks again.
pub const POLL: Duration = Duration::from_millis(50);

/// Asks `condition` every [`POLL`] until it holds and returns what it held with; fails the test naming
/// `what` once `timeout` has passed without it. On tokio's clock, so it follows paused time.
pub async fn eventually<O, F, Fut>(what: &str, timeout: Duration, mut condition: F) -> O::Value
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = O>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = condition().await.held() {
            return v;
        }
        assert!(start.elapsed() < timeout, "not within {timeout:?}: {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`](fn@eventually) for tests that run no async runtime: the same arguments, a plain
/// closure.
pub mod blocking {
    use std::time::{Duration, Instant};

    use super::{Outcome, POLL};

    pub fn eventually<O: Outcome>(
        what: &str,
        timeout: Duration,
        mut condition: impl FnMut() -> O,
    ) -> O::Value {
        let start = Instant::now();
        loop {
            if let Some(v) = condition().held() {
                return v;
            }
            assert!(start.elapsed() < timeout, "not within {timeout:?}: {what}");
            std::thread::sleep(POLL);
        }
    }
}
