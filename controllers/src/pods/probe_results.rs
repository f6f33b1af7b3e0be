//! What the probes found, by container: written by the probe workers ([`super::probes`]), read by the
//! status ([`super::status`]) and the reconcile. Apart from both so that the status reads results without
//! depending on the workers that write them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the probes say about one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerProbeStatus {
    /// The startup probe passed (true when there is none).
    pub started: bool,
    /// The readiness probe passes (meaningful only when there is one).
    pub ready: bool,
    /// The liveness or startup probe failed, with its message.
    pub unhealthy: Option<String>,
    /// Last result of each probe kind.
    pub last: BTreeMap<String, String>,
}

impl Default for ContainerProbeStatus {
    fn default() -> Self {
        ContainerProbeStatus {
            started: true,
            ready: false,
            unhealthy: None,
            last: BTreeMap::new(),
        }
    }
}

/// Probe results by container id. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProbeResults {
    inner: Arc<Mutex<HashMap<String, ContainerProbeStatus>>>,
}

impl ProbeResults {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, ContainerProbeStatus>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: &str) -> ContainerProbeStatus {
        self.lock().get(id).cloned().unwrap_or_default()
    }

    /// Whether a probed container has passed its startup probe and passes its readiness probe: false
    /// until a probe worker has reported (a container just started is not yet known to have started).
    pub fn started_and_ready(&self, id: &str, readiness: bool, startup: bool) -> bool {
        match self.lock().get(id) {
            None => !readiness && !startup,
            Some(s) => s.started && (!readiness || s.ready),
        }
    }

    /// Container ids whose liveness or startup probe failed, with the message.
    pub fn unhealthy(
        &self,
        ids: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> BTreeMap<String, String> {
        let st = self.lock();
        ids.into_iter()
            .filter_map(|id| {
                let id = id.as_ref();
                st.get(id)?.unhealthy.clone().map(|m| (id.to_string(), m))
            })
            .collect()
    }

    pub fn set_ready(&self, id: &str, ready: bool) {
        self.lock().entry(id.to_string()).or_default().ready = ready;
    }

    pub(super) fn update(&self, id: &str, f: impl FnOnce(&mut ContainerProbeStatus)) {
        f(self.lock().entry(id.to_string()).or_default());
    }

    pub(super) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}
