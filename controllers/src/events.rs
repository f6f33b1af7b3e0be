//! Events: short JSON records under `/hostlet/events/<node>/…` that expire with a 48 h lease, the way
//! `kubectl get events` shows what happened and why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hostlet_api::objects::{Event, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_runtime::etcd::Etcd;
use tokio::sync::Mutex;

/// How long an event stays in etcd.
pub const EVENT_TTL: Duration = Duration::from_secs(48 * 3600);
/// Events share one lease for this long, so that writing an event is one put, not a grant and a put.
const LEASE_REUSE: Duration = Duration::from_secs(3600);

/// Whether an event reports the normal course of things or something an operator should look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

/// Writes this node's events. Cheap to clone; failures to write are logged, never fatal.
#[derive(Clone)]
pub struct EventRecorder {
    etcd: Etcd,
    keys: KeyLayout,
    node: String,
    seq: Arc<AtomicU64>,
    lease: Arc<Mutex<Option<(i64, Instant)>>>,
}

impl EventRecorder {
    pub fn new(etcd: Etcd, keys: KeyLayout, node: impl Into<String>) -> Self {
        EventRecorder {
            etcd,
            keys,
            node: node.into(),
            seq: Arc::new(AtomicU64::new(0)),
            lease: Arc::new(Mutex::new(None)),
        }
    }

    /// Records an event about the node itself (no pod).
    pub async fn node_event(&self, kind: EventKind, reason: &str, message: impl Into<String>) {
        self.record(None, None, kind, reason, message).await;
    }

    /// Records an event; logs it as well, so the journal tells the same story.
    pub async fn record(
        &self,
        pod: Option<&str>,
        container: Option<&str>,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        match kind {
            EventKind::Normal => tracing::info!(pod, container, reason, "{message}"),
            EventKind::Warning => tracing::warn!(pod, container, reason, "{message}"),
        }
        let event = Event {
            node: self.node.clone(),
            pod: pod.map(str::to_string),
            container: container.map(str::to_string),
            reason: reason.to_string(),
            message,
            kind: match kind {
                EventKind::Normal => "Normal".into(),
                EventKind::Warning => "Warning".into(),
            },
            timestamp: Timestamp::now(),
        };
        if let Err(e) = self.put(&event).await {
            tracing::debug!(error = %e, reason, "could not write event");
        }
    }

    /// Records an event about the node that happened at `at` (written later, say once etcd takes writes
    /// again); logs it now.
    pub async fn node_event_at(
        &self,
        kind: EventKind,
        reason: &str,
        message: impl Into<String>,
        at: Timestamp,
    ) -> Result<(), hostlet_runtime::etcd::EtcdError> {
        let event = Event {
            node: self.node.clone(),
            pod: None,
            container: None,
            reason: reason.to_string(),
            message: message.into(),
            kind: match kind {
                EventKind::Normal => "Normal".into(),
                EventKind::Warning => "Warning".into(),
            },
            timestamp: at,
        };
        self.put(&event).await
    }

    async fn put(&self, event: &Event) -> Result<(), hostlet_runtime::etcd::EtcdError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let key = self.keys.event(&self.node, nanos, seq);
        let value = serde_json::to_vec(event).unwrap_or_default();
        let lease = self.lease().await?;
        match self
            .etcd
            .put_with_lease(key.clone(), value.clone(), lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(_) => {
                // The lease may have gone (etcd restored, revoked): take a new one once.
                *self.lease.lock().await = None;
                let lease = self.lease().await?;
                self.etcd
                    .put_with_lease(key, value, lease)
                    .await
                    .map(|_| ())
            }
        }
    }

    async fn lease(&self) -> Result<i64, hostlet_runtime::etcd::EtcdError> {
        let mut guard = self.lease.lock().await;
        if let Some((id, granted)) = *guard {
            if granted.elapsed() < LEASE_REUSE {
                return Ok(id);
            }
        }
        let id = self.etcd.lease_grant(EVENT_TTL + LEASE_REUSE).await?;
        *guard = Some((id, Instant::now()));
        Ok(id)
    }
}
