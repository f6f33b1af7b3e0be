//! `GET /pods/{id}/logs` and `GET /pods/{id}/exec`: what `hostlet pod logs` and `hostlet pod exec` ask of the
//! node that runs the pod, as `kubectl` asks the kubelet. The agent's server puts both behind the cluster
//! token.
//!
//! Logs are a plain streamed body. Exec is an HTTP/1.1 upgrade (`Upgrade: hostlet-exec`, as Docker's own
//! attach hijacks its connection); after the `101` both sides speak [frames](Frame): stdin, its end and
//! terminal sizes one way, stdout, stderr and the exit code the other.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::StreamExt;
use hostlet_api::naming::INFRA_CONTAINER_NAME;
use hostlet_api::routes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::controller::PodsHandle;
use super::docker::{DockerRuntime, ExecOutput, LogQuery};
use super::runtime::ContainerInfo;
use super::spec;

/// The `Upgrade` protocol name of an exec connection.
pub const EXEC_PROTOCOL: &str = "hostlet-exec";

/// The largest frame either side sends or accepts.
pub const MAX_FRAME: usize = 1 << 20;

/// One message of an exec connection: a kind byte, a 4-byte big-endian length, the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client → agent: bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// Client → agent: stdin has ended.
    StdinEnd,
    /// Client → agent: the terminal is this many columns and rows.
    Resize {
        cols: u16,
        rows: u16,
    },
    /// Agent → client.
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Agent → client, last: the command's exit code.
    Exit(i64),
    /// Agent → client, last: the exec could not run.
    Error(String),
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, Vec<u8>) = match self {
            Frame::Stdin(b) => (0, b.clone()),
            Frame::StdinEnd => (1, Vec::new()),
            Frame::Resize { cols, rows } => {
                let mut p = cols.to_be_bytes().to_vec();
                p.extend_from_slice(&rows.to_be_bytes());
                (2, p)
            }
            Frame::Stdout(b) => (3, b.clone()),
            Frame::Stderr(b) => (4, b.clone()),
            Frame::Exit(c) => (5, c.to_be_bytes().to_vec()),
            Frame::Error(m) => (6, m.as_bytes().to_vec()),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Reads one frame; `Ok(None)` at a clean end of the stream.
    pub async fn read<Rd: AsyncRead + Unpin>(r: &mut Rd) -> std::io::Result<Option<Frame>> {
        let mut head = [0u8; 5];
        match r.read_exact(&mut head[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        r.read_exact(&mut head[1..]).await?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_FRAME {
            return Err(bad(format!("a frame of {len} bytes (at most {MAX_FRAME})")));
        }
        let mut p = vec![0u8; len];
        r.read_exact(&mut p).await?;
        Frame::decode(head[0], p).map(Some)
    }

    fn decode(kind: u8, p: Vec<u8>) -> std::io::Result<Frame> {
        Ok(match kind {
            0 => Frame::Stdin(p),
            1 => Frame::StdinEnd,
            2 if p.len() == 4 => Frame::Resize {
                cols: u16::from_be_bytes([p[0], p[1]]),
                rows: u16::from_be_bytes([p[2], p[3]]),
            },
            3 => Frame::Stdout(p),
            4 => Frame::Stderr(p),
            5 if p.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&p);
                Frame::Exit(i64::from_be_bytes(b))
            }
            6 => Frame::Error(String::from_utf8_lossy(&p).into_owned()),
            k => {
                return Err(bad(format!(
                    "an unknown frame (kind {k}, {} bytes)",
                    p.len()
                )))
            }
        })
    }

    pub async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.encode()).await?;
        w.flush().await
    }
}

