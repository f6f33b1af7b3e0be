//! Secrets at rest. A Secret's `data` goes into etcd sealed (AES-256-GCM, its name bound as associated
//! data), so neither etcd's files, nor a snapshot, nor a copy in object storage holds a value in clear.
//!
//! Each key id (`k1`, `k2`, … named in `/hostlet/config/secrets-encryption`) has its own key, derived
//! with HKDF-SHA256 from root material that never leaves the nodes: the cluster CA's private key
//! (`<data-dir>/tls/ca.key`), or under `--etcd-insecure` and with an external etcd, the cluster token's
//! secret. Every member holding that material derives the same keys. A worker holds none: the voters
//! open the secrets its pods use when it reads them through the node API (`crate::nodeapi`). Rotation
//! names a new id and reseals every secret under it.

use std::path::Path;
use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use hostlet_api::configs::{SealedData, Secret};
use rand::RngCore;
use zeroize::Zeroizing;

use crate::pki::ClusterToken;

/// The HKDF salt of the secret keys.
const SALT: &[u8] = b"hostlet secrets at rest";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// The node's root for the secret keys: HKDF's extracted key (what `expand` starts from).
#[derive(Clone)]
pub struct SecretKeys {
    prk: Arc<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKeys(<hidden>)")
    }
}

impl SecretKeys {
    pub fn from_material(material: &[u8]) -> SecretKeys {
        let (prk, _) = hkdf::Hkdf::<sha2::Sha256>::extract(Some(SALT), material);
        SecretKeys {
            prk: Arc::new(Zeroizing::new(prk.to_vec())),
        }
    }

    /// The material of a node with data under `data_dir` (the agent's and the CLI's alike): its CA key,
    /// else the token's secret (`token`, else the data dir's token file). `None`: the node can neither
    /// seal nor open.
    pub fn for_node(data_dir: &Path, token: Option<&ClusterToken>) -> Option<SecretKeys> {
        let layout = crate::etcd_member::layout::MemberLayout::new(data_dir);
        if let Ok(pem) = std::fs::read(layout.tls().ca_key()) {
            return Some(SecretKeys::from_material(&pem));
        }
        let from_file;
        let token = match token {
            Some(t) => t,
            None => {
                let text = std::fs::read_to_string(layout.token_file()).ok()?;
                from_file = ClusterToken::parse(&text).ok()?;
                &from_file
            }
        };
        Some(SecretKeys::from_material(token.secret.as_bytes()))
    }

    fn cipher(&self, key_id: &str) -> Aes256Gcm {
        // The length was checked where the root came from.
        let Ok(hk) = hkdf::Hkdf::<sha2::Sha256>::from_prk(&self.prk) else {
            unreachable!("a secret root shorter than a SHA-256 output")
        };
        let mut key = Zeroizing::new([0u8; 32]);
        // 32 bytes is far below HKDF-SHA256's limit: expand cannot fail here.
        let _ = hk.expand(key_id.as_bytes(), key.as_mut());
        Aes256Gcm::new((&*key).into())
    }

