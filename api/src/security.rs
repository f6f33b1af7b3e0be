//! What a pod may ask of its host: the `securityContext` subset hostlet runs, the pod security levels
//! (`--pod-security`, named after Kubernetes' Pod Security Standards) and the settings each container is
//! created with once the pod's and the container's contexts are merged (the container's value wins).

use std::fmt;
use std::str::FromStr;

use crate::field::FieldError;
pub use crate::manifest::{Capabilities, PodSecurityContext, SeccompProfile, SecurityContext};
use crate::manifest::{Container, Form, PodManifest};

/// The largest uid or gid a manifest may give (Kubernetes' bound).
pub const MAX_ID: i64 = i32::MAX as i64;

/// `--pod-security`: what pods on this host may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum PodSecurityLevel {
    /// Anything the model holds, `privileged` included.
    Privileged,
    /// No privileged containers, no capabilities beyond [`BASELINE_CAPABILITIES`], no unconfined
    /// seccomp; NET_RAW dropped.
    #[default]
    Baseline,
    /// Baseline, and: every capability dropped (NET_BIND_SERVICE may be added back), `runAsNonRoot: true`
    /// required, seccomp RuntimeDefault, no privilege escalation.
    Restricted,
}

impl PodSecurityLevel {
    pub const ALL: [PodSecurityLevel; 3] = [
        PodSecurityLevel::Privileged,
        PodSecurityLevel::Baseline,
        PodSecurityLevel::Restricted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }
}

impl fmt::Display for PodSecurityLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PodSecurityLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PodSecurityLevel::ALL
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown pod security level {s:?}, expected privileged, baseline or restricted"
                )
            })
    }
}

/// The capabilities Kubernetes' baseline level lets a container add (Docker grants these by default).
pub const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Every Linux capability by name (without `CAP_`), as of Linux 5.9.
const LINUX_CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// A capability as written (`sys_admin`, `CAP_SYS_ADMIN`) in the form Docker and the tables use
/// (`SYS_ADMIN`); `None` when it names no capability. `ALL` stands for every one.
pub fn capability_name(s: &str) -> Option<String> {
    let up = s.trim().to_ascii_uppercase();
    let bare = up.strip_prefix("CAP_").unwrap_or(&up).to_string();
    (bare == "ALL" || LINUX_CAPABILITIES.contains(&bare.as_str())).then_some(bare)
}

/// How one container is created, once the pod's context, the container's and the level are merged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EffectiveSecurity {
    /// `uid` or `uid:gid` for the engine; `None` keeps the image's user.
    pub user: Option<String>,
    /// `runAsNonRoot: true`: the image's user must be checked when no `runAsUser` says.
    pub non_root: bool,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub privileged: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub seccomp_unconfined: bool,
}

fn seccomp_of(pod: &PodManifest, c: &Container) -> Option<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(pod
            .security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref()))
        .map(|p| p.kind.clone())
}

/// The settings container `c` of `pod` runs with under `level`. Assumes the pod passed [`check_level`].
pub fn effective(pod: &PodManifest, c: &Container, level: PodSecurityLevel) -> EffectiveSecurity {
    let sc = c.security_context.clone().unwrap_or_default();
    let psc = pod.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.or(psc.run_as_user);
    let gid = sc.run_as_group.or(psc.run_as_group);
    let privileged = c.privileged || sc.privileged == Some(true);
    let caps = sc.capabilities.unwrap_or_default();
    let mut cap_drop: Vec<String> = caps
        .drop
        .iter()
        .filter_map(|d| capability_name(d))
        .collect();
    let base_drop = match level {
        PodSecurityLevel::Restricted => "ALL",
        _ => "NET_RAW",
    };
    let cap_add: Vec<String> = caps.add.iter().filter_map(|a| capability_name(a)).collect();
    // The level's drop applies unless the manifest adds that capability back (which only the privileged
    // level lets through) or already drops it.
    if !privileged
        && !cap_drop.iter().any(|d| d == base_drop || d == "ALL")
        && !cap_add.iter().any(|a| a == base_drop || a == "ALL")
    {
        cap_drop.push(base_drop.to_string());
    }
    EffectiveSecurity {
        user: uid.map(|u| match gid {
            Some(g) => format!("{u}:{g}"),
            None => u.to_string(),
        }),
        non_root: sc.run_as_non_root.or(psc.run_as_non_root) == Some(true),
        read_only_root: sc.read_only_root_filesystem == Some(true),
        no_new_privileges: !privileged && sc.allow_privilege_escalation != Some(true),
        privileged,
        cap_add,
        cap_drop,
        seccomp_unconfined: !privileged && seccomp_of(pod, c).as_deref() == Some("Unconfined"),
    }
}

struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// The model's own checks of the security fields, whatever the level (called by [`crate::validate`]).
pub(crate) fn validate_fields(m: &PodManifest) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    if m.form == Form::Legacy {
        if m.security_context.is_some() {
            errs.push(
                "securityContext",
                "not in the 2014 form (write a v1 Pod for a securityContext)",
            );
        }
        for (list, c, i) in m.listed_containers() {
            if c.security_context.is_some() {
                errs.push(
                    format!("{list}[{i}].securityContext"),
                    "not in the 2014 form (only `privileged` is; write a v1 Pod for a securityContext)",
                );
            }
        }
    }
    if let Some(p) = &m.security_context {
        check_ids(
            &mut errs,
            "securityContext",
            p.run_as_user,
            p.run_as_group,
            p.run_as_non_root,
        );
        check_seccomp(&mut errs, "securityContext", p.seccomp_profile.as_ref());
    }
    for (list, c, i) in m.listed_containers() {
        let Some(sc) = &c.security_context else {
            continue;
        };
        let path = format!("{list}[{i}].securityContext");
        let user = sc
            .run_as_user
            .or(m.security_context.as_ref().and_then(|p| p.run_as_user));
        check_ids(&mut errs, &path, sc.run_as_user, None, None);
        if sc.run_as_group.is_some() {
            check_ids(&mut errs, &path, user, sc.run_as_group, None);
        }
        if sc.run_as_user.is_some() || sc.run_as_non_root.is_some() {
            let non_root = sc
                .run_as_non_root
                .or(m.security_context.as_ref().and_then(|p| p.run_as_non_root));
            if non_root == Some(true) && user == Some(0) {
                errs.push(
                    format!("{path}.runAsUser"),
                    "0 (root) contradicts runAsNonRoot: true",
                );
            }
        }
        check_seccomp(&mut errs, &path, sc.seccomp_profile.as_ref());
        if let Some(caps) = &sc.capabilities {
            for (which, names) in [("add", &caps.add), ("drop", &caps.drop)] {
                for (k, n) in names.iter().enumerate() {
                    if capability_name(n).is_none() {
                        errs.push(
                            format!("{path}.capabilities.{which}[{k}]"),
                            format!(
                                "{n:?} is not a Linux capability (e.g. NET_BIND_SERVICE, or ALL)"
                            ),
                        );
                    }
                }
            }
        }
    }
    errs.0
}

fn check_ids(
    errs: &mut Errors,
    path: &str,
    user: Option<i64>,
    group: Option<i64>,
    non_root: Option<bool>,
) {
    for (field, v) in [("runAsUser", user), ("runAsGroup", group)] {
        if let Some(v) = v {
            if !(0..=MAX_ID).contains(&v) {
                errs.push(
                    format!("{path}.{field}"),
                    format!("{v} is out of range 0-{MAX_ID}"),
                );
            }
        }
    }
    if group.is_some() && user.is_none() {
        errs.push(
            format!("{path}.runAsGroup"),
            "needs runAsUser (the container's user is set as uid:gid)",
        );
    }
    if non_root == Some(true) && user == Some(0) {
        errs.push(
            format!("{path}.runAsUser"),
            "0 (root) contradicts runAsNonRoot: true",
        );
    }
}

