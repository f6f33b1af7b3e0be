//! The JSON objects hostlet writes to etcd and operators read: pod status, events, node records, learner
//! progress, snapshot records, the snapshot policy and the on-demand snapshot request.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time, written as RFC 3339 UTC (`2026-11-30T02:25:06.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub SystemTime);

impl Timestamp {
    pub fn now() -> Self {
        Timestamp(SystemTime::now())
    }
    pub fn from_unix(secs: u64) -> Self {
        Timestamp(UNIX_EPOCH + Duration::from_secs(secs))
    }
    pub fn unix_secs(&self) -> u64 {
        self.0
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_rfc3339_millis(self.0).to_string())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&s)
            .map(Timestamp)
            .map_err(|e| serde::de::Error::custom(format!("timestamp {s:?}: {e}")))
    }
}

/// The phase of a pod, as Kubernetes names it, plus `Rejected` for a manifest that will not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Rejected,
}

/// `/hostlet/hosts/<node>/status/<pod-id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub id: String,
    pub node: String,
    pub phase: PodPhase,
    /// Which source the manifest came from (`etcd-key`, `file`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The manifest as its source gave it, for a pod without a pod key of its own (file, URL, HTTP, an etcd
    /// list), as a kubelet's mirror pod: so that `hostlet pod get` shows it. Absent for `etcd-key` pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub ready: bool,
    /// The init containers, in order (a completed one is `terminated` with reason `Completed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<ContainerStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The `hostlet.io/podset-hash` annotation of the manifest this status describes: a pod set's
    /// controller tells a node that already runs the new template from one that does not yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_hash: Option<String>,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub state: ContainerState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerState>,
    pub restart_count: u32,
    pub ready: bool,
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Last result of each probe kind (`liveness` → `success`/`failure`/`error`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ContainerState {
    Waiting {
        reason: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i64,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finished_at: Option<Timestamp>,
    },
}

/// `/hostlet/events/<node>/<unix-nanos>-<seq>`, on a 48 h lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Created, Started, Killing, Unhealthy, BackOff, Rejected, Pulled, Failed, …
    pub reason: String,
    pub message: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: String,
    /// When it first happened (the same as `firstTimestamp`).
    pub timestamp: Timestamp,
    /// How many times it happened: repeats of the same (pod, container, reason, message) update one event.
    #[serde(default = "one")]
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_timestamp: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_timestamp: Option<Timestamp>,
}

fn one() -> u64 {
    1
}

/// `/hostlet/nodes/<node>`: written at start; deleting it asks for the node's etcd member to be removed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub name: String,
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_name: Option<String>,
    /// The etcd member id, as hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_url: Option<String>,
    /// The agent's API URL (`--listen`), used by joiners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    pub version: String,
    pub started: Timestamp,
    /// `--role`: `voter` or `worker` when the operator pinned one; absent for `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<NodeRole>,
    /// `--failure-domain`: voters are spread across these when a choice is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// When this node's etcd member was created (absent on a worker): the newest voter leaves first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_since: Option<Timestamp>,
    /// When the first of the node's certificates expires (absent without TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_expires: Option<Timestamp>,
    /// The serials (hex) of the node's server, peer and client certificates (empty without TLS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cert_serials: Vec<String>,
    /// The node's own labels: the built-in ones and `--node-label` (an admin's are at
    /// `/hostlet/node-labels/<node>`; see [`crate::labels`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The tagged images the node's engine holds, name → id (at most 256), which other nodes may fetch
    /// from its agent when they cannot pull them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub images: std::collections::BTreeMap<String, String>,
}

/// What an operator pins a node to (`--role`); `auto` is the absence of a pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Voter,
    Worker,
}

/// The etcd voter counts the cluster policy accepts: odd, 1 to 7, as etcd's own guidance says.
pub const VOTER_TARGETS: [u8; 4] = [1, 3, 5, 7];
/// The voter target when `/hostlet/config/cluster` says nothing.
pub const DEFAULT_VOTERS: u8 = 3;

/// `/hostlet/config/cluster`: the cluster-wide settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterPolicy {
    /// How many etcd voters the cluster keeps: 1, 3, 5 or 7 (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voters: Option<u8>,
}

