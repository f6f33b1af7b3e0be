//! The cluster token: `H10::<ca-sha256-hex>::<secret>`.
//!
//! The secret authenticates a joiner to the cluster (Bearer token of `/db/info` and `/db/join`); the CA
//! fingerprint lets the joiner verify whom it joins before it sends the secret anywhere. A bare secret (no
//! `H10::` prefix) is accepted where no CA is involved: `--etcd-insecure` clusters, or a first node given
//! `--token` to use as its secret.

use std::fmt;

use rand::RngCore;

const PREFIX: &str = "H10::";

/// A parsed cluster token.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken {
    /// SHA-256 of the cluster CA certificate (DER), lowercase hex; `None` for a bare secret.
    pub ca_fingerprint: Option<String>,
    pub secret: String,
}

impl fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterToken")
            .field("ca_fingerprint", &self.ca_fingerprint)
            .field("secret", &"<hidden>")
            .finish()
    }
}

impl fmt::Display for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ca_fingerprint {
            Some(fp) => write!(f, "{PREFIX}{fp}::{}", self.secret),
            None => f.write_str(&self.secret),
        }
    }
}

/// Why a token does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token contains whitespace or control characters")]
    BadCharacters,
    #[error(
        "a token `H10::<fingerprint>::<secret>` needs a 64-hex-digit CA fingerprint and a secret (not itself starting with H10::)"
    )]
    Malformed,
}

impl ClusterToken {
    /// Parses a token as given to `--token` or read from `<data-dir>/token`.
    pub fn parse(s: &str) -> Result<Self, TokenError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(TokenError::Empty);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacters);
        }
        let Some(rest) = s.strip_prefix(PREFIX) else {
            return Ok(ClusterToken {
                ca_fingerprint: None,
                secret: s.to_string(),
            });
        };
        let (fp, secret) = rest.split_once("::").ok_or(TokenError::Malformed)?;
        let fp_ok = fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit());
        // A secret that itself starts with the prefix could not be presented bare: it would read as a
        // full token.
        if !fp_ok || secret.is_empty() || secret.starts_with(PREFIX) {
            return Err(TokenError::Malformed);
        }
        Ok(ClusterToken {
            ca_fingerprint: Some(fp.to_ascii_lowercase()),
            secret: secret.to_string(),
        })
    }

    /// A fresh random secret (128 bits) bound to the CA's fingerprint (none under `--etcd-insecure`).
    pub fn generate(ca_fingerprint: Option<String>) -> Self {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        ClusterToken {
            ca_fingerprint,
            secret: hex::encode(bytes),
        }
    }

    /// Whether a presented token (full or bare secret) carries this token's secret. Compared in constant
    /// time so that response timing does not leak the secret.
    pub fn accepts(&self, presented: &str) -> bool {
        let Ok(p) = ClusterToken::parse(presented) else {
            return false;
        };
        if let (Some(mine), Some(theirs)) = (&self.ca_fingerprint, &p.ca_fingerprint) {
            if mine != theirs {
                return false;
            }
        }
        constant_time_eq(self.secret.as_bytes(), p.secret.as_bytes())
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn full_token_round_trips() {
        let t = ClusterToken::parse(&format!("H10::{FP}::s3cret")).unwrap();
        assert_eq!(t.ca_fingerprint.as_deref(), Some(FP));
        assert_eq!(t.secret, "s3cret");
        assert_eq!(ClusterToken::parse(&t.to_string()).unwrap(), t);
    }

    #[test]
    fn bare_secret_is_a_token_without_fingerprint() {
        let t = ClusterToken::parse(" abc \n").unwrap();
        assert_eq!(t.ca_fingerprint, None);
        assert_eq!(t.to_string(), "abc");
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(ClusterToken::parse(""), Err(TokenError::Empty));
        assert_eq!(ClusterToken::parse("a b"), Err(TokenError::BadCharacters));
        assert_eq!(
            ClusterToken::parse("H10::abc::s"),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            ClusterToken::parse(&format!("H10::{FP}::")),
            Err(TokenError::Malformed)
        );
        assert_eq!(ClusterToken::parse("H10::x"), Err(TokenError::Malformed));
        // Found by the cluster_token fuzz target: such a secret, presented bare, read as a full token.
        assert_eq!(
            ClusterToken::parse(&format!("H10::{FP}::H10::x")),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn accepts_the_full_token_or_its_secret_only() {
        let t = ClusterToken::parse(&format!("H10::{FP}::s3cret")).unwrap();
        assert!(t.accepts(&t.to_string()));
        assert!(t.accepts("s3cret"));
        assert!(!t.accepts("s3cres"));
        assert!(!t.accepts("s3cret2"));
        assert!(!t.accepts(""));
        let other_ca = FP.replace('0', "1");
        assert!(!t.accepts(&format!("H10::{other_ca}::s3cret")));
    }

    #[test]
    fn generated_tokens_differ_and_debug_hides_the_secret() {
        let a = ClusterToken::generate(Some(FP.into()));
        let b = ClusterToken::generate(Some(FP.into()));
        assert_ne!(a.secret, b.secret);
        assert!(!format!("{a:?}").contains(&a.secret));
        assert_eq!(ClusterToken::parse(&a.to_string()).unwrap(), a);
    }
}
