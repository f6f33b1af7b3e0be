//! The rolling upgrade's decisions, pure: whose turn it is and whether the cluster can lose this member
//! for a restart now. Every check fails closed: a member that does not answer is a reason to wait.

use std::collections::BTreeMap;

use crate::etcd_member::version::EtcdVersion;

/// A member as the shared member cache showed it at the look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
    /// Its status at the look; `None` when it did not answer.
    pub status: Option<MemberState>,
}

/// What a member's status said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberState {
    pub version: Option<EtcdVersion>,
    pub leader: u64,
    pub raft_index: u64,
}

/// A member whose raft index is this far behind the leader's counts as caught up: a busy cluster moves
/// on between the two answers of one look.
pub const CAUGHT_UP_LAG: u64 = 1000;

/// A member's upgrade record, as far as the turn needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordView {
    /// Its agent has a new binary waiting to be rolled in (or is restarting on it).
    pub waits: bool,
    /// The release it runs, as its agent last wrote.
    pub running: Option<EtcdVersion>,
}

/// What one look saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub local_id: u64,
    pub members: Vec<MemberView>,
    /// Member name → what its agent's upgrade record says.
    pub records: BTreeMap<String, RecordView>,
    /// Alarms raised on any member (as text).
    pub alarms: Vec<String>,
    /// `--etcd-allow-single-member-upgrade`.
    pub allow_small: bool,
    /// How long ago this agent noticed its binary change.
    pub since_noticed: std::time::Duration,
    /// How long every agent may take to notice a change of its own binary (one look's interval and some):
    /// a leader that noticed a package upgrade first gives the others this long to say they have one too.
    pub notice_window: std::time::Duration,
}

impl Observation {
    fn voters(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| !m.is_learner)
    }

    fn local(&self) -> Option<&MemberView> {
        self.members.iter().find(|m| m.id == self.local_id)
    }

    /// The leader as the members that answered name it (0 when none does).
    pub fn leader(&self) -> u64 {
        self.members
            .iter()
            .filter_map(|m| m.status.map(|s| s.leader))
            .find(|l| *l != 0)
            .unwrap_or(0)
    }

    pub fn local_leads(&self) -> bool {
        self.leader() == self.local_id && self.local_id != 0
    }
}

/// Whether this member may go now, before the lock is even asked for (`new`: the release its binary holds).
/// The leader goes last: it waits while another voter's agent has a binary waiting and, until every other
/// voter runs `new`, for one notice window after its own notice (the others' agents may not have looked
/// at their binaries yet).
pub fn turn(obs: &Observation, new: EtcdVersion) -> Result<(), String> {
    if !obs.local_leads() {
        return Ok(());
    }
    let others: Vec<&MemberView> = obs.voters().filter(|m| m.id != obs.local_id).collect();
    let record = |m: &MemberView| obs.records.get(&m.name).copied().unwrap_or_default();
    let waiting: Vec<&str> = others
        .iter()
        .filter(|m| record(m).waits)
        .map(|m| m.name.as_str())
        .collect();
    if !waiting.is_empty() {
        return Err(format!(
            "this member leads and goes last: waiting for {} to upgrade first",
            waiting.join(", ")
        ));
    }
    let on_new = |m: &MemberView| {
        record(m).running == Some(new) || m.status.and_then(|s| s.version) == Some(new)
    };
    if obs.since_noticed < obs.notice_window && !others.iter().all(|m| on_new(m)) {
        return Err(format!(
            "this member leads and goes last: giving the other voters' agents {} to notice a new binary too",
            humantime::format_duration(obs.notice_window)
        ));
    }
    Ok(())
}

