//! The unit tests of [`super`]: the CAs, issuing, writing and reading certificates.
use super::*;

#[test]
fn a_write_that_fails_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    // The rename fails: a non-empty directory holds the name.
    let path = dir.path().join("endpoints");
    std::fs::create_dir_all(path.join("in-the-way")).unwrap();
    assert!(write_file(&path, "x\n", 0o644).is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("endpoints")]);
    let ok = dir.path().join("other");
    write_file(&ok, "y\n", 0o600).unwrap();
    assert_eq!(std::fs::read_to_string(&ok).unwrap(), "y\n");
}

#[test]
fn fingerprint_is_sha256_of_der_and_stable() {
    let ca = ClusterCa::generate().unwrap();
    let fp = ca.fingerprint().unwrap();
    assert_eq!(fp.len(), 64);
    assert_eq!(fp, ca.fingerprint().unwrap());
    let other = ClusterCa::generate().unwrap();
    assert_ne!(fp, other.fingerprint().unwrap());
}

#[test]
fn issued_certificates_verify_against_the_ca() {
    let ca = ClusterCa::generate().unwrap();
    let sans = node_sans("127.0.0.1", "host-a", &[]);
    let certs = ca.issue_node("n1", &sans).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider,
    )
    .build()
    .unwrap();
    let leaf = CertificateDer::from_pem_slice(certs.server.cert.as_bytes()).unwrap();
    use rustls::client::danger::ServerCertVerifier;
    for name in ["127.0.0.1", "localhost", "host-a"] {
        let sn = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        verifier
            .verify_server_cert(&leaf, &[], &sn, &[], rustls::pki_types::UnixTime::now())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let bad = rustls::pki_types::ServerName::try_from("elsewhere".to_string()).unwrap();
    assert!(verifier
        .verify_server_cert(&leaf, &[], &bad, &[], rustls::pki_types::UnixTime::now())
        .is_err());
}

#[test]
fn certificates_are_issued_again_only_when_an_address_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = TlsDir::new(tmp.path().join("tls"));
    let ca = ClusterCa::generate().unwrap();
    let old = node_sans("127.0.0.1", "host-a", &[]);
    dir.write(&ca, &ca.issue_node("n1", &old).unwrap()).unwrap();
    let before = dir.load(CertRole::Server).unwrap().cert;

    // The same names, written otherwise: nothing to do.
    let same: Vec<String> = vec!["LOCALHOST".into(), "host-a".into(), "127.0.0.1".into()];
    assert!(dir
        .missing_sans(CertRole::Server, &same)
        .unwrap()
        .is_empty());
    assert!(same_name("::1", "0:0:0:0:0:0:0:1") && !same_name("::1", "127.0.0.1"));
    assert!(dir
        .refresh_node_certs(&ca, "n1", &old, None)
        .unwrap()
        .is_empty());
    assert_eq!(dir.load(CertRole::Server).unwrap().cert, before);

    // A new advertise address: issued again, by the same CA, naming it.
    let new = node_sans("10.1.2.3", "host-a", &[]);
    assert_eq!(
        dir.refresh_node_certs(&ca, "n1", &new, None).unwrap(),
        vec!["10.1.2.3".to_string()]
    );
    assert_ne!(dir.load(CertRole::Server).unwrap().cert, before);
    assert_eq!(dir.load_ca().unwrap().cert, ca.cert);
    for role in [CertRole::Server, CertRole::Peer] {
        assert!(dir.missing_sans(role, &new).unwrap().is_empty());
    }
}

#[test]
fn a_ca_reloaded_from_pem_still_signs() {
    let ca = ClusterCa::generate().unwrap();
    let again = ClusterCa {
        cert: ca.cert.clone(),
        key: ca.key.clone(),
    };
    again.issue(CertRole::Client, "c", &[]).unwrap();
}

#[test]
fn written_keys_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = TlsDir::new(tmp.path().join("tls"));
    let ca = ClusterCa::generate().unwrap();
    let certs = ca
        .issue_node("n1", &node_sans("127.0.0.1", "h", &[]))
        .unwrap();
    assert!(!dir.is_complete());
    dir.write(&ca, &certs).unwrap();
    assert!(dir.is_complete());
    for role in [CertRole::Server, CertRole::Peer, CertRole::Client] {
        let mode = std::fs::metadata(dir.key(role))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{role:?}");
    }
    let mode = std::fs::metadata(dir.ca_key())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(dir.load_ca().unwrap(), ca);
    assert_eq!(dir.load(CertRole::Peer).unwrap(), certs.peer);
}

