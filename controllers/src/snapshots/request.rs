//! The on-demand request protocol: what an operator writes to `/hostlet/hosts/<node>/requests/snapshot`,
//! how the agent answers it, and the progress it writes while the snapshot runs.

use std::time::Duration;

use hostlet_api::objects::SnapshotRecord;
use hostlet_runtime::etcd::Etcd;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::policy::plain;

/// The name an on-demand snapshot gets when the request names none.
pub const ON_DEMAND_NAME: &str = "on-demand";

/// The request an operator writes to `/hostlet/hosts/<node>/requests/snapshot`, and the answer the agent
/// writes back into it before deleting it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Chosen by the requester to recognise its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Where it stands; absent in a fresh request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RequestState>,
    /// Bytes of the snapshot stream received so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_bytes: Option<u64>,
    /// The upload under way (or last finished) in the object-storage pass that follows the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadProgress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<SnapshotRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a snapshot request stands, as the agent writes it into the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RequestState {
    /// Taken: the snapshot, then its uploads, under way.
    Running,
    /// Taken, verified and recorded.
    Done,
    /// Tried and failed, or refused (the error says why).
    Failed,
    /// Refused: another snapshot runs.
    Busy,
    /// Written by hand or by another version, kept as written.
    Other(String),
}

impl RequestState {
    /// An answer: the request is over (the key stays with it until the next request).
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            RequestState::Done | RequestState::Failed | RequestState::Busy
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            RequestState::Running => "running",
            RequestState::Done => "done",
            RequestState::Failed => "failed",
            RequestState::Busy => "busy",
            RequestState::Other(s) => s,
        }
    }
}

impl From<String> for RequestState {
    fn from(s: String) -> Self {
        match s.as_str() {
            "running" => RequestState::Running,
            "done" => RequestState::Done,
            "failed" => RequestState::Failed,
            "busy" => RequestState::Busy,
            _ => RequestState::Other(s),
        }
    }
}

impl From<RequestState> for String {
    fn from(s: RequestState) -> Self {
        s.as_str().to_string()
    }
}

impl std::fmt::Display for RequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far one upload to object storage has got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadProgress {
    pub file: String,
    pub url: String,
    /// Bytes the server has acknowledged (whole parts).
    pub sent_bytes: u64,
    pub total_bytes: u64,
}

impl UploadProgress {
    pub fn finished(&self) -> bool {
        self.sent_bytes >= self.total_bytes
    }
}

/// How far a snapshot taken with [`super::scheduler::SnapshotScheduler::take`] has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeProgress {
    /// Bytes of the snapshot stream received so far.
    Received(u64),
    /// An upload of the object-storage pass that follows the snapshot.
    Upload(UploadProgress),
}

/// A request's progress is written at most this often (an upload's start and end are written at once).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A snapshot request key's value; blank is an empty request.
pub fn decode_request(
    _key: &str,
    bytes: &[u8],
) -> Result<SnapshotRequest, hostlet_runtime::informer::DecodeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(SnapshotRequest::default());
    }
    yaml_serde::from_slice(bytes).map_err(plain)
}

/// On-demand names end up in file names: keep them to letters, digits, `.`, `_` and `-`.
pub fn check_snapshot_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("snapshot name {name:?}: 1 to 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(format!(
            "snapshot name {name:?}: only letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Writes a running request's progress into its key: the first at once, then at most once per
/// [`PROGRESS_EVERY`] with the newest figures, except that an upload's start and end are written at once,
/// so that the requester times each upload from its start and sees it reach its total. Returns the number of writes once `stop` is cancelled
/// (checked only between writes) or the sender is gone.
pub(super) async fn report_progress(
    etcd: Etcd,
    key: String,
    mut shown: SnapshotRequest,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<TakeProgress>,
    stop: CancellationToken,
) -> u64 {
    let mut writes = 0u64;
    let mut last: Option<tokio::time::Instant> = None;
    let mut pending = false;
    loop {
        let due = last.map_or_else(tokio::time::Instant::now, |t| t + PROGRESS_EVERY);
        let msg = tokio::select! {
            biased;
            _ = stop.cancelled() => return writes,
            _ = tokio::time::sleep_until(due), if pending => None,
            m = rx.recv() => match m {
                Some(m) => Some(m),
                None => return writes,
            },
        };
        let urgent = match msg {
            None => true,
            Some(TakeProgress::Received(b)) => {
                shown.progress_bytes = Some(b);
                false
            }
            Some(TakeProgress::Upload(u)) => {
                let edge = u.sent_bytes == 0 || u.finished();
                shown.upload = Some(u);
                edge
            }
        };
        pending = true;
        if urgent || last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            if let Err(e) = etcd
                .put(&key, serde_json::to_vec(&shown).unwrap_or_default())
                .await
            {
                tracing::debug!(error = %e, "could not write a snapshot request's progress");
            }
            writes += 1;
            last = Some(tokio::time::Instant::now());
            pending = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_states_are_written_as_the_protocol_spells_them() {
        for (state, text) in [
            (RequestState::Running, "running"),
            (RequestState::Done, "done"),
            (RequestState::Failed, "failed"),
            (RequestState::Busy, "busy"),
        ] {
            let req = SnapshotRequest {
                state: Some(state.clone()),
                ..Default::default()
            };
            let json = serde_json::to_string(&req).unwrap();
            assert_eq!(json, format!(r#"{{"state":"{text}"}}"#));
            let back: SnapshotRequest = serde_json::from_str(&json).unwrap();
            assert_eq!(back.state, Some(state.clone()));
            assert_eq!(state.is_answer(), text != "running");
        }
        let odd: SnapshotRequest = serde_json::from_str(r#"{"state":"paused"}"#).unwrap();
        assert_eq!(odd.state, Some(RequestState::Other("paused".into())));
        assert!(!RequestState::Other("paused".into()).is_answer());
    }

    #[test]
    fn invalid_names_are_refused_with_the_reason() {
        for bad in ["../../evil", "a/b", &"x".repeat(300)] {
            let e = check_snapshot_name(bad).unwrap_err();
            assert!(e.contains("snapshot name"), "{e}");
        }
        assert!(check_snapshot_name("pre-upgrade_1.2").is_ok());
    }
}
