//! How this host arrived (a rejoin, a worker, a worker become member), as the Normal events its start
//! says, and the saying of them.

use crate::events::{EventKind, EventRecorder};
use crate::tombstone::Rejoined;

/// How this host arrived, for its events and the tombstone metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival<'a> {
    /// A worker: no local member.
    Worker,
    /// A member; `was_worker` when this data dir was a worker's until now.
    Member { name: &'a str, was_worker: bool },
}

/// A Normal event a start says, with its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrivalEvent {
    /// `Rejoined`: the tombstone that made this start rejoin.
    Rejoined(String),
    /// `JoinedAsWorker`.
    JoinedAsWorker(String),
    /// `BecameMember`: a worker's data dir now runs a member.
    BecameMember(String),
}

impl ArrivalEvent {
    pub fn message(&self) -> &str {
        match self {
            ArrivalEvent::Rejoined(m)
            | ArrivalEvent::JoinedAsWorker(m)
            | ArrivalEvent::BecameMember(m) => m,
        }
    }
}

/// The events a start says, in order: a rejoin (the tombstone that caused it), then how the host takes
/// part. Pure, so every case is a row of a table test.
pub fn arrival_events(arrival: Arrival<'_>, rejoined: Option<&Rejoined>) -> Vec<ArrivalEvent> {
    let mut out = Vec::new();
    if let Some(r) = rejoined {
        let reason = if r.reason.is_empty() {
            "no reason given"
        } else {
            &r.reason
        };
        let how = match arrival {
            Arrival::Worker => "as a worker (the voter target is full)".to_string(),
            Arrival::Member { name, .. } => format!("as member {name}"),
        };
        out.push(ArrivalEvent::Rejoined(format!(
            "tombstone ({reason}): member {} backed up to {}; rejoined through {} {how}",
            r.previous_name.as_deref().unwrap_or("?"),
            r.backup.display(),
            r.server,
        )));
    }
    match arrival {
        Arrival::Worker => out.push(ArrivalEvent::JoinedAsWorker(
            "runs no etcd member; talks to the voters".to_string(),
        )),
        Arrival::Member {
            name,
            was_worker: true,
        } => out.push(ArrivalEvent::BecameMember(format!(
            "this worker started etcd member {name} and joined the cluster"
        ))),
        Arrival::Member { .. } => {}
    }
    out
}

/// Whether a start counts a tombstone: a rejoin this process made (a resumed one was counted by the
/// process that made its backup).
pub fn counts_tombstone(rejoined: Option<&Rejoined>) -> bool {
    rejoined.is_some_and(|r| !r.resumed)
}

/// Says `arrival`'s events, then the etcd version gate's `warnings`, in order.
pub(super) async fn say(events: EventRecorder, arrival: Vec<ArrivalEvent>, warnings: Vec<String>) {
    // Each reason written out at its call: the reference's scan finds them there.
    for a in arrival {
        match a {
            ArrivalEvent::Rejoined(m) => events.node_event(EventKind::Normal, "Rejoined", m).await,
            ArrivalEvent::JoinedAsWorker(m) => {
                events
                    .node_event(EventKind::Normal, "JoinedAsWorker", m)
                    .await
            }
            ArrivalEvent::BecameMember(m) => {
                events
                    .node_event(EventKind::Normal, "BecameMember", m)
                    .await
            }
        }
    }
    for w in warnings {
        tracing::warn!("{w}");
        events
            .node_event(EventKind::Warning, "EtcdVersionWarning", w)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn rejoined(reason: &str, resumed: bool) -> Rejoined {
        Rejoined {
            backup: PathBuf::from("/d/db/member.tombstoned-1"),
            previous_name: Some("n1-a1".into()),
            reason: reason.into(),
            server: "https://10.0.0.1:10250".into(),
            resumed,
        }
    }

    #[test]
    fn arrival_events_and_the_tombstone_count_by_how_the_host_arrived() {
        let r = rejoined("disk replaced", false);
        let blank = rejoined("", true);
        let member = Arrival::Member {
            name: "n1-b2",
            was_worker: false,
        };
        let promoted = Arrival::Member {
            name: "n1-b2",
            was_worker: true,
        };
        type Row<'a> = (
            Arrival<'a>,
            Option<&'a Rejoined>,
            Vec<&'a str>,
            Option<&'a str>,
        );
        let cases: Vec<Row<'_>> = vec![
            (member, None, vec![], None),
            (promoted, None, vec!["BecameMember"], Some("this worker started etcd member n1-b2")),
            (Arrival::Worker, None, vec!["JoinedAsWorker"], Some("runs no etcd member")),
            (
                member,
                Some(&r),
                vec!["Rejoined"],
                Some("tombstone (disk replaced): member n1-a1 backed up to /d/db/member.tombstoned-1; rejoined through https://10.0.0.1:10250 as member n1-b2"),
            ),
            (
                Arrival::Worker,
                Some(&blank),
                vec!["Rejoined", "JoinedAsWorker"],
                Some("tombstone (no reason given): member n1-a1 backed up to /d/db/member.tombstoned-1; rejoined through https://10.0.0.1:10250 as a worker (the voter target is full)"),
            ),
        ];
        for (arrival, rejoined, reasons, first) in cases {
            let got = arrival_events(arrival, rejoined);
            let got_reasons: Vec<&str> = got
                .iter()
                .map(|e| match e {
                    ArrivalEvent::Rejoined(_) => "Rejoined",
                    ArrivalEvent::JoinedAsWorker(_) => "JoinedAsWorker",
                    ArrivalEvent::BecameMember(_) => "BecameMember",
                })
                .collect();
            assert_eq!(got_reasons, reasons, "{arrival:?}");
            if let Some(first) = first {
                assert!(
                    got[0].message().starts_with(first),
                    "{arrival:?}: {:?}",
                    got[0]
                );
            }
        }
        assert!(counts_tombstone(Some(&r)));
        assert!(
            !counts_tombstone(Some(&blank)),
            "a resumed rejoin was counted by its first process"
        );
        assert!(!counts_tombstone(None));
    }
}
