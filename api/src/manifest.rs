//! The pod manifest: the 2014 `ContainerManifest` (v1beta1/v1beta2) as it was written then, plus the fields
//! users expect today. Old spellings are accepted on input and normalised; output always uses today's names,
//! so `parse(serialize(m)) == m`.
//!
//! The Kubernetes v1 form (`apiVersion: v1`, `kind: Pod`, `metadata`, `spec`) is read into the same model
//! (see [`crate::v1`]); [`PodManifest::form`] remembers which form a pod was written in so that output
//! keeps it.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// One pod: a group of containers sharing a network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodManifest {
    /// The form the manifest was written in. Not a field of either form: the parser sets it.
    #[serde(skip)]
    pub form: Form,
    /// `v1beta1` or `v1beta2`; mandatory. `v1` for a manifest of the Kubernetes form.
    #[serde(default)]
    pub version: String,
    /// DNS subdomain, unique per node across all sources.
    #[serde(default)]
    pub id: String,
    /// 2014 manifests carried a uuid; kept so nothing an operator wrote is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Kept and shown; hostlet does not act on them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Run to completion one after the other, in order, before the app containers start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
    /// What the containers inherit (v1 form only; validation refuses it in the 2014 form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Name resolution (v1 form only; see [`crate::dns`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<DnsPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<PodDnsConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_aliases: Vec<HostAlias>,
    #[serde(default)]
    pub containers: Vec<Container>,
}

/// Which form a manifest is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Form {
    /// The 2014 `ContainerManifest` (`version`, `id`, `containers` at the top).
    #[default]
    Legacy,
    /// The Kubernetes v1 Pod (`apiVersion: v1`, `kind: Pod`, `metadata`, `spec`).
    V1,
}

impl PodManifest {
    /// The restart policy in force (`Always` when unset, as in Kubernetes).
    pub fn effective_restart_policy(&self) -> RestartPolicy {
        self.restart_policy.unwrap_or(RestartPolicy::Always)
    }

    /// The grace period in force: the manifest's value, 30 s when unset, never below 2 s (kubelet's floor).
    pub fn effective_grace_period_seconds(&self) -> i64 {
        self.termination_grace_period_seconds.unwrap_or(30).max(2)
    }

    /// Every container: the init containers in order, then the app containers.
    pub fn all_containers(&self) -> impl Iterator<Item = &Container> {
        self.init_containers.iter().chain(self.containers.iter())
    }

    /// Every container as [`Self::all_containers`], with its list's name and its index there (for
    /// field paths such as `containers[1]`).
    pub fn listed_containers(&self) -> impl Iterator<Item = (&'static str, &Container, usize)> {
        let init = self.init_containers.iter().enumerate();
        let apps = self.containers.iter().enumerate();
        init.map(|(i, c)| ("initContainers", c, i))
            .chain(apps.map(|(i, c)| ("containers", c, i)))
    }

    /// The volume of that name, if declared.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

/// When a container that exited is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Some(RestartPolicy::Always),
            "onfailure" => Some(RestartPolicy::OnFailure),
            "never" => Some(RestartPolicy::Never),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for RestartPolicy {
    /// Accepts today's string form and the 2014 object form (`{always: {}}`, `{onFailure: {}}`, `{never: {}}`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RestartPolicy;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("Always, OnFailure or Never")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RestartPolicy, E> {
                RestartPolicy::from_name(s).ok_or_else(|| {
                    E::custom(format!(
                        "restartPolicy: unknown value {s:?}, expected Always, OnFailure or Never"
                    ))
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RestartPolicy, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(serde::de::Error::custom(
                        "restartPolicy: empty, expected Always, OnFailure or Never",
                    ));
                };
                // The value (`{}` in 2014) carries nothing; read it as a value so it is not reported as ignored.
                let _: serde_json::Value = map.next_value()?;
                if map.next_key::<String>()?.is_some() {
                    return Err(serde::de::Error::custom(
                        "restartPolicy: give exactly one of always, onFailure and never",
                    ));
                }
                self.visit_str(&name)
            }
        }
        d.deserialize_any(V)
    }
}

