//! Pod sets: one pod on every node whose labels match, as Kubernetes' `apps/v1` `DaemonSet` has it (the
//! subset hostlet runs), stored at `/hostlet/podsets/<name>`. The leader's pod set controller writes each
//! matching node's pod at `/hostlet/hosts/<node>/pods/<name>` from the set's template, marked with the
//! annotations below, and rolls template changes out node by node.
//!
//! Every template is a revision (`/hostlet/podsets/<name>/revisions/<n>`); the controller's own record of
//! where the rollout stands is the set's status (`/hostlet/podsets/<name>/status`), so that the next
//! leader carries on where the last one stopped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::field::{is_dns_subdomain, FieldError};
use crate::manifest::PodManifest;
use crate::objects::Timestamp;
use crate::parse::ParseError;

/// The `apiVersion` a pod set is written with.
pub const API_VERSION: &str = "apps/v1";
/// Its `kind`.
pub const KIND: &str = "DaemonSet";
/// On a pod the controller wrote: the set that owns it.
pub const OWNER: &str = "hostlet.io/podset";
/// On a pod the controller wrote: the revision number of its template.
pub const REVISION: &str = "hostlet.io/podset-revision";
/// On a pod the controller wrote: the hash of its template (its status repeats it).
pub const HASH: &str = "hostlet.io/podset-hash";
/// On a set: `"true"` sends a failed rollout back to the last revision that was fully available.
pub const AUTO_REVERT: &str = "hostlet.io/auto-revert";

/// The defaults Kubernetes gives a DaemonSet (and, for the deadline, a Deployment).
pub const DEFAULT_REVISION_HISTORY_LIMIT: u32 = 10;
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;

/// The set as written: the fields hostlet reads; any other is refused with its path.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: RawSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    selector: Option<RawSelector>,
    /// Read as a value first: its `spec` is a v1 Pod's, read by the pod parser with its own paths.
    #[serde(default)]
    template: Option<serde_json::Value>,
    #[serde(default)]
    update_strategy: Option<RawStrategy>,
    #[serde(default)]
    min_ready_seconds: Option<u32>,
    #[serde(default)]
    revision_history_limit: Option<u32>,
    #[serde(default)]
    progress_deadline_seconds: Option<u32>,
    #[serde(default)]
    paused: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSelector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStrategy {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    rolling_update: Option<RawRolling>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRolling {
    #[serde(default)]
    max_unavailable: Option<serde_json::Value>,
    #[serde(default)]
    max_surge: Option<serde_json::Value>,
}

/// A count of nodes: a whole number, or a percentage of the matching nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(u32),
    Percent(u32),
}

impl IntOrPercent {
    fn parse(v: &serde_json::Value) -> Result<IntOrPercent, String> {
        if let Some(n) = v.as_u64() {
            return u32::try_from(n)
                .map(IntOrPercent::Int)
                .map_err(|_| "too large".to_string());
        }
        let bad = || format!("{v} is neither a whole number nor a percentage such as \"25%\"");
        let s = v.as_str().ok_or_else(bad)?;
        let n: u32 = s
            .strip_suffix('%')
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        if n > 100 {
            return Err(format!("{s:?} is more than 100%"));
        }
        Ok(IntOrPercent::Percent(n))
    }

    /// The count it stands for among `of` nodes: a percentage rounds up (as Kubernetes' maxUnavailable),
    /// and never below 1 where `at_least_one` is asked.
    pub fn of(self, of: usize, at_least_one: bool) -> usize {
        let n = match self {
            IntOrPercent::Int(n) => n as usize,
            IntOrPercent::Percent(p) => (of * p as usize).div_ceil(100),
        };
        if at_least_one {
            n.max(1)
        } else {
            n
        }
    }
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntOrPercent::Int(n) => write!(f, "{n}"),
            IntOrPercent::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// How a template change reaches the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    RollingUpdate {
        max_unavailable: IntOrPercent,
    },
    /// A node's pod is replaced only when an operator deletes it.
    OnDelete,
}

