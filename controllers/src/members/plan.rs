//! What removing a deleted node's member takes, decided on plain data.

use hostlet_api::objects::NodeInfo;
use hostlet_runtime::Member;

use super::cluster::ClusterView;

/// The next step towards removing a deleted node's member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalStep {
    /// No member carries the record's name and peer URL: nothing (left) to remove.
    NothingToRemove,
    Remove {
        id: u64,
    },
    /// The member leads: hand leadership to voter `to` first; whoever leads then removes it.
    MoveLeader {
        from: u64,
        to: u64,
    },
    /// It is the only voter: removing it would end the cluster.
    RefuseLastVoter {
        id: u64,
    },
}

/// Whether `member` is the one the node record describes: same name and the same peer URL.
pub fn is_node_member(node: &NodeInfo, member: &Member) -> bool {
    let (Some(name), Some(peer)) = (node.member_name.as_deref(), node.peer_url.as_deref()) else {
        return false;
    };
    member.name == name && member.has_peer_url(peer)
}

/// Plans the removal of the member of deleted node `node`, as seen from the leader.
pub fn plan_removal(node: &NodeInfo, view: &ClusterView) -> RemovalStep {
    let Some(member) = view.members.iter().find(|m| is_node_member(node, m)) else {
        return RemovalStep::NothingToRemove;
    };
    if member.is_learner {
        return RemovalStep::Remove { id: member.id };
    }
    let others: Vec<&Member> = view.voters().filter(|v| v.id != member.id).collect();
    if others.is_empty() {
        return RemovalStep::RefuseLastVoter { id: member.id };
    }
    if member.id == view.leader_id {
        // Prefer a voter that has started (it published a client URL) to one that never came up.
        let to = others
            .iter()
            .find(|v| v.is_started() && !v.client_urls.is_empty())
            .unwrap_or(&others[0])
            .id;
        return RemovalStep::MoveLeader {
            from: member.id,
            to,
        };
    }
    RemovalStep::Remove { id: member.id }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlet_api::objects::Timestamp;

    fn member(id: u64, name: &str, learner: bool) -> Member {
        Member {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            client_urls: if name.is_empty() {
                vec![]
            } else {
                vec![format!("https://10.0.0.{id}:2379")]
            },
            is_learner: learner,
        }
    }

    fn node(name: &str, member_name: &str, peer: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            address: "10.0.0.9".into(),
            member_name: Some(member_name.into()),
            member_id: None,
            peer_url: Some(peer.into()),
            client_url: None,
            api_url: None,
            version: "0.1.0".into(),
            started: Timestamp::from_unix(0),
            role: None,
            failure_domain: None,
            member_since: None,
            cert_expires: None,
            cert_serials: Vec::new(),
            labels: Default::default(),
            images: Default::default(),
        }
    }

    fn view(leader: u64, members: Vec<Member>) -> ClusterView {
        ClusterView {
            local_id: leader,
            leader_id: leader,
            members,
        }
    }

    #[test]
    fn table() {
        let three = || {
            vec![
                member(1, "n1-a", false),
                member(2, "n2-b", false),
                member(3, "n3-c", false),
            ]
        };
        let cases = [
            (
                "a follower's member is removed",
                node("n2", "n2-b", "https://10.0.0.2:2380"),
                view(1, three()),
                RemovalStep::Remove { id: 2 },
            ),
            (
                "the leader's member: leadership moves to another voter first",
                node("n1", "n1-a", "https://10.0.0.1:2380/"),
                view(1, three()),
                RemovalStep::MoveLeader { from: 1, to: 2 },
            ),
            (
                "leadership goes to a voter that has started",
                node("n1", "n1-a", "https://10.0.0.1:2380"),
                view(
                    1,
                    vec![
                        member(1, "n1-a", false),
                        member(2, "", false),
                        member(3, "n3-c", false),
                    ],
                ),
                RemovalStep::MoveLeader { from: 1, to: 3 },
            ),
            (
                "the last voter is never removed",
                node("n1", "n1-a", "https://10.0.0.1:2380"),
                view(1, vec![member(1, "n1-a", false), member(4, "n4-d", true)]),
                RemovalStep::RefuseLastVoter { id: 1 },
            ),
            (
                "a learner is removed directly",
                node("n4", "n4-d", "https://10.0.0.4:2380"),
                view(1, vec![member(1, "n1-a", false), member(4, "n4-d", true)]),
                RemovalStep::Remove { id: 4 },
            ),
            (
                "same name, other peer URL: not that node's member",
                node("n2", "n2-b", "https://10.9.9.9:2380"),
                view(1, three()),
                RemovalStep::NothingToRemove,
            ),
            (
                "same peer URL, other name (the node rejoined as a new member): not it",
                node("n2", "n2-old", "https://10.0.0.2:2380"),
                view(1, three()),
                RemovalStep::NothingToRemove,
            ),
            (
                "already removed",
                node("n5", "n5-e", "https://10.0.0.5:2380"),
                view(1, three()),
                RemovalStep::NothingToRemove,
            ),
        ];
        for (what, node, view, want) in cases {
            assert_eq!(plan_removal(&node, &view), want, "{what}");
        }
    }

    #[test]
    fn a_record_without_member_fields_matches_nothing() {
        let mut n = node("n2", "n2-b", "https://10.0.0.2:2380");
        n.member_name = None;
        assert!(!is_node_member(&n, &member(2, "n2-b", false)));
        let mut n = node("n2", "n2-b", "https://10.0.0.2:2380");
        n.peer_url = None;
        assert!(!is_node_member(&n, &member(2, "n2-b", false)));
    }
}
