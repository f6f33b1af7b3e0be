//! One `hostlet run` inside its namespace.

use super::*;

/// One `hostlet run` in one namespace.
pub struct Host {
    pub i: usize,
    pub name: String,
    pub ns: String,
    pub addr: String,
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    pub child: Option<Child>,
    /// The proxy the agent reaches Docker through, when the host is made for Docker outages.
    pub docker_proxy: Option<DockerProxy>,
    /// The size-limited filesystem its data dir sits on, when the host is made for a full disk (declared
    /// before `_tmp`: unmounted before the temp dir goes).
    pub disk: Option<Tmpfs>,
    runs: u32,
    _tmp: tempfile::TempDir,
}

impl Host {
    pub fn new(net: &Net, i: usize) -> Host {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let dir = tmp.path().to_path_buf();
        Host {
            i,
            name: net.namespaces[i].clone(),
            ns: net.namespaces[i].clone(),
            addr: net.addr(i),
            data_dir: dir.join("data"),
            dir,
            child: None,
            docker_proxy: None,
            disk: None,
            runs: 0,
            _tmp: tmp,
        }
    }

    /// Makes the host ready for the host faults, before its first start: its data dir on a tmpfs of
    /// `size`, and Docker reached through a proxy socket the harness can cut.
    pub fn for_host_faults(&mut self, size: &str) {
        assert!(self.child.is_none(), "{} already started", self.name);
        self.disk = Some(Tmpfs::mount(&self.data_dir, size));
        self.docker_proxy = Some(DockerProxy::start(&self.dir.join("docker.sock")));
    }

    /// The `/readyz` report, if the agent answers.
    pub fn readyz(&self) -> Option<serde_json::Value> {
        let (_, body) = http_get(&self.metrics_url("/readyz"))?;
        serde_json::from_str(&body).ok()
    }

