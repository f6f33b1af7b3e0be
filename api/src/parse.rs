//! Reading manifests from YAML or JSON text: one manifest, a list, or several YAML documents, each in
//! the 2014 form or as a Kubernetes v1 Pod (told apart by `apiVersion`/`kind` at the top).
//! Errors carry the line and column the parser gives.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::manifest::{Form, PodManifest};
use crate::v1;

/// A manifest that could not be read. `line`/`column` are 1-based when the parser knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: {}", self.message),
            (Some(l), None) => write!(f, "line {l}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ParseError {}

impl ParseError {
    fn plain(message: impl Into<String>) -> Self {
        ParseError {
            line: None,
            column: None,
            message: message.into(),
        }
    }

    fn from_json(e: &serde_json::Error) -> Self {
        // serde_json appends " at line L column C" to its message; the numbers are kept as fields instead.
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map(|(m, _)| m.to_string())
            .unwrap_or(msg);
        ParseError {
            line: (e.line() > 0).then_some(e.line()),
            column: (e.column() > 0).then_some(e.column()),
            message: plain_words(&msg),
        }
    }

    fn from_yaml(e: &yaml_serde::Error) -> Self {
        let loc = e.location();
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map(|(m, _)| m.to_string())
            .unwrap_or(msg);
        ParseError {
            line: loc.as_ref().map(|l| l.line()),
            column: loc.as_ref().map(|l| l.column()),
            message: plain_words(&msg),
        }
    }
}

/// serde names Rust types in its messages ("expected i64", "expected struct SnapshotPolicy"); operators
/// write YAML and JSON, so the message says it in their terms.
pub fn plain_words(msg: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected a sequence", "expected a list"),
        ("invalid type: sequence", "invalid type: a list"),
        ("expected a map", "expected a mapping"),
        ("invalid type: map", "invalid type: a mapping"),
        ("a borrowed string", "a string"),
        ("invalid type: floating point", "invalid type: a number"),
        ("invalid type: unit value", "invalid type: nothing (null)"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected i8", "expected a whole number"),
        ("expected i16", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected isize", "expected a whole number"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ];
    let mut out = msg.to_string();
    for (from, to) in WORDS {
        let mut at = 0;
        while let Some(i) = out[at..].find(from).map(|i| i + at) {
            let end = i + from.len();
            let boundary = out[end..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_');
            if boundary {
                out.replace_range(i..end, to);
                at = i + to.len();
            } else {
                at = end;
            }
        }
    }
    // "expected struct PodManifest" / "expected enum RestartPolicy": the Rust name means nothing here.
    for (from, to) in [
        ("expected struct ", "expected a mapping"),
        ("expected enum ", "expected one of the allowed values"),
    ] {
        while let Some(i) = out.find(from) {
            let name_end = out[i + from.len()..]
                .find(|c: char| !c.is_alphanumeric() && c != '_')
                .map_or(out.len(), |j| i + from.len() + j);
            out.replace_range(i..name_end, to);
        }
    }
    out
}

/// Text that is JSON rather than YAML: its first non-blank character opens an object or array.
fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().chars().next(), Some('{') | Some('['))
}

pub(crate) fn as_text(bytes: &[u8]) -> Result<&str, ParseError> {
    std::str::from_utf8(bytes).map_err(|e| {
        ParseError::plain(format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

fn finish(mut m: PodManifest) -> PodManifest {
    for c in m.init_containers.iter_mut().chain(m.containers.iter_mut()) {
        c.normalise();
    }
    m
}

/// Whether a document is a Kubernetes object rather than a 2014 manifest: it says `apiVersion` or `kind`.
fn is_v1(v: &serde_json::Value) -> bool {
    v.as_object()
        .is_some_and(|o| o.contains_key("apiVersion") || o.contains_key("kind"))
}

/// A Kubernetes object hostlet does not run is refused before its fields are looked at: a Deployment's
/// `spec.replicas` is not the point.
fn check_kind(v: &serde_json::Value) -> Result<(), ParseError> {
    let field = |name: &str| v.get(name).map(|f| f.as_str().unwrap_or("").to_string());
    match field("apiVersion") {
        None => return Err(ParseError::plain("apiVersion: required (v1, with kind: Pod)")),
        Some(a) if a != v1::API_VERSION => {
            return Err(ParseError::plain(format!(
                "apiVersion: unsupported value {a:?}, expected v1 (or the 2014 form with version: v1beta1 or v1beta2)"
            )))
        }
        Some(_) => {}
    }
    match field("kind") {
        None => Err(ParseError::plain("kind: required (Pod)")),
        Some(k) if k != v1::KIND => Err(ParseError::plain(format!(
            "kind: {k:?} is not supported, expected Pod (hostlet runs pods only)"
        ))),
        Some(_) => Ok(()),
    }
}

/// Fields and spellings of the 2014 form that a v1 Pod does not have: in a v1 Pod they are unknown fields
/// like any other, refused with their path (the 2014 form keeps accepting them).
fn refuse_legacy_fields(v: &serde_json::Value) -> Result<(), ParseError> {
    let mut unknown = Vec::new();
    if v.pointer("/spec/restartPolicy")
        .is_some_and(|r| !r.is_string())
    {
        return Err(ParseError::plain(
            "spec.restartPolicy: must be Always, OnFailure or Never",
        ));
    }
    for list in ["containers", "initContainers"] {
        let containers = v
            .pointer(&format!("/spec/{list}"))
            .and_then(|c| c.as_array());
        for (i, c) in containers.into_iter().flatten().enumerate() {
            let at = format!("spec.{list}[{i}]");
            for (field, legacy) in [
                ("env", &["key"][..]),
                ("ports", &["hostIp"][..]),
                ("volumeMounts", &["path", "mountType"][..]),
            ] {
                let items = c.get(field).and_then(|f| f.as_array());
                for (j, item) in items.into_iter().flatten().enumerate() {
                    for name in legacy {
                        if item.get(name).is_some() {
                            unknown.push(format!("{at}.{field}[{j}].{name}"));
                        }
                    }
                }
            }
            if c.get("privileged").is_some() {
                unknown.push(format!("{at}.privileged"));
            }
            if let Some(old) = c
                .get("imagePullPolicy")
                .and_then(|p| p.as_str())
                .filter(|p| p.starts_with("Pull"))
            {
                return Err(ParseError::plain(format!(
                    "{at}.imagePullPolicy: {old:?} is the 2014 spelling; a v1 Pod says Always, IfNotPresent or Never"
                )));
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                if c.get(probe).and_then(|p| p.get("type")).is_some() {
                    unknown.push(format!("{at}.{probe}.type"));
                }
            }
        }
    }
    refuse_unknown(unknown)
}

/// One manifest of either form from its text (`v` is the same text read as a value, to tell the form).
fn typed_manifest(text: &str, v: &serde_json::Value) -> Result<PodManifest, ParseError> {
    if is_v1(v) {
        check_kind(v)?;
        refuse_legacy_fields(v)?;
        typed::<v1::Pod>(text).map(|p| finish(p.into()))
    } else {
        typed::<PodManifest>(text).map(finish)
    }
}

/// `containers[0].bogus`, the way validation names fields.
fn field_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let up = field_path(parent);
            if up.is_empty() {
                key.clone()
            } else {
                format!("{up}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// A field the model does not hold is refused with its path, never silently ignored: a misspelt
/// `imagePullPolicy` must not run with the default.
fn refuse_unknown(unknown: Vec<String>) -> Result<(), ParseError> {
    match unknown.as_slice() {
        [] => Ok(()),
        [one] => Err(ParseError::plain(format!(
            "{one}: unknown field (hostlet does not support it)"
        ))),
        many => Err(ParseError::plain(format!(
            "unknown fields (hostlet does not support them): {}",
            many.join(", ")
        ))),
    }
}

pub(crate) fn typed<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    let mut unknown = Vec::new();
    let value = if looks_like_json(text) {
        let mut de = serde_json::Deserializer::from_str(text);
        let v: T = serde_ignored::deserialize(&mut de, |p| unknown.push(field_path(&p)))
            .map_err(|e| ParseError::from_json(&e))?;
        de.end().map_err(|e| ParseError::from_json(&e))?;
        v
    } else {
        serde_ignored::deserialize(yaml_serde::Deserializer::from_str(text), |p| {
            unknown.push(field_path(&p))
        })
        .map_err(|e| ParseError::from_yaml(&e))?
    };
    refuse_unknown(unknown)?;
    Ok(value)
}

fn from_value(v: serde_json::Value) -> Result<PodManifest, serde_json::Error> {
    let mut unknown = Vec::new();
    let m: PodManifest = if is_v1(&v) {
        check_kind(&v).map_err(|e| serde::de::Error::custom(e.message))?;
        refuse_legacy_fields(&v).map_err(|e| serde::de::Error::custom(e.message))?;
        let p: v1::Pod = serde_ignored::deserialize(v, |p| unknown.push(field_path(&p)))?;
        p.into()
    } else {
        serde_ignored::deserialize(v, |p| unknown.push(field_path(&p)))?
    };
    refuse_unknown(unknown).map_err(|e| serde::de::Error::custom(e.message))?;
    Ok(m)
}

/// Parses exactly one manifest (the value of a `/hostlet/hosts/<node>/pods/<id>` key).
pub fn parse_manifest(bytes: &[u8]) -> Result<PodManifest, ParseError> {
    let text = as_text(bytes)?;
    if text.trim().is_empty() {
        return Err(ParseError::plain("empty manifest"));
    }
    match shape(text) {
        Ok(Shape::One(v)) => typed_manifest(text, &v),
        Ok(Shape::List(_) | Shape::Documents(_)) => Err(ParseError::plain(
            "expected one manifest (a mapping), found a list of manifests",
        )),
        // A pod key holds one manifest: say that, not that lists are accepted too.
        Err(e) => Err(ParseError {
            message: e.message.replace(
                "expected a manifest (a mapping) or a list of manifests",
                "expected one manifest (a mapping)",
            ),
            ..e
        }),
    }
}

/// One item of a list of manifests: the manifest or why it could not be read.
pub type ParsedItem = Result<PodManifest, ParseError>;

/// Parses one manifest, a list of manifests, or a stream of YAML documents into a list.
///
/// The outer error means the text as a whole could not be read (not UTF-8, bad syntax, a scalar at the top);
/// an item that has the wrong shape is an error of its own while the others are still read. Blank text and
/// an empty list are zero manifests.
pub fn parse_manifest_list(bytes: &[u8]) -> Result<Vec<ParsedItem>, ParseError> {
    let text = as_text(bytes)?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    match shape(text)? {
        Shape::One(v) => Ok(vec![typed_manifest(text, &v)]),
        // v1 Pods in a list are read one by one, as the documents of a stream are.
        Shape::List(values) if values.iter().any(is_v1) => {
            Ok(items_from_values(values, ParseError::plain("")))
        }
        Shape::List(values) => match typed::<Vec<PodManifest>>(text) {
            Ok(list) => Ok(list.into_iter().map(|m| Ok(finish(m))).collect()),
            Err(whole) => Ok(items_from_values(values, whole)),
        },
        Shape::Documents(docs) => Ok(items_from_values(docs, ParseError::plain(""))),
    }
}

fn items_from_values(values: Vec<serde_json::Value>, whole: ParseError) -> Vec<ParsedItem> {
    let mut located = Some(whole).filter(|w| w.line.is_some());
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if v.is_null() {
                return Err(ParseError::plain(format!("[{i}]: empty item")));
            }
            from_value(v).map(finish).map_err(|e| {
                let message = format!("[{i}]: {}", plain_words(&e.to_string()));
                match located.take() {
                    Some(w) => ParseError {
                        line: w.line,
                        column: w.column,
                        message: format!("[{i}]: {}", w.message),
                    },
                    None => ParseError::plain(message),
                }
            })
        })
        .collect()
}

enum Shape {
    One(serde_json::Value),
    List(Vec<serde_json::Value>),
    Documents(Vec<serde_json::Value>),
}

fn shape(text: &str) -> Result<Shape, ParseError> {
    let docs: Vec<serde_json::Value> = if looks_like_json(text) {
        vec![serde_json::from_str(text).map_err(|e| ParseError::from_json(&e))?]
    } else {
        let mut docs = Vec::new();
        for doc in yaml_serde::Deserializer::from_str(text) {
            let v: yaml_serde::Value =
                serde::Deserialize::deserialize(doc).map_err(|e| ParseError::from_yaml(&e))?;
            if v.is_null() {
                continue;
            }
            docs.push(serde_json::to_value(&v).map_err(|e| ParseError::plain(e.to_string()))?);
        }
        docs
    };
    if docs.len() != 1 {
        return Ok(Shape::Documents(docs));
    }
    match docs.into_iter().next() {
        Some(v @ serde_json::Value::Object(_)) => Ok(Shape::One(v)),
        Some(serde_json::Value::Array(items)) => Ok(Shape::List(items)),
        Some(other) => Err(ParseError::plain(format!(
            "expected a manifest (a mapping) or a list of manifests, found {}",
            kind_of(&other)
        ))),
        None => Ok(Shape::Documents(Vec::new())),
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// Serialises a manifest as YAML with today's field names, in the form it was written in.
pub fn to_yaml(m: &PodManifest) -> String {
    match m.form {
        Form::Legacy => yaml_serde::to_string(m),
        Form::V1 => yaml_serde::to_string(&v1::Pod::from(m)),
    }
    .unwrap_or_default()
}

/// Serialises a manifest as YAML in the form asked for (a v1 Pod shown in the 2014 form says
/// `version: v1beta2`).
pub fn to_yaml_as(m: &PodManifest, form: Form) -> String {
    match form {
        Form::Legacy => to_yaml(&v1::as_legacy(m)),
        Form::V1 => to_yaml(&v1::as_v1(m)),
    }
}

/// Serialises a manifest as compact JSON with today's field names, in the form it was written in.
pub fn to_json(m: &PodManifest) -> String {
    match m.form {
        Form::Legacy => serde_json::to_string(m),
        Form::V1 => serde_json::to_string(&v1::Pod::from(m)),
    }
    .unwrap_or_default()
}

/// The manifest as JSON in `form` (through the serialiser that writes the keys, so it reads back as the
/// same pod).
pub fn to_value(m: &PodManifest, form: Form) -> serde_json::Value {
    let shown = match form {
        Form::V1 => v1::as_v1(m),
        Form::Legacy => v1::as_legacy(m),
    };
    serde_json::from_str(&to_json(&shown)).unwrap_or_default()
}
