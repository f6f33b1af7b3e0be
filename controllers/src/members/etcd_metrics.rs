//! The few lines of the leader's `/metrics` that tell whether a learner is catching up.
//!
//! A joining learner serves no client request — neither status nor `/metrics` — until it has applied the
//! entry that publishes its name, which comes after everything it has to catch up on (etcd 3.4). Its own
//! figures are therefore out of reach exactly while they matter. The leader's are not: it counts the bytes it
//! sends each peer (`etcd_network_peer_sent_bytes_total{To}`), and the raft snapshots it is sending
//! (`etcd_network_snapshot_send_inflights_total{To}`; the snapshot's bytes are counted once it is sent
//! whole). An idle but connected learner still gets heartbeats, about 0.5 KiB/s.

/// What the leader's metrics say about one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SentToPeer {
    /// `etcd_network_peer_sent_bytes_total{To=<peer>}`.
    pub bytes: u64,
    /// `etcd_network_snapshot_send_inflights_total{To=<peer>}`: raft snapshots being sent now.
    pub snapshots_in_flight: u64,
}

impl SentToPeer {
    /// Reads the Prometheus text format for peer `peer_hex` (the member id as etcd prints it); absent
    /// series count as 0, unreadable lines are skipped.
    pub fn parse(text: &str, peer_hex: &str) -> SentToPeer {
        let label = format!("To=\"{peer_hex}\"");
        let mut s = SentToPeer::default();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some((name, labels)) = series.split_once('{') else {
                continue;
            };
            if !labels.split(',').any(|l| l.trim_end_matches('}') == label) {
                continue;
            }
            let Ok(v) = value.trim().parse::<f64>() else {
                continue;
            };
            if !v.is_finite() || v < 0.0 {
                continue;
            }
            match name {
                "etcd_network_peer_sent_bytes_total" => s.bytes = v as u64,
                "etcd_network_snapshot_send_inflights_total" => s.snapshots_in_flight = v as u64,
                _ => {}
            }
        }
        s
    }

    /// A raft snapshot is on its way to the peer now.
    pub fn sending_snapshot(&self) -> bool {
        self.snapshots_in_flight > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as etcd 3.4.23 writes them on a leader sending a snapshot to 3ee2cb9dedfe1841.
    const LEADER: &str = r#"# HELP etcd_network_peer_sent_bytes_total The total number of bytes sent to peers.
# TYPE etcd_network_peer_sent_bytes_total counter
etcd_network_peer_sent_bytes_total{To="3ee2cb9dedfe1841"} 6.1469124e+07
etcd_network_peer_sent_bytes_total{To="8e9e05c52164694d"} 1987
# TYPE etcd_network_snapshot_send_inflights_total gauge
etcd_network_snapshot_send_inflights_total{To="3ee2cb9dedfe1841"} 1
etcd_network_snapshot_send_success{To="3ee2cb9dedfe1841"} 2
etcd_server_apply_duration_seconds_sum NaN
"#;

    #[test]
    fn reads_the_peers_series_only() {
        let s = SentToPeer::parse(LEADER, "3ee2cb9dedfe1841");
        assert_eq!(
            s,
            SentToPeer {
                bytes: 61_469_124,
                snapshots_in_flight: 1,
            }
        );
        assert!(s.sending_snapshot());
        let other = SentToPeer::parse(LEADER, "8e9e05c52164694d");
        assert_eq!(other.bytes, 1987);
        assert!(!other.sending_snapshot());
    }

    #[test]
    fn missing_series_and_garbage_read_as_zero() {
        assert_eq!(SentToPeer::parse("", "a"), SentToPeer::default());
        assert_eq!(
            SentToPeer::parse(
                "etcd_network_peer_sent_bytes_total{To=\"a\"} x\nnonsense\netcd_network_peer_sent_bytes_total{To=\"ab\"} 5",
                "a"
            ),
            SentToPeer::default()
        );
    }
}
