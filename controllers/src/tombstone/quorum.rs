//! Whether the other members this member knows are unable to form a quorum with it: the one question a
//! cluster reset must answer first. A reset on a cluster that still works founds a second cluster from one
//! member's data while the others go on, so the judgement fails closed: a reset goes ahead only when every
//! known member is shown to be down (its host refuses the connection, every time it is asked, over a span
//! of several election timeouts) or was named lost on purpose by the operator. A member that answers at
//! all, and a member that stays silent (a timeout proves nothing: a partition, a paused process, a busy
//! host), refuse it.

use std::time::Duration;

use hostlet_runtime::Etcd;

use super::standing::{self, Identity};

/// One ask of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// It answered with its member list, which holds this member.
    Lists { leader: bool },
    /// It answered with a member list without this member.
    Omits { leader: bool },
    /// It answered that it has no leader (an election under way, or no quorum among the ones it reaches).
    NoLeader,
    /// Its host refused the connection: nothing listens there.
    Refused,
    /// No answer in time, or an error that says nothing about the member (`why` is for the operator).
    Silent { why: String },
}

/// What was heard from one member over the whole wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRecord {
    /// Its client URL, as this member knows it.
    pub endpoint: String,
    pub probes: Vec<Probe>,
    /// The operator named it lost (`--cluster-reset-lost`): its silence is accepted, an answer is not.
    pub named_lost: bool,
}

/// Why a reset may not go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A member answered with a member list that holds this one.
    Holds { by: String, leader: bool },
    /// A member serves a cluster that no longer holds this one: this member was removed (or left behind),
    /// and rejoins by starting normally.
    MovedOn { by: String },
    /// A member answers without a leader: it is alive and may form a quorum again.
    Alive { by: String },
    /// These members could not be shown down: (endpoint, what was heard).
    Unsettled { peers: Vec<(String, String)> },
}

/// The verdict of [`judge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every known member is down or named lost.
    Proceed,
    Refuse(Refusal),
}

/// Judges what was heard. `rounds` is how many times every member must have been found refusing
/// connections to count as down. An answer of any kind refuses at once, whatever else was heard.
pub fn judge(peers: &[PeerRecord], rounds: usize) -> Verdict {
    let any = |f: &dyn Fn(&Probe) -> bool| {
        peers
            .iter()
            .find(|p| p.probes.iter().any(f))
            .map(|p| p.endpoint.clone())
    };
    if let Some(by) = any(&|p| matches!(p, Probe::Lists { leader: true })) {
        return Verdict::Refuse(Refusal::Holds { by, leader: true });
    }
    if let Some(by) = any(&|p| matches!(p, Probe::Lists { leader: false })) {
        return Verdict::Refuse(Refusal::Holds { by, leader: false });
    }
    if let Some(by) = any(&|p| matches!(p, Probe::Omits { leader: true })) {
        return Verdict::Refuse(Refusal::MovedOn { by });
    }
    if let Some(by) = any(&|p| matches!(p, Probe::NoLeader | Probe::Omits { leader: false })) {
        return Verdict::Refuse(Refusal::Alive { by });
    }
    let unsettled: Vec<(String, String)> = peers
        .iter()
        .filter(|p| {
            let down = p.probes.len() >= rounds && p.probes.iter().all(|x| *x == Probe::Refused);
            !down && !p.named_lost
        })
        .map(|p| (p.endpoint.clone(), heard(&p.probes)))
        .collect();
    if unsettled.is_empty() {
        Verdict::Proceed
    } else {
        Verdict::Refuse(Refusal::Unsettled { peers: unsettled })
    }
}

