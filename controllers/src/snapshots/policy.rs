//! What decides when and how this node snapshots: the flags ([`SnapshotSettings`], [`S3Flags`]), the
//! policy keys layered over them ([`EffectivePolicy`]) and the schedule's firing times.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A cache of a snapshot policy key.
pub type PolicyStore = hostlet_runtime::Store<
    String,
    hostlet_runtime::informer::Object<hostlet_api::objects::SnapshotPolicy>,
>;

use hostlet_api::objects::{S3Policy, SnapshotPolicy};
use hostlet_api::KeyLayout;
use hostlet_runtime::etcd::EtcdConfig;

use super::encryption::SnapshotKey as EncryptionKey;
use super::remote::S3Target;
use super::schedule::Schedule;

/// What the scheduler is set up with (flags; the policy keys override schedule, retention and compress).
#[derive(Debug, Clone)]
pub struct SnapshotSettings {
    pub node: String,
    pub dir: PathBuf,
    pub keys: KeyLayout,
    pub schedule: String,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    /// Up to this much random delay before a scheduled snapshot (at most 5 s is used).
    pub jitter: Duration,
    /// The local member only: a snapshot stream comes from one endpoint.
    pub local: EtcdConfig,
    /// The object-storage target from the flags (the policy keys' `s3` part may override bucket, prefix,
    /// region and retention; never the endpoint).
    pub s3: S3Flags,
    /// Encrypts every snapshot file (and so its object) when set.
    pub key: Option<Arc<EncryptionKey>>,
    /// Free space under the snapshot dir: a snapshot due while it is low is skipped with the reason rather
    /// than half-written.
    pub disk: Option<crate::disk::DiskPressure>,
}

/// The object-storage flags. Without a bucket (here or in a policy key) nothing is uploaded.
#[derive(Debug, Clone, Default)]
pub struct S3Flags {
    /// Endpoint, bucket, prefix, region and retention, as a policy would give them.
    pub policy: S3Policy,
    pub virtual_hosted: bool,
    pub ca_file: Option<PathBuf>,
    pub credentials_file: Option<PathBuf>,
    /// `--snapshot-s3-allow-http`: a plain `http://` endpoint is accepted.
    pub allow_http: bool,
}

/// Region used when none is set.
pub const DEFAULT_S3_REGION: &str = "us-east-1";
/// Objects kept per name when no remote retention is set.
pub const DEFAULT_S3_RETENTION: u32 = 5;

impl S3Flags {
    /// The target in force for `layered` (the flags' `s3` already under the keys'), or `None` without a
    /// bucket.
    pub fn target(&self, layered: &S3Policy) -> Option<S3Target> {
        let bucket = layered.bucket.clone().filter(|b| !b.is_empty())?;
        Some(S3Target {
            endpoint: layered.endpoint.clone().filter(|e| !e.is_empty()),
            bucket,
            prefix: layered.prefix.clone().unwrap_or_default(),
            region: layered
                .region
                .clone()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| DEFAULT_S3_REGION.to_string()),
            virtual_hosted: self.virtual_hosted,
            ca_file: self.ca_file.clone(),
            credentials_file: self.credentials_file.clone(),
            allow_http: self.allow_http,
        })
    }
}

/// The policy in force: flags, overridden by the cluster key, overridden by the node key.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectivePolicy {
    pub schedule: Schedule,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    /// The object-storage target, when one is set.
    pub s3: Option<S3Target>,
    pub s3_retention: u32,
}

impl EffectivePolicy {
    /// The policy from the flags layered under the cluster key and the node key (either may be absent).
    pub fn layer(
        settings: &SnapshotSettings,
        cluster: Option<&SnapshotPolicy>,
        node: Option<&SnapshotPolicy>,
        fallback_schedule: Schedule,
    ) -> EffectivePolicy {
        let mut layered = SnapshotPolicy {
            schedule: Some(settings.schedule.clone()),
            retention: Some(settings.retention),
            compress: Some(settings.compress),
            disabled: Some(settings.disabled),
            s3: Some(settings.s3.policy.clone()),
        };
        for p in [cluster, node].into_iter().flatten() {
            layered = without_endpoint(p).over(&layered);
        }
        let s3 = layered.s3.clone().unwrap_or_default();
        EffectivePolicy {
            schedule: layered
                .schedule
                .as_deref()
                .and_then(|s| Schedule::parse(s).ok())
                .unwrap_or(fallback_schedule),
            retention: layered.retention.unwrap_or(settings.retention),
            compress: layered.compress.unwrap_or(settings.compress),
            disabled: layered.disabled.unwrap_or(settings.disabled),
            s3_retention: s3.retention.unwrap_or(DEFAULT_S3_RETENTION),
            s3: settings.s3.target(&s3),
        }
    }

