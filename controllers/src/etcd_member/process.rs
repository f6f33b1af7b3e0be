//! The `etcd` child process: its command line, starting it so that it never outlives hostlet, and stopping
//! it (SIGTERM, a grace period, SIGKILL).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use crate::pki::{CertRole, TlsDir};

/// How the member comes up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterStart {
    /// The data dir holds the member already: etcd reads the cluster from its WAL.
    Existing,
    /// The first member of a new cluster.
    New { cluster_token: String },
    /// A member already added to a running cluster (as a learner); `initial_cluster` lists every member
    /// (name, peer URL), this one included.
    Join {
        initial_cluster: Vec<(String, String)>,
    },
}

/// etcd flags hostlet sets or manages itself: `--etcd-arg` may not give them.
pub const OWNED_ETCD_FLAGS: &[(&str, &str)] = &[
    ("name", "the member name is hostlet's"),
    ("data-dir", "the member dir is <data-dir>/db/etcd"),
    (
        "wal-dir",
        "the WAL must stay in the member dir that hostlet backs up and moves",
    ),
    (
        "listen-client-urls",
        "set from --etcd-client-port and --advertise-address",
    ),
    (
        "advertise-client-urls",
        "set from --etcd-client-port and --advertise-address",
    ),
    (
        "listen-peer-urls",
        "set from --etcd-peer-port and --advertise-address",
    ),
    (
        "initial-advertise-peer-urls",
        "set from --etcd-peer-port and --advertise-address",
    ),
    ("initial-cluster", "hostlet builds the cluster"),
    ("initial-cluster-state", "hostlet builds the cluster"),
    ("initial-cluster-token", "hostlet builds the cluster"),
    ("force-new-cluster", "use hostlet run --cluster-reset"),
    (
        "strict-reconfig-check",
        "hostlet turns it off: it adds learners only, and a replacement must join beside a dead voter",
    ),
    ("discovery", "hostlet builds the cluster"),
    ("logger", "hostlet reads etcd's log"),
    ("log-outputs", "hostlet reads etcd's log"),
    ("cert-file", "hostlet issues the member's certificates"),
    ("key-file", "hostlet issues the member's certificates"),
    (
        "trusted-ca-file",
        "hostlet issues the member's certificates",
    ),
    (
        "client-cert-auth",
        "hostlet issues the member's certificates",
    ),
    ("peer-cert-file", "hostlet issues the member's certificates"),
    ("peer-key-file", "hostlet issues the member's certificates"),
    (
        "peer-trusted-ca-file",
        "hostlet issues the member's certificates",
    ),
    (
        "peer-client-cert-auth",
        "hostlet issues the member's certificates",
    ),
    ("auto-tls", "hostlet issues the member's certificates"),
    (
        "client-crl-file",
        "hostlet keeps the revocation list of deleted nodes' certificates",
    ),
    (
        "peer-crl-file",
        "hostlet keeps the revocation list of deleted nodes' certificates",
    ),
    ("peer-auto-tls", "hostlet issues the member's certificates"),
    ("quota-backend-bytes", "use --etcd-quota-backend-bytes"),
    (
        "auto-compaction-retention",
        "hostlet compacts: use --etcd-compaction-retention",
    ),
    (
        "auto-compaction-mode",
        "hostlet compacts: use --etcd-compaction-retention",
    ),
];

/// Checks one `--etcd-arg NAME=VALUE` and returns it as etcd's `--NAME=VALUE`.
pub fn check_etcd_arg(arg: &str) -> Result<String, String> {
    let arg = arg.trim();
    let Some((name, value)) = arg.split_once('=') else {
        return Err(format!(
            "{arg:?}: expected NAME=VALUE (e.g. snapshot-count=10000)"
        ));
    };
    let name = name.trim().trim_start_matches('-');
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!("{arg:?}: {name:?} is not an etcd flag name"));
    }
    if let Some((_, why)) = OWNED_ETCD_FLAGS.iter().find(|(f, _)| *f == name) {
        return Err(format!("{arg:?}: hostlet sets --{name} itself ({why})"));
    }
    Ok(format!("--{name}={value}"))
}

