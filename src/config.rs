//! The agent's configuration: flags, each also an environment variable `HOSTLET_<FLAG>` and a key of the
//! YAML file given by `--config`. Precedence: command line, then environment, then the file, then defaults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};
use serde::Serialize;

fn duration(s: &str) -> Result<Duration, String> {
    hostlet_api::objects::parse_duration(s)
}

/// A certificate lifetime: at least a minute (renewal runs two thirds in), at most ten years.
fn cert_lifetime(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_secs(60) || d > Duration::from_secs(10 * 365 * 86400) {
        return Err(format!("{s:?}: a certificate lifetime is 1m to 10 years"));
    }
    Ok(d)
}

fn retention(s: &str) -> Result<String, String> {
    hostlet_controllers::upkeep::Retention::parse(s).map(|_| s.trim().to_string())
}

/// `30%` (or `0.3`) as a ratio in 0..=1.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a share like 30% or 0.3"))?;
    let ratio = v / scale;
    if !(0.0..=1.0).contains(&ratio) || !ratio.is_finite() {
        return Err(format!("{s:?}: must be between 0% and 100%"));
    }
    Ok(ratio)
}

fn percent(s: &str) -> Result<String, String> {
    parse_percent(s).map(|_| s.trim().to_string())
}

/// `64MiB`, `2GB`, `1048576` as bytes.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{s:?} is not a size like 64MiB, 8GiB or a number of bytes: {e}"))
}

fn byte_size(s: &str) -> Result<String, String> {
    parse_byte_size(s).map(|_| s.trim().to_string())
}

fn node_label(s: &str) -> Result<String, String> {
    hostlet_api::labels::parse_own(s.trim()).map(|(k, v)| format!("{k}={v}"))
}

fn pod_security(s: &str) -> Result<String, String> {
    s.trim()
        .parse::<hostlet_api::security::PodSecurityLevel>()
        .map(|l| l.to_string())
}

/// `500m` or `1.5` as thousandths of a core.
pub fn parse_cpu_millis(s: &str) -> Result<i64, String> {
    hostlet_api::manifest::Quantity(s.trim().to_string())
        .cpu_millis()
        .ok_or_else(|| format!("{s:?} is not a CPU quantity like 500m or 1.5"))
}

fn cpu_quantity(s: &str) -> Result<String, String> {
    parse_cpu_millis(s).map(|_| s.trim().to_string())
}

/// `--container-log-max-size`: at least 1 KiB (Docker refuses less than a line or two).
fn log_size(s: &str) -> Result<String, String> {
    match parse_byte_size(s)? {
        n if n < 1024 => Err(format!("{s:?} is below 1KiB")),
        _ => Ok(s.trim().to_string()),
    }
}

fn schedule(s: &str) -> Result<String, String> {
    hostlet_controllers::snapshots::schedule::Schedule::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}

fn etcd_arg(s: &str) -> Result<String, String> {
    hostlet_controllers::etcd_member::process::check_etcd_arg(s).map(|_| s.trim().to_string())
}

fn voters(s: &str) -> Result<u8, String> {
    let v: u8 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not one of 1, 3, 5, 7"))?;
    hostlet_api::objects::check_voters(v).map(|()| v)
}

/// `--role`: what this host is in the etcd cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A voter while the cluster needs one, else a worker; the leader moves hosts between the two.
    Auto,
    /// Always an etcd member, even beyond the voter target.
    Voter,
    /// Never an etcd member: client certificates only, talks to the voters.
    Worker,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `hostlet run`.
