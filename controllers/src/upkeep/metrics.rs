//! The upkeep controller's metrics, registered in the agent's shared registry.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// `result` label values of the counters.
pub const RESULTS: [&str; 2] = ["success", "failure"];
/// `type` label values of `hostlet_etcd_alarms`.
pub const ALARM_TYPES: [&str; 2] = ["NOSPACE", "CORRUPT"];

#[derive(Debug, Clone)]
pub struct UpkeepMetrics {
    /// `hostlet_etcd_db_size_bytes{member}`, shared with the member's own metrics (which register it).
    pub db_size: IntGaugeVec,
    pub db_in_use: IntGaugeVec,
    pub quota: Gauge,
    pub alarms: IntGaugeVec,
    pub defrag_total: IntCounterVec,
    pub defrag_duration: Histogram,
    pub compactions_total: IntCounterVec,
    /// 1 while the live data does not fit under the quota even compacted and defragmented.
    pub space_exhausted: IntGauge,
}

impl UpkeepMetrics {
    /// Registers every family but `db_size`, which the member metrics registered already.
    pub fn register(registry: &Registry, db_size: IntGaugeVec) -> Result<Self, prometheus::Error> {
        let m = UpkeepMetrics {
            db_size,
            db_in_use: IntGaugeVec::new(
                Opts::new(
                    "hostlet_etcd_db_in_use_bytes",
                    "Part of each etcd member's database file in use (the rest is returned by a defragmentation).",
                ),
                &["member"],
            )?,
            quota: Gauge::with_opts(Opts::new(
                "hostlet_etcd_quota_bytes",
                "The etcd backend quota: at this size etcd raises NOSPACE and refuses writes.",
            ))?,
            alarms: IntGaugeVec::new(
                Opts::new("hostlet_etcd_alarms", "etcd alarms raised, by type."),
                &["type"],
            )?,
            defrag_total: IntCounterVec::new(
                Opts::new(
                    "hostlet_etcd_defrag_total",
                    "Defragmentations of the local etcd member, by result.",
                ),
                &["result"],
            )?,
            defrag_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "hostlet_etcd_defrag_duration_seconds",
                    "How long a defragmentation of the local member took (it serves nothing meanwhile).",
                )
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
            )?,
            compactions_total: IntCounterVec::new(
                Opts::new(
                    "hostlet_etcd_compactions_total",
                    "Compactions of the etcd history this agent ran, by result.",
                ),
                &["result"],
            )?,
            space_exhausted: IntGauge::with_opts(Opts::new(
                "hostlet_etcd_space_exhausted",
                "1 while the live etcd data does not fit under the quota even compacted and defragmented.",
            ))?,
        };
        for r in RESULTS {
            m.defrag_total.with_label_values(&[r]).inc_by(0);
            m.compactions_total.with_label_values(&[r]).inc_by(0);
        }
        for t in ALARM_TYPES {
            m.alarms.with_label_values(&[t]).set(0);
        }
        registry.register(Box::new(m.db_in_use.clone()))?;
        registry.register(Box::new(m.quota.clone()))?;
        registry.register(Box::new(m.alarms.clone()))?;
        registry.register(Box::new(m.defrag_total.clone()))?;
        registry.register(Box::new(m.defrag_duration.clone()))?;
        registry.register(Box::new(m.compactions_total.clone()))?;
        registry.register(Box::new(m.space_exhausted.clone()))?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_exists_at_zero_once_registered() {
        let r = Registry::new();
        let member = crate::etcd_member::MemberMetrics::register(&r).unwrap();
        let m = UpkeepMetrics::register(&r, member.db_size_bytes).unwrap();
        m.db_size.with_label_values(&["n1"]).set(1);
        m.db_in_use.with_label_values(&["n1"]).set(1);
        let mut buf = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf)
            .unwrap();
        let text = String::from_utf8(buf).unwrap();
        for line in [
            "hostlet_etcd_alarms{type=\"NOSPACE\"} 0",
            "hostlet_etcd_defrag_total{result=\"success\"} 0",
            "hostlet_etcd_compactions_total{result=\"failure\"} 0",
            "hostlet_etcd_quota_bytes 0",
            "hostlet_etcd_defrag_duration_seconds_count 0",
            "hostlet_etcd_space_exhausted 0",
            "hostlet_etcd_db_size_bytes{member=\"n1\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
