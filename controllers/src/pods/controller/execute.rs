//! Carrying out a pod's plan: each step against the runtime, images pulled as the pull policy says,
//! containers created and started.

use super::*;

impl<R: ContainerRuntime> Shared<R> {
    /// Runs the steps in order. A failed step skips the steps that depend on it (the same container's
    /// later steps; every app container after a failed infra container) and the first error is returned
    /// after the rest ran, so one broken container does not hold up the others.
    pub(super) async fn execute(
        &self,
        pod: &str,
        desired: Option<&DesiredPod>,
        observed: &ObservedPod,
        steps: &[Step],
        memory: &mut PodRuntimeState,
        cleaned: &mut bool,
    ) -> Result<(), ReconcileError> {
        let mut first_err: Option<ReconcileError> = None;
        let mut failed: HashSet<String> = HashSet::new();
        let mut new_infra: Option<String> = None;
        let record = |e: ReconcileError, first: &mut Option<ReconcileError>| {
            if first.is_none() {
                *first = Some(e);
            }
        };
        // The containers to stop first, side by side: each gets its stop signal once its own preStop
        // hook has ended.
        let mut stopped = self.stop_containers(pod, steps, memory).await;
        for step in steps {
            match step {
                Step::EnsureImage {
                    container,
                    image,
                    policy,
                } => match self.ensure_image(pod, container, image, *policy).await {
                    Ok(()) => {
                        if let Some(mem) = memory.containers.get_mut(container) {
                            mem.pull = None;
                        }
                    }
                    Err(ImageError::Unavailable(message)) => {
                        let mem = memory.containers.entry(container.clone()).or_default();
                        let failures = mem.pull.as_ref().map_or(0, |p| p.failures) + 1;
                        mem.pull = Some(PullFailure {
                            failures,
                            retry_at: Instant::now() + pull_backoff(failures),
                            message: message.clone(),
                        });
                        self.status
                            .event(pod, Some(container), "Failed", &message, true);
                        failed.insert(container.clone());
                    }
                    Err(ImageError::Runtime(source)) => {
                        failed.insert(container.clone());
                        record(
                            ReconcileError::Runtime {
                                op: "image",
                                target: image.clone(),
                                source,
                            },
                            &mut first_err,
                        );
                    }
                },
                Step::PrepareVolumes => {
                    let Some(d) = desired else { continue };
                    for (volume, why) in self.write_config_volumes(pod, &d.manifest, true) {
                        // Only the containers that mount it wait; the message names what is missing.
                        for c in d.manifest.all_containers() {
                            if c.volume_mounts.iter().any(|m| m.name == volume) {
                                self.config_refused(pod, &c.name, &why, memory);
                                failed.insert(c.name.clone());
                            }
                        }
                    }
                    for dir in spec::empty_dirs(&self.spec, &d.manifest) {
                        if let Err(source) = std::fs::create_dir_all(&dir) {
                            for c in d.manifest.all_containers() {
                                failed.insert(c.name.clone());
                            }
                            record(
                                ReconcileError::Volumes {
                                    pod: pod.to_string(),
                                    source,
                                },
                                &mut first_err,
                            );
                            break;
                        }
                    }
                }
                Step::CreateInfra { restart_count } => {
                    let Some(d) = desired else { continue };
                    if failed.contains(INFRA_CONTAINER_NAME) {
                        continue;
                    }
                    let spec = spec::infra_spec(&self.spec, &d.manifest, *restart_count);
                    match self.create_and_start(&spec).await {
                        Ok((id, started)) => {
                            let mem = memory
                                .containers
                                .entry(INFRA_CONTAINER_NAME.to_string())
                                .or_default();
                            mem.backoff.started(Instant::now());
                            mem.start_error = match &started {
                                Started::Yes => None,
                                Started::No(message) => Some(message.clone()),
                            };
                            match started {
                                Started::Yes => new_infra = Some(id),
                                Started::No(message) => {
                                    self.status.event(
                                        pod,
                                        Some(INFRA_CONTAINER_NAME),
                                        "Failed",
                                        &format!("pod infra container did not start: {message}"),
                                        true,
                                    );
                                    failed.insert(INFRA_CONTAINER_NAME.to_string());
                                }
                            }
                        }
                        Err(e) => {
                            failed.insert(INFRA_CONTAINER_NAME.to_string());
                            record(e, &mut first_err);
                        }
                    }
                }
                Step::CreateApp {
                    container,
                    infra,
                    restart_count,
                    reason,
                }
                | Step::CreateInit {
                    container,
                    infra,
                    restart_count,
                    reason,
                } => {
                    let Some(d) = desired else { continue };
                    let init = matches!(step, Step::CreateInit { .. });
                    let of_kind = if init {
                        &d.manifest.init_containers
                    } else {
                        &d.manifest.containers
                    };
                    let Some(c) = of_kind.iter().find(|c| &c.name == container) else {
                        continue;
                    };
                    let infra_id = match infra {
                        InfraRef::Existing(id) => id.clone(),
                        InfraRef::Created => match &new_infra {
                            Some(id) => id.clone(),
                            None => continue,
                        },
                    };
                    if failed.contains(container) {
                        continue;
                    }
                    if let Err(message) = spec::recheck_host_dirs(&d.manifest, c, &d.host_dirs) {
                        // Admitted afresh on the retry: where the path leads now decides.
                        lock(&self.host_dirs).remove(pod);
                        self.status
                            .event(pod, Some(container), "Failed", &message, true);
                        failed.insert(container.clone());
                        record(
                            ReconcileError::HostPathChanged {
                                pod: pod.to_string(),
                                message,
                            },
                            &mut first_err,
                        );
                        continue;
                    }
                    let make = if init {
                        spec::init_spec
                    } else {
                        spec::app_spec
                    };
                    let env = match self.configs.environment(c) {
                        Ok(env) => env,
                        Err(why) => {
                            self.config_refused(pod, container, &why.to_string(), memory);
                            failed.insert(container.clone());
                            continue;
                        }
                    };
                    let mut spec = make(
                        &self.spec,
                        &d.manifest,
                        &d.host_dirs,
                        c,
                        &infra_id,
                        *restart_count,
                    );
                    spec::set_environment(&mut spec, c, env);
                    // The hash the plan compares: it may also cover the configs it uses.
                    if let Some(hash) = d.hashes.get(&c.name) {
                        spec.labels.insert(
                            hostlet_api::naming::LABEL_SPEC_HASH.to_string(),
                            hash.clone(),
                        );
                    }
                    match self.create_and_start(&spec).await {
                        Ok((id, started)) => {
                            let short: String = id.chars().take(12).collect();
                            self.status.event(
                                pod,
                                Some(container),
                                "Created",
                                &format!("Created container {container} ({short})"),
                                false,
                            );
                            self.started_event(pod, container, &started);
                            if matches!(started, Started::Yes) && (!init || c.is_sidecar()) {
                                self.post_start(pod, desired, container, &id).await;
                            }
                            let mem = memory.containers.entry(container.clone()).or_default();
                            mem.backoff.started(Instant::now());
                            mem.config_error = None;
                            if *reason == CreateReason::Restart {
                                self.metrics.container_restarts.inc();
                            }
                        }
                        Err(e) => {
                            self.status
                                .event(pod, Some(container), "Failed", &e.to_string(), true);
                            failed.insert(container.clone());
                            record(e, &mut first_err);
                        }
                    }
                }
                Step::Start { id, container } => match self.start(id).await {
                    Ok(started) => {
                        self.started_event(pod, container, &started);
                        if matches!(started, Started::Yes) {
                            self.post_start(pod, desired, container, id).await;
                        }
                    }
                    Err(e) => {
                        self.status
                            .event(pod, Some(container), "Failed", &e.to_string(), true);
                        record(e, &mut first_err);
                    }
                },
                Step::Terminate {
                    id,
                    container,
                    grace,
                    reason,
                } => match stopped
                    .remove(id)
                    .unwrap_or_else(|| (Instant::now(), Ok(())))
                {
                    (at, Ok(()) | Err(RuntimeError::Conflict(_))) => {
                        memory.terminating.insert(
                            id.clone(),
                            Termination {
                                at,
                                grace: *grace,
                                reason: *reason,
                            },
                        );
                        self.status.event(
                            pod,
                            Some(container),
                            "Killing",
                            &format!(
                                "Stopping container {container} ({}), grace period {}s",
                                reason.message(),
                                grace.as_secs()
                            ),
                            false,
                        );
                    }
                    (_, Err(e)) if e.is_not_found() => self.cache.record_removed(id),
                    (_, Err(source)) => record(
                        ReconcileError::Runtime {
                            op: "stop signal",
                            target: id.clone(),
                            source,
                        },
                        &mut first_err,
                    ),
                },
                Step::Kill {
                    id,
                    container,
                    reason,
                } => match self.rt.kill(id).await {
                    Ok(()) | Err(RuntimeError::Conflict(_)) => {
                        if container != INFRA_CONTAINER_NAME {
                            self.status.event(
                                pod,
                                Some(container),
                                "Killing",
                                &format!(
                                    "Killing container {container} ({}) with SIGKILL",
                                    reason.message()
                                ),
                                false,
                            );
                        }
                    }
                    Err(e) if e.is_not_found() => self.cache.record_removed(id),
                    Err(source) => record(
                        ReconcileError::Runtime {
                            op: "SIGKILL",
                            target: id.clone(),
                            source,
                        },
                        &mut first_err,
                    ),
                },
                Step::Remove { id, container } => {
                    if let Some(old) = observed.containers.iter().find(|c| &c.id == id) {
                        // An app container replaced while its pod stays: its output is kept for
                        // `pod logs --previous` (one instance per container, the newest).
                        if desired.is_some()
                            && container != INFRA_CONTAINER_NAME
                            && old.state.is_exited()
                        {
                            let path = spec::previous_log_path(&self.cfg.data_dir, pod, container);
                            if let Err(e) = self.rt.save_log(id, &path).await {
                                tracing::warn!(pod, container, error = %e, "keeping the output of the previous instance failed");
                            }
                        }
                        if let Some(t) = termination_of(old) {
                            memory
                                .containers
                                .entry(container.clone())
                                .or_default()
                                .last_termination = Some(t);
                        }
                    }
                    match self.rt.remove(id).await {
                        Ok(()) => self.cache.record_removed(id),
                        Err(e) if e.is_not_found() => self.cache.record_removed(id),
                        Err(source) => {
                            failed.insert(container.clone());
                            record(
                                ReconcileError::Runtime {
                                    op: "remove",
                                    target: id.clone(),
                                    source,
                                },
                                &mut first_err,
                            );
                        }
                    }
                }
                Step::RecordExit {
                    container,
                    exited_id,
                    backoff,
                    restart_at,
                    wait,
                } => {
                    let mem = memory.containers.entry(container.clone()).or_default();
                    mem.backoff = *backoff;
                    mem.exit = Some(HandledExit {
                        id: exited_id.clone(),
                        restart_at: *restart_at,
                    });
                    if !wait.is_zero() {
                        self.status.event(
                            pod,
                            Some(container),
                            "BackOff",
                            &format!(
                                "Back-off {}s restarting failed container {container}",
                                wait.as_secs()
                            ),
                            true,
                        );
                    }
                }
                Step::Cleanup => {
                    let dir = spec::pod_dir(&self.cfg.data_dir, pod);
                    super::super::configs::unmount_volumes(&dir.join("volumes"));
                    match std::fs::remove_dir_all(&dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            tracing::warn!(pod, dir = %dir.display(), error = %e, "removing the pod's directory failed")
                        }
                    }
                    *cleaned = true;
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A container that cannot be made for want of a ConfigMap or Secret (or one of its keys): its status
    /// waits with the reason, once in an event; it is made when the object appears.
    pub(super) fn config_refused(
        &self,
        pod: &str,
        container: &str,
        why: &str,
        memory: &mut PodRuntimeState,
    ) {
        let mem = memory.containers.entry(container.to_string()).or_default();
        if mem.config_error.as_deref() != Some(why) {
            self.status.event(
                pod,
                Some(container),
                "Failed",
                &format!("Error: {why}"),
                true,
            );
        }
        mem.config_error = Some(why.to_string());
    }

    /// Writes the pod's configMap and secret volumes from the caches (only what changed). With
    /// `prepare`, a volume not yet written is made (a secret one on its tmpfs) and a missing object is
    /// returned as (volume, why); without, only volumes already written are brought up to date, and one
    /// whose object went keeps its files (as the kubelet does).
    pub(super) fn write_config_volumes(
        &self,
        pod: &str,
        manifest: &PodManifest,
        prepare: bool,
    ) -> Vec<(String, String)> {
        use super::super::configs;
        let mut refused = Vec::new();
        // Taken (and, for a new pod, recorded) before any volume is made: see `pod_secret_default`.
        let secret_default = if configs::config_volumes(manifest).any(|(_, s)| s.secret.is_some()) {
            let pod_dir = spec::pod_dir(&self.cfg.data_dir, pod);
            match configs::pod_secret_default(&pod_dir, prepare) {
                Ok(mode) => Some(mode),
                Err(e) => {
                    tracing::warn!(pod, error = %e, "reading the pod's secret file mode failed");
                    None
                }
            }
        } else {
            None
        };
        for (volume, src) in configs::config_volumes(manifest) {
            let dir = spec::empty_dir_path(&self.cfg.data_dir, pod, volume);
            if !prepare && !dir.exists() {
                continue;
            }
            // Without the pod's default a secret volume is left alone rather than given a guessed mode.
            let secret_default = match (&src.secret, secret_default) {
                (None, _) => configs::DEFAULT_SECRET_MODE,
                (Some(_), Some(mode)) => mode,
                (Some(_), None) => {
                    if prepare {
                        refused.push((
                            volume.to_string(),
                            format!("volume {volume:?}: the pod's secret file mode is unknown"),
                        ));
                    }
                    continue;
                }
            };
            let files = match self.configs.volume_files(&src, secret_default) {
                Some(Ok(files)) => files,
                Some(Err(why)) => {
                    if prepare {
                        refused.push((volume.to_string(), why.to_string()));
                    }
                    continue;
                }
                None => continue,
            };
            let written = (|| {
                if src.secret.is_some() {
                    configs::ensure_tmpfs(&dir)?;
                }
                configs::write_volume(&dir, &files)
            })();
            match written {
                Ok(true) => tracing::debug!(pod, volume, "volume written"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(pod, volume, error = %e, "writing a volume failed");
                    if prepare {
                        refused.push((volume.to_string(), format!("volume {volume:?}: {e}")));
                    }
                }
            }
        }
        refused
    }

    /// Pull policy: IfNotPresent pulls a missing image; Always pulls, and runs a present image with a
    /// warning when the pull fails; Never only checks.
    pub(super) async fn ensure_image(
        &self,
        pod: &str,
        container: &str,
        image: &str,
        policy: PullPolicy,
    ) -> Result<(), ImageError> {
        let present = self.rt.image_present(image).await;
        let pull_failed = |e: RuntimeError| {
            if e.is_unreachable() {
                ImageError::Runtime(e)
            } else {
                ImageError::Unavailable(format!("pulling image {image}: {e}"))
            }
        };
        match (policy, present) {
            (_, Err(e)) => Err(ImageError::Runtime(e)),
            (PullPolicy::IfNotPresent, Ok(true)) => Ok(()),
            (PullPolicy::Never, Ok(true)) => Ok(()),
            (PullPolicy::Never, Ok(false)) => Err(ImageError::Unavailable(format!(
                "image {image} is not present and the pull policy is Never (ErrImageNeverPull)"
            ))),
            (PullPolicy::IfNotPresent, Ok(false)) | (PullPolicy::Always, Ok(false)) => {
                match self.rt.pull(image).await {
                    Ok(()) => {
                        self.status.event(
                            pod,
                            Some(container),
                            "Pulled",
                            &format!("Pulled image {image}"),
                            false,
                        );
                        Ok(())
                    }
                    Err(e) if e.is_unreachable() => Err(pull_failed(e)),
                    Err(e) => match self.fetch_from_peer(image).await {
                        Some(Ok(holder)) => {
                            self.status.event(
                                pod,
                                Some(container),
                                "Pulled",
                                &format!("Fetched image {image} from node {holder} (pulling it failed: {e})"),
                                false,
                            );
                            Ok(())
                        }
                        Some(Err(why)) => Err(ImageError::Unavailable(format!(
                            "pulling image {image}: {e}; and from another node: {why}"
                        ))),
                        None => Err(pull_failed(e)),
                    },
                }
            }
            (PullPolicy::Always, Ok(true)) => {
                match self.rt.pull(image).await {
                    Ok(()) => {
                        self.status.event(
                            pod,
                            Some(container),
                            "Pulled",
                            &format!("Pulled image {image}"),
                            false,
                        );
                        Ok(())
                    }
                    Err(e) => {
                        self.status.event(
                        pod,
                        Some(container),
                        "Failed",
                        &format!("pulling image {image} failed ({e}); running the image already present"),
                        true,
                    );
                        Ok(())
                    }
                }
            }
        }
    }

    /// The image from another node that has it, when this agent fetches from nodes (`None`: it does not).
    async fn fetch_from_peer(&self, image: &str) -> Option<Result<String, String>> {
        let fetch = self.peer.get()?.clone();
        Some(fetch(image.to_string()).await)
    }

    pub(super) fn started_event(&self, pod: &str, container: &str, started: &Started) {
        match started {
            Started::Yes => self.status.event(
                pod,
                Some(container),
                "Started",
                &format!("Started container {container}"),
                false,
            ),
            Started::No(message) => self.status.event(
                pod,
                Some(container),
                "Failed",
                &format!("Error: {message}"),
                true,
            ),
        }
    }

    pub(super) async fn create_and_start(
        &self,
        spec: &crate::pods::runtime::ContainerSpec,
    ) -> Result<(String, Started), ReconcileError> {
        let mut spec = spec.clone();
        spec.security.cgroup_parent = self.cgroup_parent.get().cloned().flatten();
        let spec = &spec;
        self.image_uses.touch(&spec.image);
        let id = self
            .rt
            .create(spec)
            .await
            .map_err(|source| ReconcileError::Runtime {
                op: "create",
                target: spec.name.clone(),
                source,
            })?;
        if let Some(labels) =
            crate::pods::runtime::ContainerLabels::parse(|k| spec.labels.get(k).map(String::as_str))
        {
            self.cache
                .record_created(ContainerInfo::created(&id, spec, labels));
        }
        let started = self.start(&id).await?;
        Ok((id, started))
    }

    /// Starts a container. A start the engine refuses (bad command, host port taken, …) is recorded as an
    /// exit, so that the restart policy and its backoff take it from there; only an unreachable engine is
    /// an error of the reconcile.
    pub(super) async fn start(&self, id: &str) -> Result<Started, ReconcileError> {
        match self.rt.start(id).await {
            Ok(()) => {
                self.cache.record_state(
                    id,
                    RunState::Running {
                        started_at: SystemTime::now(),
                    },
                );
                Ok(Started::Yes)
            }
            Err(e) if e.is_unreachable() => Err(ReconcileError::Runtime {
                op: "start",
                target: id.to_string(),
                source: e,
            }),
            Err(e) => {
                let message = e.to_string();
                let state = match self.rt.inspect(id).await {
                    // The engine answered with an error (say, a timeout of its own under load) and
                    // started the container all the same: it runs, and recording an exit would replace it.
                    Ok(info) if info.state.is_running() => {
                        tracing::warn!(container = id, error = %e, "the engine reported a failed start of a container that runs");
                        self.cache.record_state(id, info.state);
                        return Ok(Started::Yes);
                    }
                    Ok(info) if info.state.is_exited() => info.state,
                    _ => RunState::Exited {
                        exit_code: 128,
                        started_at: None,
                        finished_at: Some(SystemTime::now()),
                        oom_killed: false,
                        error: Some(message.clone()),
                    },
                };
                self.cache.record_state(id, state);
                Ok(Started::No(message))
            }
        }
    }
}