/// A named volume of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    #[serde(default)]
    pub name: String,
    /// Absent in many 2014 manifests: such a volume is an emptyDir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<VolumeSource>,
}

impl Volume {
    /// The source in force: an emptyDir when none is given.
    pub fn effective_source(&self) -> VolumeSource {
        self.source.clone().unwrap_or_default()
    }
}

/// Where a volume's data lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDir>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_dir: Option<HostDir>,
    /// The files of a ConfigMap, kept up to date while the pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// The files of a Secret, on tmpfs, kept up to date while the pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
}

/// A configMap volume (Kubernetes' fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapVolumeSource {
    #[serde(default)]
    pub name: String,
    /// Only these keys, at these paths (all keys, each at its own name, when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeyToPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    /// The pod starts without it (an empty volume) instead of waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A secret volume (Kubernetes' fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolumeSource {
    #[serde(default)]
    pub secret_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeyToPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// One key of a ConfigMap or Secret as a file of the volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeyToPath {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
}

/// What a pod refers to by name: a ConfigMap or a Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
}

impl ConfigKind {
    /// As Kubernetes names it in messages (`configmap "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            ConfigKind::ConfigMap => "configmap",
            ConfigKind::Secret => "secret",
        }
    }
}

impl PodManifest {
    /// Every ConfigMap and Secret the pod refers to (volumes, `valueFrom`, `envFrom`), optional or not.
    pub fn config_refs(&self) -> std::collections::BTreeSet<(ConfigKind, String)> {
        let mut out = std::collections::BTreeSet::new();
        for v in &self.volumes {
            if let Some(src) = &v.source {
                if let Some(c) = &src.config_map {
                    out.insert((ConfigKind::ConfigMap, c.name.clone()));
                }
                if let Some(s) = &src.secret {
                    out.insert((ConfigKind::Secret, s.secret_name.clone()));
                }
            }
        }
        for c in self.all_containers() {
            out.extend(c.env_config_refs());
        }
        out
    }
}

impl Container {
    /// The ConfigMaps and Secrets the container's environment reads (`valueFrom`, `envFrom`).
    pub fn env_config_refs(&self) -> impl Iterator<Item = (ConfigKind, String)> + '_ {
        let values = self.env.iter().filter_map(|e| {
            let (kind, r) = e.value_from.as_ref().and_then(EnvVarSource::reference)?;
            Some((kind, r.name.clone()))
        });
        let whole = self
            .env_from
            .iter()
            .filter_map(|f| f.reference().map(|(kind, r)| (kind, r.name.clone())));
        values.chain(whole)
    }
}

/// The pod annotation that says what a change of a ConfigMap or Secret a container uses does to it:
/// `restart` (the container is made again, so its environment is read afresh) or `signal:SIGHUP` (any stop
/// signal name; sent once the volume files are updated).
pub const ON_CONFIG_CHANGE: &str = "hostlet.io/on-config-change";

/// What [`ON_CONFIG_CHANGE`] asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnConfigChange {
    Restart,
    Signal(String),
}

impl OnConfigChange {
    /// The annotation's value read; `Err` says what is wrong with it.
    pub fn parse(value: &str) -> Result<OnConfigChange, String> {
        match value.strip_prefix("signal:") {
            None if value == "restart" => Ok(OnConfigChange::Restart),
            Some(sig) if is_stop_signal(sig) => Ok(OnConfigChange::Signal(sig.to_string())),
            _ => Err(format!(
                "{value:?}: expected restart or signal:<name> (e.g. signal:SIGHUP)"
            )),
        }
    }
}

impl PodManifest {
    /// What the pod's [`ON_CONFIG_CHANGE`] annotation asks, when it is there and valid.
    pub fn on_config_change(&self) -> Option<OnConfigChange> {
        OnConfigChange::parse(self.annotations.get(ON_CONFIG_CHANGE)?).ok()
    }