#[derive(Debug, Clone, Args, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct RunConfig {
    /// YAML file whose keys are the flag names below (e.g. `node-name: n1`).
    #[arg(long, env = "HOSTLET_CONFIG", value_name = "FILE", value_parser = crate::paths::absolute)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// This node's name [default: the hostname].
    #[arg(long, env = "HOSTLET_NODE_NAME")]
    #[serde(skip)]
    pub node_name: Option<String>,

    /// Where hostlet keeps its etcd member, snapshots, pod volumes and TLS material.
    #[arg(long, env = "HOSTLET_DATA_DIR", default_value = "/var/lib/hostlet", value_parser = crate::paths::absolute)]
    pub data_dir: PathBuf,

    /// Prefix of every hostlet key in etcd.
    #[arg(long, env = "HOSTLET_KEY_PREFIX", default_value = "/hostlet")]
    pub key_prefix: String,

    /// Address of the agent's API (HTTPS with the cluster CA; plain HTTP under --etcd-insecure).
    #[arg(long, env = "HOSTLET_LISTEN", default_value = "127.0.0.1:10250")]
    pub listen: SocketAddr,

    /// Address of the plain-HTTP /metrics, /healthz and /readyz listener.
    #[arg(
        long,
        env = "HOSTLET_METRICS_LISTEN",
        default_value = "127.0.0.1:10249"
    )]
    pub metrics_listen: SocketAddr,

    /// Address other nodes reach this one at [default: the host's primary address].
    #[arg(long, env = "HOSTLET_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,

    /// Client port of the local etcd member.
    #[arg(long, env = "HOSTLET_ETCD_CLIENT_PORT", default_value_t = 2379)]
    pub etcd_client_port: u16,

    /// Peer port of the local etcd member.
    #[arg(long, env = "HOSTLET_ETCD_PEER_PORT", default_value_t = 2380)]
    pub etcd_peer_port: u16,

    /// The etcd binary the agent starts.
    #[arg(long, env = "HOSTLET_ETCD_BINARY", default_value = "etcd", value_parser = crate::paths::program)]
    pub etcd_binary: PathBuf,

    /// The etcd binary is rolled in when replaced (a package upgrade): one member at a time, snapshot first,
    /// the leader last. A replacement is seen within 250 ms (a stat); this is how often the whole look runs
    /// besides.
    #[arg(long, env = "HOSTLET_ETCD_BINARY_CHECK_INTERVAL", default_value = "30s", value_parser = duration)]
    #[serde(with = "humantime_serde_compat")]
    pub etcd_binary_check_interval: Duration,

    /// Roll a new etcd binary in even with fewer than 3 voters (the cluster stops while each restarts).
    #[arg(long, env = "HOSTLET_ETCD_ALLOW_SINGLE_MEMBER_UPGRADE")]
    pub etcd_allow_single_member_upgrade: bool,

    /// Use this external etcd cluster instead of a local member (turns member management off).
    #[arg(long, env = "HOSTLET_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// CA certificate for --etcd-endpoints.
    #[arg(long, env = "HOSTLET_ETCD_CA_FILE", value_parser = crate::paths::absolute)]
    pub etcd_ca_file: Option<PathBuf>,

    /// Client certificate for --etcd-endpoints.
    #[arg(long, env = "HOSTLET_ETCD_CERT_FILE", value_parser = crate::paths::absolute)]
    pub etcd_cert_file: Option<PathBuf>,

    /// Client key for --etcd-endpoints.
    #[arg(long, env = "HOSTLET_ETCD_KEY_FILE", value_parser = crate::paths::absolute)]
    pub etcd_key_file: Option<PathBuf>,

    /// Plain HTTP for etcd and the API: for throwaway local clusters only. Refused with a non-loopback
    /// --advertise-address or --listen unless --etcd-insecure-allow-remote.
    #[arg(long, env = "HOSTLET_ETCD_INSECURE")]
    pub etcd_insecure: bool,

    /// With --etcd-insecure: allow a non-loopback advertise or listen address (anyone who reaches it
    /// reads and writes the whole cluster).
    #[arg(
        long,
        env = "HOSTLET_ETCD_INSECURE_ALLOW_REMOTE",
        requires = "etcd_insecure"
    )]
    pub etcd_insecure_allow_remote: bool,

    /// URL of any running hostlet to join its cluster.
    #[arg(long, env = "HOSTLET_SERVER")]
    pub server: Option<String>,

    /// Cluster token (needed with --server; generated on the first node).
    #[arg(long, env = "HOSTLET_TOKEN", hide_env_values = true)]
    #[serde(skip)]
    pub token: Option<String>,

    /// File holding the cluster token, such as the first node's `<data-dir>/token` on a shared volume;
    /// waited for until it exists. --token wins when both are given.
    #[arg(long, env = "HOSTLET_TOKEN_FILE", value_name = "FILE", value_parser = crate::paths::absolute)]
    pub token_file: Option<PathBuf>,

    /// A learner without progress for this long is evicted.
    #[arg(long, env = "HOSTLET_LEARNER_STALL_TIMEOUT", default_value = "5m", value_parser = duration)]
    #[serde(with = "humantime_serde_compat")]
    pub learner_stall_timeout: Duration,

    /// What this host is in the etcd cluster: auto (a voter while the target wants one, else a worker),
    /// voter, or worker.
    #[arg(long, env = "HOSTLET_ROLE", value_enum, default_value = "auto")]
    pub role: Role,

    /// First node only: the cluster's voter target (1, 3, 5 or 7), written to /hostlet/config/cluster
    /// unless that key exists. Later changes go to the key.
    #[arg(long, env = "HOSTLET_ETCD_VOTERS", value_parser = voters)]
    pub etcd_voters: Option<u8>,

    /// A voter whose heartbeat lease has been gone this long (and whose member does not answer) is
    /// replaced by a worker.
    #[arg(long, env = "HOSTLET_VOTER_REPLACE_AFTER", default_value = "10m", value_parser = duration)]
    #[serde(with = "humantime_serde_compat")]
    pub voter_replace_after: Duration,

    /// How long the certificates a voter issues to workers (their joins and renewals) are valid; a worker
    /// renews its own two thirds into their life, without a restart.
    #[arg(long, env = "HOSTLET_CERT_LIFETIME", default_value = "90d", value_parser = cert_lifetime)]
    #[serde(with = "humantime_serde_compat")]
    pub cert_lifetime: Duration,

    /// This host's failure domain (rack, zone): voters are spread across failure domains.
    #[arg(long, env = "HOSTLET_FAILURE_DOMAIN")]
    pub failure_domain: Option<String>,

    /// A label of this node, key=value (repeatable; Kubernetes' syntax); pod sets select nodes by labels.
    /// Labels under hostlet.io/ are hostlet's own or an admin's (hostlet node label).
    #[arg(long = "node-label", env = "HOSTLET_NODE_LABELS", value_delimiter = ',', value_parser = node_label)]
    pub node_label: Vec<String>,

    /// Snapshot schedule: 5- or 6-field cron, or `@every <duration>`.
    #[arg(
        long,
        env = "HOSTLET_SNAPSHOT_SCHEDULE",
        default_value = "0 */12 * * *"
    )]
    pub snapshot_schedule: String,

    /// Snapshots kept per name, exactly: scheduled ones share one name, each on-demand name counts its own.
    #[arg(long, env = "HOSTLET_SNAPSHOT_RETENTION", default_value_t = 5)]
    pub snapshot_retention: u32,

    /// Compress snapshots with zstd.
    #[arg(long, env = "HOSTLET_SNAPSHOT_COMPRESS")]
    pub snapshot_compress: bool,

    /// Take no scheduled snapshots.
    #[arg(long, env = "HOSTLET_DISABLE_SNAPSHOTS")]
    pub disable_snapshots: bool,

    /// Snapshot directory [default: <data-dir>/db/snapshots].
    #[arg(long, env = "HOSTLET_SNAPSHOT_DIR", value_parser = crate::paths::absolute)]
    #[serde(skip)]
    pub snapshot_dir: Option<PathBuf>,

    /// File holding a 256-bit key as 64 hex digits (`openssl rand -hex 32`), readable by its owner only:
    /// snapshots (and so their objects) are encrypted with it, and a cluster reset from an encrypted
    /// snapshot needs it.
    #[arg(long, env = "HOSTLET_SNAPSHOT_ENCRYPTION_KEY_FILE", value_name = "FILE", value_parser = crate::paths::absolute)]
    pub snapshot_encryption_key_file: Option<PathBuf>,

    /// Object-storage copies of the snapshots.
    #[command(flatten)]
    #[serde(flatten)]
    pub s3: SnapshotS3Args,

    /// Remote snapshot objects kept per name, under this node's own prefix only.
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_RETENTION", default_value_t = hostlet_controllers::snapshots::policy::DEFAULT_S3_RETENTION)]
    pub snapshot_s3_retention: u32,

    /// etcd history kept: a duration (`1h`, `30m`) or a number of revisions (`10000`); `0` never compacts.
    #[arg(
        long,
        env = "HOSTLET_ETCD_COMPACTION_RETENTION",
        default_value = "1h",
        value_parser = retention
    )]
    pub etcd_compaction_retention: String,

    /// Defragment a member once this share of its database file is free (`30%`)…
    #[arg(
        long,
        env = "HOSTLET_ETCD_DEFRAG_THRESHOLD",
        default_value = "30%",
        value_parser = percent
    )]
    pub etcd_defrag_threshold: String,

    /// …and at least this much (`64MiB`).
    #[arg(
        long,
        env = "HOSTLET_ETCD_DEFRAG_MIN_FREE",
        default_value = "64MiB",
        value_parser = byte_size
    )]
    pub etcd_defrag_min_free: String,

    /// Also defragment every member, one at a time, on this schedule (5- or 6-field cron, `@every 24h`).
    #[arg(long, env = "HOSTLET_ETCD_DEFRAG_SCHEDULE", value_parser = schedule)]
    pub etcd_defrag_schedule: Option<String>,

    /// etcd's backend quota (`8GiB`, or bytes): at this size it raises NOSPACE [default: etcd's, 2 GiB].
    #[arg(long, env = "HOSTLET_ETCD_QUOTA_BACKEND_BYTES", value_parser = byte_size)]
    pub etcd_quota_backend_bytes: Option<String>,

    /// `NAME=VALUE` handed to the etcd hostlet starts as `--NAME=VALUE` (repeatable); flags hostlet sets
    /// itself are refused.
    #[arg(
        long = "etcd-arg",
        env = "HOSTLET_ETCD_ARG",
        value_delimiter = '\n',
        value_name = "NAME=VALUE",
        value_parser = etcd_arg
    )]
    pub etcd_arg: Vec<String>,

    /// Force a new single-member cluster from this member's data (or a snapshot), then exit.
    #[arg(long, env = "HOSTLET_CLUSTER_RESET")]
    pub cluster_reset: bool,

    /// Snapshot file to restore for --cluster-reset, or an `s3://bucket/key` object (downloaded and checked
    /// with the --snapshot-s3-* settings first).
    #[arg(
        long,
        env = "HOSTLET_CLUSTER_RESET_RESTORE_PATH",
        requires = "cluster_reset",
        value_parser = crate::paths::absolute_or_s3
    )]
    pub cluster_reset_restore_path: Option<PathBuf>,

    /// For --cluster-reset: a member (client URL, or `all`) lost for good, whose silence may count as down.
    #[arg(
        long,
        env = "HOSTLET_CLUSTER_RESET_LOST",
        requires = "cluster_reset",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub cluster_reset_lost: Vec<String>,

    /// Docker engine address [default: the local socket].
    #[arg(long, env = "HOSTLET_DOCKER_HOST")]
    pub docker_host: Option<String>,

    /// Free space below this share of a filesystem the agent writes to (its data dir, Docker's root) is
    /// disk pressure: an event, `/readyz`, and the etcd member and snapshots wait for room. 0% turns it off.
    #[arg(
        long,
        env = "HOSTLET_DISK_MIN_FREE",
        default_value = "5%",
        value_parser = percent
    )]
    pub disk_min_free: String,

    /// Image of each pod's infra container.
    #[arg(long, env = "HOSTLET_PAUSE_IMAGE", default_value = "busybox:latest")]
    pub pause_image: String,

    /// Rotate each container's log at this size (Docker's json-file driver, whatever the daemon's default).
    #[arg(
        long,
        env = "HOSTLET_CONTAINER_LOG_MAX_SIZE",
        default_value = "10Mi",
        value_parser = log_size
    )]
    pub container_log_max_size: String,

    /// Log files kept per container, the one being written included (at least 2).
    #[arg(
        long,
        env = "HOSTLET_CONTAINER_LOG_MAX_FILES",
        default_value_t = 5,
        value_parser = clap::value_parser!(u32).range(2..=100)
    )]
    pub container_log_max_files: u32,

    /// Unused images are removed when the filesystem holding Docker's images is used this much (percent);
    /// 100 turns image collection off.
    #[arg(long, env = "HOSTLET_IMAGE_GC_HIGH_THRESHOLD", default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub image_gc_high_threshold: u8,

    /// Image collection removes the least recently used unused images until usage is down to this (percent).
    #[arg(long, env = "HOSTLET_IMAGE_GC_LOW_THRESHOLD", default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub image_gc_low_threshold: u8,

    /// An image first seen less than this long ago is never collected.
    #[arg(long, env = "HOSTLET_IMAGE_GC_MINIMUM_AGE", default_value = "2m", value_parser = duration)]
    #[serde(with = "humantime_serde_compat")]
    pub image_gc_minimum_age: Duration,

    /// Another directory of `docker save` tarballs (`*.tar`, `*.tar.gz`, `*.tgz`, `*.tar.zst`) to load into
    /// Docker and keep from image collection while they are there, besides `<data-dir>/images`.
    #[arg(long, env = "HOSTLET_IMAGES_DIR", value_parser = crate::paths::absolute)]
    pub images_dir: Option<PathBuf>,

    /// Host directories that hostDir volumes may name (and their subdirectories).
    #[arg(long, env = "HOSTLET_ALLOWED_HOST_PATHS", value_delimiter = ',', value_parser = crate::paths::absolute)]
    pub allowed_host_paths: Vec<PathBuf>,

    /// Host devices pods may be given (globs such as /dev/ttyUSB*,/dev/serial/by-id/*): a hostPath volume
    /// of type CharDevice or BlockDevice on a matching path becomes a device of its containers.
    #[arg(long, env = "HOSTLET_ALLOWED_DEVICES", value_delimiter = ',')]
    pub allowed_devices: Vec<String>,

    /// What pods may ask of the host: privileged, baseline (no privileged containers, no added
    /// capabilities beyond Kubernetes' baseline list, NET_RAW dropped) or restricted (also: every
    /// capability dropped, runAsNonRoot required, no privilege escalation).
    #[arg(long, env = "HOSTLET_POD_SECURITY", default_value = "baseline", value_parser = pod_security)]
    pub pod_security: String,

    /// Processes (and threads) each pod container may hold at once.
    #[arg(long, env = "HOSTLET_POD_PIDS_LIMIT", default_value_t = 4096, value_parser = clap::value_parser!(i64).range(16..=4_194_304))]
    pub pod_pids_limit: i64,

    /// The cgroup pod containers are made under [default: /hostlet-pods with Docker's cgroupfs driver,
    /// hostlet-pods.slice with its systemd driver].
    #[arg(long, env = "HOSTLET_PODS_CGROUP_PARENT")]
    pub pods_cgroup_parent: Option<String>,

    /// CPU kept from the pods for the etcd member and the agent (`500m`, `1`): the pods' cgroup gets the rest.
    #[arg(long, env = "HOSTLET_PODS_RESERVED_CPU", value_parser = cpu_quantity)]
    pub pods_reserved_cpu: Option<String>,

    /// Memory kept from the pods for the etcd member and the agent (`1GiB`): the pods' cgroup gets the rest.
    #[arg(long, env = "HOSTLET_PODS_RESERVED_MEMORY", value_parser = byte_size)]
    pub pods_reserved_memory: Option<String>,

    /// Host ports no pod may publish, besides the agent's own (etcd client and peer, API, metrics).
    #[arg(
        long,
        env = "HOSTLET_RESERVED_HOST_PORTS",
        value_delimiter = ',',
        value_name = "PORT"
    )]
    pub reserved_host_ports: Vec<u16>,

    /// A manifest file or a directory of manifest files.
    #[arg(long, env = "HOSTLET_MANIFEST_PATH", value_parser = crate::paths::absolute)]
    pub manifest_path: Option<PathBuf>,

    /// A URL serving one manifest or a list, polled every 20 s.
    #[arg(long, env = "HOSTLET_MANIFEST_URL")]
    pub manifest_url: Option<String>,

    /// `Name: value` header sent with --manifest-url requests (repeatable).
    #[arg(long, env = "HOSTLET_MANIFEST_URL_HEADER", value_delimiter = '\n')]
    #[serde(skip)]
    pub manifest_url_header: Vec<String>,

    /// Largest --manifest-url body read (`4MiB`, or bytes); a bigger one is refused and the last good
    /// set kept.
    #[arg(
        long,
        env = "HOSTLET_MANIFEST_URL_MAX_BYTES",
        default_value = "4MiB",
        value_parser = parse_byte_size
    )]
    pub manifest_url_max_bytes: u64,

    /// Log format.
    #[arg(long, env = "HOSTLET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Print the configuration the agent would run with, as YAML, and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
}