/// The checks before this member may be restarted (taken under the maintenance lock): enough voters,
/// every voter started and answering, no alarm, no learner, this member and every other voter caught up
/// with the leader.
pub fn ready_to_restart(obs: &Observation) -> Result<(), String> {
    let voters: Vec<&MemberView> = obs.voters().collect();
    if voters.len() < 3 && !obs.allow_small {
        return Err(format!(
            "only {} voter(s): a restart would stop the cluster (at least 3 are needed, or \
             --etcd-allow-single-member-upgrade)",
            voters.len()
        ));
    }
    if let Some(l) = obs.members.iter().find(|m| m.is_learner) {
        return Err(format!(
            "a learner ({}) is catching up: waiting until it is promoted or gone",
            l.name
        ));
    }
    let silent: Vec<&str> = voters
        .iter()
        .filter(|m| m.status.is_none() || m.name.is_empty())
        .map(|m| {
            if m.name.is_empty() {
                "an unstarted member"
            } else {
                m.name.as_str()
            }
        })
        .collect();
    if !silent.is_empty() {
        return Err(format!(
            "{} did not answer: every voter must serve before one restarts",
            silent.join(", ")
        ));
    }
    if !obs.alarms.is_empty() {
        return Err(format!("alarm raised: {}", obs.alarms.join(", ")));
    }
    let leader = obs.leader();
    let Some(lead) = voters.iter().find(|m| m.id == leader && leader != 0) else {
        return Err("no member names a leader".into());
    };
    let (Some(local), Some(lead_state)) = (obs.local(), lead.status) else {
        return Err("this member did not answer".into());
    };
    let Some(local_state) = local.status else {
        return Err("this member did not answer".into());
    };
    if local_state.raft_index + CAUGHT_UP_LAG < lead_state.raft_index {
        return Err(format!(
            "this member is behind the leader (raft index {} against {})",
            local_state.raft_index, lead_state.raft_index
        ));
    }
    // Another voter still catching up (one restarted a moment ago, whose turn gave up waiting for it)
    // acknowledges no new entry: restarting this one then could leave the leader without a quorum.
    let behind: Vec<String> = voters
        .iter()
        .filter_map(|m| Some((m, m.status?.raft_index)))
        .filter(|(_, index)| index + CAUGHT_UP_LAG < lead_state.raft_index)
        .map(|(m, index)| format!("{} (raft index {index})", m.name))
        .collect();
    if !behind.is_empty() {
        return Err(format!(
            "{} behind the leader (raft index {}): every voter must be caught up before one restarts",
            behind.join(", "),
            lead_state.raft_index
        ));
    }
    Ok(())
}

/// Where leadership goes before the leader restarts: a voter that answered, on `new` if one runs it (it
/// will not be restarted again), else the one with the highest raft index.
pub fn leader_target(obs: &Observation, new: EtcdVersion) -> Option<u64> {
    obs.voters()
        .filter(|m| m.id != obs.local_id)
        .filter_map(|m| m.status.map(|s| (m, s)))
        .max_by_key(|(m, s)| {
            (
                s.version == Some(new),
                s.raft_index,
                std::cmp::Reverse(m.id),
            )
        })
        .map(|(m, _)| m.id)
}