    /// The ConfigMaps and Secrets container `c` uses: the volumes it mounts, `valueFrom` and `envFrom`.
    pub fn container_config_refs(
        &self,
        c: &Container,
    ) -> std::collections::BTreeSet<(ConfigKind, String)> {
        let mut out = std::collections::BTreeSet::new();
        for m in &c.volume_mounts {
            let Some(src) = self.volume(&m.name).map(|v| v.effective_source()) else {
                continue;
            };
            if let Some(cm) = &src.config_map {
                out.insert((ConfigKind::ConfigMap, cm.name.clone()));
            }
            if let Some(sec) = &src.secret {
                out.insert((ConfigKind::Secret, sec.secret_name.clone()));
            }
        }
        out.extend(c.env_config_refs());
        out
    }
}

impl VolumeSource {
    /// The host path when this is a hostDir volume.
    pub fn host_path(&self) -> Option<&str> {
        self.host_dir
            .as_ref()
            .filter(|h| !h.is_device())
            .map(|h| h.path.as_str())
    }

    /// The host path when this is a device (`hostPath` of type `CharDevice` or `BlockDevice`).
    pub fn device_path(&self) -> Option<&str> {
        self.host_dir
            .as_ref()
            .filter(|h| h.is_device())
            .map(|h| h.path.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct EmptyDir {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HostDir {
    #[serde(default)]
    pub path: String,
    /// v1 `hostPath.type`: a directory (`""`, `DirectoryOrCreate`) or a device (`CharDevice`,
    /// `BlockDevice`), which is passed to the container as a device, not mounted.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl HostDir {
    /// `CharDevice` or `BlockDevice`: a device the container gets (on a path `--allowed-devices` allows).
    pub fn is_device(&self) -> bool {
        matches!(self.kind.as_deref(), Some("CharDevice" | "BlockDevice"))
    }
}

/// One container of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Kubernetes semantics: `command` replaces the image's entrypoint, `args` its cmd.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Every key of a ConfigMap or Secret as a variable; `env` wins on a name in both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// 2014: milli-CPU as an integer. Folded into `resources.limits.cpu` when parsed.
    #[serde(default, skip_serializing)]
    pub cpu: Option<i64>,
    /// 2014: memory in bytes as an integer. Folded into `resources.limits.memory` when parsed.
    #[serde(default, skip_serializing)]
    pub memory: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<Probe>,
    /// 2014: the one security knob of the form. A v1 Pod says `securityContext.privileged`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub privileged: bool,
    /// v1 form only (validation refuses it in the 2014 form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// v1 form only: the signal that stops the container (`lifecycle.stopSignal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// v1 form, init containers only: `Always` makes it a sidecar, started in order with the other init
    /// containers and kept running beside the app containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// A container's `lifecycle`: the stop signal (the image's `STOPSIGNAL` when not given, else SIGTERM) and
/// the hooks run right after its start and before its stop, as the kubelet runs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_start: Option<LifecycleHandler>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<LifecycleHandler>,
}

/// One hook: exactly one of a command in the container, an HTTP GET to it, or a pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleHandler {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<SleepAction>,
}

/// `sleep: {seconds: N}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SleepAction {
    #[serde(default)]
    pub seconds: i64,
}

/// What a hook does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAction<'a> {
    Exec(&'a ExecAction),
    Http(&'a HttpGetAction),
    Sleep(i64),
}

impl LifecycleHandler {
    /// The action, when exactly one is given.
    pub fn action(&self) -> Option<HookAction<'_>> {
        match (&self.exec, &self.http_get, &self.sleep) {
            (Some(e), None, None) => Some(HookAction::Exec(e)),
            (None, Some(h), None) => Some(HookAction::Http(h)),
            (None, None, Some(s)) => Some(HookAction::Sleep(s.seconds)),
            _ => None,
        }
    }
}

impl Container {
    /// The container's `postStart` hook, if any.
    pub fn post_start(&self) -> Option<&LifecycleHandler> {
        self.lifecycle.as_ref()?.post_start.as_ref()
    }

    /// An init container with `restartPolicy: Always`: a sidecar (validation allows it nowhere else).
    pub fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }

