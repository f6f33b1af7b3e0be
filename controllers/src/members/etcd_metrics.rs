//! The few lines of a member's `/metrics` that tell whether a raft snapshot is reaching it.
//!
//! A learner far behind gets the whole database as one raft snapshot; while it streams in, the learner's
//! applied index stands still. etcd 3.4 counts the snapshot's bytes into
//! `etcd_network_peer_received_bytes_total` only once the whole file is saved, but it raises
//! `etcd_network_snapshot_receive_inflights_total` for the duration, and the peer byte counter keeps moving
//! with the leader's messages while the link is alive. Together they tell a transfer in progress from a
//! learner that is gone.

/// A member's peer traffic as its metrics report it (sums over the `From` label).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    /// `etcd_network_peer_received_bytes_total`.
    pub received_bytes: u64,
    /// `etcd_network_snapshot_receive_inflights_total`: snapshots being received now.
    pub snapshots_in_flight: u64,
    /// `etcd_network_snapshot_receive_success`: snapshots received and saved.
    pub snapshots_received: u64,
}

impl PeerTraffic {
    /// Reads the Prometheus text format; absent series count as 0, unreadable lines are skipped.
    pub fn parse(text: &str) -> PeerTraffic {
        let mut t = PeerTraffic::default();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            let Ok(v) = value.trim().parse::<f64>() else {
                continue;
            };
            if !v.is_finite() || v < 0.0 {
                continue;
            }
            let v = v as u64;
            match name {
                "etcd_network_peer_received_bytes_total" => t.received_bytes += v,
                "etcd_network_snapshot_receive_inflights_total" => t.snapshots_in_flight += v,
                "etcd_network_snapshot_receive_success" => t.snapshots_received += v,
                _ => {}
            }
        }
        t
    }

    /// A raft snapshot is streaming in now.
    pub fn receiving_snapshot(&self) -> bool {
        self.snapshots_in_flight > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as etcd 3.4.23 writes them during a snapshot transfer.
    const DURING: &str = r#"# HELP etcd_network_peer_received_bytes_total The total number of bytes received from peers.
# TYPE etcd_network_peer_received_bytes_total counter
etcd_network_peer_received_bytes_total{From="0"} 360
etcd_network_peer_received_bytes_total{From="bdae9bbc11dd390d"} 6.5089088e+07
# TYPE etcd_network_snapshot_receive_inflights_total gauge
etcd_network_snapshot_receive_inflights_total{From="bdae9bbc11dd390d"} 1
etcd_network_snapshot_receive_success{From="bdae9bbc11dd390d"} 2
etcd_network_snapshot_receive_total_duration_seconds_bucket{From="bdae9bbc11dd390d",le="0.1"} 1
etcd_server_apply_duration_seconds_sum NaN
"#;

    #[test]
    fn sums_over_peers_and_reads_exponents() {
        let t = PeerTraffic::parse(DURING);
        assert_eq!(
            t,
            PeerTraffic {
                received_bytes: 65_089_448,
                snapshots_in_flight: 1,
                snapshots_received: 2,
            }
        );
        assert!(t.receiving_snapshot());
    }

    #[test]
    fn missing_series_and_garbage_read_as_zero() {
        assert_eq!(PeerTraffic::parse(""), PeerTraffic::default());
        assert_eq!(
            PeerTraffic::parse("etcd_network_peer_received_bytes_total{From=\"a\"} x\nnonsense"),
            PeerTraffic::default()
        );
    }
}
