//! The cluster's certificate authorities and the certificates each node holds under `<data-dir>/tls/`.
//!
//! The first node generates the cluster CA, the one etcd trusts; every etcd member holds its key too, so
//! that any member can admit a joiner. The node CA, which issues workers' client certificates, is derived
//! from the cluster CA key ([`ClusterCa::node_ca`]): every member has the same one without handing it
//! around, and etcd never trusts it. A worker holds neither key: it generates its own, sends a certificate
//! request, and gets back a server certificate from the cluster CA that serves only (a client of etcd
//! cannot use it) and client and peer certificates from the node CA (etcd refuses them at the handshake),
//! beside both CA certificates. Members' leaf certificates carry both server and client usage where etcd
//! needs both (peer traffic; the server certificate is also what etcd's own gateway presents).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hostlet_runtime::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use x509_parser::prelude::FromDer;

/// Errors of generating, loading or writing TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating a certificate")]
    Generate(#[from] rcgen::Error),
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: not a PEM certificate")]
    NotPem { what: String },
    #[error("csr: not a certificate request signed by its own key")]
    Request(#[source] rcgen::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A certificate and its private key, PEM-encoded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CertAndKey {
    pub cert: String,
    pub key: String,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertRole {
    /// etcd's client port and the agent's API: server auth (and client auth for etcd's own gateway).
    Server,
    /// etcd peer traffic: each member is both server and client.
    Peer,
    /// The agent's, the CLI's and etcdctl's etcd client.
    Client,
}

impl CertRole {
    fn file_stem(self) -> &'static str {
        match self {
            CertRole::Server => "server",
            CertRole::Peer => "peer",
            CertRole::Client => "client",
        }
    }
}

/// The three leaf certificates of one node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeCerts {
    pub server: CertAndKey,
    pub peer: CertAndKey,
    pub client: CertAndKey,
}

/// The common name of an admin's certificate begins with this.
pub const ADMIN_PREFIX: &str = "admin:";
/// The organization of an admin's certificate (a node's is `hostlet`).
pub const ADMIN_ORGANIZATION: &str = "hostlet:admins";

/// A CA: its certificate and key (the cluster CA, or the node CA derived from it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterCa {
    pub cert: String,
    pub key: String,
}

/// Ten years, from a day ago (clock skew between hosts).
fn validity(params: &mut CertificateParams) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let year = 1970 + (now / 31_556_952) as i32;
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
}

