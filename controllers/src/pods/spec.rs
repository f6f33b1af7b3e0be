//! How a pod manifest becomes container specs: the infra container that owns the network namespace and
//! the app containers joined to it, with their names, labels, volumes and resources.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use hostlet_api::manifest::{Container, PodManifest, Port};
use hostlet_api::naming::{self, ContainerName, Role, INFRA_CONTAINER_NAME};
use hostlet_api::security::{self, PodSecurityLevel};

use super::runtime::{Bind, ContainerLabels, ContainerSpec, Hardening, NetworkMode, PublishedPort};

/// The default `--pause-image`.
pub const DEFAULT_PAUSE_IMAGE: &str = "busybox:latest";
/// The infra container's process: it sleeps on a fifo nobody writes to, with nothing but a shell.
pub const INFRA_COMMAND: [&str; 3] = ["sh", "-c", "rm -f nap && mkfifo nap && exec cat nap"];
/// Linux limits a hostname to 64 bytes; the pod id may be a longer DNS subdomain.
const MAX_HOSTNAME: usize = 63;
/// CFS period hostlet sets with a CPU limit (100 ms, as the kubelet does).
pub const CPU_PERIOD_MICROS: i64 = 100_000;

/// What the specs depend on besides the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    pub node: String,
    pub pause_image: String,
    /// `--data-dir`; emptyDir volumes live under `<data-dir>/pods/<pod-id>/volumes/<name>`.
    pub data_dir: PathBuf,
    /// `--allowed-host-paths`: hostDir volumes must lie under one of these.
    pub allowed_host_paths: Vec<PathBuf>,
    /// `--allowed-devices`: the globs a `CharDevice` or `BlockDevice` hostPath must match.
    pub allowed_devices: Vec<String>,
    /// `--pod-security`.
    pub pod_security: PodSecurityLevel,
    /// `--pod-pids-limit` (`None`: no limit).
    pub pids_limit: Option<i64>,
    /// `--pods-cgroup-parent` (`None`: the engine's default).
    pub cgroup_parent: Option<String>,
    /// The host's resolver configuration, which a pod's `dnsConfig` adds to (under a policy other than None).
    pub host_resolver: hostlet_api::dns::Resolver,
}

/// The default `--pod-pids-limit`.
pub const DEFAULT_PIDS_LIMIT: i64 = 4096;

impl SpecConfig {
    /// Specs for `node` with the defaults of `hostlet run`.
    pub fn new(node: &str, data_dir: impl Into<PathBuf>) -> Self {
        SpecConfig {
            node: node.to_string(),
            pause_image: DEFAULT_PAUSE_IMAGE.to_string(),
            data_dir: data_dir.into(),
            allowed_host_paths: Vec::new(),
            allowed_devices: Vec::new(),
            pod_security: PodSecurityLevel::default(),
            pids_limit: Some(DEFAULT_PIDS_LIMIT),
            cgroup_parent: None,
            host_resolver: hostlet_api::dns::Resolver::default(),
        }
    }
}

