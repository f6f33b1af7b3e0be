//! Hosts in network namespaces, for tests that partition, slow down, pause and kill them.
//!
//! A [`Net`] is N namespaces `hl<k>-<tag>-<i>` joined by a bridge `hlbr<k>` in the root namespace through
//! veth pairs, in a private subnet `10.<200 + k / 256>.<k % 256>.0/24` of its own: slot `k` is claimed
//! under `/run/hostlet-netns/<k>` so that tests (and processes) in parallel never share one, and a subnet
//! the host already routes is never used. Each [`Host`] is one `hostlet run` inside its namespace on the
//! default ports (2379, 2380, 10250; metrics on 10249 at its address), with its own data dir; pods still go
//! to the host's Docker engine through its unix socket. Everything is removed when the [`Cluster`] (or the
//! [`Net`]) is dropped, also when the test panics; a slot left by a test that was killed is swept by the
//! next one that finds it.
//!
//! Faults ([`Fault`]): a partition (nftables DROP rules inside the namespace, both ways), packet loss and
//! delay on one link (`tc … netem`, when the kernel has it), SIGSTOP/SIGCONT of an etcd, SIGKILL of an
//! agent or of its etcd; for the soak ([`Cluster::for_host_faults`]) a full disk and a Docker outage.
//! [`Cluster::check`] asserts the invariants after each one and prints a line per invariant.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::member_support::{alive, docker_ids, http_get, signal, DockerProxy, Tmpfs, BIN};

/// Where slots are claimed (a directory per slot, holding the owner's pid).
pub const LOCK_ROOT: &str = "/run/hostlet-netns";
/// Slots: subnets 10.200.0.0/24 to 10.215.255.0/24.
const SLOTS: u32 = 4096;
/// The table the faults put into a namespace.
const FAULT_TABLE: &str = "hostlet_fault";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why network namespaces cannot be used here, if they cannot.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if euid != "0" {
        return Some(format!(
            "network namespaces need root (effective uid {euid}): `ip netns add` is impossible"
        ));
    }
    for tool in ["ip", "nft", "iptables"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "{tool} is missing (hack/install-deps.sh installs it)"
            ));
        }
    }
    None
}

/// Skips the calling test (returns `true`) with the reason printed when namespaces cannot be used, or
/// fails it where they must be (`HOSTLET_TEST_REQUIRE_NETNS=1`, which `.ci/run` sets), so that CI never
/// loses the fault tests without a red line.
pub fn skip() -> bool {
    let Some(why) = unavailable() else {
        return false;
    };
    if required() {
        panic!("HOSTLET_TEST_REQUIRE_NETNS=1 and network namespaces cannot be used: {why}");
    }
    eprintln!("SKIPPED: {why}");
    true
}

/// Whether the environment asks for the fault tests to fail rather than skip.
pub fn required() -> bool {
    std::env::var("HOSTLET_TEST_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command; its output, or an error with the command and what it printed.
fn run(args: &[&str]) -> Result<String, String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("{}: {}", args.join(" "), text(&o).trim()))
    }
}

/// [`run`], panicking on failure (set-up steps that must work).
fn must(args: &[&str]) -> String {
    run(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a command with `input` on its stdin.
fn run_with_input(args: &[&str], input: &str) -> Result<(), String> {
    use std::io::Write;
    let mut c = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if let Some(mut stdin) = c.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    }
    let o = c
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), text(&o).trim()))
    }
}

/// An IPv4 prefix as (network, length).
fn parse_prefix(s: &str) -> Option<(u32, u32)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, l.parse().ok()?),
        None => (s, 32),
    };
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    (len <= 32).then_some((u32::from(ip), len))
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

/// The prefixes the host routes or has addresses in (every table), default routes left out.
fn routed_prefixes() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let routes = run(&["ip", "-4", "-o", "route", "show", "table", "all"]).unwrap_or_default();
    for line in routes.lines() {
        let mut words = line.split_whitespace();
        let mut first = words.next().unwrap_or("");
        if matches!(
            first,
            "local"
                | "broadcast"
                | "unicast"
                | "multicast"
                | "anycast"
                | "blackhole"
                | "unreachable"
                | "prohibit"
                | "throw"
                | "nat"
        ) {
            first = words.next().unwrap_or("");
        }
        if let Some(p) = parse_prefix(first) {
            out.push(p);
        }
    }
    let addrs = run(&["ip", "-4", "-o", "addr", "show"]).unwrap_or_default();
    for line in addrs.lines() {
        let mut words = line.split_whitespace();
        if let Some(p) = words
            .by_ref()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(parse_prefix)
        {
            out.push(p);
        }
    }
    out
}