/// A CA certificate's contents but its validity: the name `common_name`, organization `hostlet`.
fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "hostlet");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl ClusterCa {
    /// A new self-signed CA (ECDSA P-256).
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = ca_params("hostlet-ca");
        validity(&mut params);
        let cert = params.self_signed(&key)?;
        Ok(ClusterCa {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// SHA-256 of the CA certificate's DER, lowercase hex: what the token carries.
    pub fn fingerprint(&self) -> Result<String, TlsError> {
        fingerprint_pem(&self.cert)
    }

    /// Issues a leaf certificate for `role`, valid for `sans` (IP addresses or DNS names).
    pub fn issue(
        &self,
        role: CertRole,
        common_name: &str,
        sans: &[String],
    ) -> Result<CertAndKey, TlsError> {
        self.issue_for(role, common_name, "hostlet", sans, None)
    }

    /// An admin's client certificate, `CN=admin:<name>`, valid for `lifetime` from now: etcdctl and the
    /// CLI from a workstation, and every route of the agents' APIs.
    pub fn issue_admin(&self, name: &str, lifetime: Duration) -> Result<CertAndKey, TlsError> {
        self.issue_for(
            CertRole::Client,
            &format!("{ADMIN_PREFIX}{name}"),
            ADMIN_ORGANIZATION,
            &[],
            Some(lifetime),
        )
    }

    fn issue_for(
        &self,
        role: CertRole,
        common_name: &str,
        organization: &str,
        sans: &[String],
        lifetime: Option<Duration>,
    ) -> Result<CertAndKey, TlsError> {
        let key = KeyPair::generate()?;
        let cert = self.sign(
            Usage::of(role),
            common_name,
            organization,
            sans,
            lifetime,
            &key,
        )?;
        Ok(CertAndKey {
            cert,
            key: key.serialize_pem(),
        })
    }

    /// A leaf certificate (PEM) for `key`, a key this CA never sees the private half of.
    fn sign(
        &self,
        usage: Usage,
        common_name: &str,
        organization: &str,
        sans: &[String],
        lifetime: Option<Duration>,
        key: &impl PublicKeyData,
    ) -> Result<String, TlsError> {
        let ca_key = KeyPair::from_pem(&self.key)?;
        let ca_cert = CertificateParams::from_ca_cert_pem(&self.cert)?.self_signed(&ca_key)?;
        let mut params = CertificateParams::new(if usage == Usage::Client {
            Vec::new()
        } else {
            sans.to_vec()
        })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, organization);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Usage::ServeOnly => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        // Random, so that each certificate can be revoked on its own (the default derives it from the key,
        // which a node's three certificates share).
        let mut serial = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut serial);
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        match lifetime {
            None => validity(&mut params),
            Some(l) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                let epoch = rcgen::date_time_ymd(1970, 1, 1);
                let skew = skew_for(l);
                params.not_before = epoch + now.saturating_sub(skew);
                params.not_after = epoch + now + l;
            }
        }
        Ok(params.signed_by(key, &ca_cert, &ca_key)?.pem())
    }

    /// The server, peer and client certificates of one node (ten years).
    pub fn issue_node(&self, node: &str, sans: &[String]) -> Result<NodeCerts, TlsError> {
        self.issue_node_lasting(node, sans, None)
    }

    /// [`ClusterCa::issue_node`] for `lifetime` (`None`: ten years), for one new key of the node's.
    pub fn issue_node_lasting(
        &self,
        node: &str,
        sans: &[String],
        lifetime: Option<Duration>,
    ) -> Result<NodeCerts, TlsError> {
        let key = KeyPair::generate()?;
        let client = format!("{node}-client");
        let pair = |cert: String| CertAndKey {
            cert,
            key: key.serialize_pem(),
        };
        Ok(NodeCerts {
            server: pair(self.sign(Usage::Both, node, "hostlet", sans, lifetime, &key)?),
            peer: pair(self.sign(Usage::Both, node, "hostlet", sans, lifetime, &key)?),
            client: pair(self.sign(Usage::Client, &client, "hostlet", sans, lifetime, &key)?),
        })
    }

    /// The server, peer and client certificates of one node for the key of its certificate request
    /// (`csr`, PEM, signed by that key). What the request asks for beyond its key is not read: the names
    /// and usages are this CA's to choose.
    pub fn issue_node_for(
        &self,
        node: &str,
        sans: &[String],
        csr: &str,
        lifetime: Option<Duration>,
    ) -> Result<IssuedCerts, TlsError> {
        let request = CertificateSigningRequestParams::from_pem(csr).map_err(TlsError::Request)?;
        let key = &request.public_key;
        let client = format!("{node}-client");
        Ok(IssuedCerts {
            server: self.sign(Usage::Both, node, "hostlet", sans, lifetime, key)?,
            peer: self.sign(Usage::Both, node, "hostlet", sans, lifetime, key)?,
            client: self.sign(Usage::Client, &client, "hostlet", sans, lifetime, key)?,
        })
    }

    /// A worker's certificates for the key of its request, valid for `lifetime`: a server certificate from
    /// this (the cluster) CA that serves only, so that voters and the CLI verify the worker's API as any
    /// node's, and client and peer certificates from the node CA, which etcd does not trust. No
    /// certificate a worker holds opens etcd.
    pub fn issue_worker_for(
        &self,
        node: &str,
        sans: &[String],
        csr: &str,
        lifetime: Duration,
    ) -> Result<IssuedCerts, TlsError> {
        let request = CertificateSigningRequestParams::from_pem(csr).map_err(TlsError::Request)?;
        let key = &request.public_key;
        let node_ca = self.node_ca()?;
        let client = format!("{node}-client");
        let life = Some(lifetime);
        Ok(IssuedCerts {
            server: self.sign(Usage::ServeOnly, node, "hostlet", sans, life, key)?,
            peer: node_ca.sign(Usage::Client, &client, "hostlet", sans, life, key)?,
            client: node_ca.sign(Usage::Client, &client, "hostlet", sans, life, key)?,
        })
    }

    /// The node CA of this cluster CA: an Ed25519 key derived from this CA's key and a certificate with
    /// fixed contents (Ed25519 signs deterministically), so every member derives the very same one.
    pub fn node_ca(&self) -> Result<ClusterCa, TlsError> {
        let (_, hk) =
            hkdf::Hkdf::<sha2::Sha256>::extract(Some(b"hostlet node CA"), self.key.as_bytes());
        let mut seed = zeroize::Zeroizing::new([0u8; 32]);
        // 32 bytes is far below HKDF-SHA256's limit: expand cannot fail here.
        let _ = hk.expand(b"ed25519 v1", seed.as_mut());
        // PKCS#8 v1 of an Ed25519 private key: a fixed prefix and the seed.
        let mut der = zeroize::Zeroizing::new(vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ]);
        der.extend_from_slice(seed.as_ref());
        let key = KeyPair::from_pkcs8_der_and_sign_algo(
            &rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_slice()),
            &rcgen::PKCS_ED25519,
        )?;
        let mut params = ca_params("hostlet-node-ca");
        // The cluster CA's own validity and a serial from the key: nothing that changes between members.
        same_validity(&mut params, &self.cert).ok_or_else(|| TlsError::NotPem {
            what: "the cluster CA certificate".into(),
        })?;
        let digest = Sha256::digest(key.public_key_der());
        let mut serial = digest[..16].to_vec();
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params.self_signed(&key)?;
        Ok(ClusterCa {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// What a leaf certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Usage {
    /// Server and client (etcd's server and peer certificates).
    Both,
    /// Server only: a worker's API (etcd refuses it as a client).
    ServeOnly,
    Client,
}

impl Usage {
    fn of(role: CertRole) -> Usage {
        match role {
            CertRole::Server | CertRole::Peer => Usage::Both,
            CertRole::Client => Usage::Client,
        }
    }
}

/// Gives `params` the validity of the first certificate in `pem`.
fn same_validity(params: &mut CertificateParams, pem: &str) -> Option<()> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()).ok()?;
    let v = cert.validity();
    params.not_before = v.not_before.to_datetime();
    params.not_after = v.not_after.to_datetime();
    Some(())
}

