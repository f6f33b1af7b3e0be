//! One `hostlet run` inside its namespace: a [`Node`] run through `ip netns exec`, on the default ports at
//! the namespace's address.

use super::*;

pub use crate::member_support::join_args;

/// One `hostlet run` in one namespace. Everything that is not about the namespace is the [`Node`]'s,
/// reached through `Deref` (`host.name`, `host.data_dir`, `host.kill()`, `host.wait_ready(…)`, …).
pub struct Host {
    pub i: usize,
    pub ns: String,
    /// The proxy the agent reaches Docker through, when the host is made for Docker outages.
    pub docker_proxy: Option<DockerProxy>,
    /// The size-limited filesystem its data dir sits on, when the host is made for a full disk (declared
    /// before `node`, which holds the temp dir: unmounted before the temp dir goes).
    pub disk: Option<Tmpfs>,
    pub node: Node,
}

impl std::ops::Deref for Host {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl std::ops::DerefMut for Host {
    fn deref_mut(&mut self) -> &mut Node {
        &mut self.node
    }
}

impl Host {
    /// Host `i` of `net`: named after its namespace, with scheduled snapshots off (a schedule firing in
    /// the middle of a fault would change what is checked).
    pub fn new(net: &Net, i: usize) -> Host {
        let ns = net.namespaces[i].clone();
        let mut node = Node::on_default_ports(&ns, &net.addr(i));
        node.wrapper = vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()];
        node.extra_args.push("--disable-snapshots".into());
        Host {
            i,
            ns,
            docker_proxy: None,
            disk: None,
            node,
        }
    }

    /// Makes the host ready for the host faults, before its first start: its data dir on a tmpfs of
    /// `size`, and Docker reached through a proxy socket the harness can cut.
    pub fn for_host_faults(&mut self, size: &str) {
        assert!(self.child.is_none(), "{} already started", self.name);
        self.disk = Some(Tmpfs::mount(&self.data_dir, size));
        let proxy = DockerProxy::start(&self.dir.join("docker.sock"));
        let flag = format!("--docker-host={}", proxy.docker_host());
        self.node.extra_args.push(flag);
        self.docker_proxy = Some(proxy);
    }

    /// Whether the agent's ports can be bound in its namespace now, as its own start-up check binds them
    /// (std's `TcpListener::bind`, with `SO_REUSEADDR`); else which one cannot and the sockets on it.
    pub fn ports_bindable(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.ns);
        let addr = &self.listen_address;
        let addrs = [
            format!("127.0.0.1:{}", self.client_port),
            format!("{addr}:{}", self.client_port),
            format!("{addr}:{}", self.peer_port),
            format!("{addr}:{}", self.api_port),
            format!("{addr}:{}", self.metrics_port),
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

    /// [`Node::start`], but a start right after a kill first waits until the agent's ports can be bound
    /// (said when it has to wait): sockets the killed processes left may hold them a while.
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
        self.node.start(extra);
    }

    /// The agent's etcd child, if any (none when the agent is not running).
    pub fn etcd_pid(&self) -> Option<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .and_then(crate::member_support::etcd_member_of)
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

    /// The name of the member in `db/etcd` (none before the first start).
    pub fn member_name(&self) -> Option<String> {
        std::fs::read_to_string(self.data_dir.join("db/etcd/name"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The agent goes before the proxy it reaches Docker through and the tmpfs under its data dir.
        self.node.stop(Duration::from_secs(20));
    }
}
