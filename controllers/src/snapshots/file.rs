//! Snapshot files on disk: written to `.part`, checked against etcd's sha256 trailer, optionally compressed
//! with zstd, fsynced and renamed — so a file under a final name is always whole.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// etcd ends a snapshot stream with the sha256 of the database that precedes it.
pub const TRAILER_LEN: usize = 32;

/// What can go wrong with a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: size {size} is not a snapshot (expected size % 512 == 32)")]
    BadSize { path: String, size: u64 },
    #[error("{path}: sha256 trailer does not match the data (corrupted or truncated snapshot)")]
    BadHash { path: String },
    #[error("{path}: is a directory, not a snapshot file")]
    IsDir { path: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> SnapshotFileError + '_ {
    move |source| SnapshotFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Hashes everything but the last 32 bytes of a stream, which it keeps to compare at the end: etcd's
/// snapshot is 512-byte pages followed by the sha256 of the pages.
#[derive(Default)]
pub struct TrailerCheck {
    hasher: Sha256,
    tail: Vec<u8>,
    total: u64,
}

impl TrailerCheck {
    /// Takes the next chunk of the stream, of any size.
    pub fn update(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > TRAILER_LEN {
            let cut = self.tail.len() - TRAILER_LEN;
            self.hasher.update(&self.tail[..cut]);
            self.tail.drain(..cut);
        }
    }

    /// The stream's size if it ends in the hash of what came before it at a page boundary; `path` names
    /// the stream in the error.
    pub fn check(self, path: &Path) -> Result<u64, SnapshotFileError> {
        let shown = path.display().to_string();
        if self.total % 512 != TRAILER_LEN as u64 {
            return Err(SnapshotFileError::BadSize {
                path: shown,
                size: self.total,
            });
        }
        if self.hasher.finalize().as_slice() != self.tail.as_slice() {
            return Err(SnapshotFileError::BadHash { path: shown });
        }
        Ok(self.total)
    }
}

enum Sink {
    Plain(BufWriter<File>),
    Zstd(zstd::stream::write::Encoder<'static, BufWriter<File>>),
}

/// Writes one snapshot: feed it the stream's chunks, then `finish` (checks, fsyncs and renames) or drop it
/// (the `.part` is removed).
pub struct SnapshotWriter {
    part: PathBuf,
    dest: PathBuf,
    sink: Option<Sink>,
    check: TrailerCheck,
    file_hash: Option<Sha256>,
}

/// A snapshot written under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenSnapshot {
    pub path: PathBuf,
    /// Bytes of the database stream (with the trailer).
    pub raw_size: u64,
    /// Bytes on disk.
    pub file_size: u64,
    /// sha256 of the file as it is on disk, so `sha256sum` checks it.
    pub file_sha256: String,
}

impl SnapshotWriter {
    /// Starts writing `dest` through `dest.part`.
    pub fn create(dest: &Path, compress: bool) -> Result<Self, SnapshotFileError> {
        let mut part = dest.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let file = File::create(&part).map_err(io(&part))?;
        let buf = BufWriter::with_capacity(1 << 20, file);
        let sink = if compress {
            Sink::Zstd(zstd::stream::write::Encoder::new(buf, 3).map_err(io(&part))?)
        } else {
            Sink::Plain(buf)
        };
        Ok(SnapshotWriter {
            part,
            dest: dest.to_path_buf(),
            sink: Some(sink),
            check: TrailerCheck::default(),
            file_hash: (!compress).then(Sha256::new),
        })
    }

    pub fn write_chunk(&mut self, chunk: &[u8]) -> Result<(), SnapshotFileError> {
        self.check.update(chunk);
        let part = self.part.clone();
        match self.sink.as_mut() {
            Some(Sink::Plain(w)) => {
                if let Some(h) = self.file_hash.as_mut() {
                    h.update(chunk);
                }
                w.write_all(chunk).map_err(io(&part))
            }
            Some(Sink::Zstd(w)) => w.write_all(chunk).map_err(io(&part)),
            None => Ok(()),
        }
    }

    /// Checks the trailer, flushes, fsyncs, renames into place and fsyncs the directory.
    pub fn finish(mut self) -> Result<WrittenSnapshot, SnapshotFileError> {
        let part = self.part.clone();
        let check = std::mem::take(&mut self.check);
        let raw_size = check.check(&self.dest)?;
        let file = match self.sink.take() {
            Some(Sink::Plain(w)) => w.into_inner().map_err(|e| io(&part)(e.into_error()))?,
            Some(Sink::Zstd(w)) => {
                let buf = w.finish().map_err(io(&part))?;
                buf.into_inner().map_err(|e| io(&part)(e.into_error()))?
            }
            None => return Err(io(&part)(std::io::Error::other("writer already finished"))),
        };
        file.sync_all().map_err(io(&part))?;
        drop(file);
        // Plain files were hashed as they were written; compressed ones are read back once.
        let file_sha256 = match std::mem::take(&mut self.file_hash) {
            Some(h) => hex::encode(h.finalize()),
            None => sha256_file(&part)?,
        };
        let file_size = std::fs::metadata(&part).map_err(io(&part))?.len();
        std::fs::rename(&part, &self.dest).map_err(io(&self.dest))?;
        if let Some(dir) = self.dest.parent() {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(WrittenSnapshot {
            path: self.dest.clone(),
            raw_size,
            file_size,
            file_sha256,
        })
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if self.sink.is_some() {
            self.sink = None;
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

/// sha256 of a file's bytes, as hex.
pub fn sha256_file(path: &Path) -> Result<String, SnapshotFileError> {
    let mut f = BufReader::new(File::open(path).map_err(io(path))?);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Whether a file holds zstd data (by its magic number, not its name).
pub fn is_zstd(path: &Path) -> Result<bool, SnapshotFileError> {
    let mut magic = [0u8; 4];
    let mut f = File::open(path).map_err(io(path))?;
    let n = f.read(&mut magic).map_err(io(path))?;
    Ok(n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd])
}

/// Checks a snapshot file (decompressing zstd on the fly) and, when `out` is given, writes the plain snapshot
/// there (for `etcdctl snapshot restore`). Returns the plain size. `progress` is called with bytes read.
pub fn verify(
    path: &Path,
    out: Option<&Path>,
    mut progress: impl FnMut(u64),
) -> Result<u64, SnapshotFileError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if meta.is_dir() {
        return Err(SnapshotFileError::IsDir {
            path: path.display().to_string(),
        });
    }
    let file = File::open(path).map_err(io(path))?;
    let mut reader: Box<dyn Read> = if is_zstd(path)? {
        Box::new(zstd::stream::read::Decoder::new(file).map_err(io(path))?)
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    };
    let mut writer = match out {
        Some(o) => Some(BufWriter::new(File::create(o).map_err(io(o))?)),
        None => None,
    };
    let mut check = TrailerCheck::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        check.update(&buf[..n]);
        progress(check.total);
        if let (Some(w), Some(o)) = (writer.as_mut(), out) {
            w.write_all(&buf[..n]).map_err(io(o))?;
        }
    }
    let size = check.check(path)?;
    if let (Some(w), Some(o)) = (writer, out) {
        let f = w.into_inner().map_err(|e| io(o)(e.into_error()))?;
        f.sync_all().map_err(io(o))?;
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream shaped like etcd's: 512-aligned data plus its sha256.
    fn fake_snapshot(pages: usize) -> Vec<u8> {
        let mut data: Vec<u8> = (0..pages * 512).map(|i| (i * 7 % 251) as u8).collect();
        let h = Sha256::digest(&data);
        data.extend_from_slice(&h);
        data
    }

    fn write(
        dir: &Path,
        name: &str,
        bytes: &[u8],
        compress: bool,
    ) -> Result<WrittenSnapshot, SnapshotFileError> {
        let mut w = SnapshotWriter::create(&dir.join(name), compress)?;
        for chunk in bytes.chunks(32 * 1024 + 5) {
            w.write_chunk(chunk)?;
        }
        w.finish()
    }

    #[test]
    fn good_stream_lands_under_its_final_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = fake_snapshot(300);
        let w = write(dir.path(), "s-n-1", &bytes, false).unwrap();
        assert_eq!(w.raw_size, bytes.len() as u64);
        assert_eq!(w.file_size, bytes.len() as u64);
        assert_eq!(w.file_sha256, sha256_file(&w.path).unwrap());
        assert_eq!(std::fs::read(&w.path).unwrap(), bytes);
        assert!(!dir.path().join("s-n-1.part").exists());
        assert_eq!(verify(&w.path, None, |_| {}).unwrap(), bytes.len() as u64);
    }

    #[test]
    fn compressed_snapshot_verifies_and_decompresses_to_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = fake_snapshot(1000);
        let w = write(dir.path(), "s-n-1.zst", &bytes, true).unwrap();
        assert!(w.file_size < bytes.len() as u64);
        assert!(is_zstd(&w.path).unwrap());
        let out = dir.path().join("plain.db");
        verify(&w.path, Some(&out), |_| {}).unwrap();
        assert_eq!(std::fs::read(out).unwrap(), bytes);
    }

    #[test]
    fn corrupted_or_truncated_stream_never_gets_a_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = fake_snapshot(10);
        bytes[100] ^= 1;
        assert!(matches!(
            write(dir.path(), "bad", &bytes, false),
            Err(SnapshotFileError::BadHash { .. })
        ));
        let short = &fake_snapshot(10)[..5000];
        assert!(matches!(
            write(dir.path(), "short", short, false),
            Err(SnapshotFileError::BadSize { .. })
        ));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn verify_names_the_file_and_refuses_directories() {
        let dir = tempfile::tempdir().unwrap();
        let e = verify(dir.path(), None, |_| {}).unwrap_err();
        assert!(matches!(e, SnapshotFileError::IsDir { .. }));
        let f = dir.path().join("corrupt");
        let mut bytes = fake_snapshot(4);
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        std::fs::write(&f, bytes).unwrap();
        assert!(verify(&f, None, |_| {})
            .unwrap_err()
            .to_string()
            .contains("corrupt"));
        let missing = dir.path().join("missing");
        assert!(verify(&missing, None, |_| {})
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }
}
