//! Image references: `[registry[:port]/]path[:tag][@digest]`, as Docker reads them.

use std::fmt;

use crate::manifest::PullPolicy;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (with port), when the first path component names one.
    pub registry: Option<String>,
    /// Repository path, e.g. `library/busybox` or `busybox`.
    pub repository: String,
    pub tag: Option<String>,
    /// `algorithm:hex`.
    pub digest: Option<String>,
}

/// Why an image reference is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ImageRefError {
    pub reference: String,
    pub reason: String,
}

fn component_ok(c: &str) -> bool {
    // Lower-case alphanumerics separated by '.', '_', '__' or runs of '-'.
    !c.is_empty()
        && c.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_' || b == b'-'
        })
        && c.as_bytes()[0].is_ascii_alphanumeric()
        && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        && !c.contains("..")
        && !c.contains("___")
}

fn tag_ok(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        && (t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_')
}

fn digest_ok(d: &str) -> bool {
    match d.split_once(':') {
        Some((alg, hex)) => {
            !alg.is_empty()
                && alg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-_".contains(&b))
                && hex.len() >= 32
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}

fn host_ok(h: &str) -> bool {
    let (name, port) = match h.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (h, None),
    };
    let name_ok = !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || b == b'.'
                || b == b'-'
                || b == b'['
                || b == b']'
                || b == b':'
        });
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|v| v > 0));
    name_ok && port_ok
}

impl ImageRef {
    /// Parses a reference the way Docker does: the first component is a registry when it has a `.` or a
    /// `:`, or is `localhost`.
    pub fn parse(s: &str) -> Result<Self, ImageRefError> {
        let err = |reason: &str| ImageRefError {
            reference: s.to_string(),
            reason: reason.to_string(),
        };
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.len() > 255 {
            return Err(err("longer than 255 characters"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                if !digest_ok(d) {
                    return Err(err("digest must be algorithm:hex (at least 32 hex digits)"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, tail))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                if !host_ok(first) {
                    return Err(err("registry must be host[:port]"));
                }
                (Some(first.to_string()), tail)
            }
            _ => (None, rest),
        };
        // A ':' after the last '/' starts the tag.
        let last_slash = path.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (repository, tag) = match path[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&path[..at], Some(path[at + 1..].to_string()))
            }
            None => (path, None),
        };
        if repository.is_empty() || !repository.split('/').all(component_ok) {
            return Err(err(
                "repository must be lower-case path components of letters, digits, '.', '_' and '-'",
            ));
        }
        if let Some(t) = &tag {
            if !tag_ok(t) {
                return Err(err(
                    "tag must be up to 128 letters, digits, '_', '.' and '-'",
                ));
            }
        }
        Ok(ImageRef {
            registry,
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The tag in force: the given one, `latest` when neither tag nor digest is given.
    pub fn effective_tag(&self) -> Option<&str> {
        match (&self.tag, &self.digest) {
            (Some(t), _) => Some(t),
            (None, None) => Some("latest"),
            (None, Some(_)) => None,
        }
    }

    /// The pull policy when a manifest gives none. Kubernetes pulls `:latest` always; hostlet's hosts often
    /// have no registry, so every reference defaults to `IfNotPresent` (an `Always` whose pull fails still
    /// runs a present image, with a warning).
    pub fn default_pull_policy(&self) -> PullPolicy {
        PullPolicy::IfNotPresent
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.registry {
            write!(f, "{r}/")?;
        }
        f.write_str(&self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(s: &str) -> (Option<String>, String, Option<String>, Option<String>) {
        let r = ImageRef::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (r.registry, r.repository, r.tag, r.digest)
    }

    #[test]
    fn plain_name_has_no_registry_and_latest_tag_in_force() {
        assert_eq!(parts("busybox"), (None, "busybox".into(), None, None));
        let r = ImageRef::parse("busybox").unwrap();
        assert_eq!(r.effective_tag(), Some("latest"));
    }

    #[test]
    fn registry_with_port_is_not_mistaken_for_a_tag() {
        assert_eq!(
            parts("localhost:5000/team/app:1.2"),
            (
                Some("localhost:5000".into()),
                "team/app".into(),
                Some("1.2".into()),
                None
            )
        );
        assert_eq!(
            parts("registry.example:443/app"),
            (
                Some("registry.example:443".into()),
                "app".into(),
                None,
                None
            )
        );
    }

    #[test]
    fn tag_and_digest_together() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            parts(&format!("quay.io/org/app:v1@{d}")),
            (
                Some("quay.io".into()),
                "org/app".into(),
                Some("v1".into()),
                Some(d.clone())
            )
        );
        let r = ImageRef::parse(&format!("app@{d}")).unwrap();
        assert_eq!(r.effective_tag(), None);
        assert_eq!(r.to_string(), format!("app@{d}"));
    }

    #[test]
    fn first_component_without_dot_or_colon_is_a_path() {
        assert_eq!(
            parts("library/busybox:1.36"),
            (None, "library/busybox".into(), Some("1.36".into()), None)
        );
    }

    #[test]
    fn bad_references_are_refused() {
        for bad in [
            "",
            "UPPER",
            "app:",
            "app:bad tag",
            "app@sha256:xyz",
            "host:99999/app",
            "a//b",
            "-app",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "busybox",
            "busybox:latest",
            "localhost:5000/a/b:c",
            "a.io/x",
        ] {
            assert_eq!(ImageRef::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn default_pull_policy_is_if_not_present_for_every_tag() {
        for s in ["busybox", "busybox:latest", "busybox:1.0"] {
            assert_eq!(
                ImageRef::parse(s).unwrap().default_pull_policy(),
                PullPolicy::IfNotPresent
            );
        }
    }
}
