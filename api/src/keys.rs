//! The etcd key layout. Every key hostlet reads or writes is built here and parsed back here.

/// The default key prefix (`--key-prefix`).
pub const DEFAULT_PREFIX: &str = "/hostlet";
/// The 2014 kubelet's list key lives outside the prefix.
pub const LEGACY_REGISTRY_PREFIX: &str = "/registry/hosts";

/// Key construction under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout::new(DEFAULT_PREFIX)
    }
}

/// A key read back into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Pod { node: String, pod: String },
    LegacyPodList { node: String },
    PodStatus { node: String, pod: String },
    Event { node: String, name: String },
    Node { node: String },
    Lease { node: String },
    LearnerProgress,
    MaintenanceLock,
    EtcdUpgrade { node: String },
    SnapshotRecord { node: String, file: String },
    SnapshotPolicy,
    NodeSnapshotPolicy { node: String },
    SnapshotRequest { node: String },
    TombstoneRequest { node: String },
    ClusterPolicy,
    MemberRequest { node: String },
    MemberRequestRecord,
    ConfigMap { name: String },
    Secret { name: String },
    SecretsEncryption,
    JoinToken { id: String },
    NodeCertificates { node: String },
    NodeLabels { node: String },
    PodSet { name: String },
    PodSetRevision { name: String, revision: String },
    PodSetStatus { name: String },
}