/// Everything the etcd command line is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    pub name: String,
    pub data_dir: PathBuf,
    /// The address other members and clients reach this one at.
    pub advertise: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// `None` under `--etcd-insecure`.
    pub tls: Option<TlsDir>,
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl MemberSpec {
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The URL other members reach this one at.
    pub fn peer_url(&self) -> String {
        format!(
            "{}://{}",
            self.scheme(),
            host_port(&self.advertise, self.peer_port)
        )
    }

    /// The URL clients on other hosts reach this member at.
    pub fn client_url(&self) -> String {
        format!(
            "{}://{}",
            self.scheme(),
            host_port(&self.advertise, self.client_port)
        )
    }

    /// The URL the local agent reaches its own member at (loopback, always listened on).
    pub fn local_client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.client_port)
    }

    /// Client listen URLs: loopback, and the advertise address when it is another one.
    fn listen_client_urls(&self) -> String {
        let mut urls = vec![self.local_client_url()];
        if self.advertise != "127.0.0.1" {
            urls.push(self.client_url());
        }
        urls.join(",")
    }

    /// The etcd command-line arguments.
    pub fn args(&self, start: &ClusterStart) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut flag = |k: &str, v: String| {
            a.push(format!("--{k}={v}"));
        };
        flag("name", self.name.clone());
        flag("data-dir", self.data_dir.display().to_string());
        flag("listen-client-urls", self.listen_client_urls());
        flag("advertise-client-urls", self.client_url());
        flag("listen-peer-urls", self.peer_url());
        flag("initial-advertise-peer-urls", self.peer_url());
        flag("logger", "zap".into());
        flag("log-outputs", "stderr".into());
        // etcd's check refuses any member add while a voter is unreachable, even a learner's, which
        // does not count toward quorum: a dead voter's replacement must join as a learner first.
        // hostlet adds only learners; promotion keeps etcd's own catch-up check and the voter target.
        flag("strict-reconfig-check", "false".into());
        match start {
            // etcd ignores the initial cluster once its WAL exists; naming ourselves keeps its flag
            // checks (which compare the advertised peer URLs with the initial cluster) satisfied.
            ClusterStart::Existing => {
                flag(
                    "initial-cluster",
                    format!("{}={}", self.name, self.peer_url()),
                );
            }
            ClusterStart::New { cluster_token } => {
                flag(
                    "initial-cluster",
                    format!("{}={}", self.name, self.peer_url()),
                );
                flag("initial-cluster-state", "new".into());
                flag("initial-cluster-token", cluster_token.clone());
            }
            ClusterStart::Join { initial_cluster } => {
                let list: Vec<String> = initial_cluster
                    .iter()
                    .map(|(n, u)| format!("{n}={u}"))
                    .collect();
                flag("initial-cluster", list.join(","));
                flag("initial-cluster-state", "existing".into());
            }
        }
        if let Some(tls) = &self.tls {
            let p = |p: PathBuf| p.display().to_string();
            flag("cert-file", p(tls.cert(CertRole::Server)));
            flag("key-file", p(tls.key(CertRole::Server)));
            flag("trusted-ca-file", p(tls.ca_cert()));
            flag("client-cert-auth", "true".into());
            flag("peer-cert-file", p(tls.cert(CertRole::Peer)));
            flag("peer-key-file", p(tls.key(CertRole::Peer)));
            flag("peer-trusted-ca-file", p(tls.ca_cert()));
            flag("peer-client-cert-auth", "true".into());
        }
        a
    }
}

