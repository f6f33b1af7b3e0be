//! The voters of deleted nodes, handed from member removal to voter placement (`crate::placement`). Member removal, which
//! keeps every deleted node pending on every agent, marks such a voter here instead of removing it while
//! the voter target parses; placement then replaces it as it replaces a dead voter: a worker joins as a
//! learner and catches up, the voter is removed, the learner promoted. With no worker to ask, placement
//! removes it at once. Learners and the last voter stay with member removal.

use std::sync::{Arc, Mutex};

use hostlet_api::objects::ClusterPolicy;
use hostlet_runtime::informer::Object;
use hostlet_runtime::store::{Event, Writer};
use hostlet_runtime::Store;

/// The set of member ids being retired (one per agent, shared by its two controllers).
#[derive(Clone)]
pub struct Handoff {
    writer: Arc<Mutex<Writer<u64, ()>>>,
    retiring: Store<u64, ()>,
    policy: Store<String, Object<ClusterPolicy>>,
}

impl Handoff {
    /// An empty set; `policy` is the shared cache of the cluster policy.
    pub fn new(policy: Store<String, Object<ClusterPolicy>>) -> Handoff {
        let mut writer = Writer::new();
        writer.apply_all([Event::Init, Event::InitDone]);
        let retiring = writer.store();
        Handoff {
            writer: Arc::new(Mutex::new(writer)),
            retiring,
            policy,
        }
    }

    /// Placement acts only while the voter target parses; otherwise member removal keeps the job.
    pub fn placement_acts(&self) -> bool {
        // Placement's rule: no key means the default target; a key that does not parse stops it.
        self.policy
            .state()
            .first()
            .is_none_or(|o| o.valid().is_some())
    }

    /// The ids marked, as a store placement watches.
    pub fn retiring(&self) -> &Store<u64, ()> {
        &self.retiring
    }

    /// Marks `id`; true if it was not marked before.
    pub fn mark(&self, id: u64) -> bool {
        if self.retiring.contains(&id) {
            return false;
        }
        self.write(Event::Apply(id, Arc::new(())));
        true
    }

    /// Unmarks `id` (its member is gone, or its node registered again).
    pub fn unmark(&self, id: u64) {
        if self.retiring.contains(&id) {
            self.write(Event::Delete(id));
        }
    }

    fn write(&self, event: Event<u64, ()>) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        w.apply(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_kept_once_and_the_policy_decides_who_acts() {
        let mut policy = Writer::new();
        policy.apply_all([Event::Init, Event::InitDone]);
        let h = Handoff::new(policy.store());
        // No policy key: the default target is in force, so placement acts.
        assert!(h.placement_acts());
        assert!(h.mark(7));
        assert!(!h.mark(7));
        assert!(h.retiring().contains(&7));
        h.unmark(7);
        h.unmark(7);
        assert!(h.retiring().is_empty());
        let bad = Object {
            key: "/hostlet/config/cluster".to_string(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
            value: Err(hostlet_runtime::informer::Invalid {
                error: Arc::new(std::io::Error::other("voters: 4 is not one of 1, 3, 5, 7")),
                raw: br#"{"voters":4}"#.to_vec(),
            }),
        };
        policy.apply(Event::Apply(bad.key.clone(), Arc::new(bad)));
        assert!(!h.placement_acts());
    }
}
