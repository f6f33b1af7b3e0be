//! Node labels, as Kubernetes has them: `prefix/name=value` pairs that pod sets select nodes by.
//!
//! A node sets its own at start (`--node-label`, and the built-in ones below); an admin sets more with
//! `hostlet node label`, kept apart at `/hostlet/node-labels/<node>` so that a node rewriting its record
//! never loses them. Labels under `hostlet.io/` and `node-restriction.hostlet.io/` are for admins only,
//! except the built-in ones a node states about itself, as Kubernetes' NodeRestriction has it: a selector on
//! such a label cannot be claimed by a node that wants another's pods.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validation::{check_key, is_label_value};

/// The node's name.
pub const HOSTNAME: &str = "hostlet.io/hostname";
/// `voter` or `worker`: whether it runs an etcd member now.
pub const ROLE: &str = "hostlet.io/role";
/// The CPU architecture, as Go names it (`amd64`, `arm64`).
pub const ARCH: &str = "hostlet.io/arch";
/// `linux`.
pub const OS: &str = "hostlet.io/os";
/// `--failure-domain`, when set.
pub const FAILURE_DOMAIN: &str = "hostlet.io/failure-domain";
/// A device `--allowed-devices` lets pods have is present: `hostlet.io/device.<name>=true`.
pub const DEVICE_PREFIX: &str = "hostlet.io/device.";

/// Labels only admins may set (but for the built-in ones a node states about itself).
const RESTRICTED: [&str; 2] = ["hostlet.io/", "node-restriction.hostlet.io/"];

/// Checks a label's key and value, Kubernetes' rules; the error names the label.
pub fn check(key: &str, value: &str) -> Result<(), String> {
    check_key(key).map_err(|e| format!("label {key}: {e}"))?;
    if !is_label_value(value) {
        return Err(format!(
            "label {key}: value {value:?} is not a label value (at most 63 letters, digits, '-', '_' and '.', alphanumeric at both ends, or empty)"
        ));
    }
    Ok(())
}

/// Whether `key` is one only admins may set.
pub fn is_restricted(key: &str) -> bool {
    RESTRICTED.iter().any(|p| key.starts_with(p))
}

/// One argument of `hostlet node label` or `--node-label`: `key=value` sets, `key-` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

impl LabelChange {
    pub fn parse(arg: &str) -> Result<LabelChange, String> {
        if let Some((k, v)) = arg.split_once('=') {
            check(k, v)?;
            return Ok(LabelChange::Set(k.to_string(), v.to_string()));
        }
        if let Some(k) = arg.strip_suffix('-') {
            check(k, "")?;
            return Ok(LabelChange::Remove(k.to_string()));
        }
        Err(format!(
            "{arg:?}: a label is key=value (or key- to remove it)"
        ))
    }
}

/// `--node-label key=value`: a label a node sets on itself; `hostlet.io/` ones are refused (they are the
/// built-in ones or an admin's).
pub fn parse_own(arg: &str) -> Result<(String, String), String> {
    match LabelChange::parse(arg)? {
        LabelChange::Set(k, _) if is_restricted(&k) => Err(format!(
            "label {k}: labels under hostlet.io/ and node-restriction.hostlet.io/ are set by hostlet itself or by an admin (hostlet node label), not by a node"
        )),
        LabelChange::Set(k, v) => Ok((k, v)),
        LabelChange::Remove(k) => Err(format!("{k}-: a node's own label is key=value")),
    }
}

/// May a node put `labels` in its own record? Its own labels, and of the restricted ones only the
/// built-in ones with true values: its name, and the others as it states them. The error names the label.
pub fn node_may_set(node: &str, labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in labels {
        check(k, v)?;
        if !is_restricted(k) {
            continue;
        }
        let ok = match k.as_str() {
            HOSTNAME => v == node,
            ROLE => v == "voter" || v == "worker",
            ARCH | OS | FAILURE_DOMAIN => true,
            _ => k.starts_with(DEVICE_PREFIX) && v == "true",
        };
        if !ok {
            return Err(format!(
                "label {k}={v}: a node may set only its built-in hostlet.io/ labels about itself; the others are for admins (hostlet node label)"
            ));
        }
    }
    Ok(())
}

/// `/hostlet/node-labels/<node>`: the labels an admin set on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminLabels {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `hostlet node cordon`: no new pod set pods go to the node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
}

/// A node's labels: its own, with an admin's on top.
pub fn effective(
    own: &BTreeMap<String, String>,
    admin: Option<&AdminLabels>,
) -> BTreeMap<String, String> {
    let mut out = own.clone();
    if let Some(a) = admin {
        out.extend(a.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// A label selector as `node ls -l` takes it: comma-separated `key=value`, `key!=value`, `key`, `!key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let r = if let Some((k, v)) = part.split_once("!=") {
                check(k, v)?;
                Requirement::NotEquals(k.into(), v.into())
            } else if let Some((k, v)) = part.split_once('=') {
                let v = v.strip_prefix('=').unwrap_or(v);
                check(k, v)?;
                Requirement::Equals(k.into(), v.into())
            } else if let Some(k) = part.strip_prefix('!') {
                check(k, "")?;
                Requirement::Absent(k.into())
            } else {
                check(part, "")?;
                Requirement::Exists(part.into())
            };
            out.push(r);
        }
        Ok(Selector(out))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
        })
    }
}

