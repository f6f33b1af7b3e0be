//! The version gate: before the member starts (or restarts) on a binary, its version against the cluster's.
//! etcd's own rules: never below the cluster version, one minor at a time, and 3.6 only once every member
//! runs a 3.5 patch that 3.6 accepts. A refusal leaves the member as it is; a warning lets it start.

use super::version::EtcdVersion;

/// The lowest 3.5 patch etcd 3.6 accepts beside it (upstream's 3.5 → 3.6 guide).
pub const MIN_35_FOR_36: EtcdVersion = EtcdVersion::new(3, 5, 26);
/// The newest minor line still supported upstream; older lines get a warning.
pub const OLDEST_SUPPORTED: (u32, u32) = (3, 5);

/// What the gate knows about the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// etcd's cluster version (`/version`'s `etcdcluster`), when a member answered.
    pub cluster: Option<EtcdVersion>,
    /// The other members' server versions (name, version), as far as they answered.
    pub members: Vec<(String, EtcdVersion)>,
}

/// Why a start is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The binary's minor line is below the cluster version.
    Downgrade {
        binary: EtcdVersion,
        cluster: EtcdVersion,
    },
    /// The binary is more than one minor past the cluster version.
    SkipsMinor {
        binary: EtcdVersion,
        cluster: EtcdVersion,
    },
    /// 3.6 or later while a member runs a 3.5 below [`MIN_35_FOR_36`].
    MemberTooOld {
        binary: EtcdVersion,
        member: String,
        version: EtcdVersion,
    },
}

impl Refusal {
    /// The cluster-side version the refusal names.
    pub fn other_version(&self) -> String {
        match self {
            Refusal::Downgrade { cluster, .. } | Refusal::SkipsMinor { cluster, .. } => {
                cluster.minor_text()
            }
            Refusal::MemberTooOld { version, .. } => version.to_string(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Downgrade { binary, cluster } => write!(
                f,
                "etcd {binary} is below the cluster version {}: etcd cannot run a member below the cluster \
                 version (a rollback is a restore from a snapshot); give --etcd-binary an etcd {} or later",
                cluster.minor_text(),
                cluster.minor_text()
            ),
            Refusal::SkipsMinor { binary, cluster } => write!(
                f,
                "etcd {binary} skips a minor version: the cluster version is {}, and etcd upgrades one minor at \
                 a time; run an etcd {}.{} first",
                cluster.minor_text(),
                cluster.major,
                cluster.minor + 1
            ),
            Refusal::MemberTooOld {
                binary,
                member,
                version,
            } => write!(
                f,
                "etcd {binary} needs every member on etcd {MIN_35_FOR_36} or later first: member {member} runs \
                 etcd {version}"
            ),
        }
    }
}

/// A start that goes ahead but deserves the operator's attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// etcd 3.5.0–3.5.2: the published data-inconsistency advisory.
    DataInconsistencyAdvisory { binary: EtcdVersion },
    /// A minor line upstream no longer supports.
    PastSupport { binary: EtcdVersion },
}

impl Warning {
    /// A short label for the metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::DataInconsistencyAdvisory { .. } => "data-inconsistency-advisory",
            Warning::PastSupport { .. } => "past-upstream-support",
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::DataInconsistencyAdvisory { binary } => write!(
                f,
                "etcd {binary} is under etcd's data-inconsistency advisory for 3.5.0-3.5.2 (a member may \
                 apply writes inconsistently after a crash): upgrade to 3.5.3 or later"
            ),
            Warning::PastSupport { binary } => write!(
                f,
                "etcd {binary} is past the end of upstream support (etcd {} and later are supported): \
                 plan an upgrade",
                OLDEST_SUPPORTED.0.to_string() + "." + &OLDEST_SUPPORTED.1.to_string()
            ),
        }
    }
}

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Start { warnings: Vec<Warning> },
    Refuse(Refusal),
}

