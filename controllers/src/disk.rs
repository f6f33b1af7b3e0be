//! Free space on the filesystems the agent writes to: its data dir (the etcd member, snapshots, pod
//! volumes) and Docker's root. A full disk is etcd's most common production failure; this makes it say
//! so (a metric per path, `/readyz`, one event per episode) and lets the member's supervisor and the
//! snapshot scheduler wait for room instead of failing in a loop. A full disk is never taken for a broken
//! member: nothing here moves or deletes data.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hostlet_runtime::ComponentHandle;
use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::events::{EventKind, EventRecorder};

/// How often the filesystems are looked at when nothing asks sooner.
pub const CHECK_PERIOD: Duration = Duration::from_secs(5);
/// The readiness component.
pub const READINESS_COMPONENT: &str = "disk";

/// One filesystem as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsState {
    /// The watched path (the data dir, Docker's root).
    pub path: PathBuf,
    pub free: u64,
    pub total: u64,
    /// Below the minimum, or the look failed with ENOSPC.
    pub low: bool,
}

impl std::fmt::Display for FsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the filesystem under {} has {} free of {}",
            self.path.display(),
            bytesize::ByteSize(self.free).display().iec(),
            bytesize::ByteSize(self.total).display().iec()
        )
    }
}

/// Whether `free` of `total` bytes is below `min_free` (a share of the total, 0.05 for 5 %).
pub fn is_low(free: u64, total: u64, min_free: f64) -> bool {
    if total == 0 {
        return false;
    }
    (free as f64) < (total as f64) * min_free
}

/// Free and total bytes of the filesystem holding `path` (what an unprivileged writer may use).
pub fn statfs(path: &Path) -> std::io::Result<(u64, u64)> {
    let s = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
    let unit = s.f_frsize.max(1);
    Ok((
        s.f_bavail.saturating_mul(unit),
        s.f_blocks.saturating_mul(unit),
    ))
}

/// A cheap, cloneable view of the watch for the concerns that write to disk.
#[derive(Clone)]
pub struct DiskPressure {
    state: watch::Receiver<Vec<FsState>>,
    check: Arc<Notify>,
}

impl std::fmt::Debug for DiskPressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.state.borrow().iter()).finish()
    }
}

impl DiskPressure {
    /// The low filesystem that holds `path`, if one of the watched ones does and is low.
    pub fn low(&self, path: &Path) -> Option<FsState> {
        self.state
            .borrow()
            .iter()
            .filter(|s| path.starts_with(&s.path))
            .max_by_key(|s| s.path.components().count())
            .filter(|s| s.low)
            .cloned()
    }

