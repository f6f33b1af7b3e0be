//! `hostlet pod logs` and `hostlet pod exec`: the pod's node is found in etcd (its pod key or status), and
//! that node's agent API serves the request, as the kubelet serves `kubectl logs` and `kubectl exec`. The
//! cluster token is read from the data dir and sent as a Bearer header, never taken from the command line.

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

/// A node's agent API, with the cluster's CA and token.
struct NodeApi {
    node: String,
    base: String,
    http: reqwest::Client,
    token: ClusterToken,
}

/// Finds the node running `pod` among `nodes` (those that have it) and how to reach its agent.
async fn locate(cluster: &ClusterArgs, pod: &str, nodes: &[String]) -> Result<NodeApi, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
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
    let record = etcd.get(keys.node(&node)).await?.ok_or_else(|| {
        CliError::not_found(format!("node {node} (of pod {pod}) has no node record"))
    })?;
    let info: NodeInfo = serde_json::from_slice(record.value())
        .map_err(|e| format!("the node record of {node}: {e}"))?;
    let Some(base) = info.api_url.filter(|u| !u.is_empty()) else {
        return Err(CliError::not_found(format!(
            "node {node} (of pod {pod}) publishes no API address in its node record"
        )));
    };
    let layout = MemberLayout::new(cluster.data_dir());
    let token_file = layout.token_file();
    let token = std::fs::read_to_string(&token_file)
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
    let mut http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .http1_only();
    if base.starts_with("https://") {
        let ca_file = layout.tls().ca_cert();
        let ca = std::fs::read(&ca_file)
            .map_err(|e| format!("the cluster CA {}: {e}", ca_file.display()))?;
        let ca = reqwest::Certificate::from_pem(&ca)
            .map_err(|e| format!("the cluster CA {}: {e}", ca_file.display()))?;
        http = http.tls_built_in_root_certs(false).add_root_certificate(ca);
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
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(self.token.to_string())
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
                "the agent of node {} refused the cluster token: {text}",
                self.node
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