impl ClusterPolicy {
    /// Parses and checks a policy value; the error names the field.
    pub fn parse(value: &[u8]) -> Result<ClusterPolicy, String> {
        let p: ClusterPolicy = serde_json::from_slice(value)
            .or_else(|_| yaml_serde::from_slice(value))
            .map_err(|e| format!("not a cluster policy ({{\"voters\": 3}}): {e}"))?;
        if let Some(v) = p.voters {
            check_voters(v)?;
        }
        Ok(p)
    }

    /// The voter target in force.
    pub fn voters_target(&self) -> u8 {
        self.voters.unwrap_or(DEFAULT_VOTERS)
    }
}

/// Checks a voter target: `voters: …` names the field.
pub fn check_voters(v: u8) -> Result<(), String> {
    if VOTER_TARGETS.contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "voters: {v} is not one of 1, 3, 5, 7 (an even count adds a member without adding a failure it survives)"
        ))
    }
}

/// What a member request asks of a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum MemberAction {
    /// `join`: start an etcd member and join as a learner.
    Join,
    /// Written by hand or by another version, kept as written (the worker refuses it by name).
    Other(String),
}

impl From<String> for MemberAction {
    fn from(s: String) -> Self {
        if s == "join" {
            MemberAction::Join
        } else {
            MemberAction::Other(s)
        }
    }
}

impl From<MemberAction> for String {
    fn from(a: MemberAction) -> Self {
        match a {
            MemberAction::Join => "join".to_string(),
            MemberAction::Other(s) => s,
        }
    }
}

/// `/hostlet/hosts/<node>/requests/member`: the leader asks a worker to become an etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRequest {
    /// The worker asked.
    pub node: String,
    pub action: MemberAction,
    /// The API URL of a voter's agent to join through.
    pub server: String,
    /// Why (an event on the node repeats it).
    #[serde(default)]
    pub reason: String,
    pub requested: Timestamp,
}

/// `/hostlet/etcd/learner-progress`: one entry per learner, keyed by member id (hex).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LearnerProgress {
    #[serde(default)]
    pub learners: BTreeMap<String, LearnerRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LearnerRecord {
    pub name: String,
    pub added: Timestamp,
    pub applied_index: u64,
    /// Bytes of a raft snapshot received so far, while the leader sends one.
    #[serde(default)]
    pub snapshot_bytes_received: u64,
    /// When progress was last seen; the stall clock runs from here.
    pub last_progress: Timestamp,
    /// Bytes the leader has sent it (raft entries and snapshots), as the leader's own etcd counts them. A
    /// learner serves no client requests until it has nearly caught up, so while it catches up this is what
    /// shows it moving. Each leader counts from its own start.
    #[serde(default)]
    pub bytes_sent: u64,
    /// The leader is sending it a raft snapshot (its applied index stands still meanwhile).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub receiving_snapshot: bool,
}

/// Whether a snapshot file is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotStatus {
    Successful,
    Failed,
}

/// `/hostlet/etcd/upgrades/<node>`: a voter's etcd binary as its agent saw it last, written when it changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdUpgradeState {
    /// The node's etcd member.
    pub member: String,
    /// The release the member runs.
    pub running: String,
    /// The release of the binary at `--etcd-binary` now.
    pub on_disk: String,
    pub phase: UpgradePhase,
    /// Why it waits or was refused; empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the agent noticed the binary differ from the running member (unset while they agree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noticed: Option<Timestamp>,
}

/// Where a member's etcd upgrade stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UpgradePhase {
    /// The member runs the binary on disk.
    Current,
    /// The binary changed; the member waits for its turn or for a check to pass.
    Waiting,
    /// Its turn: the member is being restarted on the new binary.
    Upgrading,
    /// The version gate refuses the new binary; the member runs on as it is.
    Refused,
}

impl std::fmt::Display for UpgradePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UpgradePhase::Current => "current",
            UpgradePhase::Waiting => "waiting",
            UpgradePhase::Upgrading => "upgrading",
            UpgradePhase::Refused => "refused",
        })
    }
}

