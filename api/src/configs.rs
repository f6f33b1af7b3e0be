//! Configuration objects a pod can use: the Kubernetes v1 `ConfigMap` and `Secret`, cluster-wide and
//! namespace-less (a cluster has one set of names), kept in etcd under keys of their own (see
//! [`crate::keys`]). Parsed with the same rules as manifests (unknown fields refused with their path) and
//! validated with every error at once.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::field::{is_dns_subdomain, FieldError};
use crate::parse::ParseError;
use crate::v1::ObjectMeta;

/// What etcd's default request size leaves for one object, as Kubernetes limits it.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;
/// The only `Secret` type hostlet handles.
pub const SECRET_TYPE_OPAQUE: &str = "Opaque";

/// A `ConfigMap`: text under `data`, bytes (base64) under `binaryData`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMap {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub binary_data: BTreeMap<String, String>,
}

/// A `Secret`: bytes (base64) under `data`; `stringData` is a write-only convenience folded into `data`
/// by [`Secret::normalise`], as the Kubernetes API server does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub string_data: BTreeMap<String, String>,
    /// `data` as kept in etcd: sealed by the agents' secret key (written by hostlet only; see
    /// [`SealedData`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<SealedData>,
}

/// A secret's `data`, encrypted (AES-256-GCM, the secret's name as associated data) under the key of
/// `keyId`. The key itself is never in etcd: each node derives it from material only it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SealedData {
    pub key_id: String,
    /// Base64.
    pub nonce: String,
    /// Base64 of the encrypted JSON of `data`.
    pub ciphertext: String,
}

/// `/hostlet/config/secrets-encryption`: which key new secret writes use (not the key; the id only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretsEncryption {
    pub key_id: String,
}

/// The key id of a cluster that never rotated.
pub const FIRST_KEY_ID: &str = "k1";

impl SecretsEncryption {
    /// The id in force: the key's value, `k1` when absent.
    pub fn active(value: Option<&[u8]>) -> Result<String, String> {
        match value {
            None => Ok(FIRST_KEY_ID.to_string()),
            Some(v) => {
                let s: SecretsEncryption =
                    serde_json::from_slice(v).map_err(|e| format!("secrets-encryption: {e}"))?;
                key_number(&s.key_id)
                    .map(|_| s.key_id.clone())
                    .ok_or_else(|| {
                        format!("secrets-encryption: keyId {:?} is not k<number>", s.key_id)
                    })
            }
        }
    }

    /// The id after `id`: `k1` → `k2`.
    pub fn next(id: &str) -> Option<String> {
        Some(format!("k{}", key_number(id)?.checked_add(1)?))
    }
}

fn key_number(id: &str) -> Option<u32> {
    id.strip_prefix('k')?.parse().ok().filter(|n| *n >= 1)
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// A key of `data`: what Kubernetes allows, since it becomes a file name and an environment variable.
pub fn check_data_key(k: &str) -> Result<(), String> {
    if k.is_empty() {
        return Err("a key must not be empty".into());
    }
    if k.len() > 253 {
        return Err(format!("key {k:?} is longer than 253 characters"));
    }
    if !k
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "key {k:?} may hold only letters, digits, '-', '_' and '.'"
        ));
    }
    if k == "." || k == ".." || k.starts_with("..") {
        return Err(format!(
            "key {k:?} must not be '.', '..' or start with '..'"
        ));
    }
    Ok(())
}

fn check_meta(
    errs: &mut Vec<FieldError>,
    kind: &str,
    api_version: &str,
    got_kind: &str,
    meta: &ObjectMeta,
) {
    let mut push = |path: &str, message: String| {
        errs.push(FieldError {
            path: path.to_string(),
            message,
        })
    };
    if api_version != crate::v1::API_VERSION {
        push("apiVersion", format!("must be v1 for a {kind}"));
    }
    if got_kind != kind {
        push("kind", format!("must be {kind}"));
    }
    if meta.name.is_empty() {
        push("metadata.name", "required".into());
    } else if !is_dns_subdomain(&meta.name) {
        push("metadata.name", format!("{:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters, alphanumeric at both ends)", meta.name));
    }
}

