//! The namespaces, their bridge and subnet slot, and the faults put on a host's link or processes.

use super::*;

/// An IPv4 prefix as (network, length).
pub(super) fn parse_prefix(s: &str) -> Option<(u32, u32)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, l.parse().ok()?),
        None => (s, 32),
    };
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    (len <= 32).then_some((u32::from(ip), len))
}

pub(super) fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

/// The prefixes the host routes or has addresses in (every table), default routes left out.
pub(super) fn routed_prefixes() -> Vec<(u32, u32)> {
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

pub(super) fn slot_prefix(k: u32) -> [u8; 3] {
    [10, (200 + k / 256) as u8, (k % 256) as u8]
}

pub(super) fn owner_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("owner"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Removes what a run on slot `k` made: the processes in its namespaces, the namespaces, the bridge, the
/// forwarding rule, its pods' containers. Each step may find nothing.
pub(super) fn sweep(k: u32) {
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
pub(super) fn forward_rule(op: &str, k: u32) -> Vec<String> {
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
pub(super) fn kill_namespace_processes(ns: &str) {
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
pub(super) fn remove_containers_of_nodes(prefix: &str) {
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
pub(super) fn claim_slot() -> (u32, PathBuf) {
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
pub(super) fn add_netem(ns: &str, args: &[&str]) -> Result<(), String> {
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
pub(super) fn nft_drop(ns: &str, cond: &str) -> Result<(), String> {
    let rules = format!(
        "table inet {FAULT_TABLE} {{\n\
         chain input {{ type filter hook input priority -10; policy accept; iifname \"eth0\" {cond}drop; }}\n\
         chain output {{ type filter hook output priority -10; policy accept; oifname \"eth0\" {cond}drop; }}\n\
         }}\n"
    );
    run_with_input(&["ip", "netns", "exec", ns, "nft", "-f", "-"], &rules)
}
