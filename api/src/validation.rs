//! Validation of one manifest (every error at once, each with its field path) and of a node's set of pods
//! (duplicate ids and host-port conflicts decided by a fixed source order).

pub use crate::field::{is_dns_label, is_dns_subdomain};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use crate::image::ImageRef;
use crate::manifest::{Container, Form, HookAction, PodManifest, Probe, ProbeAction};

/// The longest duration a manifest may give (grace period, probe delays): a year. Beyond it the agent's
/// timers would overflow; no real pod needs more.
pub const MAX_SECONDS: i64 = 365 * 24 * 3600;
/// The largest probe threshold.
pub const MAX_THRESHOLD: i64 = 1_000_000;
/// The largest CPU limit or request, in thousandths of a core (a million cores).
pub const MAX_CPU_MILLIS: i64 = 1_000_000_000;

pub use crate::field::{describe, FieldError};

/// The manifest versions hostlet reads.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1beta1", "v1beta2"];

const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// A label or annotation key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// letters, digits, `-`, `_` and `.`, alphanumeric at both ends (Kubernetes' qualified name).
pub(crate) fn check_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if !is_dns_subdomain(p) {
            return Err(format!("key prefix {p:?} is not a DNS subdomain"));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!("key {k:?} is not a qualified name (at most 63 letters, digits, '-', '_' and '.', alphanumeric at both ends, after an optional DNS subdomain and '/')"));
    }
    Ok(())
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_` and `.`, alphanumeric at both ends.
pub(crate) fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn check_name(errs: &mut Errors, path: String, value: &str, subdomain: bool) {
    if value.is_empty() {
        errs.push(path, "required");
    } else if subdomain && !is_dns_subdomain(value) {
        errs.push(path, format!("{value:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters, alphanumeric at both ends)"));
    } else if !subdomain && !is_dns_label(value) {
        errs.push(path, format!("{value:?} is not a DNS label (lower-case letters, digits and '-', at most 63 characters, alphanumeric at both ends)"));
    }
}

/// Every problem of one manifest, each with its field path (in the terms of the form it was written in).
/// Empty means valid.
pub fn validate(m: &PodManifest) -> Vec<FieldError> {
    let errs = validate_model(m);
    match m.form {
        Form::Legacy => errs,
        Form::V1 => errs
            .into_iter()
            .map(|e| FieldError {
                path: crate::v1::path_in_v1(&e.path),
                message: e
                    .message
                    .replace("emptyDir, hostDir,", "emptyDir, hostPath,"),
            })
            .collect(),
    }
}

fn validate_model(m: &PodManifest) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    if m.form == Form::V1 {
        if m.version != crate::v1::API_VERSION {
            errs.push("version", "must be v1 for a Pod");
        }
    } else if m.version.is_empty() {
        errs.push("version", "required (v1beta1 or v1beta2)");
    } else if !SUPPORTED_VERSIONS.contains(&m.version.as_str()) {
        errs.push(
            "version",
            format!(
                "unsupported version {:?}, expected v1beta1 or v1beta2",
                m.version
            ),
        );
    }
    check_name(&mut errs, "id".into(), &m.id, true);
    for (field, map) in [("labels", &m.labels), ("annotations", &m.annotations)] {
        for (k, v) in map {
            if let Err(why) = check_key(k) {
                errs.push(format!("{field}.{k}"), why);
            } else if field == "labels" && !is_label_value(v) {
                errs.push(format!("{field}.{k}"), format!("{v:?} is not a label value (at most 63 letters, digits, '-', '_' and '.', alphanumeric at both ends)"));
            }
        }
    }
    if let Some(g) = m.termination_grace_period_seconds {
        if g < 0 {
            errs.push("terminationGracePeriodSeconds", "must not be negative");
        } else if g > MAX_SECONDS {
            errs.push(
                "terminationGracePeriodSeconds",
                format!("must be at most {MAX_SECONDS} (a year)"),
            );
        }
    }

    let mut volume_names = HashSet::new();
    for (i, v) in m.volumes.iter().enumerate() {
        let path = format!("volumes[{i}]");
        check_name(&mut errs, format!("{path}.name"), &v.name, false);
        if !v.name.is_empty() && !volume_names.insert(v.name.as_str()) {
            errs.push(
                format!("{path}.name"),
                format!("duplicate volume name {:?}", v.name),
            );
        }
        if let Some(src) = &v.source {
            check_volume_source(&mut errs, &path, src, m.form);
        }
    }

    if m.containers.is_empty() {
        errs.push("containers", "at least one container is required");
    }
    let mut container_names = HashSet::new();
    for (ci, c) in m.init_containers.iter().enumerate() {
        let cpath = format!("initContainers[{ci}]");
        check_name(&mut errs, format!("{cpath}.name"), &c.name, false);
        if !c.name.is_empty() && !container_names.insert(c.name.as_str()) {
            errs.push(
                format!("{cpath}.name"),
                format!("duplicate container name {:?}", c.name),
            );
        }
        validate_container(&mut errs, &cpath, c, &volume_names);
        match c.restart_policy.as_deref() {
            None => {}
            Some(_) if m.form == Form::Legacy => errs.push(
                format!("{cpath}.restartPolicy"),
                "not in the 2014 form (write a v1 Pod for a sidecar)",
            ),
            Some("Always") => {}
            Some(other) => errs.push(
                format!("{cpath}.restartPolicy"),
                format!("{other:?}: an init container takes only Always (a sidecar)"),
            ),
        }
        // As in Kubernetes: an init container runs to completion, so nothing probes it; a sidecar runs
        // beside the app containers and may be probed.
        if !c.is_sidecar() {
            for (name, probe) in [
                ("livenessProbe", &c.liveness_probe),
                ("readinessProbe", &c.readiness_probe),
                ("startupProbe", &c.startup_probe),
            ] {
                if probe.is_some() {
                    errs.push(
                        format!("{cpath}.{name}"),
                        "not supported for init containers (they run to completion; a sidecar, restartPolicy: Always, may have one)",
                    );
                }
            }
        }
        for (pi, p) in c.ports.iter().enumerate() {
            if p.host_port != 0 {
                errs.push(
                    format!("{cpath}.ports[{pi}].hostPort"),
                    "not supported for init containers, sidecars included (give host ports to an app container)",
                );
            }
        }
    }
    let mut host_ports: HashMap<HostPortKey, String> = HashMap::new();
    for (ci, c) in m.containers.iter().enumerate() {
        let cpath = format!("containers[{ci}]");
        check_name(&mut errs, format!("{cpath}.name"), &c.name, false);
        if !c.name.is_empty() && !container_names.insert(c.name.as_str()) {
            errs.push(
                format!("{cpath}.name"),
                format!("duplicate container name {:?}", c.name),
            );
        }
        validate_container(&mut errs, &cpath, c, &volume_names);
        if c.restart_policy.is_some() {
            errs.push(
                format!("{cpath}.restartPolicy"),
                "only an init container takes one (Always, for a sidecar); the pod's spec.restartPolicy rules the app containers",
            );
        }
        for (pi, p) in c.ports.iter().enumerate() {
            let Some(key) = HostPortKey::of(p) else {
                continue;
            };
            let ppath = format!("{cpath}.ports[{pi}].hostPort");
            if let Some(owner) = host_ports
                .iter()
                .find(|(k, _)| k.conflicts(&key))
                .map(|(_, o)| o.clone())
            {
                errs.push(ppath, format!("host port {key} is already used by {owner}"));
            } else {
                host_ports.insert(key, format!("containers[{ci}].ports[{pi}]"));
            }
        }
    }
    errs.0.extend(crate::security::validate_fields(m));
    errs.0.extend(crate::dns::validate_fields(m));
    errs.0.extend(lifecycle_errors(m));
    if let Some(v) = m.annotations.get(crate::manifest::ON_CONFIG_CHANGE) {
        if let Err(why) = crate::manifest::OnConfigChange::parse(v) {
            errs.push(
                format!("annotations[{}]", crate::manifest::ON_CONFIG_CHANGE),
                why,
            );
        }
    }
    errs.0
}

/// A volume's source: one kind only, and each kind's own fields.
fn check_volume_source(
    errs: &mut Errors,
    path: &str,
    src: &crate::manifest::VolumeSource,
    form: Form,
) {
    let given = [
        src.empty_dir.is_some(),
        src.host_dir.is_some(),
        src.config_map.is_some(),
        src.secret.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        errs.push(
            format!("{path}.source"),
            "give exactly one of emptyDir, hostDir, configMap and secret",
        );
    }
    if let Some(c) = &src.config_map {
        let p = format!("{path}.source.configMap");
        check_name(errs, format!("{p}.name"), &c.name, true);
        check_projection(errs, &p, &c.items, c.default_mode);
    }
    if let Some(sv) = &src.secret {
        let p = format!("{path}.source.secret");
        check_name(errs, format!("{p}.secretName"), &sv.secret_name, true);
        check_projection(errs, &p, &sv.items, sv.default_mode);
    }
    if let Some(h) = &src.host_dir {
        if !h.path.starts_with('/') {
            errs.push(
                format!("{path}.source.hostDir.path"),
                format!("{:?} must be an absolute path", h.path),
            );
        }
        match (form, h.kind.as_deref()) {
            (_, None) | (Form::V1, Some("" | "DirectoryOrCreate" | "CharDevice" | "BlockDevice")) => {}
            (Form::Legacy, Some(_)) => errs.push(
                format!("{path}.source.hostDir.type"),
                "not in the 2014 form (write a v1 Pod for a hostPath type)",
            ),
            (Form::V1, Some(other)) => errs.push(
                format!("{path}.source.hostDir.type"),
                format!(
                    "{other:?} is not supported: expected DirectoryOrCreate (or \"\"), CharDevice or BlockDevice"
                ),
            ),
        }
    }
}

/// `lifecycle`: v1 form only, and a stop signal Linux has.
fn lifecycle_errors(m: &PodManifest) -> Vec<FieldError> {
    let lists = [
        ("initContainers", &m.init_containers),
        ("containers", &m.containers),
    ];
    let mut out = Vec::new();
    for (list, containers) in lists {
        for (i, c) in containers.iter().enumerate() {
            let Some(l) = &c.lifecycle else { continue };
            let path = format!("{list}[{i}].lifecycle");
            if m.form == Form::Legacy {
                out.push(FieldError {
                    path,
                    message: "not in the 2014 form (write a v1 Pod for lifecycle)".into(),
                });
                continue;
            }
            for (hook, handler) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
                let Some(h) = handler else { continue };
                let hpath = format!("{path}.{hook}");
                if list == "initContainers" && !c.is_sidecar() {
                    out.push(FieldError {
                        path: hpath,
                        message: "init containers take no lifecycle hooks, sidecars apart (as in Kubernetes)"
                            .into(),
                    });
                    continue;
                }
                match h.action() {
                    None => out.push(FieldError {
                        path: hpath,
                        message: "give exactly one of exec, httpGet and sleep".into(),
                    }),
                    Some(HookAction::Exec(e)) if e.command.is_empty() => out.push(FieldError {
                        path: format!("{hpath}.exec.command"),
                        message: "required".into(),
                    }),
                    Some(HookAction::Http(g)) => {
                        if g.port.resolve(c).is_none() {
                            out.push(FieldError {
                                path: format!("{hpath}.httpGet.port"),
                                message: "must be a port number 1-65535 or the name of one of the container's ports".into(),
                            });
                        }
                        if g.path
                            .as_deref()
                            .is_some_and(|p| !p.is_empty() && !p.starts_with('/'))
                        {
                            out.push(FieldError {
                                path: format!("{hpath}.httpGet.path"),
                                message: "must start with '/'".into(),
                            });
                        }
                    }
                    Some(HookAction::Sleep(secs)) if !(0..=MAX_SECONDS).contains(&secs) => out
                        .push(FieldError {
                            path: format!("{hpath}.sleep.seconds"),
                            message: format!("{secs} is out of range 0-{MAX_SECONDS}"),
                        }),
                    Some(_) => {}
                }
            }
            if let Some(sig) = &l.stop_signal {
                if !crate::manifest::is_stop_signal(sig) {
                    out.push(FieldError {
                        path: format!("{path}.stopSignal"),
                        message: format!(
                            "{sig:?} is not a signal name (e.g. SIGTERM, SIGQUIT, SIGUSR1, SIGRTMIN+3)"
                        ),
                    });
                }
            }
        }
    }
    out
}

/// The `items` and modes of a configMap or secret volume.
fn check_projection(
    errs: &mut Errors,
    path: &str,
    items: &[crate::manifest::KeyToPath],
    default_mode: Option<i32>,
) {
    let check_mode = |errs: &mut Errors, p: String, m: Option<i32>| {
        if let Some(m) = m {
            if !(0..=0o777).contains(&m) {
                errs.push(
                    p,
                    format!("{m} is not a file mode (0 to 0777, that is 511)"),
                );
            }
        }
    };
    check_mode(errs, format!("{path}.defaultMode"), default_mode);
    let mut paths = HashSet::new();
    for (i, it) in items.iter().enumerate() {
        let p = format!("{path}.items[{i}]");
        if let Err(why) = crate::configs::check_data_key(&it.key) {
            errs.push(format!("{p}.key"), why);
        }
        let bad = it.path.is_empty()
            || it.path.starts_with('/')
            || it.path.starts_with("..")
            || it.path.split('/').any(|c| c.is_empty() || c == "..");
        if bad {
            errs.push(
                format!("{p}.path"),
                format!(
                    "{:?} must be a relative path without '..' elements, not starting with '..'",
                    it.path
                ),
            );
        } else if !paths.insert(it.path.as_str()) {
            errs.push(format!("{p}.path"), format!("duplicate path {:?}", it.path));
        }
        check_mode(errs, format!("{p}.mode"), it.mode);
    }
}

fn validate_container(errs: &mut Errors, cpath: &str, c: &Container, volumes: &HashSet<&str>) {
    if c.image.is_empty() {
        errs.push(format!("{cpath}.image"), "required");
    } else if let Err(e) = ImageRef::parse(&c.image) {
        errs.push(format!("{cpath}.image"), e.to_string());
    }
    if let Some(w) = &c.working_dir {
        if !w.is_empty() && !w.starts_with('/') {
            errs.push(
                format!("{cpath}.workingDir"),
                format!("{w:?} must be an absolute path"),
            );
        }
    }
    for (ei, e) in c.env.iter().enumerate() {
        if e.name.is_empty() {
            errs.push(format!("{cpath}.env[{ei}].name"), "required");
        } else if e.name.contains('=') || e.name.contains('\0') {
            errs.push(
                format!("{cpath}.env[{ei}].name"),
                format!("{:?} must not contain '=' or NUL", e.name),
            );
        }
        if let Some(from) = &e.value_from {
            let p = format!("{cpath}.env[{ei}].valueFrom");
            if !e.value.is_empty() {
                errs.push(
                    format!("{cpath}.env[{ei}].value"),
                    "must be empty when valueFrom is given",
                );
            }
            match (&from.config_map_key_ref, &from.secret_key_ref) {
                (Some(_), Some(_)) | (None, None) => errs.push(
                    p.clone(),
                    "give exactly one of configMapKeyRef and secretKeyRef",
                ),
                (Some(r), None) | (None, Some(r)) => {
                    let field = if from.config_map_key_ref.is_some() {
                        "configMapKeyRef"
                    } else {
                        "secretKeyRef"
                    };
                    check_name(errs, format!("{p}.{field}.name"), &r.name, true);
                    if let Err(why) = crate::configs::check_data_key(&r.key) {
                        errs.push(format!("{p}.{field}.key"), why);
                    }
                }
            }
        }
    }
    for (fi, f) in c.env_from.iter().enumerate() {
        let p = format!("{cpath}.envFrom[{fi}]");
        match (&f.config_map_ref, &f.secret_ref) {
            (Some(_), Some(_)) | (None, None) => {
                errs.push(p.clone(), "give exactly one of configMapRef and secretRef")
            }
            (Some(r), None) => check_name(errs, format!("{p}.configMapRef.name"), &r.name, true),
            (None, Some(r)) => check_name(errs, format!("{p}.secretRef.name"), &r.name, true),
        }
        if let Some(prefix) = &f.prefix {
            if prefix.contains('=') || prefix.contains('\0') {
                errs.push(
                    format!("{p}.prefix"),
                    format!("{prefix:?} must not contain '=' or NUL"),
                );
            }
        }
    }
    let mut port_names = HashSet::new();
    for (pi, p) in c.ports.iter().enumerate() {
        let ppath = format!("{cpath}.ports[{pi}]");
        if !p.name.is_empty() {
            if !is_dns_label(&p.name) || p.name.len() > 15 {
                errs.push(
                    format!("{ppath}.name"),
                    format!(
                        "{:?} is not a port name (a DNS label of at most 15 characters)",
                        p.name
                    ),
                );
            } else if !port_names.insert(p.name.as_str()) {
                errs.push(
                    format!("{ppath}.name"),
                    format!("duplicate port name {:?}", p.name),
                );
            }
        }
        if !(1..=65535).contains(&p.container_port) {
            errs.push(
                format!("{ppath}.containerPort"),
                format!("{} is out of range 1-65535", p.container_port),
            );
        }
        if !(0..=65535).contains(&p.host_port) {
            errs.push(
                format!("{ppath}.hostPort"),
                format!(
                    "{} is out of range 0-65535 (0 means not published)",
                    p.host_port
                ),
            );
        }
        if let Some(proto) = &p.protocol {
            if !PROTOCOLS.contains(&proto.to_ascii_uppercase().as_str()) {
                errs.push(
                    format!("{ppath}.protocol"),
                    format!("unknown protocol {proto:?}, expected TCP, UDP or SCTP"),
                );
            }
        }
        if let Some(ip) = &p.host_ip {
            if !ip.is_empty() && ip.parse::<IpAddr>().is_err() {
                errs.push(
                    format!("{ppath}.hostIP"),
                    format!("{ip:?} is not an IP address"),
                );
            }
        }
    }
    let mut mount_paths = HashSet::new();
    for (mi, vm) in c.volume_mounts.iter().enumerate() {
        let mpath = format!("{cpath}.volumeMounts[{mi}]");
        if vm.name.is_empty() {
            errs.push(format!("{mpath}.name"), "required");
        } else if !volumes.contains(vm.name.as_str()) {
            errs.push(
                format!("{mpath}.name"),
                format!("no volume named {:?} in this pod", vm.name),
            );
        }
        if vm.mount_path.is_empty() {
            errs.push(format!("{mpath}.mountPath"), "required");
        } else if !vm.mount_path.starts_with('/') {
            errs.push(
                format!("{mpath}.mountPath"),
                format!("{:?} must be an absolute path", vm.mount_path),
            );
        } else if !mount_paths.insert(vm.mount_path.as_str()) {
            errs.push(
                format!("{mpath}.mountPath"),
                format!("{:?} is mounted twice", vm.mount_path),
            );
        }
    }
    if let Some(r) = &c.resources {
        let all = r
            .limits
            .iter()
            .map(|(k, q)| ("limits", k, q))
            .chain(r.requests.iter().map(|(k, q)| ("requests", k, q)));
        for (which, k, q) in all {
            let path = format!("{cpath}.resources.{which}.{k}");
            match k.as_str() {
                "cpu" if q.cpu_millis().is_none() => errs.push(
                    path,
                    format!("{:?} is not a CPU quantity (e.g. 500m or 1.5)", q.0),
                ),
                "cpu" if q.cpu_millis().is_some_and(|m| m > MAX_CPU_MILLIS) => errs.push(
                    path,
                    format!(
                        "{:?} is more than {} cores, more than any host has",
                        q.0,
                        MAX_CPU_MILLIS / 1000
                    ),
                ),
                "memory" if q.bytes().is_none() => errs.push(
                    path,
                    format!("{:?} is not a memory quantity (e.g. 64Mi or 1G)", q.0),
                ),
                "cpu" | "memory" => {}
                crate::manifest::GPU_RESOURCE if crate::manifest::gpu_count(q).is_none() => errs
                    .push(
                        path,
                        format!("{:?} is not a whole number of GPUs, 1 to 64", q.0),
                    ),
                // As in Kubernetes: an extended resource is asked in limits; a request must match.
                crate::manifest::GPU_RESOURCE
                    if which == "requests" && r.limits.get(k).is_none_or(|l| l.0 != q.0) =>
                {
                    errs.push(
                        path,
                        "must equal resources.limits.nvidia.com/gpu (GPUs are not overcommitted)",
                    )
                }
                crate::manifest::GPU_RESOURCE => {}
                _ => errs.push(
                    path,
                    "unknown resource, expected cpu, memory or nvidia.com/gpu",
                ),
            }
        }
    }
    for (name, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            validate_probe(errs, &format!("{cpath}.{name}"), p, c);
        }
    }
}

fn validate_probe(errs: &mut Errors, path: &str, p: &Probe, c: &Container) {
    if let Some(kind) = &p.kind {
        if !["http", "tcp", "exec"].contains(&kind.to_ascii_lowercase().as_str()) {
            errs.push(
                format!("{path}.type"),
                format!("unknown probe type {kind:?}, expected http, tcp or exec"),
            );
            return;
        }
    }
    let handlers = [
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.exec.is_some(),
    ]
    .iter()
    .filter(|h| **h)
    .count();
    if p.kind.is_none() && handlers > 1 {
        errs.push(
            path.to_string(),
            "give exactly one of httpGet, tcpSocket and exec",
        );
    }
    match p.action() {
        None => errs.push(
            path.to_string(),
            "one of httpGet, tcpSocket and exec is required (matching type when given)",
        ),
        Some(ProbeAction::Http(h)) => {
            if h.port.resolve(c).is_none() {
                errs.push(
                    format!("{path}.httpGet.port"),
                    "must be a port number 1-65535 or the name of one of the container's ports",
                );
            }
            if let Some(p) = &h.path {
                if !p.is_empty() && !p.starts_with('/') {
                    errs.push(format!("{path}.httpGet.path"), "must start with '/'");
                }
            }
        }
        Some(ProbeAction::Tcp(t)) => {
            if t.port.resolve(c).is_none() {
                errs.push(
                    format!("{path}.tcpSocket.port"),
                    "must be a port number 1-65535 or the name of one of the container's ports",
                );
            }
        }
        Some(ProbeAction::Exec(e)) => {
            if e.command.is_empty() {
                errs.push(format!("{path}.exec.command"), "required");
            }
        }
    }
    for (field, v, min, max) in [
        (
            "initialDelaySeconds",
            p.initial_delay_seconds,
            0,
            MAX_SECONDS,
        ),
        ("periodSeconds", p.period_seconds, 1, MAX_SECONDS),
        ("timeoutSeconds", p.timeout_seconds, 1, MAX_SECONDS),
        ("successThreshold", p.success_threshold, 1, MAX_THRESHOLD),
        ("failureThreshold", p.failure_threshold, 1, MAX_THRESHOLD),
    ] {
        if let Some(v) = v {
            if v < min {
                errs.push(format!("{path}.{field}"), format!("must be at least {min}"));
            } else if v > max {
                errs.push(format!("{path}.{field}"), format!("must be at most {max}"));
            }
        }
    }
}

/// A published host port: (hostIP, hostPort, protocol).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPortKey {
    pub host_ip: String,
    pub host_port: u16,
    pub protocol: String,
}

impl HostPortKey {
    /// The key of a published port; `None` when hostPort is 0 (not published) or out of range.
    pub fn of(p: &crate::manifest::Port) -> Option<Self> {
        let port = u16::try_from(p.host_port).ok().filter(|v| *v != 0)?;
        Some(HostPortKey {
            host_ip: p.effective_host_ip(),
            host_port: port,
            protocol: p.effective_protocol(),
        })
    }

    /// Two claims conflict on the same port and protocol when their addresses are equal or either is the
    /// wildcard.
    pub fn conflicts(&self, other: &HostPortKey) -> bool {
        let wildcard = |ip: &str| ip == "0.0.0.0" || ip == "::";
        self.host_port == other.host_port
            && self.protocol == other.protocol
            && (self.host_ip == other.host_ip
                || wildcard(&self.host_ip)
                || wildcard(&other.host_ip))
    }

    /// Every published port of a pod.
    pub fn all_of(m: &PodManifest) -> Vec<HostPortKey> {
        m.containers
            .iter()
            .flat_map(|c| c.ports.iter().filter_map(HostPortKey::of))
            .collect()
    }
}

impl fmt::Display for HostPortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/{}", self.host_ip, self.host_port, self.protocol)
    }
}

/// Where a manifest came from. The order of the variants is the precedence: earlier wins.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// `/hostlet/hosts/<node>/pods/<id>`
    EtcdKey,
    /// `/registry/hosts/<node>/kubelet`
    EtcdList,
    /// `--manifest-path`
    File,
    /// `--manifest-url`
    Url,
    /// `POST /pods` on the agent
    Http,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::EtcdKey => "etcd key",
            SourceKind::EtcdList => "legacy etcd list",
            SourceKind::File => "file",
            SourceKind::Url => "url",
            SourceKind::Http => "http",
        })
    }
}

/// A valid manifest and where it came from (`origin` is the key, file or URL, for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcedPod {
    pub source: SourceKind,
    pub origin: String,
    /// Position within its source (file name order, list index); breaks ties between equal ids.
    pub ordinal: usize,
    pub manifest: PodManifest,
}

/// The outcome of merging every source's pods for one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Pods to run, by id.
    pub accepted: BTreeMap<String, SourcedPod>,
    /// Pods not to run, each with the reason naming the winner.
    pub rejected: Vec<(SourcedPod, String)>,
}

/// Decides which pods run when ids or host ports collide, for pods arriving together: source order
/// first, then id, then position. The first claimant wins; every loser is rejected with a reason that
/// names the winner and its source. See [`resolve_admitted`] for pods already admitted.
pub fn resolve(pods: Vec<SourcedPod>) -> Resolution {
    resolve_admitted(pods, &BTreeMap::new())
}

/// As [`resolve`], but a host port goes to the pod admitted first: `admitted` holds, per pod id, when it
/// was admitted (any ordered stamp, e.g. unix nanos). Admitted pods claim their ports in that order before
/// any newcomer, so a newcomer never takes a running pod's port, whatever its id or source; among
/// newcomers the source order, then the id decide. Same-id precedence between sources is unchanged.
pub fn resolve_admitted(
    mut pods: Vec<SourcedPod>,
    admitted: &BTreeMap<String, u128>,
) -> Resolution {
    pods.sort_by(|a, b| {
        (a.source, &a.manifest.id, a.ordinal, &a.origin).cmp(&(
            b.source,
            &b.manifest.id,
            b.ordinal,
            &b.origin,
        ))
    });
    // Same ids first: the source order alone decides which definition of an id is the pod.
    let mut out = Resolution::default();
    let mut by_id: BTreeMap<String, SourcedPod> = BTreeMap::new();
    for pod in pods {
        if let Some(winner) = by_id.get(&pod.manifest.id) {
            let reason = format!(
                "pod id {:?} is already defined by {} {}",
                pod.manifest.id, winner.source, winner.origin
            );
            out.rejected.push((pod, reason));
            continue;
        }
        by_id.insert(pod.manifest.id.clone(), pod);
    }
    // Then host ports, in admission order.
    let mut order: Vec<SourcedPod> = by_id.into_values().collect();
    order.sort_by(|a, b| {
        let key = |p: &SourcedPod| {
            (
                admitted.get(&p.manifest.id).is_none(),
                admitted.get(&p.manifest.id).copied().unwrap_or(0),
                p.source,
                p.manifest.id.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut claimed: Vec<(HostPortKey, String, bool)> = Vec::new();
    for pod in order {
        let ports = HostPortKey::all_of(&pod.manifest);
        let conflict = ports.iter().find_map(|k| {
            claimed
                .iter()
                .find(|(c, _, _)| c.conflicts(k))
                .map(|(c, owner, first)| (k.clone(), c.clone(), owner.clone(), *first))
        });
        if let Some((mine, theirs, owner, admitted_first)) = conflict {
            let why = if admitted_first {
                "which was admitted first and keeps it"
            } else {
                "which arrived with it and comes first by source, then id"
            };
            let reason = format!(
                "host port {mine} conflicts with {theirs} of pod {owner}, {why}: this pod is rejected"
            );
            out.rejected.push((pod, reason));
            continue;
        }
        let owner = format!("{:?} ({} {})", pod.manifest.id, pod.source, pod.origin);
        let first = admitted.contains_key(&pod.manifest.id);
        claimed.extend(ports.into_iter().map(|k| (k, owner.clone(), first)));
        out.accepted.insert(pod.manifest.id.clone(), pod);
    }
    out
}