/// Whether the first certificate in `cert` names the CA certificate `ca`'s subject as its issuer (both
/// PEM): which CA a node's own certificate came from, to know when to ask for new ones. Not a trust
/// decision: the TLS handshake makes those.
pub fn issuer_is(cert: &[u8], ca: &[u8]) -> bool {
    let parse = |pem: &[u8]| CertificateDer::pem_slice_iter(pem).next()?.ok();
    let (Some(leaf), Some(ca)) = (parse(cert), parse(ca)) else {
        return false;
    };
    let Ok((_, leaf)) = x509_parser::certificate::X509Certificate::from_der(leaf.as_ref()) else {
        return false;
    };
    let Ok((_, ca)) = x509_parser::certificate::X509Certificate::from_der(ca.as_ref()) else {
        return false;
    };
    leaf.issuer().as_raw() == ca.subject().as_raw()
}

/// The serial (hex) of the first certificate in `pem` if the CA `ca` (PEM) signed it for `node` (its
/// server or peer certificate, named `node`, or its client certificate, `node-client`): one an earlier
/// version issued and may not have recorded, which the node hands in when it moves to the node CA.
pub fn serial_if_issued_to(pem: &[u8], ca: &[u8], node: &str) -> Option<String> {
    let parse = |pem: &[u8]| CertificateDer::pem_slice_iter(pem).next()?.ok();
    let (leaf_der, ca_der) = (parse(pem)?, parse(ca)?);
    let (_, leaf) = x509_parser::certificate::X509Certificate::from_der(leaf_der.as_ref()).ok()?;
    let (_, ca) = x509_parser::certificate::X509Certificate::from_der(ca_der.as_ref()).ok()?;
    leaf.verify_signature(Some(ca.public_key())).ok()?;
    let cn = leaf.subject().iter_common_name().next()?.as_str().ok()?;
    (cn == node || cn == format!("{node}-client"))
        .then(|| format!("{:x}", leaf.tbs_certificate.serial))
}