/// The device volumes of `pod` (hostPath of type `CharDevice` or `BlockDevice`) checked at admission: the
/// path as written matches one of the `allowed` globs, and what it leads to is a device of that kind. By
/// volume name, the device's own path (a `/dev/serial/by-id/…` link followed).
pub fn admit_devices(
    pod: &PodManifest,
    allowed: &[String],
) -> Result<BTreeMap<String, PathBuf>, Vec<String>> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = BTreeMap::new();
    let mut errors = device_violations(pod, allowed);
    if !errors.is_empty() {
        return Err(errors);
    }
    for (field, v, h) in device_volumes(pod) {
        let path = h.path.as_str();
        let kind = h.kind.as_deref().unwrap_or_default();
        match std::fs::canonicalize(path).and_then(|real| Ok((std::fs::metadata(&real)?, real))) {
            Ok((meta, real)) => {
                let ft = meta.file_type();
                let fits = match kind {
                    "CharDevice" => ft.is_char_device(),
                    _ => ft.is_block_device(),
                };
                if fits {
                    out.insert(v.name.clone(), real);
                } else {
                    errors.push(format!(
                        "{field}: {path:?} is not a {}",
                        if kind == "CharDevice" {
                            "character device"
                        } else {
                            "block device"
                        }
                    ));
                }
            }
            Err(e) => errors.push(format!("{field}: device {path:?}: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The device volumes of `pod` whose path matches none of the `allowed` globs, each with its field path:
/// what `pod validate --allowed-devices` and the agent refuse.
pub fn device_violations(pod: &PodManifest, allowed: &[String]) -> Vec<String> {
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    device_volumes(pod)
        .filter(|(_, _, h)| {
            !allowed
                .iter()
                .any(|g| glob::Pattern::new(g).is_ok_and(|p| p.matches_with(&h.path, options)))
        })
        .map(|(field, _, h)| {
            format!(
                "{field}: device {:?} is not allowed on this host (--allowed-devices: {})",
                h.path,
                if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                }
            )
        })
        .collect()
}

/// Each device volume with the field path of its host path, in the form the pod was written in.
fn device_volumes(
    pod: &PodManifest,
) -> impl Iterator<
    Item = (
        String,
        &hostlet_api::manifest::Volume,
        &hostlet_api::manifest::HostDir,
    ),
> {
    pod.volumes.iter().enumerate().filter_map(move |(i, v)| {
        let h = v.source.as_ref()?.host_dir.as_ref()?;
        if !h.is_device() {
            return None;
        }
        let field = format!("volumes[{i}].source.hostDir.path");
        let field = match pod.form {
            hostlet_api::manifest::Form::V1 => hostlet_api::v1::path_in_v1(&field),
            hostlet_api::manifest::Form::Legacy => field,
        };
        Some((field, v, h))
    })
}

/// The host's resolver configuration as `/etc/resolv.conf` says (empty when it cannot be read).
pub fn host_resolver() -> hostlet_api::dns::Resolver {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| hostlet_api::dns::parse_resolv_conf(&t))
        .unwrap_or_default()
}

/// `<data-dir>/pods/<pod-id>`: everything of the pod on the host's disk.
pub fn pod_dir(data_dir: &Path, pod_id: &str) -> PathBuf {
    data_dir.join("pods").join(pod_id)
}

/// Where the output of a container's previous instance is kept (`pod logs --previous`).
pub fn previous_log_path(data_dir: &Path, pod_id: &str, container: &str) -> PathBuf {
    pod_dir(data_dir, pod_id)
        .join("logs")
        .join(format!("{container}.previous.log"))
}

/// Where an emptyDir volume of a pod lives.
pub fn empty_dir_path(data_dir: &Path, pod_id: &str, volume: &str) -> PathBuf {
    pod_dir(data_dir, pod_id).join("volumes").join(volume)
}

/// A hostDir path as the host's kernel would find it: symlinks followed and `..` applied on the real
/// tree. A part that does not exist yet is taken as written (Docker creates it), but may not climb out
/// with `..`.
pub fn resolve_host_path(path: &Path) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err("is not an absolute path".into());
    }
    let existing = path
        .ancestors()
        .find_map(|a| std::fs::canonicalize(a).ok().map(|c| (a, c)));
    let Some((ancestor, mut resolved)) = existing else {
        return Err("cannot be resolved".into());
    };
    let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
    for c in rest.components() {
        match c {
            Component::Normal(part) => resolved.push(part),
            Component::CurDir => {}
            _ => return Err(format!("climbs out of {} with ..", resolved.display())),
        }
    }
    Ok(resolved)
}