    /// The container's `preStop` hook, if any.
    pub fn pre_stop(&self) -> Option<&LifecycleHandler> {
        self.lifecycle.as_ref()?.pre_stop.as_ref()
    }
}

/// The signals a container may be stopped with, as Kubernetes' `lifecycle.stopSignal` allows on Linux.
pub fn is_stop_signal(s: &str) -> bool {
    const NAMED: [&str; 33] = [
        "SIGABRT",
        "SIGALRM",
        "SIGBUS",
        "SIGCHLD",
        "SIGCLD",
        "SIGCONT",
        "SIGFPE",
        "SIGHUP",
        "SIGILL",
        "SIGINT",
        "SIGIO",
        "SIGIOT",
        "SIGKILL",
        "SIGPIPE",
        "SIGPOLL",
        "SIGPROF",
        "SIGPWR",
        "SIGQUIT",
        "SIGSEGV",
        "SIGSTKFLT",
        "SIGSTOP",
        "SIGSYS",
        "SIGTERM",
        "SIGTRAP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGUSR1",
        "SIGUSR2",
        "SIGVTALRM",
        "SIGWINCH",
        "SIGXCPU",
    ];
    if NAMED.contains(&s) || s == "SIGXFSZ" || s == "SIGRTMIN" || s == "SIGRTMAX" {
        return true;
    }
    let offset = |rest: Option<&str>, max: u32| {
        rest.and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| (1..=max).contains(&n))
    };
    offset(s.strip_prefix("SIGRTMIN+"), 15) || offset(s.strip_prefix("SIGRTMAX-"), 14)
}

/// When an image is pulled. The 2014 form spelled the values `PullAlways`, `PullIfNotPresent` and
/// `PullNever`; a v1 Pod may not (refused with its path before it gets here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PullPolicy {
    #[serde(alias = "PullAlways")]
    Always,
    #[serde(alias = "PullIfNotPresent")]
    IfNotPresent,
    #[serde(alias = "PullNever")]
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// 2014 called it `key`.
    #[serde(default, alias = "key")]
    pub name: String,
    #[serde(default)]
    pub value: String,
    /// The value from a ConfigMap or Secret key, read when the container is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where an environment variable's value comes from (`fieldRef` and `resourceFieldRef` are not supported).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,
}

impl EnvVarSource {
    /// The one reference it holds (validation refuses none or both).
    pub fn reference(&self) -> Option<(ConfigKind, &KeySelector)> {
        match (&self.config_map_key_ref, &self.secret_key_ref) {
            (Some(c), _) => Some((ConfigKind::ConfigMap, c)),
            (None, Some(s)) => Some((ConfigKind::Secret, s)),
            (None, None) => None,
        }
    }
}

/// One key of a named ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeySelector {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Every key of a ConfigMap or Secret as environment variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<NameRef>,
}

impl EnvFromSource {
    /// The one reference it holds (validation refuses none or both).
    pub fn reference(&self) -> Option<(ConfigKind, &NameRef)> {
        match (&self.config_map_ref, &self.secret_ref) {
            (Some(c), _) => Some((ConfigKind::ConfigMap, c)),
            (None, Some(s)) => Some((ConfigKind::Secret, s)),
            (None, None) => None,
        }
    }
}