    /// Seconds between two scheduled snapshots, 0 when off.
    pub fn period_seconds(&self) -> u64 {
        if self.disabled {
            return 0;
        }
        let now = SystemTime::now();
        let a = self.schedule.next_after(now);
        let b = a.and_then(|a| self.schedule.next_after(a));
        match (a, b) {
            (Some(a), Some(b)) => b.duration_since(a).map(|d| d.as_secs()).unwrap_or(0),
            _ => 0,
        }
    }
}

/// A policy key's value without the fields only flags may set: where snapshots are sent (and so who may
/// read them) is the host's decision, not that of whoever can write to etcd.
fn without_endpoint(p: &SnapshotPolicy) -> SnapshotPolicy {
    let mut p = p.clone();
    if let Some(s3) = p.s3.as_mut() {
        s3.endpoint = None;
    }
    p
}

/// The fields of a policy key that are ignored, as `s3.endpoint`.
pub fn ignored_policy_fields(p: &SnapshotPolicy) -> Vec<&'static str> {
    let mut out = Vec::new();
    if p.s3.as_ref().is_some_and(|s| s.endpoint.is_some()) {
        out.push("s3.endpoint");
    }
    out
}

/// A value's error in the operator's terms (see [`hostlet_api::parse::plain_words`]).
pub(super) fn plain(e: yaml_serde::Error) -> hostlet_runtime::informer::DecodeError {
    hostlet_api::parse::plain_words(&e.to_string()).into()
}

/// A snapshot policy key's value (`/hostlet/config/snapshots`, or a node's), its schedule checked.
pub fn decode_policy(
    _key: &str,
    bytes: &[u8],
) -> Result<SnapshotPolicy, hostlet_runtime::informer::DecodeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(SnapshotPolicy::default());
    }
    let p: SnapshotPolicy = yaml_serde::from_slice(bytes).map_err(plain)?;
    if let Some(s) = &p.schedule {
        Schedule::parse(s)?;
    }
    Ok(p)
}

/// This node's fixed delay after each of the schedule's times, so that nodes sharing a schedule do not all
/// snapshot at once: derived from the node name, at most `jitter` and at most a tenth of an `@every`
/// period. Being fixed, it never bends the cadence.
pub fn node_offset(node: &str, jitter: Duration, schedule: &Schedule) -> Duration {
    let cap = match schedule {
        Schedule::Every(d) => jitter.min(*d / 10),
        Schedule::Cron { .. } => jitter,
    };
    let ms = cap.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    // FNV-1a: stable across runs and versions, unlike the standard hasher.
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Duration::from_millis(h % (ms + 1))
}