/// Each key of a base64 map (`binaryData`, a Secret's `data`): a valid key, valid base64.
fn check_base64_map(errs: &mut Vec<FieldError>, field: &str, map: &BTreeMap<String, String>) {
    for (k, v) in map {
        let path = format!("{field}.{k}");
        if let Err(why) = check_data_key(k) {
            errs.push(FieldError {
                path: path.clone(),
                message: why,
            });
        }
        if b64().decode(v).is_err() {
            errs.push(FieldError {
                path,
                message: "not valid base64".into(),
            });
        }
    }
}

fn check_size(errs: &mut Vec<FieldError>, entries: &BTreeMap<String, Vec<u8>>) {
    let total: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_DATA_BYTES {
        errs.push(FieldError {
            path: "data".into(),
            message: format!("{total} bytes in all, more than the limit of {MAX_DATA_BYTES}"),
        });
    }
}

impl ConfigMap {
    /// Reads one `ConfigMap` from YAML or JSON.
    pub fn parse(bytes: &[u8]) -> Result<ConfigMap, ParseError> {
        crate::parse::typed(crate::parse::as_text(bytes)?)
    }

    /// A `ConfigMap` of `entries`: UTF-8 values under `data`, the others under `binaryData`.
    pub fn from_entries(name: &str, entries: BTreeMap<String, Vec<u8>>) -> ConfigMap {
        let mut cm = ConfigMap {
            api_version: crate::v1::API_VERSION.into(),
            kind: "ConfigMap".into(),
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            ..Default::default()
        };
        for (k, v) in entries {
            match String::from_utf8(v) {
                Ok(text) => {
                    cm.data.insert(k, text);
                }
                Err(e) => {
                    cm.binary_data.insert(k, b64().encode(e.into_bytes()));
                }
            }
        }
        cm
    }

    /// Every problem, each with its field path. Empty means valid.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        check_meta(
            &mut errs,
            "ConfigMap",
            &self.api_version,
            &self.kind,
            &self.metadata,
        );
        for k in self.data.keys() {
            if let Err(why) = check_data_key(k) {
                errs.push(FieldError {
                    path: format!("data.{k}"),
                    message: why,
                });
            }
        }
        check_base64_map(&mut errs, "binaryData", &self.binary_data);
        for k in self
            .binary_data
            .keys()
            .filter(|k| self.data.contains_key(*k))
        {
            errs.push(FieldError {
                path: format!("binaryData.{k}"),
                message: format!("key {k:?} is also in data"),
            });
        }
        check_size(&mut errs, &self.entries());
        errs
    }

    /// Key → bytes, `data` and `binaryData` together (an undecodable value is left out; validation
    /// refuses it).
    pub fn entries(&self) -> BTreeMap<String, Vec<u8>> {
        let mut out: BTreeMap<String, Vec<u8>> = self
            .data
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        for (k, v) in &self.binary_data {
            if let Ok(bytes) = b64().decode(v) {
                out.entry(k.clone()).or_insert(bytes);
            }
        }
        out
    }
}

impl Secret {
    /// Reads one `Secret` from YAML or JSON, `stringData` folded into `data`.
    pub fn parse(bytes: &[u8]) -> Result<Secret, ParseError> {
        let mut s: Secret = crate::parse::typed(crate::parse::as_text(bytes)?)?;
        s.normalise();
        Ok(s)
    }

    /// An `Opaque` secret of `entries`.
    pub fn from_entries(name: &str, entries: BTreeMap<String, Vec<u8>>) -> Secret {
        Secret {
            api_version: crate::v1::API_VERSION.into(),
            kind: "Secret".into(),
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            type_: Some(SECRET_TYPE_OPAQUE.into()),
            data: entries
                .into_iter()
                .map(|(k, v)| (k, b64().encode(v)))
                .collect(),
            string_data: BTreeMap::new(),
            encrypted: None,
        }
    }

    /// `stringData` into `data` (it wins on a key in both, as in Kubernetes); the type defaults to Opaque.
    pub fn normalise(&mut self) {
        for (k, v) in std::mem::take(&mut self.string_data) {
            self.data.insert(k, b64().encode(v.as_bytes()));
        }
        if self.type_.as_deref().is_none_or(str::is_empty) {
            self.type_ = Some(SECRET_TYPE_OPAQUE.into());
        }
    }

