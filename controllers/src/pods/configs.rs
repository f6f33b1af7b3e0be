//! ConfigMaps and Secrets as pods use them: the agent's shared caches of both, what a container's
//! environment reads from them, and their volumes, written as the kubelet's atomic writer does (the files
//! in a new directory, then one symlink swap, so a reader never sees half of a change). Secret volumes
//! live on a tmpfs of their own.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hostlet_api::configs::{ConfigMap, Secret};
use hostlet_api::expansion::EnvValue;
use hostlet_api::manifest::{ConfigKind, Container, KeyToPath, PodManifest, VolumeSource};
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::informer::Object;
use hostlet_runtime::{InformerFactory, Store};

/// The informer label of the ConfigMaps' cache.
pub const CONFIG_MAPS_INFORMER: &str = "config-maps";
/// The informer label of the Secrets' cache.
pub const SECRETS_INFORMER: &str = "secrets";
/// A configMap volume's files, unless the pod says otherwise.
pub const DEFAULT_CONFIG_MAP_MODE: u32 = 0o644;
/// A secret volume's files, unless the pod says otherwise: 0644 as in Kubernetes, so that a container
/// not running as root reads them (on the host, the pod's directory is 0700: see `pod_secret_default`).
pub const DEFAULT_SECRET_MODE: u32 = 0o644;
/// The default of agents from before 0644: a pod they made keeps it until it is recreated, so that an
/// upgrade does not change its files' modes under it.
pub const LEGACY_SECRET_MODE: u32 = 0o400;
/// In a pod's directory: the default mode of its secret files, in octal, written before its first volume.
pub const SECRET_MODE_RECORD: &str = "secret-default-mode";
/// The link the visible names point through; swapped to change every file at once.
const DATA_LINK: &str = "..data";
const DATA_LINK_NEW: &str = "..data_tmp";
/// A secret volume's tmpfs: two copies of the largest Secret fit (the old set stays until the swap).
const SECRET_TMPFS_BYTES: usize = 4 * hostlet_api::configs::MAX_DATA_BYTES;

/// The agent's caches of every ConfigMap and Secret (one informer each, shared through the factory).
#[derive(Clone)]
pub struct ConfigStores {
    pub config_maps: Store<String, Object<ConfigMap>>,
    pub secrets: Store<String, Object<Secret>>,
    layout: KeyLayout,
    /// Through the node API a node reads only what its pods use: both lists are read again when that
    /// changes.
    relist: [hostlet_runtime::nodeapi::Relist; 2],
}

/// Why a container cannot be made with what it refers to. Never holds a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Missing {
        kind: ConfigKind,
        name: String,
    },
    Invalid {
        kind: ConfigKind,
        name: String,
        why: String,
    },
    MissingKey {
        kind: ConfigKind,
        name: String,
        key: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Missing { kind, name } => write!(f, "{} {name:?} not found", kind.noun()),
            ConfigError::Invalid { kind, name, why } => {
                write!(f, "{} {name:?} is not valid: {why}", kind.noun())
            }
            ConfigError::MissingKey { kind, name, key } => {
                write!(f, "couldn't find key {key} in {} {name:?}", kind.noun())
            }
        }
    }
}

impl ConfigStores {
    /// The two caches, started through `factory` (or the ones it already runs); secrets are opened with
    /// `keys` as they arrive (without: each is invalid, saying why).
    pub fn start(
        factory: &InformerFactory,
        layout: &KeyLayout,
        keys: Option<crate::secrets::SecretKeys>,
    ) -> ConfigStores {
        let (config_maps, relist_config_maps) = factory.relisting_store(
            CONFIG_MAPS_INFORMER,
            layout.config_maps_prefix(),
            |_key, value| ConfigMap::parse(value).map_err(|e| e.to_string()),
        );
        let (secrets, relist_secrets) = factory.relisting_store(
            SECRETS_INFORMER,
            layout.secrets_prefix(),
            move |_key, value| {
                // The parser's message may quote the text; a secret's never goes into a log or status.
                let s =
                    Secret::parse(value).map_err(|_| "not a Secret (YAML or JSON)".to_string())?;
                match (&keys, &s.encrypted) {
                    (_, None) => Ok(s),
                    (Some(k), Some(_)) => k.open(&s),
                    (None, Some(_)) => {
                        Err("sealed, and this node holds no material to open secrets".to_string())
                    }
                }
            },
        );
        ConfigStores {
            config_maps,
            secrets,
            layout: layout.clone(),
            relist: [relist_config_maps, relist_secrets],
        }
    }