    /// Asks for a look now (say, when etcd just exited) and waits until it is in.
    pub async fn check_now(&self) {
        let mut rx = self.state.clone();
        rx.mark_unchanged();
        self.check.notify_one();
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.changed()).await;
    }

    /// Waits until the filesystem holding `path` is no longer low, or `cancel` fires.
    pub async fn wait_room(&self, path: &Path, cancel: &CancellationToken) {
        let mut rx = self.state.clone();
        loop {
            if self.low(path).is_none() {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    /// A view that never reports a low filesystem (tests of the concerns that take one).
    pub fn none() -> DiskPressure {
        let (_tx, rx) = watch::channel(Vec::new());
        DiskPressure {
            state: rx,
            check: Arc::new(Notify::new()),
        }
    }
}

/// Looks at the watched filesystems every [`CHECK_PERIOD`] or when asked.
pub struct DiskWatch {
    paths: Vec<PathBuf>,
    min_free: f64,
    free_bytes: IntGaugeVec,
    ready: ComponentHandle,
    /// The agent's event recorder, once etcd can be reached (the watch starts before the member).
    events: Arc<OnceLock<EventRecorder>>,
    tx: watch::Sender<Vec<FsState>>,
    check: Arc<Notify>,
    /// Asked once where Docker keeps its images and containers, which is then watched too.
    docker: Option<bollard::Docker>,
}

impl DiskWatch {
    /// `paths`: the data dir first, then Docker's root when known. `min_free`: `--disk-min-free`.
    pub fn new(
        paths: Vec<PathBuf>,
        min_free: f64,
        registry: &Registry,
        ready: ComponentHandle,
    ) -> prometheus::Result<(DiskWatch, DiskPressure)> {
        let free_bytes = IntGaugeVec::new(
            Opts::new(
                "hostlet_disk_free_bytes",
                "Bytes free on the filesystem under each path the agent writes to (its data dir, Docker's root).",
            ),
            &["path"],
        )?;
        registry.register(Box::new(free_bytes.clone()))?;
        let (tx, rx) = watch::channel(Vec::new());
        let check = Arc::new(Notify::new());
        let w = DiskWatch {
            paths,
            min_free,
            free_bytes,
            ready,
            events: Arc::new(OnceLock::new()),
            tx,
            check: check.clone(),
            docker: None,
        };
        w.look();
        Ok((w, DiskPressure { state: rx, check }))
    }

    /// Where the event recorder goes once there is one.
    pub fn events(&self) -> Arc<OnceLock<EventRecorder>> {
        self.events.clone()
    }

    /// Watches Docker's root too, once the engine has said where it is.
    #[must_use]
    pub fn with_docker(mut self, docker: bollard::Docker) -> Self {
        self.docker = Some(docker);
        self
    }

    /// Learns Docker's root from the engine (until it answers once).
    async fn learn_docker_root(&mut self) {
        let Some(docker) = &self.docker else {
            return;
        };
        let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(2), docker.info()).await else {
            return;
        };
        if let Some(root) = info.docker_root_dir.filter(|r| !r.is_empty()) {
            let root = PathBuf::from(root);
            if !self.paths.contains(&root) {
                self.paths.push(root);
            }
            self.docker = None;
        }
    }

    fn look(&self) -> Vec<(FsState, bool)> {
        let before = self.tx.borrow().clone();
        let mut now = Vec::new();
        for p in &self.paths {
            // A path that does not exist yet (the data dir before the first start) is looked at through
            // its nearest existing parent.
            let probe = p.ancestors().find(|a| a.exists()).unwrap_or(Path::new("/"));
            let state = match statfs(probe) {
                Ok((free, total)) => FsState {
                    path: p.clone(),
                    free,
                    total,
                    low: is_low(free, total, self.min_free),
                },
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => FsState {
                    path: p.clone(),
                    free: 0,
                    total: 0,
                    low: true,
                },
                Err(e) => {
                    tracing::debug!(path = %p.display(), error = %e, "cannot look at free space");
                    continue;
                }
            };
            self.free_bytes
                .with_label_values(&[&p.display().to_string()])
                .set(i64::try_from(state.free).unwrap_or(i64::MAX));
            let was_low = before.iter().any(|b| b.path == state.path && b.low);
            now.push((state, was_low));
        }
        self.tx
            .send_replace(now.iter().map(|(s, _)| s.clone()).collect());
        let low: Vec<String> = now
            .iter()
            .filter(|(s, _)| s.low)
            .map(|(s, _)| format!("{s}, below --disk-min-free"))
            .collect();
        if low.is_empty() {
            let shown: Vec<String> = now
                .iter()
                .map(|(s, _)| {
                    format!(
                        "{} {} free",
                        s.path.display(),
                        bytesize::ByteSize(s.free).display().iec()
                    )
                })
                .collect();
            self.ready.set_ready(shown.join("; "));
        } else {
            self.ready.set_not_ready(low.join("; "));
        }
        now
    }

    /// Looks until `cancel` fires; one event when a filesystem runs low and one when it has room again.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            self.learn_docker_root().await;
            for (s, was_low) in self.look() {
                if s.low == was_low {
                    continue;
                }
                let ev = self.events.get();
                if s.low {
                    tracing::warn!(path = %s.path.display(), free = s.free, "disk pressure");
                    let message = format!(
                        "{s}, below --disk-min-free ({:.0} %): etcd, snapshots and pods wait for room",
                        self.min_free * 100.0
                    );
                    if let Some(ev) = ev {
                        ev.record_now(None, None, EventKind::Warning, "DiskPressure", message);
                    }
                } else {
                    tracing::info!(path = %s.path.display(), free = s.free, "disk pressure over");
                    if let Some(ev) = ev {
                        ev.record_now(
                            None,
                            None,
                            EventKind::Normal,
                            "DiskPressureRelieved",
                            format!("{s}: room again"),
                        );
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.check.notified() => {}
                _ = tokio::time::sleep(CHECK_PERIOD) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_is_below_the_share_of_the_total() {
        assert!(is_low(4, 100, 0.05));
        assert!(!is_low(5, 100, 0.05));
        assert!(is_low(0, 100, 0.0001));
        assert!(
            !is_low(0, 0, 0.05),
            "no total (a look that said nothing) is not low"
        );
    }

    #[test]
    fn the_deepest_watched_path_holding_a_path_decides() {
        let (tx, rx) = watch::channel(vec![
            FsState {
                path: "/data".into(),
                free: 0,
                total: 100,
                low: true,
            },
            FsState {
                path: "/data/docker".into(),
                free: 90,
                total: 100,
                low: false,
            },
        ]);
        let d = DiskPressure {
            state: rx,
            check: Arc::new(Notify::new()),
        };
        assert!(d.low(Path::new("/data/db/etcd")).is_some());
        assert!(d.low(Path::new("/data/docker/overlay2")).is_none());
        assert!(d.low(Path::new("/elsewhere")).is_none());
        drop(tx);
    }

    #[tokio::test]
    async fn a_real_filesystem_is_looked_at_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let r = hostlet_runtime::Readiness::default();
        let ready = r.register(READINESS_COMPONENT);
        let registry = Registry::new();
        // A minimum above 100 % makes any filesystem low; 0 makes none.
        let (w, d) = DiskWatch::new(vec![dir.path().to_path_buf()], 1.1, &registry, ready).unwrap();
        assert!(d.low(&dir.path().join("x")).is_some());
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(text.contains("hostlet_disk_free_bytes{path="), "{text}");
        drop(w);
        let ready = r.register("other");
        let (_w, d) = DiskWatch::new(
            vec![dir.path().join("not-yet")],
            0.0,
            &Registry::new(),
            ready,
        )
        .unwrap();
        assert!(d.low(&dir.path().join("not-yet/db")).is_none());
    }
}
