//! A Docker engine of a test's own: a second dockerd whose root is a size-limited tmpfs the test mounts, in a
//! network namespace the test makes, so that its images are its own (no image of the host's engine, or of
//! another test, is ever in it) and its filesystem can fill for real. Everything it made goes with it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::member_support::{eventually, output_text, signal, stdout};

pub const MIB: u64 = 1 << 20;

/// A dockerd of the test's own, on a tmpfs; everything it made goes with it.
pub struct TestEngine {
    dir: PathBuf,
    daemon: Option<Child>,
    netns: Option<String>,
}

impl TestEngine {
    /// A dockerd on a tmpfs of `fs_mib` MiB under `dir`.
    pub fn start(dir: &Path, fs_mib: u64) -> TestEngine {
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(dir.join("exec")).unwrap();
        std::fs::write(dir.join("daemon.json"), "{}").unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={fs_mib}m,mode=0700")])
            .arg("tmpfs")
            .arg(&root)
            .status()
            .expect("mount");
        assert!(
            mounted.success(),
            "mounting a tmpfs for the test engine's root needs root"
        );
        let mut e = TestEngine {
            dir: dir.to_path_buf(),
            daemon: None,
            netns: None,
        };
        // In a network namespace of its own: its default bridge, addresses and routes are its own, and the
        // host's engine (its docker0 included) is never touched. No iptables rules.
        static ENGINES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let ns = format!(
            "hostlet-eng-{}-{}",
            std::process::id(),
            ENGINES.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let made = Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .expect("ip");
        assert!(made.success(), "ip netns add {ns} needs root");
        e.netns = Some(ns.clone());
        // `nsenter --net` rather than `ip netns exec`, which would give it a mount namespace without the
        // host's cgroup mounts.
        let daemon = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg("dockerd")
            .arg(format!(
                "--config-file={}",
                dir.join("daemon.json").display()
            ))
            .arg(format!("--data-root={}", root.display()))
            .arg(format!("--exec-root={}", dir.join("exec").display()))
            .arg(format!("--pidfile={}", dir.join("dockerd.pid").display()))
            .arg(format!("--host=unix://{}", e.socket().display()))
            .args(["--iptables=false", "--ip-masq=false", "--ip6tables=false"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .expect("dockerd (Docker's engine) must be installed");
        e.daemon = Some(daemon);
        eventually("the test engine to answer", Duration::from_secs(60), || {
            e.docker(&["info", "--format", "{{.DockerRootDir}}"])
                .status
                .success()
                .then_some(())
        });
        e
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .arg(format!("--host=unix://{}", self.socket().display()))
            .args(args)
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .unwrap()
    }

    /// A `FROM scratch` image with busybox and `blob_mib` MiB of random bytes of its own.
    pub fn build(&self, tag: &str, blob_mib: u64) {
        let ctx = self
            .dir
            .join(format!("ctx-{}", tag.replace(['/', ':'], "-")));
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::copy("/bin/busybox", ctx.join("busybox")).expect("busybox-static");
        let mut blob = vec![0u8; (blob_mib * MIB) as usize];
        getrandom(&mut blob);
        std::fs::write(ctx.join("blob"), blob).unwrap();
        std::fs::write(
            ctx.join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nCOPY blob /blob\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV PATH=/bin\nCMD [\"sh\"]\n",
        )
        .unwrap();
        let o = self.docker(&["build", "-q", "-t", tag, ctx.to_str().unwrap()]);
        assert!(o.status.success(), "building {tag}: {}", output_text(&o));
        std::fs::remove_dir_all(&ctx).unwrap();
    }

    pub fn images(&self) -> Vec<String> {
        let o = self.docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        let mut v: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
        v.sort();
        v
    }

    /// Bytes used and the size of the tmpfs.
    pub fn usage(&self) -> (u64, u64) {
        let o = Command::new("stat")
            .args(["-f", "-c", "%b %f %S"])
            .arg(self.root())
            .output()
            .unwrap();
        let v: Vec<u64> = stdout(&o)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let (blocks, free, size) = (v[0], v[1], v[2]);
        ((blocks - free) * size, blocks * size)
    }

    /// Grows the filler file so that the filesystem is used `low + extra` bytes: collecting down to the low
    /// threshold then needs about `extra`.
    pub fn fill_to(&self, low: u64, high: u64, extra: u64) {
        let (used, total) = self.usage();
        let filler = self.root().join("filler");
        let have = std::fs::metadata(&filler).map(|m| m.len()).unwrap_or(0);
        let target = total * low / 100 + extra;
        assert!(target > used, "used {used} already past {target}");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&filler)
            .unwrap();
        // Real pages, not a hole: tmpfs counts what is written.
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let chunk = vec![0x5au8; MIB as usize];
        let mut left = target - used;
        while left > 0 {
            let n = left.min(MIB);
            w.write_all(&chunk[..n as usize]).unwrap();
            left -= n;
        }
        w.flush().unwrap();
        drop(w);
        let (now, _) = self.usage();
        assert!(
            now * 100 / total >= high,
            "filled to {now} of {total} (had {have} of filler)"
        );
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        let o = self.docker(&["ps", "-aq"]);
        let ids: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.docker(&args);
        }
        if let Some(mut d) = self.daemon.take() {
            signal(d.id(), "TERM");
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while d.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(self.root()).status();
        if let Some(ns) = self.netns.take() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(buf)
        .unwrap();
}
