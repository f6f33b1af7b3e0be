//! How a CLI subcommand finds the cluster: the local agent's data dir (endpoints, client certificate, node
//! name), or explicit `--etcd-endpoints` and certificate flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use hostlet_api::KeyLayout;
use hostlet_controllers::etcd_member::MemberLayout;
use hostlet_controllers::pki::CertRole;
use hostlet_runtime::{Etcd, EtcdConfig, TlsFiles};
use serde::{Deserialize, Serialize};

/// Output format of listing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    /// The table with more columns (`pod ls`, `node ls`; elsewhere the same as `table`).
    Wide,
    Json,
    Yaml,
}

impl Output {
    /// JSON or YAML rather than a table for people.
    pub fn structured(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }
}

/// What the running agent leaves in `<data-dir>/agent.json` for the CLI beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    pub node: String,
    pub endpoints: Vec<String>,
    pub key_prefix: String,
    /// Whether etcd is reached over TLS with the client certificate in `<data-dir>/tls/`.
    pub tls: bool,
    /// The agent's API URL (`--listen`).
    #[serde(default)]
    pub api_url: Option<String>,
    /// The snapshot settings the agent runs with (flags and config file, no secrets), so that `snapshot
    /// prune` applies the same retention as the scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<AgentSnapshotSettings>,
}

/// The agent's snapshot flags, as `agent.json` keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSnapshotSettings {
    pub dir: PathBuf,
    pub schedule: String,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    #[serde(default)]
    pub s3: hostlet_api::objects::S3Policy,
    #[serde(default)]
    pub s3_virtual_hosted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_credentials_file: Option<PathBuf>,
    /// The agent was started with --snapshot-s3-allow-http.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub s3_allow_http: bool,
}

/// Where a running agent leaves a pointer to its data dir, so that the CLI finds it whatever `--data-dir`
/// it was started with: `$HOSTLET_RUN_DIR/agent.json`, `/run/hostlet/agent.json` by default.
pub fn run_pointer() -> PathBuf {
    let dir = std::env::var_os("HOSTLET_RUN_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/hostlet"));
    dir.join("agent.json")
}

/// What the pointer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPointer {
    pub data_dir: PathBuf,
    pub pid: u32,
}

impl RunPointer {
    /// The data dir of the agent that left the pointer, if that agent still runs.
    pub fn load() -> Option<RunPointer> {
        let bytes = std::fs::read(run_pointer()).ok()?;
        let p: RunPointer = serde_json::from_slice(&bytes).ok()?;
        Path::new(&format!("/proc/{}", p.pid)).exists().then_some(p)
    }

    /// Leaves the pointer for this process (directory 0700, file 0600: it names where the keys are), and
    /// its own entry under `agents/`, by which the CLI tells that more than one agent runs here.
    pub fn save(data_dir: &Path) -> std::io::Result<()> {
        let path = run_pointer();
        let dir = path.parent().unwrap_or(Path::new("/"));
        let me = RunPointer {
            data_dir: data_dir.to_path_buf(),
            pid: std::process::id(),
        };
        let bytes = serde_json::to_vec_pretty(&me).unwrap_or_default();
        write_private(&agents_dir(), &format!("{}.json", me.pid), &bytes)?;
        write_private(dir, "agent.json", &bytes)
    }

