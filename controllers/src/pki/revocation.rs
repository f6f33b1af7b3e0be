//! Revoking a deleted worker's certificates.
//!
//! A join records the serials of the certificates it issues under `/hostlet/certs/<node>`; `hostlet node
//! delete <worker>` moves them to the record's `revoked` list. Every voter keeps a certificate revocation
//! list of all revoked serials, signed by the cluster CA, at `<data-dir>/tls/revoked.crl`: its etcd reads
//! that file on each new connection (`--client-crl-file`), and the agent's API refuses the same
//! certificates. The deleted worker's own agent sees its serial revoked, stops its controllers (its pods
//! keep running as they are), writes nothing more, and its `/readyz` says why.

use std::path::Path;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::objects::NodeCertificates;
use hostlet_api::KeyLayout;
use hostlet_runtime::informer::Object;
use hostlet_runtime::{Etcd, EtcdError, InformerFactory, Store};
use tokio_util::sync::CancellationToken;

use super::ca::{write_file, ClusterCa, TlsError};

/// The informer label of the certificate records.
pub const CERTIFICATES_INFORMER: &str = "node-certificates";

/// The shared store of `/hostlet/certs/`.
pub fn certificates_store(
    factory: &InformerFactory,
    keys: &KeyLayout,
) -> Store<String, Object<NodeCertificates>> {
    factory.store(
        CERTIFICATES_INFORMER,
        keys.certificates_prefix(),
        |_key, value| serde_json::from_slice::<NodeCertificates>(value),
    )
}

/// Changes a node's certificate record with `change`, atomically (a concurrent change makes it read again).
pub async fn update_certificates(
    etcd: &Etcd,
    keys: &KeyLayout,
    node: &str,
    change: impl Fn(&mut NodeCertificates),
) -> Result<NodeCertificates, EtcdError> {
    let key = keys.node_certificates(node);
    loop {
        let current = etcd.get(&key).await?;
        let (mut record, compare) = match &current {
            Some(kv) => (
                // A record that does not parse is replaced: its serials are lost either way.
                serde_json::from_slice(kv.value()).unwrap_or_default(),
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
            ),
            None => (
                NodeCertificates::default(),
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            ),
        };
        change(&mut record);
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.clone(), value, None)]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(record);
        }
    }
}

/// The revoked serials of every node: which node each belongs to.
#[derive(Clone)]
pub struct Revocations {
    store: Store<String, Object<NodeCertificates>>,
}

impl Revocations {
    pub fn new(store: Store<String, Object<NodeCertificates>>) -> Self {
        Revocations { store }
    }

    /// None known: a worker's, which may not read the certificate records (its voters refuse a revoked
    /// certificate for it, and only its own node uses its API).
    pub fn none() -> Self {
        Revocations {
            store: hostlet_runtime::Writer::new().store(),
        }
    }

    /// The node whose revoked certificate has this serial (hex), if any.
    pub fn revoked(&self, serial: &str) -> Option<String> {
        self.store.state().iter().find_map(|o| {
            let r = o.valid()?;
            r.revoked
                .iter()
                .any(|s| s == serial)
                .then(|| o.key.rsplit('/').next().unwrap_or_default().to_string())
        })
    }

    /// Every serial etcd must refuse, sorted: the revoked ones and those a worker's later certificates
    /// superseded.
    pub fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .store
            .state()
            .iter()
            .filter_map(|o| o.valid())
            .flat_map(|r| r.revoked.iter().chain(&r.superseded).cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    pub fn store(&self) -> &Store<String, Object<NodeCertificates>> {
        &self.store
    }
}

/// Writes the revocation list of `serials` to `path` (0644: it holds no secret), whole or not at all.
pub fn write_crl(path: &Path, ca: &ClusterCa, serials: &[String]) -> Result<(), TlsError> {
    let number = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    write_file(path, &ca.crl(serials, number)?, 0o644)
}

/// Keeps `path` listing every revoked serial while the agent runs: written again on each change.
pub async fn keep_crl(
    revocations: Revocations,
    ca: Arc<ClusterCa>,
    path: std::path::PathBuf,
    shutdown: CancellationToken,
) {
    let store = revocations.store().clone();
    store.wait_until_ready().await;
    let mut changes = store.subscribe();
    let mut written: Option<Vec<String>> = None;
    loop {
        let all = revocations.all();
        if written.as_ref() != Some(&all) {
            let (ca, path2, serials) = (ca.clone(), path.clone(), all.clone());
            match tokio::task::spawn_blocking(move || write_crl(&path2, &ca, &serials)).await {
                Ok(Ok(())) => {
                    tracing::info!(revoked = all.len(), path = %path.display(), "certificate revocation list written");
                    written = Some(all);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::error_chain(&e), "cannot write the certificate revocation list")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the certificate revocation list")
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            batch = changes.next_batch() => if batch.is_none() { return },
            // A write that failed is tried again.
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)), if written.is_none() => {}
        }
    }
}

