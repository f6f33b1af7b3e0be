//! Encrypted snapshot files: AES-256-GCM in the STREAM construction (`aead::stream`, big-endian 32-bit
//! counter), so every chunk is authenticated on its own, chunks cannot be reordered, and the last chunk is
//! marked: a truncated file fails as surely as a changed byte.
//!
//! Layout: `MAGIC` (8 bytes), the key's id (8 bytes), the stream's nonce prefix (7 bytes), then chunks of
//! `CHUNK` plaintext bytes each followed by its 16-byte tag; the last chunk holds 0..=`CHUNK` bytes. The
//! header is every chunk's associated data, so it cannot be changed either.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use aes_gcm::aead::stream::{DecryptorBE32, EncryptorBE32};
use aes_gcm::aead::{KeyInit, Payload};
use aes_gcm::Aes256Gcm;
use rand::RngCore;
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

/// The first bytes of an encrypted snapshot file.
pub const MAGIC: &[u8; 8] = b"HLSNAPE1";
/// The file name suffix of an encrypted snapshot.
pub const SUFFIX: &str = ".enc";
const KEY_ID_LEN: usize = 8;
const NONCE_PREFIX_LEN: usize = 7;
/// Header bytes before the first chunk.
pub const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_PREFIX_LEN;
/// Plaintext bytes per chunk.
const CHUNK: usize = 1 << 20;
const TAG_LEN: usize = 16;

/// The 256-bit snapshot key, read from `--snapshot-encryption-key-file`. Its bytes are never printed.
#[derive(Clone)]
pub struct SnapshotKey {
    key: [u8; 32],
    /// Where it came from, for messages.
    file: String,
}

impl fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SnapshotKey({})", self.file)
    }
}

impl PartialEq for SnapshotKey {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for SnapshotKey {}

/// Why a key file cannot be used. The file's content is never part of the message.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: readable by group or others (mode {mode:04o}); a key file must be 0600 or 0400 (chmod 600 {file})")]
    Mode { file: String, mode: u32 },
    #[error("{file}: not a key: the file must hold 64 hex digits (a 256-bit key, as `openssl rand -hex 32` writes it)")]
    Format { file: String },
}

impl SnapshotKey {
    /// Reads a key file: 64 hex digits, surrounding whitespace allowed, readable by its owner only.
    pub fn load(path: &Path) -> Result<SnapshotKey, KeyFileError> {
        let file = path.display().to_string();
        let io_err = |source| KeyFileError::Io {
            file: file.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io_err)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Mode { file, mode });
        }
        let text = std::fs::read(path).map_err(io_err)?;
        let trimmed = text.trim_ascii();
        let mut key = [0u8; 32];
        if trimmed.len() != 64 || hex::decode_to_slice(trimmed, &mut key).is_err() {
            return Err(KeyFileError::Format { file });
        }
        Ok(SnapshotKey { key, file })
    }

    /// A key from raw bytes (tests and benchmarks).
    pub fn from_bytes(key: [u8; 32], file: &str) -> SnapshotKey {
        SnapshotKey {
            key,
            file: file.to_string(),
        }
    }

    /// The key file's path, for messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// A short public id of the key, stored in each file's header so that a wrong key is named as such
    /// rather than as a damaged file. It reveals nothing of the key.
    pub fn id(&self) -> [u8; KEY_ID_LEN] {
        let mut h = Sha256::new();
        h.update(b"hostlet snapshot key id\0");
        h.update(self.key);
        let d = h.finalize();
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&d[..KEY_ID_LEN]);
        id
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(&self.key.into())
    }
}

impl Drop for SnapshotKey {
    fn drop(&mut self) {
        // Do not leave the key in freed memory.
        self.key.zeroize();
    }
}

/// Why an encrypted snapshot cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("the snapshot is encrypted and no key was given (--snapshot-encryption-key-file)")]
    NoKey,
    #[error("the snapshot was encrypted with another key (key id {found}) than {file} (key id {expected}), or its header was changed")]
    WrongKey {
        file: String,
        found: String,
        expected: String,
    },
    #[error("chunk {chunk} does not authenticate: the file was changed or damaged")]
    Tampered { chunk: u64 },
    #[error("the encrypted stream ends early (truncated after chunk {chunk})")]
    Truncated { chunk: u64 },
    #[error("a snapshot key was given ({file}) but the snapshot is not encrypted; restore a plain snapshot without --snapshot-encryption-key-file")]
    NotEncrypted { file: String },
}

impl OpenError {
    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }

    /// The error inside an I/O error from [`OpenReader`], if that is what it is.
    pub fn from_io(e: &io::Error) -> Option<&OpenError> {
        e.get_ref().and_then(|i| i.downcast_ref::<OpenError>())
    }
}