    /// The flags of `hostlet run` on this host: its address, the default ports, scheduled snapshots off
    /// (a schedule firing in the middle of a fault would change what is checked).
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--node-name={}", self.name),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--advertise-address={}", self.addr),
            format!("--listen={}:10250", self.addr),
            format!("--metrics-listen={}:10249", self.addr),
            "--disable-snapshots".into(),
            // The machine's own disk is not what these tests are about (tests/disk_full.rs is).
            "--disk-min-free=1%".into(),
            "--image-gc-high-threshold=100".into(),
        ];
        if let Some(p) = &self.docker_proxy {
            args.push(format!("--docker-host={}", p.docker_host()));
        }
        args
    }

    /// A command run inside this host's namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("hostlet-{}.log", self.runs))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `lines` lines of the current run's log above debug level.
    pub fn log_story(&self, lines: usize) -> String {
        let log = self.log();
        let story: Vec<&str> = log.lines().filter(|l| !l.contains(" DEBUG ")).collect();
        story[story.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether the agent's ports can be bound in its namespace now, as its own start-up check binds them
    /// (std's `TcpListener::bind`, with `SO_REUSEADDR`); else which one cannot and the sockets on it.
    pub fn ports_bindable(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.ns);
        let addrs = [
            "127.0.0.1:2379".to_string(),
            format!("{}:2379", self.addr),
            format!("{}:2380", self.addr),
            format!("{}:10250", self.addr),
            format!("{}:10249", self.addr),
        ];
        // setns moves only the calling thread: a thread of its own, gone afterwards.
        let bound = std::thread::scope(|s| {
            s.spawn(|| -> Result<(), String> {
                let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
                // SAFETY: setns on a valid namespace fd affects this thread only.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
                }
                for a in &addrs {
                    std::net::TcpListener::bind(a).map_err(|e| format!("{a}: {e}"))?;
                }
                Ok(())
            })
            .join()
            .unwrap_or_else(|_| Err("the bind check panicked".into()))
        });
        bound.map_err(|e| {
            let sockets =
                run(&["ip", "netns", "exec", &self.ns, "ss", "-Htan"]).unwrap_or_default();
            let held: Vec<String> = sockets
                .lines()
                .filter(|l| !l.starts_with("TIME-WAIT") && !l.starts_with("LISTEN"))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            format!("{e}; sockets: {held:?}")
        })
    }

    /// Starts the agent with `extra` flags, output into a log file. `ip netns exec` execs the agent, so
    /// the child's pid is the agent's. A start right after a kill first waits until the agent's ports can
    /// be bound (said when it has to wait): sockets the killed processes left may hold them a while.
    pub fn start(&mut self, extra: &[String]) {
        assert!(self.child.is_none(), "{} already running", self.name);
        if let Err(why) = self.ports_bindable() {
            let t = Instant::now();
            eprintln!("{}: a port cannot be bound yet: {why}", self.name);
            crate::member_support::eventually(
                &format!("{}'s ports to be bindable", self.name),
                Duration::from_secs(120),
                || self.ports_bindable().ok(),
            );
            eprintln!(
                "{}: bindable after {:.1} s",
                self.name,
                t.elapsed().as_secs_f64()
            );
        }
        self.runs += 1;
        let log = std::fs::File::create(self.log_path())
            .unwrap_or_else(|e| panic!("{}: {e}", self.log_path().display()));
        let err = log.try_clone().unwrap_or_else(|e| panic!("log file: {e}"));
        let child = self
            .command(BIN)
            .args(&self.args()[..])
            .args(extra)
            .env("RUST_LOG", "info,hostlet_controllers=debug")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting hostlet in {}: {e}", self.ns));
        self.child = Some(child);
    }

    /// Runs `hostlet run` with `extra` flags to its end (a reset), with a deadline; `None` on timeout
    /// (the process is killed then).
    pub fn run_to_exit(&self, extra: &[String], timeout: Duration) -> Option<Output> {
        let mut child = self
            .command(BIN)
            .args(&self.args()[..])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("hostlet in {}: {e}", self.ns));
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return child.wait_with_output().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The agent's etcd child, if any.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.pid().and_then(crate::member_support::etcd_member_of)
    }

    pub fn metrics_url(&self, path: &str) -> String {
        format!("http://{}:10249{path}", self.addr)
    }

    pub fn is_ready(&self) -> bool {
        matches!(http_get(&self.metrics_url("/readyz")), Some((200, _)))
    }

    /// Waits until `/readyz` says ready; panics with the log if the agent exits or the deadline passes.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_ready() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
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
                self.log_story(80)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL to the agent (its etcd follows on its own).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM to the agent and a wait for its exit; SIGKILL after `timeout`.
    pub fn terminate(&mut self, timeout: Duration) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "TERM");
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until no process is left in the namespace (an etcd follows its killed agent by itself).
    pub fn wait_stopped(&self, timeout: Duration) {
        crate::member_support::eventually(
            &format!("every process in {} to be gone", self.ns),
            timeout,
            || {
                run(&["ip", "netns", "pids", &self.ns])
                    .ok()
                    .filter(|p| {
                        p.split_whitespace()
                            .filter_map(|p| p.parse().ok())
                            .all(|p| !alive(p))
                    })
                    .map(|_| ())
            },
        );
    }

    pub fn client_url(&self) -> String {
        format!("https://{}:2379", self.addr)
    }

    pub fn api_url(&self) -> String {
        format!("https://{}:10250", self.addr)
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .map(|t| t.trim().to_string())
            .unwrap_or_default()
    }

    pub fn tls_file(&self, name: &str) -> PathBuf {
        self.data_dir.join("tls").join(name)
    }

    /// The name of the member in `db/etcd` (none before the first start).
    pub fn member_name(&self) -> Option<String> {
        std::fs::read_to_string(self.data_dir.join("db/etcd/name"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// `hostlet <args> --data-dir <this host's>` inside the namespace.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command(BIN)
            .args(args)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .output()
            .unwrap_or_else(|e| panic!("hostlet cli in {}: {e}", self.ns))
    }
}

/// `--server` and `--token` to join through `server`.
pub fn join_args(server: &Host) -> Vec<String> {
    vec![
        format!("--server={}", server.api_url()),
        format!("--token={}", server.token()),
    ]
}
