//! Snapshot copies in S3-compatible object storage, under `<prefix>/<node>/<file>` with the file's sha256 as
//! object metadata. Every upload is read back (size and stored hash) before it counts. A download is checked
//! against the object's size (and its stored sha256 when there is one, which catches a damaged transfer),
//! but the stored hash is not what makes a snapshot trusted: whoever can write the object can write its
//! metadata too. A restore checks the snapshot itself — the AEAD tags of an encrypted one, etcd's sha256
//! trailer of a plain one (see [`super::file::verify`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, MultipartUpload, ObjectStore,
    PutMultipartOptions, PutPayload, RetryConfig,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use super::retention::SnapshotName;

/// The metadata key holding the object's sha256 (sent as `x-amz-meta-sha256`).
pub const SHA256_META: &str = "sha256";
/// Upload parts: S3 wants at least 5 MiB for every part but the last.
const PART_SIZE: usize = 16 << 20;
/// Parts in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// The length of the next part the server has acknowledged.
async fn part_done(
    parts: &mut JoinSet<Result<u64, object_store::Error>>,
) -> Result<u64, object_store::Error> {
    match parts.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(source)) => Err(object_store::Error::JoinError { source }),
        None => Ok(0),
    }
}

/// Where snapshot copies go. Credentials come from the environment or a file, never from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Target {
    /// `https://host:port` of an S3-compatible server; `None` for AWS itself.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// Folder inside the bucket (may be empty); objects go under `<prefix>/<node>/`.
    pub prefix: String,
    pub region: String,
    /// `bucket.host/key` instead of `host/bucket/key`.
    pub virtual_hosted: bool,
    /// PEM CA bundle for a private endpoint.
    pub ca_file: Option<PathBuf>,
    /// File of `AWS_ACCESS_KEY_ID=…` / `AWS_SECRET_ACCESS_KEY=…` lines (or an AWS credentials file's
    /// `aws_access_key_id = …` lines); without it the same variables are read from the environment.
    pub credentials_file: Option<PathBuf>,
    /// Accept an `http://` endpoint (credentials and snapshots then cross the network in the clear).
    pub allow_http: bool,
}

/// What can go wrong talking to the object store.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("object storage settings: {0}")]
    Config(String),
    #[error("{url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: read back {what} {found:?}, expected {expected:?}")]
    Mismatch {
        url: String,
        what: &'static str,
        found: String,
        expected: String,
    },
    #[error("{url}: sha256 mismatch: the object's data hashes to {found}, its recorded sha256 is {expected} (corrupted object)")]
    BadHash {
        url: String,
        found: String,
        expected: String,
    },
    #[error("{url}: size mismatch: downloaded {found} bytes, the object says {expected}")]
    BadSize {
        url: String,
        found: u64,
        expected: u64,
    },
    #[error("{path}: the file hashed to {found} while it was uploaded, its verified sha256 is {expected}; the upload was aborted (the file changed or the disk returns bad data)")]
    LocalChanged {
        path: String,
        found: String,
        expected: String,
    },
}

impl RemoteError {
    /// Whether the object (or its bucket) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RemoteError::Store {
                source: object_store::Error::NotFound { .. },
                ..
            }
        )
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `s3://bucket/key` → `(bucket, key)`.
pub fn parse_s3_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, key) = rest.split_once('/')?;
    let key = key.trim_matches('/');
    (!bucket.is_empty() && !key.is_empty()).then(|| (bucket.to_string(), key.to_string()))
}

