//! The pod controller's Prometheus metrics. Every label value is created at zero when registered, so
//! dashboards never show holes.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Docker operations hostlet performs, as the `op` label says them.
pub const DOCKER_OPS: [&str; 15] = [
    "version",
    "info",
    "ping",
    "list",
    "inspect",
    "create",
    "start",
    "stop",
    "signal",
    "remove",
    "pull",
    "image_inspect",
    "exec",
    "stats",
    "events",
];
/// Docker event types counted by `hostlet_docker_events_total{type}`.
pub const DOCKER_EVENT_TYPES: [&str; 6] = ["create", "start", "die", "oom", "destroy", "other"];
pub const PROBE_KINDS: [&str; 3] = ["liveness", "readiness", "startup"];
pub const PROBE_RESULTS: [&str; 3] = ["success", "failure", "error"];

/// kubelet's `pod_start_duration_seconds` buckets.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
const DOCKER_OP_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// What the Docker adapter records about each call it makes.
#[derive(Clone)]
pub struct DockerOpMetrics {
    pub operations: IntCounterVec,
    pub duration: HistogramVec,
}

impl DockerOpMetrics {
    /// Counts one finished call.
    pub fn observe(&self, op: &str, ok: bool, seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.operations.with_label_values(&[op, result]).inc();
        self.duration.with_label_values(&[op]).observe(seconds);
    }

    /// Unregistered metrics, for a runtime built without a registry (benchmarks, tools).
    pub fn unregistered() -> Self {
        Self::new().unwrap_or_else(|_| unreachable!("static metric definitions are valid"))
    }

    fn new() -> Result<Self, prometheus::Error> {
        let m = DockerOpMetrics {
            operations: IntCounterVec::new(
                Opts::new(
                    "hostlet_docker_operations_total",
                    "Docker API calls made, by operation and result",
                ),
                &["op", "result"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "hostlet_docker_operation_duration_seconds",
                    "Duration of Docker API calls",
                )
                .buckets(DOCKER_OP_BUCKETS.to_vec()),
                &["op"],
            )?,
        };
        for op in DOCKER_OPS {
            m.duration.with_label_values(&[op]);
            for r in ["success", "error"] {
                m.operations.with_label_values(&[op, r]);
            }
        }
        Ok(m)
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::new()?;
        registry.register(Box::new(m.operations.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        Ok(m)
    }
}

/// Everything else the pod controller records.
#[derive(Clone)]
pub struct PodMetrics {
    pub pod_start_duration: Histogram,
    pub running_pods: IntGauge,
    pub running_containers: IntGauge,
    pub container_restarts: IntCounter,
    pub probe_results: IntCounterVec,
    pub relist_duration: Histogram,
    pub docker_events: IntCounterVec,
}

impl PodMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = PodMetrics {
            pod_start_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "hostlet_pod_start_duration_seconds",
                    "Time from a pod's manifest being seen to all of its containers running",
                )
                .buckets(POD_START_BUCKETS.to_vec()),
            )?,
            running_pods: IntGauge::new("hostlet_running_pods", "Pods whose infra container is running")?,
            running_containers: IntGauge::new(
                "hostlet_running_containers",
                "App containers running (infra containers not counted)",
            )?,
            container_restarts: IntCounter::new(
                "hostlet_container_restarts_total",
                "Containers restarted after they exited or failed their liveness probe",
            )?,
            probe_results: IntCounterVec::new(
                Opts::new("hostlet_probe_results_total", "Probe attempts by probe kind and result"),
                &["probe", "result"],
            )?,
            relist_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "hostlet_pleg_relist_duration_seconds",
                    "Duration of a full list of this node's containers (at start and the safety relist)",
                )
                .buckets(DOCKER_OP_BUCKETS.to_vec()),
            )?,
            docker_events: IntCounterVec::new(
                Opts::new("hostlet_docker_events_total", "Docker container events received, by type"),
                &["type"],
            )?,
        };
        for p in PROBE_KINDS {
            for r in PROBE_RESULTS {
                m.probe_results.with_label_values(&[p, r]);
            }
        }
        for t in DOCKER_EVENT_TYPES {
            m.docker_events.with_label_values(&[t]);
        }
        registry.register(Box::new(m.pod_start_duration.clone()))?;
        registry.register(Box::new(m.running_pods.clone()))?;
        registry.register(Box::new(m.running_containers.clone()))?;
        registry.register(Box::new(m.container_restarts.clone()))?;
        registry.register(Box::new(m.probe_results.clone()))?;
        registry.register(Box::new(m.relist_duration.clone()))?;
        registry.register(Box::new(m.docker_events.clone()))?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_value_exists_at_zero() {
        let reg = Registry::new();
        DockerOpMetrics::register(&reg).unwrap();
        PodMetrics::register(&reg).unwrap();
        let families = reg.gather();
        let count = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .map(|f| f.get_metric().len())
                .unwrap_or(0)
        };
        assert_eq!(
            count("hostlet_docker_operations_total"),
            DOCKER_OPS.len() * 2
        );
        assert_eq!(count("hostlet_probe_results_total"), 9);
        assert_eq!(
            count("hostlet_docker_events_total"),
            DOCKER_EVENT_TYPES.len()
        );
        assert_eq!(count("hostlet_running_pods"), 1);
    }
}
