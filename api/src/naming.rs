//! Docker names and labels of hostlet's containers.
//!
//! Names follow the 2014 scheme `k8s--<container>--<pod-id>--<8 hex>`, with `_` written `___` and `-`
//! written `_-_` so that `--` only ever separates fields. Identity comes from the labels; the name is for
//! people reading `docker ps`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::manifest::{Container, PodManifest};

pub const NAME_PREFIX: &str = "k8s";
/// The name of the infra container that owns a pod's network namespace.
pub const INFRA_CONTAINER_NAME: &str = "net";

pub const LABEL_NODE: &str = "io.hostlet.node";
pub const LABEL_POD: &str = "io.hostlet.pod";
pub const LABEL_CONTAINER: &str = "io.hostlet.container";
pub const LABEL_ROLE: &str = "io.hostlet.role";
pub const LABEL_SPEC_HASH: &str = "io.hostlet.spec-hash";
/// How many times the pod's container of that name was restarted: every restart is a new Docker container,
/// so the count survives a restart of hostlet.
pub const LABEL_RESTART_COUNT: &str = "io.hostlet.restart-count";
/// On a sidecar (an init container with `restartPolicy: Always`): its place among the pod's init
/// containers, so that a pod deleted while hostlet was down still stops its sidecars last, in reverse.
pub const LABEL_SIDECAR: &str = "io.hostlet.sidecar";

/// Every label hostlet puts on its containers (docs/reference.md lists them; a test compares the two).
pub const LABELS: [&str; 7] = [
    LABEL_NODE,
    LABEL_POD,
    LABEL_CONTAINER,
    LABEL_ROLE,
    LABEL_SPEC_HASH,
    LABEL_RESTART_COUNT,
    LABEL_SIDECAR,
];

/// What a container is for within its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Infra,
    App,
    /// Runs to completion before the app containers start.
    Init,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Infra => "infra",
            Role::App => "app",
            Role::Init => "init",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "infra" => Some(Role::Infra),
            "app" => Some(Role::App),
            "init" => Some(Role::Init),
            _ => None,
        }
    }
}

/// Escapes `_` as `___` and `-` as `_-_`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for ch in s.chars() {
        match ch {
            '_' => out.push_str("___"),
            '-' => out.push_str("_-_"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`escape`]; `None` when `s` is not the output of `escape` (a lone `_` or `-`).
pub fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '_' => match (chars.next(), chars.next()) {
                (Some('_'), Some('_')) => out.push('_'),
                (Some('-'), Some('_')) => out.push('-'),
                _ => return None,
            },
            '-' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// The parts of a hostlet container name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerName {
    pub container: String,
    pub pod_id: String,
    /// 8 lower-case hex digits that keep names unique across replacements.
    pub suffix: String,
}

impl ContainerName {
    /// `k8s--<container>--<pod-id>--<suffix>`.
    pub fn render(&self) -> String {
        format!(
            "{NAME_PREFIX}--{}--{}--{}",
            escape(&self.container),
            escape(&self.pod_id),
            self.suffix
        )
    }

    /// Reads a Docker container name back (a leading `/`, as Docker lists names, is allowed).
    pub fn parse(name: &str) -> Option<ContainerName> {
        let name = name.strip_prefix('/').unwrap_or(name);
        let mut fields = name.split("--");
        let (prefix, container, pod, suffix) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if prefix != NAME_PREFIX
            || fields.next().is_some()
            || suffix.len() != 8
            || !suffix.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return None;
        }
        Some(ContainerName {
            container: unescape(container)?,
            pod_id: unescape(pod)?,
            suffix: suffix.to_string(),
        })
    }
}