/// A worker's watch of its own certificate: once `serial` is revoked, the readiness component says so,
/// `agent_stop` stops the controllers (containers are left as they are), and `revoked` fires.
pub async fn stop_when_revoked(
    revocations: Revocations,
    node: String,
    serial: String,
    component: hostlet_runtime::ComponentHandle,
    agent_stop: CancellationToken,
    revoked: CancellationToken,
) {
    let store = revocations.store().clone();
    component.set_ready(format!("certificate {serial} not revoked"));
    let mut changes = store.subscribe();
    loop {
        if let Some(owner) = revocations.revoked(&serial) {
            let why = format!(
                "certificate {serial} is revoked: node {owner} was deleted (hostlet node delete)"
            );
            stop_revoked(&node, &why, &component, &agent_stop, &revoked);
            return;
        }
        tokio::select! {
            _ = agent_stop.cancelled() => return,
            batch = changes.next_batch() => if batch.is_none() { return },
        }
    }
}

/// The same for a worker, which reads no revocation: it stops once a voter refuses its certificate as
/// revoked (its watches end then, so the refusal comes at once).
pub async fn stop_when_refused(
    api: hostlet_runtime::nodeapi::NodeApiClient,
    node: String,
    serial: String,
    component: hostlet_runtime::ComponentHandle,
    agent_stop: CancellationToken,
    revoked: CancellationToken,
) {
    component.set_ready(format!("certificate {serial} not revoked"));
    let mut refusals = api.revoked();
    let why = tokio::select! {
        _ = agent_stop.cancelled() => return,
        why = refusals.wait_for(Option::is_some) => match why {
            Ok(w) => w.clone().unwrap_or_default(),
            Err(_) => return,
        },
    };
    stop_revoked(&node, why.trim_end(), &component, &agent_stop, &revoked);
}

/// `why` names the certificate (on a worker, in its voter's words).
fn stop_revoked(
    node: &str,
    why: &str,
    component: &hostlet_runtime::ComponentHandle,
    agent_stop: &CancellationToken,
    revoked: &CancellationToken,
) {
    let message = format!(
        "{why}; this agent stopped and left its pods as they are; join again with a new worker token"
    );
    tracing::error!(node = %node, "{message}");
    component.set_not_ready(message);
    agent_stop.cancel();
    revoked.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    #[test]
    fn a_revocation_list_names_the_serials_and_is_signed_by_the_ca() {
        let ca = ClusterCa::generate().unwrap();
        let a = ca.issue_node("a", &["127.0.0.1".into()]).unwrap();
        let b = ca.issue_node("b", &["127.0.0.1".into()]).unwrap();
        let serial = |pem: &str| crate::pki::serial_of(pem.as_bytes()).unwrap();
        let (sa, sb) = (serial(&a.client.cert), serial(&b.client.cert));
        assert_ne!(
            serial(&a.server.cert),
            sa,
            "each certificate its own serial"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked.crl");
        write_crl(&path, &ca, std::slice::from_ref(&sa)).unwrap();
        let pem = std::fs::read(&path).unwrap();
        let (_, p) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let (_, crl) =
            x509_parser::revocation_list::CertificateRevocationList::from_der(&p.contents).unwrap();
        let listed: Vec<String> = crl
            .iter_revoked_certificates()
            .map(|r| format!("{:x}", r.user_certificate))
            .collect();
        assert_eq!(listed, vec![sa.clone()]);
        assert!(!listed.contains(&sb));
        let ca_der = rustls::pki_types::CertificateDer::from(
            x509_parser::pem::parse_x509_pem(ca.cert.as_bytes())
                .unwrap()
                .1
                .contents,
        );
        let (_, ca_cert) = x509_parser::certificate::X509Certificate::from_der(&ca_der).unwrap();
        crl.verify_signature(ca_cert.public_key()).unwrap();
        // An empty list is a list too: etcd starts with one.
        write_crl(&path, &ca, &[]).unwrap();
    }

    #[test]
    fn a_record_issues_then_revokes_and_keeps_every_serial() {
        let mut r = NodeCertificates::default();
        r.issue(["a1".to_string(), "a2".to_string()]);
        r.issue(["a2".to_string()]);
        assert_eq!(r.issued, vec!["a1", "a2"]);
        r.revoke(hostlet_api::objects::Timestamp::from_unix(10));
        assert!(r.issued.is_empty());
        r.issue(["b1".to_string()]);
        r.revoke(hostlet_api::objects::Timestamp::from_unix(20));
        assert_eq!(r.revoked, vec!["a1", "a2", "b1"]);
        assert_eq!(r.revoked_at.map(|t| t.unix_secs()), Some(20));
    }
}