/// Finds `binary` the way a shell would: a path with a `/` as given, else on `$PATH`.
pub fn resolve_binary(binary: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if binary.components().count() > 1 || binary.is_absolute() {
        return executable(binary).then(|| binary.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(binary))
        .find(|p| executable(p))
}

/// A running etcd child. Dropping it kills the process (SIGKILL), so an unwinding hostlet never leaves it
/// behind; a hostlet that dies outright takes it along through the parent-death signal.
/// What etcd logs (and then exits 0) when its cluster answers that this member was removed.
pub const REMOVED_MESSAGE: &str = "the member has been permanently removed from the cluster";

#[derive(Debug)]
pub struct EtcdProcess {
    child: tokio::process::Child,
    pid: i32,
    log: PathBuf,
    /// Where this run's output starts in `log`.
    log_offset: u64,
}

impl EtcdProcess {
    /// Starts `binary args…` with its output appended to `log`.
    ///
    /// The child gets its own process group (a Ctrl-C on hostlet's terminal must not reach it: hostlet
    /// decides when it stops) and `PR_SET_PDEATHSIG = SIGKILL`. The death signal fires when the *thread*
    /// that forked exits, so call this from a task of the runtime's worker threads, which live as long as
    /// the agent, never from a short-lived blocking thread.
    pub fn spawn(binary: &Path, args: &[String], log: &Path) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let log_offset = out.metadata()?.len();
        let err = out.try_clone()?;
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = tokio::process::Command::new(binary);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .process_group(0);
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl: then nobody would kill us.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("hostlet exited while starting etcd"));
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        Ok(EtcdProcess {
            child,
            pid,
            log: log.to_path_buf(),
            log_offset,
        })
    }

    /// Whether this run's output says that the cluster removed this member ([`REMOVED_MESSAGE`]).
    pub fn said_removed(&self) -> bool {
        output_says_removed(&self.log, self.log_offset)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Whether it has exited already (without waiting).
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then up to `grace` for a clean exit, then SIGKILL.
    pub async fn stop(mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.try_exited() {
            return Ok(status);
        }
        if self.pid > 0 {
            // SAFETY: plain kill(2) on our own child's pid, which is not reaped yet (try_wait above).
            unsafe {
                libc::kill(self.pid, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    "etcd did not stop within {grace:?}; killing it"
                );
                self.child.kill().await?;
                self.child.wait().await
            }
        }
    }
}

