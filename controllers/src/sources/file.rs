//! `--manifest-path`: one file, or a directory of files read in name order. Watched with inotify, and read
//! again every 20 s in case an event was missed. Dotfiles and editor temp/swap files are ignored, so an
//! editor's "write a temp file, rename it into place" applies exactly once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hostlet_api::validation::SourceKind;
use notify::{RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;

use super::{entries_from_list, SourceEntry, SourceSet, SourceSink};
use crate::events::{EventKind, EventRecorder};

/// How often the path is read again without an inotify event.
pub const POLL_PERIOD: Duration = Duration::from_secs(20);

/// Whether a file in a manifest directory is skipped: dotfiles, editor backups, swap and temp files.
pub fn is_ignored(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || (name.starts_with('#') && name.ends_with('#'))
        || name == "4913"
        || [
            ".swp",
            ".swx",
            ".swo",
            ".tmp",
            ".part",
            ".bak",
            ".dpkg-new",
            ".dpkg-old",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// The file source's memory: the last good entries of each file.
#[derive(Default)]
pub struct FileSource {
    last_good: HashMap<PathBuf, Vec<SourceEntry>>,
    /// Errors reported already, so that a broken file is reported once, not every poll.
    reported: HashMap<PathBuf, String>,
}

/// What one read of the path found.
#[derive(Debug, Default)]
pub struct Scan {
    pub set: Vec<SourceEntry>,
    /// New problems, each naming its file.
    pub errors: Vec<String>,
}

impl FileSource {
    /// Reads the path now. A file that cannot be read or parsed keeps its last good entries.
    pub fn scan(&mut self, path: &Path) -> Scan {
        let mut out = Scan::default();
        let files: Vec<PathBuf> = match std::fs::metadata(path) {
            Err(e) => {
                self.report(path, format!("{}: {e}", path.display()), &mut out);
                self.last_good.clear();
                return out;
            }
            Ok(m) if m.is_dir() => match std::fs::read_dir(path) {
                Ok(rd) => {
                    let mut v: Vec<PathBuf> = rd
                        .flatten()
                        .filter(|e| !is_ignored(&e.file_name().to_string_lossy()))
                        .filter(|e| {
                            e.file_type()
                                .map(|t| t.is_file() || t.is_symlink())
                                .unwrap_or(false)
                        })
                        .map(|e| e.path())
                        .collect();
                    v.sort();
                    v
                }
                Err(e) => {
                    self.report(path, format!("{}: {e}", path.display()), &mut out);
                    out.set = self.all_last_good();
                    return out;
                }
            },
            Ok(_) => vec![path.to_path_buf()],
        };
        // The path itself reads again: its own error (missing, unreadable dir) is over. In single-file mode
        // the path is the file, whose parse error stays reported until the file changes.
        if !files.iter().any(|f| f == path) {
            self.reported.remove(path);
        }
        self.reported.retain(|p, _| p == path || files.contains(p));
        self.last_good.retain(|p, _| files.contains(p));
        for (fi, f) in files.iter().enumerate() {
            let shown = f.display().to_string();
            let parsed = std::fs::read(f)
                .map_err(|e| format!("{shown}: {e}"))
                .and_then(|bytes| entries_from_list(&shown, &bytes, fi * 10_000));
            match parsed {
                Ok(entries) => {
                    self.reported.remove(f);
                    self.last_good.insert(f.clone(), entries);
                }
                Err(e) => {
                    let kept = self.last_good.get(f).map(Vec::len).unwrap_or(0);
                    self.report(
                        f,
                        format!("{e} (keeping the {kept} pod(s) last read from it)"),
                        &mut out,
                    );
                }
            }
        }
        out.set = files
            .iter()
            .filter_map(|f| self.last_good.get(f))
            .flatten()
            .cloned()
            .collect();
        out
    }

    fn all_last_good(&self) -> Vec<SourceEntry> {
        let mut keys: Vec<&PathBuf> = self.last_good.keys().collect();
        keys.sort();
        keys.into_iter()
            .flat_map(|k| self.last_good[k].clone())
            .collect()
    }

    fn report(&mut self, path: &Path, message: String, out: &mut Scan) {
        if self.reported.get(path) != Some(&message) {
            self.reported.insert(path.to_path_buf(), message.clone());
            out.errors.push(message);
        }
    }
}

/// Runs the file source until `shutdown`.
pub async fn run(
    path: PathBuf,
    sink: SourceSink,
    events: Option<EventRecorder>,
    shutdown: CancellationToken,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // Watch the path's directory (or the directory itself), so files renamed into place are seen.
    let watch_dir = if path.is_dir() {
        path.clone()
    } else {
        path.parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    // In single-file mode only events naming the file matter: the directory may be busy with other files.
    let only = (!path.is_dir())
        .then(|| path.file_name().map(|n| n.to_os_string()))
        .flatten();
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let relevant = match (&only, &res) {
            (Some(name), Ok(ev)) => ev
                .paths
                .iter()
                .any(|p| p.file_name() == Some(name.as_os_str())),
            _ => true,
        };
        if relevant {
            let _ = tx.send(());
        }
    })
    .and_then(|mut w| w.watch(&watch_dir, RecursiveMode::NonRecursive).map(|_| w));
    let _watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(path = %watch_dir.display(), error = %e, "cannot watch manifest path; reading it every 20 s");
            None
        }
    };
    let mut source = FileSource::default();
    let mut last: Option<Vec<SourceEntry>> = None;
    loop {
        let scan = source.scan(&path);
        for e in &scan.errors {
            match &events {
                Some(ev) => {
                    ev.node_event(EventKind::Warning, "ManifestFileError", e.clone())
                        .await
                }
                None => tracing::warn!("{e}"),
            }
        }
        if last.as_ref() != Some(&scan.set) {
            sink.publish(SourceSet {
                source: SourceKind::File,
                entries: scan.set.clone(),
            });
            last = Some(scan.set);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL_PERIOD) => {}
            Some(()) = rx.recv() => {
                // Let a burst of events (write, rename) settle, then read once.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while rx.try_recv().is_ok() {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "version: v1beta1\nid: a\ncontainers: [{name: c, image: busybox}]\n";

    #[test]
    fn editor_files_and_dotfiles_are_ignored() {
        for n in [
            ".pod.yaml.swp",
            "pod.yaml~",
            "#pod.yaml#",
            "4913",
            ".hidden",
            "pod.yaml.tmp",
            "x.swx",
        ] {
            assert!(is_ignored(n), "{n}");
        }
        for n in ["pod.yaml", "pod.json", "10-web"] {
            assert!(!is_ignored(n), "{n}");
        }
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_pods_and_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, POD).unwrap();
        std::fs::write(dir.path().join("b.yaml"), POD.replace("id: a", "id: b")).unwrap();
        let mut src = FileSource::default();
        let s = src.scan(dir.path());
        assert_eq!(s.set.len(), 2);
        assert!(s.errors.is_empty());
        std::fs::write(&f, [0xffu8, 0xfe, 0x00]).unwrap();
        let s = src.scan(dir.path());
        assert_eq!(s.set.len(), 2, "last good kept");
        assert_eq!(s.errors.len(), 1);
        assert!(s.errors[0].contains("a.yaml"), "{:?}", s.errors);
        assert!(src.scan(dir.path()).errors.is_empty(), "reported once");
        std::fs::remove_file(&f).unwrap();
        let s = src.scan(dir.path());
        assert_eq!(s.set.len(), 1, "a removed file takes its pods away");
    }

    #[test]
    fn a_single_broken_file_is_reported_once_however_often_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pod.yaml");
        std::fs::write(&f, "garbage: [[[").unwrap();
        let mut src = FileSource::default();
        let first = src.scan(&f);
        assert_eq!(first.errors.len(), 1, "{:?}", first.errors);
        assert!(first.errors[0].contains("pod.yaml"), "{:?}", first.errors);
        for _ in 0..50 {
            assert!(src.scan(&f).errors.is_empty(), "reported again");
        }
        std::fs::write(&f, POD).unwrap();
        let s = src.scan(&f);
        assert!(s.errors.is_empty() && s.set.len() == 1);
        std::fs::write(&f, [1u8, 2, 3]).unwrap();
        assert_eq!(src.scan(&f).errors.len(), 1, "a new problem is reported");
    }

    #[test]
    fn a_missing_path_is_an_error_naming_it_and_an_empty_set() {
        let mut src = FileSource::default();
        let s = src.scan(Path::new("/nonexistent/manifests"));
        assert!(s.set.is_empty());
        assert!(s.errors[0].contains("/nonexistent/manifests"));
    }

    #[test]
    fn an_empty_list_is_an_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pods.yaml"), "[]").unwrap();
        let s = FileSource::default().scan(dir.path());
        assert!(s.set.is_empty() && s.errors.is_empty());
    }
}
