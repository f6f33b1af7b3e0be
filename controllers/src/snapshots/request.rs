//! The on-demand request protocol: what an operator writes to `/hostlet/hosts/<node>/requests/snapshot`,
//! how the agent answers it, and the progress it writes while the snapshot runs.

use std::time::Duration;

pub use hostlet_api::objects::{
    check_snapshot_name, SnapshotRequest, SnapshotRequestState, UploadProgress, ON_DEMAND_NAME,
};

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
