//! Snapshot files on disk: written to `.part`, checked against etcd's sha256 trailer, optionally compressed
//! with zstd, fsynced and renamed — so a file under a final name is always whole.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::encryption::{self, OpenError, OpenReader, SealWriter, SnapshotKey};

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
    #[error("{path}: {error}")]
    Encrypted { path: String, error: OpenError },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> SnapshotFileError + '_ {
    move |source| match OpenError::from_io(&source) {
        Some(error) => SnapshotFileError::Encrypted {
            path: path.display().to_string(),
            error: error.clone(),
        },
        None => SnapshotFileError::Io {
            path: path.display().to_string(),
            source,
        },
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

/// Everything written to the file passes here, so the file's sha256 is known without reading it back.
struct Hashing {
    file: BufWriter<File>,
    hash: Sha256,
}

impl Write for Hashing {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(data)?;
        self.hash.update(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Compression comes before encryption: ciphertext does not compress.
enum Sink {
    Plain(Hashing),
    Zstd(zstd::stream::write::Encoder<'static, Hashing>),
    Sealed(SealWriter<Hashing>),
    ZstdSealed(zstd::stream::write::Encoder<'static, SealWriter<Hashing>>),
}

impl Sink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Plain(w) => w,
            Sink::Zstd(w) => w,
            Sink::Sealed(w) => w,
            Sink::ZstdSealed(w) => w,
        }
    }

    fn finish(self) -> std::io::Result<Hashing> {
        match self {
            Sink::Plain(w) => Ok(w),
            Sink::Zstd(w) => w.finish(),
            Sink::Sealed(w) => w.finish(),
            Sink::ZstdSealed(w) => w.finish()?.finish(),
        }
    }
}

/// Creates `path` readable by its owner only (snapshots hold the whole keyspace).
pub fn create_private(path: &Path) -> Result<File, SnapshotFileError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))
}

/// Creates `dir` (and missing parents) 0700, and makes an existing `dir` 0700.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Writes one snapshot: feed it the stream's chunks, then `finish` (checks, fsyncs and renames) or drop it
/// (the `.part` is removed).
pub struct SnapshotWriter {
    part: PathBuf,
    dest: PathBuf,
    sink: Option<Sink>,
    check: TrailerCheck,
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
    /// Starts writing `dest` through `dest.part` (0600), compressed and/or encrypted with `key`.
    pub fn create(
        dest: &Path,
        compress: bool,
        key: Option<&SnapshotKey>,
    ) -> Result<Self, SnapshotFileError> {
        let mut part = dest.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let file = create_private(&part)?;
        let hashing = Hashing {
            file: BufWriter::with_capacity(1 << 20, file),
            hash: Sha256::new(),
        };
        let made = (|| -> std::io::Result<Sink> {
            Ok(match (compress, key) {
                (false, None) => Sink::Plain(hashing),
                (true, None) => Sink::Zstd(zstd::stream::write::Encoder::new(hashing, 3)?),
                (false, Some(k)) => Sink::Sealed(SealWriter::new(hashing, k)?),
                (true, Some(k)) => Sink::ZstdSealed(zstd::stream::write::Encoder::new(
                    SealWriter::new(hashing, k)?,
                    3,
                )?),
            })
        })();
        let sink = match made {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                return Err(io(&part)(e));
            }
        };
        Ok(SnapshotWriter {
            part,
            dest: dest.to_path_buf(),
            sink: Some(sink),
            check: TrailerCheck::default(),
        })
    }

    pub fn write_chunk(&mut self, chunk: &[u8]) -> Result<(), SnapshotFileError> {
        self.check.update(chunk);
        let part = self.part.clone();
        match self.sink.as_mut() {
            Some(s) => s.writer().write_all(chunk).map_err(io(&part)),
            None => Ok(()),
        }
    }

    /// Checks the trailer, flushes, fsyncs, renames into place and fsyncs the directory.
    pub fn finish(mut self) -> Result<WrittenSnapshot, SnapshotFileError> {
        let part = self.part.clone();
        let check = std::mem::take(&mut self.check);
        let raw_size = check.check(&self.dest)?;
        let Some(sink) = self.sink.take() else {
            return Err(io(&part)(std::io::Error::other("writer already finished")));
        };
        // From here on the `.part` is this function's to remove on failure.
        let result = (|| {
            let hashing = sink.finish().map_err(io(&part))?;
            let file_sha256 = hex::encode(hashing.hash.finalize());
            let file = hashing
                .file
                .into_inner()
                .map_err(|e| io(&part)(e.into_error()))?;
            file.sync_all().map_err(io(&part))?;
            drop(file);
            let file_size = std::fs::metadata(&part).map_err(io(&part))?.len();
            std::fs::rename(&part, &self.dest).map_err(io(&self.dest))?;
            Ok((file_size, file_sha256))
        })();
        let (file_size, file_sha256) = match result {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                return Err(e);
            }
        };
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