/// Resolves the pod's hostDir volumes (volume name → resolved path) and checks each against `allowed`
/// (resolved the same way); or every reason the pod may not run on this host.
pub fn resolve_host_dirs(
    pod: &PodManifest,
    allowed: &[PathBuf],
) -> Result<BTreeMap<String, PathBuf>, Vec<String>> {
    let allowed: Vec<PathBuf> = allowed
        .iter()
        .map(|a| resolve_host_path(a).unwrap_or_else(|_| a.clone()))
        .collect();
    let shown = || {
        if allowed.is_empty() {
            "none is allowed; see --allowed-host-paths".to_string()
        } else {
            allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let mut resolved = BTreeMap::new();
    let mut errors = Vec::new();
    for v in &pod.volumes {
        let Some(path) = v.source.as_ref().and_then(|s| s.host_path()) else {
            continue;
        };
        match resolve_host_path(Path::new(path)) {
            Ok(real) if allowed.iter().any(|a| real.starts_with(a)) => {
                resolved.insert(v.name.clone(), real);
            }
            Ok(real) if real != Path::new(path) => errors.push(format!(
                "volume {:?}: hostDir {path:?} resolves to {} which is not under an allowed host path ({})",
                v.name,
                real.display(),
                shown()
            )),
            Ok(_) => errors.push(format!(
                "volume {:?}: hostDir {path:?} is not under an allowed host path ({})",
                v.name,
                shown()
            )),
            Err(why) => errors.push(format!("volume {:?}: hostDir {path:?} {why}", v.name)),
        }
    }
    if errors.is_empty() {
        Ok(resolved)
    } else {
        Err(errors)
    }
}

/// Creates the missing parts of each resolved hostDir path, one directory at a time and never through
/// a symlink (`mkdir` does not follow one), then checks that the path now resolves to itself: after
/// this, nothing of it is taken as written, so a link planted later shows in [`recheck_host_dirs`].
pub fn create_host_dirs(resolved: &BTreeMap<String, PathBuf>) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for (volume, path) in resolved {
        let mut at = PathBuf::from("/");
        let mut failed = None;
        for part in path.components().skip(1) {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) => {
                    failed = Some(format!("{} is not a directory", at.display()));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed = Some(format!("{}: {e}", at.display()));
                    break;
                }
            }
            if let Err(e) = std::fs::create_dir(&at) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    failed = Some(format!("creating {}: {e}", at.display()));
                    break;
                }
            }
        }
        let why = failed.or_else(|| match std::fs::canonicalize(path) {
            Ok(real) if real == *path => None,
            Ok(real) => Some(format!("now resolves to {}", real.display())),
            Err(e) => Some(e.to_string()),
        });
        if let Some(why) = why {
            errors.push(format!(
                "volume {volume:?}: hostDir {}: {why}",
                path.display()
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Checks, just before container `c` is created, that each hostDir it mounts still resolves to the path
/// admitted: a symlink swapped in since (by the host, or by a container of the pod writing to a parent
/// directory) would make the engine bind whatever it points to.
pub fn recheck_host_dirs(
    pod: &PodManifest,
    c: &Container,
    resolved: &BTreeMap<String, PathBuf>,
) -> Result<(), String> {
    for m in &c.volume_mounts {
        let Some(declared) = pod.volume(&m.name).and_then(|v| {
            v.source
                .as_ref()
                .and_then(|s| s.host_path())
                .map(PathBuf::from)
        }) else {
            continue;
        };
        let Some(admitted) = resolved.get(&m.name) else {
            return Err(format!(
                "volume {:?}: hostDir {} was not admitted",
                m.name,
                declared.display()
            ));
        };
        for p in [&declared, admitted] {
            match std::fs::canonicalize(p) {
                Ok(real) if real == *admitted => {}
                Ok(real) => {
                    return Err(format!(
                        "volume {:?}: hostDir {} changed since admission: it resolved to {} and now resolves to {}",
                        m.name,
                        declared.display(),
                        admitted.display(),
                        real.display()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "volume {:?}: hostDir {} changed since admission: {e}",
                        m.name,
                        declared.display()
                    ))
                }
            }
        }
    }
    Ok(())
}

/// The resolved hostDir paths of `pod` that some container mounts read-write.
pub fn writable_host_dirs(pod: &PodManifest, resolved: &BTreeMap<String, PathBuf>) -> Vec<PathBuf> {
    resolved
        .iter()
        .filter(|(name, _)| {
            pod.all_containers()
                .flat_map(|c| c.volume_mounts.iter())
                .any(|m| &m.name == *name && !m.read_only)
        })
        .map(|(_, p)| p.clone())
        .collect()
}

/// Why a hostDir of one pod may not nest with another pod's: a pod that can write a directory can plant
/// a symlink where the other pod's path continues (or replace a directory the other mounts).
pub fn nesting_conflicts(
    mine: &BTreeMap<String, PathBuf>,
    my_writable: &[PathBuf],
    other_pod: &str,
    theirs: &BTreeMap<String, PathBuf>,
    their_writable: &[PathBuf],
) -> Vec<String> {
    let mut out = Vec::new();
    for (volume, path) in mine {
        for w in their_writable {
            if path != w && path.starts_with(w) {
                out.push(format!(
                    "volume {volume:?}: hostDir {} lies below {}, which pod {other_pod} mounts read-write",
                    path.display(),
                    w.display()
                ));
            }
        }
        if my_writable.contains(path) {
            for p in theirs.values() {
                if p != path && p.starts_with(path) {
                    out.push(format!(
                        "volume {volume:?}: hostDir {} is mounted read-write and holds {}, a hostDir of pod {other_pod}",
                        path.display(),
                        p.display()
                    ));
                }
            }
        }
    }
    out
}

/// Why an `--allowed-host-paths` entry may not be one: it is, or holds, a directory whose contents
/// would let a pod take the host (`/`, `/proc`, `/sys`, `/run`, `/var/run`, the data dir), or lies
/// inside the kernel's own trees or the data dir.
pub fn check_allowed_host_path(entry: &Path, data_dir: &Path) -> Result<(), String> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let e = real(entry);
    let data = real(data_dir);
    // `/var/run` is usually a link to `/run`: both spellings are guarded.
    let guarded: [(PathBuf, &str); 8] = [
        (PathBuf::from("/"), "/"),
        (PathBuf::from("/proc"), "/proc"),
        (PathBuf::from("/sys"), "/sys"),
        (PathBuf::from("/run"), "/run"),
        (real(Path::new("/run")), "/run"),
        (PathBuf::from("/var/run"), "/var/run"),
        (real(Path::new("/var/run")), "/var/run"),
        (data.clone(), "the data dir"),
    ];
    for (g, what) in &guarded {
        if g.starts_with(&e) {
            return Err(format!(
                "--allowed-host-paths {}: is or holds {what} ({}); a pod mounting it could take the host",
                entry.display(),
                g.display()
            ));
        }
    }
    for inside in [Path::new("/proc"), Path::new("/sys"), data.as_path()] {
        if e.starts_with(inside) {
            return Err(format!(
                "--allowed-host-paths {}: lies inside {}; a pod mounting it could take the host",
                entry.display(),
                inside.display()
            ));
        }
    }
    Ok(())
}

/// Why a pod may not run on this host although its manifest is valid (see [`resolve_host_dirs`]).
pub fn host_path_violations(pod: &PodManifest, allowed: &[PathBuf]) -> Vec<String> {
    resolve_host_dirs(pod, allowed).err().unwrap_or_default()
}

/// Eight random hex digits, keeping names unique across replacements.
fn name_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

fn name(container: &str, pod_id: &str) -> String {
    ContainerName {
        container: container.to_string(),
        pod_id: pod_id.to_string(),
        suffix: name_suffix(),
    }
    .render()
}

fn hostname(pod_id: &str) -> String {
    let mut h: String = pod_id.chars().take(MAX_HOSTNAME).collect();
    while h.ends_with(['.', '-']) {
        h.pop();
    }
    h
}

fn published(p: &Port) -> Option<PublishedPort> {
    Some(PublishedPort {
        container_port: u16::try_from(p.container_port).ok()?,
        protocol: p.effective_protocol().to_ascii_lowercase(),
        host_ip: p.effective_host_ip(),
        host_port: u16::try_from(p.host_port).ok().filter(|v| *v != 0)?,
    })
}

/// The infra container: the pause image, the pod's hostname and every published port.
pub fn infra_spec(cfg: &SpecConfig, pod: &PodManifest, restart_count: u32) -> ContainerSpec {
    let labels = ContainerLabels {
        node: cfg.node.clone(),
        pod: pod.id.clone(),
        container: INFRA_CONTAINER_NAME.to_string(),
        role: Role::Infra,
        spec_hash: naming::infra_spec_hash(pod, &cfg.pause_image),
        restart_count,
        sidecar: None,
    };
    ContainerSpec {
        name: name(INFRA_CONTAINER_NAME, &pod.id),
        image: cfg.pause_image.clone(),
        command: INFRA_COMMAND.iter().map(|s| s.to_string()).collect(),
        args: Vec::new(),
        working_dir: None,
        env: Vec::new(),
        labels: labels.to_map(),
        hostname: Some(hostname(&pod.id)),
        dns: hostlet_api::dns::resolver(pod, &cfg.host_resolver),
        extra_hosts: hostlet_api::dns::extra_hosts(pod),
        network: NetworkMode::Own {
            ports: pod
                .containers
                .iter()
                .flat_map(|c| c.ports.iter())
                .filter_map(published)
                .collect(),
        },
        binds: Vec::new(),
        cpu_shares: None,
        cpu_period: None,
        cpu_quota: None,
        memory_bytes: None,
        memory_reservation_bytes: None,
        // It only sleeps: nothing it needs is taken away. Its root stays writable for its fifo.
        security: Hardening {
            no_new_privileges: true,
            cap_drop: vec!["ALL".to_string()],
            pids_limit: cfg.pids_limit,
            cgroup_parent: cfg.cgroup_parent.clone(),
            ..Hardening::default()
        },
        stop_signal: None,
        devices: Vec::new(),
        gpus: None,
    }
}

/// An app container joined to the infra container `infra_id`. `host_dirs` are the pod's hostDir volumes
/// as [`resolve_host_dirs`] resolved and checked them: what is mounted.
pub fn app_spec(
    cfg: &SpecConfig,
    pod: &PodManifest,
    host_dirs: &BTreeMap<String, PathBuf>,
    c: &Container,
    infra_id: &str,
    restart_count: u32,
) -> ContainerSpec {
    container_spec(cfg, pod, host_dirs, c, Role::App, infra_id, restart_count)
}

/// An init container: made as an app container is, labelled as what it is.
pub fn init_spec(
    cfg: &SpecConfig,
    pod: &PodManifest,
    host_dirs: &BTreeMap<String, PathBuf>,
    c: &Container,
    infra_id: &str,
    restart_count: u32,
) -> ContainerSpec {
    container_spec(cfg, pod, host_dirs, c, Role::Init, infra_id, restart_count)
}

fn container_spec(
    cfg: &SpecConfig,
    pod: &PodManifest,
    host_dirs: &BTreeMap<String, PathBuf>,
    c: &Container,
    role: Role,
    infra_id: &str,
    restart_count: u32,
) -> ContainerSpec {
    let labels = ContainerLabels {
        node: cfg.node.clone(),
        pod: pod.id.clone(),
        container: c.name.clone(),
        role,
        spec_hash: naming::container_spec_hash(pod, c),
        restart_count,
        sidecar: if role == Role::Init && c.is_sidecar() {
            pod.init_containers
                .iter()
                .position(|i| i.name == c.name)
                .and_then(|i| u32::try_from(i).ok())
        } else {
            None
        },
    };
    let devices = c
        .volume_mounts
        .iter()
        .filter_map(|m| {
            let source = pod.volume(&m.name)?.effective_source();
            let declared = source.device_path()?;
            // Admission puts the device it resolved beside the host dirs.
            let host = host_dirs
                .get(&m.name)
                .map_or_else(|| declared.to_string(), |p| p.display().to_string());
            Some(crate::pods::runtime::DeviceMapping {
                host,
                container: m.mount_path.clone(),
                permissions: if m.read_only { "r" } else { "rwm" }.to_string(),
            })
        })
        .collect();
    let binds = c
        .volume_mounts
        .iter()
        .filter_map(|m| {
            let source = pod.volume(&m.name)?.effective_source();
            if source.device_path().is_some() {
                // Passed as a device, not mounted.
                return None;
            }
            let host_path = match (host_dirs.get(&m.name), source.host_path()) {
                (Some(resolved), _) => resolved.display().to_string(),
                (None, Some(p)) => p.to_string(),
                (None, None) => empty_dir_path(&cfg.data_dir, &pod.id, &m.name)
                    .display()
                    .to_string(),
            };
            // As in Kubernetes, what a ConfigMap or Secret gives is read-only in the container.
            let projected = source.config_map.is_some() || source.secret.is_some();
            Some(Bind {
                host_path,
                container_path: m.mount_path.clone(),
                read_only: m.read_only || projected,
            })
        })
        .collect();
    let cpu = c.cpu_millis().filter(|m| *m > 0);
    // Shares follow the request when there is one (as the kubelet sets them), else the limit.
    let shares_of = c.cpu_request_millis().filter(|m| *m > 0).or(cpu);
    // `$(VAR)` references as Kubernetes expands them (the manifest, and so the spec hash, keeps them).
    let env = hostlet_api::expansion::environment(&c.env);
    ContainerSpec {
        name: name(&c.name, &pod.id),
        image: c.image.clone(),
        command: hostlet_api::expansion::expand_all(&c.command, &env),
        args: hostlet_api::expansion::expand_all(&c.args, &env),
        working_dir: c.working_dir.clone(),
        env,
        labels: labels.to_map(),
        hostname: None,
        dns: None,
        extra_hosts: Vec::new(),
        network: NetworkMode::JoinContainer(infra_id.to_string()),
        binds,
        cpu_shares: shares_of.map(|m| (m * 1024 / 1000).max(2)),
        cpu_period: cpu.map(|_| CPU_PERIOD_MICROS),
        // The kernel refuses a quota under 1 ms.
        cpu_quota: cpu.map(|m| (m * CPU_PERIOD_MICROS / 1000).max(1000)),
        memory_bytes: c.memory_bytes().filter(|b| *b > 0),
        memory_reservation_bytes: c.memory_request_bytes().filter(|b| *b > 0),
        security: hardening(cfg, pod, c),
        stop_signal: c.lifecycle.as_ref().and_then(|l| l.stop_signal.clone()),
        devices,
        gpus: c.gpus(),
    }
}

/// The security settings of one container: the manifest's, merged under the host's level.
pub fn hardening(cfg: &SpecConfig, pod: &PodManifest, c: &Container) -> Hardening {
    let e = security::effective(pod, c, cfg.pod_security);
    Hardening {
        user: e.user,
        privileged: e.privileged,
        read_only_root: e.read_only_root,
        no_new_privileges: e.no_new_privileges,
        cap_add: e.cap_add,
        cap_drop: e.cap_drop,
        seccomp_unconfined: e.seccomp_unconfined,
        pids_limit: cfg.pids_limit,
        cgroup_parent: cfg.cgroup_parent.clone(),
    }
}

/// The container's environment as read from its ConfigMaps and Secrets (see
/// [`super::configs::ConfigStores::environment`]) in place of the manifest's literal one; `command` and
/// `args` expand against it.
pub fn set_environment(spec: &mut ContainerSpec, c: &Container, env: Vec<(String, String)>) {
    spec.command = hostlet_api::expansion::expand_all(&c.command, &env);
    spec.args = hostlet_api::expansion::expand_all(&c.args, &env);
    spec.env = env;
}

/// The emptyDir directories a pod needs (configMap and secret volumes are written, not made empty).
pub fn empty_dirs(cfg: &SpecConfig, pod: &PodManifest) -> Vec<PathBuf> {
    pod.volumes
        .iter()
        .filter(|v| {
            let src = v.effective_source();
            src.host_dir.is_none() && src.config_map.is_none() && src.secret.is_none()
        })
        .map(|v| empty_dir_path(&cfg.data_dir, &pod.id, &v.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlet_api::parse_manifest;

    fn cfg() -> SpecConfig {
        SpecConfig {
            allowed_host_paths: vec!["/srv".into()],
            ..SpecConfig::new("n1", "/var/lib/hostlet")
        }
    }

    const POD: &str = r#"
version: v1beta1
id: web
volumes:
  - name: data
    source: { emptyDir: {} }
  - name: logs
    source: { hostDir: { path: /srv/logs } }
containers:
  - name: httpd
    image: busybox:latest
    command: [httpd, -f, -p, "8080", -h, /data]
    ports: [{ containerPort: 8080, hostPort: 18080, hostIP: 127.0.0.1 }, { containerPort: 9, protocol: udp }]
    volumeMounts: [{ name: data, mountPath: /data, readOnly: true }, { name: logs, mountPath: /logs }]
    resources: { limits: { cpu: 250m, memory: 64Mi } }
    env: [{ name: A, value: "1" }]
  - name: writer
    image: busybox:latest
    resources: { limits: { cpu: 1m } }
"#;

    #[test]
    fn infra_owns_ports_and_hostname_and_apps_join_it() {
        let pod = parse_manifest(POD.as_bytes()).unwrap();
        let infra = infra_spec(&cfg(), &pod, 0);
        assert_eq!(infra.hostname.as_deref(), Some("web"));
        assert_eq!(infra.command, INFRA_COMMAND);
        assert_eq!(
            infra.network,
            NetworkMode::Own {
                ports: vec![PublishedPort {
                    container_port: 8080,
                    protocol: "tcp".into(),
                    host_ip: "127.0.0.1".into(),
                    host_port: 18080
                }]
            },
            "hostPort 0 is not published"
        );
        assert!(ContainerName::parse(&infra.name)
            .is_some_and(|n| n.container == "net" && n.pod_id == "web"));
        assert_eq!(infra.labels[naming::LABEL_ROLE], "infra");

        let app = app_spec(&cfg(), &pod, &BTreeMap::new(), &pod.containers[0], "abc", 2);
        assert_eq!(app.hostname, None);
        assert_eq!(app.network, NetworkMode::JoinContainer("abc".into()));
        assert_eq!(app.cpu_shares, Some(256));
        assert_eq!(app.cpu_quota, Some(25_000));
        assert_eq!(app.cpu_period, Some(100_000));
        assert_eq!(app.memory_bytes, Some(64 << 20));
        assert_eq!(app.env, [("A".to_string(), "1".to_string())]);
        assert_eq!(
            app.binds,
            [
                Bind {
                    host_path: "/var/lib/hostlet/pods/web/volumes/data".into(),
                    container_path: "/data".into(),
                    read_only: true
                },
                Bind {
                    host_path: "/srv/logs".into(),
                    container_path: "/logs".into(),
                    read_only: false
                },
            ]
        );
        assert_eq!(app.labels[super::super::runtime::LABEL_RESTART_COUNT], "2");
        assert_eq!(
            app.labels[naming::LABEL_SPEC_HASH],
            naming::container_spec_hash(&pod, &pod.containers[0])
        );
        let tiny = app_spec(&cfg(), &pod, &BTreeMap::new(), &pod.containers[1], "abc", 0);
        assert_eq!(
            (tiny.cpu_shares, tiny.cpu_quota),
            (Some(2), Some(1000)),
            "kubelet's minimum shares"
        );
        assert_eq!(
            empty_dirs(&cfg(), &pod),
            [PathBuf::from("/var/lib/hostlet/pods/web/volumes/data")]
        );
    }

    #[test]
    fn host_dirs_only_under_allowed_paths() {
        let pod = parse_manifest(POD.as_bytes()).unwrap();
        assert!(host_path_violations(&pod, &[PathBuf::from("/srv")]).is_empty());
        assert_eq!(
            host_path_violations(&pod, &[PathBuf::from("/srv/log")]).len(),
            1,
            "not a path prefix"
        );
        assert_eq!(host_path_violations(&pod, &[]).len(), 1);
        let mut sneaky = pod.clone();
        sneaky.volumes[1]
            .source
            .as_mut()
            .unwrap()
            .host_dir
            .as_mut()
            .unwrap()
            .path = "/srv/../etc".into();
        assert_eq!(
            host_path_violations(&sneaky, &[PathBuf::from("/srv")]).len(),
            1
        );
    }

    #[test]
    fn a_symlink_out_of_an_allowed_path_is_refused_and_one_inside_is_mounted_resolved() {
        let root = tempfile::tempdir().unwrap();
        let ok = root.path().join("ok");
        let secret = root.path().join("secret");
        std::fs::create_dir_all(ok.join("real")).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        std::os::unix::fs::symlink(&secret, ok.join("link")).unwrap();
        std::os::unix::fs::symlink(ok.join("real"), ok.join("inner")).unwrap();
        let with_path = |p: &Path| {
            let yaml = format!(
                "version: v1beta1\nid: p\nvolumes: [{{name: h, source: {{hostDir: {{path: {}}}}}}}]\ncontainers: [{{name: c, image: busybox, volumeMounts: [{{name: h, mountPath: /h}}]}}]\n",
                p.display()
            );
            parse_manifest(yaml.as_bytes()).unwrap()
        };
        let allowed = [ok.clone()];
        let out = resolve_host_dirs(&with_path(&ok.join("link")), &allowed).unwrap_err();
        assert!(
            out[0].contains("resolves to") && out[0].contains("secret"),
            "{out:?}"
        );
        let out = resolve_host_dirs(&with_path(&ok.join("link/sub")), &allowed).unwrap_err();
        assert_eq!(out.len(), 1, "a path below the escaping link: {out:?}");
        let out = resolve_host_dirs(&with_path(&ok.join("nope/../../secret")), &allowed);
        assert!(out.is_err(), "{out:?}");
        let pod = with_path(&ok.join("inner"));
        let real = std::fs::canonicalize(ok.join("real")).unwrap();
        let dirs = resolve_host_dirs(&pod, &allowed).unwrap();
        assert_eq!(dirs["h"], real);
        let app = app_spec(&cfg(), &pod, &dirs, &pod.containers[0], "abc", 0);
        assert_eq!(app.binds[0].host_path, real.display().to_string());
        // A path that does not exist yet is checked as written.
        assert!(resolve_host_dirs(&with_path(&ok.join("new/dir")), &allowed).is_ok());
    }

    #[test]
    fn long_ids_make_valid_hostnames() {
        let id = format!("{}.b", "a".repeat(62));
        assert_eq!(hostname(&id), "a".repeat(62));
    }

    fn with_host_dirs(paths: &[(&str, &Path, bool)]) -> PodManifest {
        let volumes: Vec<String> = paths
            .iter()
            .map(|(n, p, _)| {
                format!(
                    "{{name: {n}, source: {{hostDir: {{path: {}}}}}}}",
                    p.display()
                )
            })
            .collect();
        let mounts: Vec<String> = paths
            .iter()
            .map(|(n, _, ro)| format!("{{name: {n}, mountPath: /{n}, readOnly: {ro}}}"))
            .collect();
        let yaml = format!(
            "version: v1beta1\nid: p\nvolumes: [{}]\ncontainers: [{{name: c, image: busybox, volumeMounts: [{}]}}]\n",
            volumes.join(", "),
            mounts.join(", ")
        );
        parse_manifest(yaml.as_bytes()).unwrap()
    }

    #[test]
    fn missing_parts_are_created_at_admission_and_a_link_planted_later_is_caught_before_create() {
        let root = tempfile::tempdir().unwrap();
        let allowed = std::fs::canonicalize(root.path()).unwrap().join("allowed");
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        let pod = with_host_dirs(&[("x", &allowed.join("sub/x/y"), false)]);
        let resolved = resolve_host_dirs(&pod, std::slice::from_ref(&allowed)).unwrap();
        create_host_dirs(&resolved).unwrap();
        assert!(allowed.join("sub/x/y").is_dir(), "created");
        recheck_host_dirs(&pod, &pod.containers[0], &resolved).unwrap();

        // A link planted where a part was.
        std::fs::remove_dir(allowed.join("sub/x/y")).unwrap();
        std::fs::remove_dir(allowed.join("sub/x")).unwrap();
        std::os::unix::fs::symlink(root.path(), allowed.join("sub/x")).unwrap();
        let why = recheck_host_dirs(&pod, &pod.containers[0], &resolved).unwrap_err();
        assert!(why.contains("changed since admission"), "{why}");
        // Creating again never goes through the link.
        assert!(create_host_dirs(&resolved).is_err());
        assert!(
            !root.path().join("y").exists(),
            "nothing made through the link"
        );
    }

    #[test]
    fn a_host_dir_below_another_pods_writable_one_conflicts() {
        let upper = PathBuf::from("/srv/shared");
        let lower = PathBuf::from("/srv/shared/app");
        let mine = BTreeMap::from([("a".to_string(), lower.clone())]);
        let theirs = BTreeMap::from([("b".to_string(), upper.clone())]);
        assert_eq!(
            nesting_conflicts(&mine, &[], "other", &theirs, std::slice::from_ref(&upper)).len(),
            1
        );
        assert!(
            nesting_conflicts(&mine, &[], "other", &theirs, &[]).is_empty(),
            "theirs is read-only"
        );
        // The other way round: my writable dir holds theirs.
        assert_eq!(
            nesting_conflicts(&theirs, std::slice::from_ref(&upper), "other", &mine, &[]).len(),
            1
        );
        let pod = with_host_dirs(&[("a", &upper, true), ("b", &lower, false)]);
        let resolved = BTreeMap::from([
            ("a".to_string(), upper.clone()),
            ("b".to_string(), lower.clone()),
        ]);
        assert_eq!(
            writable_host_dirs(&pod, &resolved),
            [lower],
            "a is mounted read-only"
        );
    }

    #[test]
    fn allow_list_entries_that_hand_over_the_host_are_refused() {
        let data = Path::new("/var/lib/hostlet");
        for bad in [
            "/",
            "/proc",
            "/proc/sys",
            "/sys/fs",
            "/run",
            "/var",
            "/var/lib",
            "/var/lib/hostlet/pods",
        ] {
            assert!(
                check_allowed_host_path(Path::new(bad), data).is_err(),
                "{bad}"
            );
        }
        for good in ["/srv", "/var/log", "/data/www"] {
            assert_eq!(
                check_allowed_host_path(Path::new(good), data),
                Ok(()),
                "{good}"
            );
        }
    }

    #[test]
    fn the_level_and_the_host_set_the_hardening() {
        let pod = parse_manifest(POD.as_bytes()).unwrap();
        let app = app_spec(&cfg(), &pod, &BTreeMap::new(), &pod.containers[0], "abc", 0);
        assert!(app.security.no_new_privileges);
        assert_eq!(app.security.cap_drop, ["NET_RAW"]);
        assert_eq!(app.security.pids_limit, Some(DEFAULT_PIDS_LIMIT));
        let restricted = SpecConfig {
            pod_security: PodSecurityLevel::Restricted,
            ..cfg()
        };
        let app = app_spec(
            &restricted,
            &pod,
            &BTreeMap::new(),
            &pod.containers[0],
            "abc",
            0,
        );
        assert_eq!(app.security.cap_drop, ["ALL"]);
        let infra = infra_spec(&cfg(), &pod, 0);
        assert_eq!(infra.security.cap_drop, ["ALL"]);
        assert!(!infra.security.read_only_root, "it makes its fifo");
    }
}
