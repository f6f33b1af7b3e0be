//! Who may do what with hostlet's keys: the one decision the node API makes for every request, on plain data.
//!
//! Voters and admins hold the cluster. A worker node acts for itself alone,
//! as Kubernetes' Node authorizer and NodeRestriction admit a kubelet: it reads its own pods and the
//! objects they use, writes its own statuses, events, node record and lease, and reads what it needs to
//! find the voters. Everything else is denied, with the rule that denied it.

use crate::field::is_dns_subdomain;
use crate::keys::{Key, KeyLayout};
use crate::manifest::ConfigKind;

/// Who asks: from the certificate the request came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A voter's agent (the control plane).
    Voter(String),
    /// An operator's admin certificate.
    Admin(String),
    /// A worker node's agent, by node name.
    Node(String),
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Put,
    Delete,
}

impl Verb {
    pub const ALL: [Verb; 5] = [Verb::Get, Verb::List, Verb::Watch, Verb::Put, Verb::Delete];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Put => "put",
            Verb::Delete => "delete",
        }
    }
}

/// What a request is about: one key, or every key under a prefix (lists and watches). The node API has
/// no other range: no from-key reads or watches, no ranges between two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Key(&'a str),
    Prefix(&'a str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The rule that denied it, in words an operator can act on.
    Deny(String),
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

/// Which ConfigMaps and Secrets a node's pods use, as the voter's caches of pods know it.
pub trait PodGraph {
    fn uses(&self, node: &str, kind: ConfigKind, name: &str) -> bool;
}

/// No pod uses anything.
pub struct NoPods;

impl PodGraph for NoPods {
    fn uses(&self, _: &str, _: ConfigKind, _: &str) -> bool {
        false
    }
}

const NODE_LABELS_RULE: &str =
    "the labels an admin sets on nodes are for voters and admins; a node states its own in its record";

const PODSETS_RULE: &str = "pod sets are for voters and admins; a node reads the pods they give it";

/// What a node may do with a ConfigMap or Secret: read it while one of its pods uses it.
fn config_rule(
    node: &str,
    kind: ConfigKind,
    name: &str,
    graph: &impl PodGraph,
) -> (&'static [Verb], String) {
    if graph.uses(node, kind, name) {
        (
            &[Verb::Get, Verb::Watch],
            format!(
                "a node reads the {}s its pods use; voters and admins write them",
                kind.noun()
            ),
        )
    } else {
        (
            &[],
            format!("no pod of node {node} uses {} {name:?}", kind.noun()),
        )
    }
}

/// May `who` do `verb` on `target`?
pub fn authorize(
    layout: &KeyLayout,
    who: &Identity,
    verb: Verb,
    target: Target<'_>,
    graph: &impl PodGraph,
) -> Decision {
    let node = match who {
        Identity::Voter(_) | Identity::Admin(_) => return Decision::Allow,
        Identity::Node(n) => n.as_str(),
    };
    if !is_dns_subdomain(node) {
        return Decision::Deny(format!(
            "{node:?} is not a node name: the certificate names no node"
        ));
    }
    let deny = |what: &str, rule: &str| {
        Decision::Deny(format!(
            "node {node} may not {} {what}: {rule}",
            verb.as_str()
        ))
    };
    match target {
        Target::Prefix(prefix) => {
            let lists = [
                (layout.pods_prefix(node), &[Verb::List, Verb::Watch][..]),
                (layout.statuses_prefix(node), &[Verb::List, Verb::Watch][..]),
                (layout.events_prefix(node), &[Verb::List][..]),
                (layout.nodes_prefix(), &[Verb::List, Verb::Watch][..]),
            ];
            let what = format!("the keys under {prefix}");
            if !matches!(verb, Verb::List | Verb::Watch) {
                return deny(&what, "a node writes one key at a time");
            }
            // A deeper prefix stays inside an allowed one; a shorter one, or one that is not cut at a `/`,
            // does not (`/pods` would also cover `/podsX/`).
            match lists.iter().find(|(p, _)| prefix.starts_with(p.as_str())) {
                Some((_, verbs)) if verbs.contains(&verb) => Decision::Allow,
                Some(_) => deny(&what, "its events are listed, never watched"),
                None => deny(
                    &what,
                    "a node lists and watches only its own pods, its own statuses and the node records",
                ),
            }
        }
        Target::Key(key) => {
            let Some(parsed) = layout.parse(key) else {
                return deny(key, "not a hostlet key");
            };
            let reads = [Verb::Get, Verb::Watch];
            let own = |n: &str| n == node;
            let (verbs, rule): (&[Verb], String) = match &parsed {
                Key::Pod { node: n, .. } | Key::LegacyPodList { node: n } if own(n) => (
                    &reads,
                    "a node reads its own pods; voters and admins write them".into(),
                ),
                Key::PodStatus { node: n, .. } if own(n) => (
                    &[Verb::Get, Verb::Watch, Verb::Put, Verb::Delete],
                    String::new(),
                ),
                Key::Event { node: n, .. } if own(n) => (
                    &[Verb::Put, Verb::Delete],
                    "a node writes its own events and lists them to prune them; it reads no other".into(),
                ),
                Key::Node { node: n } if own(n) => (
                    &[Verb::Get, Verb::Watch, Verb::Put],
                    "a node writes its own record; deleting it is for voters and admins".into(),
                ),
                Key::Node { .. } => (
                    &reads,
                    "a node reads the other node records (to find the voters); it writes only its own"
                        .into(),
                ),
                Key::Lease { node: n } if own(n) => (
                    &[Verb::Get, Verb::Put, Verb::Delete],
                    "a node reads and keeps its own lease".into(),
                ),
                Key::MemberRequest { node: n } if own(n) => (
                    &[Verb::Get, Verb::Watch, Verb::Delete],
                    "member requests are written by the leader's voter placement".into(),
                ),
                Key::ClusterPolicy => (&reads, "the cluster policy is read-only to nodes".into()),
                Key::ConfigMap { name } | Key::Secret { name } => {
                    let kind = if matches!(parsed, Key::Secret { .. }) {
                        ConfigKind::Secret
                    } else {
                        ConfigKind::ConfigMap
                    };
                    config_rule(node, kind, name, graph)
                }
                Key::Pod { node: n, .. }
                | Key::LegacyPodList { node: n }
                | Key::PodStatus { node: n, .. }
                | Key::Event { node: n, .. }
                | Key::Lease { node: n }
                | Key::MemberRequest { node: n }
                | Key::EtcdUpgrade { node: n }
                | Key::SnapshotRecord { node: n, .. }
                | Key::NodeSnapshotPolicy { node: n }
                | Key::SnapshotRequest { node: n }
                | Key::TombstoneRequest { node: n }
                    if !own(n) =>
                {
                    (&[], format!("a node acts for itself alone (this key is node {n}'s)"))
                }
                Key::TombstoneRequest { .. } | Key::SnapshotRequest { .. } => {
                    (&[], "requests are written by voters and admins".into())
                }
                Key::EtcdUpgrade { .. }
                | Key::SnapshotRecord { .. }
                | Key::NodeSnapshotPolicy { .. }
                | Key::SnapshotPolicy
                | Key::LearnerProgress
                | Key::MaintenanceLock
                | Key::MemberRequestRecord => (&[], "etcd's upkeep is for voters".into()),
                Key::NodeLabels { .. } => (&[], NODE_LABELS_RULE.into()),
                Key::PodSet { .. } | Key::PodSetRevision { .. } | Key::PodSetStatus { .. } => {
                    (&[], PODSETS_RULE.into())
                }
                Key::SecretsEncryption | Key::JoinToken { .. } | Key::NodeCertificates { .. } => {
                    (&[], "tokens, keys and certificates are for voters and admins".into())
                }
                // Every own-node case is above; kept for the compiler.
                Key::Pod { .. }
                | Key::LegacyPodList { .. }
                | Key::PodStatus { .. }
                | Key::Event { .. }
                | Key::Lease { .. }
                | Key::MemberRequest { .. } => (&[], "not a key a node may use".into()),
            };
            if verbs.contains(&verb) {
                Decision::Allow
            } else {
                deny(key, &rule)
            }
        }
    }
}

/// The table docs/reference.md shows under "Who may do what": for every kind of key, what voters and
/// admins, the node the key names, and any other node may do. Made by asking [`authorize`].
pub fn who_may_do_what(layout: &KeyLayout) -> Vec<[String; 4]> {
    struct Uses(bool);
    impl PodGraph for Uses {
        fn uses(&self, _: &str, _: ConfigKind, _: &str) -> bool {
            self.0
        }
    }
    let example = |pattern: &str| {
        pattern
            .replace("<node>", "n1")
            .replace("<pod>", "p")
            .replace("<unix-nanos>-<seq>", "00000000000000000001-000001")
            .replace("<file>", "f")
            .replace("<name>", "x")
            .replace("<id>", "t")
            .replace("<n>", "0000000001")
    };
    let cell = |key: &str, decide: &dyn Fn(Verb, Target<'_>) -> Decision| {
        let mut verbs: Vec<&str> = Vec::new();
        for verb in Verb::ALL {
            let target = if verb == Verb::List {
                // A key is listed through the prefix it sits under.
                match key.rfind('/') {
                    Some(i) => Target::Prefix(&key[..=i]),
                    None => continue,
                }
            } else {
                Target::Key(key)
            };
            if decide(verb, target).allowed() {
                verbs.push(verb.as_str());
            }
        }
        if verbs.is_empty() {
            "—".to_string()
        } else {
            verbs.join(", ")
        }
    };
    layout
        .patterns()
        .into_iter()
        .map(|pattern| {
            let key = example(&pattern);
            let column = |who: Identity| {
                let with = |uses: bool| {
                    cell(&key, &|verb, target| {
                        authorize(layout, &who, verb, target, &Uses(uses))
                    })
                };
                let (used, unused) = (with(true), with(false));
                if used == unused {
                    used
                } else {
                    format!("{used} (if a pod of its uses it), else {unused}")
                }
            };
            [
                pattern,
                column(Identity::Voter("v".into())),
                column(Identity::Node("n1".into())),
                column(Identity::Node("n2".into())),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Uses(&'static [(&'static str, ConfigKind, &'static str)]);
    impl PodGraph for Uses {
        fn uses(&self, node: &str, kind: ConfigKind, name: &str) -> bool {
            self.0
                .iter()
                .any(|(n, k, x)| *n == node && *k == kind && *x == name)
        }
    }

    const GRAPH: Uses = Uses(&[
        ("w1", ConfigKind::Secret, "db-password"),
        ("w1", ConfigKind::ConfigMap, "settings"),
        ("w2", ConfigKind::Secret, "other"),
    ]);

    fn ask(who: &Identity, verb: Verb, target: Target<'_>) -> Decision {
        authorize(&KeyLayout::default(), who, verb, target, &GRAPH)
    }

    #[test]
    fn a_worker_acts_for_itself_alone() {
        use Target::{Key as K, Prefix as P};
        use Verb::*;
        let w1 = Identity::Node("w1".into());
        // (verb, target, allowed)
        let table: &[(Verb, Target<'_>, bool)] = &[
            // Its own pods: read, never written.
            (Get, K("/hostlet/hosts/w1/pods/web"), true),
            (Watch, K("/hostlet/hosts/w1/pods/web"), true),
            (List, P("/hostlet/hosts/w1/pods/"), true),
            (Watch, P("/hostlet/hosts/w1/pods/"), true),
            (Put, K("/hostlet/hosts/w1/pods/web"), false),
            (Delete, K("/hostlet/hosts/w1/pods/web"), false),
            (Get, K("/registry/hosts/w1/kubelet"), true),
            (Put, K("/registry/hosts/w1/kubelet"), false),
            // Another node's pods, or everyone's.
            (Get, K("/hostlet/hosts/w2/pods/web"), false),
            (List, P("/hostlet/hosts/w2/pods/"), false),
            (Watch, P("/hostlet/hosts/"), false),
            (List, P("/hostlet/"), false),
            (List, P(""), false),
            (List, P("/hostlet/hosts/w1/pods"), false),
            (Get, K("/registry/hosts/w2/kubelet"), false),
            // Its own statuses, events, record and lease.
            (Put, K("/hostlet/hosts/w1/status/web"), true),
            (Delete, K("/hostlet/hosts/w1/status/web"), true),
            (List, P("/hostlet/hosts/w1/status/"), true),
            (Put, K("/hostlet/hosts/w2/status/web"), false),
            (
                Put,
                K("/hostlet/events/w1/00000000000000000001-000001"),
                true,
            ),
            (List, P("/hostlet/events/w1/"), true),
            (Watch, P("/hostlet/events/w1/"), false),
            (
                Put,
                K("/hostlet/events/w2/00000000000000000001-000001"),
                false,
            ),
            (List, P("/hostlet/events/"), false),
            (Put, K("/hostlet/nodes/w1"), true),
            (Delete, K("/hostlet/nodes/w1"), false),
            (Get, K("/hostlet/nodes/v1"), true),
            (List, P("/hostlet/nodes/"), true),
            (Put, K("/hostlet/nodes/v1"), false),
            (Delete, K("/hostlet/nodes/v1"), false),
            (Put, K("/hostlet/leases/w1"), true),
            (Put, K("/hostlet/leases/v1"), false),
            // The cluster's policy: read only.
            (Get, K("/hostlet/config/cluster"), true),
            (Watch, K("/hostlet/config/cluster"), true),
            (Put, K("/hostlet/config/cluster"), false),
            // Requests and etcd's upkeep: never.
            (Put, K("/hostlet/hosts/v1/requests/tombstone"), false),
            (Put, K("/hostlet/hosts/w1/requests/tombstone"), false),
            (Put, K("/hostlet/hosts/w1/requests/snapshot"), false),
            (Get, K("/hostlet/hosts/w1/requests/member"), true),
            (Put, K("/hostlet/hosts/w1/requests/member"), false),
            (Get, K("/hostlet/hosts/w2/requests/member"), false),
            (Put, K("/hostlet/etcd/member-request"), false),
            (Put, K("/hostlet/etcd/maintenance-lock"), false),
            (Get, K("/hostlet/etcd/snapshots/v1/s.db"), false),
            (Get, K("/hostlet/tokens/abc"), false),
            (Get, K("/hostlet/config/secrets-encryption"), false),
            // ConfigMaps and Secrets by the pod graph.
            (Get, K("/hostlet/secrets/db-password"), true),
            (Watch, K("/hostlet/configmaps/settings"), true),
            (Put, K("/hostlet/secrets/db-password"), false),
            (Get, K("/hostlet/secrets/other"), false),
            (Get, K("/hostlet/configmaps/db-password"), false),
            (List, P("/hostlet/secrets/"), false),
            // Not hostlet's, or not a key at all.
            (Get, K("/elsewhere"), false),
            (Get, K("/hostlet/hosts/w1/pods/a/b"), false),
            (Put, P("/hostlet/hosts/w1/status/"), false),
        ];
        for (verb, target, allowed) in table {
            let got = ask(&w1, *verb, *target);
            assert_eq!(got.allowed(), *allowed, "{verb:?} {target:?}: {got:?}");
        }
    }

    #[test]
    fn pod_sets_cordons_and_labels_are_not_a_worker_s() {
        let l = KeyLayout::default();
        let w1 = Identity::Node("w1".into());
        for key in [
            l.podset("agent"),
            l.podset_status("agent"),
            l.podset_revision("agent", 1),
            l.node_labels("w1"),
            l.pod("w2", "agent"),
        ] {
            for verb in Verb::ALL {
                let target = if verb == Verb::List {
                    Target::Prefix(&key)
                } else {
                    Target::Key(&key)
                };
                assert!(
                    !authorize(&l, &w1, verb, target, &NoPods).allowed(),
                    "{verb:?} {key}"
                );
            }
        }
        // Its own pod key (where a set writes it) it reads, and no more.
        let own = l.pod("w1", "agent");
        assert!(authorize(&l, &w1, Verb::Get, Target::Key(&own), &NoPods).allowed());
        assert!(!authorize(&l, &w1, Verb::Put, Target::Key(&own), &NoPods).allowed());
    }

    #[test]
    fn a_denial_names_its_rule() {
        let w1 = Identity::Node("w1".into());
        let d = |verb, target| match ask(&w1, verb, target) {
            Decision::Deny(r) => r,
            Decision::Allow => panic!("{verb:?} {target:?} allowed"),
        };
        assert_eq!(
            d(Verb::Get, Target::Key("/hostlet/hosts/w2/pods/web")),
            "node w1 may not get /hostlet/hosts/w2/pods/web: a node acts for itself alone (this key is node w2's)"
        );
        assert_eq!(
            d(Verb::Put, Target::Key("/hostlet/config/cluster")),
            "node w1 may not put /hostlet/config/cluster: the cluster policy is read-only to nodes"
        );
        assert_eq!(
            d(Verb::Get, Target::Key("/hostlet/secrets/other")),
            "node w1 may not get /hostlet/secrets/other: no pod of node w1 uses secret \"other\""
        );
        assert!(d(Verb::Put, Target::Key("/hostlet/hosts/w1/pods/web"))
            .contains("voters and admins write them"));
    }

    #[test]
    fn voters_and_admins_may_do_anything_and_a_nameless_certificate_nothing() {
        for who in [Identity::Voter("v1".into()), Identity::Admin("ops".into())] {
            for verb in Verb::ALL {
                assert!(ask(&who, verb, Target::Key("/hostlet/config/cluster")).allowed());
                assert!(ask(&who, verb, Target::Prefix("/")).allowed());
            }
        }
        for bad in ["", "W1", "a/b", "../w1"] {
            let who = Identity::Node(bad.into());
            assert!(!ask(&who, Verb::Get, Target::Key("/hostlet/config/cluster")).allowed());
        }
    }

    #[test]
    fn the_table_covers_every_key_and_shows_the_pod_graph() {
        let rows = who_may_do_what(&KeyLayout::default());
        assert_eq!(rows.len(), KeyLayout::default().patterns().len());
        let row = |p: &str| rows.iter().find(|r| r[0] == p).unwrap().clone();
        assert_eq!(
            row("/hostlet/hosts/<node>/pods/<pod>")[1..],
            ["get, list, watch, put, delete", "get, list, watch", "—"]
        );
        assert_eq!(
            row("/hostlet/secrets/<name>")[2],
            "get, watch (if a pod of its uses it), else —"
        );
    }
}
