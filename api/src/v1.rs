//! The Kubernetes v1 Pod form (`apiVersion: v1`, `kind: Pod`) of a manifest: the subset hostlet runs,
//! read into (and written from) the same [`PodManifest`] as the 2014 form. Fields outside the subset are
//! refused with their path by the parser, as for the 2014 form.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::manifest::{
    ConfigMapVolumeSource, Container, EmptyDir, Form, HostDir, PodManifest, RestartPolicy,
    SecretVolumeSource, Volume, VolumeSource,
};
use crate::manifest::{DnsPolicy, HostAlias, PodDnsConfig, PodSecurityContext};

/// The `apiVersion` of the form.
pub const API_VERSION: &str = "v1";
/// The only `kind` hostlet runs.
pub const KIND: &str = "Pod";

/// A Pod as Kubernetes writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The pod id.
    #[serde(default)]
    pub name: String,
    /// What `kubectl get -o yaml` prints; kept as the 2014 uuid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<PodVolume>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<DnsPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<PodDnsConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_aliases: Vec<HostAlias>,
}

/// A volume: its source inline, as Kubernetes writes it (`hostPath` is the 2014 `hostDir`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDir>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostDir>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
}

impl From<Pod> for PodManifest {
    fn from(p: Pod) -> Self {
        PodManifest {
            form: Form::V1,
            version: API_VERSION.to_string(),
            id: p.metadata.name,
            uuid: p.metadata.uid,
            labels: p.metadata.labels,
            annotations: p.metadata.annotations,
            restart_policy: p.spec.restart_policy,
            termination_grace_period_seconds: p.spec.termination_grace_period_seconds,
            volumes: p
                .spec
                .volumes
                .into_iter()
                .map(|v| Volume {
                    name: v.name,
                    source: (v.empty_dir.is_some()
                        || v.host_path.is_some()
                        || v.config_map.is_some()
                        || v.secret.is_some())
                    .then_some(VolumeSource {
                        empty_dir: v.empty_dir,
                        host_dir: v.host_path,
                        config_map: v.config_map,
                        secret: v.secret,
                    }),
                })
                .collect(),
            init_containers: p.spec.init_containers,
            containers: p.spec.containers,
            security_context: p.spec.security_context,
            dns_policy: p.spec.dns_policy,
            dns_config: p.spec.dns_config,
            host_aliases: p.spec.host_aliases,
        }
    }
}

impl From<&PodManifest> for Pod {
    fn from(m: &PodManifest) -> Self {
        Pod {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            metadata: ObjectMeta {
                name: m.id.clone(),
                uid: m.uuid.clone(),
                labels: m.labels.clone(),
                annotations: m.annotations.clone(),
            },
            spec: PodSpec {
                restart_policy: m.restart_policy,
                termination_grace_period_seconds: m.termination_grace_period_seconds,
                volumes: m
                    .volumes
                    .iter()
                    .map(|v| {
                        let src = v.source.clone().unwrap_or_default();
                        PodVolume {
                            name: v.name.clone(),
                            empty_dir: src.empty_dir,
                            host_path: src.host_dir,
                            config_map: src.config_map,
                            secret: src.secret,
                        }
                    })
                    .collect(),
                init_containers: m.init_containers.clone(),
                containers: m.containers.clone(),
                security_context: m.security_context.clone(),
                dns_policy: m.dns_policy,
                dns_config: m.dns_config.clone(),
                host_aliases: m.host_aliases.clone(),
            },
        }
    }
}

/// The manifest as the 2014 form writes it: the same pod, with a 2014 version when it was a v1 Pod.
pub fn as_legacy(m: &PodManifest) -> PodManifest {
    let mut out = m.clone();
    if out.form == Form::V1 {
        out.form = Form::Legacy;
        out.version = "v1beta2".to_string();
    }
    out
}

/// The manifest as a v1 Pod. What only the 2014 form has goes: a probe's `type` (the handler present
/// says it; the others it did not select are dropped) and a mount's `mountType` (read, never acted on).
pub fn as_v1(m: &PodManifest) -> PodManifest {
    let mut out = m.clone();
    out.form = Form::V1;
    out.version = API_VERSION.to_string();
    for c in out
        .containers
        .iter_mut()
        .chain(out.init_containers.iter_mut())
    {
        for vm in c.volume_mounts.iter_mut() {
            vm.mount_type = None;
        }
        if std::mem::take(&mut c.privileged) {
            c.security_context
                .get_or_insert_with(Default::default)
                .privileged = Some(true);
        }
        for p in [
            &mut c.liveness_probe,
            &mut c.readiness_probe,
            &mut c.startup_probe,
        ]
        .into_iter()
        .flatten()
        {
            match p.kind.take().map(|k| k.to_ascii_lowercase()).as_deref() {
                Some("http") => {
                    p.tcp_socket = None;
                    p.exec = None;
                }
                Some("tcp") => {
                    p.http_get = None;
                    p.exec = None;
                }
                Some("exec") => {
                    p.http_get = None;
                    p.tcp_socket = None;
                }
                _ => {}
            }
        }
    }
    out
}

/// A field path of the 2014 form (as validation names fields) in the v1 form's terms.
pub fn path_in_v1(path: &str) -> String {
    let head_end = path.find(['.', '[']).unwrap_or(path.len());
    let (head, rest) = path.split_at(head_end);
    match head {
        "id" => format!("metadata.name{rest}"),
        "uuid" => format!("metadata.uid{rest}"),
        "version" => format!("apiVersion{rest}"),
        "labels" | "annotations" => format!("metadata.{path}"),
        "volumes" => {
            // `volumes[0].source.hostDir.path` → `spec.volumes[0].hostPath.path`
            let rest = rest
                .replacen(".source.hostDir", ".hostPath", 1)
                .replacen(".source.emptyDir", ".emptyDir", 1)
                .replacen(".source.configMap", ".configMap", 1)
                .replacen(".source.secret", ".secret", 1);
            let rest = rest.strip_suffix(".source").unwrap_or(&rest);
            format!("spec.volumes{rest}")
        }
        "" => path.to_string(),
        _ => format!("spec.{path}"),
    }
}
