//! The images directory, for hosts without a registry: a `docker save` tarball (`*.tar`, `*.tar.gz`,
//! `*.tgz`, `*.tar.zst`) put in `<data-dir>/images/` or `--images-dir` is loaded into Docker once, by its
//! digest, and the images it held are pinned against the image collector while the file is there.
//!
//! The directories are watched; a file written less than [`SETTLE`] ago is looked at again later, so that
//! one still being copied in is not loaded half-way. A file that cannot be loaded (not an image archive,
//! truncated, unreadable) is a warning event once, and is looked at again only when it changes. What was
//! loaded is kept in `<data-dir>/image-loads.json`, so that a restart loads nothing again while the images
//! are still on the engine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::BoxStream;
use notify::{RecursiveMode, Watcher};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::runtime::RuntimeError;
use crate::events::{EventKind, EventRecorder};

/// A file changed less than this long ago may still be being written.
pub const SETTLE: Duration = Duration::from_secs(2);
/// The directories are also read this often, in case a watch missed something (or could not be set).
pub const RESCAN_PERIOD: Duration = Duration::from_secs(30);
/// How often a long load says how far it has got.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Read from the file (and sent to the engine) this much at a time.
const CHUNK: usize = 1 << 20;
/// The record of what was loaded, under the data dir.
pub const RECORD_FILE: &str = "image-loads.json";

/// How a file in the directory is packed, from its name; `None` for a file that is not an image archive
/// (dotfiles, and the temporary names of a copy in progress, are never one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    Tar,
    Gzip,
    Zstd,
}

impl Packing {
    pub fn of(name: &str) -> Option<Packing> {
        if name.starts_with('.') {
            return None;
        }
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Packing::Gzip)
        } else if name.ends_with(".tar.zst") {
            Some(Packing::Zstd)
        } else if name.ends_with(".tar") {
            Some(Packing::Tar)
        } else {
            None
        }
    }
}

/// The ids of the images each file of the directory holds; the image collector keeps them all.
#[derive(Debug, Clone, Default)]
pub struct PinnedImages(Arc<Mutex<BTreeMap<PathBuf, Vec<String>>>>);

impl PinnedImages {
    pub fn ids(&self) -> HashSet<String> {
        self.lock().values().flatten().cloned().collect()
    }

    pub(crate) fn set(&self, file: &Path, ids: Vec<String>) {
        self.lock().insert(file.to_path_buf(), ids);
    }

    pub(crate) fn remove(&self, file: &Path) -> Option<Vec<String>> {
        self.lock().remove(file)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PathBuf, Vec<String>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the directory asks of the engine.
pub trait ImageLoader: Send + Sync + 'static {
    /// `docker load` of a tar stream: the names (or ids, for an untagged image) the engine says it loaded.
    fn load(
        &self,
        tar: BoxStream<'static, Bytes>,
    ) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send;
    /// The id `reference` names, `None` when no such image is present.
    fn loaded_id(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<Option<String>, RuntimeError>> + Send;
}

/// One file as last looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    size: u64,
    /// Nanoseconds since the epoch.
    modified: u64,
}

/// A file loaded, as kept in the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Loaded {
    path: PathBuf,
    #[serde(flatten)]
    seen: Seen,
    /// `sha256:<hex>` of the file as it is on disk.
    digest: String,
    images: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    loaded: Vec<Loaded>,
}

/// Why a file was not loaded.
#[derive(Debug)]
enum LoadError {
    /// The file's fault: reported once, tried again only when it changes.
    File(String),
    /// The engine's (unreachable, timed out): tried again at the next look.
    Engine(RuntimeError),
}

/// The directory's metrics.
#[derive(Clone)]
pub struct ImagesDirMetrics {
    loads: IntCounterVec,
    bytes: IntCounter,
    pinned: IntGauge,
}