/// Whether `log` holds [`REMOVED_MESSAGE`] after byte `offset`.
pub fn output_says_removed(log: &Path, offset: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return false;
    };
    let mut text = Vec::new();
    if f.seek(SeekFrom::Start(offset)).is_err() || f.read_to_end(&mut text).is_err() {
        return false;
    }
    String::from_utf8_lossy(&text).contains(REMOVED_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tls: bool) -> MemberSpec {
        MemberSpec {
            name: "h-0011aabb".into(),
            data_dir: "/d/db/etcd".into(),
            advertise: "10.0.0.5".into(),
            client_port: 2379,
            peer_port: 2380,
            tls: tls.then(|| TlsDir::new("/d/tls")),
        }
    }

    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let prefix = format!("--{flag}=");
        args.iter().find_map(|a| a.strip_prefix(prefix.as_str()))
    }

    #[test]
    fn new_cluster_names_only_itself_over_tls() {
        let s = spec(true);
        let args = s.args(&ClusterStart::New {
            cluster_token: "t".into(),
        });
        assert_eq!(
            value(&args, "initial-cluster"),
            Some("h-0011aabb=https://10.0.0.5:2380")
        );
        assert_eq!(value(&args, "initial-cluster-state"), Some("new"));
        assert_eq!(
            value(&args, "listen-client-urls"),
            Some("https://127.0.0.1:2379,https://10.0.0.5:2379")
        );
        assert_eq!(value(&args, "client-cert-auth"), Some("true"));
        assert_eq!(value(&args, "peer-client-cert-auth"), Some("true"));
        assert_eq!(value(&args, "trusted-ca-file"), Some("/d/tls/ca.crt"));
        assert_eq!(value(&args, "peer-key-file"), Some("/d/tls/peer.key"));
    }

    #[test]
    fn join_lists_every_member_and_says_existing() {
        let s = spec(false);
        let args = s.args(&ClusterStart::Join {
            initial_cluster: vec![
                ("a".into(), "http://10.0.0.1:2380".into()),
                ("h-0011aabb".into(), s.peer_url()),
            ],
        });
        assert_eq!(
            value(&args, "initial-cluster"),
            Some("a=http://10.0.0.1:2380,h-0011aabb=http://10.0.0.5:2380")
        );
        assert_eq!(value(&args, "initial-cluster-state"), Some("existing"));
        assert_eq!(value(&args, "cert-file"), None);
    }

    #[test]
    fn restart_sets_no_cluster_state() {
        let args = spec(false).args(&ClusterStart::Existing);
        assert_eq!(value(&args, "initial-cluster-state"), None);
        assert_eq!(value(&args, "data-dir"), Some("/d/db/etcd"));
    }

    #[test]
    fn loopback_advertise_listens_once() {
        let mut s = spec(false);
        s.advertise = "127.0.0.1".into();
        let args = s.args(&ClusterStart::Existing);
        assert_eq!(
            value(&args, "listen-client-urls"),
            Some("http://127.0.0.1:2379")
        );
        s.advertise = "::1".into();
        assert_eq!(s.peer_url(), "http://[::1]:2380");
    }

    #[test]
    fn etcd_args_are_checked_against_the_flags_hostlet_owns() {
        assert_eq!(
            check_etcd_arg("snapshot-count=10000").unwrap(),
            "--snapshot-count=10000"
        );
        assert_eq!(
            check_etcd_arg("--heartbeat-interval=200").unwrap(),
            "--heartbeat-interval=200"
        );
        let e = check_etcd_arg("data-dir=/tmp/x").unwrap_err();
        assert!(e.contains("hostlet sets --data-dir itself"), "{e}");
        let e = check_etcd_arg("quota-backend-bytes=1").unwrap_err();
        assert!(e.contains("--etcd-quota-backend-bytes"), "{e}");
        assert!(check_etcd_arg("snapshot-count").is_err());
        assert!(check_etcd_arg("a b=1").is_err());
        // Every flag hostlet writes on the command line is owned.
        for arg in spec(true).args(&ClusterStart::New {
            cluster_token: "t".into(),
        }) {
            let name = arg.trim_start_matches("--").split('=').next().unwrap();
            assert!(
                check_etcd_arg(&format!("{name}=x")).is_err(),
                "{name} not owned"
            );
        }
    }

    #[test]
    fn binaries_resolve_on_path_or_as_given() {
        assert!(resolve_binary(Path::new("sh")).is_some());
        assert!(resolve_binary(Path::new("/bin/sh")).is_some());
        assert!(resolve_binary(Path::new("/nonexistent/etcd")).is_none());
        assert!(resolve_binary(Path::new("no-such-binary-here")).is_none());
    }

    #[tokio::test]
    async fn stop_escalates_to_sigkill_after_the_grace_period() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let p = EtcdProcess::spawn(
            Path::new("sh"),
            &["-c".into(), "trap '' TERM; sleep 30".into()],
            &log,
        )
        .unwrap();
        let started = std::time::Instant::now();
        let status = p.stop(Duration::from_millis(300)).await.unwrap();
        assert!(!status.success());
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn stop_is_clean_when_the_child_obeys_sigterm() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let p = EtcdProcess::spawn(
            Path::new("sh"),
            &[
                "-c".into(),
                "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done".into(),
            ],
            &log,
        )
        .unwrap();
        // The trap must be in place before the signal: wait for the line printed after it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ready")
        {
            assert!(std::time::Instant::now() < deadline, "child never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = p.stop(Duration::from_secs(5)).await.unwrap();
        assert!(status.success(), "{status:?}");
    }

    #[tokio::test]
    async fn only_this_runs_output_counts_as_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let say = |line: &str| {
            vec![
                "-c".to_string(),
                format!("echo '{{\"msg\":\"server error\",\"error\":\"{line}\"}}'"),
            ]
        };
        let mut first = EtcdProcess::spawn(Path::new("sh"), &say(REMOVED_MESSAGE), &log).unwrap();
        first.wait().await.unwrap();
        assert!(first.said_removed());
        let mut second = EtcdProcess::spawn(Path::new("sh"), &say("no space left"), &log).unwrap();
        second.wait().await.unwrap();
        assert!(
            !second.said_removed(),
            "an earlier run's removal is not this run's"
        );
        assert!(!output_says_removed(&tmp.path().join("missing"), 0));
    }
}
