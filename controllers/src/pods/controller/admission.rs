//! What a pod must pass before it runs: its manifest admitted (host dirs, reserved ports, a non-root
//! image where the policy asks for one), or its status says why not.

use super::*;

impl<R: ContainerRuntime> Shared<R> {
    /// Parses, validates and checks the pod against this host and the node's other pods.
    pub(super) fn desired(&self, pod: &str) -> Desired {
        let Some(d) = self.desired.get(pod) else {
            // Not running from any source: rejected (and why), or gone.
            return match self
                .merged
                .rejected()
                .into_iter()
                .find(|r| !r.duplicate_id && r.id.as_deref() == Some(pod))
            {
                Some(r) => Desired::Rejected(
                    format!("{} ({}): {}", r.origin, r.source, r.reason),
                    r.source,
                ),
                None => Desired::Absent,
            };
        };
        // The merger validated it and decided duplicate ids and host ports; what is left is this host's.
        // hostDir paths are resolved once, at admission: a symlink swapped later changes nothing.
        let declared: Vec<(String, String)> = d
            .manifest
            .volumes
            .iter()
            .filter_map(|v| Some((v.name.clone(), v.source.as_ref()?.host_path()?.to_string())))
            .collect();
        let cached = lock(&self.host_dirs)
            .get(pod)
            .filter(|(decl, _)| *decl == declared)
            .map(|(_, r)| r.clone());
        let mut refused = security::check_level(&d.manifest, self.cfg.pod_security);
        if self.cfg.pod_security == PodSecurityLevel::Restricted {
            refused = self.keep_if_running(pod, &d.manifest, refused);
        }
        if !refused.is_empty() {
            lock(&self.host_dirs).remove(pod);
            return Desired::Rejected(describe(&refused), d.source);
        }
        let reserved = self.reserved_port_errors(&d.manifest);
        if !reserved.is_empty() {
            lock(&self.host_dirs).remove(pod);
            return Desired::Rejected(describe(&reserved), d.source);
        }
        let host_dirs = match cached {
            Some(r) => r,
            None => match self.admit_host_dirs(pod, &d.manifest) {
                Ok(r) => {
                    lock(&self.host_dirs).insert(pod.to_string(), (declared, r.clone()));
                    r
                }
                Err(violations) => {
                    lock(&self.host_dirs).remove(pod);
                    return Desired::Rejected(violations.join("; "), d.source);
                }
            },
        };
        let devices = match spec::admit_devices(&d.manifest, &self.spec.allowed_devices) {
            Ok(devices) => devices,
            Err(violations) => return Desired::Rejected(violations.join("; "), d.source),
        };
        let mut run = DesiredPod::new(d.manifest.clone(), &self.cfg.pause_image);
        run.host_dirs = host_dirs;
        // Beside the host dirs, by volume name: what each device volume resolved to.
        run.host_dirs.extend(devices);
        Desired::Run(Box::new(run))
    }

    /// `refused` without what the restricted level asks to be written (hostlet adds it itself) when the
    /// pod already runs as it is: every app container made from the manifest as it stands. Kubernetes checks
    /// a pod when it is created or changed, never stops one that runs; a Warning event names the fields
    /// once, and the next change of the pod must write them.
    fn keep_if_running(
        &self,
        pod: &str,
        manifest: &PodManifest,
        refused: Vec<FieldError>,
    ) -> Vec<FieldError> {
        let unwritten = security::restricted_unwritten(manifest);
        if refused.is_empty() || refused.iter().any(|e| !unwritten.contains(e)) {
            return refused;
        }
        let observed = self.cache.pod(pod);
        let runs_as_is = manifest.containers.iter().all(|c| {
            let hash = hostlet_api::naming::container_spec_hash(manifest, c);
            observed
                .containers
                .iter()
                .any(|o| o.labels.container == c.name && o.labels.spec_hash == hash)
        });
        if !runs_as_is {
            return refused;
        }
        let message = format!(
            "kept running as it was admitted before; its next change must write: {}",
            describe(&refused)
        );
        if lock(&self.reported_duplicates).insert((pod.to_string(), message.clone())) {
            self.status
                .event(pod, None, "PodSecurityWarning", &message, true);
        }
        Vec::new()
    }