/// A pod set, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSet {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub selector: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    /// The pod every matching node runs (v1 form, id = the set's name), without the owner annotations.
    pub template: PodManifest,
    /// `spec.template` as written: what a revision keeps and a revert writes back.
    pub template_value: serde_json::Value,
    pub strategy: Strategy,
    pub min_ready_seconds: u32,
    pub revision_history_limit: u32,
    pub progress_deadline_seconds: u32,
    pub paused: bool,
    pub auto_revert: bool,
}

impl PodSet {
    /// The template's hash: what a revision and a pod's status are told apart by (10 hex digits).
    pub fn hash(&self) -> String {
        template_hash(&self.template_value)
    }

    /// The manifest written to a node for revision `revision`: the template, marked as the set's.
    pub fn pod_for(&self, revision: u64) -> PodManifest {
        let mut m = self.template.clone();
        m.annotations.insert(OWNER.into(), self.name.clone());
        m.annotations.insert(REVISION.into(), revision.to_string());
        m.annotations.insert(HASH.into(), self.hash());
        m
    }

    /// Whether a node with these labels runs the set.
    pub fn selects(&self, node_labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| node_labels.get(k) == Some(v))
    }
}

/// The hash of a template value (its canonical JSON: serde_json keeps object keys sorted).
pub fn template_hash(template: &serde_json::Value) -> String {
    let text = serde_json::to_string(template).unwrap_or_default();
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// Reads a pod set from YAML or JSON and checks it: every error names its field, as `pod validate` does
/// for a pod (a template's errors are under `spec.template.`).
pub fn parse(bytes: &[u8]) -> Result<PodSet, Vec<FieldError>> {
    let one = |path: &str, message: String| {
        vec![FieldError {
            path: path.to_string(),
            message,
        }]
    };
    let text = crate::parse::as_text(bytes).map_err(|e| one("", e.to_string()))?;
    let raw: Raw = crate::parse::typed(text).map_err(|e: ParseError| one("", e.to_string()))?;
    let mut errs = Vec::new();
    let mut err = |path: &str, message: String| {
        errs.push(FieldError {
            path: path.to_string(),
            message,
        })
    };
    if raw.api_version != API_VERSION {
        err(
            "apiVersion",
            format!("must be {API_VERSION} (found {:?})", raw.api_version),
        );
    }
    if raw.kind != KIND {
        err("kind", format!("must be {KIND} (found {:?})", raw.kind));
    }
    let name = raw.metadata.name.clone();
    if !is_dns_subdomain(&name) || name.len() > 63 || name.contains('.') {
        err(
            "metadata.name",
            format!("{name:?} is not a pod set name (a DNS label: at most 63 lowercase letters, digits and '-')"),
        );
    }
    for (field, map) in [
        ("metadata.labels", &raw.metadata.labels),
        ("metadata.annotations", &raw.metadata.annotations),
    ] {
        for k in map.keys() {
            if let Err(e) = crate::validation::check_key(k) {
                err(&format!("{field}[{k}]"), e);
            }
        }
    }
    let auto_revert = match raw
        .metadata
        .annotations
        .get(AUTO_REVERT)
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            err(
                &format!("metadata.annotations[{AUTO_REVERT}]"),
                format!("{other:?}: must be \"true\" or \"false\""),
            );
            false
        }
    };
    let selector = raw
        .spec
        .selector
        .as_ref()
        .map(|s| s.match_labels.clone())
        .unwrap_or_default();
    if selector.is_empty() {
        err(
            "spec.selector.matchLabels",
            "required: the labels of the set's pods (its template's labels must have them)".into(),
        );
    }
    for (k, v) in &selector {
        if let Err(e) = crate::labels::check(k, v) {
            err("spec.selector.matchLabels", e);
        }
    }
    let strategy = strategy(&raw.spec.update_strategy, &mut err);
    let (template, node_selector, template_value) = match &raw.spec.template {
        None => {
            err("spec.template", "required: the pod each node runs".into());
            (
                PodManifest::default(),
                BTreeMap::new(),
                serde_json::Value::Null,
            )
        }
        Some(t) => match template(&name, t) {
            Ok((m, ns)) => (m, ns, t.clone()),
            Err(es) => {
                errs.extend(es);
                return Err(errs);
            }
        },
    };
    for (k, v) in &selector {
        if template.labels.get(k) != Some(v) {
            errs.push(FieldError {
                path: "spec.template.metadata.labels".into(),
                message: format!("must match spec.selector.matchLabels: {k}={v} is not among them"),
            });
        }
    }
    for k in template.annotations.keys() {
        if [OWNER, REVISION, HASH].contains(&k.as_str()) {
            errs.push(FieldError {
                path: format!("spec.template.metadata.annotations[{k}]"),
                message: "set by the pod set controller, not in a template".into(),
            });
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(PodSet {
        name,
        labels: raw.metadata.labels,
        annotations: raw.metadata.annotations,
        selector,
        node_selector,
        template,
        template_value,
        strategy,
        min_ready_seconds: raw.spec.min_ready_seconds.unwrap_or(0),
        revision_history_limit: raw
            .spec
            .revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT),
        progress_deadline_seconds: raw
            .spec
            .progress_deadline_seconds
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
        paused: raw.spec.paused.unwrap_or(false),
        auto_revert,
    })
}