fn check_seccomp(errs: &mut Errors, path: &str, p: Option<&SeccompProfile>) {
    if let Some(p) = p {
        if !matches!(p.kind.as_str(), "RuntimeDefault" | "Unconfined") {
            errs.push(
                format!("{path}.seccompProfile.type"),
                format!(
                    "{:?} is not supported, expected RuntimeDefault or Unconfined",
                    p.kind
                ),
            );
        }
    }
}

/// What `level` refuses in the pod, each with its field path in the terms of the form it was written
/// in. Empty means the pod may run on a host at that level.
pub fn check_level(m: &PodManifest, level: PodSecurityLevel) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    let why = |what: &str| format!("{what} (refused under --pod-security {level})");
    if level != PodSecurityLevel::Privileged {
        if let Some(p) = &m.security_context {
            if p.seccomp_profile
                .as_ref()
                .is_some_and(|s| s.kind == "Unconfined")
            {
                errs.push(
                    "securityContext.seccompProfile.type",
                    why("Unconfined is not allowed"),
                );
            }
        }
    }
    for (list, c, i) in m.listed_containers() {
        let path = format!("{list}[{i}]");
        let sc = c.security_context.clone().unwrap_or_default();
        let scp = format!("{path}.securityContext");
        if level == PodSecurityLevel::Privileged {
            continue;
        }
        if c.privileged {
            errs.push(format!("{path}.privileged"), why("privileged containers"));
        }
        if sc.privileged == Some(true) {
            errs.push(format!("{scp}.privileged"), why("privileged containers"));
        }
        if sc
            .seccomp_profile
            .as_ref()
            .is_some_and(|s| s.kind == "Unconfined")
        {
            errs.push(
                format!("{scp}.seccompProfile.type"),
                why("Unconfined is not allowed"),
            );
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        for (k, a) in caps.add.iter().enumerate() {
            let Some(name) = capability_name(a) else {
                continue;
            };
            let allowed = match level {
                PodSecurityLevel::Restricted => name == "NET_BIND_SERVICE",
                _ => BASELINE_CAPABILITIES.contains(&name.as_str()),
            };
            if !allowed {
                errs.push(
                    format!("{scp}.capabilities.add[{k}]"),
                    why(&format!("{name} is beyond the {level} list")),
                );
            }
        }
        if level == PodSecurityLevel::Restricted {
            let non_root = sc
                .run_as_non_root
                .or(m.security_context.as_ref().and_then(|p| p.run_as_non_root));
            if non_root != Some(true) {
                errs.push(
                    format!("{scp}.runAsNonRoot"),
                    why("must be true (set it here or in the pod's securityContext)"),
                );
            }
            let uid = sc
                .run_as_user
                .or(m.security_context.as_ref().and_then(|p| p.run_as_user));
            if uid == Some(0) {
                errs.push(format!("{scp}.runAsUser"), why("root (0)"));
            }
            if sc.allow_privilege_escalation == Some(true) {
                errs.push(
                    format!("{scp}.allowPrivilegeEscalation"),
                    why("privilege escalation"),
                );
            }
        }
    }
    let mut errs = in_form(m, errs.0);
    if level == PodSecurityLevel::Restricted {
        errs.extend(restricted_unwritten(m));
    }
    errs
}