/// Where snapshot copies go in S3-compatible object storage. Credentials are read from
/// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) or from
/// --snapshot-s3-credentials-file, never from a flag.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotS3Args {
    /// S3-compatible endpoint, `https://host:port` [default: AWS].
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_ENDPOINT")]
    pub snapshot_s3_endpoint: Option<String>,

    /// Bucket for snapshot copies; without one (here or in a policy key) nothing is uploaded.
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_BUCKET")]
    pub snapshot_s3_bucket: Option<String>,

    /// Folder in the bucket; objects go under `<prefix>/<node>/<file>`.
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_PREFIX")]
    pub snapshot_s3_prefix: Option<String>,

    /// Region of the bucket [default: us-east-1].
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_REGION")]
    pub snapshot_s3_region: Option<String>,

    /// `bucket.host` addressing instead of the default path-style `host/bucket`.
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_VIRTUAL_HOSTED_STYLE")]
    pub snapshot_s3_virtual_hosted_style: bool,

    /// PEM CA bundle of a private endpoint.
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_CA_FILE", value_parser = crate::paths::absolute)]
    pub snapshot_s3_ca_file: Option<PathBuf>,

    /// File of `AWS_ACCESS_KEY_ID=…` and `AWS_SECRET_ACCESS_KEY=…` lines [default: those variables from the
    /// environment].
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_CREDENTIALS_FILE", value_parser = crate::paths::absolute)]
    pub snapshot_s3_credentials_file: Option<PathBuf>,

    /// Accept a plain `http://` --snapshot-s3-endpoint (credentials and snapshots cross the network in the
    /// clear).
    #[arg(long, env = "HOSTLET_SNAPSHOT_S3_ALLOW_HTTP")]
    pub snapshot_s3_allow_http: bool,
}