/// Whether a file is an encrypted snapshot (by its header, not its name).
pub fn is_encrypted(path: &Path) -> Result<bool, SnapshotFileError> {
    let mut magic = [0u8; encryption::MAGIC.len()];
    let mut f = File::open(path).map_err(io(path))?;
    let mut n = 0;
    while n < magic.len() {
        match f.read(&mut magic[n..]).map_err(io(path))? {
            0 => break,
            k => n += k,
        }
    }
    Ok(encryption::is_sealed(&magic[..n]))
}

/// Checks a snapshot file (decrypting with `key` and decompressing zstd on the fly) and, when `out` is given,
/// writes the plain snapshot there (0600, for `etcdctl snapshot restore`). Returns the plain size. An
/// encrypted file needs its key; with a key, a file that is not encrypted is refused (it could have been put
/// in place of the encrypted one). `progress` is called with plain bytes read.
pub fn verify(
    path: &Path,
    out: Option<&Path>,
    key: Option<&SnapshotKey>,
    mut progress: impl FnMut(u64),
) -> Result<u64, SnapshotFileError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if meta.is_dir() {
        return Err(SnapshotFileError::IsDir {
            path: path.display().to_string(),
        });
    }
    let encrypted = is_encrypted(path)?;
    let file = BufReader::with_capacity(1 << 20, File::open(path).map_err(io(path))?);
    let opened: Box<dyn Read> = match (encrypted, key) {
        (true, Some(k)) => Box::new(OpenReader::new(file, k).map_err(io(path))?),
        (true, None) => {
            return Err(SnapshotFileError::Encrypted {
                path: path.display().to_string(),
                error: OpenError::NoKey,
            })
        }
        (false, Some(k)) => {
            return Err(SnapshotFileError::Encrypted {
                path: path.display().to_string(),
                error: OpenError::NotEncrypted {
                    file: k.file().to_string(),
                },
            })
        }
        (false, None) => Box::new(file),
    };
    let mut opened = BufReader::with_capacity(1 << 20, opened);
    let head = opened.fill_buf().map_err(io(path))?;
    let zstd = head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]);
    let mut reader: Box<dyn Read> = if zstd {
        Box::new(zstd::stream::read::Decoder::with_buffer(opened).map_err(io(path))?)
    } else {
        Box::new(opened)
    };
    let mut writer = match out {
        Some(o) => Some(BufWriter::new(create_private(o)?)),
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
        key: Option<&SnapshotKey>,
    ) -> Result<WrittenSnapshot, SnapshotFileError> {
        let mut w = SnapshotWriter::create(&dir.join(name), compress, key)?;
        for chunk in bytes.chunks(32 * 1024 + 5) {
            w.write_chunk(chunk)?;
        }
        w.finish()
    }

    #[test]
    fn good_stream_lands_under_its_final_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = fake_snapshot(300);
        let w = write(dir.path(), "s-n-1", &bytes, false, None).unwrap();
        assert_eq!(w.raw_size, bytes.len() as u64);
        assert_eq!(w.file_size, bytes.len() as u64);
        assert_eq!(w.file_sha256, sha256_file(&w.path).unwrap());
        assert_eq!(std::fs::read(&w.path).unwrap(), bytes);
        assert!(!dir.path().join("s-n-1.part").exists());
        assert_eq!(
            verify(&w.path, None, None, |_| {}).unwrap(),
            bytes.len() as u64
        );
    }

    #[test]
    fn compressed_snapshot_verifies_and_decompresses_to_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = fake_snapshot(1000);
        let w = write(dir.path(), "s-n-1.zst", &bytes, true, None).unwrap();
        assert!(w.file_size < bytes.len() as u64);
        assert!(is_zstd(&w.path).unwrap());
        let out = dir.path().join("plain.db");
        verify(&w.path, Some(&out), None, |_| {}).unwrap();
        assert_eq!(std::fs::read(out).unwrap(), bytes);
    }

    #[test]
    fn corrupted_or_truncated_stream_never_gets_a_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = fake_snapshot(10);
        bytes[100] ^= 1;
        assert!(matches!(
            write(dir.path(), "bad", &bytes, false, None),
            Err(SnapshotFileError::BadHash { .. })
        ));
        let short = &fake_snapshot(10)[..5000];
        assert!(matches!(
            write(dir.path(), "short", short, false, None),
            Err(SnapshotFileError::BadSize { .. })
        ));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn verify_names_the_file_and_refuses_directories() {
        let dir = tempfile::tempdir().unwrap();
        let e = verify(dir.path(), None, None, |_| {}).unwrap_err();
        assert!(matches!(e, SnapshotFileError::IsDir { .. }));
        let f = dir.path().join("corrupt");
        let mut bytes = fake_snapshot(4);
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        std::fs::write(&f, bytes).unwrap();
        assert!(verify(&f, None, None, |_| {})
            .unwrap_err()
            .to_string()
            .contains("corrupt"));
        let missing = dir.path().join("missing");
        assert!(verify(&missing, None, None, |_| {})
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }

    #[test]
    fn encrypted_snapshots_are_private_hide_the_data_and_need_their_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = SnapshotKey::from_bytes([7; 32], "k");
        let mut bytes = fake_snapshot(3000);
        let marker = b"marker-value-in-the-keyspace";
        bytes[1000..1000 + marker.len()].copy_from_slice(marker);
        let n = bytes.len() - TRAILER_LEN;
        let h = Sha256::digest(&bytes[..n]);
        bytes[n..].copy_from_slice(&h);
        for compress in [false, true] {
            let name = format!("s-n-1-{compress}");
            let w = write(dir.path(), &name, &bytes, compress, Some(&key)).unwrap();
            let on_disk = std::fs::read(&w.path).unwrap();
            assert_eq!(w.file_sha256, sha256_file(&w.path).unwrap());
            assert!(!on_disk.windows(marker.len()).any(|x| x == marker));
            let mode = std::fs::metadata(&w.path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            assert!(is_encrypted(&w.path).unwrap());
            let out = dir.path().join(format!("plain-{compress}"));
            verify(&w.path, Some(&out), Some(&key), |_| {}).unwrap();
            assert_eq!(std::fs::read(&out).unwrap(), bytes);
            let e = verify(&w.path, None, None, |_| {}).unwrap_err();
            assert!(
                matches!(
                    e,
                    SnapshotFileError::Encrypted {
                        error: OpenError::NoKey,
                        ..
                    }
                ),
                "{e}"
            );
            let other = SnapshotKey::from_bytes([8; 32], "other");
            let e = verify(&w.path, None, Some(&other), |_| {}).unwrap_err();
            assert!(e.to_string().contains("another key"), "{e}");
            let mut bad = on_disk.clone();
            bad[on_disk.len() / 2] ^= 1;
            let tampered = dir.path().join(format!("tampered-{compress}"));
            std::fs::write(&tampered, bad).unwrap();
            let e = verify(&tampered, None, Some(&key), |_| {}).unwrap_err();
            assert!(e.to_string().contains("changed"), "{e}");
        }
        let plain = write(dir.path(), "plain", &bytes, false, None).unwrap();
        let e = verify(&plain.path, None, Some(&key), |_| {}).unwrap_err();
        assert!(e.to_string().contains("not encrypted"), "{e}");
    }
}