/// Decides whether a member may start on `binary` in the cluster seen as `view`. Without a cluster version
/// the lowest member version stands in for it (the cluster version is the lowest member's minor).
pub fn decide(binary: EtcdVersion, view: &ClusterView) -> Verdict {
    let cluster = view.cluster.or_else(|| {
        view.members
            .iter()
            .map(|(_, v)| EtcdVersion::new(v.major, v.minor, 0))
            .min()
    });
    if let Some(cluster) = cluster {
        if binary.minor_line() < cluster.minor_line() {
            return Verdict::Refuse(Refusal::Downgrade { binary, cluster });
        }
        let next = (cluster.major, cluster.minor + 1);
        if binary.minor_line() > next {
            return Verdict::Refuse(Refusal::SkipsMinor { binary, cluster });
        }
    }
    if binary.minor_line() >= (3, 6) {
        if let Some((member, version)) = view
            .members
            .iter()
            .filter(|(_, v)| v.minor_line() == (3, 5) && *v < MIN_35_FOR_36)
            .min_by_key(|(_, v)| *v)
        {
            return Verdict::Refuse(Refusal::MemberTooOld {
                binary,
                member: member.clone(),
                version: *version,
            });
        }
    }
    Verdict::Start {
        warnings: warnings(binary),
    }
}

/// What deserves the operator's attention about a release that may run.
pub fn warnings(binary: EtcdVersion) -> Vec<Warning> {
    let mut warnings = Vec::new();
    if binary.minor_line() == (3, 5) && binary.patch <= 2 {
        warnings.push(Warning::DataInconsistencyAdvisory { binary });
    }
    if binary.minor_line() < OLDEST_SUPPORTED {
        warnings.push(Warning::PastSupport { binary });
    }
    warnings
}

/// What one member's `/version` says.
#[derive(Debug, Clone, serde::Deserialize)]
struct VersionDoc {
    etcdserver: String,
    etcdcluster: String,
    /// 3.6 on: the version of the member's data on disk.
    #[serde(default)]
    storage: Option<String>,
}

/// One member's `/version`: its server version, the cluster version it reports and, from etcd 3.6 on,
/// its storage version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberVersions {
    pub server: Option<EtcdVersion>,
    pub cluster: Option<EtcdVersion>,
    pub storage: Option<String>,
}

/// How long one member's `/version` may take.
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// An HTTP client for the members' client URLs: the member's client certificate under TLS.
fn version_client(tls: Option<&hostlet_runtime::TlsFiles>) -> Option<reqwest::Client> {
    let mut b = reqwest::Client::builder().timeout(ASK_TIMEOUT).no_proxy();
    if let Some(t) = tls {
        let ca = std::fs::read(&t.ca).ok()?;
        let mut pem = std::fs::read(&t.cert).ok()?;
        pem.push(b'\n');
        pem.extend(std::fs::read(&t.key).ok()?);
        b = b
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).ok()?)
            .identity(reqwest::Identity::from_pem(&pem).ok()?);
    }
    b.build().ok()
}

/// Asks each of `client_urls` for `/version`, in order; `None` for a member that does not answer.
pub async fn member_versions(
    client_urls: &[String],
    tls: Option<&hostlet_runtime::TlsFiles>,
) -> Vec<Option<MemberVersions>> {
    let Some(client) = version_client(tls) else {
        return vec![None; client_urls.len()];
    };
    let asks = client_urls.iter().map(|url| {
        let client = client.clone();
        async move {
            let doc: VersionDoc = client
                .get(format!("{}/version", url.trim_end_matches('/')))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            Some(MemberVersions {
                server: EtcdVersion::parse(&doc.etcdserver),
                cluster: EtcdVersion::parse(&doc.etcdcluster),
                storage: doc.storage.filter(|s| !s.is_empty()),
            })
        }
    });
    futures::future::join_all(asks).await
}