/// Whether this member serves again after its restart: it runs `new`, knows a leader, and is caught up.
pub fn back(obs: &Observation, new: EtcdVersion) -> Result<(), String> {
    let Some(local) = obs.local() else {
        return Err("this member is not in the member list".into());
    };
    let Some(s) = local.status else {
        return Err("this member does not answer yet".into());
    };
    if s.version != Some(new) {
        return Err(format!(
            "this member reports etcd {}, not {new}",
            s.version
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into())
        ));
    }
    if s.leader == 0 {
        return Err("this member knows no leader yet".into());
    }
    let lead = obs
        .members
        .iter()
        .find(|m| m.id == s.leader)
        .and_then(|m| m.status);
    match lead {
        Some(l) if s.raft_index + CAUGHT_UP_LAG >= l.raft_index => Ok(()),
        Some(l) => Err(format!(
            "this member is catching up (raft index {} against {})",
            s.raft_index, l.raft_index
        )),
        None => Err("the leader did not answer".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> EtcdVersion {
        EtcdVersion::parse(s).unwrap()
    }

    fn member(id: u64, leader: u64, index: u64, version: &str) -> MemberView {
        MemberView {
            id,
            name: format!("m{id}"),
            is_learner: false,
            status: Some(MemberState {
                version: Some(v(version)),
                leader,
                raft_index: index,
            }),
        }
    }

    fn three(local: u64, leader: u64) -> Observation {
        Observation {
            local_id: local,
            members: (1..=3).map(|i| member(i, leader, 100, "3.4.23")).collect(),
            records: BTreeMap::new(),
            alarms: Vec::new(),
            allow_small: false,
            since_noticed: std::time::Duration::from_secs(60),
            notice_window: std::time::Duration::from_secs(35),
        }
    }

    fn record(waits: bool, running: &str) -> RecordView {
        RecordView {
            waits,
            running: Some(v(running)),
        }
    }

    #[test]
    fn the_leader_waits_while_another_voter_has_a_binary_waiting() {
        let new = v("3.5.1");
        let mut obs = three(1, 1);
        obs.records.insert("m1".into(), record(true, "3.4.23"));
        obs.records.insert("m2".into(), record(true, "3.4.23"));
        obs.records.insert("m3".into(), record(false, "3.4.23"));
        let e = turn(&obs, new).unwrap_err();
        assert!(e.contains("m2") && !e.contains("m3"), "{e}");
        obs.records.insert("m2".into(), record(false, "3.5.1"));
        assert_eq!(turn(&obs, new), Ok(()));
        // Before the others had a look of their own, the leader waits even with nobody waiting...
        obs.since_noticed = std::time::Duration::from_secs(10);
        assert!(turn(&obs, new).unwrap_err().contains("to notice"));
        // ...unless every other voter already runs the new release (its record or its status says so).
        obs.members[2].status.as_mut().unwrap().version = Some(new);
        assert_eq!(turn(&obs, new), Ok(()));
        // A follower goes whatever the others wait for.
        let mut f = three(2, 1);
        f.since_noticed = std::time::Duration::ZERO;
        f.records.insert("m3".into(), record(true, "3.4.23"));
        assert_eq!(turn(&f, new), Ok(()));
    }

    #[test]
    fn a_restart_waits_for_every_check_and_fails_closed() {
        type Change = fn(&mut Observation);
        let table: &[(&str, Change, Option<&str>)] = &[
            ("all well", |_| {}, None),
            (
                "two voters",
                |o| {
                    o.members.pop();
                },
                Some("only 2 voter(s)"),
            ),
            (
                "two voters, allowed",
                |o| {
                    o.members.pop();
                    o.allow_small = true;
                },
                None,
            ),
            (
                "a learner",
                |o| {
                    let mut l = member(4, 1, 100, "3.4.23");
                    l.is_learner = true;
                    o.members.push(l);
                },
                Some("learner (m4)"),
            ),
            (
                "a silent voter",
                |o| o.members[2].status = None,
                Some("m3 did not answer"),
            ),
            (
                "an unstarted voter",
                |o| o.members[2].name.clear(),
                Some("unstarted"),
            ),
            (
                "an alarm",
                |o| o.alarms.push("NOSPACE on m2".into()),
                Some("alarm raised: NOSPACE"),
            ),
            (
                "no leader",
                |o| {
                    for m in &mut o.members {
                        if let Some(s) = &mut m.status {
                            s.leader = 0;
                        }
                    }
                },
                Some("no member names a leader"),
            ),
            (
                "local behind",
                |o| {
                    if let Some(s) = &mut o.members[0].status {
                        s.raft_index = 100;
                    }
                    if let Some(s) = &mut o.members[1].status {
                        s.raft_index = 100 + CAUGHT_UP_LAG + 1;
                    }
                },
                Some("behind the leader"),
            ),
            (
                "another voter behind",
                |o| {
                    if let Some(s) = &mut o.members[2].status {
                        s.raft_index = 100;
                    }
                    for i in 0..2 {
                        if let Some(s) = &mut o.members[i].status {
                            s.raft_index = 100 + CAUGHT_UP_LAG + 1;
                        }
                    }
                },
                Some("m3 (raft index 100) behind the leader"),
            ),
        ];
        for (what, change, want) in table {
            let mut obs = three(1, 2);
            change(&mut obs);
            match (ready_to_restart(&obs), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{what}: {e}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn leadership_goes_to_a_member_already_on_the_new_release() {
        let mut obs = three(1, 1);
        obs.members[1].status.as_mut().unwrap().raft_index = 200;
        obs.members[2].status.as_mut().unwrap().version = Some(v("3.5.1"));
        assert_eq!(leader_target(&obs, v("3.5.1")), Some(3));
        // None on the new release: the most caught-up one.
        assert_eq!(leader_target(&obs, v("3.6.0")), Some(2));
        // Silent members are not candidates.
        obs.members[1].status = None;
        obs.members[2].status = None;
        assert_eq!(leader_target(&obs, v("3.5.1")), None);
    }

    #[test]
    fn a_member_is_back_once_it_runs_the_new_release_and_caught_up() {
        let new = v("3.5.1");
        let mut obs = three(1, 2);
        assert!(back(&obs, new).unwrap_err().contains("3.4.23"));
        obs.members[0].status.as_mut().unwrap().version = Some(new);
        assert_eq!(back(&obs, new), Ok(()));
        obs.members[1].status.as_mut().unwrap().raft_index = 100 + CAUGHT_UP_LAG + 1;
        assert!(back(&obs, new).unwrap_err().contains("catching up"));
        obs.members[0].status = None;
        assert!(back(&obs, new).unwrap_err().contains("does not answer"));
    }
}