/// What Kubernetes' restricted level requires each container to say, which hostlet would otherwise do
/// for it: `allowPrivilegeEscalation: false`, `capabilities.drop` with `ALL`, and a `RuntimeDefault`
/// seccomp profile (the container's or the pod's). [`check_level`] refuses these under `restricted`; a pod
/// already running as admitted before is kept (see the pod controller's admission).
pub fn restricted_unwritten(m: &PodManifest) -> Vec<FieldError> {
    let mut errs = Errors(Vec::new());
    let pod_seccomp = m
        .security_context
        .as_ref()
        .and_then(|p| p.seccomp_profile.as_ref())
        .map(|p| p.kind.as_str());
    for (list, c, i) in m.listed_containers() {
        let scp = format!("{list}[{i}].securityContext");
        let sc = c.security_context.clone().unwrap_or_default();
        let why = |what: &str| {
            format!("{what} (refused under --pod-security restricted, as Kubernetes' restricted level refuses it)")
        };
        // `true` is refused by the level itself.
        if sc.allow_privilege_escalation.is_none() {
            errs.push(
                format!("{scp}.allowPrivilegeEscalation"),
                why("must be written, false"),
            );
        }
        let drops_all = sc.capabilities.as_ref().is_some_and(|caps| {
            caps.drop
                .iter()
                .any(|d| capability_name(d).as_deref() == Some("ALL"))
        });
        if !drops_all {
            errs.push(format!("{scp}.capabilities.drop"), why("must include ALL"));
        }
        let seccomp = sc
            .seccomp_profile
            .as_ref()
            .map(|p| p.kind.as_str())
            .or(pod_seccomp);
        if seccomp.is_none() {
            errs.push(
                format!("{scp}.seccompProfile.type"),
                why("must be RuntimeDefault (set it here or in the pod's securityContext)"),
            );
        }
    }
    in_form(m, errs.0)
}

