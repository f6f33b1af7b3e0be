//! docs/reference.md against the code, both ways: every command and flag (with its environment variable,
//! config key and default), every kind of etcd key, every Docker label, every event reason (and every
//! reason recorded in the sources) and every exit code. The metrics are compared with a running agent in
//! tests/docs_reference.rs. A failure names the item and the side it is missing from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::{ArgAction, CommandFactory};

use crate::cli::exit::Exit;
use crate::source_scan::{is_test_only, rust_files};
use crate::Cli;

const DOC: &str = "docs/reference.md";

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn doc() -> String {
    let path = root().join(DOC);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the first table after the heading `heading` (any level), header and rule left out; cells
/// trimmed, backticks dropped.
pub fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = doc
        .lines()
        .skip_while(|l| !(l.starts_with('#') && l.trim_start_matches('#').trim() == heading));
    assert!(
        lines.next().is_some(),
        "{DOC}: no heading {heading:?} (the reference test reads its table)"
    );
    let rows: Vec<Vec<String>> = lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('`', ""))
                .collect()
        })
        .collect();
    assert!(
        rows.len() >= 2,
        "{DOC}: no table (header and rule) under {heading:?}"
    );
    rows.into_iter().skip(2).collect()
}

/// Compares rows keyed by their first `key` cells; the `checked` cells after the key must match. Returns
/// one line per difference, saying on which side the item is missing.
pub fn compare(
    what: &str,
    columns: &[&str],
    key: usize,
    code: &[Vec<String>],
    doc: &[Vec<String>],
) -> Vec<String> {
    let keyed = |rows: &[Vec<String>], side: &str, out: &mut Vec<String>| {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in rows {
            let k = r.iter().take(key).cloned().collect::<Vec<_>>().join(" ");
            if map.insert(k.clone(), r.clone()).is_some() {
                out.push(format!("{what}: {k} appears twice in the {side}"));
            }
        }
        map
    };
    let mut out = Vec::new();
    let code = keyed(code, "code", &mut out);
    let doc = keyed(doc, DOC, &mut out);
    for (k, row) in &code {
        match doc.get(k) {
            None => out.push(format!(
                "{what}: {k} is in the code but missing from {DOC}; add the row | {} |",
                row.join(" | ")
            )),
            Some(d) => {
                for (i, c) in row.iter().enumerate().skip(key) {
                    let there = d.get(i).map(String::as_str).unwrap_or("");
                    if there != c {
                        out.push(format!(
                            "{what}: {k}: column {:?} says {there:?} in {DOC}, the code says {c:?}",
                            columns.get(i).copied().unwrap_or("?")
                        ));
                    }
                }
            }
        }
    }
    for k in doc.keys().filter(|k| !code.contains_key(*k)) {
        out.push(format!(
            "{what}: {k} is in {DOC} but the code has no such item; remove or fix the row"
        ));
    }
    out
}

fn assert_none(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// Leaf commands (those that run something), as `hostlet pod ls`, with their `clap::Command`.
fn leaves(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
    let subs: Vec<_> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if subs.is_empty() {
        out.push((path.clone(), cmd.clone()));
    }
    for s in subs {
        leaves(s, format!("{path} {}", s.get_name()), out);
    }
}

/// The flag as the doc writes it: `-o, --output` or `--node`.
fn flag_name(a: &clap::Arg) -> Option<String> {
    let long = a.get_long()?;
    if long == "help" || long == "version" {
        return None;
    }
    Some(match a.get_short() {
        Some(s) => format!("-{s}, --{long}"),
        None => format!("--{long}"),
    })
}

fn env_of(a: &clap::Arg) -> String {
    a.get_env()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "-".into())
}

fn default_of(a: &clap::Arg) -> String {
    let d: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if matches!(a.get_action(), ArgAction::SetTrue) || d.is_empty() {
        "-".into()
    } else {
        d.join(",")
    }
}