fn bad(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// The logs and exec routes, on a Docker-backed pod controller.
pub fn router(handle: PodsHandle<DockerRuntime>) -> Router {
    let r = crate::routes::serve(Router::new(), &routes::POD_LOGS, logs);
    crate::routes::serve(r, &routes::POD_EXEC, exec).with_state(handle)
}

/// Why a logs or exec request names nothing that can serve it.
#[derive(Debug, thiserror::Error)]
enum Missing {
    #[error("no pod {pod} on node {node}")]
    Pod { pod: String, node: String },
    #[error("pod {pod} has no container {container}; it has: {}", has.join(", "))]
    Container {
        pod: String,
        container: String,
        has: Vec<String>,
    },
    #[error("container {container} of pod {pod} has not been created yet")]
    NotCreated { pod: String, container: String },
    #[error("container {container} of pod {pod} is not running")]
    NotRunning { pod: String, container: String },
    #[error("container {container} of pod {pod} has no previous instance")]
    NoPrevious { pod: String, container: String },
}

impl IntoResponse for Missing {
    fn into_response(self) -> Response {
        let code = match self {
            Missing::NotRunning { .. } => StatusCode::CONFLICT,
            _ => StatusCode::NOT_FOUND,
        };
        (code, format!("{self}\n")).into_response()
    }
}

/// The container a request names: `container`, else the pod's first; the infra container by its name.
fn target(
    h: &PodsHandle<DockerRuntime>,
    pod: &str,
    container: Option<&str>,
) -> Result<(String, Option<ContainerInfo>), Missing> {
    let Some(names) = h.container_names(pod) else {
        return Err(Missing::Pod {
            pod: pod.into(),
            node: h.node().into(),
        });
    };
    let name = match container {
        Some(c) if c == INFRA_CONTAINER_NAME || names.iter().any(|n| n == c) => c.to_string(),
        Some(c) => {
            return Err(Missing::Container {
                pod: pod.into(),
                container: c.into(),
                has: names,
            })
        }
        None => match names.first() {
            Some(n) => n.clone(),
            None => {
                return Err(Missing::Container {
                    pod: pod.into(),
                    container: String::new(),
                    has: names,
                })
            }
        },
    };
    let info = if name == INFRA_CONTAINER_NAME {
        h.observed().pod(pod).infra().cloned()
    } else {
        h.current_container(pod, &name)
    };
    Ok((name, info))
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct LogParams {
    container: Option<String>,
    previous: bool,
    follow: bool,
    tail: Option<u64>,
    since_seconds: Option<u64>,
    timestamps: bool,
}

async fn logs(
    State(h): State<PodsHandle<DockerRuntime>>,
    Path(pod): Path<String>,
    Query(p): Query<LogParams>,
) -> Response {
    let query = LogQuery {
        follow: p.follow,
        tail: p.tail,
        since_seconds: p.since_seconds,
        timestamps: p.timestamps,
    };
    let (name, info) = match target(&h, &pod, p.container.as_deref()) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    if p.previous {
        let path = spec::previous_log_path(h.data_dir(), &pod, &name);
        return match tokio::fs::read(&path).await {
            Ok(saved) => text(Body::from(previous_lines(
                &saved,
                &query,
                std::time::SystemTime::now(),
            ))),
            Err(_) => Missing::NoPrevious {
                pod,
                container: name,
            }
            .into_response(),
        };
    }
    let Some(info) = info else {
        return Missing::NotCreated {
            pod,
            container: name,
        }
        .into_response();
    };
    let mut stream = h.runtime().logs(&info.id, &query);
    // The first chunk is awaited before answering, so that an engine error is an HTTP error.
    let first = match stream.next().await {
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => {
            return (StatusCode::BAD_GATEWAY, format!("docker logs: {e}\n")).into_response()
        }
        None => None,
    };
    // Docker hands out one entry (a line) at a time: what is ready is sent as one chunk.
    let body = futures::stream::iter(first.map(Ok))
        .chain(stream)
        .ready_chunks(1024)
        .flat_map(|batch| {
            let mut out = Vec::new();
            let mut buf = bytes::BytesMut::new();
            for r in batch {
                match r {
                    Ok(b) => buf.extend_from_slice(&b),
                    Err(e) => {
                        if !buf.is_empty() {
                            out.push(Ok(buf.split().freeze()));
                        }
                        out.push(Err(e));
                    }
                }
            }
            if !buf.is_empty() {
                out.push(Ok(buf.freeze()));
            }
            futures::stream::iter(out)
        });
    text(Body::from_stream(body))
}

fn text(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The saved output of a previous instance (each line led by its RFC 3339 time), filtered by `since` and
/// `tail`, the times kept only when asked for.
pub fn previous_lines(saved: &[u8], q: &LogQuery, now: std::time::SystemTime) -> Vec<u8> {
    let cutoff = q.since_seconds.map(|s| now - Duration::from_secs(s));
    let mut lines: Vec<&[u8]> = saved
        .split_inclusive(|b| *b == b'\n')
        .filter(|line| {
            let Some(cutoff) = cutoff else { return true };
            let stamp = line.split(|b| *b == b' ').next().unwrap_or_default();
            std::str::from_utf8(stamp)
                .ok()
                .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
                .is_none_or(|t| t >= cutoff)
        })
        .collect();
    if let Some(n) = q.tail {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let mut out = Vec::new();
    for line in lines {
        if q.timestamps {
            out.extend_from_slice(line);
        } else {
            let at = line.iter().position(|b| *b == b' ').map_or(0, |p| p + 1);
            out.extend_from_slice(&line[at..]);
        }
    }
    out
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct ExecParams {
    container: Option<String>,
    /// The command as a JSON array of strings.
    command: String,
    stdin: bool,
    tty: bool,
}

async fn exec(
    State(h): State<PodsHandle<DockerRuntime>>,
    Path(pod): Path<String>,
    Query(p): Query<ExecParams>,
    mut req: Request,
) -> Response {
    let command: Vec<String> = match serde_json::from_str(&p.command) {
        Ok(c) => c,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("command: expected a JSON array of strings: {e}\n"),
            )
                .into_response()
        }
    };
    if command.is_empty() {
        return (StatusCode::BAD_REQUEST, "command: empty\n").into_response();
    }
    let wants_upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(EXEC_PROTOCOL));
    if !wants_upgrade {
        return (
            StatusCode::UPGRADE_REQUIRED,
            [(header::UPGRADE, EXEC_PROTOCOL)],
            format!("exec needs `Connection: upgrade` and `Upgrade: {EXEC_PROTOCOL}`\n"),
        )
            .into_response();
    }
    let (name, info) = match target(&h, &pod, p.container.as_deref()) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Some(info) = info.filter(|c| c.state.is_running()) else {
        return Missing::NotRunning {
            pod,
            container: name,
        }
        .into_response();
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let rt = h.runtime().clone();
    tokio::spawn(async move {
        let io = match upgrade.await {
            Ok(u) => hyper_util::rt::TokioIo::new(u),
            Err(e) => {
                tracing::debug!(pod, error = %e, "exec: the upgrade failed");
                return;
            }
        };
        let (mut rd, mut wr) = tokio::io::split(io);
        let last = match rt.exec_attached(&info.id, command, p.stdin, p.tty).await {
            Ok(session) => run_exec(&rt, session, &mut rd, &mut wr).await,
            Err(e) => Frame::Error(format!("docker exec: {e}")),
        };
        let _ = last.write(&mut wr).await;
        let _ = wr.shutdown().await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, EXEC_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default()
}

/// Pumps frames between the client and the exec until the command's output ends; returns the last frame
/// (its exit code, or why there is none).
async fn run_exec<Rd, W>(
    rt: &DockerRuntime,
    session: super::docker::ExecSession,
    rd: &mut Rd,
    wr: &mut W,
) -> Frame
where
    Rd: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let super::docker::ExecSession {
        id,
        mut output,
        mut input,
    } = session;
    let exec_id = id.clone();
    let inbound = async {
        // Client frames until the client closes its side; input errors only end the input.
        loop {
            match Frame::read(rd).await {
                Ok(Some(Frame::Stdin(b))) => {
                    if input.write_all(&b).await.is_err() || input.flush().await.is_err() {
                        break;
                    }
                }
                Ok(Some(Frame::StdinEnd)) => {
                    let _ = input.shutdown().await;
                }
                Ok(Some(Frame::Resize { cols, rows })) => {
                    if let Err(e) = rt.resize_exec(&exec_id, cols, rows).await {
                        tracing::debug!(error = %e, "exec: resize failed");
                    }
                }
                // The client is gone: the command's stdin ends, so that a shell waiting on it exits.
                Ok(Some(_)) | Ok(None) | Err(_) => {
                    let _ = input.shutdown().await;
                    break;
                }
            }
        }
        // Keep waiting: the output decides when the exec is over.
        std::future::pending::<()>().await;
    };
    let outbound = async {
        while let Some(chunk) = output.next().await {
            let frame = match chunk {
                Ok(ExecOutput::Stdout(b)) => Frame::Stdout(b.to_vec()),
                Ok(ExecOutput::Stderr(b)) => Frame::Stderr(b.to_vec()),
                Err(e) => return Some(Frame::Error(format!("docker exec output: {e}"))),
            };
            if frame.write(wr).await.is_err() {
                return None;
            }
        }
        None
    };
    let ended = tokio::select! {
        _ = inbound => None,
        r = outbound => r,
    };
    if let Some(f) = ended {
        return f;
    }
    // The output ends when the process does; the engine may take a moment to record the code.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match rt.exec_exit_code(&id).await {
            Ok(Some(code)) => return Frame::Exit(code),
            Ok(None) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(None) => return Frame::Error("the exec's output ended while it still runs".into()),
            Err(e) => return Frame::Error(format!("docker exec inspect: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[tokio::test]
    async fn frames_round_trip() {
        let frames = vec![
            Frame::Stdin(b"ls\n".to_vec()),
            Frame::StdinEnd,
            Frame::Resize { cols: 80, rows: 24 },
            Frame::Stdout(b"hi\n".to_vec()),
            Frame::Stderr(vec![]),
            Frame::Exit(-3),
            Frame::Error("boom".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut r = bytes.as_slice();
        for f in &frames {
            assert_eq!(Frame::read(&mut r).await.unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read(&mut r).await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_and_unknown_frames_are_refused() {
        let mut big = vec![3u8];
        big.extend_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert!(Frame::read(&mut big.as_slice()).await.is_err());
        let unknown = [9u8, 0, 0, 0, 0];
        assert!(Frame::read(&mut unknown.as_slice()).await.is_err());
        let short_resize = [2u8, 0, 0, 0, 1, 7];
        assert!(Frame::read(&mut short_resize.as_slice()).await.is_err());
    }

    #[test]
    fn previous_lines_filter_by_time_and_tail() {
        let saved = b"2026-01-01T00:00:00.000000001Z one\n\
2026-01-01T00:00:10.5Z two\n\
2026-01-01T00:00:20Z three\n\
2026-01-01T00:00:30Z four\n";
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_635); // 2026-01-01T00:00:35Z
        let all = LogQuery::default();
        assert_eq!(
            previous_lines(saved, &all, now),
            b"one\ntwo\nthree\nfour\n".to_vec()
        );
        let tail = LogQuery {
            tail: Some(2),
            ..LogQuery::default()
        };
        assert_eq!(previous_lines(saved, &tail, now), b"three\nfour\n".to_vec());
        let since = LogQuery {
            since_seconds: Some(20),
            timestamps: true,
            ..LogQuery::default()
        };
        assert_eq!(
            previous_lines(saved, &since, now),
            b"2026-01-01T00:00:20Z three\n2026-01-01T00:00:30Z four\n".to_vec()
        );
        let none = LogQuery {
            tail: Some(0),
            ..LogQuery::default()
        };
        assert!(previous_lines(saved, &none, now).is_empty());
    }
}
