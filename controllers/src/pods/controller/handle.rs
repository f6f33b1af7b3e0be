//! What the rest of the agent asks of the pod controller through its handle.

use super::*;

impl<R: ContainerRuntime> PodsHandle<R> {
    /// The images the desired pods of this host name (init containers included), once every manifest
    /// source has answered.
    pub fn desired_images(&self) -> crate::pods::images::DesiredImages {
        let shared = self.shared.clone();
        Arc::new(move || {
            if !shared.merged.all_synced() || !shared.desired.is_ready() {
                return None;
            }
            Some(
                shared
                    .desired
                    .state()
                    .iter()
                    .flat_map(|d| d.manifest.all_containers().map(|c| c.image.clone()))
                    .collect(),
            )
        })
    }

    /// Images were loaded onto the engine (from the images directory): the pods waiting out a failed pull
    /// try again now rather than at the end of their backoff.
    pub fn images_arrived(&self) {
        let waiting: Vec<String> = {
            let mut memory = lock(&self.shared.memory);
            memory
                .iter_mut()
                .filter_map(|(pod, m)| {
                    let mut any = false;
                    for c in m.containers.values_mut() {
                        any |= c.pull.take().is_some();
                    }
                    any.then(|| pod.clone())
                })
                .collect()
        };
        for pod in waiting {
            (self.shared.wake)(&pod);
        }
    }

    /// Lets the controller fetch images it cannot pull from other nodes (once; later calls do nothing).
    pub fn set_peer_fetch(&self, fetch: PeerFetch) {
        let _ = self.shared.peer.set(fetch);
    }

    /// The `POST /pods` source, for the API router.
    pub fn http_source(&self) -> HttpSource {
        self.shared.http_source.clone()
    }

    pub fn readiness(&self) -> PodsReadiness {
        PodsReadiness {
            docker_reachable: self.shared.cache.docker_reachable(),
            observed_synced: self.shared.cache.is_synced(),
            desired_synced: self.shared.desired.is_ready(),
        }
    }

    /// Every pod known from etcd or running here, with its manifest and status.
    pub fn pods(&self) -> Vec<PodView> {
        let s = &self.shared;
        let mut ids: Vec<String> = s
            .desired
            .keys()
            .into_iter()
            .chain(s.cache.pod_ids())
            .collect();
        ids.sort();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.pod(&id)).collect()
    }

    /// One pod with its manifest (when it parses) and status.
    pub fn pod(&self, id: &str) -> Option<PodView> {
        let s = &self.shared;
        let obj = s.desired.get(id);
        let status = s.status.get(id);
        if obj.is_none() && status.is_none() && s.cache.pod(id).is_empty() {
            return None;
        }
        Some(PodView {
            id: id.to_string(),
            manifest: obj.map(|o| o.manifest.clone()),
            status,
        })
    }

    /// CPU and memory of a pod's running container, from Docker.
    pub async fn stats(
        &self,
        pod: &str,
        container: &str,
    ) -> Result<crate::pods::runtime::ContainerStats, StatsError> {
        let observed = self.shared.cache.pod(pod);
        let target = if container == INFRA_CONTAINER_NAME {
            observed.infra()
        } else {
            observed.current(container).filter(|c| c.state.is_running())
        };
        let Some(c) = target else {
            return Err(StatsError::NotFound {
                pod: pod.to_string(),
                container: container.to_string(),
            });
        };
        Ok(self.shared.rt.stats(&c.id).await?)
    }

    /// The container runtime (the agent's logs and exec routes).
    pub fn runtime(&self) -> &Arc<R> {
        &self.shared.rt
    }

    /// `--data-dir`.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.shared.cfg.data_dir
    }

    /// The node this controller runs pods for.
    pub fn node(&self) -> &str {
        &self.shared.cfg.node
    }

    /// A pod's app containers by name (as its manifest lists them, else as running), or `None` when the
    /// pod is not known here.
    pub fn container_names(&self, pod: &str) -> Option<Vec<String>> {
        let s = &self.shared;
        if let Some(d) = s.desired.get(pod) {
            return Some(
                // The first app container first: what logs and exec reach when none is named, as
                // kubectl does (not an init container or a sidecar).
                d.manifest
                    .containers
                    .iter()
                    .chain(d.manifest.init_containers.iter())
                    .map(|c| c.name.clone())
                    .collect(),
            );
        }
        let observed = s.cache.pod(pod);
        let mut names: Vec<String> = observed
            .containers
            .iter()
            .filter(|c| c.labels.container != INFRA_CONTAINER_NAME)
            .map(|c| c.labels.container.clone())
            .collect();
        names.dedup();
        (!observed.containers.is_empty()).then_some(names)
    }

    /// The newest instance of a pod's container, running or not.
    pub fn current_container(&self, pod: &str, container: &str) -> Option<ContainerInfo> {
        let observed = self.shared.cache.pod(pod);
        observed
            .current(container)
            .or_else(|| {
                observed
                    .containers
                    .iter()
                    .filter(|c| c.labels.container == container)
                    .max_by_key(|c| c.created)
            })
            .cloned()
    }

    /// The observed cache (tests and tools).
    pub fn observed(&self) -> &ObservedCache {
        &self.shared.cache
    }

    /// Whether every status and event asked for has reached etcd.
    pub fn status_flushed(&self) -> bool {
        self.shared.status.is_flushed()
    }
}
