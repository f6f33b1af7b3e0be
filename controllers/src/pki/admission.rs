//! Who a join is from and whom it may make: the server token or a worker token in the `Authorization`
//! header, the worker tokens' records under `/hostlet/tokens/` (their secrets kept as SHA-256), and the
//! rules of a worker token's join. The join routes (`etcd_member::api`) answer with what this decides.

use axum::http::{header, HeaderMap};
use hostlet_api::objects::{JoinToken, JoinTokenState};
use hostlet_api::KeyLayout;
use hostlet_runtime::{Etcd, EtcdError};

use super::token::{constant_time_eq, ClusterToken};

/// Whether `headers` carry `Authorization: Bearer <token>` for `token`. No token configured: nobody is.
pub fn authorized(headers: &HeaderMap, token: Option<&ClusterToken>) -> bool {
    let Some(token) = token else {
        return false;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|presented| token.accepts(presented.trim()))
        .unwrap_or(false)
}

/// Who a join request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinCaller {
    /// The server token: a voter's join.
    Server,
    /// A worker token, with its record's revision (a use is counted against it).
    Worker {
        id: String,
        record: JoinToken,
        mod_revision: i64,
        /// Admits only the member the leader asked its node to become.
        used_up: bool,
    },
}

/// Why a join request's token admits nobody.
#[derive(Debug)]
pub enum JoinRefusal {
    /// No token, or not one of this cluster's: "missing or wrong cluster token".
    WrongToken,
    /// A worker token of this cluster that admits nobody now, and why.
    Refused(String),
    /// etcd did not answer about the worker token: never a guess.
    Unavailable(EtcdError),
}

/// The server token (`server`), or a worker token that admits a join now, presented in `headers`.
pub async fn verify_join_token(
    etcd: &Etcd,
    keys: &KeyLayout,
    server: &ClusterToken,
    headers: &HeaderMap,
) -> Result<JoinCaller, JoinRefusal> {
    if authorized(headers, Some(server)) {
        return Ok(JoinCaller::Server);
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|v| ClusterToken::parse(v.trim()).ok())
        .ok_or(JoinRefusal::WrongToken)?;
    if let (Some(mine), Some(theirs)) = (&server.ca_fingerprint, &presented.ca_fingerprint) {
        if mine != theirs {
            return Err(JoinRefusal::WrongToken);
        }
    }
    let (id, secret) = worker_token_parts(&presented.secret).ok_or(JoinRefusal::WrongToken)?;
    let kv = match etcd.get(keys.join_token(id)).await {
        Ok(Some(kv)) => kv,
        Ok(None) => return Err(JoinRefusal::WrongToken),
        Err(e) => return Err(JoinRefusal::Unavailable(e)),
    };
    let record: JoinToken = serde_json::from_slice(kv.value())
        .map_err(|_| JoinRefusal::Refused(format!("token {id} is not readable")))?;
    if !constant_time_eq(
        record.secret_sha256.as_bytes(),
        sha256_hex(secret).as_bytes(),
    ) {
        return Err(JoinRefusal::WrongToken);
    }
    // A used-up token still carries the node it admitted to the member the leader asks it to
    // become (the join routes check that request); an expired or revoked one carries nobody.
    let state = record.state(std::time::SystemTime::now());
    let used_up = state == JoinTokenState::UsedUp;
    if state != JoinTokenState::Valid && !used_up {
        return Err(JoinRefusal::Refused(format!(
            "token {id} is {}",
            state.as_str()
        )));
    }
    Ok(JoinCaller::Worker {
        id: id.to_string(),
        record,
        mod_revision: kv.mod_revision(),
        used_up,
    })
}

/// Counts one use of the worker token `id` whose record was `record` at `mod_revision`: `false` when
/// another join changed it meanwhile (took its last use, say).
pub async fn spend_worker_token(
    etcd: &Etcd,
    keys: &KeyLayout,
    id: &str,
    mut record: JoinToken,
    mod_revision: i64,
) -> Result<bool, EtcdError> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let key = keys.join_token(id);
    record.used += 1;
    let value = serde_json::to_vec(&record).unwrap_or_default();
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            mod_revision,
        )])
        .and_then([TxnOp::put(key, value, None)]);
    Ok(etcd.txn(txn).await?.succeeded())
}

/// The id and secret of a worker token's secret part, `wt.<id>.<secret>`.
pub fn worker_token_parts(secret: &str) -> Option<(&str, &str)> {
    let (id, secret) = secret.strip_prefix(WORKER_TOKEN_PREFIX)?.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 6) && hex(secret, 32)).then_some((id, secret))
}

