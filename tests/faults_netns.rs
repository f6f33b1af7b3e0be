//! Faults on hosts in network namespaces (each agent on its own address with the default ports): a host
//! partitioned away (a minority voter, then the leader), a lossy or slow link, an etcd paused for 10 s,
//! and SIGKILLs in the middle of a join, a promotion, a snapshot, a rejoin and a reset. After each fault is
//! healed the invariants are checked and asserted (`netns_support::Cluster::check`): every key the
//! writer got an OK for is in every member, one cluster id, no member dir or snapshot gone, no container
//! created or removed on the hosts not under the fault, back to the voters (the time is printed).
//!
//! `make soak SECONDS=…` runs the random version of these (`soak` below, ignored by default), with two
//! faults of the host beside them: a full disk under one host's data dir (each on a tmpfs of its own), and a
//! Docker outage (the agent's proxy socket cut and restored), after which not one of that host's containers
//! may have been recreated.

mod member_support;
mod netns_support;

use std::time::{Duration, Instant};

use netns_support::{Cluster, Fault};

/// How long the cluster gets to be back to its voters after a fault is healed.
const CONVERGE: Duration = Duration::from_secs(60);
/// How long a partition or a pause is held: far below the learner stall timeout (5 min), the only timer
/// after which the cluster drops a member by itself.
const HOLD: Duration = Duration::from_secs(10);

/// Holds host `i` partitioned for `hold`, checking every second that the others neither removed nor
/// replaced its member and that it did not tombstone itself; then heals it.
fn partition(c: &mut Cluster, i: usize, hold: Duration) -> Instant {
    let member = c.hosts[i].member_name();
    let backups = netns_support::DiskState::of(&c.hosts[i]).backups;
    Fault::Partition
        .put_on(&c.hosts[i])
        .unwrap_or_else(|e| panic!("partition: {e}"));
    let others: Vec<usize> = c.all().into_iter().filter(|j| *j != i).collect();
    assert!(
        c.client.status(&c.hosts[i].client_url()).is_none(),
        "{} still answers through its partition",
        c.hosts[i].name
    );
    let until = Instant::now() + hold;
    let mut leaders = std::collections::BTreeSet::new();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        for j in &others {
            if let Some((_, id, leader, _)) = c.client.status(&c.hosts[*j].client_url()) {
                if id == leader {
                    leaders.insert(*j);
                }
            }
            if let Some(ms) = c.client.members(&c.hosts[*j].client_url()) {
                assert!(
                    ms.iter().any(|(n, _, _)| Some(n) == member.as_ref()),
                    "{}'s member {member:?} dropped while partitioned: {ms:?}",
                    c.hosts[i].name
                );
            }
        }
        assert_eq!(
            c.hosts[i].member_name(),
            member,
            "tombstoned while partitioned"
        );
        assert_eq!(
            netns_support::DiskState::of(&c.hosts[i]).backups,
            backups,
            "backed up while partitioned"
        );
        assert!(
            c.hosts[i].running(),
            "{} exited while partitioned",
            c.hosts[i].name
        );
    }
    assert!(
        !leaders.is_empty(),
        "the other hosts had no leader while {} was partitioned",
        c.hosts[i].name
    );
    Fault::heal(&c.hosts[i]);
    Instant::now()
}

/// After a fault on host `i`: its member is the same one as before, not backed up.
fn same_member(c: &Cluster, i: usize, before: &netns_support::Before) {
    assert_eq!(
        c.hosts[i].member_name(),
        before.members[i],
        "{} got a new member",
        c.hosts[i].name
    );
    assert_eq!(
        netns_support::DiskState::of(&c.hosts[i]).backups,
        before.backups[i],
        "{} backed its member up",
        c.hosts[i].name
    );
}

