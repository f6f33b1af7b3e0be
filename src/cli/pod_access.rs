//! `hostlet pod logs` and `hostlet pod exec`: the pod's node is found in etcd (its pod key or status), and
//! that node's agent API serves the request, as the kubelet serves `kubectl logs` and `kubectl exec`. The
//! CLI proves itself with a client certificate (the node's own from the data dir, or an admin's); only an
//! agent serving plain HTTP gets the cluster token, read from the data dir, never from the command line.

use std::process::ExitCode;
use std::time::Duration;

use hostlet_api::objects::NodeInfo;
use hostlet_controllers::etcd_member::layout::MemberLayout;
use hostlet_controllers::pki::ClusterToken;
use hostlet_controllers::pods::access::{Frame, EXEC_PROTOCOL};
use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;

use super::cluster::ClusterArgs;
use super::exit::CliError;

/// A node's agent API, with the cluster's CA and the CLI's credential: a client certificate (a voter's,
/// an admin's, or beside a worker the worker's own) over TLS, so that no token goes to another node's
/// agent; the cluster token only to an agent that serves plain HTTP (`--etcd-insecure` clusters).
struct NodeApi {
    node: String,
    base: String,
    http: reqwest::Client,
    token: Option<ClusterToken>,
}

/// Beside a worker (its data dir, no etcd flags): the worker reads no etcd, and may use only its own
/// agent, so `pod logs` and `pod exec` there are for its own pods. Its node, or `None` elsewhere.
pub fn beside_worker(cluster: &ClusterArgs) -> Option<String> {
    cluster.worker_node_api().map(|_| cluster.node())
}

/// Finds the node running `pod` among `nodes` (those that have it) and how to reach its agent.
async fn locate(cluster: &ClusterArgs, pod: &str, nodes: &[String]) -> Result<NodeApi, CliError> {
    let node = match nodes {
        [] => return Err(CliError::not_found(format!("no pod {pod} on any node"))),
        [one] => one.clone(),
        many => match &cluster.node {
            Some(n) if many.contains(n) => n.clone(),
            _ => {
                return Err(CliError::refused(format!(
                    "pod {pod} is on nodes {}: name one with --node",
                    many.join(", ")
                )))
            }
        },
    };
    let layout = MemberLayout::new(cluster.data_dir());
    let base = match beside_worker(cluster) {
        // The worker's own agent, as the agent itself says where it listens.
        Some(own) => super::cluster::AgentInfo::load(&cluster.data_dir())
            .and_then(|a| a.api_url)
            .filter(|u| !u.is_empty() && own == node)
            .ok_or_else(|| {
                CliError::not_found(format!(
                    "node {own}'s agent left no API address in {}",
                    cluster.data_dir().display()
                ))
            })?,
        None => {
            let etcd = cluster.connect().await?;
            let record = etcd.get(cluster.keys().node(&node)).await?.ok_or_else(|| {
                CliError::not_found(format!("node {node} (of pod {pod}) has no node record"))
            })?;
            let info: NodeInfo = serde_json::from_slice(record.value())
                .map_err(|e| format!("the node record of {node}: {e}"))?;
            info.api_url.filter(|u| !u.is_empty()).ok_or_else(|| {
                CliError::not_found(format!(
                    "node {node} (of pod {pod}) publishes no API address in its node record"
                ))
            })?
        }
    };
    let mut http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .http1_only();
    let mut token = None;
    if base.starts_with("https://") {
        // An admin's certificate where given, else this node's own.
        let files = match (
            &cluster.etcd_ca_file,
            &cluster.etcd_cert_file,
            &cluster.etcd_key_file,
        ) {
            (Some(ca), Some(cert), Some(key)) => hostlet_runtime::TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => hostlet_controllers::pki::client_tls_files(&layout.tls()),
        };
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                CliError::refused(format!(
                    "{what} {}: {e} (pod logs and exec need a cluster node's data dir, --data-dir, or an admin certificate)",
                    path.display()
                ))
            })
        };
        let ca = read(&files.ca, "the cluster CA")?;
        let ca = reqwest::Certificate::from_pem(&ca)
            .map_err(|e| format!("the cluster CA {}: {e}", files.ca.display()))?;
        let mut pem = read(&files.cert, "the client certificate")?;
        pem.push(b'\n');
        pem.extend(read(&files.key, "the client key")?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            format!(
                "the client certificate {} and key {}: {e}",
                files.cert.display(),
                files.key.display()
            )
        })?;
        http = http
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .identity(identity);
    } else {
        let token_file = layout.token_file();
        let t = std::fs::read_to_string(&token_file)
            .map_err(|e| {
                CliError::refused(format!(
                    "the cluster token {}: {e} (pod logs and exec need a cluster node's data dir, --data-dir)",
                    token_file.display()
                ))
            })
            .and_then(|t| {
                ClusterToken::parse(&t)
                    .map_err(|e| CliError::refused(format!("{}: {e}", token_file.display())))
            })?;
        token = Some(t);
    }
    Ok(NodeApi {
        node,
        base: base.trim_end_matches('/').to_string(),
        http: http.build().map_err(|e| e.to_string())?,
        token,
    })
}