    /// Every agent running on this host that left its pointer, each data dir once.
    pub fn running() -> Vec<RunPointer> {
        let mut found: Vec<RunPointer> = std::fs::read_dir(agents_dir())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .filter_map(|b| serde_json::from_slice::<RunPointer>(&b).ok())
                    .filter(|p| Path::new(&format!("/proc/{}", p.pid)).exists())
                    .collect()
            })
            .unwrap_or_default();
        found.sort_by(|a, b| a.data_dir.cmp(&b.data_dir));
        found.dedup_by(|a, b| a.data_dir == b.data_dir);
        found
    }

    /// Leaves the pointer until the returned guard is dropped (the agent's stop).
    pub fn leave(data_dir: &Path) -> RunPointerGuard {
        if let Err(e) = Self::save(data_dir) {
            tracing::warn!(error = %e, "cannot write {}", run_pointer().display());
        }
        RunPointerGuard
    }

    /// Removes the pointer if it is still this process's (another agent may have left its own since).
    fn remove_own() {
        let _ = std::fs::remove_file(agents_dir().join(format!("{}.json", std::process::id())));
        let path = run_pointer();
        let ours = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<RunPointer>(&b).ok())
            .is_some_and(|p| p.pid == std::process::id());
        if ours {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where each running agent leaves an entry of its own: `agents/<pid>.json` beside the pointer.
fn agents_dir() -> PathBuf {
    run_pointer()
        .parent()
        .unwrap_or(Path::new("/"))
        .join("agents")
}

/// Writes `dir/name` whole (a temp file renamed), 0600 in a 0700 directory.
fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, bytes)?;
    std::fs::rename(tmp, dir.join(name))
}

/// Removes this agent's run pointer when dropped.
pub struct RunPointerGuard;

impl Drop for RunPointerGuard {
    fn drop(&mut self) {
        RunPointer::remove_own();
    }
}

impl AgentInfo {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("agent.json")
    }

    pub fn load(data_dir: &Path) -> Option<AgentInfo> {
        let bytes = std::fs::read(Self::path(data_dir)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes the file atomically (temp file + rename).
    pub fn save(&self, data_dir: &Path) -> std::io::Result<()> {
        let path = Self::path(data_dir);
        let tmp = data_dir.join(".agent.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).unwrap_or_default())?;
        std::fs::rename(tmp, path)
    }
}

/// With no `--data-dir` and more than one agent running on this host, says once which one the CLI
/// talks to and how to pick another: a write must not land on a node the operator did not mean.
fn warn_if_others_run(chosen: &Path, running: Vec<RunPointer>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let others: Vec<String> = running
            .into_iter()
            .filter(|p| p.data_dir != chosen)
            .map(|p| agent_label(&p.data_dir))
            .collect();
        if !others.is_empty() {
            eprintln!(
                "warning: {} hostlet agents run on this host; this command uses {}, not {}; pick one with --data-dir or HOSTLET_DATA_DIR",
                others.len() + 1,
                agent_label(chosen),
                others.join(", ")
            );
        }
    });
}

/// A data dir and, when its agent says, the node it runs as.
fn agent_label(data_dir: &Path) -> String {
    match AgentInfo::load(data_dir) {
        Some(a) => format!("{} (node {})", data_dir.display(), a.node),
        None => data_dir.display().to_string(),
    }
}

/// Why the CLI beside a worker does not reach etcd.
pub const WORKER_HAS_NO_ETCD: &str = "this host is a worker: it reaches the cluster through the voters' node API, for its own node alone, and no certificate it holds opens etcd. Run the command on a voter, or with an admin certificate (hostlet cert admin --out DIR on a voter; then --etcd-endpoints with --etcd-ca-file, --etcd-cert-file and --etcd-key-file)";

/// Flags every etcd-backed subcommand takes.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// The local agent's data dir: endpoints, client certificate and node name are read from it (default:
    /// the running agent's, found through /run/hostlet/agent.json, else /var/lib/hostlet).
    #[arg(
        long,
        env = "HOSTLET_DATA_DIR",
        global = true,
        value_parser = crate::paths::absolute
    )]
    pub data_dir: Option<PathBuf>,
    /// etcd endpoints (instead of the local agent's).
    #[arg(
        long,
        env = "HOSTLET_ETCD_ENDPOINTS",
        value_delimiter = ',',
        global = true
    )]
    pub etcd_endpoints: Vec<String>,
    /// CA certificate for --etcd-endpoints (the three TLS flags go together).
    #[arg(long, env = "HOSTLET_ETCD_CA_FILE", global = true, value_parser = crate::paths::absolute)]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate for --etcd-endpoints.
    #[arg(long, env = "HOSTLET_ETCD_CERT_FILE", global = true, value_parser = crate::paths::absolute)]
    pub etcd_cert_file: Option<PathBuf>,
    /// Client key for --etcd-endpoints.
    #[arg(long, env = "HOSTLET_ETCD_KEY_FILE", global = true, value_parser = crate::paths::absolute)]
    pub etcd_key_file: Option<PathBuf>,
    /// Key prefix (default: the local agent's, else /hostlet).
    #[arg(long, env = "HOSTLET_KEY_PREFIX", global = true)]
    pub key_prefix: Option<String>,
    /// The node to act on (default: the local agent's node, else the hostname).
    #[arg(long, global = true)]
    pub node: Option<String>,
    /// Output format: table, wide (more columns: pod ls, node ls), json or yaml.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "table",
        global = true
    )]
    pub output: Output,
}

