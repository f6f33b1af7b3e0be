//! The metric families of the controller machinery, in one registry the whole agent shares.
//!
//! Every label value a component will use is created at zero when the component registers
//! ([`Metrics::queue`], [`Metrics::controller`], [`Metrics::informer`]), so dashboards never show holes.
//! Other crates add their own families to [`Metrics::registry`].
//!
//! ```
//! let metrics = hostlet_runtime::Metrics::new();
//! let _pods = metrics.controller("pods");
//! let text = metrics.encode_text();
//! assert!(text.contains(r#"hostlet_reconcile_total{controller="pods",result="error"} 0"#));
//! ```

use std::sync::Arc;

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The `result` label values of `hostlet_reconcile_total`.
pub const RECONCILE_RESULTS: [&str; 3] = ["success", "error", "requeue"];

/// The `type` label values of `hostlet_informer_events_total`. `invalid` counts values that did not
/// decode (in addition to the `apply`/`init_apply` that carried them); `error` counts failed list/watch calls.
pub const INFORMER_EVENT_TYPES: [&str; 7] = [
    "init",
    "init_apply",
    "init_done",
    "apply",
    "delete",
    "invalid",
    "error",
];

struct Families {
    registry: Registry,
    workqueue_depth: IntGaugeVec,
    workqueue_adds_total: IntCounterVec,
    workqueue_queue_duration_seconds: HistogramVec,
    workqueue_work_duration_seconds: HistogramVec,
    workqueue_unfinished_work_seconds: GaugeVec,
    workqueue_longest_running_processor_seconds: GaugeVec,
    workqueue_retries_total: IntCounterVec,
    reconcile_total: IntCounterVec,
    reconcile_errors_total: IntCounterVec,
    reconcile_panics_total: IntCounterVec,
    reconcile_duration_seconds: HistogramVec,
    informer_events_total: IntCounterVec,
    informer_relists_total: IntCounterVec,
    informer_last_revision: IntGaugeVec,
    informer_last_event_timestamp_seconds: GaugeVec,
}

/// The shared registry and the runtime's metric families. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    families: Arc<Families>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once per registry");
    c
}

fn int_gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(g.clone()))
        .expect("metric registered once per registry");
    g
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(g.clone()))
        .expect("metric registered once per registry");
    g
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric definition");
    r.register(Box::new(h.clone()))
        .expect("metric registered once per registry");
    h
}

impl Metrics {
    /// A fresh registry holding the runtime's families.
    pub fn new() -> Self {
        let r = Registry::new();
        // The work queue's buckets as users know them: 10 ns to 10 s, ×10.
        let queue_buckets = exponential_buckets(10e-9, 10.0, 10).expect("valid buckets");
        let reconcile_buckets = vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
        ];
        let families = Families {
            workqueue_depth: int_gauge(&r, "workqueue_depth", "Keys waiting in the work queue.", &["name"]),
            workqueue_adds_total: counter(&r, "workqueue_adds_total", "Keys added to the work queue.", &["name"]),
            workqueue_queue_duration_seconds: histogram(
                &r,
                "workqueue_queue_duration_seconds",
                "How long a key waited, once due, before a worker took it.",
                &["name"],
                queue_buckets.clone(),
            ),
            workqueue_work_duration_seconds: histogram(
                &r,
                "workqueue_work_duration_seconds",
                "How long processing a key took.",
                &["name"],
                queue_buckets,
            ),
            workqueue_unfinished_work_seconds: gauge(
                &r,
                "workqueue_unfinished_work_seconds",
                "Seconds of work in progress that has not finished (sum over keys being processed).",
                &["name"],
            ),
            workqueue_longest_running_processor_seconds: gauge(
                &r,
                "workqueue_longest_running_processor_seconds",
                "Seconds the longest-running key has been processed.",
                &["name"],
            ),
            workqueue_retries_total: counter(&r, "workqueue_retries_total", "Keys re-added with backoff.", &["name"]),
            reconcile_total: counter(
                &r,
                "hostlet_reconcile_total",
                "Reconciles by result.",
                &["controller", "result"],
            ),
            reconcile_errors_total: counter(
                &r,
                "hostlet_reconcile_errors_total",
                "Reconciles that returned an error or panicked.",
                &["controller"],
            ),
            reconcile_panics_total: counter(
                &r,
                "hostlet_reconcile_panics_total",
                "Reconciles that panicked.",
                &["controller"],
            ),
            reconcile_duration_seconds: histogram(
                &r,
                "hostlet_reconcile_duration_seconds",
                "How long a reconcile took.",
                &["controller"],
                reconcile_buckets,
            ),
            informer_events_total: counter(
                &r,
                "hostlet_informer_events_total",
                "Events an informer applied to its cache, by type.",
                &["informer", "type"],
            ),
            informer_relists_total: counter(
                &r,
                "hostlet_informer_relists_total",
                "Full relists after the watched revision was compacted away.",
                &["informer"],
            ),
            informer_last_revision: int_gauge(
                &r,
                "hostlet_informer_last_revision",
                "The etcd revision the informer's cache is at.",
                &["informer"],
            ),
            informer_last_event_timestamp_seconds: gauge(
                &r,
                "hostlet_informer_last_event_timestamp_seconds",
                "Unix time the informer's cache last took in a change (or finished a list).",
                &["informer"],
            ),
            registry: r,
        };
        // The agent's own memory, CPU and file descriptors, read from /proc at each scrape.
        #[cfg(target_os = "linux")]
        families
            .registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process collector registered once per registry");
        Metrics {
            families: Arc::new(families),
        }
    }

    /// Registers `hostlet_build_info{version, commit}` = 1, so dashboards can tell which build runs where.
    pub fn register_build_info(&self, version: &str, commit: &str) -> prometheus::Result<()> {
        let g = IntGaugeVec::new(
            Opts::new(
                "hostlet_build_info",
                "The running build: always 1, with its version and git commit as labels.",
            ),
            &["version", "commit"],
        )?;
        g.with_label_values(&[version, commit]).set(1);
        self.families.registry.register(Box::new(g))
    }

    /// The registry to serve on `/metrics` and to register other families in.
    pub fn registry(&self) -> &Registry {
        &self.families.registry
    }

    /// Everything in the registry, in the Prometheus text format.
    pub fn encode_text(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.families.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Registers a work queue named `name`: its series exist (at zero) from now on.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let f = &self.families;
        QueueMetrics {
            depth: f.workqueue_depth.with_label_values(&[name]),
            adds: f.workqueue_adds_total.with_label_values(&[name]),
            queue_duration: f
                .workqueue_queue_duration_seconds
                .with_label_values(&[name]),
            work_duration: f.workqueue_work_duration_seconds.with_label_values(&[name]),
            unfinished_work: f
                .workqueue_unfinished_work_seconds
                .with_label_values(&[name]),
            longest_running: f
                .workqueue_longest_running_processor_seconds
                .with_label_values(&[name]),
            retries: f.workqueue_retries_total.with_label_values(&[name]),
        }
    }

    /// Registers a controller named `name` (its queue carries the same name).
    pub fn controller(&self, name: &str) -> ControllerMetrics {
        let f = &self.families;
        let result = |r: &str| f.reconcile_total.with_label_values(&[name, r]);
        ControllerMetrics {
            queue: self.queue(name),
            success: result("success"),
            error: result("error"),
            requeue: result("requeue"),
            errors: f.reconcile_errors_total.with_label_values(&[name]),
            panics: f.reconcile_panics_total.with_label_values(&[name]),
            duration: f.reconcile_duration_seconds.with_label_values(&[name]),
        }
    }

    /// Registers an informer named `name`.
    pub fn informer(&self, name: &str) -> InformerMetrics {
        let f = &self.families;
        let ev = |t: &str| f.informer_events_total.with_label_values(&[name, t]);
        InformerMetrics {
            init: ev("init"),
            init_apply: ev("init_apply"),
            init_done: ev("init_done"),
            apply: ev("apply"),
            delete: ev("delete"),
            invalid: ev("invalid"),
            error: ev("error"),
            relists: f.informer_relists_total.with_label_values(&[name]),
            last_revision: f.informer_last_revision.with_label_values(&[name]),
            last_event: f
                .informer_last_event_timestamp_seconds
                .with_label_values(&[name]),
        }
    }
}

