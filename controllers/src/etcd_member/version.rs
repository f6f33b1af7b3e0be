//! What an etcd binary can do, from its `--version`: the one place where etcd 3.4, 3.5 and 3.6 differ for
//! hostlet (the tool that restores a snapshot, flags a version rejects), and the version gate's input.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// An etcd release, `major.minor.patch` (a pre-release suffix is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl EtcdVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        EtcdVersion {
            major,
            minor,
            patch,
        }
    }

    /// `3.5.1`, `v3.5.1`, `3.5.1-rc.0`, or a cluster version `3.5` / `3.5.0` (patch 0).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_start_matches('v');
        let core = s.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(EtcdVersion::new(major, minor, patch))
    }

    /// The release line, `3.5`: what etcd's cluster version is made of.
    pub fn minor_line(&self) -> (u32, u32) {
        (self.major, self.minor)
    }

    /// `3.5`.
    pub fn minor_text(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl std::fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Reads the server version from `etcd --version` output (`etcd Version: 3.5.1`).
pub fn parse_version_output(text: &str) -> Option<EtcdVersion> {
    text.lines().find_map(|l| {
        let l = l.trim();
        let rest = l
            .strip_prefix("etcd Version:")
            .or_else(|| l.strip_prefix("etcd version:"))?;
        EtcdVersion::parse(rest)
    })
}

/// The program that writes a member dir from a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTool {
    /// `etcdutl snapshot restore` (3.5 and later; 3.6's etcdctl has no restore).
    Etcdutl(PathBuf),
    /// `etcdctl snapshot restore` with `ETCDCTL_API=3` (3.4).
    Etcdctl(PathBuf),
}

impl RestoreTool {
    pub fn program(&self) -> &Path {
        match self {
            RestoreTool::Etcdutl(p) | RestoreTool::Etcdctl(p) => p,
        }
    }

    /// A program named by the operator: its file name says which one it is.
    pub fn named(program: PathBuf) -> Self {
        let is_etcdutl = program
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("etcdutl"));
        if is_etcdutl {
            RestoreTool::Etcdutl(program)
        } else {
            RestoreTool::Etcdctl(program)
        }
    }

    /// `etcdutl` or `etcdctl`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            RestoreTool::Etcdutl(_) => "etcdutl",
            RestoreTool::Etcdctl(_) => "etcdctl",
        }
    }
}

/// etcd flags that a release no longer accepts: (flag, the first minor that refuses it).
const REMOVED_FLAGS: &[(&str, EtcdVersion)] = &[
    ("enable-v2", EtcdVersion::new(3, 6, 0)),
    ("experimental-enable-v2v3", EtcdVersion::new(3, 6, 0)),
    ("log-package-levels", EtcdVersion::new(3, 5, 0)),
];

/// What the etcd binary at hand is and what goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub binary: PathBuf,
    pub version: EtcdVersion,
    /// `etcdutl` beside the binary, when there is one.
    pub etcdutl: Option<PathBuf>,
    /// `etcdctl` beside the binary, when there is one.
    pub etcdctl: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("cannot run {binary} --version: {source}")]
    Run {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{binary} --version did not answer within {secs} s")]
    Timeout { binary: String, secs: u64 },
    #[error("{binary} --version printed no etcd version ({output:?})")]
    Unreadable { binary: String, output: String },
}

