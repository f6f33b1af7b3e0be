//! A pod's name resolution, as a v1 Pod asks for it: `dnsPolicy`, `dnsConfig` and `hostAliases`.
//!
//! hostlet has no cluster DNS, so `ClusterFirst` (Kubernetes' default) and `ClusterFirstWithHostNet` resolve
//! as `Default` does: with the host's resolver configuration. `None` takes everything from `dnsConfig`.
//! `dnsConfig` under any other policy adds its nameservers, searches and options to the host's, as the
//! kubelet merges them. `hostAliases` become lines of the pod's `/etc/hosts`.

use std::net::IpAddr;

use crate::field::FieldError;
use crate::manifest::{DnsOption, DnsPolicy, PodDnsConfig, PodManifest};

/// Kubernetes' limits on a pod's resolver configuration.
pub const MAX_NAMESERVERS: usize = 3;
pub const MAX_SEARCHES: usize = 32;
pub const MAX_SEARCH_CHARS: usize = 2048;

/// What the pod's resolver configuration is made of, in the container engine's terms (`--dns`,
/// `--dns-search`, `--dns-option`). `None`: the engine's default (the host's configuration).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolver {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// The host's resolver configuration, read from a `resolv.conf`.
pub fn parse_resolv_conf(text: &str) -> Resolver {
    let mut r = Resolver::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => r.nameservers.extend(words.next().map(str::to_string)),
            // The last search (or domain) line wins, as the resolver reads them.
            Some("search") | Some("domain") => r.searches = words.map(str::to_string).collect(),
            Some("options") => r.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    r
}

fn option_text(o: &DnsOption) -> String {
    match &o.value {
        Some(v) => format!("{}:{v}", o.name),
        None => o.name.clone(),
    }
}

/// The pod's resolver configuration given the host's, `None` when the engine's default is what the pod
/// asks for (no `dnsConfig`, a policy other than `None`).
pub fn resolver(m: &PodManifest, host: &Resolver) -> Option<Resolver> {
    let policy = m.dns_policy.unwrap_or(DnsPolicy::ClusterFirst);
    let config = m.dns_config.clone().unwrap_or_default();
    if policy != DnsPolicy::None && config == PodDnsConfig::default() {
        return None;
    }
    let mut r = if policy == DnsPolicy::None {
        Resolver::default()
    } else {
        host.clone()
    };
    for ns in config.nameservers {
        if !r.nameservers.contains(&ns) {
            r.nameservers.push(ns);
        }
    }
    for s in config.searches {
        if !r.searches.contains(&s) {
            r.searches.push(s);
        }
    }
    // An option the pod sets replaces the host's of the same name.
    for o in &config.options {
        let name = o.name.as_str();
        r.options
            .retain(|x| x.split(':').next().is_some_and(|n| n != name));
        r.options.push(option_text(o));
    }
    // The resolver reads at most three nameservers.
    r.nameservers.truncate(MAX_NAMESERVERS);
    Some(r)
}

/// `/etc/hosts` lines the engine adds (`HOST:IP`, as Docker's `--add-host` takes them).
pub fn extra_hosts(m: &PodManifest) -> Vec<String> {
    m.host_aliases
        .iter()
        .flat_map(|a| a.hostnames.iter().map(move |h| format!("{h}:{}", a.ip)))
        .collect()
}

