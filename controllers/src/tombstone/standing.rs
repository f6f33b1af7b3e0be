//! Whether this member still belongs to its cluster, as the other members see it.
//!
//! A member whose cluster moved on without it — removed while it was down, or left behind by a cluster
//! reset on another node — would otherwise start on its old data and wait for a quorum that never comes,
//! or (worse) form one with other members left behind. Before etcd starts, and while it runs, the agent
//! asks the other members it knows: a member that serves (knows a leader) and does not list this one
//! means the cluster has moved on, unless another serving member still lists it.

use std::time::Duration;

use hostlet_runtime::{Etcd, EtcdConfig, TlsFiles};

/// How long one member gets to answer.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// What one other member said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAnswer {
    /// The client URL it was asked at.
    pub endpoint: String,
    /// It knows a leader: its member list is the one of a cluster that works.
    pub has_leader: bool,
    /// Its member list holds this member (by name, or by id when the id is known).
    pub lists_us: bool,
    /// The id of the cluster it serves (0 when not known).
    pub cluster_id: u64,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A serving member lists this one.
    Member,
    /// Serving members answered and none lists this one; `by` is the first of them.
    Removed { by: String },
    /// No serving member answered: nothing can be concluded.
    Unknown,
}

/// Judges the answers. One serving member that lists us outweighs any number that do not, so a member
/// with a stale view never pushes a healthy one out.
pub fn judge(answers: &[PeerAnswer]) -> Standing {
    let serving: Vec<&PeerAnswer> = answers.iter().filter(|a| a.has_leader).collect();
    if serving.iter().any(|a| a.lists_us) {
        return Standing::Member;
    }
    match serving.first() {
        Some(a) => Standing::Removed {
            by: a.endpoint.clone(),
        },
        None => Standing::Unknown,
    }
}

/// How long to wait before asking again to confirm a removal: a few of etcd's election timeouts.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(2);

/// Two verdicts, one after the other: a removal stands only when both say so; anything else in
/// either makes the outcome not a removal (a member in one of them wins, else nothing is known).
pub fn confirmed(first: &Standing, second: &Standing) -> Standing {
    match (first, second) {
        (Standing::Removed { .. }, Standing::Removed { by }) => {
            Standing::Removed { by: by.clone() }
        }
        (Standing::Member, _) | (_, Standing::Member) => Standing::Member,
        _ => Standing::Unknown,
    }
}

/// Judges the answers for a member that serves, in cluster `own_cluster`, from the other members its
/// cluster lists. Besides [`judge`]'s rule: one of them that serves another cluster which does not hold
/// this member was made a cluster of its own by a reset (from a snapshot: a new cluster id), and this
/// member's cluster is what was left behind — even while the other members left behind still list it.
/// A member only catching up keeps the cluster id, so it never counts as such.
pub fn judge_from_inside(answers: &[PeerAnswer], own_cluster: u64) -> Standing {
    let made_anew = answers.iter().find(|a| {
        a.has_leader
            && !a.lists_us
            && own_cluster != 0
            && a.cluster_id != 0
            && a.cluster_id != own_cluster
    });
    match made_anew {
        Some(a) => Standing::Removed {
            by: a.endpoint.clone(),
        },
        None => judge(answers),
    }
}

/// Who this member is, to find it in a member list.
#[derive(Debug, Clone)]
pub struct Identity {
    pub name: String,
    /// 0 when not known.
    pub id: u64,
}

impl Identity {
    /// Whether the member with this id and name is this one. A member added but never started has no
    /// name yet, so an empty name matches nothing.
    pub fn is(&self, id: u64, name: &str) -> bool {
        (self.id != 0 && id == self.id) || (!self.name.is_empty() && name == self.name)
    }
}

/// Asks one member for its status and member list; `None` when it does not answer in time.
pub async fn ask(etcd: &Etcd, endpoint: &str, me: &Identity) -> Option<PeerAnswer> {
    let asked = async {
        let status = etcd.status_of(endpoint).await.ok()?;
        let members = etcd.member_list_of(endpoint).await.ok()?;
        Some(PeerAnswer {
            endpoint: endpoint.to_string(),
            has_leader: status.leader() != 0,
            lists_us: members.iter().any(|m| me.is(m.id(), m.name())),
            cluster_id: status.header().map(|h| h.cluster_id()).unwrap_or(0),
        })
    };
    tokio::time::timeout(PEER_TIMEOUT * 2, asked)
        .await
        .ok()
        .flatten()
}

/// Asks every endpoint of `peers` at once; the answers of those that answered.
pub async fn ask_all(etcd: &Etcd, peers: &[String], me: &Identity) -> Vec<PeerAnswer> {
    let answers = futures::future::join_all(peers.iter().map(|p| ask(etcd, p, me))).await;
    let answers: Vec<PeerAnswer> = answers.into_iter().flatten().collect();
    tracing::debug!(?answers, "asked the other members about this one");
    answers
}

