//! The learner manager's metrics, registered in the agent's shared registry.

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGaugeVec, Opts, Registry};

/// The `role` label values of `hostlet_etcd_members`.
pub const MEMBER_ROLES: [&str; 2] = ["voter", "learner"];

/// `hostlet_etcd_members{role}` and the `hostlet_learner_*` families.
#[derive(Debug, Clone)]
pub struct LearnerMetrics {
    pub members: IntGaugeVec,
    pub promotions: IntCounter,
    pub evictions: IntCounter,
    /// The longest any current learner has gone without progress (0 without learners, and off the leader).
    pub stalled_seconds: Gauge,
    /// From first sight of a learner to its promotion.
    pub promotion_duration: Histogram,
}

impl LearnerMetrics {
    /// Creates the families (every series at 0) and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = LearnerMetrics {
            members: IntGaugeVec::new(
                Opts::new("hostlet_etcd_members", "etcd members by role."),
                &["role"],
            )?,
            promotions: IntCounter::with_opts(Opts::new(
                "hostlet_learner_promotions_total",
                "Learners this agent promoted to voters.",
            ))?,
            evictions: IntCounter::with_opts(Opts::new(
                "hostlet_learner_evictions_total",
                "Learners this agent removed for making no progress within the stall timeout.",
            ))?,
            stalled_seconds: Gauge::with_opts(Opts::new(
                "hostlet_learner_stalled_seconds",
                "Seconds the most stalled learner has gone without progress (on the leader).",
            ))?,
            promotion_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "hostlet_learner_promotion_duration_seconds",
                    "From a learner's addition (first sight by a leader) to its promotion.",
                )
                .buckets(vec![
                    0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                ]),
            )?,
        };
        for role in MEMBER_ROLES {
            m.members.with_label_values(&[role]).set(0);
        }
        registry.register(Box::new(m.members.clone()))?;
        registry.register(Box::new(m.promotions.clone()))?;
        registry.register(Box::new(m.evictions.clone()))?;
        registry.register(Box::new(m.stalled_seconds.clone()))?;
        registry.register(Box::new(m.promotion_duration.clone()))?;
        Ok(m)
    }

    /// Sets `hostlet_etcd_members` from a member list.
    pub fn set_members(&self, voters: usize, learners: usize) {
        self.members
            .with_label_values(&["voter"])
            .set(voters as i64);
        self.members
            .with_label_values(&["learner"])
            .set(learners as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_exists_at_zero_once_registered() {
        let r = Registry::new();
        let _m = LearnerMetrics::register(&r).unwrap();
        let mut buf = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf)
            .unwrap();
        let text = String::from_utf8(buf).unwrap();
        for line in [
            "hostlet_etcd_members{role=\"voter\"} 0",
            "hostlet_etcd_members{role=\"learner\"} 0",
            "hostlet_learner_promotions_total 0",
            "hostlet_learner_evictions_total 0",
            "hostlet_learner_stalled_seconds 0",
            "hostlet_learner_promotion_duration_seconds_count 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        assert!(LearnerMetrics::register(&r).is_err(), "registered twice");
    }
}