/// What was heard from one member, briefly.
fn heard(probes: &[Probe]) -> String {
    let refused = probes.iter().filter(|p| **p == Probe::Refused).count();
    let silent: Vec<&str> = probes
        .iter()
        .filter_map(|p| match p {
            Probe::Silent { why } => Some(why.as_str()),
            _ => None,
        })
        .collect();
    match silent.last() {
        None => format!("refused {refused} of {} asks", probes.len()),
        Some(why) => format!(
            "no answer to {} of {} asks ({why})",
            silent.len(),
            probes.len()
        ),
    }
}

/// How the members are asked: every `interval`, for at least `span` and at least `rounds` rounds.
#[derive(Debug, Clone, Copy)]
pub struct Asking {
    pub interval: Duration,
    pub span: Duration,
    pub rounds: usize,
}

impl Default for Asking {
    /// Five seconds: five of etcd's default election timeouts, so a member in the middle of an election,
    /// or restarting, has answered by then.
    fn default() -> Self {
        Asking {
            interval: Duration::from_millis(500),
            span: Duration::from_secs(5),
            rounds: 5,
        }
    }
}

/// Asks one member once.
pub async fn probe(etcd: &Etcd, endpoint: &str, me: &Identity) -> Probe {
    let asked = async {
        let status = etcd.status_of(endpoint).await?;
        let members = etcd.member_list_of(endpoint).await?;
        let lists = members.iter().any(|m| me.is(m.id(), m.name()));
        let leader = status.leader() != 0;
        Ok::<Probe, hostlet_runtime::EtcdError>(if lists {
            Probe::Lists { leader }
        } else {
            Probe::Omits { leader }
        })
    };
    match tokio::time::timeout(standing::PEER_TIMEOUT * 2, asked).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) if e.is_connection_refused() => Probe::Refused,
        Ok(Err(e)) if e.server_message().is_some_and(|m| m.contains("no leader")) => {
            Probe::NoLeader
        }
        Ok(Err(e)) => Probe::Silent { why: e.to_string() },
        Err(_) => Probe::Silent {
            why: format!("no answer within {:?}", standing::PEER_TIMEOUT * 2),
        },
    }
}

/// Asks every member in `peers` until [`judge`] refuses, or until the span is over; the verdict.
pub async fn ask_until_settled(
    etcd: &Etcd,
    peers: &[String],
    lost: &[String],
    me: &Identity,
    asking: Asking,
) -> Verdict {
    let mut records: Vec<PeerRecord> = peers
        .iter()
        .map(|p| PeerRecord {
            endpoint: p.clone(),
            probes: Vec::new(),
            named_lost: named(lost, p),
        })
        .collect();
    let start = tokio::time::Instant::now();
    let mut round = 0;
    loop {
        let probes = futures::future::join_all(peers.iter().map(|p| probe(etcd, p, me))).await;
        for (r, p) in records.iter_mut().zip(probes) {
            r.probes.push(p);
        }
        round += 1;
        let verdict = judge(&records, asking.rounds);
        tracing::debug!(
            round,
            ?records,
            ?verdict,
            "asked the other members before a reset"
        );
        if matches!(verdict, Verdict::Refuse(ref r) if !matches!(r, Refusal::Unsettled { .. })) {
            return verdict;
        }
        if round >= asking.rounds && start.elapsed() >= asking.span {
            return verdict;
        }
        tokio::time::sleep(asking.interval).await;
    }
}

