//! The on-demand request protocol: what an operator writes to `/hostlet/hosts/<node>/requests/snapshot`,
//! how the agent answers it, and the progress it writes while the snapshot runs.

use std::sync::Arc;
use std::time::Duration;

pub use hostlet_api::objects::{
    check_snapshot_name, SnapshotRequest, SnapshotRequestState, UploadProgress, ON_DEMAND_NAME,
};
use tokio_util::sync::CancellationToken;

use super::effects::SnapshotEffects;
use super::policy::plain;

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

/// Writes a running request's progress into its key: the first at once, then at most once per
/// [`PROGRESS_EVERY`] with the newest figures, except that an upload's start and end are written at once,
/// so that the requester times each upload from its start and sees it reach its total. Returns the number of writes once `stop` is cancelled
/// (checked only between writes) or the sender is gone.
pub(super) async fn report_progress<S: SnapshotEffects>(
    effects: Arc<S>,
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
            if let Err(e) = effects.write_request(&shown).await {
                tracing::debug!(error = %e, "could not write a snapshot request's progress");
            }
            writes += 1;
            last = Some(tokio::time::Instant::now());
            pending = false;
        }
    }
}