impl NodeApi {
    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.get(format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t.to_string()),
            None => req,
        }
    }

    /// Sends a request; an answer other than `ok` becomes the agent's message with a fitting exit code.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        ok: StatusCode,
    ) -> Result<reqwest::Response, CliError> {
        let resp = req.send().await.map_err(|e| {
            CliError::unreachable(format!(
                "the agent of node {} at {} does not answer: {e}",
                self.node, self.base
            ))
        })?;
        if resp.status() == ok {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let text = text.trim();
        Err(match status {
            StatusCode::NOT_FOUND => CliError::not_found(text.to_string()),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => CliError::refused(format!(
                "the agent of node {} refused the {}: {text}",
                self.node,
                if self.token.is_some() {
                    "cluster token"
                } else {
                    "client certificate"
                }
            )),
            StatusCode::CONFLICT | StatusCode::BAD_REQUEST => CliError::refused(text.to_string()),
            _ => CliError::from(format!("the agent of node {}: {status}: {text}", self.node)),
        })
    }
}

/// What `pod logs` asks for.
pub struct LogsArgs {
    pub container: Option<String>,
    pub follow: bool,
    pub previous: bool,
    pub tail: Option<u64>,
    pub since: Option<Duration>,
    pub timestamps: bool,
}

/// `nodes`: the nodes that have the pod.
pub async fn logs(
    pod: &str,
    nodes: &[String],
    args: &LogsArgs,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let api = locate(cluster, pod, nodes).await?;
    let mut query: Vec<(&str, String)> = vec![
        ("follow", args.follow.to_string()),
        ("previous", args.previous.to_string()),
        ("timestamps", args.timestamps.to_string()),
    ];
    if let Some(c) = &args.container {
        query.push(("container", c.clone()));
    }
    if let Some(n) = args.tail {
        query.push(("tail", n.to_string()));
    }
    if let Some(d) = args.since {
        query.push(("since_seconds", d.as_secs().max(1).to_string()));
    }
    let req = api.get(&format!("/pods/{pod}/logs")).query(&query);
    let mut resp = api.send(req, StatusCode::OK).await?;
    // Written straight from each chunk: one write for the many lines a chunk holds.
    let stdout = std::io::stdout();
    loop {
        match resp.chunk().await {
            Ok(Some(b)) => {
                use std::io::Write;
                let mut out = stdout.lock();
                if out.write_all(&b).is_err() || out.flush().is_err() {
                    // The reader went away (`| head`): nothing more to do.
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Err(e) => {
                return Err(CliError::unreachable(format!(
                    "the log stream from node {} broke: {e}",
                    api.node
                )))
            }
        }
    }
}

/// What `pod exec` asks for.
pub struct ExecArgs {
    pub container: Option<String>,
    pub stdin: bool,
    pub tty: bool,
    pub command: Vec<String>,
}

/// The local terminal in raw mode for as long as this lives (a TTY exec), restored on drop.
struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    fn enter() -> Option<RawMode> {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a termios we own; failure leaves the terminal as it was.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return None;
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return None;
            }
            Some(RawMode { saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `enter`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

/// The size of the terminal on stdout (else stdin), if there is one.
fn terminal_size() -> Option<(u16, u16)> {
    for fd in [1, 0] {
        // SAFETY: TIOCGWINSZ fills a winsize we own.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            return Some((ws.ws_col, ws.ws_row));
        }
    }
    None
}

/// `nodes`: the nodes that have the pod.
pub async fn exec(
    pod: &str,
    nodes: &[String],
    args: &ExecArgs,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let api = locate(cluster, pod, nodes).await?;
    let command = serde_json::to_string(&args.command).map_err(|e| e.to_string())?;
    let mut query: Vec<(&str, String)> = vec![
        ("command", command),
        ("stdin", args.stdin.to_string()),
        ("tty", args.tty.to_string()),
    ];
    if let Some(c) = &args.container {
        query.push(("container", c.clone()));
    }
    let req = api
        .get(&format!("/pods/{pod}/exec"))
        .query(&query)
        .header(reqwest::header::CONNECTION, "upgrade")
        .header(reqwest::header::UPGRADE, EXEC_PROTOCOL);
    let resp = api.send(req, StatusCode::SWITCHING_PROTOCOLS).await?;
    let upgraded = resp.upgrade().await.map_err(|e| {
        CliError::unreachable(format!(
            "exec on node {}: the upgrade failed: {e}",
            api.node
        ))
    })?;
    let (mut rd, mut wr) = tokio::io::split(upgraded);

    // One writer for the agent: stdin and terminal sizes go through this channel.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if f.write(&mut wr).await.is_err() {
                break;
            }
        }
    });
    let raw = if args.tty { RawMode::enter() } else { None };
    if args.tty {
        if let Some((cols, rows)) = terminal_size() {
            let _ = tx.send(Frame::Resize { cols, rows }).await;
        }
        let tx = tx.clone();
        if let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        {
            tokio::spawn(async move {
                while winch.recv().await.is_some() {
                    if let Some((cols, rows)) = terminal_size() {
                        if tx.send(Frame::Resize { cols, rows }).await.is_err() {
                            break;
                        }
                    }
                }
            });
        }
    }
    if args.stdin {
        // A plain thread: a blocked read of the terminal must not keep the runtime from ending.
        let tx = tx.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut input = std::io::stdin().lock();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.blocking_send(Frame::StdinEnd);
                        break;
                    }
                    Ok(n) => {
                        if tx.blocking_send(Frame::Stdin(buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    drop(tx);
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let outcome = loop {
        match Frame::read(&mut rd).await {
            Ok(Some(Frame::Stdout(b))) => {
                let _ = stdout.write_all(&b).await;
                let _ = stdout.flush().await;
            }
            Ok(Some(Frame::Stderr(b))) => {
                let _ = stderr.write_all(&b).await;
                let _ = stderr.flush().await;
            }
            Ok(Some(Frame::Exit(code))) => break Ok(code),
            Ok(Some(Frame::Error(m))) => break Err(CliError::from(m)),
            Ok(Some(_)) => continue,
            Ok(None) => {
                break Err(CliError::unreachable(format!(
                    "exec on node {}: the agent closed the connection before the command ended",
                    api.node
                )))
            }
            Err(e) => {
                break Err(CliError::unreachable(format!(
                    "exec on node {}: {e}",
                    api.node
                )))
            }
        }
    };
    drop(raw);
    writer.abort();
    let code = outcome?;
    // Exit codes beyond a byte wrap as a shell shows them.
    Ok(ExitCode::from((code & 0xff) as u8))
}
