//! The cluster's trust, in one place: the certificate authorities and what they issue, certificate
//! requests, renewal, the revocation list, the tokens and the verification of a join.
//!
//! - `ca`: the cluster CA (the one etcd trusts) and the node CA derived from it, the certificates each
//!   node holds under `<data-dir>/tls/` ([`TlsDir`]), a joiner's own key and its certificate request
//!   ([`NodeKey`]), and who a client certificate names ([`identity_of_certificate`]);
//! - `token`: the cluster token, `H10::<ca-sha256-hex>::<secret>` ([`ClusterToken`]);
//! - `admission`: who a join is from (the server token or a worker token, [`verify_join_token`]), the
//!   rules of a worker token's join ([`worker_join_verdict`]) and the worker tokens' store;
//! - `revocation`: the certificate records under `/hostlet/certs/`, the revocation list etcd reads
//!   ([`keep_crl`]) and a worker's stop once its certificate is revoked;
//! - `renewal`: a node's certificates renewed before they expire, and a worker's server token swapped for
//!   a token of its own.
//!
//! Not here: the HTTP services that hand trust out. The join protocol's routes (`/cacerts`, `/db/info`,
//! `/db/join`) stay with the etcd member (`etcd_member::api`), the renewal route
//! (`POST /node/v1/certificates`) with the node API (`nodeapi::certs`), and the worker's join and restart
//! with the etcd member (`etcd_member::worker`); they call this module. It calls neither of them, so that
//! trust has one home and no cycle.

mod admission;
mod ca;
mod renewal;
mod revocation;
mod token;

pub use admission::{
    authorized, node_token, put_worker_token, spend_worker_token, verify_join_token,
    worker_join_verdict, worker_token_parts, JoinCaller, JoinRefusal, WorkerJoin,
    WORKER_TOKEN_PREFIX,
};
pub use ca::{
    cert_sans, check_request, client_tls_files, fingerprint_pem, identity_of_certificate,
    node_sans, not_after, serial_if_issued_to, serial_of, serial_of_der, write_file, CertAndKey,
    CertIdentity, CertRole, ClusterCa, IssuedCerts, NodeCerts, NodeKey, PeerNode, TlsDir, TlsError,
};
pub use renewal::{
    drop_server_token, keep_certificates_fresh, keep_member_certificates_fresh, RenewRequest,
    RenewResponse, RenewingNode,
};
pub use revocation::{
    certificates_store, keep_crl, stop_when_refused, stop_when_revoked, update_certificates,
    write_crl, Revocations,
};
pub use token::{ClusterToken, TokenError};
