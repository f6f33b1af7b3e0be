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

mod client;
mod host;
mod invariants;
mod net;

pub use client::*;
pub use host::*;
pub use invariants::*;
pub use net::*;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::member_support::{alive, docker_ids, signal, DockerProxy, Node, Tmpfs};

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