/// When the first certificate in `pem` should be renewed: two thirds into its life.
pub fn renew_at(pem: &[u8]) -> Option<SystemTime> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()).ok()?;
    let v = cert.validity();
    let from = v.not_before.timestamp();
    let until = v.not_after.timestamp();
    let at = from + (until - from) * 2 / 3;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(at).ok()?))
}

/// Whether the first certificate in `pem` lasts longer than one issued now for `lifetime` would (its
/// back-dating for clock skew and a minute's slack allowed): then it was issued under other terms.
pub fn outlasts(pem: &[u8], lifetime: Duration) -> bool {
    let Some(der) = CertificateDer::pem_slice_iter(pem)
        .next()
        .and_then(Result::ok)
    else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()) else {
        return false;
    };
    let v = cert.validity();
    let life = (v.not_after.timestamp() - v.not_before.timestamp()).max(0);
    let allowed = lifetime + skew_for(lifetime) + Duration::from_secs(60);
    u64::try_from(life).unwrap_or(0) > allowed.as_secs()
}

/// How far back a certificate issued for `lifetime` starts, for clock skew between hosts: an hour, or a
/// quarter of a short life (renewal reckons two thirds from the start).
fn skew_for(lifetime: Duration) -> Duration {
    Duration::from_secs(3600).min(lifetime / 4)
}

/// The serial number of the first certificate in `pem`, lowercase hex without leading zeros (as a CRL
/// and [`hostlet_api::objects::NodeCertificates`] name it).
pub fn serial_of(pem: &[u8]) -> Option<String> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    serial_of_der(der.as_ref())
}

/// [`serial_of`] for a DER certificate.
pub fn serial_of_der(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    Some(format!("{:x}", cert.tbs_certificate.serial))
}

impl IssuedCerts {
    /// The serials of the three certificates.
    pub fn serials(&self) -> Vec<String> {
        [&self.server, &self.peer, &self.client]
            .iter()
            .filter_map(|c| serial_of(c.as_bytes()))
            .collect()
    }
}

impl ClusterCa {
    /// A certificate revocation list (PEM) naming `serials` (hex), signed by this CA: what etcd's
    /// `--client-crl-file` reads on each new connection. `number` orders the lists.
    pub fn crl(&self, serials: &[String], number: u64) -> Result<String, TlsError> {
        let ca_key = KeyPair::from_pem(&self.key)?;
        let ca_cert = CertificateParams::from_ca_cert_pem(&self.cert)?.self_signed(&ca_key)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let revoked_certs = serials
            .iter()
            .filter_map(|s| {
                let bytes = hex_bytes(s)?;
                Some(rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from_slice(&bytes),
                    revocation_time: epoch + now,
                    reason_code: None,
                    invalidity_date: None,
                })
            })
            .collect();
        let params = rcgen::CertificateRevocationListParams {
            this_update: epoch + now.saturating_sub(Duration::from_secs(3600)),
            // Far ahead: the list is written anew whenever it changes, and a stale one must not expire.
            next_update: epoch + now + Duration::from_secs(10 * 365 * 86400),
            crl_number: rcgen::SerialNumber::from_slice(&number.to_be_bytes()),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&ca_cert, &ca_key)?.pem()?)
    }
}

/// `serial` (hex, any length) as big-endian bytes.
fn hex_bytes(serial: &str) -> Option<Vec<u8>> {
    let padded = if serial.len() % 2 == 1 {
        format!("0{serial}")
    } else {
        serial.to_string()
    };
    hex::decode(padded).ok().filter(|b| !b.is_empty())
}