/// Access key id, secret and session token from `file` or, without one, the environment.
fn credentials(file: Option<&Path>) -> Result<(String, String, Option<String>), RemoteError> {
    let mut id = None;
    let mut secret = None;
    let mut token = None;
    match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(io(path))?;
            for line in text.lines() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                    continue;
                }
                let Some((k, v)) = line.split_once('=') else {
                    return Err(RemoteError::Config(format!(
                        "{}: a line is not KEY=VALUE",
                        path.display()
                    )));
                };
                let v = v.trim().trim_matches('"').to_string();
                match k.trim().to_ascii_lowercase().as_str() {
                    "aws_access_key_id" => id = Some(v),
                    "aws_secret_access_key" => secret = Some(v),
                    "aws_session_token" => token = Some(v),
                    other => {
                        return Err(RemoteError::Config(format!(
                            "{}: unknown key {other:?} (expected AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)",
                            path.display()
                        )))
                    }
                }
            }
        }
        None => {
            id = std::env::var("AWS_ACCESS_KEY_ID").ok();
            secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok();
            token = std::env::var("AWS_SESSION_TOKEN").ok();
        }
    }
    let whence = match file {
        Some(p) => p.display().to_string(),
        None => "the environment".to_string(),
    };
    match (id.filter(|s| !s.is_empty()), secret.filter(|s| !s.is_empty())) {
        (Some(i), Some(s)) => Ok((i, s, token.filter(|t| !t.is_empty()))),
        _ => Err(RemoteError::Config(format!(
            "no S3 credentials in {whence}: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are both needed"
        ))),
    }
}

/// A connection to the target bucket.
pub struct Remote {
    store: AmazonS3,
    target: S3Target,
}