#[test]
fn partitions_of_a_follower_and_of_the_leader_heal_without_losing_a_write() {
    if netns_support::skip() {
        return;
    }
    let mut c = Cluster::new("part", 3);
    // A minority voter (a follower).
    let leader = c.wait_leader(Duration::from_secs(30));
    let follower = (leader + 1) % 3;
    let before = c.before();
    let healed = partition(&mut c, follower, HOLD);
    c.assert_ok("partition-follower", &[follower], &before, healed, CONVERGE);
    same_member(&c, follower, &before);

    // The leader: the other two elect one of theirs, the old leader steps down and follows on healing.
    let leader = c.wait_leader(Duration::from_secs(30));
    let before = c.before();
    let healed = partition(&mut c, leader, HOLD);
    c.assert_ok("partition-leader", &[leader], &before, healed, CONVERGE);
    same_member(&c, leader, &before);
}

/// Pauses host `i`'s etcd (SIGSTOP) for `hold`, then lets it go on (SIGCONT).
fn pause_etcd(c: &mut Cluster, i: usize, hold: Duration) -> Instant {
    let pid = c.hosts[i]
        .etcd_pid()
        .unwrap_or_else(|| panic!("{} has no etcd", c.hosts[i].name));
    member_support::signal(pid, "STOP");
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            c.hosts[i].running(),
            "{}'s agent exited while its etcd was paused",
            c.hosts[i].name
        );
    }
    member_support::signal(pid, "CONT");
    Instant::now()
}

/// Holds `fault` on host `i`'s link for `hold`; `None` (and a line saying why) when this kernel cannot.
fn link_fault(c: &mut Cluster, i: usize, fault: Fault, hold: Duration) -> Option<Instant> {
    if let Err(e) = fault.put_on(&c.hosts[i]) {
        if netns_support::required() {
            panic!(
                "[{}] HOSTLET_TEST_REQUIRE_NETNS=1 and the fault cannot be put on: {e}",
                fault.label()
            );
        }
        eprintln!("[{}] SKIPPED: {e}", fault.label());
        return None;
    }
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            c.hosts[i].running(),
            "{} exited under {fault:?}",
            c.hosts[i].name
        );
    }
    Fault::heal(&c.hosts[i]);
    Some(Instant::now())
}

#[test]
fn a_lossy_or_slow_link_and_a_paused_etcd_heal_without_losing_a_write() {
    if netns_support::skip() {
        return;
    }
    let mut c = Cluster::new("link", 3);
    let leader = c.wait_leader(Duration::from_secs(30));
    let follower = (leader + 1) % 3;

    let before = c.before();
    if let Some(healed) = link_fault(&mut c, follower, Fault::Loss(30), HOLD) {
        c.assert_ok("loss-30%-follower", &[follower], &before, healed, CONVERGE);
        same_member(&c, follower, &before);
    }
    let leader = c.wait_leader(Duration::from_secs(30));
    let before = c.before();
    let delay = Fault::Delay {
        ms: 200,
        jitter_ms: 50,
    };
    if let Some(healed) = link_fault(&mut c, leader, delay, HOLD) {
        c.assert_ok("delay-200ms-leader", &[leader], &before, healed, CONVERGE);
        same_member(&c, leader, &before);
    }

    for role in ["follower", "leader"] {
        let leader = c.wait_leader(Duration::from_secs(30));
        let i = if role == "leader" {
            leader
        } else {
            (leader + 2) % 3
        };
        let before = c.before();
        let healed = pause_etcd(&mut c, i, HOLD);
        c.assert_ok(
            &format!("sigstop-etcd-{role}"),
            &[i],
            &before,
            healed,
            CONVERGE,
        );
        same_member(&c, i, &before);
    }
}

/// The new member of host `i` (one not among `old`), as host `via`'s member lists it: (name, learner).
fn new_member(c: &Cluster, via: usize, old: &[String]) -> Option<(String, bool)> {
    c.client
        .members(&c.hosts[via].client_url())?
        .into_iter()
        .find(|(n, _, _)| !old.contains(n))
        .map(|(n, _, learner)| (n, learner))
}

fn names(c: &Cluster, via: usize) -> Vec<String> {
    c.client
        .members(&c.hosts[via].client_url())
        .unwrap_or_default()
        .into_iter()
        .map(|(n, _, _)| n)
        .collect()
}

