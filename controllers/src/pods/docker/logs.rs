//! A container's log as `pod logs` reads it: from the engine, or followed from the json-file files.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::{map_err, DockerRuntime};
use crate::pods::runtime::RuntimeError;

/// What `pod logs` asks of a container's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Keep streaming what the container prints next, across rotations (read from the json-file files).
    pub follow: bool,
    /// Only the last this many lines.
    pub tail: Option<u64>,
    /// Only lines printed in the last this many seconds.
    pub since_seconds: Option<u64>,
    /// Prefix each line with the time Docker received it (RFC 3339, nanoseconds).
    pub timestamps: bool,
}

/// The entries a followed log has passed on at its latest engine time, to tell a repeat from a new entry.
#[derive(Default)]
struct FollowedEntries {
    last: Option<SystemTime>,
    at_last: Vec<bytes::Bytes>,
}

impl FollowedEntries {
    /// Whether an entry stamped `stamp` (RFC 3339 with nanoseconds, as the engine writes it) with `line` is
    /// new: later than the last one passed on, or of the same time and not passed on yet. An entry whose
    /// time does not parse is passed on.
    fn first_time(&mut self, stamp: &str, line: &[u8]) -> bool {
        let Ok(t) = humantime::parse_rfc3339_weak(stamp) else {
            return true;
        };
        match self.last {
            Some(last) if t < last => false,
            Some(last) if t == last => {
                if self.at_last.iter().any(|l| l.as_ref() == line) {
                    return false;
                }
                self.at_last.push(bytes::Bytes::copy_from_slice(line));
                true
            }
            _ => {
                self.last = Some(t);
                self.at_last.clear();
                self.at_last.push(bytes::Bytes::copy_from_slice(line));
                true
            }
        }
    }
}

