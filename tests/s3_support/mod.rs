//! A real S3-compatible server for the snapshot tests: Garage, started per test on free ports in its own
//! temp dir (single node, one bucket, one key), stopped and started again on demand, killed on drop.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hostlet_controllers::snapshots::remote::{Remote, S3Target};

use super::member_support::{eventually, free_port};

pub const BUCKET: &str = "snapshots";
pub const KEY_ID: &str = "GKhostlettest0000000001";
pub const SECRET: &str = "hostlet-test-secret-0123456789abcdef";

/// The `garage` binary `hack/install-deps.sh` installs.
fn garage_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GARAGE_BIN") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo_bin = home.join(".cargo/bin/garage");
    if cargo_bin.exists() {
        return cargo_bin;
    }
    PathBuf::from("garage")
}

pub struct Garage {
    pub dir: PathBuf,
    pub s3_port: u16,
    pub rpc_port: u16,
    child: Option<Child>,
    runs: u32,
    _tmp: tempfile::TempDir,
}

impl Garage {
    /// Starts a fresh server and waits until its bucket answers.
    pub fn start() -> Garage {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut g = Garage {
            dir,
            s3_port: free_port(),
            rpc_port: free_port(),
            child: None,
            runs: 0,
            _tmp: tmp,
        };
        let config = format!(
            r#"metadata_dir = "{dir}/meta"
data_dir = "{dir}/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.garage.localhost"
"#,
            dir = g.dir.display(),
            rpc = g.rpc_port,
            s3 = g.s3_port,
            secret = "4425f5c26c5e11581d3223904324dcb5b5d5dfb14e5e7f35e38c595424f5f1e6",
        );
        std::fs::write(g.config_path(), config).unwrap();
        std::fs::write(
            g.credentials_file(),
            format!("AWS_ACCESS_KEY_ID={KEY_ID}\nAWS_SECRET_ACCESS_KEY={SECRET}\n"),
        )
        .unwrap();
        g.resume();
        g
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("garage.toml")
    }

    /// A file with the test key, for `--snapshot-s3-credentials-file`.
    pub fn credentials_file(&self) -> PathBuf {
        self.dir.join("credentials")
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    pub fn log(&self) -> String {
        (1..=self.runs)
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("garage-{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts the server (again, on the same ports and data) and waits until the bucket lists.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "garage already running");
        self.runs += 1;
        let log =
            std::fs::File::create(self.dir.join(format!("garage-{}.log", self.runs))).unwrap();
        let bin = garage_bin();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(self.config_path())
            .args(["server", "--single-node", "--default-bucket"])
            .env("GARAGE_DEFAULT_ACCESS_KEY", KEY_ID)
            .env("GARAGE_DEFAULT_SECRET_KEY", SECRET)
            .env("GARAGE_DEFAULT_BUCKET", BUCKET)
            .env("RUST_LOG", "garage=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): run hack/install-deps.sh",
                    bin.display()
                )
            });
        self.child = Some(child);
        let remote = self.remote("");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if rt.block_on(remote.list("probe")).is_ok() {
                break;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("garage exited ({status}):\n{}", self.log());
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "garage did not serve its bucket within 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Caps the bucket at `max_objects` objects (`None`: no cap), through garage's own admin CLI: writes
    /// beyond it are refused while listing, reading and deleting still work, as when a bucket is full.
    pub fn set_max_objects(&self, max_objects: Option<u64>) {
        let n = max_objects.map_or("none".to_string(), |n| n.to_string());
        let o = Command::new(garage_bin())
            .arg("-c")
            .arg(self.config_path())
            .args(["bucket", "set-quotas", "--max-objects", &n, BUCKET])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "garage bucket set-quotas: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Kills the server; its data stays for [`Garage::resume`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let port = self.s3_port;
        eventually("garage's S3 port to close", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .is_err()
                .then_some(())
        });
    }

    /// The target as the agent gets it.
    pub fn target(&self, prefix: &str) -> S3Target {
        S3Target {
            endpoint: Some(self.endpoint()),
            bucket: BUCKET.into(),
            prefix: prefix.into(),
            region: "garage".into(),
            virtual_hosted: false,
            ca_file: None,
            credentials_file: Some(self.credentials_file()),
            // The test server listens on loopback in plain HTTP.
            allow_http: true,
        }
    }

    pub fn remote(&self, prefix: &str) -> Remote {
        Remote::new(&self.target(prefix)).unwrap()
    }

    /// `hostlet run` flags for this server (credentials from the file).
    pub fn agent_args(&self, prefix: &str) -> Vec<String> {
        vec![
            format!("--snapshot-s3-endpoint={}", self.endpoint()),
            // The test server listens on loopback in plain HTTP.
            "--snapshot-s3-allow-http".to_string(),
            format!("--snapshot-s3-bucket={BUCKET}"),
            format!("--snapshot-s3-prefix={prefix}"),
            "--snapshot-s3-region=garage".to_string(),
            format!(
                "--snapshot-s3-credentials-file={}",
                self.credentials_file().display()
            ),
        ]
    }

    /// Writes `local` as object `key` with `sha256` as its stored hash, through a standard client (s3cmd):
    /// how a test puts an object whose data and recorded hash disagree, which hostlet itself never uploads.
    pub fn put_with_sha256(&self, local: &Path, key: &str, sha256: &str) {
        let cfg = self.dir.join("s3cfg");
        std::fs::write(
            &cfg,
            format!(
                "[default]\naccess_key = {KEY_ID}\nsecret_key = {SECRET}\nhost_base = 127.0.0.1:{p}\nhost_bucket = 127.0.0.1:{p}\nbucket_location = garage\nuse_https = False\nsignature_v2 = False\n",
                p = self.s3_port
            ),
        )
        .unwrap();
        let o = Command::new("s3cmd")
            .arg("-c")
            .arg(&cfg)
            .args(["--no-progress", "--no-mime-magic"])
            .arg(format!("--add-header=x-amz-meta-sha256:{sha256}"))
            .arg("put")
            .arg(local)
            .arg(format!("s3://{BUCKET}/{key}"))
            .output()
            .expect("s3cmd (hack/install-deps.sh installs it)");
        assert!(
            o.status.success(),
            "s3cmd put: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The environment a CLI on a fresh host would have: the usual AWS variables.
    pub fn env(&self) -> [(&'static str, &'static str); 2] {
        [
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ]
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `f` on a fresh current-thread runtime (the tests are synchronous).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