#[test]
fn commands_and_flags_match_the_reference() {
    let doc = doc();
    let mut all = Vec::new();
    leaves(&Cli::command(), "hostlet".into(), &mut all);
    assert!(all.len() > 15, "{}", all.len());

    let mut commands = Vec::new();
    let mut own = Vec::new();
    let mut run = Vec::new();
    let mut cluster: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, cmd) in &all {
        let takes_cluster = cmd.get_arguments().any(|a| a.is_global_set());
        commands.push(vec![
            path.clone(),
            if takes_cluster { "yes" } else { "no" }.to_string(),
        ]);
        for a in cmd.get_arguments() {
            let Some(flag) = flag_name(a) else { continue };
            if a.is_global_set() {
                cluster.insert(flag.clone(), vec![flag, env_of(a), default_of(a)]);
            } else if path == "hostlet run" {
                // The config file takes every flag of `run` by its long name, but these two.
                let long = a.get_long().unwrap_or_default();
                let config_key = match long {
                    "config" | "print-config" => "-".to_string(),
                    l => l.to_string(),
                };
                run.push(vec![flag, env_of(a), config_key, default_of(a)]);
            } else {
                own.push(vec![path.clone(), flag, env_of(a), default_of(a)]);
            }
        }
    }
    let cluster: Vec<Vec<String>> = cluster.into_values().collect();
    let mut problems = compare(
        "Commands",
        &["command", "cluster flags"],
        1,
        &commands,
        &table(&doc, "Commands"),
    );
    problems.extend(compare(
        "Flags of hostlet run",
        &["flag", "environment", "config key", "default"],
        1,
        &run,
        &table(&doc, "Flags of hostlet run"),
    ));
    problems.extend(compare(
        "Cluster flags",
        &["flag", "environment", "default"],
        1,
        &cluster,
        &table(&doc, "Cluster flags"),
    ));
    problems.extend(compare(
        "Command flags",
        &["command", "flag", "environment", "default"],
        2,
        &own,
        &table(&doc, "Command flags"),
    ));
    assert_none(problems);
}

#[test]
fn etcd_keys_match_the_reference() {
    let code: Vec<Vec<String>> = hostlet_api::KeyLayout::default()
        .patterns()
        .into_iter()
        .map(|p| vec![p])
        .collect();
    assert_none(compare(
        "etcd keys",
        &["key"],
        1,
        &code,
        &table(&doc(), "etcd keys"),
    ));
}

#[test]
fn who_may_do_what_matches_authorize() {
    let code: Vec<Vec<String>> =
        hostlet_api::authz::who_may_do_what(&hostlet_api::KeyLayout::default())
            .into_iter()
            .map(Vec::from)
            .collect();
    assert_none(compare(
        "who may do what",
        &[
            "key",
            "a voter or an admin",
            "the node the key names",
            "any other node",
        ],
        1,
        &code,
        &table(&doc(), "Who may do what"),
    ));
}

#[test]
fn docker_labels_match_the_reference() {
    let code: Vec<Vec<String>> = hostlet_api::naming::LABELS
        .iter()
        .map(|l| vec![l.to_string()])
        .collect();
    assert_none(compare(
        "Docker labels",
        &["label"],
        1,
        &code,
        &table(&doc(), "Docker labels"),
    ));
}

#[test]
fn exit_codes_match_the_reference() {
    let code: Vec<Vec<String>> = Exit::ALL
        .iter()
        .map(|e| vec![(*e as u8).to_string()])
        .collect();
    assert_none(compare(
        "Exit codes",
        &["code"],
        1,
        &code,
        &table(&doc(), "Exit codes"),
    ));
}

#[test]
fn event_reasons_match_the_reference() {
    use hostlet_controllers::events::REASONS;
    let mut kinds: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (reason, kind) in REASONS {
        kinds.entry(reason).or_default().push(kind.as_str());
    }
    let code: Vec<Vec<String>> = kinds
        .into_iter()
        .map(|(r, mut k)| {
            k.sort();
            vec![r.to_string(), k.join(", ")]
        })
        .collect();
    assert_none(compare(
        "Events",
        &["reason", "type"],
        1,
        &code,
        &table(&doc(), "Events"),
    ));
}

/// Methods that record an event; a CamelCase string literal among their arguments is a reason.
const RECORDING: [&str; 7] = [
    "event",
    "node_event",
    "node_event_at",
    "record",
    "record_now",
    "emit",
    "emit_at",
];