impl DockerRuntime {
    /// A container's output, stdout and stderr merged as they come.
    pub fn logs(
        &self,
        id: &str,
        q: &LogQuery,
    ) -> BoxStream<'static, Result<bytes::Bytes, RuntimeError>> {
        if q.follow {
            self.follow_log(id.to_string(), q)
        } else {
            self.engine_logs(id.to_string(), q)
        }
    }

    /// A container's output as the engine hands it out.
    fn engine_logs(
        &self,
        id: String,
        q: &LogQuery,
    ) -> BoxStream<'static, Result<bytes::Bytes, RuntimeError>> {
        let this = self.clone();
        let since = q
            .since_seconds
            .map(|s| SystemTime::now() - Duration::from_secs(s))
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX));
        let tail = q.tail.map_or_else(|| "all".to_string(), |n| n.to_string());
        let (follow, timestamps) = (q.follow, q.timestamps);
        // Docker's json-file reader can hand a line out twice when it follows a file that rotates; each
        // entry carries the time the engine took it, so a followed log asks for the times and drops an entry
        // older than the last one passed on, or one of that very time already passed on (two lines the
        // engine took in the same nanosecond are both kept).
        let stamped = timestamps || follow;
        let mut seen = FollowedEntries::default();
        let dedup = move |b: bytes::Bytes| -> Option<bytes::Bytes> {
            if !follow {
                return Some(b);
            }
            let at = b.iter().position(|c| *c == b' ')?;
            let stamp = std::str::from_utf8(&b[..at]).ok()?;
            if !seen.first_time(stamp, &b[at + 1..]) {
                return None;
            }
            Some(if timestamps { b } else { b.slice(at + 1..) })
        };
        futures::stream::once(async move {
            let docker = this.client().await?.clone();
            this.inner.metrics.observe("logs", true, 0.0);
            let opts = bollard::query_parameters::LogsOptionsBuilder::new()
                .follow(follow)
                .stdout(true)
                .stderr(true)
                .since(since)
                .timestamps(stamped)
                .tail(&tail)
                .build();
            // A followed log runs as long as the container does: no request timeout.
            let docker = if follow {
                docker.with_timeout(Duration::from_secs(u64::from(u32::MAX)))
            } else {
                docker
            };
            Ok::<_, RuntimeError>(
                docker
                    .logs(&id, Some(opts))
                    .map(|r| r.map(|o| o.into_bytes()).map_err(map_err)),
            )
        })
        .try_flatten()
        .scan(dedup, |dedup, r| {
            futures::future::ready(Some(match r {
                Ok(b) => dedup(b).map(Ok),
                Err(e) => Some(Err(e)),
            }))
        })
        .filter_map(futures::future::ready)
        .boxed()
    }

    /// A followed log: read from the engine's json-file files when this process can read them (so that a
    /// reader a whole file behind does not skip it, as the engine's own follower does), else through the
    /// engine.
    fn follow_log(
        &self,
        id: String,
        q: &LogQuery,
    ) -> BoxStream<'static, Result<bytes::Bytes, RuntimeError>> {
        let this = self.clone();
        let q = q.clone();
        futures::stream::once(async move {
            let resp = this.inspect_raw(&id).await?;
            let json_file = resp
                .host_config
                .as_ref()
                .and_then(|h| h.log_config.as_ref())
                .and_then(|l| l.typ.as_deref())
                == Some("json-file");
            let path = resp.log_path.unwrap_or_default();
            let readable = json_file
                && !path.is_empty()
                && std::path::Path::new(&path)
                    .parent()
                    .is_some_and(|d| std::fs::read_dir(d).is_ok());
            Ok::<_, RuntimeError>(if readable {
                this.follow_log_file(id, std::path::PathBuf::from(path), &q)
            } else {
                this.engine_logs(id, &q)
            })
        })
        .try_flatten()
        .boxed()
    }

    /// Follows the json-file log at `path` until the container stops.
    fn follow_log_file(
        &self,
        id: String,
        path: std::path::PathBuf,
        q: &LogQuery,
    ) -> BoxStream<'static, Result<bytes::Bytes, RuntimeError>> {
        use crate::pods::logfile::{Follower, Step};
        /// Read at most this much at a time (bounded memory per follower).
        const CHUNK: usize = 256 * 1024;
        /// How long a follower at the end of the log waits before reading again.
        const IDLE: Duration = Duration::from_millis(50);
        /// How often a follower at the end of the log asks whether the container still runs.
        const CHECK_EVERY: Duration = Duration::from_secs(1);
        struct State {
            follower: Option<Follower>,
            checked: Option<Instant>,
            lost: u64,
            stopped: bool,
        }
        let since = q
            .since_seconds
            .map(|s| SystemTime::now() - Duration::from_secs(s));
        let tail = q.tail.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let state = State {
            follower: Some(Follower::new(path, q.timestamps, since, tail)),
            checked: None,
            lost: 0,
            stopped: false,
        };
        let this = self.clone();
        futures::stream::unfold(state, move |mut s| {
            let this = this.clone();
            let id = id.clone();
            async move {
                loop {
                    let mut f = s.follower.take()?;
                    let (f, r) = tokio::task::spawn_blocking(move || {
                        let r = f.read_some(CHUNK);
                        (f, r)
                    })
                    .await
                    .ok()?;
                    if f.lost > s.lost {
                        s.lost = f.lost;
                        tracing::warn!(
                            container = %id,
                            "a followed log fell behind the log caps: a rotated file was deleted before it was read"
                        );
                    }
                    s.follower = Some(f);
                    match r {
                        Err(e) => {
                            s.follower = None;
                            return Some((
                                Err(RuntimeError::Other(format!("reading the log file: {e}"))),
                                s,
                            ));
                        }
                        Ok(Step::Data(b)) => {
                            if !b.is_empty() {
                                return Some((Ok(bytes::Bytes::from(b)), s));
                            }
                        }
                        // The container had stopped before this read: its log is complete.
                        Ok(Step::Idle) if s.stopped => return None,
                        Ok(Step::Idle) => {
                            // At the first end of the log (a container that has already exited
                            // ends the follow at once), then at most every CHECK_EVERY.
                            let due = s.checked.is_none_or(|t| t.elapsed() >= CHECK_EVERY);
                            if due {
                                s.checked = Some(Instant::now());
                            }
                            if due && !this.still_running(&id).await {
                                s.stopped = true;
                                continue;
                            }
                            tokio::time::sleep(IDLE).await;
                        }
                    }
                }
            }
        })
        .boxed()
    }

    /// Whether a container runs; true when the engine cannot say (a followed log is not cut by an outage).
    async fn still_running(&self, id: &str) -> bool {
        match self.inspect_raw(id).await {
            Ok(resp) => resp.state.and_then(|s| s.running).unwrap_or(false),
            Err(RuntimeError::NotFound(_)) => false,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_log_drops_repeats_and_keeps_two_lines_of_the_same_nanosecond() {
        let mut f = FollowedEntries::default();
        assert!(f.first_time("2026-12-03T10:00:00.5Z", b"one"));
        // The same time written with a longer fraction is the same time: a repeat.
        assert!(!f.first_time("2026-12-03T10:00:00.500000000Z", b"one"));
        // Another line the engine took in the same nanosecond is new; its repeat is not.
        assert!(f.first_time("2026-12-03T10:00:00.500000000Z", b"two"));
        assert!(!f.first_time("2026-12-03T10:00:00.5Z", b"two"));
        // Older: a repeat from before a rotation.
        assert!(!f.first_time("2026-12-03T10:00:00.499999999Z", b"zero"));
        assert!(f.first_time("2026-12-03T10:00:00.500000001Z", b"three"));
        assert!(!f.first_time("2026-12-03T10:00:00.500000000Z", b"two"));
        // A time that does not parse is passed on.
        assert!(f.first_time("garbage", b"x"));
    }
}