/// Field paths in the terms of the form the pod was written in.
fn in_form(m: &PodManifest, errs: Vec<FieldError>) -> Vec<FieldError> {
    match m.form {
        Form::Legacy => errs,
        Form::V1 => errs
            .into_iter()
            .map(|e| FieldError {
                path: crate::v1::path_in_v1(&e.path),
                message: e.message,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_manifest;

    fn pod(containers: &str) -> PodManifest {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: {containers}\n"
        );
        parse_manifest(text.as_bytes()).expect("parses")
    }

    fn paths(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.path.clone()).collect()
    }

    #[test]
    fn baseline_refuses_privileged_and_added_capabilities_with_their_paths() {
        let p = pod("[{name: a, image: busybox, securityContext: {privileged: true, capabilities: {add: [SYS_ADMIN, NET_BIND_SERVICE]}}}]");
        let errs = check_level(&p, PodSecurityLevel::Baseline);
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].securityContext.privileged",
                "spec.containers[0].securityContext.capabilities.add[0]"
            ]
        );
        assert!(errs[1].message.contains("SYS_ADMIN"), "{}", errs[1]);
        assert!(check_level(&p, PodSecurityLevel::Privileged).is_empty());
    }

    #[test]
    fn restricted_requires_non_root_and_refuses_escalation() {
        let p =
            pod("[{name: a, image: busybox, securityContext: {allowPrivilegeEscalation: true}}]");
        assert_eq!(
            paths(&check_level(&p, PodSecurityLevel::Restricted)),
            [
                "spec.containers[0].securityContext.runAsNonRoot",
                "spec.containers[0].securityContext.allowPrivilegeEscalation",
                "spec.containers[0].securityContext.capabilities.drop",
                "spec.containers[0].securityContext.seccompProfile.type"
            ]
        );
        assert!(check_level(&p, PodSecurityLevel::Baseline).is_empty());
        // What Kubernetes' restricted level wants written, and hostlet would have added itself.
        let unwritten = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {runAsNonRoot: true, runAsUser: 1000}\n  containers: [{name: a, image: busybox}]\n  initContainers: [{name: i, image: busybox, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [all]}}}]\n";
        let unwritten = parse_manifest(unwritten.as_bytes()).expect("parses");
        let refused = check_level(&unwritten, PodSecurityLevel::Restricted);
        assert_eq!(
            paths(&refused),
            [
                "spec.initContainers[0].securityContext.seccompProfile.type",
                "spec.containers[0].securityContext.allowPrivilegeEscalation",
                "spec.containers[0].securityContext.capabilities.drop",
                "spec.containers[0].securityContext.seccompProfile.type"
            ]
        );
        assert_eq!(refused, restricted_unwritten(&unwritten));
        assert!(check_level(&unwritten, PodSecurityLevel::Baseline).is_empty());
        let ok = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}\n  containers: [{name: a, image: busybox, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}}]\n";
        let ok = parse_manifest(ok.as_bytes()).expect("parses");
        assert!(check_level(&ok, PodSecurityLevel::Restricted).is_empty());
        let e = effective(&ok, &ok.containers[0], PodSecurityLevel::Restricted);
        assert_eq!(e.cap_drop, ["ALL"]);
        assert_eq!(e.cap_add, ["NET_BIND_SERVICE"]);
        assert_eq!(e.user.as_deref(), Some("1000"));
        assert!(e.no_new_privileges && e.non_root);
    }

    #[test]
    fn the_container_wins_over_the_pod() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {runAsUser: 1000, runAsGroup: 10}\n  containers: [{name: a, image: busybox, securityContext: {runAsUser: 2000, readOnlyRootFilesystem: true}}, {name: b, image: busybox}]\n";
        let p = parse_manifest(text.as_bytes()).expect("parses");
        let a = effective(&p, &p.containers[0], PodSecurityLevel::Baseline);
        assert_eq!(a.user.as_deref(), Some("2000:10"));
        assert!(a.read_only_root);
        assert_eq!(a.cap_drop, ["NET_RAW"]);
        let b = effective(&p, &p.containers[1], PodSecurityLevel::Baseline);
        assert_eq!(b.user.as_deref(), Some("1000:10"));
        assert!(!b.read_only_root);
    }

    #[test]
    fn defaults_harden_a_container_that_asks_nothing() {
        let p = pod("[{name: a, image: busybox}]");
        let e = effective(&p, &p.containers[0], PodSecurityLevel::Baseline);
        assert_eq!(
            e,
            EffectiveSecurity {
                no_new_privileges: true,
                cap_drop: vec!["NET_RAW".into()],
                ..Default::default()
            }
        );
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused_by_path() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: busybox, securityContext: {procMount: Unmasked}}]\n";
        let err = parse_manifest(text.as_bytes()).expect_err("unknown field");
        assert!(
            err.message
                .contains("spec.containers[0].securityContext.procMount"),
            "{err}"
        );
        let p = pod("[{name: a, image: busybox, securityContext: {runAsUser: -1, runAsNonRoot: true, capabilities: {drop: [BOGUS]}, seccompProfile: {type: Localhost}}}]");
        let errs = crate::validate(&p);
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].securityContext.runAsUser",
                "spec.containers[0].securityContext.seccompProfile.type",
                "spec.containers[0].securityContext.capabilities.drop[0]"
            ]
        );
    }

    #[test]
    fn the_2014_form_has_privileged_only() {
        let legacy =
            "version: v1beta1\nid: p\ncontainers: [{name: a, image: busybox, privileged: true}]\n";
        let p = parse_manifest(legacy.as_bytes()).expect("parses");
        assert!(crate::validate(&p).is_empty());
        assert_eq!(
            paths(&check_level(&p, PodSecurityLevel::Baseline)),
            ["containers[0].privileged"]
        );
        let with_context = "version: v1beta1\nid: p\ncontainers: [{name: a, image: busybox, securityContext: {runAsUser: 1}}]\n";
        let p = parse_manifest(with_context.as_bytes()).expect("parses");
        assert_eq!(
            paths(&crate::validate(&p)),
            ["containers[0].securityContext"]
        );
        let v1 = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: busybox, privileged: true}]\n";
        let err = parse_manifest(v1.as_bytes()).expect_err("not a v1 field");
        assert!(
            err.message.contains("spec.containers[0].privileged"),
            "{err}"
        );
    }

    #[test]
    fn levels_parse_by_name() {
        for l in PodSecurityLevel::ALL {
            assert_eq!(l.as_str().parse::<PodSecurityLevel>(), Ok(l));
        }
        assert!("strict".parse::<PodSecurityLevel>().is_err());
        assert_eq!(PodSecurityLevel::default(), PodSecurityLevel::Baseline);
    }
}