#[test]
fn sigkills_during_a_join_a_promotion_and_a_rejoin_leave_the_cluster_whole() {
    if netns_support::skip() {
        return;
    }
    let ready = Duration::from_secs(120);
    let mut c = Cluster::partly("kill", 3, 2);

    // A join: the joiner's agent killed once its member is in the cluster as a learner, then started
    // again with the same flags, as its service manager would.
    let before = c.before();
    let old = names(&c, 0);
    let join = netns_support::join_args(&c.hosts[0]);
    c.hosts[2].start(&join);
    let (_, learner) =
        member_support::eventually("the joiner's member", ready, || new_member(&c, 0, &old));
    c.hosts[2].kill();
    c.hosts[2].wait_stopped(Duration::from_secs(20));
    eprintln!(
        "[kill-joiner] killed with its member a {}",
        if learner { "learner" } else { "voter" }
    );
    let healed = Instant::now();
    c.hosts[2].start(&join);
    c.hosts[2].wait_ready(ready);
    c.assert_ok("kill-joiner", &[2], &before, healed, CONVERGE);
    c.apply_pod(2);
    c.wait_pod(2, Duration::from_secs(90));

    // A promotion: host 2 asked to rejoin; once its new member is a learner, the leader's agent (the one
    // that promotes) is killed and started again.
    let before = c.before();
    let old = names(&c, 0);
    let key = format!("/hostlet/hosts/{}/requests/tombstone", c.hosts[2].name);
    c.client
        .put(&c.endpoints(), &key, "rejoin")
        .unwrap_or_else(|e| panic!("tombstone request: {e}"));
    let via = c.wait_leader(Duration::from_secs(30));
    let learner_seen = member_support::eventually("host 2's new member", ready, || {
        let leader = c.leader()?;
        let (_, learner) = new_member(&c, leader, &old)?;
        Some((leader, learner))
    });
    let leader = learner_seen.0;
    c.hosts[leader].kill();
    c.hosts[leader].wait_stopped(Duration::from_secs(20));
    eprintln!(
        "[kill-promoter] leader {} killed with the new member a {} (leader before: {})",
        c.hosts[leader].name,
        if learner_seen.1 { "learner" } else { "voter" },
        c.hosts[via].name
    );
    let healed = Instant::now();
    c.hosts[leader].start(&[]);
    c.hosts[leader].wait_ready(ready);
    c.assert_ok("kill-promoter", &[leader, 2], &before, healed, CONVERGE);

    // A rejoin: host 2's agent killed right after it backed its member up, before its new member exists.
    let before = c.before();
    c.client
        .put(&c.endpoints(), &key, "rejoin again")
        .unwrap_or_else(|e| panic!("tombstone request: {e}"));
    member_support::eventually("host 2's backup", ready, || {
        (netns_support::DiskState::of(&c.hosts[2]).backups > before.backups[2]).then_some(())
    });
    c.hosts[2].kill();
    c.hosts[2].wait_stopped(Duration::from_secs(20));
    let healed = Instant::now();
    c.hosts[2].start(&[]);
    c.hosts[2].wait_ready(ready);
    c.assert_ok("kill-rejoiner", &[2], &before, healed, CONVERGE);
    let events = format!("/hostlet/events/{}/", c.hosts[2].name);
    member_support::eventually("the resumed rejoin's Rejoined event", CONVERGE, || {
        c.client
            .values(&c.endpoints(), &events)
            .iter()
            .any(|e| e.contains("Rejoined") && e.contains("a rejoin the agent was stopped in"))
            .then_some(())
    });
}