impl SnapshotS3Args {
    /// The endpoint flag's checks: an http(s) URL, and plain http only when allowed.
    pub fn check(&self) -> Result<(), String> {
        if let Some(ep) = &self.snapshot_s3_endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(format!(
                    "--snapshot-s3-endpoint {ep:?}: must be an http:// or https:// URL"
                ));
            }
            if ep.starts_with("http://") && !self.snapshot_s3_allow_http {
                return Err(format!(
                    "--snapshot-s3-endpoint {ep:?}: plain http:// is refused (credentials and snapshots would cross the network in the clear); use https://, or give --snapshot-s3-allow-http"
                ));
            }
        }
        Ok(())
    }

    /// The flags as the scheduler takes them (`retention` is the remote retention).
    pub fn flags(&self, retention: Option<u32>) -> hostlet_controllers::snapshots::policy::S3Flags {
        hostlet_controllers::snapshots::policy::S3Flags {
            policy: hostlet_api::objects::S3Policy {
                endpoint: self.snapshot_s3_endpoint.clone(),
                bucket: self.snapshot_s3_bucket.clone(),
                prefix: self.snapshot_s3_prefix.clone(),
                region: self.snapshot_s3_region.clone(),
                retention,
            },
            virtual_hosted: self.snapshot_s3_virtual_hosted_style,
            ca_file: self.snapshot_s3_ca_file.clone(),
            credentials_file: self.snapshot_s3_credentials_file.clone(),
            allow_http: self.snapshot_s3_allow_http,
        }
    }

    /// The target for reading `bucket` (from an `s3://` URL), whatever bucket the flags name.
    pub fn target_for(&self, bucket: &str) -> hostlet_controllers::snapshots::remote::S3Target {
        let mut flags = self.flags(None);
        flags.policy.bucket = Some(bucket.to_string());
        flags.policy.prefix = None;
        // A bucket is always set here, so there is a target.
        flags.target(&flags.policy).unwrap_or_else(|| {
            hostlet_controllers::snapshots::remote::S3Target {
                endpoint: None,
                bucket: bucket.to_string(),
                prefix: String::new(),
                region: hostlet_controllers::snapshots::policy::DEFAULT_S3_REGION.into(),
                virtual_hosted: false,
                ca_file: None,
                credentials_file: None,
                allow_http: false,
            }
        })
    }
}