/// `/hostlet/etcd/snapshots/<node>/<file>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub name: String,
    pub node: String,
    pub file: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    pub revision: i64,
    pub created: Timestamp,
    #[serde(default)]
    pub duration_seconds: f64,
    #[serde(default)]
    pub compressed: bool,
    /// Encrypted with the node's snapshot key (the file name ends in `.enc`); a restore needs that key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// True for an operator's on-demand snapshot; retention counts those by their own name.
    #[serde(default)]
    pub on_demand: bool,
    pub status: SnapshotStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether the file is on the node's disk; false once local retention deleted it while its object stays.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub local: bool,
    /// The copy in object storage, when a target is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteCopy>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Where a snapshot's object-storage copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteState {
    /// Uploaded and read back: size and stored sha256 match the local file.
    Ok,
    /// The last upload failed; the next run retries it while the local file exists.
    Failed,
    /// Deleted by remote retention (or never uploaded because retention would delete it at once).
    Pruned,
}

/// A snapshot's copy in object storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteCopy {
    pub state: RemoteState,
    /// `s3://<bucket>/<prefix>/<node>/<file>`.
    pub url: String,
    /// Upload attempts so far.
    #[serde(default)]
    pub attempts: u32,
    /// When the state was last set.
    pub updated: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `/hostlet/config/snapshots` (cluster-wide) and `/hostlet/hosts/<node>/config/snapshots` (per node).
/// Fields left out fall back to the wider policy, then to the flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotPolicy {
    /// 5- or 6-field cron, or `@every <duration>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// The object-storage target (credentials never go here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Policy>,
}

/// The `s3` part of a snapshot policy; fields left out fall back like the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct S3Policy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Objects kept per name under this node's prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u32>,
}

impl S3Policy {
    pub fn over(&self, wider: &S3Policy) -> S3Policy {
        S3Policy {
            endpoint: self.endpoint.clone().or_else(|| wider.endpoint.clone()),
            bucket: self.bucket.clone().or_else(|| wider.bucket.clone()),
            prefix: self.prefix.clone().or_else(|| wider.prefix.clone()),
            region: self.region.clone().or_else(|| wider.region.clone()),
            retention: self.retention.or(wider.retention),
        }
    }
}

impl SnapshotPolicy {
    /// This policy with the gaps filled from `wider`.
    pub fn over(&self, wider: &SnapshotPolicy) -> SnapshotPolicy {
        SnapshotPolicy {
            schedule: self.schedule.clone().or_else(|| wider.schedule.clone()),
            retention: self.retention.or(wider.retention),
            compress: self.compress.or(wider.compress),
            disabled: self.disabled.or(wider.disabled),
            s3: match (&self.s3, &wider.s3) {
                (Some(a), Some(b)) => Some(a.over(b)),
                (a, b) => a.clone().or_else(|| b.clone()),
            },
        }
    }
}

/// Parses a duration written `10s`, `5m`, `1h`, `1h30m`, `250ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 10s, 5m or 1h: {e}"))
}

// The on-demand snapshot request protocol.

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
    pub state: Option<SnapshotRequestState>,
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
pub enum SnapshotRequestState {
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

impl SnapshotRequestState {
    /// An answer: the request is over (the key stays with it until the next request).
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            SnapshotRequestState::Done | SnapshotRequestState::Failed | SnapshotRequestState::Busy
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            SnapshotRequestState::Running => "running",
            SnapshotRequestState::Done => "done",
            SnapshotRequestState::Failed => "failed",
            SnapshotRequestState::Busy => "busy",
            SnapshotRequestState::Other(s) => s,
        }
    }
}

impl From<String> for SnapshotRequestState {
    fn from(s: String) -> Self {
        match s.as_str() {
            "running" => SnapshotRequestState::Running,
            "done" => SnapshotRequestState::Done,
            "failed" => SnapshotRequestState::Failed,
            "busy" => SnapshotRequestState::Busy,
            _ => SnapshotRequestState::Other(s),
        }
    }
}

impl From<SnapshotRequestState> for String {
    fn from(s: SnapshotRequestState) -> Self {
        s.as_str().to_string()
    }
}