/// The data dir of a host's agent when none is given.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/hostlet";

impl ClusterArgs {
    /// `--data-dir` when given; else the running agent's (its pointer), else the default.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(d) = &self.data_dir {
            return d.clone();
        }
        let default = PathBuf::from(DEFAULT_DATA_DIR);
        let running = RunPointer::running();
        let chosen = if AgentInfo::path(&default).exists() {
            default
        } else if let Some(p) = RunPointer::load() {
            p.data_dir
        } else if let Some(p) = running.first() {
            // The agent started last has stopped: one still running is found by its own entry.
            p.data_dir.clone()
        } else {
            default
        };
        warn_if_others_run(&chosen, running);
        chosen
    }

    fn agent(&self) -> Option<AgentInfo> {
        AgentInfo::load(&self.data_dir())
    }

    pub fn node(&self) -> String {
        self.node
            .clone()
            .or_else(|| self.agent().map(|a| a.node))
            .unwrap_or_else(crate::config::hostname)
    }

    pub fn keys(&self) -> KeyLayout {
        let prefix = self
            .key_prefix
            .clone()
            .or_else(|| self.agent().map(|a| a.key_prefix))
            .unwrap_or_else(|| hostlet_api::keys::DEFAULT_PREFIX.to_string());
        KeyLayout::new(&prefix)
    }

    /// The etcd client configuration: explicit flags first, then the local agent's files.
    pub fn etcd_config(&self) -> Result<EtcdConfig, String> {
        let explicit_tls = match (
            &self.etcd_ca_file,
            &self.etcd_cert_file,
            &self.etcd_key_file,
        ) {
            (Some(ca), Some(cert), Some(key)) => Some(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None, None) => None,
            _ => {
                return Err(
                    "--etcd-ca-file, --etcd-cert-file and --etcd-key-file go together".into(),
                )
            }
        };
        let tls_dir = MemberLayout::new(self.data_dir()).tls();
        let local_tls = || TlsFiles {
            ca: tls_dir.ca_cert(),
            cert: tls_dir.cert(CertRole::Client),
            key: tls_dir.key(CertRole::Client),
        };
        if !self.etcd_endpoints.is_empty() {
            let mut cfg = EtcdConfig::new(self.etcd_endpoints.clone());
            if let Some(t) = explicit_tls {
                cfg = cfg.with_tls(t);
            } else if self
                .etcd_endpoints
                .iter()
                .any(|e| e.starts_with("https://"))
            {
                cfg = cfg.with_tls(local_tls());
            }
            return Ok(cfg);
        }
        let Some(agent) = self.agent() else {
            let looked = match &self.data_dir {
                Some(d) => format!("in {} (no agent.json there)", d.display()),
                None => format!(
                    "in {DEFAULT_DATA_DIR} nor through {} (no running agent left its data dir there)",
                    run_pointer().display()
                ),
            };
            return Err(format!(
                "no running agent found {looked}; give --data-dir of the local agent or --etcd-endpoints"
            ));
        };
        let layout = MemberLayout::new(self.data_dir());
        if explicit_tls.is_none()
            && agent.tls
            && hostlet_controllers::etcd_member::worker::is_worker(&layout)
        {
            return Err(WORKER_HAS_NO_ETCD.to_string());
        }
        let mut cfg = EtcdConfig::new(agent.endpoints.clone());
        if let Some(t) = explicit_tls {
            cfg = cfg.with_tls(t);
        } else if agent.tls {
            cfg = cfg.with_tls(local_tls());
        }
        Ok(cfg)
    }

    /// Beside a worker (its data dir, no etcd flags given): a client of the voters' node API with the
    /// worker's certificate, which reads what that node may read. `None` elsewhere.
    pub fn worker_node_api(
        &self,
    ) -> Option<Result<hostlet_runtime::nodeapi::NodeApiClient, crate::cli::exit::CliError>> {
        if !self.etcd_endpoints.is_empty() || self.etcd_cert_file.is_some() {
            return None;
        }
        let layout = MemberLayout::new(self.data_dir());
        let agent = self.agent()?;
        if !agent.tls || !hostlet_controllers::etcd_member::worker::is_worker(&layout) {
            return None;
        }
        let voters = hostlet_controllers::etcd_member::worker::read_voters(&layout);
        let files = hostlet_controllers::pki::client_tls_files(&layout.tls());
        Some(
            hostlet_runtime::nodeapi::NodeApiClient::from_files(&files, voters)
                .map_err(crate::cli::exit::CliError::from),
        )
    }

    /// Connects, giving up after a short while with a message that names the endpoints.
    pub async fn connect(&self) -> Result<Etcd, crate::cli::exit::CliError> {
        use crate::cli::exit::CliError;
        // No endpoints given and no agent found: there is nothing to reach.
        let mut cfg = self.etcd_config().map_err(|m| {
            if self.etcd_endpoints.is_empty() && self.agent().is_none() {
                CliError::unreachable(m)
            } else {
                CliError::from(m)
            }
        })?;
        cfg.connect_timeout = Duration::from_secs(5);
        let shown = cfg.endpoints.join(",");
        let etcd = Etcd::connect(cfg)
            .await
            .map_err(|e| CliError::from(e).context(format!("connecting to etcd at {shown}")))?;
        Ok(etcd)
    }
}