#[test]
fn a_request_gets_certificates_for_its_own_key_and_a_worker_keeps_no_ca_key() {
    let ca = ClusterCa::generate().unwrap();
    let key = NodeKey::generate().unwrap();
    let csr = key.request("w1").unwrap();
    let sans = node_sans("127.0.0.1", "h", &[]);
    let issued = ca.issue_node_for("w1", &sans, &csr, None).unwrap();
    let certs = key.with(issued);
    let spki = |pem: &str| {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, c) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()).unwrap();
        c.public_key().raw.to_vec()
    };
    let own = KeyPair::from_pem(&certs.client.key).unwrap();
    for ck in [&certs.server, &certs.peer, &certs.client] {
        assert_eq!(ck.key, certs.client.key);
        assert_eq!(spki(&ck.cert), own.public_key_der());
    }
    // What the request asks for is not what decides: the names are the CA's.
    let der = CertificateDer::from_pem_slice(certs.client.cert.as_bytes()).unwrap();
    let (_, c) = x509_parser::certificate::X509Certificate::from_der(der.as_ref()).unwrap();
    assert_eq!(
        c.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        "w1-client"
    );
    // A request not signed by its key, or no request at all, is refused.
    let body: String = csr.lines().filter(|l| !l.starts_with("-----")).collect();
    let at = body.trim_end_matches('=').len() - 20;
    let mut bytes = body.into_bytes();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let forged = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        String::from_utf8(bytes).unwrap()
    );
    assert!(ca.issue_node_for("w1", &sans, &forged, None).is_err());
    assert!(ca.issue_node_for("w1", &sans, "", None).is_err());

    // A former member's directory: the CA key goes, and a root of the secret keys an earlier version
    // wrote goes too.
    let tmp = tempfile::tempdir().unwrap();
    let dir = TlsDir::new(tmp.path().join("tls"));
    dir.write(&ca, &ca.issue_node("w1", &sans).unwrap())
        .unwrap();
    assert!(dir.ca_key().exists());
    std::fs::write(dir.secrets_root(), "root").unwrap();
    dir.write_worker(&ca.cert, None, &certs).unwrap();
    assert!(!dir.ca_key().exists() && dir.is_complete());
    assert!(!dir.secrets_root().exists());
    assert!(dir.load_ca().is_err());
    dir.write(&ca, &certs).unwrap();
    assert!(dir.ca_key().exists());
}

/// Whether a client verifier trusting `roots` (PEM) takes `cert` (PEM) as a client certificate.
fn client_accepted(roots: &[&str], cert: &str) -> bool {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store
            .add(CertificateDer::from_pem_slice(r.as_bytes()).unwrap())
            .unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(store),
        provider,
    )
    .build()
    .unwrap();
    let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    verifier
        .verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
        .is_ok()
}

#[test]
fn every_member_derives_the_same_node_ca_and_no_other_ca_does() {
    let ca = ClusterCa::generate().unwrap();
    let a = ca.node_ca().unwrap();
    let again = ClusterCa {
        cert: ca.cert.clone(),
        key: ca.key.clone(),
    }
    .node_ca()
    .unwrap();
    assert_eq!(a, again, "byte for byte");
    assert_ne!(a.cert, ca.cert);
    let other = ClusterCa::generate().unwrap().node_ca().unwrap();
    assert_ne!(a.key, other.key);
    assert_ne!(a.cert, other.cert);
}