/// A ConfigMap or Secret by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NameRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Kept wide so that an out-of-range number is a validation error with its path, not a parse error.
    #[serde(default)]
    pub container_port: i64,
    /// 0 (or absent) means "not published".
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_port: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(
        default,
        rename = "hostIP",
        alias = "hostIp",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_ip: Option<String>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl Port {
    /// The protocol in force, upper-cased (`TCP` when unset).
    pub fn effective_protocol(&self) -> String {
        self.protocol
            .as_deref()
            .map(str::to_ascii_uppercase)
            .unwrap_or_else(|| "TCP".to_string())
    }

    /// The host address in force (`0.0.0.0` when unset).
    pub fn effective_host_ip(&self) -> String {
        match self.host_ip.as_deref() {
            None | Some("") => "0.0.0.0".to_string(),
            Some(ip) => ip.to_string(),
        }
    }
}

/// 2014 mount types: `HOST` bound a host directory, `LOCAL` a directory private to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountType {
    #[serde(alias = "host")]
    #[serde(rename = "HOST")]
    Host,
    #[serde(alias = "local")]
    #[serde(rename = "LOCAL")]
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    #[serde(default)]
    pub name: String,
    /// 2014 also spelled it `path`.
    #[serde(default, alias = "path")]
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<MountType>,
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// The extended resource a container asks NVIDIA GPUs with, as the Kubernetes device plugin names it.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A GPU count: a whole number, 1 or more (GPUs are not shared).
pub fn gpu_count(q: &Quantity) -> Option<i64> {
    q.0.parse::<i64>().ok().filter(|n| (1..=64).contains(n))
}

/// Resource limits, written as Kubernetes quantities (`500m`, `64Mi`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// What the container is guaranteed: CPU shares and a memory reservation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

/// A Kubernetes quantity as written (a number or a string such as `500m`, `1.5`, `64Mi`, `1G`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
            F(f64),
        }
        Ok(Quantity(match Raw::deserialize(d)? {
            Raw::S(s) => s,
            Raw::I(i) => i.to_string(),
            Raw::F(f) => f.to_string(),
        }))
    }
}

impl Quantity {
    /// CPU in thousandths of a core (`500m` → 500, `1.5` → 1500). `None` when it does not parse.
    pub fn cpu_millis(&self) -> Option<i64> {
        let s = self.0.trim();
        if let Some(m) = s.strip_suffix('m') {
            return m.parse::<i64>().ok().filter(|v| *v >= 0);
        }
        let cores: f64 = s.parse().ok()?;
        (cores.is_finite() && cores >= 0.0).then(|| (cores * 1000.0).round() as i64)
    }

    /// Memory in bytes (`64Mi`, `1G`, `1000`). `None` when it does not parse.
    pub fn bytes(&self) -> Option<i64> {
        const SUFFIXES: [(&str, f64); 12] = [
            ("Ki", 1024.0),
            ("Mi", 1048576.0),
            ("Gi", 1073741824.0),
            ("Ti", 1099511627776.0),
            ("Pi", 1125899906842624.0),
            ("Ei", 1152921504606846976.0),
            ("k", 1e3),
            ("M", 1e6),
            ("G", 1e9),
            ("T", 1e12),
            ("P", 1e15),
            ("E", 1e18),
        ];
        let s = self.0.trim();
        let (num, mult) = SUFFIXES
            .iter()
            .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
            .unwrap_or((s, 1.0));
        let v: f64 = num.parse().ok()?;
        let bytes = v * mult;
        (bytes.is_finite() && (0.0..9.2e18).contains(&bytes)).then_some(bytes as i64)
    }
}

/// A health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// 2014: `http` or `tcp`, selecting which of the handlers below is meant. Today the handler present says it.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i64>,
}

/// The one action a probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction<'a> {
    Http(&'a HttpGetAction),
    Tcp(&'a TcpSocketAction),
    Exec(&'a ExecAction),
}

impl Probe {
    /// The handler in force; the 2014 `type` picks one when several are given.
    pub fn action(&self) -> Option<ProbeAction<'_>> {
        match self.kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("http") => self.http_get.as_ref().map(ProbeAction::Http),
            Some("tcp") => self.tcp_socket.as_ref().map(ProbeAction::Tcp),
            Some("exec") => self.exec.as_ref().map(ProbeAction::Exec),
            _ => self
                .http_get
                .as_ref()
                .map(ProbeAction::Http)
                .or(self.tcp_socket.as_ref().map(ProbeAction::Tcp))
                .or(self.exec.as_ref().map(ProbeAction::Exec)),
        }
    }
    /// Seconds between probes (10 by default).
    pub fn period(&self) -> i64 {
        self.period_seconds.unwrap_or(10).max(1)
    }
    /// Seconds before a probe attempt counts as failed (1 by default).
    pub fn timeout(&self) -> i64 {
        self.timeout_seconds.unwrap_or(1).max(1)
    }
    /// Consecutive failures that make the probe fail (3 by default).
    pub fn failure_threshold(&self) -> i64 {
        self.failure_threshold.unwrap_or(3).max(1)
    }
    /// Consecutive successes that make the probe pass (1 by default).
    pub fn success_threshold(&self) -> i64 {
        self.success_threshold.unwrap_or(1).max(1)
    }
    /// Seconds after the container starts before the first probe (0 by default).
    pub fn initial_delay(&self) -> i64 {
        self.initial_delay_seconds.unwrap_or(0).max(0)
    }
}