/// Encrypts everything written to it into `inner`; [`SealWriter::finish`] writes the last chunk.
pub struct SealWriter<W: Write> {
    inner: W,
    header: [u8; HEADER_LEN],
    enc: Option<EncryptorBE32<Aes256Gcm>>,
    buf: Vec<u8>,
}

impl<W: Write> SealWriter<W> {
    /// Writes the header with a fresh random nonce prefix.
    pub fn new(mut inner: W, key: &SnapshotKey) -> io::Result<Self> {
        let mut prefix = [0u8; NONCE_PREFIX_LEN];
        rand::rng().fill_bytes(&mut prefix);
        let mut header = [0u8; HEADER_LEN];
        header[..MAGIC.len()].copy_from_slice(MAGIC);
        header[MAGIC.len()..MAGIC.len() + KEY_ID_LEN].copy_from_slice(&key.id());
        header[MAGIC.len() + KEY_ID_LEN..].copy_from_slice(&prefix);
        inner.write_all(&header)?;
        let enc = EncryptorBE32::from_aead(key.cipher(), (&prefix).into());
        Ok(SealWriter {
            inner,
            header,
            enc: Some(enc),
            buf: Vec::with_capacity(CHUNK + TAG_LEN),
        })
    }

    fn seal_full_chunk(&mut self) -> io::Result<()> {
        let enc = self
            .enc
            .as_mut()
            .ok_or_else(|| io::Error::other("encrypted stream already finished"))?;
        enc.encrypt_next_in_place(&self.header, &mut self.buf)
            .map_err(|_| io::Error::other("encrypting a snapshot chunk failed"))?;
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Seals the last chunk (possibly empty) and hands back the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        let enc = self
            .enc
            .take()
            .ok_or_else(|| io::Error::other("encrypted stream already finished"))?;
        let mut last = std::mem::take(&mut self.buf);
        enc.encrypt_last_in_place(&self.header, &mut last)
            .map_err(|_| io::Error::other("encrypting a snapshot chunk failed"))?;
        self.inner.write_all(&last)?;
        Ok(self.inner)
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W: Write> Write for SealWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut rest = data;
        while !rest.is_empty() {
            // A full chunk is sealed only once more data follows: the last chunk is sealed by `finish`.
            if self.buf.len() == CHUNK {
                self.seal_full_chunk()?;
            }
            let n = rest.len().min(CHUNK - self.buf.len());
            self.buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Whether `prefix` (a file's first bytes) starts an encrypted snapshot.
pub fn is_sealed(prefix: &[u8]) -> bool {
    prefix.starts_with(MAGIC)
}

/// Decrypts and authenticates an encrypted snapshot as it is read. Errors are I/O errors of kind
/// `InvalidData` wrapping an [`OpenError`]; no plaintext of a chunk is handed out before its tag checked.
pub struct OpenReader<R: Read> {
    inner: R,
    header: [u8; HEADER_LEN],
    dec: Option<DecryptorBE32<Aes256Gcm>>,
    /// Ciphertext read ahead (one byte beyond a full chunk tells that it is not the last).
    raw: Vec<u8>,
    /// Plaintext not yet handed out, from `pos`.
    plain: Vec<u8>,
    pos: usize,
    chunk: u64,
    done: bool,
}

impl<R: Read> OpenReader<R> {
    /// Reads and checks the header.
    pub fn new(mut inner: R, key: &SnapshotKey) -> io::Result<Self> {
        let mut header = [0u8; HEADER_LEN];
        let n = read_full(&mut inner, &mut header)?;
        if n < HEADER_LEN || !is_sealed(&header) {
            return Err(OpenError::Truncated { chunk: 0 }.into_io());
        }
        let found = &header[MAGIC.len()..MAGIC.len() + KEY_ID_LEN];
        if found != key.id() {
            return Err(OpenError::WrongKey {
                file: key.file.clone(),
                found: hex::encode(found),
                expected: hex::encode(key.id()),
            }
            .into_io());
        }
        let mut prefix = [0u8; NONCE_PREFIX_LEN];
        prefix.copy_from_slice(&header[MAGIC.len() + KEY_ID_LEN..]);
        let dec = DecryptorBE32::from_aead(key.cipher(), (&prefix).into());
        Ok(OpenReader {
            inner,
            header,
            dec: Some(dec),
            raw: Vec::with_capacity(CHUNK + TAG_LEN + 1),
            plain: Vec::new(),
            pos: 0,
            chunk: 0,
            done: false,
        })
    }

    /// Decrypts the next chunk into `plain`.
    fn next_chunk(&mut self) -> io::Result<()> {
        let want = CHUNK + TAG_LEN + 1;
        let have = self.raw.len();
        self.raw.resize(want, 0);
        let n = read_full(&mut self.inner, &mut self.raw[have..])?;
        self.raw.truncate(have + n);
        let chunk = self.chunk;
        self.chunk += 1;
        if self.raw.len() == want {
            let carry = self.raw[CHUNK + TAG_LEN];
            self.raw.truncate(CHUNK + TAG_LEN);
            let dec = self
                .dec
                .as_mut()
                .ok_or_else(|| OpenError::Truncated { chunk }.into_io())?;
            dec.decrypt_next_in_place(&self.header, &mut self.raw)
                .map_err(|_| OpenError::Tampered { chunk }.into_io())?;
            self.plain = std::mem::replace(&mut self.raw, Vec::with_capacity(want));
            self.raw.push(carry);
        } else {
            if self.raw.len() < TAG_LEN {
                return Err(OpenError::Truncated { chunk }.into_io());
            }
            let dec = self
                .dec
                .take()
                .ok_or_else(|| OpenError::Truncated { chunk }.into_io())?;
            let last = std::mem::take(&mut self.raw);
            // Either a changed byte or a cut at a chunk boundary (a full chunk is not marked last).
            self.plain = dec
                .decrypt_last(Payload {
                    msg: &last,
                    aad: &self.header,
                })
                .map_err(|_| OpenError::Tampered { chunk }.into_io())?;
            self.done = true;
        }
        self.pos = 0;
        Ok(())
    }
}

impl<R: Read> Read for OpenReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.plain.len() {
            if self.done {
                return Ok(0);
            }
            self.next_chunk()?;
        }
        let n = out.len().min(self.plain.len() - self.pos);
        out[..n].copy_from_slice(&self.plain[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SnapshotKey {
        SnapshotKey::from_bytes([b; 32], "test.key")
    }

    fn seal(data: &[u8], k: &SnapshotKey) -> Vec<u8> {
        let mut w = SealWriter::new(Vec::new(), k).unwrap();
        for c in data.chunks(70_001) {
            w.write_all(c).unwrap();
        }
        w.finish().unwrap()
    }

    fn open(sealed: &[u8], k: &SnapshotKey) -> Result<Vec<u8>, OpenError> {
        let mut out = Vec::new();
        OpenReader::new(sealed, k)
            .and_then(|mut r| r.read_to_end(&mut out))
            .map_err(|e| OpenError::from_io(&e).cloned().expect("an OpenError"))?;
        Ok(out)
    }

    #[test]
    fn round_trips_at_and_around_chunk_boundaries() {
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let sealed = seal(&data, &key(1));
            assert!(is_sealed(&sealed));
            assert_eq!(open(&sealed, &key(1)).unwrap(), data, "len {len}");
        }
    }

    #[test]
    fn wrong_key_changed_byte_and_truncation_are_refused() {
        let data: Vec<u8> = (0..2 * CHUNK + 100).map(|i| (i % 251) as u8).collect();
        let sealed = seal(&data, &key(1));
        assert!(matches!(
            open(&sealed, &key(2)),
            Err(OpenError::WrongKey { .. })
        ));
        for at in [HEADER_LEN + 5, HEADER_LEN + CHUNK + 20, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert!(
                matches!(open(&bad, &key(1)), Err(OpenError::Tampered { .. })),
                "byte {at}"
            );
        }
        // Cut at a chunk boundary (the last chunk dropped whole) and in the middle of a chunk.
        let boundary = HEADER_LEN + 2 * (CHUNK + TAG_LEN);
        for cut in [boundary, boundary - 7, HEADER_LEN + 3] {
            assert!(open(&sealed[..cut], &key(1)).is_err(), "cut at {cut}");
        }
        // The nonce prefix is authenticated too.
        let mut bad = sealed.clone();
        bad[HEADER_LEN - 1] ^= 1;
        assert!(open(&bad, &key(1)).is_err());
    }

    #[test]
    fn key_files_must_be_private_and_hold_64_hex_digits() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("snap.key");
        std::fs::write(&f, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SnapshotKey::load(&f).unwrap_err().to_string();
        assert!(e.contains("snap.key") && e.contains("0644"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = SnapshotKey::load(&f).unwrap();
        assert_eq!(k, SnapshotKey::from_bytes([0xab; 32], "x"));
        assert!(!format!("{k:?}").contains("abab"));
        std::fs::write(&f, "secret-but-not-hex").unwrap();
        let e = SnapshotKey::load(&f).unwrap_err().to_string();
        assert!(e.contains("64 hex digits") && !e.contains("secret"), "{e}");
    }
}