impl std::fmt::Display for SnapshotRequestState {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_action_is_read_as_written_and_an_unknown_one_kept() {
        let r: MemberRequest = serde_json::from_str(
            r#"{"node":"w1","action":"join","server":"https://a:10250","requested":"2026-12-04T10:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(r.action, MemberAction::Join);
        assert!(serde_json::to_string(&r)
            .unwrap()
            .contains(r#""action":"join""#));
        let r: MemberRequest = serde_json::from_str(
            r#"{"node":"w1","action":"Leave","server":"","requested":"2026-12-04T10:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(r.action, MemberAction::Other("Leave".into()));
        assert!(serde_json::to_string(&r)
            .unwrap()
            .contains(r#""action":"Leave""#));
    }

    #[test]
    fn objects_round_trip_through_json() {
        let status = PodStatus {
            id: "web".into(),
            node: "n1".into(),
            phase: PodPhase::Running,
            source: Some("etcd-key".into()),
            manifest: None,
            message: String::new(),
            ready: true,
            init_containers: Vec::new(),
            containers: vec![ContainerStatus {
                name: "app".into(),
                state: ContainerState::Terminated {
                    exit_code: 137,
                    reason: "OOMKilled".into(),
                    finished_at: Some(Timestamp::from_unix(1_700_000_000)),
                },
                last_state: None,
                restart_count: 2,
                ready: false,
                image: "busybox:latest".into(),
                container_id: None,
                probes: BTreeMap::new(),
            }],
            started_at: None,
            revision_hash: None,
            updated_at: Timestamp::from_unix(1_700_000_001),
        };
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.contains("\"exitCode\":137"), "{json}");
        assert!(json.contains("2023-11-14T22:13:20"), "{json}");
        assert_eq!(serde_json::from_str::<PodStatus>(&json).unwrap(), status);
    }

    #[test]
    fn snapshot_policy_layers_per_node_over_cluster() {
        let cluster = SnapshotPolicy {
            schedule: Some("@every 1h".into()),
            retention: Some(5),
            ..Default::default()
        };
        let node = SnapshotPolicy {
            retention: Some(2),
            ..Default::default()
        };
        let eff = node.over(&cluster);
        assert_eq!(eff.schedule.as_deref(), Some("@every 1h"));
        assert_eq!(eff.retention, Some(2));
        assert!(serde_json::from_str::<SnapshotPolicy>(r#"{"retension": 3}"#).is_err());
    }

    #[test]
    fn durations_as_operators_write_them() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("ten").is_err());
    }

    #[test]
    fn request_states_are_written_as_the_protocol_spells_them() {
        for (state, text) in [
            (SnapshotRequestState::Running, "running"),
            (SnapshotRequestState::Done, "done"),
            (SnapshotRequestState::Failed, "failed"),
            (SnapshotRequestState::Busy, "busy"),
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
        assert_eq!(
            odd.state,
            Some(SnapshotRequestState::Other("paused".into()))
        );
        assert!(!SnapshotRequestState::Other("paused".into()).is_answer());
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

/// The certificates issued to one node, by serial (lowercase hex), as kept in etcd
/// (`/hostlet/certs/<node>`): the join that issues them records them, and `hostlet node delete` moves the
/// node's current ones to `revoked`, which every voter's etcd and API refuse from then on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificates {
    #[serde(default)]
    pub issued: Vec<String>,
    #[serde(default)]
    pub revoked: Vec<String>,
    /// When the node was last deleted: a worker token made before then cannot bring the name back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
    /// Serials a node's later certificates replaced: etcd refuses them (they may be certificates from the
    /// cluster CA that an earlier version gave workers, or a voter's ten-year ones), while the node itself
    /// is not deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<String>,
    /// `issued` holds a worker's certificates as this version issues them, none of which opens etcd.
    /// `false` for a voter's, and for a worker joined by an earlier version until it renews.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub worker_certs: bool,
}

impl NodeCertificates {
    /// Records newly issued serials. None is ever dropped: a serial forgotten could not be revoked.
    pub fn issue(&mut self, serials: impl IntoIterator<Item = String>) {
        for s in serials {
            if !self.issued.contains(&s) {
                self.issued.push(s);
            }
        }
    }

    /// Records a worker's new certificates: every serial issued before is superseded (etcd refuses it
    /// from now on), the node itself stays trusted.
    pub fn issue_to_worker(&mut self, serials: Vec<String>) {
        for s in self.issued.drain(..) {
            if !serials.contains(&s) && !self.superseded.contains(&s) {
                self.superseded.push(s);
            }
        }
        self.issued = serials;
        self.worker_certs = true;
    }

    /// Supersedes every issued serial but `current` (a member's renewed certificates, once it presents
    /// them): etcd refuses the earlier ones from then on.
    pub fn supersede_all_but(&mut self, current: &[String]) {
        let (keep, old): (Vec<String>, Vec<String>) =
            self.issued.drain(..).partition(|s| current.contains(s));
        for s in old {
            if !self.superseded.contains(&s) {
                self.superseded.push(s);
            }
        }
        self.issued = keep;
    }

    /// Revokes every issued serial.
    pub fn revoke(&mut self, at: Timestamp) {
        self.revoked.append(&mut self.issued);
        self.revoked_at = Some(at);
        self.worker_certs = false;
    }
}

/// A worker join token as kept in etcd (`/hostlet/tokens/<id>`): the secret only as its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinToken {
    pub id: String,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub created: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<Timestamp>,
    /// How many joins it admits (`None`: any number until it expires or is revoked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
    #[serde(default)]
    pub used: u32,
    #[serde(default)]
    pub revoked: bool,
}

/// Whether a join token admits a join now, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinTokenState {
    Valid,
    Expired,
    Revoked,
    UsedUp,
}

impl JoinTokenState {
    pub fn as_str(self) -> &'static str {
        match self {
            JoinTokenState::Valid => "valid",
            JoinTokenState::Expired => "expired",
            JoinTokenState::Revoked => "revoked",
            JoinTokenState::UsedUp => "used up",
        }
    }
}

impl JoinToken {
    /// Revoked first, then expired, then used up: the message names the first that holds.
    pub fn state(&self, now: SystemTime) -> JoinTokenState {
        if self.revoked {
            JoinTokenState::Revoked
        } else if self.expires.is_some_and(|e| e.0 <= now) {
            JoinTokenState::Expired
        } else if self.uses.is_some_and(|u| self.used >= u) {
            JoinTokenState::UsedUp
        } else {
            JoinTokenState::Valid
        }
    }
}

#[cfg(test)]
mod join_token_tests {
    use super::*;

    #[test]
    fn a_token_is_refused_for_the_first_reason_that_holds() {
        let now = SystemTime::now();
        let t = JoinToken {
            id: "abc123".into(),
            secret_sha256: "00".into(),
            description: String::new(),
            created: Timestamp(now),
            expires: Some(Timestamp(now + Duration::from_secs(60))),
            uses: Some(1),
            used: 0,
            revoked: false,
        };
        assert_eq!(t.state(now), JoinTokenState::Valid);
        assert_eq!(
            t.state(now + Duration::from_secs(60)),
            JoinTokenState::Expired
        );
        let used = JoinToken {
            used: 1,
            ..t.clone()
        };
        assert_eq!(used.state(now), JoinTokenState::UsedUp);
        let revoked = JoinToken {
            revoked: true,
            ..used
        };
        assert_eq!(revoked.state(now), JoinTokenState::Revoked);
        let forever = JoinToken {
            expires: None,
            uses: None,
            ..t
        };
        assert_eq!(
            forever.state(now + Duration::from_secs(1 << 30)),
            JoinTokenState::Valid
        );
    }

    #[test]
    fn a_members_renewal_supersedes_every_earlier_serial_and_keeps_its_current_ones() {
        let mut r = NodeCertificates::default();
        r.issue(["a1".to_string(), "a2".to_string()]);
        r.issue(["b1".to_string(), "b2".to_string()]);
        r.supersede_all_but(&["b1".to_string(), "b2".to_string()]);
        assert_eq!(r.issued, ["b1", "b2"]);
        assert_eq!(r.superseded, ["a1", "a2"]);
        // Again (a retried renewal): nothing twice.
        r.issue(["a1".to_string()]);
        r.supersede_all_but(&["b1".to_string(), "b2".to_string()]);
        assert_eq!(r.superseded, ["a1", "a2"]);
        assert!(r.revoked.is_empty() && !r.worker_certs);
    }
}
