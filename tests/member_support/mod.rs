//! Running real `hostlet run` processes (each with its own etcd child) for the member tests: free ports,
//! a temp data dir per node, waits with deadlines, etcdctl with the node's client certificate.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_hostlet");

pub use hostlet_runtime::testkit::free_port;

/// The suite's one wait: asks a condition until it holds, fails naming what it waited for.
pub use hostlet_runtime::testkit::blocking::eventually;

/// [`eventually`], but a timeout shows the end of these nodes' logs.
pub fn wait_for_nodes<T>(
    what: &str,
    timeout: Duration,
    nodes: &[&Node],
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes
                .iter()
                .map(|n| format!("---- {} ----\n{}", n.name, n.log_story(60)))
                .collect();
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One node: its ports, data dir and (while running) its hostlet process.
pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    pub api_port: u16,
    pub metrics_port: u16,
    pub client_port: u16,
    pub peer_port: u16,
    pub insecure: bool,
    /// `--advertise-address` (any loopback address works on one host).
    pub advertise: String,
    /// The address the API and metrics listen on and the test reaches the agent's ports at.
    pub listen_address: String,
    /// A command the agent (and [`Node::wrapped`] programs) run through, e.g. `ip netns exec <ns>`; it
    /// must exec the program, so that the child's pid is the agent's. Empty: run directly.
    pub wrapper: Vec<String>,
    /// Flags of `hostlet run` given on every start after the common ones.
    pub extra_args: Vec<String>,
    /// Environment of the agent on every start (e.g. `FAILPOINTS`).
    pub env: Vec<(String, String)>,
    pub child: Option<Child>,
    /// The agent's working directory; paths under it are passed relative to it.
    pub cwd: Option<PathBuf>,
    /// `--disk-min-free`: 0 % (off) by default, so that the machine's own disk running low does not make
    /// every agent of the suite unready (tests/disk_full.rs sets a threshold of its own on a filesystem of
    /// its own).
    pub disk_min_free: String,
    /// `--image-gc-high-threshold`: 100 (off) by default, so that no agent of the suite removes an image of
    /// the host's engine (tests/image_gc.rs collects on an engine of its own).
    pub image_gc_high_threshold: u8,
    runs: u32,
    _tmp: Option<tempfile::TempDir>,
}

impl Node {
    pub fn new(name: &str) -> Node {
        Node::with_ports(
            name,
            "127.0.0.1",
            [free_port(), free_port(), free_port(), free_port()],
        )
    }

    /// A node advertising and listening at `address` on the agent's default ports (API 10250, metrics
    /// 10249, etcd 2379 and 2380): for an agent with an address of its own, where no port is shared.
    pub fn on_default_ports(name: &str, address: &str) -> Node {
        Node::with_ports(name, address, [10250, 10249, 2379, 2380])
    }