/// The device label for a device file's name: `hostlet.io/device.<name>`, the name cut to what a label
/// name may hold; `None` when nothing of it is left.
pub fn device_label(file_name: &str) -> Option<String> {
    let room = 63 - (DEVICE_PREFIX.len() - "hostlet.io/".len());
    let cleaned: String = file_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cut: String = cleaned.chars().take(room).collect();
    let trimmed = cut.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    (!trimmed.is_empty()).then(|| format!("{DEVICE_PREFIX}{trimmed}"))
}

/// Go's name for this machine's architecture, as Kubernetes' `kubernetes.io/arch` says it.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_follow_kubernetes_syntax_and_errors_name_the_label() {
        assert!(check("zone", "a").is_ok());
        assert!(check("example.com/disk", "ssd").is_ok());
        assert!(check("k", "").is_ok());
        let e = check("Bad Key", "x").unwrap_err();
        assert!(e.starts_with("label Bad Key:"), "{e}");
        let e = check("k", "-x").unwrap_err();
        assert!(e.contains("not a label value"), "{e}");
        assert!(check(&"a".repeat(64), "x").is_err());
        assert!(check("k", &"a".repeat(64)).is_err());
        assert!(
            check("UPPER_case.ok/x", "v").is_err(),
            "a prefix is a DNS subdomain"
        );
    }

    #[test]
    fn changes_and_a_node_s_own_labels() {
        assert_eq!(
            LabelChange::parse("disk=ssd"),
            Ok(LabelChange::Set("disk".into(), "ssd".into()))
        );
        assert_eq!(
            LabelChange::parse("disk-"),
            Ok(LabelChange::Remove("disk".into()))
        );
        assert!(LabelChange::parse("disk").is_err());
        assert_eq!(parse_own("disk=ssd"), Ok(("disk".into(), "ssd".into())));
        for restricted in [
            "hostlet.io/role=voter",
            "node-restriction.hostlet.io/gpu=yes",
        ] {
            let e = parse_own(restricted).unwrap_err();
            assert!(e.contains("hostlet node label"), "{e}");
        }
    }

    #[test]
    fn a_node_may_state_its_built_in_labels_about_itself_and_nothing_restricted_else() {
        let ok = map(&[
            (HOSTNAME, "w1"),
            (ROLE, "worker"),
            (ARCH, "amd64"),
            (OS, "linux"),
            ("hostlet.io/device.ttyUSB0", "true"),
            ("disk", "ssd"),
        ]);
        assert_eq!(node_may_set("w1", &ok), Ok(()));
        for bad in [
            map(&[(HOSTNAME, "v1")]),
            map(&[(ROLE, "leader")]),
            map(&[("hostlet.io/dedicated", "db")]),
            map(&[("node-restriction.hostlet.io/pci", "yes")]),
            map(&[("hostlet.io/device.x", "false")]),
        ] {
            let e = node_may_set("w1", &bad).unwrap_err();
            assert!(e.contains("for admins"), "{e}");
        }
    }

    #[test]
    fn an_admin_s_labels_go_on_top_and_selectors_match() {
        let own = map(&[("zone", "a"), ("disk", "hdd")]);
        let admin = AdminLabels {
            labels: map(&[("disk", "ssd"), ("hostlet.io/dedicated", "db")]),
            unschedulable: false,
        };
        let l = effective(&own, Some(&admin));
        assert_eq!(l["disk"], "ssd");
        assert!(Selector::parse("zone=a,disk==ssd").unwrap().matches(&l));
        assert!(Selector::parse("hostlet.io/dedicated").unwrap().matches(&l));
        assert!(!Selector::parse("!hostlet.io/dedicated")
            .unwrap()
            .matches(&l));
        assert!(!Selector::parse("zone!=a").unwrap().matches(&l));
        assert!(Selector::parse("").unwrap().matches(&l));
        assert!(Selector::parse("bad key=x").is_err());
    }

    #[test]
    fn device_labels_are_valid_labels() {
        assert_eq!(
            device_label("ttyUSB0").as_deref(),
            Some("hostlet.io/device.ttyUSB0")
        );
        let long = "usb-Silicon_Labs_CP2102N_USB_to_UART_Bridge_Controller_0001-if00-port0:x";
        let l = device_label(long).unwrap();
        assert_eq!(check(&l, "true"), Ok(()), "{l}");
        assert_eq!(device_label("___"), None);
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }
}