/// Column widths of a table, so that lines printed later (`--watch`) line up with the first ones.
pub struct Table {
    widths: Vec<usize>,
}

impl Table {
    /// Widths that fit the header and `rows`.
    pub fn new(header: &[&str], rows: &[Vec<String>]) -> Table {
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for r in rows {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        Table { widths }
    }

    /// At least `min` wide per column (a watch that starts empty still lines up).
    #[must_use]
    pub fn at_least(mut self, min: &[usize]) -> Table {
        for (w, m) in self.widths.iter_mut().zip(min) {
            *w = (*w).max(*m);
        }
        self
    }

    /// Prints `header` and `rows` as a table that fits them.
    pub fn print(header: &[&str], rows: &[Vec<String>]) {
        let table = Table::new(header, rows);
        let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
        println!("{}", table.line(&head));
        for r in rows {
            println!("{}", table.line(r));
        }
    }

    /// One line: every cell but the last padded to its column's width.
    pub fn line(&self, cells: &[String]) -> String {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                let w = self.widths.get(i).copied().unwrap_or(0);
                out.push_str(&format!("{c:<w$}   "));
            }
        }
        out.trim_end().to_string()
    }
}

/// Prints rows as a table with a header, columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let table = Table::new(header, rows);
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    println!("{}", table.line(&header));
    for r in rows {
        println!("{}", table.line(r));
    }
}

/// Prints a value as JSON or YAML. The YAML is of the same data as the JSON: through a JSON value, so
/// that an enum (a container's `state`) is a plain mapping, not a YAML tag such as `!running`.
pub fn print_structured<T: Serialize>(value: &T, output: Output) {
    match output {
        Output::Yaml => print!(
            "{}",
            serde_json::to_value(value)
                .ok()
                .and_then(|v| yaml_serde::to_string(&v).ok())
                .unwrap_or_default()
        ),
        _ => println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        ),
    }
}

/// A size for people: `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    hostlet_controllers::members::table::human_size(n)
}