impl InformerMetrics {
    /// Notes that the cache took in a change now; set before the revision, so that a scrape that sees the
    /// revision sees this time or a later one.
    pub fn stamp(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.last_event.set(now);
    }
}

/// One work queue's series.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    pub depth: IntGauge,
    pub adds: IntCounter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub unfinished_work: prometheus::Gauge,
    pub longest_running: prometheus::Gauge,
    pub retries: IntCounter,
}

/// One controller's series.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    pub queue: QueueMetrics,
    pub success: IntCounter,
    pub error: IntCounter,
    pub requeue: IntCounter,
    pub errors: IntCounter,
    pub panics: IntCounter,
    pub duration: Histogram,
}

/// One informer's series.
#[derive(Clone, Debug)]
pub struct InformerMetrics {
    pub init: IntCounter,
    pub init_apply: IntCounter,
    pub init_done: IntCounter,
    pub apply: IntCounter,
    pub delete: IntCounter,
    pub invalid: IntCounter,
    pub error: IntCounter,
    pub relists: IntCounter,
    pub last_revision: IntGauge,
    pub last_event: prometheus::Gauge,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 15] = [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
        "hostlet_reconcile_total",
        "hostlet_reconcile_errors_total",
        "hostlet_reconcile_panics_total",
        "hostlet_reconcile_duration_seconds",
        "hostlet_informer_events_total",
        "hostlet_informer_relists_total",
        "hostlet_informer_last_revision",
        "hostlet_informer_last_event_timestamp_seconds",
    ];

    #[test]
    fn every_design_metric_exists_at_zero_once_registered() {
        let m = Metrics::new();
        m.controller("pods");
        m.informer("pods");
        let text = m.encode_text();
        for name in NAMES {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        for r in RECONCILE_RESULTS {
            let line = format!("hostlet_reconcile_total{{controller=\"pods\",result=\"{r}\"}} 0");
            assert!(text.contains(&line), "{line}");
        }
        for t in INFORMER_EVENT_TYPES {
            let line = format!("hostlet_informer_events_total{{informer=\"pods\",type=\"{t}\"}} 0");
            assert!(text.contains(&line), "{line}");
        }
        assert!(text.contains("workqueue_depth{name=\"pods\"} 0"));
        assert!(text.contains("hostlet_informer_relists_total{informer=\"pods\"} 0"));
    }

    #[test]
    fn registering_a_name_twice_shares_the_series() {
        let m = Metrics::new();
        m.controller("a").success.inc();
        m.controller("a").success.inc();
        assert!(m
            .encode_text()
            .contains("hostlet_reconcile_total{controller=\"a\",result=\"success\"} 2"));
    }
}
