//! The metrics table of docs/reference.md against a running agent's `/metrics`, both ways: every family
//! the agent exports is documented with its type and label names, and every documented metric is exported.
//! Every family has its series from the agent's start (labels created at zero), so a fresh agent shows
//! them all; a family that only appeared after some activity would show up here as "documented but not
//! exported". The other tables are checked in `src/reference.rs`.

mod member_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use member_support::Node;

const DOC: &str = "docs/reference.md";

/// The rows of the first table after the heading `heading`, header and rule left out, backticks dropped.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = doc
        .lines()
        .skip_while(|l| !(l.starts_with('#') && l.trim_start_matches('#').trim() == heading));
    assert!(lines.next().is_some(), "{DOC}: no heading {heading:?}");
    lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('`', ""))
                .collect()
        })
        .collect()
}

/// Family → (type, label names) from the text format. Histogram samples (`_bucket`, `_sum`, `_count`)
/// count for their family; `le` is the histogram's own label.
fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE <name> <type>");
            out.insert(name.to_string(), (kind.to_string(), BTreeSet::new()));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (sample, names) = member_support::sample_names(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| sample.strip_suffix(s))
            .find(|f| out.get(*f).is_some_and(|(k, _)| k == "histogram"))
            .unwrap_or(sample)
            .to_string();
        let Some((_, labels)) = out.get_mut(&family) else {
            panic!("sample {sample} has no # TYPE line");
        };
        labels.extend(names.into_iter().filter(|k| k != "le"));
    }
    out
}

#[test]
fn the_text_format_is_read_into_families_types_and_labels() {
    let text = "# HELP a x\n# TYPE a counter\na{op=\"get\",result=\"ok\"} 1\n# TYPE h histogram\nh_bucket{le=\"1\",op=\"x\"} 0\nh_sum{op=\"x\"} 0\nh_count{op=\"x\"} 0\n# TYPE g gauge\ng 0\n";
    let f = families(text);
    assert_eq!(
        f["a"],
        (
            "counter".into(),
            BTreeSet::from(["op".into(), "result".into()])
        )
    );
    assert_eq!(f["h"], ("histogram".into(), BTreeSet::from(["op".into()])));
    assert_eq!(f["g"], ("gauge".into(), BTreeSet::new()));
    assert_eq!(f.len(), 3);
}

#[test]
fn every_metric_a_running_agent_exports_is_in_the_reference_and_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join(DOC)).expect("docs/reference.md");
    let documented: BTreeMap<String, (String, String)> = table(&doc, "Metrics")
        .into_iter()
        .map(|r| {
            let cell = |i: usize| r.get(i).cloned().unwrap_or_default();
            (cell(0), (cell(1), cell(2)))
        })
        .collect();
    assert!(documented.len() > 40, "{documented:?}");

    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(Duration::from_secs(60));
    let (code, text) = member_support::metrics_with_a_pod_set(&n);
    assert_eq!(code, 200);
    let exported = families(&text);

    let mut problems = Vec::new();
    for (name, (kind, labels)) in &exported {
        let labels = if labels.is_empty() {
            "-".to_string()
        } else {
            labels.iter().cloned().collect::<Vec<_>>().join(", ")
        };
        match documented.get(name) {
            None => problems.push(format!(
                "Metrics: {name} is exported but missing from {DOC}; add the row | {name} | {kind} | {labels} | <meaning> |"
            )),
            Some((doc_kind, doc_labels)) => {
                if doc_kind != kind {
                    problems.push(format!(
                        "Metrics: {name}: {DOC} says type {doc_kind:?}, the agent exports {kind:?}"
                    ));
                }
                if *doc_labels != labels {
                    problems.push(format!(
                        "Metrics: {name}: {DOC} says labels {doc_labels:?}, the agent exports {labels:?}"
                    ));
                }
            }
        }
    }
    for name in documented.keys().filter(|m| !exported.contains_key(*m)) {
        problems.push(format!(
            "Metrics: {name} is in {DOC} but a running agent does not export it; remove or fix the row"
        ));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// docs/architecture.md's table of controllers names every controller by the name its queue and
/// reconcile metrics carry, so the table cannot lose one that the code has.
#[test]
fn every_controller_has_its_row_in_the_architecture() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("docs/architecture.md");
    let rows = table(&doc, "Controllers and tasks");
    assert!(rows.len() >= 8, "rows found: {}", rows.len());
    let named: BTreeSet<String> = rows
        .iter()
        .filter_map(|r| r.get(1))
        .filter_map(|kind| kind.strip_prefix("controller "))
        .map(|rest| rest.split([' ', ',', '(']).next().unwrap_or("").to_string())
        .collect();
    for name in [
        hostlet_controllers::pods::controller::CONTROLLER_NAME,
        hostlet_controllers::learners::controller::CONTROLLER,
        hostlet_controllers::members::removal::CONTROLLER,
        hostlet_controllers::placement::CONTROLLER,
        hostlet_controllers::podsets::CONTROLLER,
        hostlet_controllers::upkeep::controller::CONTROLLER,
        hostlet_controllers::upgrade::controller::CONTROLLER,
        hostlet_controllers::snapshots::controller::CONTROLLER,
        hostlet_controllers::tombstone::controller::CONTROLLER,
    ] {
        assert!(
            named.contains(name),
            "no row for controller {name:?} in {named:?}"
        );
    }
}