fn slot_prefix(k: u32) -> [u8; 3] {
    [10, (200 + k / 256) as u8, (k % 256) as u8]
}

fn owner_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("owner"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Removes what a run on slot `k` made: the processes in its namespaces, the namespaces, the bridge, the
/// forwarding rule, its pods' containers. Each step may find nothing.
fn sweep(k: u32) {
    let prefix = format!("hl{k}-");
    let list = run(&["ip", "netns", "list"]).unwrap_or_default();
    for ns in list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
    {
        kill_namespace_processes(ns);
        let _ = run(&["ip", "netns", "del", ns]);
    }
    let veths = format!("hl{k}h");
    let links = run(&["ip", "-o", "link", "show"]).unwrap_or_default();
    for link in links
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| n.starts_with(&veths))
    {
        let _ = run(&["ip", "link", "del", link]);
    }
    let bridge = format!("hlbr{k}");
    let _ = run(&["ip", "link", "del", &bridge]);
    while run(&forward_rule("-D", k)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>())
    .is_ok()
    {}
    remove_containers_of_nodes(&prefix);
}

/// The iptables arguments of the rule letting the bridge forward between its ports: Docker sets the
/// FORWARD policy to DROP and bridged frames pass through it.
fn forward_rule(op: &str, k: u32) -> Vec<String> {
    let bridge = format!("hlbr{k}");
    let mut v: Vec<String> = vec!["iptables".into(), op.into(), "FORWARD".into()];
    if op == "-I" {
        v.push("1".into());
    }
    v.extend(
        [
            "-i",
            &bridge,
            "-o",
            &bridge,
            "-m",
            "comment",
            "--comment",
            &format!("hostlet-netns-{k}"),
            "-j",
            "ACCEPT",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v
}

/// SIGKILLs every process in namespace `ns` and waits until they are gone.
fn kill_namespace_processes(ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids: Vec<u32> = run(&["ip", "netns", "pids", ns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p| alive(*p))
            .collect();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for p in pids {
            signal(p, "CONT");
            signal(p, "KILL");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes the containers of every node whose name starts with `prefix`.
fn remove_containers_of_nodes(prefix: &str) {
    let listed = run(&[
        "docker",
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        "label=io.hostlet.node",
        "--format",
        "{{.ID}} {{.Label \"io.hostlet.node\"}}",
    ])
    .unwrap_or_default();
    let ids: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, node)| node.starts_with(prefix))
        .map(|(id, _)| id)
        .collect();
    if !ids.is_empty() {
        let mut args = vec!["docker", "rm", "-f"];
        args.extend(ids);
        let _ = run(&args);
    }
}

/// Claims a free slot whose subnet the host does not route.
fn claim_slot() -> (u32, PathBuf) {
    std::fs::create_dir_all(LOCK_ROOT).unwrap_or_else(|e| panic!("{LOCK_ROOT}: {e}"));
    let routed = routed_prefixes();
    let start =
        (std::process::id().wrapping_mul(31) + COUNTER.fetch_add(1, Ordering::SeqCst) * 7) % SLOTS;
    for off in 0..SLOTS {
        let k = (start + off) % SLOTS;
        let p = slot_prefix(k);
        let net = (u32::from(std::net::Ipv4Addr::new(p[0], p[1], p[2], 0)), 24);
        if routed.iter().any(|r| r.1 > 0 && overlaps(*r, net)) {
            continue;
        }
        let dir = Path::new(LOCK_ROOT).join(k.to_string());
        let mut claimed = std::fs::create_dir(&dir).is_ok();
        if !claimed {
            // Left by a run that died without cleaning up: sweep it and take it.
            // (`hack/netns.sh up` marks its slots `manual`: they live until `hack/netns.sh down`.)
            if !dir.join("manual").exists() && owner_pid(&dir).is_some_and(|pid| !alive(pid)) {
                sweep(k);
                let _ = std::fs::remove_dir_all(&dir);
                claimed = std::fs::create_dir(&dir).is_ok();
            }
        }
        if claimed {
            std::fs::write(dir.join("owner"), std::process::id().to_string())
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            // A run killed before it wrote its owner file may have left something: start clean.
            sweep(k);
            return (k, dir);
        }
    }
    panic!("no free subnet slot under {LOCK_ROOT}");
}

/// N namespaces on one bridge, in a subnet of their own.
pub struct Net {
    pub k: u32,
    pub tag: String,
    pub prefix: [u8; 3],
    pub bridge: String,
    pub namespaces: Vec<String>,
    lock: PathBuf,
}

impl Net {
    /// Builds `n` namespaces for test `tag` (a few letters: names are short).
    pub fn new(tag: &str, n: usize) -> Net {
        let (k, lock) = claim_slot();
        let prefix = slot_prefix(k);
        let mut net = Net {
            k,
            tag: tag.to_string(),
            prefix,
            bridge: format!("hlbr{k}"),
            namespaces: Vec::new(),
            lock,
        };
        let bridge = net.bridge.clone();
        must(&["ip", "link", "add", &bridge, "type", "bridge"]);
        must(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", net.gateway()),
            "dev",
            &bridge,
        ]);
        must(&["ip", "link", "set", &bridge, "up"]);
        must(
            &forward_rule("-I", k)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        for i in 0..n {
            let ns = format!("hl{k}-{tag}-{}", i + 1);
            must(&["ip", "netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            let outer = net.veth(i);
            let inner = format!("hl{k}n{}", i + 1);
            must(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            must(&["ip", "link", "set", &inner, "netns", &ns]);
            must(&["ip", "-n", &ns, "link", "set", &inner, "name", "eth0"]);
            must(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.addr(i)),
                "dev",
                "eth0",
            ]);
            must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            must(&["ip", "link", "set", &outer, "master", &bridge, "up"]);
        }
        eprintln!(
            "netns: {n} namespaces hl{k}-{tag}-1..{n} on {bridge}, subnet {}.{}.{}.0/24",
            prefix[0], prefix[1], prefix[2]
        );
        net
    }

    /// Host `i`'s address (0-based).
    pub fn addr(&self, i: usize) -> String {
        let p = self.prefix;
        format!("{}.{}.{}.{}", p[0], p[1], p[2], i + 1)
    }

    /// The bridge's address in the root namespace (how the test reaches the hosts).
    pub fn gateway(&self) -> String {
        let p = self.prefix;
        format!("{}.{}.{}.254", p[0], p[1], p[2])
    }

    /// The root end of host `i`'s veth pair.
    pub fn veth(&self, i: usize) -> String {
        format!("hl{}h{}", self.k, i + 1)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (i, ns) in self.namespaces.iter().enumerate() {
            kill_namespace_processes(ns);
            // The pair goes with either end; deleting it here does not wait for the kernel to free the
            // namespace, which can take a while after its sockets close.
            let _ = run(&["ip", "link", "del", &self.veth(i)]);
            let _ = run(&["ip", "netns", "del", ns]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge]);
        let k = self.k;
        while run(&forward_rule("-D", k)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>())
        .is_ok()
        {}
        remove_containers_of_nodes(&format!("hl{k}-"));
        let _ = std::fs::remove_dir_all(&self.lock);
    }
}

/// `tc qdisc add dev eth0 root netem ARGS…` inside namespace `ns`.
fn add_netem(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut cmd = vec![
        "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
    ];
    cmd.extend_from_slice(args);
    run(&cmd).map(|_| ())
}

/// Whether the kernel has `sch_netem` (tried on a namespace's link: `Ok` when it does).
pub fn netem_available(ns: &str) -> Result<(), String> {
    run(&[
        "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
        "1ms",
    ])?;
    let _ = run(&[
        "ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root",
    ]);
    Ok(())
}

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

/// A fault, put on and taken off.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Every packet in and out of the host's link dropped (nftables, inside its namespace).
    Partition,
    /// A share of the packets on the host's link dropped, both ways (netem when the kernel has it,
    /// else nftables' random numbers).
    Loss(u32),
    /// Delay with jitter on the host's link (netem; where the kernel has none, a token-bucket queue that
    /// holds packets for up to `ms`).
    Delay { ms: u32, jitter_ms: u32 },
}

impl Fault {
    /// A short name for reports.
    pub fn label(&self) -> String {
        match self {
            Fault::Partition => "partition".into(),
            Fault::Loss(pct) => format!("loss-{pct}%"),
            Fault::Delay { ms, jitter_ms } => format!("delay-{ms}ms±{jitter_ms}ms"),
        }
    }

    pub fn put_on(&self, host: &Host) -> Result<(), String> {
        let ns = host.ns.as_str();
        match self {
            Fault::Partition => nft_drop(ns, ""),
            Fault::Loss(pct) => {
                if netem_available(ns).is_ok() {
                    add_netem(ns, &["loss", &format!("{pct}%")])
                } else {
                    nft_drop(ns, &format!("numgen random mod 100 < {pct} "))
                }
            }
            Fault::Delay { ms, jitter_ms } => {
                if netem_available(ns).is_ok() {
                    return add_netem(
                        ns,
                        &["delay", &format!("{ms}ms"), &format!("{jitter_ms}ms")],
                    );
                }
                // Without netem a slow link still runs: a token bucket too narrow for the traffic,
                // whose queue holds packets for up to `ms` (delay by queueing rather than by clock).
                run(&[
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    "256kbit",
                    "burst",
                    "16kbit",
                    "latency",
                    &format!("{ms}ms"),
                ])
                .map(|_| ())
            }
        }
    }

    /// Takes every fault off the host (whatever was put on).
    pub fn heal(host: &Host) {
        let ns = host.ns.as_str();
        let _ = run(&[
            "ip",
            "netns",
            "exec",
            ns,
            "nft",
            "delete",
            "table",
            "inet",
            FAULT_TABLE,
        ]);
        let _ = run(&[
            "ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root",
        ]);
    }
}

/// Drops the packets matching `cond` on `eth0`, both ways, inside namespace `ns` (loopback untouched).
fn nft_drop(ns: &str, cond: &str) -> Result<(), String> {
    let rules = format!(
        "table inet {FAULT_TABLE} {{\n\
         chain input {{ type filter hook input priority -10; policy accept; iifname \"eth0\" {cond}drop; }}\n\
         chain output {{ type filter hook output priority -10; policy accept; oifname \"eth0\" {cond}drop; }}\n\
         }}\n"
    );
    run_with_input(&["ip", "netns", "exec", ns, "nft", "-f", "-"], &rules)
}

/// A Kubernetes v1 Pod that sleeps: one app container beside the infra one.
pub const SLEEPER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  containers:\n  - name: main\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"86400\"]\n";

/// A client for the cluster from the root namespace, with a host's client certificate.
pub struct Client {
    pub rt: tokio::runtime::Runtime,
    tls: hostlet_runtime::TlsFiles,
}

impl Client {
    pub fn new(via: &Host) -> Client {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("tokio: {e}"));
        // Copies: a rejoin may issue the host's certificates again; the CA stays.
        let dir = via.dir.join("test-client-tls");
        let _ = std::fs::create_dir_all(&dir);
        for f in ["ca.crt", "client.crt", "client.key"] {
            std::fs::copy(via.tls_file(f), dir.join(f))
                .unwrap_or_else(|e| panic!("{}: {e}", via.tls_file(f).display()));
        }
        Client {
            rt,
            tls: hostlet_runtime::TlsFiles {
                ca: dir.join("ca.crt"),
                cert: dir.join("client.crt"),
                key: dir.join("client.key"),
            },
        }
    }

    pub fn config(&self, endpoints: &[String], timeout: Duration) -> hostlet_runtime::EtcdConfig {
        let mut c =
            hostlet_runtime::EtcdConfig::new(endpoints.iter().cloned()).with_tls(self.tls.clone());
        c.connect_timeout = timeout;
        c.request_timeout = timeout;
        c
    }

    /// A client of exactly these endpoints.
    pub fn connect(&self, endpoints: &[String], timeout: Duration) -> hostlet_runtime::Etcd {
        let cfg = self.config(endpoints, timeout);
        self.rt
            .block_on(hostlet_runtime::Etcd::connect(cfg))
            .unwrap_or_else(|e| panic!("etcd client: {e}"))
    }

    /// What the member at `endpoint` says: (cluster id, member id, leader, raft index), `None` when it
    /// does not answer.
    pub fn status(&self, endpoint: &str) -> Option<(u64, u64, u64, u64)> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(2));
        let s = self.rt.block_on(etcd.status_of(endpoint)).ok()?;
        let h = s.header()?;
        Some((h.cluster_id(), h.member_id(), s.leader(), s.raft_index()))
    }

    /// (name, id, is learner) of every member, as the member at `endpoint` knows them.
    pub fn members(&self, endpoint: &str) -> Option<Vec<(String, u64, bool)>> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(2));
        let ms = self.rt.block_on(etcd.member_list_of(endpoint)).ok()?;
        Some(
            ms.iter()
                .map(|m| (m.name().to_string(), m.id(), m.is_learner()))
                .collect(),
        )
    }

    /// The keys under `prefix` in the member at `endpoint`'s own copy (a serializable read: what that
    /// member holds, leader or not).
    pub fn local_keys(&self, endpoint: &str, prefix: &str) -> Option<BTreeSet<String>> {
        let etcd = self.connect(&[endpoint.to_string()], Duration::from_secs(5));
        let mut kv = etcd.client().kv_client();
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_serializable();
        let r = self
            .rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), kv.get(prefix, Some(opts))).await
            })
            .ok()?
            .ok()?;
        Some(
            r.kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect(),
        )
    }

    /// The values under `prefix`, read through the cluster.
    pub fn values(&self, endpoints: &[String], prefix: &str) -> Vec<String> {
        let etcd = self.connect(endpoints, Duration::from_secs(5));
        self.rt
            .block_on(etcd.get_prefix(prefix))
            .map(|(kvs, _)| {
                kvs.iter()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn put(&self, endpoints: &[String], key: &str, value: &str) -> Result<(), String> {
        let etcd = self.connect(endpoints, Duration::from_secs(5));
        self.rt
            .block_on(etcd.put(key, value.as_bytes().to_vec()))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Puts a key every ~100 ms through the cluster's endpoints and records each one it got an OK for.
pub struct Writer {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    /// Puts begun and finished: equal when none is in flight.
    begun: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    pub acked: Arc<Mutex<Vec<String>>>,
    pub failed: Arc<AtomicU64>,
    pub prefix: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub fn start(cfg: hostlet_runtime::EtcdConfig, prefix: &str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let begun = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicU64::new(0));
        let (s, a, f, p) = (
            stop.clone(),
            acked.clone(),
            failed.clone(),
            prefix.to_string(),
        );
        let (pa, b, d) = (paused.clone(), begun.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(etcd) = hostlet_runtime::Etcd::connect(cfg).await else {
                    return;
                };
                let mut seq: u64 = 0;
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !s.load(Ordering::SeqCst) {
                    tick.tick().await;
                    // Counted as begun before the pause is looked at, so that `pause` never misses a
                    // put about to start.
                    b.fetch_add(1, Ordering::SeqCst);
                    if pa.load(Ordering::SeqCst) {
                        d.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    seq += 1;
                    let key = format!("{p}/{seq:09}");
                    let put = etcd.put(&key, seq.to_string().into_bytes());
                    match tokio::time::timeout(Duration::from_secs(5), put).await {
                        Ok(Ok(_)) => a.lock().unwrap_or_else(|e| e.into_inner()).push(key),
                        _ => {
                            f.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    d.fetch_add(1, Ordering::SeqCst);
                }
            });
        });
        Writer {
            stop,
            paused,
            begun,
            done,
            acked,
            failed,
            prefix: prefix.to_string(),
            thread: Some(thread),
        }
    }

    pub fn acked(&self) -> Vec<String> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops putting; returns once no put is in flight.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        crate::member_support::eventually(
            "the writer's put in flight",
            Duration::from_secs(10),
            || {
                (self.begun.load(Ordering::SeqCst) == self.done.load(Ordering::SeqCst))
                    .then_some(())
            },
        );
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where each member dir and snapshot file of a host was seen.
#[derive(Debug, Clone, Default)]
pub struct DiskState {
    /// Member name → the dir under `db/` holding it whole (`etcd`, `etcd-backup-<unix>`, `etcd-old-<…>`).
    pub members: BTreeMap<String, String>,
    /// Snapshot file names in `db/snapshots`.
    pub snapshots: BTreeSet<String>,
    pub backups: usize,
    /// The `db/etcd-backup-*` names: a new backup shows as a new name (the count stops at five).
    pub backup_names: BTreeSet<String>,
}

impl DiskState {
    pub fn of(host: &Host) -> DiskState {
        let db = host.data_dir.join("db");
        let mut s = DiskState::default();
        for e in std::fs::read_dir(&db).into_iter().flatten().flatten() {
            let dir = e.file_name().to_string_lossy().into_owned();
            if dir != "etcd" && !dir.starts_with("etcd-backup-") && !dir.starts_with("etcd-old-") {
                continue;
            }
            if dir.starts_with("etcd-backup-") {
                s.backups += 1;
                s.backup_names.insert(dir.clone());
            }
            let name = std::fs::read_to_string(e.path().join("name"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            if !name.is_empty() && e.path().join("member/wal").is_dir() {
                s.members.insert(name, dir);
            }
        }
        for e in std::fs::read_dir(db.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            // A `.part` is a snapshot being written, not one taken.
            if e.path().is_file() && !name.starts_with('.') && !name.ends_with(".part") {
                s.snapshots.insert(name);
            }
        }
        s
    }
}

/// The backups a host keeps (older ones are pruned by design).
pub const BACKUPS_KEPT: usize = 5;

/// The snapshots a host keeps per name (`--snapshot-retention`'s default): older ones of a name are pruned
/// by design.
pub const SNAPSHOTS_KEPT: usize = 5;

/// The series (`<name>-<node>`) and time of a snapshot file `<name>-<node>-<unix>[.ext]`.
fn snapshot_series(file: &str) -> Option<(&str, u64)> {
    let stem = file.split('.').next()?;
    let (series, unix) = stem.rsplit_once('-')?;
    Some((series, unix.parse().ok()?))
}

/// Whether snapshot `gone` went by retention: at least [`SNAPSHOTS_KEPT`] newer ones of its name are there.
pub fn pruned_by_retention(gone: &str, now: &BTreeSet<String>) -> bool {
    let Some((series, at)) = snapshot_series(gone) else {
        return false;
    };
    now.iter()
        .filter_map(|f| snapshot_series(f))
        .filter(|(s, t)| *s == series && *t > at)
        .count()
        >= SNAPSHOTS_KEPT
}

/// The cluster under test: hosts in namespaces, a pod on each, a writer, and what the invariants compare.
pub struct Cluster {
    pub hosts: Vec<Host>,
    pub client: Client,
    pub writer: Option<Writer>,
    /// Every member dir and snapshot seen on each host so far.
    seen: Vec<DiskState>,
    pub net: Net,
}

/// What is taken before a fault to compare with after it.
pub struct Before {
    pub containers: Vec<Vec<String>>,
    pub cluster_id: u64,
    pub members: Vec<Option<String>>,
    pub backups: Vec<usize>,
}

/// The outcome of one fault's checks.
#[derive(Debug, Clone)]
pub struct Report {
    pub converge: Duration,
    pub lines: Vec<String>,
    pub failures: Vec<String>,
}

impl Cluster {
    /// `n` hosts: the first founds the cluster, the others join through it one after the other; a pod on
    /// each; the writer started.
    pub fn new(tag: &str, n: usize) -> Cluster {
        Cluster::partly(tag, n, n)
    }

    /// [`Cluster::new`] on `n` namespaces with only the first `started` hosts started (the others are
    /// for joins the test makes).
    pub fn partly(tag: &str, n: usize, started: usize) -> Cluster {
        Cluster::build(tag, n, started, None)
    }

    /// [`Cluster::new`] with every host made for the host faults ([`Host::for_host_faults`]): its data
    /// dir on a tmpfs of `disk_size`, Docker through a proxy socket.
    pub fn for_host_faults(tag: &str, n: usize, disk_size: &str) -> Cluster {
        Cluster::build(tag, n, n, Some(disk_size))
    }

    fn build(tag: &str, n: usize, started: usize, host_faults: Option<&str>) -> Cluster {
        let net = Net::new(tag, n);
        let mut hosts: Vec<Host> = (0..n).map(|i| Host::new(&net, i)).collect();
        if let Some(size) = host_faults {
            for h in &mut hosts {
                h.for_host_faults(size);
            }
        }
        let ready = Duration::from_secs(120);
        hosts[0].start(&[]);
        hosts[0].wait_ready(ready);
        let client = Client::new(&hosts[0]);
        let mut c = Cluster {
            hosts,
            client,
            writer: None,
            seen: Vec::new(),
            net,
        };
        for i in 1..started {
            let join = join_args(&c.hosts[0]);
            c.hosts[i].start(&join);
            c.hosts[i].wait_ready(ready);
        }
        c.wait_converged(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{e}\n{}", c.logs()));
        for i in 0..started {
            c.apply_pod(i);
        }
        for i in 0..started {
            c.wait_pod(i, Duration::from_secs(90));
        }
        let cfg = c.client.config(&c.endpoints(), Duration::from_secs(2));
        c.writer = Some(Writer::start(cfg, "/faults/writer"));
        c.seen = c.hosts.iter().map(DiskState::of).collect();
        c
    }

    /// The client URLs of the hosts that have a member.
    pub fn endpoints(&self) -> Vec<String> {
        self.hosts
            .iter()
            .filter(|h| h.member_name().is_some())
            .map(Host::client_url)
            .collect()
    }

    /// The hosts that have a member (started at least once).
    pub fn members_hosts(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|i| self.hosts[*i].member_name().is_some())
            .collect()
    }

    /// The end of every host's log, for a failure message.
    pub fn logs(&self) -> String {
        self.hosts
            .iter()
            .map(|h| format!("---- {} ----\n{}", h.name, h.log_story(40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn apply_pod(&self, i: usize) {
        let key = format!("/hostlet/hosts/{}/pods/sleeper", self.hosts[i].name);
        self.client
            .put(&self.endpoints(), &key, SLEEPER)
            .unwrap_or_else(|e| panic!("applying the pod on {}: {e}", self.hosts[i].name));
    }

    /// Waits until host `i`'s pod runs: its infra and app containers exist and run.
    pub fn wait_pod(&self, i: usize, timeout: Duration) {
        let name = &self.hosts[i].name;
        crate::member_support::eventually(&format!("{name}'s pod to run"), timeout, || {
            let o = Command::new("docker")
                .args([
                    "ps",
                    "-q",
                    "--filter",
                    &format!("label=io.hostlet.node={name}"),
                    "--filter",
                    "status=running",
                ])
                .output()
                .ok()?;
            (String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .count()
                >= 2)
                .then_some(())
        });
    }

    /// The host whose member leads, as the members say.
    pub fn leader(&self) -> Option<usize> {
        let statuses: Vec<Option<(u64, u64, u64, u64)>> = self
            .hosts
            .iter()
            .map(|h| self.client.status(&h.client_url()))
            .collect();
        statuses
            .iter()
            .position(|s| matches!(s, Some((_, id, leader, _)) if id == leader))
    }

    /// Waits (deadline `timeout`) for a leader; its host.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        crate::member_support::eventually("a leader", timeout, || self.leader())
    }

    /// The members' names that should be voters: each running host's current member.
    pub fn expected_voters(&self, which: &[usize]) -> BTreeSet<String> {
        which
            .iter()
            .filter_map(|i| self.hosts[*i].member_name())
            .collect()
    }

    /// `Ok` when every host in `which` answers, all with one cluster id and one leader, each listing
    /// exactly the expected voters (no learner); else what is not so yet.
    pub fn converged_among(&self, which: &[usize]) -> Result<u64, String> {
        let want = self.expected_voters(which);
        let mut ids = BTreeSet::new();
        let mut leaders = BTreeSet::new();
        for i in which {
            let h = &self.hosts[*i];
            let Some((cluster, _, leader, _)) = self.client.status(&h.client_url()) else {
                return Err(format!("{} does not answer", h.name));
            };
            if leader == 0 {
                return Err(format!("{} has no leader", h.name));
            }
            ids.insert(cluster);
            leaders.insert(leader);
            let Some(ms) = self.client.members(&h.client_url()) else {
                return Err(format!("{} does not list its members", h.name));
            };
            let voters: BTreeSet<String> = ms
                .iter()
                .filter(|(_, _, learner)| !learner)
                .map(|(n, _, _)| n.clone())
                .collect();
            if voters != want || ms.len() != want.len() {
                return Err(format!("{} lists {ms:?}, want voters {want:?}", h.name));
            }
        }
        if ids.len() != 1 {
            return Err(format!("cluster ids {ids:x?}"));
        }
        if leaders.len() != 1 {
            return Err(format!("leaders {leaders:x?}"));
        }
        Ok(ids.into_iter().next().unwrap_or(0))
    }

    pub fn all(&self) -> Vec<usize> {
        (0..self.hosts.len()).collect()
    }

    /// Waits until [`Cluster::converged_among`] every host; how long it took.
    pub fn wait_converged(&self, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            match self.converged_among(&self.members_hosts()) {
                Ok(_) => return Ok(start.elapsed()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("not converged after {timeout:?}: {last}"))
    }

    pub fn before(&self) -> Before {
        Before {
            containers: self
                .hosts
                .iter()
                .map(|h| docker_ids(&h.name, None))
                .collect(),
            cluster_id: self.converged_among(&self.members_hosts()).unwrap_or(0),
            members: self.hosts.iter().map(Host::member_name).collect(),
            backups: self
                .hosts
                .iter()
                .map(|h| DiskState::of(h).backups)
                .collect(),
        }
    }

    /// Records what is on disk now (call after a step that may create member dirs or snapshots).
    pub fn note_disk(&mut self) {
        for (i, h) in self.hosts.iter().enumerate() {
            let now = DiskState::of(h);
            let seen = &mut self.seen[i];
            for (name, dir) in now.members {
                seen.members.insert(name, dir);
            }
            seen.snapshots.extend(now.snapshots);
        }
    }

    /// The invariants after fault `fault` on hosts `faulted`, healed at `healed`: converged within
    /// `within`, each line printed; failures collected (the caller asserts or reports them).
    pub fn check(
        &mut self,
        fault: &str,
        faulted: &[usize],
        before: &Before,
        healed: Instant,
        within: Duration,
    ) -> Report {
        let mut lines = Vec::new();
        let mut failures = Vec::new();
        let mut fail = |lines: &mut Vec<String>, ok: bool, line: String| {
            let l = format!("[{fault}] {} {line}", if ok { "ok  " } else { "FAIL" });
            eprintln!("{l}");
            if !ok {
                failures.push(l.clone());
            }
            lines.push(l);
        };

        // Back to its voters.
        let conv = self.wait_converged(within);
        let converge = healed.elapsed();
        match &conv {
            Ok(_) => fail(
                &mut lines,
                true,
                format!(
                    "converged: {} voters, one leader, {:.1} s after healing",
                    self.members_hosts().len(),
                    converge.as_secs_f64()
                ),
            ),
            Err(e) => fail(&mut lines, false, format!("converged: {e}")),
        }

        // One cluster id, on every serving member.
        let ids: Vec<(String, Option<u64>)> = self
            .hosts
            .iter()
            .map(|h| {
                (
                    h.name.clone(),
                    self.client.status(&h.client_url()).map(|s| s.0),
                )
            })
            .collect();
        let serving: BTreeSet<u64> = ids.iter().filter_map(|(_, id)| *id).collect();
        let same_as_before = serving.len() == 1 && serving.contains(&before.cluster_id);
        fail(
            &mut lines,
            serving.len() == 1,
            format!(
                "cluster id: {} serving member(s), ids {serving:x?}{}",
                ids.iter().filter(|(_, id)| id.is_some()).count(),
                if same_as_before {
                    " (as before)"
                } else {
                    " (changed)"
                }
            ),
        );

        // Every key the writer got an OK for is there, and in every member's own copy.
        if let Some(w) = &self.writer {
            let acked = w.acked();
            let prefix = format!("{}/", w.prefix);
            let mut missing_by = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            for h in self.hosts.iter().filter(|h| h.member_name().is_some()) {
                let missing = loop {
                    let have = self.client.local_keys(&h.client_url(), &prefix);
                    let missing = match &have {
                        Some(have) => acked.iter().filter(|k| !have.contains(*k)).count(),
                        None => acked.len(),
                    };
                    if missing == 0 || Instant::now() > deadline {
                        break missing;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                };
                if missing > 0 {
                    missing_by.push(format!("{} misses {missing}", h.name));
                }
            }
            fail(
                &mut lines,
                missing_by.is_empty(),
                format!(
                    "writer: {} acked keys ({} puts failed meanwhile) readable in every member{}",
                    acked.len(),
                    w.failed.load(Ordering::SeqCst),
                    if missing_by.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", missing_by.join(", "))
                    }
                ),
            );
        }

        // No member dir or snapshot file has gone.
        let mut lost = Vec::new();
        let (mut in_place, mut moved, mut pruned, mut snaps, mut snaps_pruned) = (0, 0, 0, 0, 0);
        for (i, h) in self.hosts.iter().enumerate() {
            let now = DiskState::of(h);
            for (name, dir) in &self.seen[i].members {
                match now.members.get(name) {
                    Some(d) if d == dir => in_place += 1,
                    Some(_) => moved += 1,
                    None if now.backups >= BACKUPS_KEPT && dir.starts_with("etcd-backup-") => {
                        pruned += 1
                    }
                    None => lost.push(format!("{}: member {name} (was in db/{dir})", h.name)),
                }
            }
            for s in &self.seen[i].snapshots {
                if now.snapshots.contains(s) {
                    snaps += 1;
                } else if pruned_by_retention(s, &now.snapshots) {
                    snaps_pruned += 1;
                } else {
                    lost.push(format!("{}: snapshot {s}", h.name));
                }
            }
        }
        fail(
            &mut lines,
            lost.is_empty(),
            format!(
                "data dirs: {in_place} member dir(s) in place, {moved} moved to a backup, {pruned} \
                 pruned past {BACKUPS_KEPT} backups, {snaps} snapshot(s) kept, {snaps_pruned} pruned \
                 past {SNAPSHOTS_KEPT} of a name{}",
                if lost.is_empty() {
                    String::new()
                } else {
                    format!("; gone: {}", lost.join(", "))
                }
            ),
        );
        self.note_disk();

        // Pods on the hosts not under the fault: not one container created or removed.
        let mut changed = Vec::new();
        let mut untouched = Vec::new();
        for (i, h) in self.hosts.iter().enumerate() {
            if faulted.contains(&i) {
                continue;
            }
            let now = docker_ids(&h.name, None);
            if now != before.containers[i] {
                changed.push(format!(
                    "{}: {:?} → {:?}",
                    h.name, before.containers[i], now
                ));
            } else {
                untouched.push(h.name.clone());
            }
        }
        fail(
            &mut lines,
            changed.is_empty(),
            format!(
                "pods: containers unchanged on {} host(s) not under the fault{}",
                untouched.len(),
                if changed.is_empty() {
                    String::new()
                } else {
                    format!("; changed: {}", changed.join(", "))
                }
            ),
        );
        Report {
            converge,
            lines,
            failures,
        }
    }

    /// Checks and asserts: a failure panics with the lines and the hosts' logs.
    pub fn assert_ok(
        &mut self,
        fault: &str,
        faulted: &[usize],
        before: &Before,
        healed: Instant,
        within: Duration,
    ) -> Report {
        let r = self.check(fault, faulted, before, healed, within);
        assert!(
            r.failures.is_empty(),
            "{fault}: invariants broken:\n{}\n{}",
            r.failures.join("\n"),
            self.logs()
        );
        r
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut w) = self.writer.take() {
            w.stop();
        }
        for h in &mut self.hosts {
            Fault::heal(h);
            h.kill();
        }
        // The namespaces, bridge and containers go with `net`, dropped after this.
    }
}
