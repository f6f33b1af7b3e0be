//! `hostlet.io/on-config-change`: a change of a ConfigMap or Secret that an app container uses restarts
//! that container (`restart`: it is made again, so its environment is read afresh) or signals it once its
//! volume files are updated (`signal:SIGHUP`). Without the annotation nothing restarts, as in Kubernetes.

use hostlet_api::manifest::{ConfigKind, OnConfigChange};
use sha2::Digest;

use super::*;

/// By app container: what it uses, each with the revision it was written at.
type Uses = BTreeMap<String, BTreeMap<(ConfigKind, String), i64>>;

impl<R: ContainerRuntime> Shared<R> {
    fn config_uses(&self, m: &PodManifest) -> Uses {
        m.containers
            .iter()
            .map(|c| {
                let uses = m
                    .container_config_refs(c)
                    .into_iter()
                    .map(|(kind, name)| {
                        let rev = self.configs.revision(kind, &name);
                        ((kind, name), rev)
                    })
                    .collect();
                (c.name.clone(), uses)
            })
            .collect()
    }

    /// Before the plan: under `restart`, each app container's hash also covers the revisions of what it
    /// uses, so that a change makes it again (its stop as any replacement's: preStop, stop signal, grace).
    /// Under either mode, a change since the last look is an event naming what changed; under `signal`,
    /// the containers to signal once the files are written are returned.
    pub(super) fn follow_configs(&self, pod: &str, run: &mut DesiredPod) -> Vec<(String, String)> {
        let Some(mode) = run.manifest.on_config_change() else {
            lock(&self.config_seen).remove(pod);
            return Vec::new();
        };
        let uses = self.config_uses(&run.manifest);
        if mode == OnConfigChange::Restart {
            for (name, used) in &uses {
                if used.is_empty() {
                    continue;
                }
                let mut h = sha2::Sha256::new();
                for ((kind, object), rev) in used {
                    h.update(format!("{}/{object}@{rev};", kind.noun()));
                }
                let digest: String = h
                    .finalize()
                    .iter()
                    .take(4)
                    .map(|b| format!("{b:02x}"))
                    .collect();
                if let Some(hash) = run.hashes.get_mut(name) {
                    *hash = format!("{hash}-{digest}");
                }
            }
        }
        let before = lock(&self.config_seen).insert(pod.to_string(), uses.clone());
        let Some(before) = before else {
            return Vec::new();
        };
        let mut to_signal = Vec::new();
        for (name, used) in &uses {
            let changed: Vec<String> = used
                .iter()
                .filter(|(what, rev)| before.get(name).and_then(|b| b.get(*what)) != Some(*rev))
                .map(|((kind, object), _)| format!("{} {object}", kind.noun()))
                .collect();
            if changed.is_empty() {
                continue;
            }
            let (action, signal) = match &mode {
                OnConfigChange::Restart => ("restarted".to_string(), None),
                OnConfigChange::Signal(sig) => {
                    (format!("sent {sig} once its files are updated"), Some(sig))
                }
            };
            self.status.event(
                pod,
                Some(name),
                "ConfigChanged",
                &format!(
                    "{} changed: container {name} is {action} ({}: {})",
                    changed.join(", "),
                    hostlet_api::manifest::ON_CONFIG_CHANGE,
                    run.manifest
                        .annotations
                        .get(hostlet_api::manifest::ON_CONFIG_CHANGE)
                        .map_or("", String::as_str)
                ),
                false,
            );
            if let Some(sig) = signal {
                to_signal.push((name.clone(), sig.clone()));
            }
        }
        to_signal
    }

    /// Under `signal:…`: after the volume files were written, the running containers whose configs changed
    /// get the signal.
    pub(super) async fn signal_changed(
        &self,
        pod: &str,
        observed: &ObservedPod,
        to_signal: &[(String, String)],
    ) {
        for (name, sig) in to_signal {
            let running = observed
                .containers
                .iter()
                .filter(|c| c.labels.container == *name && c.state.is_running());
            for c in running {
                if let Err(e) = self.rt.signal(&c.id, sig).await {
                    tracing::warn!(pod, container = %name, error = %e, "cannot signal a container whose config changed");
                }
            }
        }
    }
}
