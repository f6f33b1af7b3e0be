//! The member's Prometheus metrics.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

/// `hostlet_etcd_*` gauges and the restart counter.
#[derive(Debug, Clone)]
pub struct MemberMetrics {
    pub restarts: IntCounter,
    pub is_leader: IntGauge,
    pub is_learner: IntGauge,
    /// By member name: the local member here; the upkeep controller adds the others.
    pub db_size_bytes: IntGaugeVec,
    pub up: IntGauge,
    /// 1 per warning of the version gate this start (`kind`: `data-inconsistency-advisory`,
    /// `past-upstream-support`).
    pub version_warning: IntGaugeVec,
    /// 1 for the local member's release and the cluster version it reports (`member`, `server`,
    /// `cluster`); one series at a time.
    pub version_info: IntGaugeVec,
}

impl MemberMetrics {
    /// Creates the metrics (all at 0) and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = MemberMetrics {
            restarts: IntCounter::with_opts(Opts::new(
                "hostlet_etcd_member_restarts_total",
                "Restarts of the local etcd member after it exited on its own.",
            ))?,
            is_leader: IntGauge::with_opts(Opts::new(
                "hostlet_etcd_is_leader",
                "1 when the local etcd member is the raft leader.",
            ))?,
            is_learner: IntGauge::with_opts(Opts::new(
                "hostlet_etcd_is_learner",
                "1 while the local etcd member is a learner.",
            ))?,
            db_size_bytes: IntGaugeVec::new(
                Opts::new(
                    "hostlet_etcd_db_size_bytes",
                    "Size of each etcd member's database file on disk.",
                ),
                &["member"],
            )?,
            up: IntGauge::with_opts(Opts::new(
                "hostlet_etcd_up",
                "1 while the local etcd member (or the external cluster) answers.",
            ))?,
            version_warning: IntGaugeVec::new(
                Opts::new(
                    "hostlet_etcd_version_warning",
                    "1 when the local member's etcd release has a known problem or is past upstream support.",
                ),
                &["kind"],
            )?,
            version_info: IntGaugeVec::new(
                Opts::new(
                    "hostlet_etcd_version_info",
                    "1 for the local etcd member's server version and the cluster version it reports.",
                ),
                &["member", "server", "cluster"],
            )?,
        };
        registry.register(Box::new(m.version_info.clone()))?;
        for kind in ["data-inconsistency-advisory", "past-upstream-support"] {
            m.version_warning.with_label_values(&[kind]).set(0);
        }
        registry.register(Box::new(m.version_warning.clone()))?;
        registry.register(Box::new(m.restarts.clone()))?;
        registry.register(Box::new(m.is_leader.clone()))?;
        registry.register(Box::new(m.is_learner.clone()))?;
        registry.register(Box::new(m.db_size_bytes.clone()))?;
        registry.register(Box::new(m.up.clone()))?;
        Ok(m)
    }

    /// The local member's versions as its `/version` gives them; the previous series goes.
    pub fn set_version_info(&self, member: &str, server: &str, cluster: &str) {
        self.version_info.reset();
        self.version_info
            .with_label_values(&[member, server, cluster])
            .set(1);
    }

    /// The member is gone: no leader, no learner, not up.
    pub fn set_down(&self) {
        self.up.set(0);
        self.is_leader.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exported_from_the_start() {
        let r = Registry::new();
        let _m = MemberMetrics::register(&r).unwrap();
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        for n in [
            "hostlet_etcd_member_restarts_total",
            "hostlet_etcd_is_leader",
            "hostlet_etcd_is_learner",
            "hostlet_etcd_up",
        ] {
            // hostlet_etcd_db_size_bytes{member} has a series once a member's size is known.
            assert!(names.iter().any(|x| x == n), "{n} missing: {names:?}");
        }
    }
}