    /// Every problem, each with its field path. Empty means valid. Messages never hold a value.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = Vec::new();
        check_meta(
            &mut errs,
            "Secret",
            &self.api_version,
            &self.kind,
            &self.metadata,
        );
        if self.encrypted.is_some() {
            errs.push(FieldError {
                path: "encrypted".into(),
                message: "written by hostlet only: give the values in data or stringData".into(),
            });
        }
        if let Some(t) = self.type_.as_deref().filter(|t| *t != SECRET_TYPE_OPAQUE) {
            errs.push(FieldError {
                path: "type".into(),
                message: format!("{t:?} is not supported (only {SECRET_TYPE_OPAQUE})"),
            });
        }
        check_base64_map(&mut errs, "data", &self.data);
        check_size(&mut errs, &self.entries());
        errs
    }

    /// Key → bytes (an undecodable value is left out; validation refuses it).
    pub fn entries(&self) -> BTreeMap<String, Vec<u8>> {
        self.data
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), b64().decode(v).ok()?)))
            .collect()
    }

    /// The same secret with every value replaced by its length, for showing without revealing.
    pub fn redacted(&self) -> Secret {
        let mut out = self.clone();
        for v in out.data.values_mut() {
            let len = b64().decode(v.as_bytes()).map(|b| b.len()).unwrap_or(0);
            *v = format!("<{len} bytes>");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_map_reads_with_text_and_binary_data() {
        let cm = ConfigMap::parse(
            b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: game-config}\ndata:\n  ui.properties: |\n    color=blue\nbinaryData:\n  raw: AAEC\n",
        )
        .unwrap();
        assert!(cm.validate().is_empty(), "{:?}", cm.validate());
        let e = cm.entries();
        assert_eq!(e["ui.properties"], b"color=blue\n");
        assert_eq!(e["raw"], vec![0u8, 1, 2]);
    }

    #[test]
    fn bad_config_maps_name_each_field() {
        let cm = ConfigMap::parse(
            b"apiVersion: v2\nkind: Config\nmetadata: {name: Bad_Name}\ndata: {'../x': a, ok: b}\nbinaryData: {ok: '!!', two: 'AA=='}\n",
        )
        .unwrap();
        let paths: Vec<String> = cm.validate().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "apiVersion",
                "kind",
                "metadata.name",
                "data.../x",
                "binaryData.ok",
                "binaryData.ok"
            ]
        );
        let err =
            ConfigMap::parse(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndatas: {}\n")
                .unwrap_err();
        assert!(err.message.contains("datas"), "{err}");
    }

    #[test]
    fn a_secret_folds_string_data_and_never_shows_a_value_in_errors() {
        let s = Secret::parse(
            b"apiVersion: v1\nkind: Secret\nmetadata: {name: db}\ndata: {username: YWRtaW4=}\nstringData: {password: 'hunter2-marker'}\n",
        )
        .unwrap();
        assert!(s.validate().is_empty());
        assert!(s.string_data.is_empty());
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        assert_eq!(s.entries()["password"], b"hunter2-marker");
        let shown = serde_json::to_string(&s.redacted()).unwrap();
        assert!(
            !shown.contains("aHVudGVy") && shown.contains("<14 bytes>"),
            "{shown}"
        );
        let bad = Secret::parse(
            b"apiVersion: v1\nkind: Secret\nmetadata: {name: db}\ntype: kubernetes.io/tls\ndata: {k: 'not base64 marker'}\n",
        )
        .unwrap();
        let errs = bad.validate();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs.iter().all(|e| !e.message.contains("marker")),
            "{errs:?}"
        );
    }

    #[test]
    fn an_object_over_the_size_limit_is_refused() {
        let mut big = BTreeMap::new();
        big.insert("a".to_string(), vec![b'x'; MAX_DATA_BYTES]);
        let cm = ConfigMap::from_entries("big", big);
        assert_eq!(cm.validate()[0].path, "data");
    }

    #[test]
    fn from_entries_keeps_bytes_that_are_not_text() {
        let mut e = BTreeMap::new();
        e.insert("t".to_string(), b"text".to_vec());
        e.insert("b".to_string(), vec![0xff, 0xfe]);
        let cm = ConfigMap::from_entries("m", e.clone());
        assert!(cm.validate().is_empty());
        assert_eq!(cm.entries(), e);
        assert_eq!(Secret::from_entries("s", e.clone()).entries(), e);
    }
}