    /// `ports`: API, metrics, etcd client, etcd peer.
    fn with_ports(name: &str, address: &str, ports: [u16; 4]) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        DATA_DIRS.lock().unwrap().push(dir.join("data"));
        let [api_port, metrics_port, client_port, peer_port] = ports;
        Node {
            name: name.to_string(),
            data_dir: dir.join("data"),
            dir,
            api_port,
            metrics_port,
            client_port,
            peer_port,
            insecure: false,
            advertise: address.to_string(),
            listen_address: address.to_string(),
            wrapper: Vec::new(),
            extra_args: Vec::new(),
            env: Vec::new(),
            child: None,
            cwd: None,
            disk_min_free: "0%".to_string(),
            image_gc_high_threshold: 100,
            runs: 0,
            _tmp: Some(tmp),
        }
    }

    pub fn insecure(mut self) -> Node {
        self.insecure = true;
        self
    }

    /// The common flags of `hostlet run` for this node.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "run".to_string(),
            format!("--node-name={}", self.name),
            format!(
                "--data-dir={}",
                self.cwd
                    .as_deref()
                    .and_then(|cwd| self.data_dir.strip_prefix(cwd).ok())
                    .unwrap_or(&self.data_dir)
                    .display()
            ),
            format!("--advertise-address={}", self.advertise),
            format!("--listen={}:{}", self.listen_address, self.api_port),
            format!(
                "--metrics-listen={}:{}",
                self.listen_address, self.metrics_port
            ),
            format!("--etcd-client-port={}", self.client_port),
            format!("--etcd-peer-port={}", self.peer_port),
            format!("--disk-min-free={}", self.disk_min_free),
            format!("--image-gc-high-threshold={}", self.image_gc_high_threshold),
        ];
        if self.insecure {
            a.push("--etcd-insecure".to_string());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// Where the agent leaves its run pointer (`HOSTLET_RUN_DIR`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("hostlet-{}.log", self.runs))
    }

    /// A command running `program` the way this node's agent runs: through [`Node::wrapper`], if any.
    pub fn wrapped(&self, program: impl AsRef<OsStr>) -> Command {
        match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn command(&self, extra: &[String]) -> Command {
        let mut c = self.wrapped(BIN);
        c.args(self.args())
            .args(extra)
            .env("RUST_LOG", "info,hostlet_controllers=debug")
            // Each test agent leaves its run pointer in its own directory, not the host's /run/hostlet.
            .env("HOSTLET_RUN_DIR", self.run_dir())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        // The etcd release under test (HOSTLET_TEST_ETCD_DIR); an explicit --etcd-binary still wins.
        if let Some(dir) = hostlet_runtime::testkit::etcd_dir() {
            c.env("HOSTLET_ETCD_BINARY", dir.join("etcd"));
        }
        if let Some(cwd) = &self.cwd {
            c.current_dir(cwd);
        }
        c
    }

    /// Starts hostlet with `extra` flags, its output into a log file.
    pub fn start(&mut self, extra: &[String]) {
        assert!(self.child.is_none(), "{} already running", self.name);
        self.runs += 1;
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = self
            .command(extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Runs hostlet to completion (for runs that must fail), with a deadline.
    pub fn run_to_exit(&self, extra: &[String], timeout: Duration) -> Output {
        let mut child = self
            .command(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = eventually("hostlet to exit", timeout, || child.try_wait().unwrap());
        let mut out = Vec::new();
        let mut err = Vec::new();
        use std::io::Read;
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_end(&mut err).unwrap();
        Output {
            status,
            stdout: out,
            stderr: err,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `lines` lines of the current run's log above debug level: what happened, without the
    /// chatter of retries.
    pub fn log_story(&self, lines: usize) -> String {
        let log = self.log();
        let story: Vec<&str> = log.lines().filter(|l| !l.contains(" DEBUG ")).collect();
        story[story.len().saturating_sub(lines)..].join("\n")
    }

    /// The last `lines` lines of the current run's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not running").id()
    }

    /// Whether hostlet has exited (and how).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// Whether hostlet was started and has not exited.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn metrics_url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.listen_address, self.metrics_port)
    }

    pub fn api_url(&self) -> String {
        let scheme = if self.insecure { "http" } else { "https" };
        format!("{scheme}://{}:{}", self.listen_address, self.api_port)
    }

    pub fn client_url(&self) -> String {
        let scheme = if self.insecure { "http" } else { "https" };
        format!("{scheme}://{}:{}", self.listen_address, self.client_port)
    }

    /// The remote ports of the established TCP connections the agent process holds (its sockets' inodes
    /// looked up in the kernel's TCP tables).
    pub fn connected_ports(&self) -> Vec<u16> {
        let pid = self.pid();
        let inodes: std::collections::HashSet<String> =
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| std::fs::read_link(e.path()).ok())
                        .filter_map(|l| {
                            let l = l.to_string_lossy().to_string();
                            l.strip_prefix("socket:[")
                                .and_then(|r| r.strip_suffix(']'))
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
        let mut ports = Vec::new();
        for table in ["tcp", "tcp6"] {
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // remote address, state (01: established), inode
                if cols.len() > 9 && cols[3] == "01" && inodes.contains(cols[9]) {
                    if let Some(port) = cols[2]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                    {
                        ports.push(port);
                    }
                }
            }
        }
        ports.sort_unstable();
        ports
    }

    /// GET on the metrics listener: (status, body), or `None` when nothing answers.
    pub fn get_metrics(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.metrics_url(path))
    }

    /// The `/readyz` report, if the agent answers.
    pub fn readyz(&self) -> Option<serde_json::Value> {
        let (_, body) = self.get_metrics("/readyz")?;
        serde_json::from_str(&body).ok()
    }

    /// `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        matches!(self.get_metrics("/readyz"), Some((200, _)))
    }

    /// Waits until `/readyz` says ready; panics with the log if hostlet exits or the deadline passes.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_ready() {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "{} exited ({status}) before ready:\n{}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after {timeout:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn tls_file(&self, name: &str) -> PathBuf {
        self.data_dir.join("tls").join(name)
    }

    pub fn member_name(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("db/etcd/name"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// etcdctl against `endpoint` with this node's client certificate (unless insecure).
    pub fn etcdctl_at(&self, endpoint: &str, args: &[&str]) -> Output {
        let mut c = Command::new(etcdctl_program());
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .arg("--dial-timeout=3s")
            .arg("--command-timeout=5s");
        if !self.insecure {
            c.arg(format!("--cacert={}", self.tls_file("ca.crt").display()))
                .arg(format!("--cert={}", self.tls_file("client.crt").display()))
                .arg(format!("--key={}", self.tls_file("client.key").display()));
        }
        c.args(args).output().unwrap()
    }

    /// etcdctl against this node's own member.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_at(&self.client_url(), args)
    }

    /// The etcd child of the running hostlet, if any.
    pub fn etcd_pid(&self) -> Option<u32> {
        etcd_member_of(self.pid())
    }

    /// SIGTERM to hostlet; waits for its exit (panics after `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        signal(self.pid(), "TERM");
        let mut child = self.child.take().unwrap();
        let status = eventually("hostlet to exit after SIGTERM", timeout, || {
            child.try_wait().unwrap()
        });
        self.check_drained();
        status
    }

    /// A stop asked by SIGTERM drained every task of the agent within its deadline: the runtime's cut-off
    /// at exit ended none of them (they could have been midway through a write).
    fn check_drained(&self) {
        const CUT_OFF: &str = "agent tasks still running after";
        let log = self.log();
        if let Some(line) = log.lines().find(|l| l.contains(CUT_OFF)) {
            if !std::thread::panicking() {
                panic!(
                    "{}: its stop left tasks to the cut-off at exit: {line}",
                    self.name
                );
            }
        }
    }

    /// SIGKILL to hostlet (its etcd must follow on its own).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops hostlet if it runs: SIGTERM first so that etcd stops cleanly, SIGKILL once `timeout` has
    /// passed.
    pub fn stop(&mut self, timeout: Duration) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "TERM");
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    self.check_drained();
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(20));
        // The whole log of every agent, kept for a failure that happens only now and then.
        if let Ok(d) = std::env::var("HOSTLET_TEST_KEEP_LOGS") {
            let _ = std::fs::create_dir_all(&d);
            let to = format!("{d}/{}-{}-{}.log", self.name, std::process::id(), self.runs);
            let _ = std::fs::copy(self.log_path(), to);
        }
        // A stopped agent leaves its pods' secret volumes mounted (its pods may still run); the test's
        // directory goes, so they go first.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        for point in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if Path::new(point).starts_with(&self.dir) {
                let _ = Command::new("umount").arg("-l").arg(point).status();
            }
        }
    }
}