    /// The secret with `data` sealed under `key_id` (and `data` emptied).
    pub fn seal(&self, s: &Secret, key_id: &str) -> Result<Secret, String> {
        let plain = Zeroizing::new(serde_json::to_vec(&s.data).map_err(|e| e.to_string())?);
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let ciphertext = self
            .cipher(key_id)
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: s.metadata.name.as_bytes(),
                },
            )
            .map_err(|_| "sealing the secret failed".to_string())?;
        let mut out = s.clone();
        out.data.clear();
        out.string_data.clear();
        out.encrypted = Some(SealedData {
            key_id: key_id.to_string(),
            nonce: b64().encode(nonce),
            ciphertext: b64().encode(ciphertext),
        });
        Ok(out)
    }

    /// The secret with `data` opened. One never sealed (written before sealing existed, or by hand) is
    /// returned as it is.
    pub fn open(&self, s: &Secret) -> Result<Secret, String> {
        let Some(sealed) = &s.encrypted else {
            return Ok(s.clone());
        };
        let nonce = b64()
            .decode(&sealed.nonce)
            .ok()
            .filter(|n| n.len() == 12)
            .ok_or("encrypted.nonce is not 12 bytes of base64")?;
        let ciphertext = b64()
            .decode(&sealed.ciphertext)
            .map_err(|_| "encrypted.ciphertext is not base64")?;
        let plain = Zeroizing::new(
            self.cipher(&sealed.key_id)
                .decrypt(
                    Nonce::from_slice(&nonce),
                    Payload {
                        msg: &ciphertext,
                        aad: s.metadata.name.as_bytes(),
                    },
                )
                .map_err(|_| {
                    format!(
                        "cannot open it with key {}: sealed by another cluster's key, or for another name",
                        sealed.key_id
                    )
                })?,
        );
        let mut out = s.clone();
        out.data = serde_json::from_slice(&plain).map_err(|_| "the sealed data is not a map")?;
        out.encrypted = None;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::parse(b"apiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData: {password: marker-9f1c}\n")
            .unwrap()
    }

    #[test]
    fn sealed_data_holds_no_value_and_opens_with_the_same_material_only() {
        let keys = SecretKeys::from_material(b"root");
        let sealed = keys.seal(&secret(), "k1").unwrap();
        let stored = serde_json::to_string(&sealed).unwrap();
        assert!(
            !stored.contains("marker") && !stored.contains("bWFya2Vy"),
            "{stored}"
        );
        assert!(sealed.data.is_empty());
        assert_eq!(
            keys.open(&sealed).unwrap().entries()["password"],
            b"marker-9f1c"
        );
        // Another cluster's material, another key id, or another name: refused, never garbage.
        assert!(SecretKeys::from_material(b"other").open(&sealed).is_err());
        let mut relabelled = sealed.clone();
        relabelled.encrypted.as_mut().unwrap().key_id = "k2".into();
        assert!(keys.open(&relabelled).is_err());
        let mut renamed = sealed.clone();
        renamed.metadata.name = "web".into();
        assert!(keys.open(&renamed).is_err());
        // Two seals of the same secret differ (fresh nonce).
        assert_ne!(keys.seal(&secret(), "k1").unwrap(), sealed);
    }

    #[test]
    fn a_node_uses_its_ca_key_else_its_token() {
        let dir = tempfile::tempdir().unwrap();
        assert!(SecretKeys::for_node(dir.path(), None).is_none());
        std::fs::write(dir.path().join("token"), "plain-secret\n").unwrap();
        let by_token = SecretKeys::for_node(dir.path(), None).unwrap();
        let sealed = by_token.seal(&secret(), "k1").unwrap();
        assert!(SecretKeys::from_material(b"plain-secret")
            .open(&sealed)
            .is_ok());
        std::fs::create_dir_all(dir.path().join("tls")).unwrap();
        std::fs::write(dir.path().join("tls/ca.key"), "ca key pem").unwrap();
        let by_ca = SecretKeys::for_node(dir.path(), None).unwrap();
        assert!(
            by_ca.open(&sealed).is_err(),
            "the CA key wins over the token"
        );
        assert!(SecretKeys::from_material(b"ca key pem")
            .open(&by_ca.seal(&secret(), "k1").unwrap())
            .is_ok());
    }

    #[test]
    fn each_key_id_has_its_own_key() {
        let keys = SecretKeys::from_material(b"root");
        let a = keys.seal(&secret(), "k1").unwrap();
        let b = keys.seal(&secret(), "k2").unwrap();
        assert_eq!(keys.open(&a).unwrap(), keys.open(&b).unwrap());
        assert_eq!(
            hostlet_api::configs::SecretsEncryption::next("k1").as_deref(),
            Some("k2")
        );
    }
}
