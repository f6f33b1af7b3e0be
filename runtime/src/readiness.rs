//! The readiness registry behind `/readyz`: each component (etcd member, caches, Docker…) registers once
//! and reports its state; the agent is ready when every registered component is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hostlet_api::objects::Timestamp;
use serde::Serialize;

/// One component's state as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentState {
    pub ready: bool,
    pub message: String,
    /// When `ready` last changed.
    pub since: Timestamp,
}

/// The whole `/readyz` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadinessReport {
    pub ready: bool,
    pub components: BTreeMap<String, ComponentState>,
}

/// Shared registry of component states. Cheap to clone.
///
/// ```
/// use hostlet_runtime::Readiness;
/// let r = Readiness::default();
/// let etcd = r.register("etcd");
/// assert!(!r.report().ready);
/// etcd.set_ready("serving");
/// assert!(r.report().ready);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Mutex<BTreeMap<String, ComponentState>>>,
}

impl Readiness {
    /// Registers `name`, not ready until it says otherwise.
    pub fn register(&self, name: &str) -> ComponentHandle {
        self.lock().insert(
            name.to_string(),
            ComponentState {
                ready: false,
                message: "starting".to_string(),
                since: Timestamp::now(),
            },
        );
        ComponentHandle {
            name: name.to_string(),
            registry: self.clone(),
        }
    }

    /// Every component's state; ready when all are (and at least one registered).
    pub fn report(&self) -> ReadinessReport {
        let components = self.lock().clone();
        ReadinessReport {
            ready: !components.is_empty() && components.values().all(|c| c.ready),
            components,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ComponentState>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A component's handle on its entry.
#[derive(Debug, Clone)]
pub struct ComponentHandle {
    name: String,
    registry: Readiness,
}

impl ComponentHandle {
    pub fn set_ready(&self, message: impl Into<String>) {
        self.set(true, message.into());
    }

    pub fn set_not_ready(&self, message: impl Into<String>) {
        self.set(false, message.into());
    }

    /// Sets the state; `since` moves only when readiness flips.
    pub fn set(&self, ready: bool, message: String) {
        let mut map = self.registry.lock();
        let entry = map
            .entry(self.name.clone())
            .or_insert_with(|| ComponentState {
                ready: !ready,
                message: String::new(),
                since: Timestamp::now(),
            });
        if entry.ready != ready {
            entry.since = Timestamp::now();
        }
        entry.ready = ready;
        entry.message = message;
    }

    pub fn is_ready(&self) -> bool {
        self.registry
            .lock()
            .get(&self.name)
            .map(|c| c.ready)
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_component_is() {
        let r = Readiness::default();
        assert!(!r.report().ready, "nothing registered is not ready");
        let a = r.register("a");
        let b = r.register("b");
        a.set_ready("ok");
        assert!(!r.report().ready);
        b.set_ready("ok");
        assert!(r.report().ready);
        a.set_not_ready("down");
        let rep = r.report();
        assert!(!rep.ready);
        assert_eq!(rep.components["a"].message, "down");
        assert!(!a.is_ready());
        assert!(b.is_ready());
    }

    #[test]
    fn since_moves_only_on_a_flip() {
        let r = Readiness::default();
        let a = r.register("a");
        a.set_ready("one");
        let first = r.report().components["a"].since;
        std::thread::sleep(std::time::Duration::from_millis(5));
        a.set_ready("two");
        assert_eq!(r.report().components["a"].since, first);
        a.set_not_ready("three");
        assert!(r.report().components["a"].since > first);
    }
}