/// A port given by number or by the name of one of the container's ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    Number(i64),
    Name(String),
}

impl Default for PortRef {
    fn default() -> Self {
        PortRef::Number(0)
    }
}

impl PortRef {
    /// The port number, resolving a name against the container's ports.
    pub fn resolve(&self, container: &Container) -> Option<u16> {
        let n = match self {
            PortRef::Number(n) => *n,
            PortRef::Name(name) => match name.parse::<i64>() {
                Ok(n) => n,
                Err(_) => {
                    container
                        .ports
                        .iter()
                        .find(|p| &p.name == name)?
                        .container_port
                }
            },
        };
        u16::try_from(n).ok().filter(|p| *p != 0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpGetAction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default)]
    pub port: PortRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct TcpSocketAction {
    #[serde(default)]
    pub port: PortRef,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExecAction {
    #[serde(default)]
    pub command: Vec<String>,
}

impl Container {
    /// Moves the 2014 integer `cpu`/`memory` fields into `resources.limits`, unless limits already say.
    pub(crate) fn normalise(&mut self) {
        let cpu = self.cpu.take().filter(|v| *v > 0);
        let memory = self.memory.take().filter(|v| *v > 0);
        if cpu.is_none() && memory.is_none() {
            return;
        }
        let limits = &mut self.resources.get_or_insert_with(Resources::default).limits;
        if let Some(c) = cpu {
            limits
                .entry("cpu".to_string())
                .or_insert_with(|| Quantity(format!("{c}m")));
        }
        if let Some(m) = memory {
            limits
                .entry("memory".to_string())
                .or_insert_with(|| Quantity(m.to_string()));
        }
    }

    /// CPU limit in milli-cores, when set and valid.
    pub fn cpu_millis(&self) -> Option<i64> {
        self.resources.as_ref()?.limits.get("cpu")?.cpu_millis()
    }

    /// NVIDIA GPUs asked for (`resources.limits` `nvidia.com/gpu`), when set and a whole number.
    pub fn gpus(&self) -> Option<i64> {
        gpu_count(self.resources.as_ref()?.limits.get(GPU_RESOURCE)?)
    }

    /// Memory limit in bytes, when set and valid.
    pub fn memory_bytes(&self) -> Option<i64> {
        self.resources.as_ref()?.limits.get("memory")?.bytes()
    }

    /// CPU request in milli-cores, when set and valid.
    pub fn cpu_request_millis(&self) -> Option<i64> {
        self.resources.as_ref()?.requests.get("cpu")?.cpu_millis()
    }

    /// Memory request in bytes, when set and valid.
    pub fn memory_request_bytes(&self) -> Option<i64> {
        self.resources.as_ref()?.requests.get("memory")?.bytes()
    }
}

/// A container's `securityContext`: the subset hostlet runs. Any other field is refused with its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_root_filesystem: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_privilege_escalation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_profile: Option<SeccompProfile>,
}

/// A pod's `securityContext`: what its containers inherit unless they say otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_profile: Option<SeccompProfile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Capabilities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SeccompProfile {
    /// `RuntimeDefault` or `Unconfined`.
    #[serde(default, rename = "type")]
    pub kind: String,
}

/// How a pod's names resolve (see [`crate::dns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DnsPolicy {
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodDnsConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub searches: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<DnsOption>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DnsOption {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostAlias {
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub hostnames: Vec<String>,
}