/// What a join with a worker token gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerJoin {
    Admit,
    /// It asks to start an etcd member the leader did not ask this node for.
    NotAMember,
    /// Its joins are spent, and this is not the member the leader asked its node to become.
    UsedUp,
    /// It claims the name of a node that exists (and was not asked to become a member).
    NameTaken,
}

/// The rules of a worker token's join: a worker only, unless the leader's member request for the node
/// exists; a spent token only for that member; never an existing node's name but the one asked for.
pub fn worker_join_verdict(
    member: bool,
    requested: bool,
    exists: bool,
    used_up: bool,
) -> WorkerJoin {
    if member && !requested {
        WorkerJoin::NotAMember
    } else if used_up && !(member && requested) {
        WorkerJoin::UsedUp
    } else if exists && !requested {
        WorkerJoin::NameTaken
    } else {
        WorkerJoin::Admit
    }
}

/// Where a worker token's secret part begins.
pub const WORKER_TOKEN_PREFIX: &str = "wt.";

/// Stores a new worker token (a fresh id; a clash, one in 16 million, is tried again) and returns its
/// secret part, `wt.<id>.<secret>`: what `hostlet token create` prints after the CA fingerprint.
pub async fn put_worker_token(
    etcd: &Etcd,
    keys: &KeyLayout,
    description: &str,
    expires: Option<std::time::SystemTime>,
    uses: Option<u32>,
    used: u32,
) -> Result<String, EtcdError> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    use hostlet_api::objects::Timestamp;
    for _ in 0..5 {
        let mut b = [0u8; 3];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
        // The secret is made as the server token's is.
        let (id, secret) = (hex::encode(b), ClusterToken::generate(None).secret);
        let record = JoinToken {
            id: id.clone(),
            secret_sha256: sha256_hex(&secret),
            description: description.to_string(),
            created: Timestamp::now(),
            expires: expires.map(Timestamp),
            uses,
            used,
            revoked: false,
        };
        let key = keys.join_token(&id);
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(format!("{WORKER_TOKEN_PREFIX}{id}.{secret}"));
        }
    }
    Err(EtcdError::unavailable(
        "worker tokens",
        etcd_client::Error::InvalidArgs("could not find a free token id".into()),
    ))
}

/// The token a worker that joined with the server token keeps instead: a worker token of its own, its
/// one use spent by that join. It still carries the node to the member the leader may ask it to become,
/// and never makes a voter otherwise; the server token stays on the voters.
pub async fn node_token(
    etcd: &Etcd,
    keys: &KeyLayout,
    node: &str,
    fingerprint: Option<String>,
) -> Result<ClusterToken, EtcdError> {
    let secret = put_worker_token(
        etcd,
        keys,
        &format!("node {node}: kept by it instead of the server token"),
        None,
        Some(1),
        1,
    )
    .await?;
    Ok(ClusterToken {
        ca_fingerprint: fingerprint,
        secret,
    })
}

/// How etcd keeps a worker token's secret (`/hostlet/tokens/<id>`): its SHA-256, lowercase hex.
pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_worker_token_joins_a_worker_or_the_member_the_leader_asked_for() {
        use WorkerJoin::*;
        // (member, requested, exists, used up) → verdict
        for (member, requested, exists, used_up, want) in [
            (false, false, false, false, Admit),
            (true, false, false, false, NotAMember),
            (true, true, true, false, Admit),
            (false, false, true, false, NameTaken),
            (false, true, true, false, Admit),
            (false, false, false, true, UsedUp),
            (true, false, false, true, NotAMember),
            (false, true, true, true, UsedUp),
            (true, true, true, true, Admit),
        ] {
            assert_eq!(
                worker_join_verdict(member, requested, exists, used_up),
                want,
                "member {member}, requested {requested}, exists {exists}, used up {used_up}"
            );
        }
    }

    #[test]
    fn worker_token_secrets_have_one_shape() {
        let ok = "wt.abc123.0123456789abcdef0123456789abcdef";
        assert_eq!(
            worker_token_parts(ok),
            Some(("abc123", "0123456789abcdef0123456789abcdef"))
        );
        for bad in [
            "abc123.0123456789abcdef0123456789abcdef",
            "wt.abc12.0123456789abcdef0123456789abcdef",
            "wt.abc123.0123456789abcdef0123456789abcde",
            "wt.abc12g.0123456789abcdef0123456789abcdef",
            "wt.abc123",
            "",
        ] {
            assert_eq!(worker_token_parts(bad), None, "{bad}");
        }
    }

    #[test]
    fn bearer_token_is_required_and_checked() {
        let t = ClusterToken::parse("s3cret").unwrap();
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!authorized(&h, Some(&t)));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(authorized(&h, Some(&t)));
        assert!(!authorized(&h, None));
    }
}