/// Whether `endpoint` is among the members the operator named lost (`all` names every one).
pub fn named(lost: &[String], endpoint: &str) -> bool {
    let norm = |s: &str| s.trim().trim_end_matches('/').to_string();
    lost.iter()
        .any(|l| l.trim() == "all" || norm(l) == norm(endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(endpoint: &str, probes: Vec<Probe>) -> PeerRecord {
        PeerRecord {
            endpoint: endpoint.into(),
            probes,
            named_lost: false,
        }
    }

    fn silent() -> Probe {
        Probe::Silent {
            why: "no answer within 4s".into(),
        }
    }

    fn refused(n: usize) -> Vec<Probe> {
        vec![Probe::Refused; n]
    }

    #[test]
    fn a_reset_goes_ahead_only_when_every_member_is_shown_down() {
        use Probe::*;
        let unsettled = |v: &Verdict| matches!(v, Verdict::Refuse(Refusal::Unsettled { .. }));
        type Check = Box<dyn Fn(&Verdict) -> bool>;
        let cases: Vec<(&str, Vec<PeerRecord>, Check)> = vec![
            (
                "both peers refuse every ask",
                vec![rec("a", refused(5)), rec("b", refused(5))],
                Box::new(|v| *v == Verdict::Proceed),
            ),
            (
                "not asked often enough yet",
                vec![rec("a", refused(4)), rec("b", refused(5))],
                Box::new(unsettled),
            ),
            (
                "a leader that lists us",
                vec![rec("a", refused(5)), rec("b", vec![Lists { leader: true }])],
                Box::new(|v| {
                    *v == Verdict::Refuse(Refusal::Holds {
                        by: "b".into(),
                        leader: true,
                    })
                }),
            ),
            (
                "a member in an election that lists us",
                vec![rec("a", vec![Refused, Lists { leader: false }, Refused])],
                Box::new(|v| {
                    *v == Verdict::Refuse(Refusal::Holds {
                        by: "a".into(),
                        leader: false,
                    })
                }),
            ),
            (
                "a member that only says it has no leader",
                vec![rec("a", refused(5)), rec("b", vec![NoLeader, Refused])],
                Box::new(|v| *v == Verdict::Refuse(Refusal::Alive { by: "b".into() })),
            ),
            (
                "a cluster that went on without us",
                vec![rec("a", vec![Omits { leader: true }])],
                Box::new(|v| *v == Verdict::Refuse(Refusal::MovedOn { by: "a".into() })),
            ),
            (
                "silence is not proof",
                vec![rec("a", refused(5)), rec("b", vec![silent(); 5])],
                Box::new(unsettled),
            ),
            (
                "refused, then silent: inconsistent",
                vec![rec("a", vec![Refused, Refused, silent(), Refused, Refused])],
                Box::new(unsettled),
            ),
            (
                "a holder outweighs any number of down members",
                vec![
                    rec("a", refused(9)),
                    rec("b", refused(9)),
                    rec("c", vec![Refused, Lists { leader: false }]),
                ],
                Box::new(|v| matches!(v, Verdict::Refuse(Refusal::Holds { .. }))),
            ),
            (
                "no other member at all",
                vec![],
                Box::new(|v| *v == Verdict::Proceed),
            ),
        ];
        for (what, records, ok) in cases {
            let v = judge(&records, 5);
            assert!(ok(&v), "{what}: {v:?}");
        }
    }

    #[test]
    fn a_member_named_lost_may_be_silent_but_not_answer() {
        let mut b = rec("b", vec![silent(); 5]);
        b.named_lost = true;
        assert_eq!(
            judge(&[rec("a", refused(5)), b.clone()], 5),
            Verdict::Proceed
        );
        b.probes.push(Probe::Lists { leader: false });
        assert!(matches!(
            judge(&[b], 5),
            Verdict::Refuse(Refusal::Holds { .. })
        ));
    }

    #[test]
    fn members_are_named_by_url_or_all() {
        let lost = vec!["https://10.0.0.2:2379/".to_string()];
        assert!(named(&lost, "https://10.0.0.2:2379"));
        assert!(!named(&lost, "https://10.0.0.3:2379"));
        assert!(named(&["all".to_string()], "https://10.0.0.3:2379"));
        assert!(!named(&[], "https://10.0.0.3:2379"));
    }

    #[test]
    fn what_was_heard_is_told() {
        assert_eq!(heard(&refused(3)), "refused 3 of 3 asks");
        assert_eq!(
            heard(&[Probe::Refused, silent()]),
            "no answer to 1 of 2 asks (no answer within 4s)"
        );
    }
}