/// Asks every endpoint of `peers` at once and judges the answers.
pub async fn check(etcd: &Etcd, peers: &[String], me: &Identity) -> Standing {
    judge(&ask_all(etcd, peers, me).await)
}

/// A client over `peers` (before the local member runs): requests go to the first and move on to the
/// next when one cannot serve; `None` without peers.
pub async fn peer_client(peers: &[String], tls: Option<TlsFiles>) -> Option<Etcd> {
    if peers.is_empty() {
        return None;
    }
    let mut cfg = EtcdConfig::new(peers.to_vec());
    cfg.connect_timeout = PEER_TIMEOUT;
    cfg.request_timeout = PEER_TIMEOUT;
    if let Some(t) = tls {
        cfg = cfg.with_tls(t);
    }
    Etcd::connect(cfg).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(endpoint: &str, has_leader: bool, lists_us: bool) -> PeerAnswer {
        PeerAnswer {
            endpoint: endpoint.into(),
            has_leader,
            lists_us,
            cluster_id: 7,
        }
    }

    fn of(cluster_id: u64, answer: PeerAnswer) -> PeerAnswer {
        PeerAnswer {
            cluster_id,
            ..answer
        }
    }

    #[test]
    fn from_inside_a_member_made_a_cluster_of_its_own_outweighs_the_ones_left_behind() {
        let cases: Vec<(Vec<PeerAnswer>, Standing)> = vec![
            // The same cluster: the plain rule.
            (vec![a("x", true, true)], Standing::Member),
            (
                vec![a("x", true, false)],
                Standing::Removed { by: "x".into() },
            ),
            (vec![a("x", false, false)], Standing::Unknown),
            // Another cluster without us, next to one left behind with us: left behind.
            (
                vec![a("x", true, true), of(9, a("y", true, false))],
                Standing::Removed { by: "y".into() },
            ),
            // Another cluster that has no leader, or that holds us, or whose id is not known: not that.
            (
                vec![a("x", true, true), of(9, a("y", false, false))],
                Standing::Member,
            ),
            (
                vec![a("x", true, true), of(9, a("y", true, true))],
                Standing::Member,
            ),
            (
                vec![a("x", true, true), of(0, a("y", true, false))],
                Standing::Member,
            ),
        ];
        for (answers, want) in cases {
            assert_eq!(judge_from_inside(&answers, 7), want, "{answers:?}");
        }
        // Our own cluster id not known: only the plain rule.
        let answers = vec![a("x", true, true), of(9, a("y", true, false))];
        assert_eq!(judge_from_inside(&answers, 0), Standing::Member);
    }

    #[test]
    fn the_verdict_follows_the_serving_members() {
        let cases: Vec<(Vec<PeerAnswer>, Standing)> = vec![
            (vec![], Standing::Unknown),
            // Members without a leader prove nothing either way.
            (
                vec![a("x", false, false), a("y", false, true)],
                Standing::Unknown,
            ),
            (vec![a("x", true, true)], Standing::Member),
            (
                vec![a("x", true, false)],
                Standing::Removed { by: "x".into() },
            ),
            (
                vec![a("x", false, true), a("y", true, false)],
                Standing::Removed { by: "y".into() },
            ),
            // One serving member that still lists us wins over one that does not.
            (
                vec![a("x", true, false), a("y", true, true)],
                Standing::Member,
            ),
        ];
        for (answers, want) in cases {
            assert_eq!(judge(&answers), want, "{answers:?}");
        }
    }

    #[test]
    fn a_removal_stands_only_when_asked_twice() {
        let removed = |by: &str| Standing::Removed { by: by.into() };
        let cases = [
            (removed("x"), removed("y"), removed("y")),
            (removed("x"), Standing::Unknown, Standing::Unknown),
            (removed("x"), Standing::Member, Standing::Member),
            (Standing::Unknown, removed("x"), Standing::Unknown),
            (Standing::Member, removed("x"), Standing::Member),
            (Standing::Unknown, Standing::Unknown, Standing::Unknown),
        ];
        for (a, b, want) in cases {
            assert_eq!(confirmed(&a, &b), want, "{a:?} then {b:?}");
        }
    }

    #[test]
    fn a_member_is_found_by_id_or_by_name() {
        let by_name = Identity {
            name: "h-00000001".into(),
            id: 0,
        };
        assert!(by_name.is(42, "h-00000001"));
        assert!(!by_name.is(42, "h-00000002"));
        assert!(!by_name.is(0, ""), "an unnamed member is nobody");
        let both = Identity {
            name: "h-00000001".into(),
            id: 7,
        };
        assert!(both.is(7, "renamed"));
        assert!(both.is(8, "h-00000001"));
        assert!(!both.is(8, "other"));
        let nameless = Identity {
            name: String::new(),
            id: 0,
        };
        assert!(!nameless.is(0, ""));
    }
}