/// The schedule's next time after `last` (the previous scheduled time, not when it ran). Times whose
/// firing (`+ offset`) has passed by more than a second are skipped, so a host that was busy or suspended
/// does not run the missed snapshots back to back.
pub fn next_fire(
    schedule: &Schedule,
    last: SystemTime,
    offset: Duration,
    now: SystemTime,
) -> Option<SystemTime> {
    let mut next = schedule.next_after(last)?;
    while next + offset + Duration::from_secs(1) < now {
        next = schedule.next_after(next)?;
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::UNIX_EPOCH;

    use super::*;

    fn t(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(1_800_000_000.0 + secs)
    }

    #[test]
    fn every_fires_on_a_fixed_cadence_however_late_each_run_starts() {
        let every = Schedule::parse("@every 3s").unwrap();
        let offset = node_offset("n1", Duration::from_secs(5), &every);
        assert!(
            offset <= Duration::from_millis(300),
            "a tenth of the period at most: {offset:?}"
        );
        // Each wake-up comes late by a varying amount; the times fired stay 3 s apart.
        let mut last = t(0.0);
        let mut fired = Vec::new();
        for late in [0.0, 0.9, 0.05, 1.7, 0.4] {
            let next = next_fire(&every, last, offset, last).unwrap();
            let woke = next + offset + Duration::from_secs_f64(late);
            fired.push(next);
            last = next;
            assert!(woke >= next);
        }
        for pair in fired.windows(2) {
            assert_eq!(
                pair[1].duration_since(pair[0]).unwrap(),
                Duration::from_secs(3)
            );
        }
    }

    #[test]
    fn missed_times_are_skipped_not_run_back_to_back() {
        let every = Schedule::parse("@every 3s").unwrap();
        let next = next_fire(&every, t(0.0), Duration::ZERO, t(10.5)).unwrap();
        assert_eq!(next, t(12.0));
        let cron = Schedule::parse("*/10 * * * * *").unwrap();
        let next = next_fire(&cron, t(0.0), Duration::ZERO, t(35.0)).unwrap();
        assert!(next >= t(34.0) && next <= t(40.0), "{next:?}");
    }

    #[test]
    fn node_offsets_are_stable_bounded_and_differ_between_nodes() {
        let cron = Schedule::parse("0 */12 * * *").unwrap();
        let j = Duration::from_secs(5);
        let a = node_offset("node-a", j, &cron);
        assert_eq!(a, node_offset("node-a", j, &cron));
        assert!(a <= j);
        let offsets: HashSet<Duration> = (0..20)
            .map(|i| node_offset(&format!("n{i}"), j, &cron))
            .collect();
        assert!(offsets.len() > 10, "{offsets:?}");
        assert_eq!(node_offset("n", Duration::ZERO, &cron), Duration::ZERO);
    }

    #[test]
    fn s3_target_layers_flags_under_the_policy_keys_and_needs_a_bucket() {
        let settings = SnapshotSettings {
            node: "n1".into(),
            dir: PathBuf::from("/tmp/x"),
            keys: KeyLayout::default(),
            schedule: "@every 1h".into(),
            retention: 2,
            compress: false,
            disabled: false,
            jitter: Duration::ZERO,
            local: EtcdConfig::new(Vec::<String>::new()),
            s3: S3Flags {
                policy: S3Policy {
                    endpoint: Some("https://s3.local:9000".into()),
                    prefix: Some("etcd".into()),
                    retention: Some(3),
                    ..Default::default()
                },
                credentials_file: Some(PathBuf::from("/etc/hostlet/s3")),
                ..Default::default()
            },
            key: None,
            disk: None,
        };
        let hourly = Schedule::parse("@every 1h").unwrap();
        let off = EffectivePolicy::layer(&settings, None, None, hourly.clone());
        assert_eq!(off.s3, None, "no bucket, no uploads");
        assert_eq!(off.s3_retention, 3);
        assert_eq!(off.period_seconds(), 3600);
        let cluster: SnapshotPolicy =
            serde_json::from_str(r#"{"s3": {"bucket": "backups", "retention": 10}}"#).unwrap();
        let node: SnapshotPolicy =
            serde_json::from_str(r#"{"s3": {"prefix": "n1-only"}}"#).unwrap();
        let on = EffectivePolicy::layer(&settings, Some(&cluster), Some(&node), hourly.clone());
        let t = on.s3.unwrap();
        assert_eq!(t.bucket, "backups");
        assert_eq!(t.prefix, "n1-only");
        assert_eq!(t.endpoint.as_deref(), Some("https://s3.local:9000"));
        assert_eq!(t.region, DEFAULT_S3_REGION);
        assert_eq!(t.credentials_file, Some(PathBuf::from("/etc/hostlet/s3")));
        assert_eq!(on.s3_retention, 10);
        assert!(serde_json::from_str::<SnapshotPolicy>(r#"{"s3": {"secretKey": "x"}}"#).is_err());
        // Whoever writes a policy key cannot send the snapshots elsewhere: its endpoint is ignored.
        let redirect: SnapshotPolicy = serde_json::from_str(
            r#"{"s3": {"endpoint": "https://attacker.example", "bucket": "b2"}}"#,
        )
        .unwrap();
        assert_eq!(ignored_policy_fields(&redirect), vec!["s3.endpoint"]);
        assert!(ignored_policy_fields(&cluster).is_empty());
        let t = EffectivePolicy::layer(&settings, Some(&redirect), None, hourly)
            .s3
            .unwrap();
        assert_eq!(t.endpoint.as_deref(), Some("https://s3.local:9000"));
        assert_eq!(t.bucket, "b2");
    }
}