/// Reasons written at recording calls: (file, reason, the type when the call names it).
#[derive(Default)]
struct Recorded {
    file: String,
    found: Vec<(String, String, Option<&'static str>)>,
}

impl Recorded {
    fn call<'a>(&mut self, args: impl Iterator<Item = &'a syn::Expr>) {
        let mut reason = None;
        let mut kind = None;
        for a in args {
            match a {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => {
                    let v = s.value();
                    let camel = v.len() > 2
                        && v.starts_with(|c: char| c.is_ascii_uppercase())
                        && v.chars().all(|c| c.is_ascii_alphanumeric());
                    if camel && reason.is_none() {
                        reason = Some(v);
                    }
                }
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Bool(b),
                    ..
                }) => kind = Some(if b.value { "Warning" } else { "Normal" }),
                syn::Expr::Path(p) => {
                    let segs: Vec<String> = p
                        .path
                        .segments
                        .iter()
                        .map(|s| s.ident.to_string())
                        .collect();
                    if let [.., ty, v] = segs.as_slice() {
                        if ty == "EventKind" {
                            kind = match v.as_str() {
                                "Normal" => Some("Normal"),
                                "Warning" => Some("Warning"),
                                _ => None,
                            };
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = reason {
            self.found.push((self.file.clone(), r, kind));
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for Recorded {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        if RECORDING.contains(&c.method.to_string().as_str()) {
            self.call(c.args.iter());
        }
        syn::visit::visit_expr_method_call(self, c);
    }

    // Free helpers named like the recorder's methods (`node_event(&recorder, "Reason", ..)`) record too.
    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func {
            if p.path
                .segments
                .last()
                .is_some_and(|s| RECORDING.contains(&s.ident.to_string().as_str()))
            {
                self.call(c.args.iter());
            }
        }
        syn::visit::visit_expr_call(self, c);
    }
}

fn scan(rec: &mut Recorded, file: &str, text: &str) {
    let parsed = syn::parse_file(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    rec.file = file.to_string();
    syn::visit::Visit::visit_file(rec, &parsed);
}

#[test]
fn the_scan_finds_reasons_at_recording_calls_outside_tests() {
    let mut rec = Recorded::default();
    scan(
        &mut rec,
        "x.rs",
        r#"
        fn f() {
            ev.node_event(EventKind::Warning, "BrandNew", format!("{x}"));
            self.status.event(pod, None, "PodThing", &m, false);
            tracing::info!("NotAnEvent");
            leading.record(m.id);
            node_event(&recorder, "FreeHelper", m);
        }
        #[cfg(test)]
        mod tests { fn g() { ev.node_event(EventKind::Normal, "InATest", "m"); } }
        "#,
    );
    let found: Vec<(&str, Option<&str>)> =
        rec.found.iter().map(|(_, r, k)| (r.as_str(), *k)).collect();
    assert_eq!(
        found,
        [
            ("BrandNew", Some("Warning")),
            ("PodThing", Some("Normal")),
            ("FreeHelper", None)
        ]
    );
}

#[test]
fn every_reason_recorded_in_the_sources_is_listed() {
    use hostlet_controllers::events::REASONS;
    let mut files = Vec::new();
    for dir in ["src", "api/src", "runtime/src", "controllers/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut rec = Recorded::default();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let shown = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        scan(&mut rec, &shown, &text);
    }
    assert!(
        rec.found.len() >= REASONS.len(),
        "only {} recording calls found: is the scan still looking at the right calls?",
        rec.found.len()
    );
    let listed: BTreeSet<(&str, &str)> = REASONS.iter().map(|(r, k)| (*r, k.as_str())).collect();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (file, reason, kind) in &rec.found {
        used.insert(reason.as_str());
        let ok = match kind {
            Some(k) => listed.contains(&(reason.as_str(), *k)),
            None => listed.iter().any(|(r, _)| r == reason),
        };
        if !ok {
            problems.push(format!(
                "{file} records reason {reason:?} ({}) that is not in hostlet_controllers::events::REASONS; add it there and to {DOC}",
                kind.unwrap_or("type not named at the call")
            ));
        }
    }
    for (r, _) in REASONS {
        if !used.contains(r) {
            problems.push(format!(
                "REASONS lists {r:?} but no recording call in the sources uses it; remove it there and from {DOC}"
            ));
        }
    }
    assert_none(problems);
}
