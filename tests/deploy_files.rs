//! The files in `deploy/` that watch hostlet (Prometheus alert rules, the Grafana dashboard) speak of
//! metrics a running agent exports, with labels those metrics carry: a renamed metric or label breaks
//! this test instead of an alert that silently never fires.

mod member_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use member_support::Node;

/// Labels Prometheus adds when it scrapes, not hostlet.
const SCRAPE_LABELS: [&str; 2] = ["instance", "job"];

/// Sample names (`foo`, `foo_bucket`, …) and the label names each carries, from a `/metrics` text.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (sample, labels) = member_support::sample_names(line);
        out.entry(sample.to_string()).or_default().extend(labels);
    }
    out
}

/// The metrics and the label names a PromQL expression refers to.
#[derive(Debug, Default, PartialEq)]
struct Refs {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

fn refs(expr: &str) -> Refs {
    // Quoted label values and template variables are not names.
    let mut plain = String::new();
    let mut in_quote = false;
    for c in expr.chars() {
        if c == '"' {
            in_quote = !in_quote;
        } else if !in_quote {
            plain.push(c);
        }
    }
    let ident = |s: &str| -> Option<String> {
        let s = s.trim();
        (!s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then(|| s.to_string())
    };
    let mut r = Refs::default();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '{') {
        rest = &rest[i..];
        if let Some(body) = rest.strip_prefix('{') {
            let (inside, after) = body.split_once('}').unwrap_or((body, ""));
            for m in inside.split(',') {
                let name_end = m.find(['=', '!']).unwrap_or(m.len());
                r.labels.extend(ident(&m[..name_end]));
            }
            rest = after;
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        rest = &rest[end..];
        if word == "by" || word == "without" {
            if let Some(body) = rest.trim_start().strip_prefix('(') {
                let (inside, after) = body.split_once(')').unwrap_or((body, ""));
                r.labels.extend(inside.split(',').filter_map(ident));
                rest = after;
            }
        } else if word.starts_with("hostlet_") || word.starts_with("workqueue_") {
            r.metrics.insert(word.to_string());
        }
    }
    r
}

/// Every `expr` in the alert rules, named by its alert.
fn alert_exprs(root: &Path) -> Vec<(String, String)> {
    let path = root.join("deploy/prometheus-alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("every rule has an expr");
            assert!(
                rule["annotations"]["summary"].as_str().is_some(),
                "{name} has no summary"
            );
            out.push((format!("alert {name}"), expr.to_string()));
        }
    }
    out
}

/// Every query in the dashboard (panel targets and template variables), named by its panel.
fn dashboard_exprs(root: &Path) -> Vec<(String, String)> {
    let path = root.join("deploy/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in doc["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "{title}: id used twice"
        );
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("every target has an expr");
            out.push((format!("panel {title}"), expr.to_string()));
        }
    }
    for var in doc["templating"]["list"].as_array().expect("templating") {
        if var["type"] == "query" {
            let q = var["query"].as_str().expect("query");
            out.push((format!("variable {}", var["name"]), q.to_string()));
        }
    }
    out
}

#[test]
fn promql_references_are_read_from_selectors_groupings_and_names() {
    let r = refs(
        r#"histogram_quantile(0.99, sum(rate(hostlet_x_bucket{instance=~"$i",result!="a,b"}[5m])) by (le, op)) / workqueue_depth"#,
    );
    assert_eq!(
        r.metrics,
        BTreeSet::from(["hostlet_x_bucket".into(), "workqueue_depth".into()])
    );
    assert_eq!(
        r.labels,
        BTreeSet::from(["instance".into(), "result".into(), "le".into(), "op".into()])
    );
    let text = "# HELP a x\na{op=\"get\",result=\"ok\"} 1\nb 0\n";
    let e = exported(text);
    assert_eq!(e["a"], BTreeSet::from(["op".into(), "result".into()]));
    assert!(e["b"].is_empty());
}

#[test]
fn alerts_and_dashboard_use_only_metrics_and_labels_a_running_agent_exports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut exprs = alert_exprs(root);
    let alerts = exprs.len();
    exprs.extend(dashboard_exprs(root));
    assert!(alerts >= 10 && exprs.len() > alerts + 20, "{exprs:?}");

    let mut n = Node::new("n1");
    n.start(&[]);
    n.wait_ready(Duration::from_secs(60));
    let (code, text) = member_support::metrics_with_a_pod_set(&n);
    assert_eq!(code, 200);
    let have = exported(&text);

    let mut wrong = Vec::new();
    let mut used = BTreeSet::new();
    for (whose, expr) in &exprs {
        let r = refs(expr);
        if r.metrics.is_empty() {
            wrong.push(format!("{whose}: no hostlet metric in {expr}"));
        }
        let mut labels_there = BTreeSet::new();
        for m in &r.metrics {
            used.insert(m.clone());
            match have.get(m) {
                Some(l) => labels_there.extend(l.iter().cloned()),
                None => wrong.push(format!("{whose}: {m} is not exported")),
            }
        }
        for l in &r.labels {
            if !SCRAPE_LABELS.contains(&l.as_str()) && !labels_there.contains(l) {
                wrong.push(format!("{whose}: label {l} is on none of {:?}", r.metrics));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The tombstone and reset family is watched, not only exported.
    for m in [
        "hostlet_tombstones_total",
        "hostlet_data_dir_backups",
        "hostlet_cluster_resets_total",
    ] {
        assert!(used.contains(m), "{m} is in no alert or panel");
    }
}