/// Whether `csr` is a certificate request signed by the key it names.
pub fn check_request(csr: &str) -> Result<(), TlsError> {
    CertificateSigningRequestParams::from_pem(csr)
        .map(|_| ())
        .map_err(TlsError::Request)
}

/// A joiner's own key: the private half never leaves the node; the join sends a certificate request.
pub struct NodeKey {
    key: KeyPair,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(<hidden>)")
    }
}

impl NodeKey {
    /// A new key (ECDSA P-256).
    pub fn generate() -> Result<NodeKey, TlsError> {
        Ok(NodeKey {
            key: KeyPair::generate()?,
        })
    }

    /// A certificate request for `node`, signed by this key (PEM).
    pub fn request(&self, node: &str) -> Result<String, TlsError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node);
        params.distinguished_name = dn;
        Ok(params.serialize_request(&self.key)?.pem()?)
    }

    /// The node's certificates with this key beside each.
    pub fn with(&self, issued: IssuedCerts) -> NodeCerts {
        let key = self.key.serialize_pem();
        let pair = |cert: String| CertAndKey {
            cert,
            key: key.clone(),
        };
        NodeCerts {
            server: pair(issued.server),
            peer: pair(issued.peer),
            client: pair(issued.client),
        }
    }
}

/// A node's three certificates as the CA issues them for its request: no private key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssuedCerts {
    pub server: String,
    pub peer: String,
    pub client: String,
}

/// Who a client certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertIdentity {
    Node(String),
    Admin(String),
}

/// Who the request's client certificate names (`None`: no certificate) and its serial (hex), set by the
/// API's listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerNode(pub Option<CertIdentity>, pub Option<String>);

/// Who a DER certificate names, by how hostlet issues them (see the module docs); `None` for one it does
/// not understand.
pub fn identity_of_certificate(der: &[u8]) -> Option<CertIdentity> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let serves = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .is_some_and(|e| e.value.server_auth);
    let name_ok = |n: &str| hostlet_api::field::is_dns_subdomain(n);
    if serves {
        return name_ok(&cn).then_some(CertIdentity::Node(cn));
    }
    if let Some(admin) = cn.strip_prefix(ADMIN_PREFIX) {
        // Both marks: the name and the organization only `hostlet cert admin` gives.
        let admins = cert
            .subject()
            .iter_organization()
            .any(|o| o.as_str() == Ok(ADMIN_ORGANIZATION));
        return (admins && name_ok(admin)).then(|| CertIdentity::Admin(admin.to_string()));
    }
    let node = cn.strip_suffix("-client")?;
    name_ok(node).then(|| CertIdentity::Node(node.to_string()))
}

/// When the first certificate in `pem` expires.
pub fn not_after(pem: &[u8]) -> Option<SystemTime> {
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// SHA-256 of the first certificate in `pem`, over its DER, lowercase hex.
pub fn fingerprint_pem(pem: &str) -> Result<String, TlsError> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|_| TlsError::NotPem {
        what: "CA certificate".into(),
    })?;
    Ok(hex::encode(Sha256::digest(der.as_ref())))
}

