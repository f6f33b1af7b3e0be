//! `hostlet etcd members`: one row per etcd member, gathered from the member list, each member's status,
//! the node records and the learner progress record.

use std::time::{Duration, SystemTime};

use hostlet_api::objects::{LearnerProgress, LearnerRecord, NodeInfo};
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError, Member};
use serde::Serialize;

use super::plan::is_node_member;

/// How long one member's status may take before its row shows it as unreachable.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// One member, as `hostlet etcd members` shows it (`-o json` prints these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRow {
    /// Empty until the member has started once.
    pub name: String,
    /// Hex, as etcd prints it.
    pub id: String,
    /// `voter` or `learner`.
    pub role: String,
    /// The node whose record names this member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub peer_url: String,
    pub client_url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db_size: Option<i64>,
    pub leader: bool,
    /// Why the member's status is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_error: Option<String>,
    /// The learner manager's record, while it is a learner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learner_progress: Option<LearnerRecord>,
}

/// The table's columns, in the order of [`MemberRow::cells`].
pub const MEMBER_TABLE_HEADER: [&str; 10] = [
    "NAME",
    "ID",
    "ROLE",
    "NODE",
    "PEER URL",
    "CLIENT URL",
    "APPLIED",
    "DB SIZE",
    "LEADER",
    "PROGRESS",
];

impl MemberRow {
    /// The row's cells for the table; `now` ages the learner progress.
    pub fn cells(&self, now: SystemTime) -> Vec<String> {
        let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".to_string());
        vec![
            if self.name.is_empty() {
                "(not started)".to_string()
            } else {
                self.name.clone()
            },
            self.id.clone(),
            self.role.clone(),
            or_dash(self.node.clone()),
            or_dash(Some(self.peer_url.clone()).filter(|s| !s.is_empty())),
            or_dash(Some(self.client_url.clone()).filter(|s| !s.is_empty())),
            or_dash(self.applied_index.map(|i| i.to_string())),
            or_dash(self.db_size.map(|b| human_size(b.max(0) as u64))),
            if self.leader { "*" } else { "" }.to_string(),
            or_dash(
                self.learner_progress
                    .as_ref()
                    .map(|p| progress_summary(p, now)),
            ),
        ]
    }
}

/// `applied 1234, 60.0 MiB sent, receiving a snapshot, last progress 3s ago`.
pub fn progress_summary(p: &LearnerRecord, now: SystemTime) -> String {
    let ago = now
        .duration_since(p.last_progress.0)
        .map(|d| Duration::from_secs(d.as_secs()))
        .unwrap_or_default();
    let mut s = format!("applied {}", p.applied_index);
    if p.bytes_sent > 0 {
        s.push_str(&format!(", {} sent", human_size(p.bytes_sent)));
    }
    if p.receiving_snapshot {
        s.push_str(", receiving a snapshot");
    }
    s.push_str(&format!(
        ", last progress {} ago",
        humantime::format_duration(ago)
    ));
    s
}

/// A size for people: `1.5 MiB`.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Gathers the rows: members in `member_list` order, each member's status asked concurrently (a member
/// that does not answer gets a row all the same, with the reason).
pub async fn gather_member_rows(
    etcd: &Etcd,
    keys: &KeyLayout,
) -> Result<Vec<MemberRow>, EtcdError> {
    let members: Vec<Member> = etcd.member_list().await?.iter().map(Member::from).collect();
    let (node_kvs, _) = etcd.get_prefix(keys.nodes_prefix()).await?;
    let nodes: Vec<NodeInfo> = node_kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    let progress: LearnerProgress = etcd
        .get(keys.learner_progress())
        .await?
        .and_then(|kv| serde_json::from_slice(kv.value()).ok())
        .unwrap_or_default();
    let statuses = futures::future::join_all(members.iter().map(|m| async {
        let url = m.client_urls.first()?;
        Some(
            match tokio::time::timeout(STATUS_TIMEOUT, etcd.status_of(url)).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("status timed out".to_string()),
            },
        )
    }))
    .await;
    let leader = statuses
        .iter()
        .flatten()
        .filter_map(|s| s.as_ref().ok())
        .map(|s| s.leader())
        .find(|l| *l != 0)
        .unwrap_or(0);
    Ok(members
        .iter()
        .zip(statuses)
        .map(|(m, status)| {
            let id = format!("{:x}", m.id);
            let (applied_index, db_size, status_error) = match status {
                Some(Ok(s)) => (Some(s.raft_applied_index()), Some(s.db_size()), None),
                Some(Err(e)) => (None, None, Some(e)),
                None => (None, None, Some("not started".to_string())),
            };
            MemberRow {
                name: m.name.clone(),
                role: if m.is_learner { "learner" } else { "voter" }.to_string(),
                node: nodes
                    .iter()
                    .find(|n| {
                        is_node_member(n, m)
                            // Not started yet: its node record is all that names it.
                            || (m.name.is_empty()
                                && n.peer_url.as_deref().is_some_and(|p| m.has_peer_url(p)))
                    })
                    .map(|n| n.name.clone()),
                peer_url: m.peer_urls.first().cloned().unwrap_or_default(),
                client_url: m.client_urls.first().cloned().unwrap_or_default(),
                applied_index,
                db_size,
                leader: leader != 0 && m.id == leader,
                status_error,
                learner_progress: if m.is_learner {
                    progress.learners.get(&id).cloned()
                } else {
                    None
                },
                id,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlet_api::objects::Timestamp;

    #[test]
    fn cells_line_up_with_the_header_and_show_the_gaps() {
        let row = MemberRow {
            name: String::new(),
            id: "8e9e05c52164694d".into(),
            role: "learner".into(),
            node: None,
            peer_url: "https://10.0.0.4:2380".into(),
            client_url: String::new(),
            applied_index: None,
            db_size: None,
            leader: false,
            status_error: Some("not started".into()),
            learner_progress: Some(LearnerRecord {
                name: String::new(),
                added: Timestamp::from_unix(100),
                applied_index: 42,
                snapshot_bytes_received: 0,
                last_progress: Timestamp::from_unix(100),
                bytes_sent: 3 * 1024 * 1024,
                receiving_snapshot: true,
            }),
        };
        let cells = row.cells(Timestamp::from_unix(107).0);
        assert_eq!(cells.len(), MEMBER_TABLE_HEADER.len());
        assert_eq!(cells[0], "(not started)");
        assert_eq!(cells[5], "-");
        assert_eq!(
            cells[9],
            "applied 42, 3.0 MiB sent, receiving a snapshot, last progress 7s ago"
        );
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(json["learnerProgress"]["appliedIndex"], 42);
        assert!(json.get("node").is_none());
    }
}