    /// Reads both lists again whenever the set of ConfigMaps and Secrets that `pods` use changes, until
    /// `shutdown` (a no-op over etcd, where the caches hold every one).
    pub async fn follow_references(
        self,
        pods: Store<String, crate::sources::DesiredPod>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut changes = pods.subscribe();
        let mut used = std::collections::BTreeSet::new();
        loop {
            let now: std::collections::BTreeSet<(ConfigKind, String)> = pods
                .state()
                .iter()
                .flat_map(|p| p.manifest.config_refs())
                .collect();
            if now != used {
                used = now;
                for r in &self.relist {
                    r.now();
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                batch = changes.next_batch() => if batch.is_none() { return },
            }
        }
    }

    /// Both caches have their first list.
    pub fn is_ready(&self) -> bool {
        self.config_maps.is_ready() && self.secrets.is_ready()
    }

    pub async fn wait_until_ready(&self) {
        self.config_maps.wait_until_ready().await;
        self.secrets.wait_until_ready().await;
    }

    /// What an etcd key of either cache names.
    pub fn named_by(&self, key: &str) -> Option<(ConfigKind, String)> {
        match self.layout.parse(key)? {
            Key::ConfigMap { name } => Some((ConfigKind::ConfigMap, name)),
            Key::Secret { name } => Some((ConfigKind::Secret, name)),
            _ => None,
        }
    }

    /// The etcd revision the object was last written at (0 when it is not there).
    pub fn revision(&self, kind: ConfigKind, name: &str) -> i64 {
        match kind {
            ConfigKind::ConfigMap => self
                .config_maps
                .get(&self.layout.config_map(name))
                .map_or(0, |o| o.mod_revision),
            ConfigKind::Secret => self
                .secrets
                .get(&self.layout.secret(name))
                .map_or(0, |o| o.mod_revision),
        }
    }

    /// The object's keys and bytes.
    pub fn entries(
        &self,
        kind: ConfigKind,
        name: &str,
    ) -> Result<BTreeMap<String, Vec<u8>>, ConfigError> {
        let invalid = |why: String| ConfigError::Invalid {
            kind,
            name: name.to_string(),
            why,
        };
        let missing = || ConfigError::Missing {
            kind,
            name: name.to_string(),
        };
        let problems = |errs: Vec<hostlet_api::FieldError>| {
            let paths: Vec<String> = errs.into_iter().map(|e| e.path).collect();
            invalid(format!("fields {}", paths.join(", ")))
        };
        match kind {
            ConfigKind::ConfigMap => {
                let o = self
                    .config_maps
                    .get(&self.layout.config_map(name))
                    .ok_or_else(missing)?;
                let cm = o.value.as_ref().map_err(|e| invalid(e.message()))?;
                let errs = cm.validate();
                if !errs.is_empty() || cm.metadata.name != name {
                    return Err(problems(errs));
                }
                Ok(cm.entries())
            }
            ConfigKind::Secret => {
                let o = self
                    .secrets
                    .get(&self.layout.secret(name))
                    .ok_or_else(missing)?;
                let s = o.value.as_ref().map_err(|e| invalid(e.message()))?;
                let errs = s.validate();
                if !errs.is_empty() || s.metadata.name != name {
                    return Err(problems(errs));
                }
                Ok(s.entries())
            }
        }
    }

    /// The container's environment: `envFrom` first, then `env` (a later name wins), each `valueFrom`
    /// read now. A missing object or key that is not optional is an error.
    pub fn environment(&self, c: &Container) -> Result<Vec<(String, String)>, ConfigError> {
        let mut values: Vec<(String, EnvValue)> = Vec::new();
        for f in &c.env_from {
            let Some((kind, r)) = f.reference() else {
                continue;
            };
            match self.entries(kind, &r.name) {
                Ok(entries) => {
                    let prefix = f.prefix.as_deref().unwrap_or("");
                    for (k, v) in entries {
                        let text = String::from_utf8_lossy(&v).into_owned();
                        values.push((format!("{prefix}{k}"), EnvValue::Resolved(text)));
                    }
                }
                Err(ConfigError::Missing { .. }) if r.optional == Some(true) => {}
                Err(e) => return Err(e),
            }
        }
        for e in &c.env {
            let Some((kind, sel)) = e.value_from.as_ref().and_then(|f| f.reference()) else {
                values.push((e.name.clone(), EnvValue::Literal(e.value.clone())));
                continue;
            };
            let optional = sel.optional == Some(true);
            match self.entries(kind, &sel.name) {
                Ok(entries) => match entries.get(&sel.key) {
                    Some(v) => values.push((
                        e.name.clone(),
                        EnvValue::Resolved(String::from_utf8_lossy(v).into_owned()),
                    )),
                    None if optional => {}
                    None => {
                        return Err(ConfigError::MissingKey {
                            kind,
                            name: sel.name.clone(),
                            key: sel.key.clone(),
                        })
                    }
                },
                Err(ConfigError::Missing { .. }) if optional => {}
                Err(e) => return Err(e),
            }
        }
        Ok(hostlet_api::expansion::environment_of(&values))
    }

    /// The files of one configMap or secret volume: (relative path, bytes, mode). `None` for another kind
    /// of volume. A missing optional object gives no files.
    /// `secret_default` is the pod's default for secret files (see `pod_secret_default`).
    pub fn volume_files(
        &self,
        src: &VolumeSource,
        secret_default: u32,
    ) -> Option<Result<Vec<VolumeFile>, ConfigError>> {
        let (kind, name, items, default_mode, optional, fallback) =
            match (&src.config_map, &src.secret) {
                (Some(c), _) => (
                    ConfigKind::ConfigMap,
                    &c.name,
                    &c.items,
                    c.default_mode,
                    c.optional,
                    DEFAULT_CONFIG_MAP_MODE,
                ),
                (None, Some(s)) => (
                    ConfigKind::Secret,
                    &s.secret_name,
                    &s.items,
                    s.default_mode,
                    s.optional,
                    secret_default,
                ),
                (None, None) => return None,
            };
        let optional = optional == Some(true);
        let mode = default_file_mode(default_mode, fallback);
        Some(match self.entries(kind, name) {
            Ok(entries) => project(kind, name, entries, items, mode, optional),
            Err(ConfigError::Missing { .. }) if optional => Ok(Vec::new()),
            Err(e) => Err(e),
        })
    }
}

/// A volume's file mode where no `items[].mode` says one: its `defaultMode`, else the kind's default.
fn default_file_mode(default_mode: Option<i32>, fallback: u32) -> u32 {
    default_mode.map_or(fallback, |m| m as u32 & 0o777)
}

/// One file of a configMap or secret volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    pub path: String,
    pub bytes: Vec<u8>,
    pub mode: u32,
}