    /// hostDir volumes at admission: resolved and checked against the allow-list, missing parts created
    /// (never through a symlink), and none nested with another admitted pod's read-write hostDir.
    pub(super) fn admit_host_dirs(
        &self,
        pod: &str,
        manifest: &PodManifest,
    ) -> Result<BTreeMap<String, PathBuf>, Vec<String>> {
        let resolved = spec::resolve_host_dirs(manifest, &self.cfg.allowed_host_paths)?;
        if resolved.is_empty() {
            return Ok(resolved);
        }
        let mine_rw = spec::writable_host_dirs(manifest, &resolved);
        let mut conflicts = Vec::new();
        for (other, (_, theirs)) in lock(&self.host_dirs).iter() {
            if other == pod || theirs.is_empty() {
                continue;
            }
            let Some(their_manifest) = self.desired.get(other) else {
                continue;
            };
            let theirs_rw = spec::writable_host_dirs(&their_manifest.manifest, theirs);
            conflicts.extend(spec::nesting_conflicts(
                &resolved, &mine_rw, other, theirs, &theirs_rw,
            ));
        }
        if !conflicts.is_empty() {
            return Err(conflicts);
        }
        spec::create_host_dirs(&resolved)?;
        Ok(resolved)
    }

    /// The pod's published host ports that this host keeps for itself, each with its field path.
    pub(super) fn reserved_port_errors(&self, m: &PodManifest) -> Vec<FieldError> {
        let mut out = Vec::new();
        for (ci, c) in m.containers.iter().enumerate() {
            for (pi, p) in c.ports.iter().enumerate() {
                let Some((port, what)) = self
                    .cfg
                    .reserved_host_ports
                    .iter()
                    .find(|(port, _)| i64::from(*port) == p.host_port)
                else {
                    continue;
                };
                let path = format!("containers[{ci}].ports[{pi}].hostPort");
                out.push(FieldError {
                    path: match m.form {
                        Form::V1 => hostlet_api::v1::path_in_v1(&path),
                        Form::Legacy => path,
                    },
                    message: format!("host port {port} is reserved on this host ({what})"),
                });
            }
        }
        out
    }

    /// A container with `runAsNonRoot` and no `runAsUser` runs as its image's user: the pod is refused
    /// when that user is root. `None` while an image is not present yet (checked again once pulled).
    pub(super) async fn root_image_refusal(&self, m: &PodManifest) -> Option<String> {
        let mut out = Vec::new();
        for (list, c, i) in m.listed_containers() {
            let e = security::effective(m, c, self.cfg.pod_security);
            if !e.non_root || e.user.is_some() {
                continue;
            }
            let Ok(user) = self.rt.image_user(&c.image).await else {
                continue;
            };
            if let Some(why) = image_user_not_provably_non_root(&user) {
                let path = format!("{list}[{i}].securityContext.runAsNonRoot");
                let path = match m.form {
                    Form::V1 => hostlet_api::v1::path_in_v1(&path),
                    Form::Legacy => path,
                };
                out.push(format!(
                    "{path}: image {} may run as root ({why}); set a non-zero runAsUser or use an image with a numeric non-root USER",
                    c.image
                ));
            }
        }
        (!out.is_empty()).then(|| out.join("; "))
    }

    /// A pod that asks for GPUs runs only where the engine can hand them out: its `nvidia` runtime set up
    /// (the NVIDIA Container Toolkit's `nvidia-ctk runtime configure`). Elsewhere it is refused, with the
    /// fields that ask. `None` while the engine does not answer (nothing is created then anyway).
    pub(super) async fn gpu_refusal(&self, m: &PodManifest) -> Option<String> {
        let asks: Vec<String> = m
            .listed_containers()
            .filter(|(_, c, _)| c.gpus().is_some())
            .map(|(list, _, i)| {
                let path = format!(
                    "{list}[{i}].resources.limits.{}",
                    hostlet_api::manifest::GPU_RESOURCE
                );
                match m.form {
                    Form::V1 => hostlet_api::v1::path_in_v1(&path),
                    Form::Legacy => path,
                }
            })
            .collect();
        if asks.is_empty() {
            return None;
        }
        let runtimes = self.rt.runtimes().await.ok()?;
        if runtimes.iter().any(|r| r == "nvidia") {
            return None;
        }
        Some(format!(
            "{}: this host's Docker engine has no nvidia runtime (it has {}): install the NVIDIA Container Toolkit and run nvidia-ctk runtime configure, or run the pod on a host with GPUs",
            asks.join(", "),
            runtimes.join(", ")
        ))
    }
}

/// Why an image's `USER` does not prove a non-root user: unset (root), root or uid 0, or a name (which
/// only the image's passwd file maps to a uid: as the kubelet, hostlet does not guess).
fn image_user_not_provably_non_root(user: &str) -> Option<String> {
    let name = user.split(':').next().unwrap_or("").trim();
    match name.parse::<u64>() {
        _ if name.is_empty() => Some("it sets no USER, so it runs as root".to_string()),
        Ok(0) => Some(format!("its USER {user:?} is root")),
        Ok(_) => None,
        Err(_) if name == "root" => Some(format!("its USER {user:?} is root")),
        Err(_) => Some(format!(
            "its USER {user:?} is a name, which cannot be verified as non-root"
        )),
    }
}