/// How long `etcd --version` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Capabilities {
    /// Runs `binary --version` (a resolved path) and looks beside it for etcdutl and etcdctl.
    pub async fn probe(binary: &Path) -> Result<Capabilities, VersionError> {
        let shown = binary.display().to_string();
        let run = tokio::process::Command::new(binary)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PROBE_TIMEOUT, run)
            .await
            .map_err(|_| VersionError::Timeout {
                binary: shown.clone(),
                secs: PROBE_TIMEOUT.as_secs(),
            })?
            .map_err(|source| VersionError::Run {
                binary: shown.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = parse_version_output(&text).ok_or_else(|| VersionError::Unreadable {
            binary: shown,
            output: text.chars().take(200).collect(),
        })?;
        Ok(Self::beside(binary, version))
    }

    /// The capabilities of `binary` at `version`, with the tools found in its directory.
    pub fn beside(binary: &Path, version: EtcdVersion) -> Capabilities {
        let sibling = |name: &str| {
            let p = binary.parent()?.join(name);
            super::process::resolve_binary(&p)
        };
        Capabilities {
            binary: binary.to_path_buf(),
            version,
            etcdutl: sibling("etcdutl"),
            etcdctl: sibling("etcdctl"),
        }
    }

    /// The program that restores snapshots for this etcd: etcdutl from 3.5 on (beside the binary, else on
    /// PATH), etcdctl before (beside the binary, else on PATH).
    pub fn restore_tool(&self) -> RestoreTool {
        if self.version >= EtcdVersion::new(3, 5, 0) {
            RestoreTool::Etcdutl(self.etcdutl.clone().unwrap_or_else(|| "etcdutl".into()))
        } else {
            RestoreTool::Etcdctl(self.etcdctl.clone().unwrap_or_else(|| "etcdctl".into()))
        }
    }

    /// Checks extra etcd flags (`--NAME=VALUE`) against what this version still accepts.
    pub fn check_args(&self, args: &[String]) -> Result<(), String> {
        for a in args {
            let name = a.trim_start_matches('-').split('=').next().unwrap_or("");
            if let Some((flag, since)) = REMOVED_FLAGS.iter().find(|(f, _)| *f == name) {
                if self.version >= *since {
                    return Err(format!(
                        "--etcd-arg {flag}: etcd {} no longer accepts --{flag} (removed in {})",
                        self.version,
                        since.minor_text()
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_every_form_etcd_prints() {
        type Row = (&'static str, Option<(u32, u32, u32)>);
        let table: &[Row] = &[
            ("3.4.23", Some((3, 4, 23))),
            ("v3.5.1", Some((3, 5, 1))),
            (" 3.6.0-rc.2 ", Some((3, 6, 0))),
            ("3.5", Some((3, 5, 0))),
            ("3.5.0", Some((3, 5, 0))),
            ("3.10.2+dirty", Some((3, 10, 2))),
            ("", None),
            ("3", None),
            ("3.x.1", None),
            ("3.5.1.2", None),
            ("not a version", None),
        ];
        for (text, want) in table {
            assert_eq!(
                EtcdVersion::parse(text),
                want.map(|(a, b, c)| EtcdVersion::new(a, b, c)),
                "{text:?}"
            );
        }
        assert!(EtcdVersion::new(3, 4, 23) < EtcdVersion::new(3, 5, 0));
        assert!(EtcdVersion::new(3, 5, 9) < EtcdVersion::new(3, 5, 10));
        assert_eq!(EtcdVersion::new(3, 5, 1).to_string(), "3.5.1");
    }

    #[test]
    fn version_output_of_each_release_is_read() {
        let table: &[(&str, Option<&str>)] = &[
            (
                "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\nGo Version: go1.19.8\nGo OS/Arch: linux/amd64\n",
                Some("3.4.23"),
            ),
            (
                "etcd Version: 3.5.1\nGit SHA: e8732fb5f\nGo Version: go1.16.3\nGo OS/Arch: linux/amd64\n",
                Some("3.5.1"),
            ),
            ("etcd Version: 3.6.4\nGit SHA: 5400cdc\n", Some("3.6.4")),
            ("etcd Version: 3.7.0\n", Some("3.7.0")),
            ("etcdctl version: 3.5.1\nAPI version: 3.5\n", None),
            ("Usage: etcd [flags]\n", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(
                parse_version_output(text),
                want.and_then(EtcdVersion::parse),
                "{text:?}"
            );
        }
    }

    fn caps(version: &str, etcdutl: bool, etcdctl: bool) -> Capabilities {
        Capabilities {
            binary: "/opt/etcd/etcd".into(),
            version: EtcdVersion::parse(version).unwrap(),
            etcdutl: etcdutl.then(|| "/opt/etcd/etcdutl".into()),
            etcdctl: etcdctl.then(|| "/opt/etcd/etcdctl".into()),
        }
    }

    #[test]
    fn the_restore_tool_follows_the_version_and_what_is_beside_the_binary() {
        let table: &[(&str, bool, bool, RestoreTool)] = &[
            (
                "3.4.23",
                false,
                false,
                RestoreTool::Etcdctl("etcdctl".into()),
            ),
            (
                "3.4.23",
                false,
                true,
                RestoreTool::Etcdctl("/opt/etcd/etcdctl".into()),
            ),
            (
                "3.5.1",
                true,
                true,
                RestoreTool::Etcdutl("/opt/etcd/etcdutl".into()),
            ),
            ("3.5.1", false, true, RestoreTool::Etcdutl("etcdutl".into())),
            (
                "3.6.4",
                true,
                true,
                RestoreTool::Etcdutl("/opt/etcd/etcdutl".into()),
            ),
        ];
        for (v, utl, ctl, want) in table {
            assert_eq!(&caps(v, *utl, *ctl).restore_tool(), want, "{v} {utl} {ctl}");
        }
        assert_eq!(
            RestoreTool::named("/usr/local/bin/etcdutl".into()).name(),
            "etcdutl"
        );
        assert_eq!(RestoreTool::named("etcdctl".into()).name(), "etcdctl");
    }

    #[test]
    fn flags_a_release_removed_are_refused_from_that_release_on() {
        let v2 = vec!["--enable-v2=true".to_string()];
        assert!(caps("3.4.23", false, true).check_args(&v2).is_ok());
        assert!(caps("3.5.1", true, true).check_args(&v2).is_ok());
        let e = caps("3.6.0", true, true).check_args(&v2).unwrap_err();
        assert!(e.contains("enable-v2") && e.contains("3.6"), "{e}");
        let levels = vec!["--log-package-levels=etcdserver=DEBUG".to_string()];
        assert!(caps("3.4.23", false, true).check_args(&levels).is_ok());
        assert!(caps("3.5.1", true, true).check_args(&levels).is_err());
        let fine = vec!["--snapshot-count=10000".to_string()];
        assert!(caps("3.6.0", true, true).check_args(&fine).is_ok());
    }

    #[tokio::test]
    async fn probing_reads_a_binary_and_finds_its_siblings() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let etcd = tmp.path().join("etcd");
        std::fs::write(&etcd, "#!/bin/sh\necho 'etcd Version: 3.5.1'\n").unwrap();
        std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
        let utl = tmp.path().join("etcdutl");
        std::fs::write(&utl, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&utl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = Capabilities::probe(&etcd).await.unwrap();
        assert_eq!(c.version, EtcdVersion::new(3, 5, 1));
        assert_eq!(c.restore_tool(), RestoreTool::Etcdutl(utl));
        assert_eq!(c.etcdctl, None);
        std::fs::write(&etcd, "#!/bin/sh\necho hello\n").unwrap();
        let e = Capabilities::probe(&etcd).await.unwrap_err();
        assert!(e.to_string().contains("printed no etcd version"), "{e}");
    }
}