/// Asks each of `client_urls` for `/version`: the members' server versions (named by URL) and the highest
/// cluster version any of them reports. Members that do not answer are left out.
pub async fn ask_versions(
    client_urls: &[String],
    tls: Option<&hostlet_runtime::TlsFiles>,
) -> ClusterView {
    let mut view = ClusterView::default();
    for (url, answer) in client_urls
        .iter()
        .zip(member_versions(client_urls, tls).await)
    {
        let Some(v) = answer else { continue };
        if let Some(server) = v.server {
            view.members.push((url.clone(), server));
        }
        if let Some(cluster) = v.cluster {
            view.cluster = Some(view.cluster.map_or(cluster, |c| c.max(cluster)));
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> EtcdVersion {
        EtcdVersion::parse(s).unwrap()
    }

    fn view(cluster: Option<&str>, members: &[(&str, &str)]) -> ClusterView {
        ClusterView {
            cluster: cluster.map(v),
            members: members.iter().map(|(n, m)| (n.to_string(), v(m))).collect(),
        }
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        Start(&'static [&'static str]),
        Downgrade,
        Skips,
        TooOld(&'static str),
    }

    #[test]
    fn the_gate_follows_etcds_upgrade_rules() {
        use Want::*;
        // (binary, cluster version, other members, verdict)
        type Row = (
            &'static str,
            Option<&'static str>,
            &'static [(&'static str, &'static str)],
            Want,
        );
        let table: &[Row] = &[
            // Same line, patch changes either way: fine.
            (
                "3.4.23",
                Some("3.4"),
                &[("a", "3.4.23")],
                Start(&["past-upstream-support"]),
            ),
            ("3.5.21", Some("3.5"), &[("a", "3.5.25")], Start(&[])),
            ("3.5.21", Some("3.5"), &[("a", "3.5.10")], Start(&[])),
            // One minor up, in a cluster still at the lower one: the roll.
            (
                "3.5.1",
                Some("3.4"),
                &[("a", "3.4.23")],
                Start(&["data-inconsistency-advisory"]),
            ),
            ("3.5.3", Some("3.4"), &[], Start(&[])),
            ("3.5.2", None, &[], Start(&["data-inconsistency-advisory"])),
            // Below the cluster version.
            ("3.4.23", Some("3.5"), &[("a", "3.5.1")], Downgrade),
            ("3.4.32", Some("3.5.0"), &[], Downgrade),
            ("3.5.30", Some("3.6"), &[], Downgrade),
            // No cluster version known: the lowest member's minor stands in.
            ("3.4.23", None, &[("a", "3.5.1"), ("b", "3.5.4")], Downgrade),
            ("3.7.0", None, &[("a", "3.5.30")], Skips),
            // Two minors up.
            ("3.7.0", Some("3.5"), &[], Skips),
            ("3.6.0", Some("3.4"), &[("a", "3.4.23")], Skips),
            ("4.0.0", Some("3.5"), &[], Skips),
            // 3.6 beside a 3.5 below the patch 3.6 needs.
            (
                "3.6.4",
                Some("3.5"),
                &[("a", "3.5.26"), ("b", "3.5.21")],
                TooOld("b"),
            ),
            (
                "3.6.0",
                Some("3.5"),
                &[("a", "3.5.26"), ("b", "3.6.0")],
                Start(&[]),
            ),
            ("3.6.0", Some("3.6"), &[("a", "3.6.1")], Start(&[])),
            // Nothing known: only the binary's own warnings.
            ("3.4.23", None, &[], Start(&["past-upstream-support"])),
        ];
        for (binary, cluster, members, want) in table {
            let got = match decide(v(binary), &view(*cluster, members)) {
                Verdict::Start { warnings } => {
                    let kinds: Vec<&str> = warnings.iter().map(|w| w.kind()).collect();
                    assert_eq!(
                        Start(Box::leak(kinds.into_boxed_slice())),
                        *want,
                        "{binary} in {cluster:?} {members:?}"
                    );
                    continue;
                }
                Verdict::Refuse(Refusal::Downgrade { .. }) => Downgrade,
                Verdict::Refuse(Refusal::SkipsMinor { .. }) => Skips,
                Verdict::Refuse(Refusal::MemberTooOld { member, .. }) => {
                    TooOld(Box::leak(member.into_boxed_str()))
                }
            };
            assert_eq!(got, *want, "{binary} in {cluster:?} {members:?}");
        }
    }

    #[test]
    fn refusals_and_warnings_name_both_versions() {
        let Verdict::Refuse(r) = decide(v("3.4.23"), &view(Some("3.5"), &[])) else {
            panic!("not refused");
        };
        let text = r.to_string();
        assert!(text.contains("3.4.23") && text.contains("3.5"), "{text}");
        assert_eq!(r.other_version(), "3.5");
        let Verdict::Refuse(r) = decide(v("3.7.0"), &view(Some("3.5"), &[])) else {
            panic!("not refused");
        };
        let text = r.to_string();
        assert!(
            text.contains("3.7.0") && text.contains("skips a minor"),
            "{text}"
        );
        let Verdict::Refuse(r) = decide(v("3.6.0"), &view(Some("3.5"), &[("n-1", "3.5.1")])) else {
            panic!("not refused");
        };
        let text = r.to_string();
        assert!(
            text.contains("n-1") && text.contains("3.5.1") && text.contains("3.5.26"),
            "{text}"
        );
        let Verdict::Start { warnings } = decide(v("3.5.1"), &ClusterView::default()) else {
            panic!("refused");
        };
        let text = warnings[0].to_string();
        assert!(
            text.contains("3.5.1") && text.contains("advisory"),
            "{text}"
        );
    }
}