/// The labels hostlet puts on every container it creates.
pub fn labels(
    node: &str,
    pod_id: &str,
    container: &str,
    role: Role,
    spec_hash: &str,
) -> BTreeMap<String, String> {
    [
        (LABEL_NODE, node),
        (LABEL_POD, pod_id),
        (LABEL_CONTAINER, container),
        (LABEL_ROLE, role.as_str()),
        (LABEL_SPEC_HASH, spec_hash),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A hash of everything that decides how a container is created: the container's own spec and the sources
/// of the volumes it mounts. Stable across runs and field order (hashes canonical JSON with sorted keys);
/// any change to the container changes it.
pub fn container_spec_hash(pod: &PodManifest, container: &Container) -> String {
    let volumes: Vec<_> = container
        .volume_mounts
        .iter()
        .map(|m| pod.volume(&m.name).map(|v| v.effective_source()))
        .collect();
    let mut canonical = serde_json::json!({ "container": container, "volumes": volumes });
    // Only when set, so that a pod written before security contexts existed keeps its hashes.
    if let Some(sc) = &pod.security_context {
        canonical["podSecurityContext"] = serde_json::json!(sc);
    }
    short_hash(&canonical)
}

/// A hash of what decides how the infra container is created: the pod id and every published port; and
/// the init containers, when there are any, so that changing one starts the pod afresh (as in Kubernetes).
pub fn infra_spec_hash(pod: &PodManifest, pause_image: &str) -> String {
    let ports: Vec<_> = pod.containers.iter().flat_map(|c| c.ports.iter()).collect();
    let mut canonical = serde_json::json!({ "id": pod.id, "image": pause_image, "ports": ports });
    // Only when set, so that a pod written before these existed keeps its hash.
    if pod.dns_policy.is_some() || pod.dns_config.is_some() || !pod.host_aliases.is_empty() {
        canonical["dns"] = serde_json::json!({
            "policy": pod.dns_policy,
            "config": pod.dns_config,
            "hostAliases": pod.host_aliases,
        });
    }
    if !pod.init_containers.is_empty() {
        let inits: Vec<String> = pod
            .init_containers
            .iter()
            .map(|c| container_spec_hash(pod, c))
            .collect();
        canonical["init"] = serde_json::json!(inits);
    }
    short_hash(&canonical)
}

fn short_hash(v: &serde_json::Value) -> String {
    // serde_json's Map is ordered by key, so to_string is canonical.
    let digest = Sha256::digest(v.to_string().as_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_label_put_on_a_container_is_listed() {
        for key in labels("n", "p", "c", Role::App, "h").keys() {
            assert!(LABELS.contains(&key.as_str()), "{key} is not in LABELS");
        }
        assert!(LABELS.contains(&LABEL_RESTART_COUNT));
    }

    #[test]
    fn escaping_matches_the_2014_scheme() {
        assert_eq!(escape("my_pod-1"), "my___pod_-_1");
        let n = ContainerName {
            container: "net".into(),
            pod_id: "web-1".into(),
            suffix: "0a1b2c3d".into(),
        };
        assert_eq!(n.render(), "k8s--net--web_-_1--0a1b2c3d");
        assert_eq!(
            ContainerName::parse("/k8s--net--web_-_1--0a1b2c3d"),
            Some(n)
        );
    }

    #[test]
    fn runs_of_dashes_and_underscores_round_trip_at_ends_and_middle() {
        for s in [
            "-", "_", "--", "__", "-_", "_-", "---a", "a---", "___a___", "a-_-b", "a_-_b", "-a_b-",
            "_a-b_", "a--b__c", "_-_", "___", "-__-", "x",
        ] {
            let e = escape(s);
            assert!(
                !e.contains("--"),
                "{s:?} escaped to {e:?} holds a separator"
            );
            assert_eq!(unescape(&e).as_deref(), Some(s), "{s:?}");
            let n = ContainerName {
                container: s.into(),
                pod_id: format!("{s}.{s}"),
                suffix: "deadbeef".into(),
            };
            assert_eq!(ContainerName::parse(&n.render()), Some(n));
        }
    }

    #[test]
    fn names_not_ours_are_not_parsed() {
        for n in [
            "web",
            "k8s--a--b",
            "k8s--a--b--xyz",
            "k8s--a--b--0a1b2c3d--e",
            "k9s--a--b--0a1b2c3d",
            "k8s--a_b--c--0a1b2c3d",
        ] {
            assert_eq!(ContainerName::parse(n), None, "{n}");
        }
    }

    #[test]
    fn spec_hash_is_stable_and_sensitive() {
        let pod: PodManifest = crate::parse::parse_manifest(
            b"version: v1beta1\nid: p\ncontainers:\n- name: a\n  image: busybox\n  command: [sh]\n",
        )
        .unwrap();
        let reordered: PodManifest = crate::parse::parse_manifest(
            br#"{"containers":[{"command":["sh"],"image":"busybox","name":"a"}],"id":"p","version":"v1beta1"}"#,
        )
        .unwrap();
        let h = container_spec_hash(&pod, &pod.containers[0]);
        assert_eq!(h.len(), 16);
        assert_eq!(h, container_spec_hash(&reordered, &reordered.containers[0]));
        let mut changed = pod.clone();
        changed.containers[0].command.push("-c".into());
        assert_ne!(h, container_spec_hash(&changed, &changed.containers[0]));
        let mut env = pod.clone();
        env.containers[0].env.push(crate::manifest::EnvVar {
            name: "A".into(),
            value: "1".into(),
            ..Default::default()
        });
        assert_ne!(h, container_spec_hash(&env, &env.containers[0]));
    }

    #[test]
    fn a_pod_without_security_settings_keeps_the_hash_it_had_before_they_existed() {
        let pod: PodManifest = crate::parse::parse_manifest(
            b"version: v1beta1\nid: p\ncontainers:\n- name: a\n  image: busybox\n  command: [sh]\n",
        )
        .unwrap();
        // Computed by the hostlet that had no securityContext: an upgrade must not replace containers.
        assert_eq!(
            container_spec_hash(&pod, &pod.containers[0]),
            "dd81d67c5cb438e5"
        );
        let mut hardened = pod.clone();
        hardened.containers[0].security_context = Some(crate::security::SecurityContext {
            run_as_user: Some(1000),
            ..Default::default()
        });
        assert_ne!(
            container_spec_hash(&hardened, &hardened.containers[0]),
            "dd81d67c5cb438e5"
        );
        let mut pod_level = pod.clone();
        pod_level.security_context = Some(crate::security::PodSecurityContext {
            run_as_non_root: Some(true),
            ..Default::default()
        });
        assert_ne!(
            container_spec_hash(&pod_level, &pod_level.containers[0]),
            "dd81d67c5cb438e5"
        );
    }

    proptest! {
        #[test]
        fn escape_round_trips(s in "[a-z0-9_.-]{0,24}") {
            prop_assert_eq!(unescape(&escape(&s)), Some(s.clone()));
        }

        #[test]
        fn container_names_round_trip(c in "[a-z0-9_-]{1,20}", p in "[a-z0-9_.-]{1,40}", n in any::<u32>()) {
            let name = ContainerName { container: c, pod_id: p, suffix: format!("{n:08x}") };
            prop_assert_eq!(ContainerName::parse(&name.render()), Some(name));
        }
    }
}