fn project(
    kind: ConfigKind,
    name: &str,
    entries: BTreeMap<String, Vec<u8>>,
    items: &[KeyToPath],
    mode: u32,
    optional: bool,
) -> Result<Vec<VolumeFile>, ConfigError> {
    if items.is_empty() {
        return Ok(entries
            .into_iter()
            .map(|(path, bytes)| VolumeFile { path, bytes, mode })
            .collect());
    }
    let mut out = Vec::new();
    for it in items {
        match entries.get(&it.key) {
            Some(bytes) => out.push(VolumeFile {
                path: it.path.clone(),
                bytes: bytes.clone(),
                mode: it.mode.map_or(mode, |m| m as u32 & 0o777),
            }),
            None if optional => {}
            None => {
                return Err(ConfigError::MissingKey {
                    kind,
                    name: name.to_string(),
                    key: it.key.clone(),
                })
            }
        }
    }
    Ok(out)
}

/// The default mode of a pod's secret files, from its record and whether its volumes directory exists.
/// A record says the mode; without one, a pod whose volumes were already made is from an agent that
/// kept no record (0400); any other pod is new and takes today's default.
pub fn secret_default_mode(recorded: Option<&str>, volumes_exist: bool) -> u32 {
    match recorded {
        Some(text) => u32::from_str_radix(text.trim(), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .unwrap_or(DEFAULT_SECRET_MODE),
        None if volumes_exist => LEGACY_SECRET_MODE,
        None => DEFAULT_SECRET_MODE,
    }
}

/// The default mode of the secret files of the pod whose directory is `pod_dir`. With `record`, a new
/// pod's default is written down before any of its volumes is made, so that it holds for the pod's whole
/// life (the record goes with the pod's directory, so a recreated pod takes the default of its day).
pub fn pod_secret_default(pod_dir: &Path, record: bool) -> io::Result<u32> {
    let path = pod_dir.join(SECRET_MODE_RECORD);
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let volumes_exist = pod_dir.join("volumes").exists();
    let mode = secret_default_mode(recorded.as_deref(), volumes_exist);
    if record && recorded.is_none() && !volumes_exist {
        // Files any user may read: only root goes through the pod's directory on the host (a container
        // sees its volumes through their bind mounts, not this path).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(pod_dir)?;
        // Whole or absent: a torn record would read as the current default, not the one written.
        let tmp = pod_dir.join(format!("{SECRET_MODE_RECORD}.tmp"));
        std::fs::write(&tmp, format!("{mode:o}\n"))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(mode)
}

/// Every configMap or secret volume of the pod: (volume name, source).
pub fn config_volumes(pod: &PodManifest) -> impl Iterator<Item = (&str, VolumeSource)> {
    pod.volumes.iter().filter_map(|v| {
        let src = v.effective_source();
        (src.config_map.is_some() || src.secret.is_some()).then_some((v.name.as_str(), src))
    })
}

/// Whether `dir` is a mount point (another file system than its parent's).
fn is_mount_point(dir: &Path) -> io::Result<bool> {
    let here = std::fs::metadata(dir)?;
    let parent = std::fs::metadata(dir.join(".."))?;
    Ok(here.dev() != parent.dev())
}

/// Mounts a tmpfs of its own on a secret volume's directory (once: a mounted one is kept).
pub fn ensure_tmpfs(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if is_mount_point(dir)? {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).map_err(io::Error::other);
    let target = c(&dir.display().to_string())?;
    let fstype = c("tmpfs")?;
    let opts = c(&format!("size={SECRET_TMPFS_BYTES},mode=0755"))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts every secret tmpfs under a pod's volume directory, so that the directory can go.
pub fn unmount_volumes(volumes_dir: &Path) {
    let Ok(read) = std::fs::read_dir(volumes_dir) else {
        return;
    };
    for entry in read.flatten() {
        let path = entry.path();
        if is_mount_point(&path).unwrap_or(false) {
            if let Ok(target) = std::ffi::CString::new(path.display().to_string()) {
                // SAFETY: a NUL-terminated path that outlives the call.
                let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
                if rc != 0 {
                    tracing::warn!(dir = %path.display(), error = %io::Error::last_os_error(), "unmounting a secret volume failed");
                }
            }
        }
    }
}

/// The files as the volume shows them now, if it was written before.
fn current(dir: &Path) -> Option<Vec<VolumeFile>> {
    let data = dir.join(DATA_LINK);
    std::fs::symlink_metadata(&data).ok()?;
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(data.join(&rel)).ok()?.flatten() {
            let rel_path = rel.join(entry.file_name());
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                stack.push(rel_path);
            } else {
                out.push(VolumeFile {
                    path: rel_path.display().to_string(),
                    bytes: std::fs::read(entry.path()).ok()?,
                    mode: meta.permissions().mode() & 0o777,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Some(out)
}

/// Writes the volume's files unless it already shows exactly them; returns whether it changed. A reader
/// sees the old set or the new one, never a mix: the new set goes into a directory of its own, then the
/// `..data` link is replaced by a rename.
pub fn write_volume(dir: &Path, files: &[VolumeFile]) -> io::Result<bool> {
    let mut wanted = files.to_vec();
    wanted.sort_by(|a, b| a.path.cmp(&b.path));
    if current(dir).as_ref() == Some(&wanted) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    let old = std::fs::read_link(dir.join(DATA_LINK)).ok();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let name = format!("..{stamp}");
    let fresh = dir.join(&name);
    std::fs::create_dir(&fresh)?;
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))?;
    for f in &wanted {
        let path = fresh.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &f.bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))?;
    }
    let tmp = dir.join(DATA_LINK_NEW);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA_LINK))?;
    // The names a reader opens: one link per top-level entry, through `..data`.
    let tops: std::collections::BTreeSet<String> = wanted
        .iter()
        .filter_map(|f| f.path.split('/').next().map(str::to_string))
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("{DATA_LINK}/{top}"), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let n = entry.file_name().to_string_lossy().into_owned();
        if n.starts_with("..") {
            continue;
        }
        if !tops.contains(&n) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old {
        if old != Path::new(&name) {
            let _ = std::fs::remove_dir_all(dir.join(old));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str, mode: u32) -> VolumeFile {
        VolumeFile {
            path: path.into(),
            bytes: text.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn a_pod_s_secret_default_is_its_record_else_0400_for_an_old_pod_else_0644() {
        assert_eq!(secret_default_mode(Some("644\n"), true), 0o644);
        assert_eq!(secret_default_mode(Some("400\n"), true), 0o400);
        // A torn or foreign record: only this agent writes one, so today's default.
        assert_eq!(secret_default_mode(Some(""), true), DEFAULT_SECRET_MODE);
        assert_eq!(
            secret_default_mode(Some("7777"), false),
            DEFAULT_SECRET_MODE
        );
        // Volumes made with no record: an agent from before 0644 made them.
        assert_eq!(secret_default_mode(None, true), 0o400);
        assert_eq!(secret_default_mode(None, false), 0o644);
    }

    #[test]
    fn a_new_pod_s_default_is_recorded_before_its_volumes_and_an_old_pod_s_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        // New: recorded when its volumes are prepared, and kept after they exist.
        let new = tmp.path().join("new");
        assert_eq!(pod_secret_default(&new, false).unwrap(), 0o644);
        assert!(!new.exists(), "only a preparation records");
        assert_eq!(pod_secret_default(&new, true).unwrap(), 0o644);
        assert_eq!(
            std::fs::read_to_string(new.join(SECRET_MODE_RECORD)).unwrap(),
            "644\n"
        );
        let dir_mode = std::fs::metadata(&new).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        std::fs::create_dir_all(new.join("volumes/s")).unwrap();
        assert_eq!(pod_secret_default(&new, false).unwrap(), 0o644);
        assert_eq!(pod_secret_default(&new, true).unwrap(), 0o644);
        // Old: volumes without a record keep 0400, refreshed or prepared again, and nothing is written.
        let old = tmp.path().join("old");
        std::fs::create_dir_all(old.join("volumes/s")).unwrap();
        assert_eq!(pod_secret_default(&old, false).unwrap(), 0o400);
        assert_eq!(pod_secret_default(&old, true).unwrap(), 0o400);
        assert!(!old.join(SECRET_MODE_RECORD).exists());
        // A record that says otherwise is followed (one written by a later agent, say).
        std::fs::write(old.join(SECRET_MODE_RECORD), "440\n").unwrap();
        assert_eq!(pod_secret_default(&old, false).unwrap(), 0o440);
    }

    #[test]
    fn default_mode_and_item_modes_win_over_either_secret_default() {
        for pod_default in [DEFAULT_SECRET_MODE, LEGACY_SECRET_MODE] {
            assert_eq!(default_file_mode(None, pod_default), pod_default);
            assert_eq!(default_file_mode(Some(0o440), pod_default), 0o440);
            let entries = BTreeMap::from([
                ("a".to_string(), b"1".to_vec()),
                ("b".to_string(), b"2".to_vec()),
            ]);
            let items = [
                KeyToPath {
                    key: "a".into(),
                    path: "a".into(),
                    mode: Some(0o600),
                },
                KeyToPath {
                    key: "b".into(),
                    path: "b".into(),
                    mode: None,
                },
            ];
            let files =
                project(ConfigKind::Secret, "s", entries, &items, pod_default, false).unwrap();
            assert_eq!(files[0].mode, 0o600);
            assert_eq!(files[1].mode, pod_default);
        }
    }

    #[test]
    fn the_writer_swaps_whole_sets_and_drops_names_that_went() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("v");
        assert!(write_volume(&dir, &[file("a", "1", 0o644), file("sub/b", "2", 0o400)]).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        let mode = std::fs::metadata(dir.join("sub/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o400);
        assert!(!write_volume(&dir, &[file("sub/b", "2", 0o400), file("a", "1", 0o644)]).unwrap());
        let first = std::fs::read_link(dir.join(DATA_LINK)).unwrap();
        assert!(write_volume(&dir, &[file("a", "one", 0o644)]).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "one");
        assert!(std::fs::symlink_metadata(dir.join("sub")).is_err());
        assert!(!dir.join(&first).exists(), "the old set is removed");
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), 3, "{left:?}");
    }

    #[test]
    fn a_reader_never_sees_a_mix_of_two_sets() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("v");
        let set = |n: usize| {
            vec![
                file("a", &format!("{n}"), 0o644),
                file("b", &format!("{n}"), 0o644),
            ]
        };
        write_volume(&dir, &set(0)).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Both through one resolution of `..data`, as a reader of a directory would.
                    let Ok(target) = std::fs::read_link(dir.join(DATA_LINK)) else {
                        continue;
                    };
                    let base = dir.join(target);
                    if let (Ok(a), Ok(b)) = (
                        std::fs::read_to_string(base.join("a")),
                        std::fs::read_to_string(base.join("b")),
                    ) {
                        assert_eq!(a, b, "a mixed set");
                        reads += 1;
                    }
                }
                reads
            })
        };
        for n in 1..200 {
            write_volume(&dir, &set(n)).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