#[test]
fn sigkills_during_a_snapshot_and_a_cluster_reset_lose_no_data() {
    if netns_support::skip() {
        return;
    }
    let ready = Duration::from_secs(120);
    let mut c = Cluster::new("snap", 3);

    // A snapshot big enough to be caught while its file is written: 24 values of 1 MiB.
    let blob = "x".repeat(1 << 20);
    for n in 0..24 {
        c.client
            .put(&c.endpoints(), &format!("/faults/bulk/{n:02}"), &blob)
            .unwrap_or_else(|e| panic!("bulk put: {e}"));
    }
    let first = member_support::cli(
        &c.hosts[1],
        &["etcd", "snapshot", "save", "--name", "first"],
    );
    assert!(
        first.status.success(),
        "{}",
        member_support::output_text(&first)
    );
    c.note_disk();

    let before = c.before();
    let snapshots = c.hosts[1].data_dir.join("db/snapshots");
    let mut save = c.hosts[1]
        .wrapped(member_support::BIN)
        .args(["etcd", "snapshot", "save", "--name", "killed", "--data-dir"])
        .arg(&c.hosts[1].data_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("snapshot save: {e}"));
    member_support::eventually("the snapshot's .part file", ready, || {
        std::fs::read_dir(&snapshots)
            .ok()?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .then_some(())
    });
    c.hosts[1].kill();
    c.hosts[1].wait_stopped(Duration::from_secs(20));
    let _ = save.kill();
    let _ = save.wait();
    let healed = Instant::now();
    c.hosts[1].start(&[]);
    c.hosts[1].wait_ready(ready);
    c.assert_ok("kill-during-snapshot", &[1], &before, healed, CONVERGE);
    let again = member_support::cli(
        &c.hosts[1],
        &["etcd", "snapshot", "save", "--name", "after"],
    );
    assert!(
        again.status.success(),
        "{}",
        member_support::output_text(&again)
    );
    let left: Vec<String> = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    eprintln!("[kill-during-snapshot] .part files left after the next snapshot: {left:?}");
    c.note_disk();

    // A reset after a lost quorum, killed while its etcd runs, then done again. Every acked key is on
    // host 0 before the other two go: a reset keeps what its member holds.
    let before = c.before();
    let writer = c.writer.as_ref().map(|w| {
        w.pause();
        w.acked()
    });
    let acked = writer.unwrap_or_default();
    member_support::eventually("host 0 to hold every acked key", ready, || {
        let have = c
            .client
            .local_keys(&c.hosts[0].client_url(), "/faults/writer/")?;
        acked.iter().all(|k| have.contains(k)).then_some(())
    });
    for i in [1, 2] {
        c.hosts[i].stop(Duration::from_secs(30));
        c.hosts[i].wait_stopped(Duration::from_secs(20));
    }
    c.hosts[0].stop(Duration::from_secs(30));
    c.hosts[0].wait_stopped(Duration::from_secs(20));
    let mut reset = c.hosts[0]
        .wrapped(member_support::BIN)
        .args(&c.hosts[0].args()[..])
        .arg("--cluster-reset")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("reset: {e}"));
    let pid = reset.id();
    member_support::eventually("the reset's etcd", ready, || {
        member_support::etcd_member_of(pid)
    });
    let _ = reset.kill();
    let _ = reset.wait();
    c.hosts[0].wait_stopped(Duration::from_secs(20));
    let o = c.hosts[0].run_to_exit(&["--cluster-reset".to_string()], ready);
    let said = member_support::output_text(&o);
    eprintln!(
        "[kill-during-reset] the reset again: {} ({})",
        o.status,
        // Its last line above debug: the agent runs with the controllers at debug level.
        said.lines()
            .rev()
            .find(|l| !l.contains(" DEBUG "))
            .unwrap_or("")
    );
    let healed = Instant::now();
    c.hosts[0].start(&[]);
    c.hosts[0].wait_ready(ready);
    for i in [1, 2] {
        c.hosts[i].start(&[]);
    }
    for i in [1, 2] {
        c.hosts[i].wait_ready(ready);
    }
    if let Some(w) = &c.writer {
        w.resume();
    }
    c.assert_ok(
        "kill-during-reset",
        &[0, 1, 2],
        &before,
        healed,
        Duration::from_secs(120),
    );
}