impl ImagesDirMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ImagesDirMetrics {
            loads: IntCounterVec::new(
                Opts::new(
                    "hostlet_images_dir_loads_total",
                    "Files of the images directory loaded into the engine, by result: loaded, failed (the \
                     file could not be loaded; a warning event), retried (the engine did not answer)",
                ),
                &["result"],
            )?,
            bytes: IntCounter::new(
                "hostlet_images_dir_loaded_bytes_total",
                "Bytes of the images directory's files loaded into the engine (as on disk)",
            )?,
            pinned: IntGauge::new(
                "hostlet_images_dir_pinned_images",
                "Images the images directory's files hold, kept from the image collector",
            )?,
        };
        for r in ["loaded", "failed", "retried"] {
            m.loads.with_label_values(&[r]);
        }
        registry.register(Box::new(m.loads.clone()))?;
        registry.register(Box::new(m.bytes.clone()))?;
        registry.register(Box::new(m.pinned.clone()))?;
        Ok(m)
    }
}

/// The directories' watcher and loader: one per agent.
pub struct ImagesDir<L> {
    loader: Arc<L>,
    dirs: Vec<PathBuf>,
    record_path: PathBuf,
    record: Record,
    pinned: PinnedImages,
    events: Option<EventRecorder>,
    metrics: ImagesDirMetrics,
    /// Called after images were loaded (pods waiting for one retry at once).
    on_loaded: Arc<dyn Fn() + Send + Sync>,
    /// Files that could not be loaded, as they were then.
    failed: HashMap<PathBuf, Seen>,
}

/// What one look found to do later.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Look {
    /// A file is still settling, or the engine did not answer: look again soon.
    pub again_soon: bool,
}