mod humantime_serde_compat {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

impl RunConfig {
    /// The node name in force: the flag, else the hostname.
    pub fn node_name(&self) -> String {
        self.node_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(hostname)
    }

    /// Whether the agent runs its own etcd member.
    pub fn embedded_etcd(&self) -> bool {
        self.etcd_endpoints.is_empty()
    }

    /// The snapshot directory in force.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.snapshot_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("db").join("snapshots"))
    }

    /// `--etcd-insecure` serves etcd and the API without authentication: only on loopback addresses,
    /// unless --etcd-insecure-allow-remote. Checked before anything binds.
    pub fn check_insecure(&self) -> Result<(), String> {
        // --print-config serves nothing: it shows what a start would run with.
        if !self.etcd_insecure || self.etcd_insecure_allow_remote || self.print_config {
            return Ok(());
        }
        let why = "etcd and the API would serve the whole cluster without authentication to anyone who reaches them; use loopback addresses, drop --etcd-insecure, or give --etcd-insecure-allow-remote";
        if !self.listen.ip().is_loopback() {
            return Err(format!(
                "--etcd-insecure with --listen {}: not a loopback address; {why}",
                self.listen
            ));
        }
        if self.embedded_etcd() {
            match self.advertise_address.as_deref().filter(|a| !a.is_empty()) {
                None => {
                    return Err(format!(
                        "--etcd-insecure without --advertise-address advertises the host's primary address; {why}"
                    ))
                }
                Some(a) if !is_loopback_host(a) => {
                    return Err(format!(
                        "--etcd-insecure with --advertise-address {a}: not a loopback address; {why}"
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The snapshot key, when --snapshot-encryption-key-file is given.
    pub fn snapshot_key(
        &self,
    ) -> Result<
        Option<hostlet_controllers::snapshots::encryption::SnapshotKey>,
        hostlet_controllers::snapshots::encryption::KeyFileError,
    > {
        self.snapshot_encryption_key_file
            .as_deref()
            .map(hostlet_controllers::snapshots::encryption::SnapshotKey::load)
            .transpose()
    }

    /// The image collector's policy (`--image-gc-*`).
    pub fn image_gc(&self) -> Result<hostlet_controllers::pods::images::ImageGcPolicy, String> {
        hostlet_controllers::pods::images::ImageGcPolicy::new(
            self.image_gc_high_threshold,
            self.image_gc_low_threshold,
            self.image_gc_minimum_age,
        )
    }

    /// Checks what clap cannot: combinations of flags.
    pub fn check(&self) -> Result<(), String> {
        if self.server.is_some()
            && self.token.as_deref().unwrap_or("").is_empty()
            && self.token_file.is_none()
        {
            return Err(
                "--server needs --token or --token-file (the cluster token of the node you join)"
                    .into(),
            );
        }
        if !self.embedded_etcd() && (self.server.is_some() || self.cluster_reset) {
            return Err(
                "--etcd-endpoints uses an external cluster: --server and --cluster-reset manage a local member and cannot go with it"
                    .into(),
            );
        }
        for (flag, url) in [
            ("--server", &self.server),
            ("--manifest-url", &self.manifest_url),
        ] {
            if let Some(u) = url {
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    return Err(format!("{flag} {u:?}: must be an http:// or https:// URL"));
                }
            }
        }
        for l in &self.node_label {
            hostlet_api::labels::parse_own(l).map_err(|e| format!("--node-label {e}"))?;
        }
        self.s3.check()?;
        self.check_insecure()?;
        self.image_gc()?;
        if let Some(b) = &self.s3.snapshot_s3_bucket {
            if b.is_empty() || b.contains('/') {
                return Err(format!(
                    "--snapshot-s3-bucket {b:?}: a bucket name, without '/'"
                ));
            }
        }
        if let Some(p) = &self.cluster_reset_restore_path {
            let s = p.to_string_lossy();
            if s.starts_with("s3://")
                && hostlet_controllers::snapshots::remote::parse_s3_url(&s).is_none()
            {
                return Err(format!(
                    "--cluster-reset-restore-path {s:?}: must be s3://<bucket>/<key>"
                ));
            }
        }
        // A header line may hold a secret: a bad one is named by its place, never shown.
        for (i, h) in self.manifest_url_header.iter().enumerate() {
            if !h.contains(':') {
                return Err(format!(
                    "--manifest-url-header line {}: must be `Name: value` (the line is not shown: it may hold a secret)",
                    i + 1
                ));
            }
        }
        for p in &self.allowed_host_paths {
            if !p.is_absolute() {
                return Err(format!(
                    "--allowed-host-paths {}: must be an absolute path",
                    p.display()
                ));
            }
            hostlet_controllers::pods::spec::check_allowed_host_path(p, &self.data_dir)?;
        }
        for g in &self.allowed_devices {
            if !g.starts_with('/') {
                return Err(format!(
                    "--allowed-devices {g}: must be an absolute path (a glob such as /dev/ttyUSB*)"
                ));
            }
            if let Err(e) = glob::Pattern::new(g) {
                return Err(format!("--allowed-devices {g}: {e}"));
            }
        }
        Ok(())
    }
}

/// Whether `host` (an IP address or `localhost`) is a loopback address.
fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The host's name, from the kernel.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Errors of reading the `--config` file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Invalid { path: String, message: String },
}

/// Turns the config file into command-line arguments for every flag that neither the command line nor the
/// environment set, so that clap parses and checks file values exactly as it does flags.
pub fn config_file_args(
    path: &Path,
    run_matches: &ArgMatches,
) -> Result<Vec<String>, ConfigFileError> {
    let shown = path.display().to_string();
    let invalid = |message: String| ConfigFileError::Invalid {
        path: shown.clone(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: shown.clone(),
        source,
    })?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let map: BTreeMap<String, yaml_serde::Value> =
        yaml_serde::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let cmd = RunConfig::augment_args(clap::Command::new("run"));
    let mut out = Vec::new();
    for (key, value) in map {
        let flag = key.replace('_', "-");
        let Some(arg) = cmd.get_arguments().find(|a| {
            a.get_long() == Some(flag.as_str()) && flag != "config" && flag != "print-config"
        }) else {
            return Err(invalid(format!(
                "unknown key {key:?} (keys are the flags of `hostlet run`)"
            )));
        };
        let id = arg.get_id().as_str();
        if matches!(
            run_matches.value_source(id),
            Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable)
        ) {
            continue;
        }
        let scalars: Vec<String> = match &value {
            yaml_serde::Value::Sequence(items) => {
                items.iter().map(scalar).collect::<Result<_, _>>()
            }
            v => scalar(v).map(|s| vec![s]),
        }
        .map_err(|m| invalid(format!("{key}: {m}")))?;
        let is_switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        if is_switch {
            match scalars.as_slice() {
                [v] if v == "true" => out.push(format!("--{flag}")),
                [v] if v == "false" => {}
                _ => return Err(invalid(format!("{key}: expected true or false"))),
            }
            continue;
        }
        for v in scalars {
            out.push(format!("--{flag}={v}"));
        }
    }
    Ok(out)
}

fn scalar(v: &yaml_serde::Value) -> Result<String, String> {
    match v {
        yaml_serde::Value::String(s) => Ok(s.clone()),
        yaml_serde::Value::Number(n) => Ok(n.to_string()),
        yaml_serde::Value::Bool(b) => Ok(b.to_string()),
        _ => Err("expected a string, number, boolean or a list of them".into()),
    }
}

/// Parses `hostlet run` arguments (as given after `run`) with the config file applied.
pub fn parse_run_args<I: IntoIterator<Item = String>>(args: I) -> Result<RunConfig, anyhow::Error> {
    let args: Vec<String> = args.into_iter().collect();
    let cmd = RunConfig::augment_args(clap::Command::new("run").no_binary_name(true));
    let matches = cmd.clone().try_get_matches_from(&args)?;
    let first = RunConfig::from_arg_matches(&matches)?;
    let Some(path) = first.config.clone() else {
        return Ok(first);
    };
    let mut merged = config_file_args(&path, &matches)?;
    merged.extend(args);
    let matches = cmd.try_get_matches_from(&merged)?;
    Ok(RunConfig::from_arg_matches(&matches)?)
}

#[cfg(test)]
mod upkeep_flag_tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn insecure_etcd_stays_on_loopback_unless_allowed() {
        let check = |a: &[&str]| parse_run_args(args(a)).unwrap().check();
        assert!(check(&["--etcd-insecure", "--advertise-address=127.0.0.2"]).is_ok());
        let e = check(&["--etcd-insecure", "--advertise-address=192.0.2.7"]).unwrap_err();
        assert!(
            e.contains("192.0.2.7") && e.contains("--etcd-insecure-allow-remote"),
            "{e}"
        );
        assert!(check(&["--etcd-insecure"])
            .unwrap_err()
            .contains("primary address"));
        let e = check(&[
            "--etcd-insecure",
            "--advertise-address=127.0.0.1",
            "--listen=0.0.0.0:10250",
        ])
        .unwrap_err();
        assert!(e.contains("--listen 0.0.0.0:10250"), "{e}");
        assert!(check(&[
            "--etcd-insecure",
            "--etcd-insecure-allow-remote",
            "--advertise-address=192.0.2.7"
        ])
        .is_ok());
        assert!(check(&["--advertise-address=192.0.2.7"]).is_ok());
    }

    #[test]
    fn plain_http_endpoints_and_bad_header_lines_are_refused_without_echo() {
        let check = |a: &[&str]| parse_run_args(args(a)).unwrap().check();
        let e = check(&["--snapshot-s3-endpoint=http://s3.local:9000"]).unwrap_err();
        assert!(e.contains("--snapshot-s3-allow-http"), "{e}");
        assert!(check(&[
            "--snapshot-s3-endpoint=http://s3.local:9000",
            "--snapshot-s3-allow-http"
        ])
        .is_ok());
        let e = check(&[
            "--manifest-url=https://m.local/x",
            "--manifest-url-header=Authorization: Bearer ok",
            "--manifest-url-header=Bearer-s3cr3t-token",
        ])
        .unwrap_err();
        assert!(e.contains("line 2") && !e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn shares_and_sizes_parse_with_clear_errors() {
        assert_eq!(parse_percent("30%"), Ok(0.3));
        assert_eq!(parse_percent("0.5"), Ok(0.5));
        assert!(parse_percent("130%")
            .unwrap_err()
            .contains("between 0% and 100%"));
        assert!(parse_percent("lots").is_err());
        assert_eq!(parse_byte_size("64MiB"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_byte_size("1048576"), Ok(1048576));
        assert_eq!(parse_byte_size("8GiB"), Ok(8 * 1024 * 1024 * 1024));
        assert!(parse_byte_size("big").unwrap_err().contains("64MiB"));
    }

    #[test]
    fn etcd_args_clashing_with_hostlet_are_refused_at_parse_time() {
        let err = parse_run_args(["--etcd-arg".to_string(), "name=x".to_string()]).unwrap_err();
        assert!(
            err.to_string().contains("hostlet sets --name itself"),
            "{err}"
        );
        let cfg = parse_run_args([
            "--etcd-arg=snapshot-count=5000".to_string(),
            "--etcd-compaction-retention=10000".to_string(),
        ])
        .unwrap();
        assert_eq!(cfg.etcd_arg, vec!["snapshot-count=5000"]);
        assert!(parse_run_args(["--etcd-compaction-retention=soon".to_string()]).is_err());
        assert!(parse_run_args(["--etcd-defrag-schedule=never".to_string()]).is_err());
    }
}