impl KeyLayout {
    /// A layout under `prefix` (a trailing `/` is dropped; an empty prefix means the root).
    pub fn new(prefix: &str) -> Self {
        KeyLayout {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn host(&self, node: &str) -> String {
        format!("{}/hosts/{node}", self.prefix)
    }

    pub fn pods_prefix(&self, node: &str) -> String {
        format!("{}/pods/", self.host(node))
    }
    pub fn pod(&self, node: &str, pod: &str) -> String {
        format!("{}{pod}", self.pods_prefix(node))
    }
    pub fn legacy_pod_list(&self, node: &str) -> String {
        format!("{LEGACY_REGISTRY_PREFIX}/{node}/kubelet")
    }
    pub fn statuses_prefix(&self, node: &str) -> String {
        format!("{}/status/", self.host(node))
    }
    pub fn pod_status(&self, node: &str, pod: &str) -> String {
        format!("{}{pod}", self.statuses_prefix(node))
    }
    pub fn events_prefix(&self, node: &str) -> String {
        format!("{}/events/{node}/", self.prefix)
    }
    pub fn all_events_prefix(&self) -> String {
        format!("{}/events/", self.prefix)
    }
    /// `<unix-nanos>-<seq>`, zero-padded so that keys sort by time.
    pub fn event(&self, node: &str, unix_nanos: u128, seq: u64) -> String {
        format!("{}{unix_nanos:020}-{seq:06}", self.events_prefix(node))
    }
    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }
    pub fn node(&self, node: &str) -> String {
        format!("{}{node}", self.nodes_prefix())
    }
    pub fn leases_prefix(&self) -> String {
        format!("{}/leases/", self.prefix)
    }
    pub fn lease(&self, node: &str) -> String {
        format!("{}{node}", self.leases_prefix())
    }
    pub fn learner_progress(&self) -> String {
        format!("{}/etcd/learner-progress", self.prefix)
    }
    /// Held (on a lease) by whoever runs the cluster's one compaction or defragmentation at a time.
    pub fn maintenance_lock(&self) -> String {
        format!("{}/etcd/maintenance-lock", self.prefix)
    }
    /// Each voter's etcd binary as its agent last saw it, and where its upgrade stands.
    pub fn etcd_upgrades_prefix(&self) -> String {
        format!("{}/etcd/upgrades/", self.prefix)
    }
    pub fn etcd_upgrade(&self, node: &str) -> String {
        format!("{}{node}", self.etcd_upgrades_prefix())
    }
    pub fn snapshots_prefix(&self) -> String {
        format!("{}/etcd/snapshots/", self.prefix)
    }
    pub fn node_snapshots_prefix(&self, node: &str) -> String {
        format!("{}{node}/", self.snapshots_prefix())
    }
    pub fn snapshot_record(&self, node: &str, file: &str) -> String {
        format!("{}{file}", self.node_snapshots_prefix(node))
    }
    pub fn snapshot_policy(&self) -> String {
        format!("{}/config/snapshots", self.prefix)
    }
    pub fn node_snapshot_policy(&self, node: &str) -> String {
        format!("{}/config/snapshots", self.host(node))
    }
    pub fn snapshot_request(&self, node: &str) -> String {
        format!("{}/requests/snapshot", self.host(node))
    }
    pub fn tombstone_request(&self, node: &str) -> String {
        format!("{}/requests/tombstone", self.host(node))
    }
    /// The leader's record of its one pending member request (the same value as the node's request key).
    pub fn member_request_record(&self) -> String {
        format!("{}/etcd/member-request", self.prefix)
    }
    pub fn cluster_policy(&self) -> String {
        format!("{}/config/cluster", self.prefix)
    }
    pub fn member_request(&self, node: &str) -> String {
        format!("{}/requests/member", self.host(node))
    }
    /// ConfigMaps, cluster-wide (no namespaces).
    pub fn config_maps_prefix(&self) -> String {
        format!("{}/configmaps/", self.prefix)
    }
    pub fn config_map(&self, name: &str) -> String {
        format!("{}{name}", self.config_maps_prefix())
    }
    /// Secrets, cluster-wide (no namespaces).
    pub fn secrets_prefix(&self) -> String {
        format!("{}/secrets/", self.prefix)
    }
    pub fn secret(&self, name: &str) -> String {
        format!("{}{name}", self.secrets_prefix())
    }
    /// Worker join tokens, each by its id (the secret only hashed).
    pub fn tokens_prefix(&self) -> String {
        format!("{}/tokens/", self.prefix)
    }
    pub fn join_token(&self, id: &str) -> String {
        format!("{}{id}", self.tokens_prefix())
    }
    /// The certificates issued to each node (serials), and those revoked when it was deleted.
    pub fn certificates_prefix(&self) -> String {
        format!("{}/certs/", self.prefix)
    }
    pub fn node_certificates(&self, node: &str) -> String {
        format!("{}{node}", self.certificates_prefix())
    }
    /// The labels an admin set on each node (`hostlet node label`), apart from the node's own record.
    pub fn node_labels_prefix(&self) -> String {
        format!("{}/node-labels/", self.prefix)
    }
    pub fn node_labels(&self, node: &str) -> String {
        format!("{}{node}", self.node_labels_prefix())
    }
    /// Pod sets (`hostlet podset apply`), with their revisions and status under each.
    pub fn podsets_prefix(&self) -> String {
        format!("{}/podsets/", self.prefix)
    }
    pub fn podset(&self, name: &str) -> String {
        format!("{}{name}", self.podsets_prefix())
    }
    pub fn podset_revisions_prefix(&self, name: &str) -> String {
        format!("{}/revisions/", self.podset(name))
    }
    /// Zero-padded so that the revisions list in order.
    pub fn podset_revision(&self, name: &str, revision: u64) -> String {
        format!("{}{revision:010}", self.podset_revisions_prefix(name))
    }
    pub fn podset_status(&self, name: &str) -> String {
        format!("{}/status", self.podset(name))
    }
    /// Which key id new secret writes use.
    pub fn secrets_encryption(&self) -> String {
        format!("{}/config/secrets-encryption", self.prefix)
    }

    /// Every kind of key, written with placeholders (`<node>`, `<pod>`, …): docs/reference.md lists the same
    /// (a test compares them), and each parses back into its [`Key`].
    pub fn patterns(&self) -> Vec<String> {
        let (n, p) = ("<node>", "<pod>");
        vec![
            self.pod(n, p),
            self.legacy_pod_list(n),
            self.pod_status(n, p),
            format!("{}<unix-nanos>-<seq>", self.events_prefix(n)),
            self.node(n),
            self.lease(n),
            self.learner_progress(),
            self.maintenance_lock(),
            self.etcd_upgrade(n),
            self.snapshot_record(n, "<file>"),
            self.snapshot_policy(),
            self.node_snapshot_policy(n),
            self.snapshot_request(n),
            self.tombstone_request(n),
            self.cluster_policy(),
            self.member_request(n),
            self.member_request_record(),
            self.config_map("<name>"),
            self.secret("<name>"),
            self.secrets_encryption(),
            self.join_token("<id>"),
            self.node_certificates(n),
            self.node_labels(n),
            self.podset("<name>"),
            format!("{}<n>", self.podset_revisions_prefix("<name>")),
            self.podset_status("<name>"),
        ]
    }

    /// Reads a key back into its parts; `None` for a key that is not hostlet's.
    pub fn parse(&self, key: &str) -> Option<Key> {
        if let Some(rest) = key.strip_prefix(LEGACY_REGISTRY_PREFIX) {
            let parts: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
            return match parts.as_slice() {
                [node, "kubelet"] if !node.is_empty() => Some(Key::LegacyPodList {
                    node: node.to_string(),
                }),
                _ => None,
            };
        }
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        let s = |v: &&str| v.to_string();
        Some(match parts.as_slice() {
            ["hosts", node, "pods", pod] => Key::Pod {
                node: s(node),
                pod: s(pod),
            },
            ["hosts", node, "status", pod] => Key::PodStatus {
                node: s(node),
                pod: s(pod),
            },
            ["hosts", node, "config", "snapshots"] => Key::NodeSnapshotPolicy { node: s(node) },
            ["hosts", node, "requests", "snapshot"] => Key::SnapshotRequest { node: s(node) },
            ["hosts", node, "requests", "tombstone"] => Key::TombstoneRequest { node: s(node) },
            ["hosts", node, "requests", "member"] => Key::MemberRequest { node: s(node) },
            ["events", node, name] => Key::Event {
                node: s(node),
                name: s(name),
            },
            ["nodes", node] => Key::Node { node: s(node) },
            ["configmaps", name] => Key::ConfigMap { name: s(name) },
            ["secrets", name] => Key::Secret { name: s(name) },
            ["tokens", id] => Key::JoinToken { id: s(id) },
            ["certs", node] => Key::NodeCertificates { node: s(node) },
            ["node-labels", node] => Key::NodeLabels { node: s(node) },
            ["podsets", name] => Key::PodSet { name: s(name) },
            ["podsets", name, "status"] => Key::PodSetStatus { name: s(name) },
            ["podsets", name, "revisions", n] => Key::PodSetRevision {
                name: s(name),
                revision: s(n),
            },
            ["leases", node] => Key::Lease { node: s(node) },
            ["etcd", "learner-progress"] => Key::LearnerProgress,
            ["etcd", "maintenance-lock"] => Key::MaintenanceLock,
            ["etcd", "member-request"] => Key::MemberRequestRecord,
            ["etcd", "upgrades", node] => Key::EtcdUpgrade { node: s(node) },
            ["etcd", "snapshots", node, file] => Key::SnapshotRecord {
                node: s(node),
                file: s(file),
            },
            ["config", "snapshots"] => Key::SnapshotPolicy,
            ["config", "cluster"] => Key::ClusterPolicy,
            ["config", "secrets-encryption"] => Key::SecretsEncryption,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_back_into_its_parts() {
        let l = KeyLayout::default();
        let cases = [
            (
                l.pod("n1", "web"),
                Key::Pod {
                    node: "n1".into(),
                    pod: "web".into(),
                },
            ),
            (
                l.legacy_pod_list("n1"),
                Key::LegacyPodList { node: "n1".into() },
            ),
            (
                l.pod_status("n1", "web"),
                Key::PodStatus {
                    node: "n1".into(),
                    pod: "web".into(),
                },
            ),
            (
                l.event("n1", 12, 3),
                Key::Event {
                    node: "n1".into(),
                    name: "00000000000000000012-000003".into(),
                },
            ),
            (l.node("n1"), Key::Node { node: "n1".into() }),
            (l.lease("n1"), Key::Lease { node: "n1".into() }),
            (l.learner_progress(), Key::LearnerProgress),
            (l.maintenance_lock(), Key::MaintenanceLock),
            (l.etcd_upgrade("n1"), Key::EtcdUpgrade { node: "n1".into() }),
            (
                l.snapshot_record("n1", "f"),
                Key::SnapshotRecord {
                    node: "n1".into(),
                    file: "f".into(),
                },
            ),
            (l.snapshot_policy(), Key::SnapshotPolicy),
            (l.cluster_policy(), Key::ClusterPolicy),
            (l.member_request_record(), Key::MemberRequestRecord),
            (
                l.member_request("n1"),
                Key::MemberRequest { node: "n1".into() },
            ),
            (
                l.node_snapshot_policy("n1"),
                Key::NodeSnapshotPolicy { node: "n1".into() },
            ),
            (
                l.snapshot_request("n1"),
                Key::SnapshotRequest { node: "n1".into() },
            ),
            (
                l.tombstone_request("n1"),
                Key::TombstoneRequest { node: "n1".into() },
            ),
            (
                l.node_certificates("n1"),
                Key::NodeCertificates { node: "n1".into() },
            ),
            (l.node_labels("n1"), Key::NodeLabels { node: "n1".into() }),
            (l.podset("ds"), Key::PodSet { name: "ds".into() }),
            (
                l.podset_revision("ds", 3),
                Key::PodSetRevision {
                    name: "ds".into(),
                    revision: "0000000003".into(),
                },
            ),
            (
                l.podset_status("ds"),
                Key::PodSetStatus { name: "ds".into() },
            ),
        ];
        for (key, want) in cases {
            assert_eq!(l.parse(&key), Some(want), "{key}");
        }
    }

    #[test]
    fn patterns_name_every_kind_of_key() {
        let l = KeyLayout::default();
        let mut seen = [false; 26];
        for p in l.patterns() {
            let key = l.parse(&p).unwrap_or_else(|| panic!("{p} does not parse"));
            // No wildcard: a new kind of key fails to compile here until it has a pattern.
            let i = match key {
                Key::Pod { .. } => 0,
                Key::LegacyPodList { .. } => 1,
                Key::PodStatus { .. } => 2,
                Key::Event { .. } => 3,
                Key::Node { .. } => 4,
                Key::Lease { .. } => 5,
                Key::LearnerProgress => 6,
                Key::MaintenanceLock => 7,
                Key::SnapshotRecord { .. } => 8,
                Key::SnapshotPolicy => 9,
                Key::NodeSnapshotPolicy { .. } => 10,
                Key::SnapshotRequest { .. } => 11,
                Key::TombstoneRequest { .. } => 12,
                Key::ClusterPolicy => 13,
                Key::MemberRequest { .. } => 14,
                Key::MemberRequestRecord => 15,
                Key::EtcdUpgrade { .. } => 16,
                Key::ConfigMap { .. } => 17,
                Key::Secret { .. } => 18,
                Key::SecretsEncryption => 19,
                Key::JoinToken { .. } => 20,
                Key::NodeCertificates { .. } => 21,
                Key::NodeLabels { .. } => 22,
                Key::PodSet { .. } => 23,
                Key::PodSetRevision { .. } => 24,
                Key::PodSetStatus { .. } => 25,
            };
            assert!(!seen[i], "{p}: a second pattern for the same kind");
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
    }

    #[test]
    fn layout_follows_the_design() {
        let l = KeyLayout::default();
        assert_eq!(l.pod("n", "p"), "/hostlet/hosts/n/pods/p");
        assert_eq!(l.legacy_pod_list("n"), "/registry/hosts/n/kubelet");
        assert_eq!(l.pod_status("n", "p"), "/hostlet/hosts/n/status/p");
        assert_eq!(l.snapshot_record("n", "f"), "/hostlet/etcd/snapshots/n/f");
        assert_eq!(
            l.tombstone_request("n"),
            "/hostlet/hosts/n/requests/tombstone"
        );
    }

    #[test]
    fn custom_prefix_and_foreign_keys() {
        let l = KeyLayout::new("/x/");
        assert_eq!(l.pod("n", "p"), "/x/hosts/n/pods/p");
        assert_eq!(l.parse("/hostlet/hosts/n/pods/p"), None);
        assert_eq!(l.parse("/x/hosts/n/pods/"), None);
        assert_eq!(l.parse("/x/hosts/n/pods/p/q"), None);
        assert_eq!(l.parse("/xy/nodes/n"), None);
    }

    #[test]
    fn event_keys_sort_by_time() {
        let l = KeyLayout::default();
        assert!(l.event("n", 9, 0) < l.event("n", 10, 0));
        assert!(l.event("n", 10, 2) < l.event("n", 10, 10));
    }
}