impl<L: ImageLoader> ImagesDir<L> {
    pub fn new(
        loader: Arc<L>,
        dirs: Vec<PathBuf>,
        data_dir: &Path,
        pinned: PinnedImages,
        events: Option<EventRecorder>,
        metrics: ImagesDirMetrics,
        on_loaded: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let record_path = data_dir.join(RECORD_FILE);
        let record = match std::fs::read(&record_path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %record_path.display(), error = %e, "unreadable; the images directory's files are loaded again");
                Record::default()
            }),
            Err(_) => Record::default(),
        };
        ImagesDir {
            loader,
            dirs,
            record_path,
            record,
            pinned,
            events,
            metrics,
            on_loaded,
            failed: HashMap::new(),
        }
    }

    /// The archives in the directories now, with how each looks.
    fn list(&self) -> BTreeMap<PathBuf, (Packing, Seen)> {
        let mut out = BTreeMap::new();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Some(packing) = e.file_name().to_str().and_then(Packing::of) else {
                    continue;
                };
                let Ok(meta) = std::fs::metadata(e.path()) else {
                    continue;
                };
                if !meta.is_file() {
                    continue;
                }
                let modified = meta
                    .modified()
                    .ok()
                    .and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                out.insert(
                    e.path(),
                    (
                        packing,
                        Seen {
                            size: meta.len(),
                            modified,
                        },
                    ),
                );
            }
        }
        out
    }

    /// One look over the directories: files gone are unpinned, new or changed ones loaded.
    pub async fn look(&mut self) -> Look {
        let files = self.list();
        let mut look = Look::default();
        let gone: Vec<PathBuf> = self
            .record
            .loaded
            .iter()
            .map(|l| l.path.clone())
            .filter(|p| !files.contains_key(p))
            .collect();
        for path in gone {
            if let Some(ids) = self.pinned.remove(&path) {
                tracing::info!(file = %path.display(), images = ids.len(), "image file removed; its images are no longer kept from the image collector");
            }
            self.record.loaded.retain(|l| l.path != path);
            self.save_record();
        }
        self.failed.retain(|p, _| files.contains_key(p));
        let mut any_loaded = false;
        for (path, (packing, seen)) in files {
            if self.failed.get(&path) == Some(&seen) {
                continue;
            }
            let age = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .saturating_sub(seen.modified);
            if u128::from(age) < SETTLE.as_nanos() {
                look.again_soon = true;
                continue;
            }
            match self.take(&path, packing, &seen).await {
                Ok(loaded) => any_loaded |= loaded,
                Err(LoadError::Engine(e)) => {
                    self.metrics.loads.with_label_values(&["retried"]).inc();
                    tracing::warn!(file = %path.display(), error = %e, "image file not loaded: the engine did not answer; trying again");
                    look.again_soon = true;
                }
                Err(LoadError::File(message)) => {
                    self.metrics.loads.with_label_values(&["failed"]).inc();
                    self.failed.insert(path.clone(), seen);
                    let message = format!(
                        "{}: not loaded ({message}); it is tried again when the file changes",
                        path.display()
                    );
                    tracing::warn!("{message}");
                    if let Some(ev) = &self.events {
                        ev.node_event(EventKind::Warning, "ImageFileFailed", message)
                            .await;
                    }
                }
            }
        }
        self.metrics.pinned.set(self.pinned.ids().len() as i64);
        if any_loaded {
            (self.on_loaded)();
        }
        look
    }

    /// Pins the file's images, loading it first unless the record says it was and the images are all
    /// still on the engine. True when it loaded something.
    async fn take(
        &mut self,
        path: &Path,
        packing: Packing,
        seen: &Seen,
    ) -> Result<bool, LoadError> {
        let known = self
            .record
            .loaded
            .iter()
            .find(|l| l.path == path && &l.seen == seen)
            .cloned();
        if let Some(l) = &known {
            if self.pinned.lock().contains_key(path) {
                return Ok(false);
            }
            if self.all_present(&l.images).await? {
                self.pinned.set(path, l.images.clone());
                return Ok(false);
            }
        }
        let digest = {
            let path = path.to_path_buf();
            tokio::task::spawn_blocking(move || file_digest(&path))
                .await
                .map_err(|e| LoadError::File(e.to_string()))?
                .map_err(|e| LoadError::File(e.to_string()))?
        };
        // The same bytes under another name (or touched): loaded already if its images are all there.
        let same = self
            .record
            .loaded
            .iter()
            .find(|l| l.digest == digest)
            .cloned();
        let (images, loaded) = match same {
            Some(l) if self.all_present(&l.images).await? => (l.images, false),
            _ => (self.load(path, packing, seen.size).await?, true),
        };
        self.pinned.set(path, images.clone());
        self.record.loaded.retain(|l| l.path != path);
        self.record.loaded.push(Loaded {
            path: path.to_path_buf(),
            seen: seen.clone(),
            digest,
            images,
        });
        self.save_record();
        Ok(loaded)
    }

    async fn all_present(&self, ids: &[String]) -> Result<bool, LoadError> {
        for id in ids {
            match self.loader.loaded_id(id).await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(false),
                Err(e) => return Err(LoadError::Engine(e)),
            }
        }
        Ok(!ids.is_empty())
    }

    /// Streams the file, unpacked, into the engine; the ids of the images it held.
    async fn load(
        &self,
        path: &Path,
        packing: Packing,
        size: u64,
    ) -> Result<Vec<String>, LoadError> {
        let started = std::time::Instant::now();
        tracing::info!(file = %path.display(), size = %bytesize::ByteSize(size).display().iec(), "loading images from file");
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let reader = {
            let path = path.to_path_buf();
            tokio::task::spawn_blocking(move || read_unpacked(&path, packing, size, tx))
        };
        let body = Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (b, rx))
        }));
        let answer = self.loader.load(body).await;
        let read = reader.await.map_err(|e| LoadError::File(e.to_string()))?;
        // The file's own error explains an engine that saw a cut-off archive.
        if let Err(e) = read {
            return Err(LoadError::File(e.to_string()));
        }
        let names = match answer {
            Ok(n) => n,
            Err(e) if e.is_unreachable() => return Err(LoadError::Engine(e)),
            Err(e) => return Err(LoadError::File(format!("the engine refused it: {e}"))),
        };
        if names.is_empty() {
            return Err(LoadError::File(
                "the engine loaded no image from it (is it `docker save` output?)".into(),
            ));
        }
        let mut ids = Vec::new();
        for n in &names {
            match self.loader.loaded_id(n).await {
                Ok(Some(id)) => ids.push(id),
                Ok(None) => {
                    return Err(LoadError::File(format!(
                        "the engine says it loaded {n}, which it does not have"
                    )))
                }
                Err(e) => return Err(LoadError::Engine(e)),
            }
        }
        ids.sort();
        ids.dedup();
        self.metrics.loads.with_label_values(&["loaded"]).inc();
        self.metrics.bytes.inc_by(size);
        let message = format!(
            "loaded {} from {} in {:.1} s",
            names.join(", "),
            path.display(),
            started.elapsed().as_secs_f64()
        );
        tracing::info!("{message}");
        if let Some(ev) = &self.events {
            ev.node_event(EventKind::Normal, "ImageFileLoaded", message)
                .await;
        }
        Ok(ids)
    }

    fn save_record(&self) {
        let r = serde_json::to_vec_pretty(&self.record)
            .map_err(std::io::Error::other)
            .and_then(|b| crate::files::write_atomic(&self.record_path, &b, 0o600));
        if let Err(e) = r {
            tracing::warn!(file = %self.record_path.display(), error = %e, "cannot keep the record of loaded image files; a restart loads them again");
        }
    }

    /// Watches the directories and looks whenever they change (and every [`RESCAN_PERIOD`]) until `cancel`.
    pub async fn run(mut self, cancel: CancellationToken) {
        for dir in &self.dirs {
            if let Err(e) = make_dir(dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot make the images directory");
            }
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
            let _ = tx.send(());
        })
        .and_then(|mut w| {
            for dir in &self.dirs {
                w.watch(dir, RecursiveMode::NonRecursive)?;
            }
            Ok(w)
        });
        let _watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the images directory; reading it every {} s", RESCAN_PERIOD.as_secs());
                None
            }
        };
        loop {
            let look = self.look().await;
            let wait = if look.again_soon {
                SETTLE
            } else {
                RESCAN_PERIOD
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                Some(()) = rx.recv() => {
                    // Let a burst of events (a copy's writes, a rename) settle, then read once.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    while rx.try_recv().is_ok() {}
                }
            }
        }
    }
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// `sha256:<hex>` of the file.
fn file_digest(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// Counts what is read from the file, for the progress lines.
struct Counting<R> {
    inner: R,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads the file, unpacked, into `tx` a chunk at a time; stops quietly when the engine stops taking.
fn read_unpacked(
    path: &Path,
    packing: Packing,
    size: u64,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) -> std::io::Result<()> {
    let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let file = Counting {
        inner: std::fs::File::open(path)?,
        read: read.clone(),
    };
    let mut reader: Box<dyn Read> = match packing {
        Packing::Tar => Box::new(file),
        Packing::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Packing::Zstd => Box::new(zstd::stream::read::Decoder::new(file)?),
    };
    let mut said = std::time::Instant::now();
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = reader
            .read(&mut buf)
            .map_err(|e| std::io::Error::new(e.kind(), format!("reading it: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        buf.truncate(n);
        if tx.blocking_send(Bytes::from(buf)).is_err() {
            return Ok(());
        }
        if said.elapsed() >= PROGRESS_EVERY {
            said = std::time::Instant::now();
            let done = read.load(std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                file = %path.display(),
                percent = done.saturating_mul(100) / size.max(1),
                "loading images from file"
            );
        }
    }
}

#[cfg(test)]
mod tests;
