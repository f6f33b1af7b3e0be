//! The snapshot metrics (`hostlet_snapshot_*`), registered once per agent.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// The snapshot series; a one-off command registers them in a registry of its own.
pub struct SnapshotMetrics {
    pub(super) duration: HistogramVec,
    pub(super) last_success: IntGaugeVec,
    pub(super) size: IntGauge,
    pub(super) total: IntCounterVec,
    pub(super) files: IntGauge,
    pub(super) uploads: IntCounterVec,
    pub(super) upload_duration: Histogram,
    pub(super) remote_count: IntGauge,
    pub(super) period: IntGauge,
}

impl SnapshotMetrics {
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "hostlet_snapshot_duration_seconds",
                "Time to take one snapshot, by outcome.",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            &["status"],
        )?;
        let last_success = IntGaugeVec::new(
            Opts::new(
                "hostlet_snapshot_last_success_timestamp_seconds",
                "Unix time of the last successful snapshot of this node, by place (local file, remote object).",
            ),
            &["place"],
        )?;
        let size = IntGauge::new(
            "hostlet_snapshot_size_bytes",
            "Size on disk of the last successful snapshot.",
        )?;
        let total = IntCounterVec::new(
            Opts::new("hostlet_snapshots_total", "Snapshots attempted, by result."),
            &["result"],
        )?;
        let files = IntGauge::new(
            "hostlet_snapshot_files",
            "Snapshot files of this node in the snapshot dir.",
        )?;
        r.register(Box::new(duration.clone()))?;
        r.register(Box::new(last_success.clone()))?;
        r.register(Box::new(size.clone()))?;
        r.register(Box::new(total.clone()))?;
        r.register(Box::new(files.clone()))?;
        let uploads = IntCounterVec::new(
            Opts::new(
                "hostlet_snapshot_uploads_total",
                "Snapshot uploads to object storage, by result (a success is read back and matches).",
            ),
            &["result"],
        )?;
        let upload_duration = Histogram::with_opts(
            HistogramOpts::new(
                "hostlet_snapshot_upload_duration_seconds",
                "Time to upload and read back one snapshot.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
        )?;
        let remote_count = IntGauge::new(
            "hostlet_snapshot_remote_count",
            "Snapshot objects of this node under its prefix in object storage.",
        )?;
        let period = IntGauge::new(
            "hostlet_snapshot_schedule_period_seconds",
            "Seconds between two scheduled snapshots (0 while scheduled snapshots are off).",
        )?;
        r.register(Box::new(uploads.clone()))?;
        r.register(Box::new(upload_duration.clone()))?;
        r.register(Box::new(remote_count.clone()))?;
        r.register(Box::new(period.clone()))?;
        for s in ["success", "failure"] {
            uploads.with_label_values(&[s]);
        }
        // The remote series appears once a target is set, so that no alert fires on a host without one.
        last_success.with_label_values(&["local"]);
        for s in ["successful", "failed"] {
            duration.with_label_values(&[s]);
        }
        for r in ["success", "failure", "busy", "skipped", "refused"] {
            total.with_label_values(&[r]);
        }
        Ok(SnapshotMetrics {
            duration,
            last_success,
            size,
            total,
            files,
            uploads,
            upload_duration,
            remote_count,
            period,
        })
    }
}