/// The subject alternative names of a node's certificates: the advertise address, loopback, `localhost`
/// and the hostname (deduplicated, order kept).
pub fn node_sans(advertise: &str, hostname: &str, extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in [advertise, "127.0.0.1", "localhost", hostname]
        .into_iter()
        .map(str::to_string)
        .chain(extra.iter().cloned())
    {
        if !s.is_empty() && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The subject alternative names a PEM certificate carries, as text.
pub fn cert_sans(pem: &str) -> Result<Vec<String>, TlsError> {
    let params = CertificateParams::from_ca_cert_pem(pem)?;
    Ok(params
        .subject_alt_names
        .iter()
        .filter_map(|san| match san {
            SanType::IpAddress(ip) => Some(ip.to_string()),
            SanType::DnsName(name) => Some(name.as_str().to_string()),
            _ => None,
        })
        .collect())
}

/// Whether two names are the same: addresses by value (`::1` and `0:0::1`), DNS names without case.
fn same_name(a: &str, b: &str) -> bool {
    match (a.parse::<std::net::IpAddr>(), b.parse::<std::net::IpAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        (Err(_), Err(_)) => a.eq_ignore_ascii_case(b),
        _ => false,
    }
}

/// The files of `<data-dir>/tls/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsDir {
    pub dir: PathBuf,
}

impl TlsDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TlsDir { dir: dir.into() }
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    /// The node CA's certificate (every node; no node stores its key: members derive it).
    pub fn node_ca_cert(&self) -> PathBuf {
        self.dir.join("node-ca.crt")
    }

    /// The CA certificates the node's API takes client certificates from: the cluster CA's and, where
    /// the node has it, the node CA's (workers' client certificates).
    pub fn client_cas(&self) -> Result<Vec<u8>, TlsError> {
        let mut pem = read(&self.ca_cert())?.into_bytes();
        match std::fs::read(self.node_ca_cert()) {
            Ok(node) => {
                pem.push(b'\n');
                pem.extend(node);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&self.node_ca_cert())(e)),
        }
        Ok(pem)
    }

    /// Whether the node's client certificate comes from the node CA: a worker's as this version issues
    /// them (one from the cluster CA, which an earlier version gave workers, still opens etcd).
    pub fn client_from_node_ca(&self) -> bool {
        match (
            std::fs::read(self.cert(CertRole::Client)),
            std::fs::read(self.node_ca_cert()),
        ) {
            (Ok(cert), Ok(ca)) => issuer_is(&cert, &ca),
            _ => false,
        }
    }

    /// Writes the node CA certificate derived from the cluster CA `ca` (a member's), when it is not there
    /// or differs.
    pub fn ensure_node_ca(&self, ca: &ClusterCa) -> Result<(), TlsError> {
        let node_ca = ca.node_ca()?;
        if std::fs::read_to_string(self.node_ca_cert()).ok().as_deref() != Some(&node_ca.cert) {
            write_file(&self.node_ca_cert(), &node_ca.cert, 0o644)?;
        }
        Ok(())
    }
    pub fn cert(&self, role: CertRole) -> PathBuf {
        self.dir.join(format!("{}.crt", role.file_stem()))
    }
    pub fn key(&self, role: CertRole) -> PathBuf {
        self.dir.join(format!("{}.key", role.file_stem()))
    }

    /// When each certificate there expires: `ca`, `server`, `peer`, `client`, those that exist and parse.
    pub fn expiries(&self) -> Vec<(&'static str, SystemTime)> {
        let mut files = vec![("ca", self.ca_cert())];
        for r in [CertRole::Server, CertRole::Peer, CertRole::Client] {
            files.push((r.file_stem(), self.cert(r)));
        }
        files
            .into_iter()
            .filter_map(|(name, path)| {
                let pem = std::fs::read(&path).ok()?;
                Some((name, not_after(&pem)?))
            })
            .collect()
    }

    /// Where a worker of an earlier version kept the root of the secret keys (`crate::secrets`); a worker
    /// deletes it now, and so does a member's write.
    pub fn secrets_root(&self) -> PathBuf {
        self.dir.join("secrets.key")
    }

    /// The revocation list a member's etcd reads ([`super::keep_crl`] keeps it).
    pub fn crl(&self) -> PathBuf {
        self.dir.join("revoked.crl")
    }

    /// The serials of the node's server, peer and client certificates that are there.
    pub fn serials(&self) -> Vec<String> {
        [CertRole::Server, CertRole::Peer, CertRole::Client]
            .iter()
            .filter_map(|r| serial_of(&std::fs::read(self.cert(*r)).ok()?))
            .collect()
    }

    /// Whether the node's certificates and the CA certificate are there (a worker holds no CA key).
    pub fn is_complete(&self) -> bool {
        let mut files = vec![self.ca_cert()];
        for r in [CertRole::Server, CertRole::Peer, CertRole::Client] {
            files.push(self.cert(r));
            files.push(self.key(r));
        }
        files.iter().all(|f| f.is_file())
    }

    /// Writes the CA and the node's certificates; keys are created 0600, each file written whole then
    /// renamed into place so that a crash never leaves half a key.
    pub fn write(&self, ca: &ClusterCa, certs: &NodeCerts) -> Result<(), TlsError> {
        self.write_node(&ca.cert, Some(&ca.key), certs)?;
        self.ensure_node_ca(ca)
    }

    /// Writes a worker's material: the CA certificate without its key (one left from when the node ran a
    /// member goes, and so does a root of the secret keys an earlier version handed workers), the node CA
    /// certificate when the server sent one (a server of an earlier version does not), and its
    /// certificates.
    pub fn write_worker(
        &self,
        ca_cert: &str,
        node_ca_cert: Option<&str>,
        certs: &NodeCerts,
    ) -> Result<(), TlsError> {
        if let Some(node_ca) = node_ca_cert {
            std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
            write_file(&self.node_ca_cert(), node_ca, 0o644)?;
        }
        self.write_node(ca_cert, None, certs)
    }

    fn write_node(
        &self,
        ca_cert: &str,
        ca_key: Option<&str>,
        certs: &NodeCerts,
    ) -> Result<(), TlsError> {
        std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        set_mode(&self.dir, 0o700)?;
        write_file(&self.ca_cert(), ca_cert, 0o644)?;
        // No node keeps a root of the secret keys any more: members derive it from the CA key, and workers
        // get their secrets opened by the voters.
        for (path, contents) in [(self.ca_key(), ca_key), (self.secrets_root(), None)] {
            match contents {
                Some(c) => write_file(&path, c, 0o600)?,
                None => match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io_err(&path)(e))
                    }
                    _ => {}
                },
            }
        }
        for (role, ck) in [
            (CertRole::Server, &certs.server),
            (CertRole::Peer, &certs.peer),
            (CertRole::Client, &certs.client),
        ] {
            write_file(&self.cert(role), &ck.cert, 0o644)?;
            write_file(&self.key(role), &ck.key, 0o600)?;
        }
        Ok(())
    }

    /// Which of `sans` the stored certificate of `role` does not name (addresses compared as addresses).
    pub fn missing_sans(&self, role: CertRole, sans: &[String]) -> Result<Vec<String>, TlsError> {
        let pem = read(&self.cert(role))?;
        let named = cert_sans(&pem)?;
        Ok(sans
            .iter()
            .filter(|want| !named.iter().any(|have| same_name(have, want)))
            .cloned()
            .collect())
    }

    /// Issues the node's certificates again for `sans` when the stored server or peer certificate does not
    /// name all of them (the advertise address or the hostname changed, say); the CA stays. Returns the
    /// names that were missing, empty when nothing was reissued.
    pub fn refresh_node_certs(
        &self,
        ca: &ClusterCa,
        node: &str,
        sans: &[String],
        lifetime: Option<Duration>,
    ) -> Result<Vec<String>, TlsError> {
        let mut missing = self.missing_sans(CertRole::Server, sans)?;
        for m in self.missing_sans(CertRole::Peer, sans)? {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
        if !missing.is_empty() {
            self.write(ca, &ca.issue_node_lasting(node, sans, lifetime)?)?;
        }
        Ok(missing)
    }

    /// The CA as stored.
    pub fn load_ca(&self) -> Result<ClusterCa, TlsError> {
        Ok(ClusterCa {
            cert: read(&self.ca_cert())?,
            key: read(&self.ca_key())?,
        })
    }

    /// One of the node's certificates as stored.
    pub fn load(&self, role: CertRole) -> Result<CertAndKey, TlsError> {
        Ok(CertAndKey {
            cert: read(&self.cert(role))?,
            key: read(&self.key(role))?,
        })
    }
}

/// The client TLS files of a node's data dir.
pub fn client_tls_files(tls: &TlsDir) -> TlsFiles {
    TlsFiles {
        ca: tls.ca_cert(),
        cert: tls.cert(CertRole::Client),
        key: tls.key(CertRole::Client),
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(io_err(path))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Writes `contents` to `path` with `mode`, whole or not at all ([`crate::files::write_atomic`]).
pub fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), TlsError> {
    crate::files::write_atomic(path, contents.as_bytes(), mode).map_err(io_err(path))
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