fn strategy(raw: &Option<RawStrategy>, err: &mut impl FnMut(&str, String)) -> Strategy {
    let default = Strategy::RollingUpdate {
        max_unavailable: IntOrPercent::Int(1),
    };
    let Some(raw) = raw else { return default };
    match raw.kind.as_deref() {
        Some("OnDelete") => {
            if raw.rolling_update.is_some() {
                err(
                    "spec.updateStrategy.rollingUpdate",
                    "only with type RollingUpdate".into(),
                );
            }
            Strategy::OnDelete
        }
        None | Some("RollingUpdate") => {
            let r = raw.rolling_update.clone().unwrap_or_default();
            let max_unavailable = match r.max_unavailable.as_ref().map(IntOrPercent::parse) {
                None => IntOrPercent::Int(1),
                Some(Ok(v)) => v,
                Some(Err(e)) => {
                    err("spec.updateStrategy.rollingUpdate.maxUnavailable", e);
                    IntOrPercent::Int(1)
                }
            };
            if matches!(
                max_unavailable,
                IntOrPercent::Int(0) | IntOrPercent::Percent(0)
            ) {
                err(
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                    "must be more than 0: a rollout replaces a node's pod in place".into(),
                );
            }
            match r.max_surge.as_ref().map(IntOrPercent::parse) {
                None | Some(Ok(IntOrPercent::Int(0) | IntOrPercent::Percent(0))) => {}
                Some(Ok(_)) => err(
                    "spec.updateStrategy.rollingUpdate.maxSurge",
                    "must be 0: hostlet runs one pod of a set per node and replaces it in place"
                        .into(),
                ),
                Some(Err(e)) => err("spec.updateStrategy.rollingUpdate.maxSurge", e),
            }
            Strategy::RollingUpdate { max_unavailable }
        }
        Some(other) => {
            err(
                "spec.updateStrategy.type",
                format!("{other:?}: must be RollingUpdate or OnDelete"),
            );
            default
        }
    }
}

