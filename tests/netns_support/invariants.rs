//! The cluster of hosts and the invariants checked after each fault.

use super::*;

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
pub(super) fn snapshot_series(file: &str) -> Option<(&str, u64)> {
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
            .map(|h| h.client_url())
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