/// The etcdctl of the etcd release under test (`HOSTLET_TEST_ETCD_DIR`, else `PATH`'s).
pub fn etcdctl_program() -> PathBuf {
    hostlet_runtime::testkit::etcd_program("etcdctl")
}

/// `--server` and `--token` to join the cluster through `server`.
pub fn join_args(server: &Node) -> Vec<String> {
    vec![
        format!("--server={}", server.api_url()),
        format!("--token={}", server.token()),
    ]
}

/// (name, is learner) of every member, asked through `via` (empty when it does not answer).
pub fn members(via: &Node) -> Vec<(String, bool)> {
    let o = via.etcdctl(&["member", "list", "-w", "json"]);
    if !o.status.success() {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or("").to_string(),
                        m["isLearner"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `Some` when the members, asked through `via`, are exactly these names, all voters.
pub fn voters_named(via: &Node, names: &[String]) -> Option<()> {
    let m = members(via);
    (m.len() == names.len()
        && names
            .iter()
            .all(|want| m.iter().any(|(name, learner)| name == want && !learner)))
    .then_some(())
}

/// Three nodes `<prefix>-1..3`, the second and third joining through the first; all voters in the end.
pub fn three_voters(prefix: &str) -> (Node, Node, Node) {
    let ready = Duration::from_secs(90);
    let mut n1 = Node::new(&format!("{prefix}-1"));
    n1.start(&[]);
    n1.wait_ready(ready);
    let mut n2 = Node::new(&format!("{prefix}-2"));
    n2.start(&join_args(&n1));
    n2.wait_ready(ready);
    let mut n3 = Node::new(&format!("{prefix}-3"));
    n3.start(&join_args(&n1));
    n3.wait_ready(ready);
    let names = vec![n1.member_name(), n2.member_name(), n3.member_name()];
    eventually("three voters", Duration::from_secs(60), || {
        voters_named(&n1, &names)
    });
    (n1, n2, n3)
}

/// The member backups of a node (`db/etcd-backup-*`), oldest first.
/// The names in `n`'s `db/` dir, sorted: what a refusal must leave as it was.
pub fn db_entries(n: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(n.data_dir.join("db"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn backups(n: &Node) -> Vec<PathBuf> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(n.data_dir.join("db"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let unix = name.strip_prefix("etcd-backup-")?.parse().ok()?;
                    Some((unix, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// The backup of a node that holds the member dir of member `name` whole (its name file and WAL).
pub fn backup_of(n: &Node, name: &str) -> Option<PathBuf> {
    backups(n).into_iter().find(|b| {
        std::fs::read_to_string(b.join("name")).is_ok_and(|s| s.trim() == name)
            && b.join("member/wal").is_dir()
    })
}

/// Stdout and stderr of a finished command, together.
pub fn output_text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// Sends `SIG<sig>` to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status();
}

/// Whether process `pid` exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // The state follows the command name in parentheses.
            let state = s
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some(Some('Z')) | Some(Some('X')))
        }
        Err(_) => false,
    }
}

/// Pids of the direct children of `parent` whose command name is `comm`.
/// `parent`'s etcd member process: a child `etcd` serving a data dir, not a short `etcd --version` probe
/// (stopping or killing that one would test something else).
pub fn etcd_member_of(parent: u32) -> Option<u32> {
    children_named(parent, "etcd").into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0)
                .any(|arg| arg.starts_with(b"--data-dir="))
        })
    })
}