/// The template as a v1 Pod named after the set, and its `nodeSelector` (which a pod itself does not have).
fn template(
    name: &str,
    t: &serde_json::Value,
) -> Result<(PodManifest, BTreeMap<String, String>), Vec<FieldError>> {
    let fail = |path: &str, message: String| {
        vec![FieldError {
            path: path.to_string(),
            message,
        }]
    };
    let Some(obj) = t.as_object() else {
        return Err(fail("spec.template", "must be a mapping".into()));
    };
    let mut unknown: Vec<&String> = obj
        .keys()
        .filter(|k| *k != "metadata" && *k != "spec")
        .collect();
    if let Some(meta) = obj.get("metadata").and_then(|m| m.as_object()) {
        unknown.extend(
            meta.keys()
                .filter(|k| *k != "labels" && *k != "annotations"),
        );
    }
    if let Some(k) = unknown.first() {
        return Err(fail(
            &format!("spec.template.{k}"),
            "unknown field (hostlet does not support it)".into(),
        ));
    }
    let mut spec = obj
        .get("spec")
        .cloned()
        .unwrap_or(serde_json::Value::Object(Default::default()));
    let mut node_selector = BTreeMap::new();
    if let Some(ns) = spec.as_object_mut().and_then(|s| s.remove("nodeSelector")) {
        node_selector = serde_json::from_value::<BTreeMap<String, String>>(ns).map_err(|e| {
            fail(
                "spec.template.spec.nodeSelector",
                format!("must map label keys to values: {e}"),
            )
        })?;
        for (k, v) in &node_selector {
            if let Err(e) = crate::labels::check(k, v) {
                return Err(fail("spec.template.spec.nodeSelector", e));
            }
        }
    }
    let mut meta = obj
        .get("metadata")
        .cloned()
        .unwrap_or(serde_json::Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.insert("name".into(), serde_json::Value::String(name.to_string()));
    }
    let pod = serde_json::json!({
        "apiVersion": crate::v1::API_VERSION,
        "kind": crate::v1::KIND,
        "metadata": meta,
        "spec": spec,
    });
    let text = serde_json::to_string(&pod).unwrap_or_default();
    let m = crate::parse::parse_manifest(text.as_bytes()).map_err(|e| {
        // The pod parser names fields from the pod's root; here the pod is the template.
        let message = e.message.replacen("spec.", "spec.template.spec.", 1);
        fail("", message)
    })?;
    let errs: Vec<FieldError> = crate::validation::validate(&m)
        .into_iter()
        .filter(|e| e.path != "metadata.name")
        .map(|e| FieldError {
            path: format!("spec.template.{}", e.path),
            message: e.message,
        })
        .collect();
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok((m, node_selector))
}

/// The JSON a set is stored as: what was given, with the template replaced (a revert, an undo).
pub fn with_template(stored: &[u8], template: &serde_json::Value) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(stored).ok()?;
    let mut v: serde_json::Value = yaml_serde::from_str(text).ok()?;
    *v.pointer_mut("/spec/template")? = template.clone();
    serde_json::to_vec_pretty(&v).ok()
}

/// The stored form of a set the CLI writes: JSON, whatever the file was.
pub fn to_stored(bytes: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let v: serde_json::Value = yaml_serde::from_str(text).ok()?;
    serde_json::to_vec_pretty(&v).ok()
}

/// `/hostlet/podsets/<name>/revisions/<n>`: one template the set has had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub revision: u64,
    pub hash: String,
    pub template: serde_json::Value,
    pub created: Timestamp,
}

/// One condition of a set's status, as Kubernetes writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    /// `True` or `False`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub last_transition_time: Timestamp,
}

/// Where the rollout of the update revision stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    pub revision: u64,
    pub hash: String,
    pub started: Timestamp,
    /// The last time one more node's pod of this revision became available (the deadline counts from it).
    pub progressed: Timestamp,
    /// How many nodes had an available pod of this revision at that time.
    pub available: u64,
    /// Set once the rollout has stopped for good: when, and the nodes whose pods did not become available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failure>,
    #[serde(default)]
    pub complete: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    #[serde(default)]
    pub revision: u64,
    pub at: Timestamp,
    pub nodes: Vec<String>,
    pub reason: String,
}

/// `/hostlet/podsets/<name>/status`: written by the leader's controller only, and only when it changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetStatus {
    pub desired_number_scheduled: u64,
    pub current_number_scheduled: u64,
    pub updated_number_scheduled: u64,
    pub number_ready: u64,
    pub number_available: u64,
    pub number_unavailable: u64,
    pub number_misscheduled: u64,
    /// The etcd mod revision of the set's key this status was made from.
    pub observed_generation: i64,
    pub current_revision: u64,
    pub update_revision: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The last revision whose rollout completed (every node available): where an auto-revert goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good: Option<u64>,
    /// The last rollout that failed, kept through the revert that followed it (until a new template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Failure>,
    /// The hash an auto-revert went back to, while the set still runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_to: Option<String>,
    /// Counts the controller's writes: every write of pods also writes the status, under a compare on its
    /// last version, so that a controller whose caches lag behind its own last step cannot take another.
    #[serde(default)]
    pub steps: u64,
}

impl PodSetStatus {
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

#[cfg(test)]
mod tests;
