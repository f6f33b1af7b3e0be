//! The directory's sequencing on a fake engine: the "archive" is text, one `name=id` line per image.

use super::*;
use futures::StreamExt;
use std::io::Write;

#[derive(Default)]
struct FakeEngine {
    st: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    /// name or id → id.
    images: HashMap<String, String>,
    loads: Vec<String>,
    unreachable: bool,
}

impl FakeEngine {
    fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.st.lock().unwrap()
    }
}

impl ImageLoader for FakeEngine {
    async fn load(&self, tar: BoxStream<'static, Bytes>) -> Result<Vec<String>, RuntimeError> {
        let chunks: Vec<Bytes> = tar.collect().await;
        if self.st().unreachable {
            return Err(RuntimeError::Unreachable("engine away".into()));
        }
        let text = String::from_utf8(chunks.concat()).map_err(|_| RuntimeError::Api {
            status: 500,
            message: "unexpected EOF".into(),
        })?;
        let mut names = Vec::new();
        let mut st = self.st();
        for line in text.lines() {
            let Some((name, id)) = line.split_once('=') else {
                return Err(RuntimeError::Api {
                    status: 500,
                    message: format!("not an archive: {line}"),
                });
            };
            st.images.insert(name.into(), id.into());
            st.images.insert(id.into(), id.into());
            names.push(name.to_string());
        }
        st.loads.push(text);
        Ok(names)
    }

    async fn loaded_id(&self, reference: &str) -> Result<Option<String>, RuntimeError> {
        let st = self.st();
        if st.unreachable {
            return Err(RuntimeError::Unreachable("engine away".into()));
        }
        Ok(st.images.get(reference).cloned())
    }
}