impl Remote {
    /// Checks the settings and reads the credentials and CA; no request is made yet.
    pub fn new(target: &S3Target) -> Result<Remote, RemoteError> {
        if target.bucket.is_empty() || target.bucket.contains('/') {
            return Err(RemoteError::Config(format!(
                "bucket {:?}: a bucket name without '/'",
                target.bucket
            )));
        }
        let (id, secret, token) = credentials(target.credentials_file.as_deref())?;
        let mut client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(120));
        if let Some(ca) = &target.ca_file {
            let pem = std::fs::read(ca).map_err(io(ca))?;
            let certs = object_store::Certificate::from_pem_bundle(&pem).map_err(|e| {
                RemoteError::Config(format!("{}: not a PEM CA bundle: {e}", ca.display()))
            })?;
            if certs.is_empty() {
                return Err(RemoteError::Config(format!(
                    "{}: no certificate in the CA file",
                    ca.display()
                )));
            }
            for c in certs {
                client = client.with_root_certificate(c);
            }
        }
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&target.bucket)
            .with_region(&target.region)
            .with_access_key_id(id)
            .with_secret_access_key(secret)
            .with_virtual_hosted_style_request(target.virtual_hosted)
            .with_client_options(client)
            // A failed run is retried by the next scheduled one: give up within seconds, not minutes.
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: Duration::from_secs(30),
            });
        if let Some(t) = token {
            b = b.with_token(t);
        }
        if let Some(ep) = &target.endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(RemoteError::Config(format!(
                    "endpoint {ep:?}: must be an http:// or https:// URL"
                )));
            }
            if ep.starts_with("http://") && !target.allow_http {
                return Err(RemoteError::Config(format!(
                    "endpoint {ep:?}: plain http:// is refused (credentials and snapshots would cross the network in the clear); use https://, or give --snapshot-s3-allow-http"
                )));
            }
            b = b
                .with_endpoint(ep.trim_end_matches('/'))
                .with_allow_http(ep.starts_with("http://"));
        }
        let store = b
            .build()
            .map_err(|e| RemoteError::Config(format!("S3 target: {e}")))?;
        Ok(Remote {
            store,
            target: target.clone(),
        })
    }

    pub fn target(&self) -> &S3Target {
        &self.target
    }

    fn prefix_parts(&self) -> impl Iterator<Item = &str> {
        self.target.prefix.split('/').filter(|p| !p.is_empty())
    }

    /// The folder of `node`'s objects.
    fn node_dir(&self, node: &str) -> ObjectPath {
        ObjectPath::from_iter(self.prefix_parts().chain([node]))
    }

    /// The key of `node`'s `file`.
    pub fn key(&self, node: &str, file: &str) -> ObjectPath {
        ObjectPath::from_iter(self.prefix_parts().chain([node, file]))
    }

    /// `s3://bucket/key` of a key.
    pub fn url_of(&self, key: &ObjectPath) -> String {
        format!("s3://{}/{}", self.target.bucket, key)
    }

    pub fn url(&self, node: &str, file: &str) -> String {
        self.url_of(&self.key(node, file))
    }

    fn store_err(&self, key: &ObjectPath) -> impl Fn(object_store::Error) -> RemoteError + '_ {
        let url = self.url_of(key);
        move |source| RemoteError::Store {
            url: url.clone(),
            source,
        }
    }

    /// Uploads `local` (multipart) as `node`'s `file` with its sha256 as metadata, then reads the object's
    /// size and stored hash back; only a matching read-back is a success.
    pub async fn upload(
        &self,
        local: &Path,
        node: &str,
        file: &str,
        sha256: &str,
    ) -> Result<(), RemoteError> {
        self.upload_with(local, node, file, sha256, |_, _| {}).await
    }

    /// [`Remote::upload`], calling `progress(bytes the server has acknowledged, file size)` once before the
    /// first part and after each part the server has taken (so the bytes count what arrived, not what was
    /// handed to the client).
    pub async fn upload_with(
        &self,
        local: &Path,
        node: &str,
        file: &str,
        sha256: &str,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(), RemoteError> {
        let key = self.key(node, file);
        let err = self.store_err(&key);
        let size = tokio::fs::metadata(local).await.map_err(io(local))?.len();
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(SHA256_META.into()),
            sha256.to_string().into(),
        );
        let opts = PutMultipartOptions {
            attributes,
            ..Default::default()
        };
        let mut upload = self
            .store
            .put_multipart_opts(&key, opts)
            .await
            .map_err(&err)?;
        let mut f = tokio::fs::File::open(local).await.map_err(io(local))?;
        progress(0, size);
        // Each part's task yields its length once the server has it; parts run in the background while
        // the next one is read.
        let mut parts: JoinSet<Result<u64, object_store::Error>> = JoinSet::new();
        let mut acked = 0u64;
        // The bytes sent are hashed as they go: an object never carries a sha256 its data does not have.
        let mut hasher = Sha256::new();
        let sent: Result<(), RemoteError> = async {
            loop {
                while parts.len() >= PARTS_IN_FLIGHT {
                    acked += part_done(&mut parts).await.map_err(&err)?;
                    progress(acked, size);
                }
                let mut part = Vec::with_capacity(PART_SIZE);
                (&mut f)
                    .take(PART_SIZE as u64)
                    .read_to_end(&mut part)
                    .await
                    .map_err(io(local))?;
                if part.is_empty() {
                    break;
                }
                hasher.update(&part);
                let n = part.len() as u64;
                let put = upload.put_part(PutPayload::from(part));
                parts.spawn(async move { put.await.map(|()| n) });
            }
            while !parts.is_empty() {
                acked += part_done(&mut parts).await.map_err(&err)?;
                progress(acked, size);
            }
            let sent_hash = hex::encode(hasher.finalize_reset());
            if sent_hash != sha256 {
                return Err(RemoteError::LocalChanged {
                    path: local.display().to_string(),
                    found: sent_hash,
                    expected: sha256.to_string(),
                });
            }
            upload.complete().await.map_err(&err)?;
            Ok(())
        }
        .await;
        if let Err(e) = sent {
            parts.shutdown().await;
            let _ = upload.abort().await;
            return Err(e);
        }
        let (found_size, found_hash) = self.head(&key).await?;
        let url = self.url_of(&key);
        if found_size != size {
            return Err(RemoteError::Mismatch {
                url,
                what: "size",
                found: found_size.to_string(),
                expected: size.to_string(),
            });
        }
        if found_hash.as_deref() != Some(sha256) {
            return Err(RemoteError::Mismatch {
                url,
                what: "sha256 metadata",
                found: found_hash.unwrap_or_default(),
                expected: sha256.to_string(),
            });
        }
        Ok(())
    }

    /// An object's size and stored sha256.
    pub async fn head(&self, key: &ObjectPath) -> Result<(u64, Option<String>), RemoteError> {
        let r = self
            .store
            .get_opts(
                key,
                GetOptions {
                    head: true,
                    ..Default::default()
                },
            )
            .await
            .map_err(self.store_err(key))?;
        let hash = r
            .attributes
            .get(&Attribute::Metadata(SHA256_META.into()))
            .map(|v| v.to_string());
        Ok((r.meta.size, hash))
    }

    /// `node`'s snapshot objects as `(file, size)`: only names of that node directly under its folder, so
    /// another node's objects (even one whose name starts with this one's) are never seen.
    pub async fn list(&self, node: &str) -> Result<Vec<(String, u64)>, RemoteError> {
        let dir = self.node_dir(node);
        let mut out = Vec::new();
        let mut stream = self.store.list(Some(&dir));
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(self.store_err(&dir))?;
            let Some(file) = meta.location.prefix_match(&dir).and_then(|mut parts| {
                match (parts.next(), parts.next()) {
                    (Some(only), None) => Some(only.as_ref().to_string()),
                    _ => None,
                }
            }) else {
                continue;
            };
            if SnapshotName::parse(&file, node).is_some() {
                out.push((file, meta.size));
            }
        }
        out.sort();
        Ok(out)
    }

    pub async fn delete(&self, node: &str, file: &str) -> Result<(), RemoteError> {
        let key = self.key(node, file);
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err(&key)(e)),
        }
    }

    /// Downloads `key` to `<dest>.part` (0600), checks its size (and the stored sha256 when the object has
    /// one) against the object's, then renames it to `dest`. A mismatch leaves nothing behind. Returns the
    /// size. The caller checks the snapshot itself before using it.
    pub async fn download(&self, key: &str, dest: &Path) -> Result<u64, RemoteError> {
        self.download_with(key, dest, |_, _| {}).await
    }

    /// [`Remote::download`], calling `progress(bytes so far, object size)` after each chunk.
    pub async fn download_with(
        &self,
        key: &str,
        dest: &Path,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<u64, RemoteError> {
        let key = ObjectPath::from(key);
        let url = self.url_of(&key);
        let err = self.store_err(&key);
        let got = self.store.get(&key).await.map_err(&err)?;
        let expected_size = got.meta.size;
        let expected_hash = got
            .attributes
            .get(&Attribute::Metadata(SHA256_META.into()))
            .map(|v| v.to_string());
        let mut part = dest.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let result: Result<u64, RemoteError> = async {
            let mut f = tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&part)
                .await
                .map_err(io(&part))?;
            let mut hasher = Sha256::new();
            let mut n = 0u64;
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(&err)?;
                hasher.update(&chunk);
                n += chunk.len() as u64;
                f.write_all(&chunk).await.map_err(io(&part))?;
                progress(n, expected_size);
            }
            f.sync_all().await.map_err(io(&part))?;
            if n != expected_size {
                return Err(RemoteError::BadSize {
                    url: url.clone(),
                    found: n,
                    expected: expected_size,
                });
            }
            let found = hex::encode(hasher.finalize());
            if let Some(expected) = &expected_hash {
                if !found.eq_ignore_ascii_case(expected) {
                    return Err(RemoteError::BadHash {
                        url: url.clone(),
                        found,
                        expected: expected.clone(),
                    });
                }
            }
            tokio::fs::rename(&part, dest).await.map_err(io(dest))?;
            Ok(n)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_split_into_bucket_and_key() {
        assert_eq!(
            parse_s3_url("s3://b/p/n1/etcd-snapshot-n1-17"),
            Some(("b".into(), "p/n1/etcd-snapshot-n1-17".into()))
        );
        assert_eq!(parse_s3_url("s3://b/"), None);
        assert_eq!(parse_s3_url("s3://b"), None);
        assert_eq!(parse_s3_url("/tmp/x"), None);
    }

    #[test]
    fn credentials_file_takes_env_and_ini_spellings_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("creds");
        std::fs::write(
            &f,
            "# keys\nAWS_ACCESS_KEY_ID=GKid\nAWS_SECRET_ACCESS_KEY=\"sec\"\n",
        )
        .unwrap();
        assert_eq!(
            credentials(Some(&f)).unwrap(),
            ("GKid".into(), "sec".into(), None)
        );
        std::fs::write(
            &f,
            "[default]\naws_access_key_id = a\naws_secret_access_key = b\n",
        )
        .unwrap();
        assert_eq!(
            credentials(Some(&f)).unwrap(),
            ("a".into(), "b".into(), None)
        );
        std::fs::write(&f, "aws_access_key_id = a\n").unwrap();
        let e = credentials(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("AWS_SECRET_ACCESS_KEY") && e.contains("creds"),
            "{e}"
        );
        std::fs::write(&f, "password: x\n").unwrap();
        assert!(credentials(Some(&f))
            .unwrap_err()
            .to_string()
            .contains("KEY=VALUE"));
    }
}