/// Fills the filesystem under host `i`'s data dir (a tmpfs of its own) until the agent reports it, holds it
/// full for `hold`, checking that the agent stays up and neither tombstones nor backs up its member; then
/// removes the filler.
fn disk_full(c: &mut Cluster, i: usize, hold: Duration) -> Instant {
    let h = &c.hosts[i];
    assert!(
        h.disk.is_some(),
        "{} is not on a filesystem of its own",
        h.name
    );
    let member = h.member_name();
    let backups = netns_support::DiskState::of(h).backups;
    let shown = h.data_dir.display().to_string();
    let filler = member_support::fill(&h.data_dir);
    member_support::eventually(
        &format!("{}'s /readyz to report the full disk", h.name),
        Duration::from_secs(30),
        || {
            h.readyz().filter(|r| {
                r["components"]["disk"]["ready"] == false
                    && r["components"]["disk"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&shown))
            })
        },
    );
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        let h = &mut c.hosts[i];
        assert!(h.running(), "{} exited while its disk was full", h.name);
        assert_eq!(
            h.member_name(),
            member,
            "tombstoned while the disk was full"
        );
        assert_eq!(
            netns_support::DiskState::of(h).backups,
            backups,
            "backed up while the disk was full"
        );
    }
    std::fs::remove_file(&filler).unwrap_or_else(|e| panic!("removing {}: {e}", filler.display()));
    Instant::now()
}

/// Cuts host `i`'s Docker proxy until `/readyz` says Docker is unreachable, holds it cut for `hold`
/// (the agent up), restores it; when it was restored, and how long the agent took to be ready again.
fn docker_outage(c: &mut Cluster, i: usize, hold: Duration) -> (Instant, Duration) {
    let docker_down = |r: &serde_json::Value| r["components"]["docker"]["ready"] == false;
    c.hosts[i]
        .docker_proxy
        .as_mut()
        .unwrap_or_else(|| panic!("host {i} reaches Docker directly"))
        .cut();
    member_support::eventually(
        &format!("{}'s /readyz to name Docker", c.hosts[i].name),
        Duration::from_secs(30),
        || c.hosts[i].readyz().filter(docker_down),
    );
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            c.hosts[i].running(),
            "{} exited while Docker was away",
            c.hosts[i].name
        );
    }
    if let Some(p) = c.hosts[i].docker_proxy.as_mut() {
        p.restore();
    }
    let restored = Instant::now();
    member_support::eventually(
        &format!("{} ready after Docker answered", c.hosts[i].name),
        Duration::from_secs(60),
        || c.hosts[i].is_ready().then_some(()),
    );
    (restored, restored.elapsed())
}

/// The faults the soak draws from.
const SOAK_FAULTS: &[&str] = &[
    "disk-full",
    "docker-outage",
    "partition-follower",
    "partition-leader",
    "loss-follower",
    "delay-follower",
    "sigstop-etcd",
    "sigkill-agent",
    "sigkill-etcd",
    "kill-rejoiner",
    "kill-during-snapshot",
];

/// One fault of the soak, put on and healed.
struct Applied {
    /// The hosts under it.
    hosts: Vec<usize>,
    /// When it was healed.
    healed: Instant,
    /// A Docker outage: how long the agent took to be ready once Docker answered.
    docker_ready: Option<Duration>,
}

/// Puts one fault of the soak on, heals it (`None` when this kernel cannot make it).
fn soak_fault(c: &mut Cluster, fault: &str, rng: &mut rand::rngs::StdRng) -> Option<Applied> {
    use rand::Rng;
    if fault == "docker-outage" {
        let any = rng.random_range(0..c.hosts.len());
        let hold = Duration::from_secs(rng.random_range(10..=40));
        let (healed, ready) = docker_outage(c, any, hold);
        return Some(Applied {
            hosts: vec![any],
            healed,
            docker_ready: Some(ready),
        });
    }
    let (hosts, healed) = cluster_fault(c, fault, rng)?;
    Some(Applied {
        hosts,
        healed,
        docker_ready: None,
    })
}