#[test]
fn no_certificate_a_worker_gets_opens_etcd() {
    let ca = ClusterCa::generate().unwrap();
    let node_ca = ca.node_ca().unwrap();
    let key = NodeKey::generate().unwrap();
    let sans = node_sans("127.0.0.1", "h", &[]);
    let csr = key.request("w1").unwrap();
    let issued = ca
        .issue_worker_for("w1", &sans, &csr, Duration::from_secs(120))
        .unwrap();
    // etcd trusts the cluster CA alone: it takes a member's client certificate, none of the worker's.
    let member = ca.issue_node("v1", &sans).unwrap();
    assert!(client_accepted(&[&ca.cert], &member.client.cert));
    for (what, cert) in [
        ("server", &issued.server),
        ("peer", &issued.peer),
        ("client", &issued.client),
    ] {
        assert!(
            !client_accepted(&[&ca.cert], cert),
            "etcd took the worker's {what} certificate"
        );
    }
    // The agents' APIs trust both CAs: the worker's client certificate names it there.
    assert!(client_accepted(&[&ca.cert, &node_ca.cert], &issued.client));
    let der = CertificateDer::from_pem_slice(issued.client.as_bytes()).unwrap();
    assert_eq!(
        identity_of_certificate(der.as_ref()),
        Some(CertIdentity::Node("w1".into()))
    );
    // Its server certificate still serves under the cluster CA, for its own names.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider,
    )
    .build()
    .unwrap();
    use rustls::client::danger::ServerCertVerifier;
    let leaf = CertificateDer::from_pem_slice(issued.server.as_bytes()).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
    server_verifier
        .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
        .unwrap();
    // Issued for the lifetime asked, renewed two thirds in.
    let pem = issued.client.as_bytes();
    let life = not_after(pem)
        .unwrap()
        .duration_since(SystemTime::now())
        .unwrap();
    assert!(
        life <= Duration::from_secs(120) && life > Duration::from_secs(60),
        "{life:?}"
    );
    let due = renew_at(pem).unwrap();
    assert!(due < not_after(pem).unwrap() && due > SystemTime::now() - Duration::from_secs(3600));
    // Which CA each came from, as the worker tells when to ask for new ones.
    assert!(issuer_is(issued.client.as_bytes(), node_ca.cert.as_bytes()));
    assert!(!issuer_is(
        member.client.cert.as_bytes(),
        node_ca.cert.as_bytes()
    ));
    let tmp = tempfile::tempdir().unwrap();
    let dir = TlsDir::new(tmp.path().join("tls"));
    dir.write_worker(&ca.cert, None, &key.with(issued.clone()))
        .unwrap();
    assert!(!dir.client_from_node_ca(), "no node CA certificate yet");
    dir.write_worker(&ca.cert, Some(&node_ca.cert), &key.with(issued))
        .unwrap();
    assert!(dir.client_from_node_ca());
    assert!(!dir.node_ca_cert().with_extension("key").exists());
}

#[test]
fn sans_are_deduplicated() {
    assert_eq!(
        node_sans("127.0.0.1", "h", &["h".into(), "10.0.0.1".into()]),
        vec!["127.0.0.1", "localhost", "h", "10.0.0.1"]
    );
}

#[test]
fn a_certificate_issued_for_longer_than_the_lifetime_now_is_renewed_at_once() {
    let ca = ClusterCa::generate().unwrap();
    let sans = vec!["127.0.0.1".to_string()];
    let day = Duration::from_secs(86_400);
    // An earlier version's ten-year certificate.
    let old = ca.issue_node("n1", &sans).unwrap();
    assert!(outlasts(old.client.cert.as_bytes(), 90 * day));
    // One issued for 90 days, back-dated an hour: due two thirds in, not at once.
    let now = ca.issue_node_lasting("n1", &sans, Some(90 * day)).unwrap();
    assert!(!outlasts(now.client.cert.as_bytes(), 90 * day));
    assert!(
        outlasts(now.client.cert.as_bytes(), 30 * day),
        "--cert-lifetime shortened"
    );
    // Short lives, back-dated a quarter: still within their terms.
    let short = Duration::from_secs(120);
    let brief = ca.issue_node_lasting("n1", &sans, Some(short)).unwrap();
    assert!(!outlasts(brief.client.cert.as_bytes(), short));
    assert!(
        !outlasts(b"not a certificate", short),
        "unreadable: the two-thirds rule decides"
    );
}

#[test]
fn a_certificate_handed_in_counts_only_if_the_ca_signed_it_for_that_node() {
    let ca = ClusterCa::generate().unwrap();
    let other = ClusterCa::generate().unwrap();
    let sans = vec!["127.0.0.1".to_string()];
    let mine = ca.issue_node("w1", &sans).unwrap();
    for c in [&mine.server, &mine.peer, &mine.client] {
        assert_eq!(
            serial_if_issued_to(c.cert.as_bytes(), ca.cert.as_bytes(), "w1"),
            serial_of(c.cert.as_bytes())
        );
        assert!(serial_if_issued_to(c.cert.as_bytes(), ca.cert.as_bytes(), "w2").is_none());
        assert!(serial_if_issued_to(c.cert.as_bytes(), other.cert.as_bytes(), "w1").is_none());
    }
    // Another CA's certificate under the same name is not the cluster's.
    let forged = other.issue_node("w1", &sans).unwrap();
    assert!(serial_if_issued_to(forged.client.cert.as_bytes(), ca.cert.as_bytes(), "w1").is_none());
    assert!(serial_if_issued_to(b"junk", ca.cert.as_bytes(), "w1").is_none());
}