/// The model's checks of these fields (in the 2014 form's terms; the v1 form maps the paths). A manifest in
/// the 2014 form may carry them too, so that a v1 Pod written back in that form stays valid.
pub(crate) fn validate_fields(m: &PodManifest) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut push = |path: String, message: String| errs.push(FieldError { path, message });
    if m.dns_policy == Some(DnsPolicy::None) && m.dns_config.is_none() {
        push("dnsConfig".into(), "required when dnsPolicy is None".into());
    }
    if let Some(c) = &m.dns_config {
        if m.dns_policy == Some(DnsPolicy::None) && c.nameservers.is_empty() {
            push(
                "dnsConfig.nameservers".into(),
                "at least one nameserver when dnsPolicy is None".into(),
            );
        }
        if c.nameservers.len() > MAX_NAMESERVERS {
            push(
                "dnsConfig.nameservers".into(),
                format!("at most {MAX_NAMESERVERS}"),
            );
        }
        for (i, ns) in c.nameservers.iter().enumerate() {
            if ns.parse::<IpAddr>().is_err() {
                push(
                    format!("dnsConfig.nameservers[{i}]"),
                    format!("{ns:?} is not an IP address"),
                );
            }
        }
        if c.searches.len() > MAX_SEARCHES {
            push(
                "dnsConfig.searches".into(),
                format!("at most {MAX_SEARCHES}"),
            );
        }
        if c.searches.iter().map(|s| s.len() + 1).sum::<usize>() > MAX_SEARCH_CHARS {
            push(
                "dnsConfig.searches".into(),
                format!("at most {MAX_SEARCH_CHARS} characters in all"),
            );
        }
        for (i, s) in c.searches.iter().enumerate() {
            if !crate::field::is_dns_subdomain(s.trim_end_matches('.')) {
                push(
                    format!("dnsConfig.searches[{i}]"),
                    format!("{s:?} is not a DNS subdomain"),
                );
            }
        }
        for (i, o) in c.options.iter().enumerate() {
            if o.name.is_empty() || o.name.contains([':', ' ']) {
                push(
                    format!("dnsConfig.options[{i}].name"),
                    "required, without ':' or spaces".into(),
                );
            }
            if o.value.as_deref().is_some_and(|v| v.contains(' ')) {
                push(
                    format!("dnsConfig.options[{i}].value"),
                    "without spaces".into(),
                );
            }
        }
    }
    for (i, a) in m.host_aliases.iter().enumerate() {
        if a.ip.parse::<IpAddr>().is_err() {
            push(
                format!("hostAliases[{i}].ip"),
                format!("{:?} is not an IP address", a.ip),
            );
        }
        if a.hostnames.is_empty() {
            push(format!("hostAliases[{i}].hostnames"), "required".into());
        }
        for (j, h) in a.hostnames.iter().enumerate() {
            if !crate::field::is_dns_subdomain(h) {
                push(
                    format!("hostAliases[{i}].hostnames[{j}]"),
                    format!("{h:?} is not a DNS subdomain"),
                );
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_manifest;

    fn pod(spec: &str) -> PodManifest {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: c, image: busybox}}]\n{spec}"
        );
        parse_manifest(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn host() -> Resolver {
        parse_resolv_conf(
            "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch example.com\noptions ndots:1 edns0\n",
        )
    }

    #[test]
    fn the_host_configuration_is_read() {
        let h = host();
        assert_eq!(h.nameservers, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(h.searches, ["example.com"]);
        assert_eq!(h.options, ["ndots:1", "edns0"]);
    }

    #[test]
    fn policies_resolve_as_documented() {
        // Unset, ClusterFirst and Default without dnsConfig: the engine's default (the host's).
        for spec in [
            "",
            "  dnsPolicy: ClusterFirst\n",
            "  dnsPolicy: Default\n",
            "  dnsPolicy: ClusterFirstWithHostNet\n",
        ] {
            let p = pod(spec);
            assert!(crate::validate(&p).is_empty(), "{spec}");
            assert_eq!(resolver(&p, &host()), None, "{spec}");
        }
        // None: only what dnsConfig says (the example of Kubernetes' documentation).
        let p = pod("  dnsPolicy: \"None\"\n  dnsConfig:\n    nameservers: [192.0.2.1]\n    searches: [ns1.svc.cluster-domain.example, my.dns.search.suffix]\n    options:\n    - name: ndots\n      value: \"2\"\n    - name: edns0\n");
        assert!(crate::validate(&p).is_empty());
        assert_eq!(
            resolver(&p, &host()),
            Some(Resolver {
                nameservers: vec!["192.0.2.1".into()],
                searches: vec![
                    "ns1.svc.cluster-domain.example".into(),
                    "my.dns.search.suffix".into()
                ],
                options: vec!["ndots:2".into(), "edns0".into()],
            })
        );
        // Default with dnsConfig: merged with the host's; the pod's option replaces the host's.
        let p = pod("  dnsPolicy: Default\n  dnsConfig:\n    nameservers: [192.0.2.1, 10.0.0.2]\n    options: [{name: ndots, value: \"5\"}]\n");
        let r = resolver(&p, &host()).unwrap();
        assert_eq!(r.nameservers, ["10.0.0.2", "10.0.0.3", "192.0.2.1"]);
        assert_eq!(r.searches, ["example.com"]);
        assert_eq!(r.options, ["edns0", "ndots:5"]);
    }

    #[test]
    fn bad_values_are_refused_by_path() {
        let errs = |spec: &str| -> Vec<String> {
            crate::validate(&pod(spec))
                .into_iter()
                .map(|e| e.to_string())
                .collect()
        };
        let e = errs("  dnsPolicy: \"None\"\n");
        assert!(
            e.iter().any(|e| e.starts_with("spec.dnsConfig: required")),
            "{e:?}"
        );
        let e = errs("  dnsConfig:\n    nameservers: [a, 1.1.1.1, 2.2.2.2, 3.3.3.3]\n");
        assert!(
            e.iter()
                .any(|e| e.starts_with("spec.dnsConfig.nameservers: at most 3")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|e| e.starts_with("spec.dnsConfig.nameservers[0]")),
            "{e:?}"
        );
        let e = errs("  hostAliases:\n  - ip: nope\n    hostnames: [Foo_Bar]\n");
        assert!(
            e.iter().any(|e| e.starts_with("spec.hostAliases[0].ip")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|e| e.starts_with("spec.hostAliases[0].hostnames[0]")),
            "{e:?}"
        );
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  dnsPolicy: Sometimes\n  containers: [{name: c, image: busybox}]\n";
        assert!(parse_manifest(text.as_bytes()).is_err());
    }

    #[test]
    fn host_aliases_become_hosts_lines() {
        let p = pod("  hostAliases:\n  - ip: \"127.0.0.1\"\n    hostnames: [foo.local, bar.local]\n  - ip: \"10.1.2.3\"\n    hostnames: [foo.remote]\n");
        assert!(crate::validate(&p).is_empty());
        assert_eq!(
            extra_hosts(&p),
            [
                "foo.local:127.0.0.1",
                "bar.local:127.0.0.1",
                "foo.remote:10.1.2.3"
            ]
        );
    }
}