/// Puts one of the other faults on, heals it; the hosts under it, and the moment it was healed (`None`
/// when this kernel cannot make it).
fn cluster_fault(
    c: &mut Cluster,
    fault: &str,
    rng: &mut rand::rngs::StdRng,
) -> Option<(Vec<usize>, Instant)> {
    use rand::Rng;
    let ready = Duration::from_secs(120);
    let leader = c.wait_leader(Duration::from_secs(30));
    let follower = (leader + rng.random_range(1..3)) % 3;
    let any = rng.random_range(0..3);
    let hold = Duration::from_secs(rng.random_range(5..=15));
    match fault {
        "partition-follower" => Some((vec![follower], partition(c, follower, hold))),
        "partition-leader" => Some((vec![leader], partition(c, leader, hold))),
        "loss-follower" => {
            let pct = rng.random_range(10..=40);
            link_fault(c, follower, Fault::Loss(pct), hold).map(|t| (vec![follower], t))
        }
        "delay-follower" => {
            let ms = rng.random_range(50..=300);
            let delay = Fault::Delay {
                ms,
                jitter_ms: ms / 4,
            };
            link_fault(c, follower, delay, hold).map(|t| (vec![follower], t))
        }
        "sigstop-etcd" => Some((vec![any], pause_etcd(c, any, HOLD))),
        "disk-full" => Some((vec![any], disk_full(c, any, hold))),
        "sigkill-agent" => {
            c.hosts[any].kill();
            c.hosts[any].wait_stopped(Duration::from_secs(20));
            let healed = Instant::now();
            c.hosts[any].start(&[]);
            c.hosts[any].wait_ready(ready);
            Some((vec![any], healed))
        }
        "sigkill-etcd" => {
            let pid = c.hosts[any].etcd_pid()?;
            member_support::signal(pid, "KILL");
            let healed = Instant::now();
            // The agent starts its member again by itself.
            member_support::eventually("a new etcd", ready, || {
                c.hosts[any].etcd_pid().filter(|p| *p != pid)
            });
            Some((vec![any], healed))
        }
        "kill-rejoiner" => {
            let backups = netns_support::DiskState::of(&c.hosts[any]).backup_names;
            let key = format!("/hostlet/hosts/{}/requests/tombstone", c.hosts[any].name);
            c.client.put(&c.endpoints(), &key, "soak").ok()?;
            member_support::eventually("the rejoiner's backup", ready, || {
                let now = netns_support::DiskState::of(&c.hosts[any]).backup_names;
                now.difference(&backups).next().map(|_| ())
            });
            c.hosts[any].kill();
            c.hosts[any].wait_stopped(Duration::from_secs(20));
            let healed = Instant::now();
            c.hosts[any].start(&[]);
            c.hosts[any].wait_ready(ready);
            Some((vec![any], healed))
        }
        "kill-during-snapshot" => {
            let snapshots = c.hosts[any].data_dir.join("db/snapshots");
            let mut save = c.hosts[any]
                .wrapped(member_support::BIN)
                .args(["etcd", "snapshot", "save", "--name", "soak", "--data-dir"])
                .arg(&c.hosts[any].data_dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?;
            // The moment: its file being written, or the save over (a small database is quick).
            member_support::eventually("the snapshot under way", ready, || {
                let writing = std::fs::read_dir(&snapshots)
                    .ok()
                    .map(|d| {
                        d.flatten()
                            .any(|e| e.file_name().to_string_lossy().ends_with(".part"))
                    })
                    .unwrap_or(false);
                (writing || matches!(save.try_wait(), Ok(Some(_)))).then_some(())
            });
            c.hosts[any].kill();
            let _ = save.kill();
            let _ = save.wait();
            c.hosts[any].wait_stopped(Duration::from_secs(20));
            let healed = Instant::now();
            c.hosts[any].start(&[]);
            c.hosts[any].wait_ready(ready);
            Some((vec![any], healed))
        }
        other => panic!("unknown fault {other}"),
    }
}

/// Random faults from a seed for `SOAK_SECONDS` (default 600); `SEED=` replays a run. One row per fault:
/// fault, host, time to converge, invariants held. Run by `make soak SECONDS=…`.
#[test]
#[ignore = "long: run by make soak"]
fn soak() {
    use rand::{Rng, SeedableRng};
    if netns_support::skip() {
        return;
    }
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("soak: SEED={seed} SOAK_SECONDS={seconds}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Every host on a filesystem of its own (room for its member, five backups and snapshots) and
    // reaching Docker through a proxy: any of them can be given a full disk or a Docker outage.
    let mut c = Cluster::for_host_faults("soak", 3, "1g");
    // Drawn from only the faults this kernel can make, so that every row is a fault.
    // Every fault runs on any kernel: without netem the delay is a token-bucket queue (see Fault::Delay).
    let faults: Vec<&str> = SOAK_FAULTS.to_vec();
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut broken = Vec::new();
    println!(
        "{:>3}  {:<22} {:<16} {:>10}  invariants",
        "#", "fault", "hosts", "converge"
    );
    while started.elapsed() < Duration::from_secs(seconds) {
        let fault = faults[rng.random_range(0..faults.len())];
        let before = c.before();
        // A fault that cannot be put on or healed in time fails the run with the hosts' logs, as a broken
        // invariant does.
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            soak_fault(&mut c, fault, &mut rng)
        }));
        let applied = match applied {
            Ok(a) => a,
            Err(panic) => {
                println!("{:>3}  {fault:<22} FAILED (see below)", rows.len() + 1);
                eprintln!(
                    "SEED={seed}: fault {} ({fault}) failed; the hosts' logs:\n{}",
                    rows.len() + 1,
                    c.logs()
                );
                std::panic::resume_unwind(panic);
            }
        };
        let Some(Applied {
            hosts,
            healed,
            docker_ready,
        }) = applied
        else {
            println!(
                "{:>3}  {fault:<22} skipped: this kernel cannot make it",
                rows.len() + 1
            );
            continue;
        };
        let mut r = c.check(fault, &hosts, &before, healed, CONVERGE);
        if let Some(ready) = docker_ready {
            // The host under a Docker outage too: not one container created or removed.
            for i in &hosts {
                let h = &c.hosts[*i];
                let now = member_support::docker_ids(&h.name, None);
                let kept = now == before.containers[*i];
                let line = format!(
                    "[{fault}] {} pods: no container recreated on {} by the outage; ready {:.1} s after Docker answered{}",
                    if kept { "ok  " } else { "FAIL" },
                    h.name,
                    ready.as_secs_f64(),
                    if kept {
                        String::new()
                    } else {
                        format!("; {:?} → {now:?}", before.containers[*i])
                    }
                );
                eprintln!("{line}");
                if !kept {
                    r.failures.push(line.clone());
                }
                r.lines.push(line);
            }
        }
        let held = r.lines.len() - r.failures.len();
        let names: Vec<String> = hosts.iter().map(|i| format!("h{}", i + 1)).collect();
        let row = format!(
            "{:>3}  {fault:<22} {:<16} {:>9.1}s  {held}/{} held{}",
            rows.len() + 1,
            names.join(","),
            r.converge.as_secs_f64(),
            r.lines.len(),
            if r.failures.is_empty() { "" } else { "  FAIL" }
        );
        println!("{row}");
        rows.push(row);
        broken.extend(r.failures);
        if !broken.is_empty() {
            break;
        }
    }
    println!(
        "soak: SEED={seed}: {} faults in {:.0} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    for r in &rows {
        println!("{r}");
    }
    assert!(
        broken.is_empty(),
        "SEED={seed}: invariants broken:\n{}\n{}",
        broken.join("\n"),
        c.logs()
    );
}

#[test]
fn a_snapshot_pruned_by_its_names_retention_is_not_a_loss() {
    let now: std::collections::BTreeSet<String> = (2..=6)
        .map(|t| format!("soak-hl1-soak-3-{t}"))
        .chain(["other-hl1-soak-3-9".to_string()])
        .collect();
    // Five newer of its name are there: pruned by design.
    assert!(netns_support::pruned_by_retention(
        "soak-hl1-soak-3-1",
        &now
    ));
    // Only four newer of its name (the fifth is another name's): a loss.
    let fewer: std::collections::BTreeSet<String> =
        now.iter().filter(|f| !f.ends_with("-6")).cloned().collect();
    assert!(!netns_support::pruned_by_retention(
        "soak-hl1-soak-3-1",
        &fewer
    ));
    // A newer one gone is never the retention's doing.
    assert!(!netns_support::pruned_by_retention(
        "soak-hl1-soak-3-7",
        &now
    ));
}