struct Setup {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    dir: PathBuf,
    engine: Arc<FakeEngine>,
    pinned: PinnedImages,
    woken: Arc<std::sync::atomic::AtomicUsize>,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let dir = data.join("images");
        std::fs::create_dir_all(&dir).unwrap();
        Setup {
            data,
            dir,
            _tmp: tmp,
            engine: Arc::default(),
            pinned: PinnedImages::default(),
            woken: Arc::default(),
        }
    }

    fn images_dir(&self) -> ImagesDir<FakeEngine> {
        let woken = self.woken.clone();
        ImagesDir::new(
            self.engine.clone(),
            vec![self.dir.clone()],
            &self.data,
            self.pinned.clone(),
            None,
            ImagesDirMetrics::register(&Registry::new()).unwrap(),
            Arc::new(move || {
                woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        )
    }

    /// Writes a file as it would be after a finished copy: changed a while ago.
    fn put(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        settle(&path);
        path
    }

    fn pinned(&self) -> Vec<String> {
        let mut v: Vec<String> = self.pinned.ids().into_iter().collect();
        v.sort();
        v
    }
}

fn settle(path: &Path) {
    let f = std::fs::File::options().append(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(60))
        .unwrap();
}

#[test]
fn archives_are_told_by_their_names() {
    assert_eq!(Packing::of("app.tar"), Some(Packing::Tar));
    assert_eq!(Packing::of("app.tar.gz"), Some(Packing::Gzip));
    assert_eq!(Packing::of("app.tgz"), Some(Packing::Gzip));
    assert_eq!(Packing::of("app.tar.zst"), Some(Packing::Zstd));
    for other in [
        ".app.tar",
        "app.tar.part",
        "app.zip",
        "app",
        "app.tar.gz.tmp",
    ] {
        assert_eq!(Packing::of(other), None, "{other}");
    }
}

#[tokio::test]
async fn a_file_is_loaded_once_pinned_while_it_is_there_and_not_loaded_again_after_a_restart() {
    let s = Setup::new();
    let file = s.put("app.tar", b"app:1=sha256:a1\nhelper:2=sha256:b2\n");
    let mut d = s.images_dir();
    assert_eq!(d.look().await, Look::default());
    assert_eq!(s.engine.st().loads.len(), 1);
    assert_eq!(s.pinned(), ["sha256:a1", "sha256:b2"]);
    assert_eq!(s.woken.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Looked at again: nothing to do.
    d.look().await;
    assert_eq!(s.engine.st().loads.len(), 1);
    // The record is private to the agent.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.data.join(RECORD_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // A restart: the images are still there, so nothing is loaded; they are pinned again.
    drop(d);
    let pinned_before = s.pinned();
    s.pinned.remove(&file);
    let mut d = s.images_dir();
    d.look().await;
    assert_eq!(s.engine.st().loads.len(), 1);
    assert_eq!(s.pinned(), pinned_before);
    // The same bytes under another name are not loaded again either.
    s.put("copy.tar", b"app:1=sha256:a1\nhelper:2=sha256:b2\n");
    d.look().await;
    assert_eq!(s.engine.st().loads.len(), 1);

    // Removed meanwhile from the engine: loaded again at the next restart.
    s.engine.st().images.clear();
    s.pinned.remove(&file);
    s.pinned.remove(&s.dir.join("copy.tar"));
    let mut d = s.images_dir();
    d.look().await;
    assert_eq!(s.engine.st().loads.len(), 2);

    // The files go: nothing is pinned.
    std::fs::remove_file(&file).unwrap();
    std::fs::remove_file(s.dir.join("copy.tar")).unwrap();
    d.look().await;
    assert!(s.pinned().is_empty());
    let record = std::fs::read_to_string(s.data.join(RECORD_FILE)).unwrap();
    assert!(!record.contains("app.tar"), "{record}");
}

#[tokio::test]
async fn compressed_archives_are_unpacked_on_the_way_to_the_engine() {
    let s = Setup::new();
    let content = b"gz:1=sha256:g\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(content).unwrap();
    s.put("a.tar.gz", &gz.finish().unwrap());
    s.put(
        "b.tar.zst",
        &zstd::encode_all(&b"zst:1=sha256:z\n"[..], 3).unwrap(),
    );
    let mut d = s.images_dir();
    d.look().await;
    let mut loads = s.engine.st().loads.clone();
    loads.sort();
    assert_eq!(loads, ["gz:1=sha256:g\n", "zst:1=sha256:z\n"]);
    assert_eq!(s.pinned(), ["sha256:g", "sha256:z"]);
}

#[tokio::test]
async fn a_bad_file_is_reported_once_and_tried_again_only_when_it_changes() {
    let s = Setup::new();
    let bad = s.put("bad.tar", b"this is no archive\n");
    // A gzip that ends half-way: the file's own error is what is reported.
    s.put("cut.tar.gz", &[0x1f, 0x8b, 0x08, 0x00]);
    s.put("good.tar", b"good:1=sha256:g\n");
    let mut d = s.images_dir();
    d.look().await;
    assert_eq!(s.pinned(), ["sha256:g"], "a bad file disturbs no other");
    assert_eq!(d.failed.len(), 2);
    assert_eq!(d.metrics.loads.with_label_values(&["failed"]).get(), 2);
    // Not tried again while it is as it was.
    d.look().await;
    assert_eq!(d.metrics.loads.with_label_values(&["failed"]).get(), 2);
    // Fixed: loaded.
    std::fs::write(&bad, b"fixed:1=sha256:f\n").unwrap();
    settle(&bad);
    d.look().await;
    assert_eq!(s.pinned(), ["sha256:f", "sha256:g"]);
}

#[tokio::test]
async fn a_file_still_being_written_or_an_engine_away_is_looked_at_again_soon() {
    let s = Setup::new();
    std::fs::write(s.dir.join("new.tar"), b"new:1=sha256:n\n").unwrap();
    let mut d = s.images_dir();
    assert!(d.look().await.again_soon);
    assert!(s.engine.st().loads.is_empty());
    settle(&s.dir.join("new.tar"));
    s.engine.st().unreachable = true;
    assert!(d.look().await.again_soon);
    assert!(s.pinned().is_empty());
    assert!(
        d.failed.is_empty(),
        "an engine away is not the file's fault"
    );
    s.engine.st().unreachable = false;
    assert!(!d.look().await.again_soon);
    assert_eq!(s.pinned(), ["sha256:n"]);
}
