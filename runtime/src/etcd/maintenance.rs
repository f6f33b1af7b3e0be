//! Maintenance: compaction, defragmentation, alarms (the upkeep controller and `hostlet etcd`).

use std::time::Duration;

use etcd_client::GetOptions;

use super::config::{normalise_endpoint, Settings};
use super::error::{is_compaction, is_retryable, timed_out};
use super::{Etcd, EtcdError};

/// Maintenance: compaction, defragmentation, alarms (the upkeep controller and `hostlet etcd`).
impl Etcd {
    /// The cluster's current revision, as the endpoint in use reports it.
    pub async fn revision(&self) -> Result<i64, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.get(&b"\0"[..], Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Compacts history up to `revision`; `physical` waits until the freed entries are gone from the backend.
    /// A revision already compacted is [`EtcdError::Compacted`].
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<(), EtcdError> {
        let result = self
            .with_retry(|mut c| async move {
                let opts = physical.then(|| etcd_client::CompactionOptions::new().with_physical());
                c.compact(revision, opts).await
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(EtcdError::Compacted { source, .. }) => {
                Err(EtcdError::Compacted { revision, source })
            }
            Err(e) => Err(e),
        }
    }

    /// Whether history is compacted up to `revision` (a read just before it answers "compacted"; the
    /// compaction revision itself stays readable). A read, so it works while etcd refuses writes.
    pub async fn is_compacted_to(&self, revision: i64) -> Result<bool, EtcdError> {
        let revision = revision - 1;
        if revision <= 0 {
            return Ok(true);
        }
        let result = self
            .with_retry(|mut c| async move {
                c.get(
                    &b"\0"[..],
                    Some(GetOptions::new().with_count_only().with_revision(revision)),
                )
                .await
            })
            .await;
        match result {
            Ok(_) => Ok(false),
            Err(EtcdError::Compacted { .. }) => Ok(true),
            Err(EtcdError::Request(e)) if is_compaction(&e) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The cluster's raised alarms: `(member id, alarm)`.
    pub async fn alarms(&self) -> Result<Vec<(u64, etcd_client::AlarmType)>, EtcdError> {
        let resp = self
            .with_retry(|mut c| async move {
                c.alarm(
                    etcd_client::AlarmAction::Get,
                    etcd_client::AlarmType::None,
                    None,
                )
                .await
            })
            .await?;
        Ok(resp
            .alarms()
            .iter()
            .map(|a| (a.member_id(), a.alarm()))
            .collect())
    }

    /// Clears one member's alarm (etcd accepts this while it refuses writes).
    pub async fn alarm_disarm(
        &self,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.alarm_of(etcd_client::AlarmAction::Deactivate, member, alarm)
            .await
    }

    /// Raises an alarm for one member.
    pub async fn alarm_activate(
        &self,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.alarm_of(etcd_client::AlarmAction::Activate, member, alarm)
            .await
    }

    async fn alarm_of(
        &self,
        action: etcd_client::AlarmAction,
        member: u64,
        alarm: etcd_client::AlarmType,
    ) -> Result<(), EtcdError> {
        self.with_retry(|mut c| async move {
            let mut opts = etcd_client::AlarmOptions::new();
            opts.with_member(member);
            c.alarm(action, alarm, Some(opts)).await
        })
        .await
        .map(|_| ())
    }

    /// Defragments the member serving at `endpoint`, waiting up to `timeout` (a large database takes longer
    /// than an ordinary request may). One attempt, no rotation: the point is that member.
    pub async fn defragment_at(&self, endpoint: &str, timeout: Duration) -> Result<(), EtcdError> {
        let endpoint = normalise_endpoint(endpoint, self.inner.settings.uses_tls())?;
        let settings = Settings {
            tls: std::sync::RwLock::new(self.inner.settings.tls()),
            tls_files: None,
            connect_timeout: self.inner.settings.connect_timeout,
            request_timeout: timeout,
        };
        let mut client = settings.build_client(&endpoint).await?;
        match tokio::time::timeout(timeout, client.defragment()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if is_retryable(&e) => Err(EtcdError::unavailable(endpoint, e)),
            Ok(Err(e)) => Err(EtcdError::request(e)),
            Err(_) => Err(EtcdError::unavailable(
                endpoint,
                timed_out("defragment", timeout),
            )),
        }
    }
}