pub fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map(|(_, n)| n).unwrap_or("");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ppid: u32 = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == parent && name == comm && fields.first() != Some(&"Z") {
            out.push(pid);
        }
    }
    out
}

/// A plain-HTTP GET over a bare socket (the metrics listener is plain HTTP); `None` when nothing answers.
pub fn http_get(url: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut s = std::net::TcpStream::connect(hostport).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// An HTTPS (or HTTP) client trusting only `ca`.
pub fn api_client(ca: Option<&Path>) -> reqwest::Client {
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        b = b
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The value of a metric without labels in Prometheus text.
/// A sample line of the text format split into its sample name and its label names.
pub fn sample_names(line: &str) -> (&str, Vec<String>) {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let labels = line[name_end..]
        .strip_prefix('{')
        .and_then(|r| r.split_once('}'))
        .map(|(body, _)| {
            body.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, _)| k.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    (&line[..name_end], labels)
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A voter founding its cluster (`<prefix>-1`) and a worker (`<prefix>-2`) joined through it with the
/// token in a file, both ready within `ready`.
pub fn voter_and_worker(prefix: &str, ready: Duration) -> (Node, Node) {
    let mut voter = Node::new(&format!("{prefix}-1"));
    voter.start(&["--etcd-voters=1".to_string()]);
    voter.wait_ready(ready);
    let token_file = voter.run_dir().join("join-token");
    std::fs::write(&token_file, voter.token()).unwrap();
    let mut worker = Node::new(&format!("{prefix}-2"));
    worker.start(&[
        format!("--server={}", voter.api_url()),
        format!("--token-file={}", token_file.display()),
        "--role=worker".to_string(),
    ]);
    worker.wait_ready(ready);
    (voter, worker)
}

/// Removes this node's containers once the test is over (declared before the node: it drops last).
pub struct Cleanup(pub String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let ids = docker_ids(&self.0, None);
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(ids)
                .output();
        }
    }
}

/// The ids of this node's containers (of one pod, if given), sorted.
pub fn docker_ids(node: &str, pod: Option<&str>) -> Vec<String> {
    let mut c = Command::new("docker");
    c.args([
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label=io.hostlet.node={node}"),
    ]);
    if let Some(p) = pod {
        c.args(["--filter", &format!("label=io.hostlet.pod={p}")]);
    }
    let mut ids: Vec<String> = c
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Every node's data dir this test made: where [`cli`] finds a voter of a worker's cluster.
static DATA_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The `hostlet` CLI beside `node`'s agent (found through its data dir; through its wrapper, if any).
/// Beside a worker, whose certificate does not open etcd, it runs as an operator would: with an admin
/// certificate a voter of the worker's cluster issued (`hostlet cert admin`), against the voters' etcd
/// the worker knows, for the worker's node.
pub fn cli(node: &Node, args: &[&str]) -> Output {
    let mut c = node.wrapped(BIN);
    if let Some(dir) = hostlet_runtime::testkit::etcd_dir() {
        c.env("HOSTLET_ETCD_BINARY", dir.join("etcd"));
    }
    c.args(args).arg("--data-dir").arg(&node.data_dir);
    if node.data_dir.join("db/worker").exists() && !node.insecure {
        let admin = admin_certificate(node);
        let endpoints = std::fs::read_to_string(node.data_dir.join("db/endpoints")).unwrap();
        let endpoints: Vec<&str> = endpoints.split_whitespace().collect();
        c.arg(format!("--etcd-endpoints={}", endpoints.join(",")))
            .arg(format!("--etcd-ca-file={}", admin.join("ca.crt").display()))
            .arg(format!(
                "--etcd-cert-file={}",
                admin.join("admin.crt").display()
            ))
            .arg(format!(
                "--etcd-key-file={}",
                admin.join("admin.key").display()
            ));
    }
    c.output().unwrap()
}

/// The `hostlet` CLI beside `node`'s agent with nothing but its data dir, as a user on that host runs it.
pub fn cli_bare(node: &Node, args: &[&str]) -> Output {
    node.wrapped(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(&node.data_dir)
        .output()
        .unwrap()
}

/// An admin certificate for `worker`'s cluster, issued once by one of its voters.
pub fn admin_certificate(worker: &Node) -> PathBuf {
    let out = worker.dir.join("admin");
    if out.join("admin.key").exists() {
        return out;
    }
    let ca = std::fs::read(worker.tls_file("ca.crt")).unwrap();
    let voter = DATA_DIRS
        .lock()
        .unwrap()
        .iter()
        .find(|d| {
            d.join("tls/ca.key").exists()
                && std::fs::read(d.join("tls/ca.crt")).ok() == Some(ca.clone())
        })
        .cloned()
        .unwrap_or_else(|| panic!("no voter of {}'s cluster in this test", worker.name));
    let o = Command::new(BIN)
        .args(["cert", "admin", "--name", "test"])
        .arg("--out")
        .arg(&out)
        .arg("--data-dir")
        .arg(&voter)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    out
}

/// Applies, through the CLI beside `n`, a v1 pod `name` of one container `app` that sleeps, from `image`
/// with `imagePullPolicy: policy`.
pub fn apply_sleeper(n: &Node, name: &str, image: &str, policy: &str) {
    let file = n.dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: {policy}\n    command: [sleep, \"86400\"]\n"
        ),
    )
    .unwrap();
    let o = cli(n, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
}

/// A pod's status as `hostlet pod get -o json` shows it.
pub fn status(node: &Node, id: &str) -> Option<serde_json::Value> {
    let o = cli(node, &["pod", "get", id, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    Some(v["status"].clone()).filter(|s| !s.is_null())
}

/// Waits until pod `id` on `node` is Running with every container running.
pub fn wait_running(node: &Node, id: &str, within: Duration) {
    eventually(&format!("pod {id} running"), within, || {
        let st = status(node, id)?;
        (st["phase"] == "Running"
            && st["containers"]
                .as_array()?
                .iter()
                .all(|c| c["state"]["running"].is_object()))
        .then_some(())
    });
}

/// A writer putting a key every 100 ms through `endpoints` with `via`'s client certificate, measuring the
/// longest run of failed writes (an outage as a client sees it).
pub struct OutageWriter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    worst: std::sync::Arc<std::sync::Mutex<Duration>>,
    /// The keys whose put etcd acknowledged.
    acked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OutageWriter {
    /// Starts writing `<prefix>w<i>` keys.
    pub fn start(via: &Node, endpoints: &[String], prefix: &str) -> OutageWriter {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(Mutex::new(Duration::ZERO));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let endpoints = endpoints.join(",");
        let prefix = prefix.to_string();
        let tls = [
            format!("--cacert={}", via.tls_file("ca.crt").display()),
            format!("--cert={}", via.tls_file("client.crt").display()),
            format!("--key={}", via.tls_file("client.key").display()),
        ];
        let thread = {
            let (stop, worst, acked) = (stop.clone(), worst.clone(), acked.clone());
            std::thread::spawn(move || {
                let mut failing_since: Option<Instant> = None;
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("{prefix}w{i}");
                    let ok = Command::new("etcdctl")
                        .env("ETCDCTL_API", "3")
                        .arg(format!("--endpoints={endpoints}"))
                        .args(["--dial-timeout=2s", "--command-timeout=3s"])
                        .args(&tls)
                        .args(["put", &key, "x"])
                        .output()
                        .is_ok_and(|o| o.status.success());
                    if ok {
                        acked.lock().unwrap().push(key);
                    }
                    match (ok, failing_since) {
                        (true, Some(t)) => {
                            let mut w = worst.lock().unwrap();
                            *w = (*w).max(t.elapsed());
                            failing_since = None;
                        }
                        (false, None) => failing_since = Some(Instant::now()),
                        _ => {}
                    }
                    i += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                if let Some(t) = failing_since {
                    let mut w = worst.lock().unwrap();
                    *w = (*w).max(t.elapsed());
                }
            })
        };
        OutageWriter {
            stop,
            worst,
            acked,
            thread: Some(thread),
        }
    }

    /// Stops the writer: the longest run of failed writes, and the keys etcd acknowledged.
    pub fn finish_with_keys(self) -> (Duration, Vec<String>) {
        let acked = self.acked.clone();
        let worst = self.finish();
        let keys = std::mem::take(&mut *acked.lock().unwrap());
        (worst, keys)
    }

    /// Stops the writer; the longest run of failed writes it saw.
    pub fn finish(mut self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let worst = *self.worst.lock().unwrap();
        worst
    }
}

/// `socat` forwarding a Unix socket of the test's to the Docker daemon's, each connection in a child of
/// its own (the agent is given it with `--docker-host`); [`DockerProxy::cut`] kills the whole process
/// group, so open connections (the event stream) break as they would when the daemon stops.
pub struct DockerProxy {
    pub socket: PathBuf,
    child: Option<Child>,
}

impl DockerProxy {
    pub fn start(socket: &Path) -> DockerProxy {
        let mut p = DockerProxy {
            socket: socket.to_path_buf(),
            child: None,
        };
        p.restore();
        p
    }

    /// `--docker-host` for an agent that goes through this proxy.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn restore(&mut self) {
        use std::os::unix::process::CommandExt;
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new("socat")
            .arg(format!(
                "UNIX-LISTEN:{},fork,unlink-early",
                self.socket.display()
            ))
            .arg("UNIX-CONNECT:/var/run/docker.sock")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("socat (hack/install-deps.sh installs it): {e}"));
        self.child = Some(child);
        eventually("the proxy socket", Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&self.socket)
                .ok()
                .map(|_| ())
        });
    }

    pub fn cut(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The group: the listener and every forked connection.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// A tmpfs of `size` mounted at `at` for the test's life (root only).
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "mounting a tmpfs at {} (this test needs root): {}",
            at.display(),
            output_text(&o)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem under `dir` with one file until it is full; the file.
pub fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    // dd stops at ENOSPC with an error: that is the point.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .output()
        .unwrap();
    filler
}

/// etcd 3.5.1's directory: `HOSTLET_TEST_ETCD_DIR` when it holds a 3.5, else where
/// `hack/install-deps.sh --tests` puts it. Missing, the test fails: it never runs on something else.
pub fn etcd35() -> PathBuf {
    let dir = hostlet_runtime::testkit::etcd_dir()
        .filter(|d| version_of(&d.join("etcd")).starts_with("3.5."))
        .unwrap_or_else(|| PathBuf::from("/opt/hostlet-test/etcd-3.5.1"));
    let v = version_of(&dir.join("etcd"));
    assert!(
        v.starts_with("3.5."),
        "no etcd 3.5 at {} ({v:?}): run hack/install-deps.sh --tests",
        dir.display()
    );
    dir
}

/// The distribution's etcd 3.4 on PATH.
pub fn etcd34() -> PathBuf {
    let p = PathBuf::from("/usr/bin/etcd");
    let v = version_of(&p);
    assert!(v.starts_with("3.4."), "/usr/bin/etcd is {v:?}, not a 3.4");
    p
}

pub fn version_of(binary: &Path) -> String {
    let o = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// How a test reaches a member's HTTP endpoints with the node's client certificate: (ca, cert, key, client
/// URL). Plain data, so a sampling thread can hold it.
#[derive(Debug, Clone)]
pub struct MemberHttp(pub PathBuf, pub PathBuf, pub PathBuf, pub String);

impl MemberHttp {
    pub fn of(n: &Node) -> MemberHttp {
        MemberHttp(
            n.tls_file("ca.crt"),
            n.tls_file("client.crt"),
            n.tls_file("client.key"),
            n.client_url(),
        )
    }

    /// `GET <client URL><path>` as JSON, within `secs`.
    pub fn get(&self, path: &str, secs: u32) -> Option<serde_json::Value> {
        let o = Command::new("curl")
            .args(["-sf", "--max-time", &secs.to_string()])
            .arg("--cacert")
            .arg(&self.0)
            .arg("--cert")
            .arg(&self.1)
            .arg("--key")
            .arg(&self.2)
            .arg(format!("{}{path}", self.3))
            .output()
            .ok()?;
        serde_json::from_slice(&o.stdout).ok()
    }

    /// Whether the member's `/health` says it serves.
    pub fn healthy(&self) -> bool {
        self.get("/health", 1)
            .is_some_and(|v| v["health"] == "true")
    }
}

/// `/version` of a node's member: (server, cluster).
pub fn member_version(n: &Node) -> Option<(String, String)> {
    let v = MemberHttp::of(n).get("/version", 3)?;
    Some((
        v["etcdserver"].as_str()?.to_string(),
        v["etcdcluster"].as_str()?.to_string(),
    ))
}

/// A running pod `id` on `node`: a busybox sleeping, applied through the CLI.
pub fn run_pod(node: &Node, id: &str) {
    let file = node.dir.join(format!("{id}.yaml"));
    std::fs::write(
        &file,
        format!(
            "version: v1beta1\nid: {id}\ncontainers:\n  - name: app\n    image: busybox:latest\n    command: [sleep, \"3600\"]\n"
        ),
    )
    .unwrap();
    let o = cli(node, &["pod", "apply", "-f", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
}

/// Events about `node` with `reason`, read through `via`: their messages.
pub fn events(via: &Node, node: &str, reason: &str) -> Vec<String> {
    let o = via.etcdctl(&[
        "get",
        &format!("/hostlet/events/{node}/"),
        "--prefix",
        "--print-value-only",
    ]);
    stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["reason"] == reason)
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The files under `dir` holding a private key whose public half is the CA certificate's `ca_crt`, or the
/// node CA certificate's beside it: what a node without the CA keys must not have, whatever the file is
/// called.
pub fn ca_keys_under(dir: &Path, ca_crt: &Path) -> Vec<PathBuf> {
    use x509_parser::pem::parse_x509_pem;
    let public = |path: &Path| {
        let pem = std::fs::read(path).unwrap();
        let (_, p) = parse_x509_pem(&pem).unwrap();
        let ca = p.parse_x509().unwrap();
        ca.public_key().raw.to_vec()
    };
    let node_ca = ca_crt.with_file_name("node-ca.crt");
    assert!(node_ca.exists(), "{} is missing", node_ca.display());
    let ca_publics = [public(ca_crt), public(&node_ca)];
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if !text.contains("PRIVATE KEY-----") {
                    continue;
                }
                let key = rcgen::KeyPair::from_pem(&text).unwrap_or_else(|e| {
                    panic!("{}: a private key that does not parse: {e}", path.display())
                });
                if ca_publics.contains(&key.public_key_der()) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Asserts that no certificate and key pair in `node`'s `tls/` opens `voter`'s etcd: a worker's, which
/// reaches the cluster through the voters' node API alone. Each pair is tried with a new connection.
pub fn assert_no_pair_opens_etcd(node: &Node, voter: &Node) {
    let dir = node.data_dir.join("tls");
    let mut tried = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let cert = entry.unwrap().path();
        if cert.extension().and_then(|e| e.to_str()) != Some("crt") {
            continue;
        }
        let key = cert.with_extension("key");
        if !key.exists() {
            continue;
        }
        tried += 1;
        assert!(
            !pair_opens_etcd(voter, &cert, &key),
            "{} opens {}'s etcd",
            cert.display(),
            voter.name
        );
    }
    assert!(
        tried >= 3,
        "{}: fewer key pairs than a node holds",
        dir.display()
    );
}

/// Whether the certificate and key at `cert`/`key` open `voter`'s etcd, over a new connection.
pub fn pair_opens_etcd(voter: &Node, cert: &Path, key: &Path) -> bool {
    Command::new(etcdctl_program())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", voter.client_url()))
        .args(["--dial-timeout=2s", "--command-timeout=2s"])
        .arg(format!("--cacert={}", voter.tls_file("ca.crt").display()))
        .arg(format!("--cert={}", cert.display()))
        .arg(format!("--key={}", key.display()))
        .args(["get", "/hostlet/x"])
        .output()
        .unwrap()
        .status
        .success()
}

/// Applies a pod set that matches no node and waits until `n`'s metrics show its series: a running agent
/// exports the per-set series only for sets it has.
pub fn metrics_with_a_pod_set(n: &Node) -> (u16, String) {
    let set = n.dir.join("none-set.yaml");
    std::fs::write(
        &set,
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: none}\nspec:\n  selector: {matchLabels: {app: none}}\n  template:\n    metadata: {labels: {app: none}}\n    spec:\n      nodeSelector: {tier: nowhere}\n      containers: [{name: c, image: busybox:latest}]\n",
    )
    .unwrap();
    let o = cli(n, &["podset", "apply", "-f", set.to_str().unwrap()]);
    assert!(o.status.success(), "{}", output_text(&o));
    eventually("the pod set's series", Duration::from_secs(30), || {
        n.get_metrics("/metrics")
            .filter(|(_, t)| t.contains("hostlet_podset_pods{"))
    })
}
