//! Every crate's modules (api, runtime, controllers and the binary) depend on each other one way only: the top-level modules (`crate::<module>`
//! references between `src/<module>.rs` / `src/<module>/`) and, inside each directory module, its files
//! (`super::<file>` / `crate::<module>::<file>` references; `mod.rs` is the parent and not counted). A
//! cycle means two concerns each reach into the other: move what they share to its owner.
//!
//! References are found by reading the source text (comments skipped), not by the compiler: a
//! `super::<name>` inside an inline test module is taken for a sibling when a sibling has that name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// Shared with the binary's source scans (docs/reference.md, the routes, docs/architecture.md).
#[path = "../../src/source_scan.rs"]
mod source_scan;

use source_scan::{is_test_only, rust_files};

/// One file's lines without comments.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment(s) after each occurrence of `prefix` on the line: `a` for `prefix a::…`, and
/// each of `a`, `b` for `prefix {a::…, b, …}`.
fn segments_after(line: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        // `prefix` must start a path, not end another identifier (`my_crate::`).
        let before = rest[..at].chars().next_back();
        let after = &rest[at + prefix.len()..];
        rest = after;
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            for i in items {
                let name: String = i.trim().chars().take_while(|c| is_ident(*c)).collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Edges `from → to`, each with where it was seen (`file:line`).
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn rust_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    rust_files(dir, &mut out);
    out
}

fn shown(src: &Path, file: &Path, line: usize) -> String {
    format!(
        "{}:{line}",
        file.strip_prefix(src).unwrap_or(file).display()
    )
}

/// The top-level modules and their `crate::` references to each other.
fn top_level_graph(src: &Path) -> Graph {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap().flatten() {
        let p = entry.path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            modules.insert(name, rust_files_under(&p));
        } else if p.extension().is_some_and(|x| x == "rs") && name != "lib" && name != "main" {
            modules.insert(name, vec![p]);
        }
    }
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for file in files {
            for (n, line) in code_lines(file) {
                for to in segments_after(&line, "crate::") {
                    if &to != module && modules.contains_key(&to) {
                        edges.entry(to).or_default().push(shown(src, file, n));
                    }
                }
            }
        }
    }
    graph
}

/// The files of one directory module (without `mod.rs`) and their references to each other.
fn sibling_graph(src: &Path, dir: &Path) -> Graph {
    let module = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            files.insert(name.clone(), p.join("mod.rs"));
        } else if p.extension().is_some_and(|x| x == "rs") && name != "mod" {
            files.insert(name, p);
        }
    }
    let in_module = format!("crate::{module}::");
    let mut graph = Graph::new();
    for (name, file) in &files {
        let edges = graph.entry(name.clone()).or_default();
        if !file.exists() {
            continue;
        }
        for (n, line) in code_lines(file) {
            let unsupered = line.replace("super::super::", "super::");
            let mut seen = segments_after(&unsupered, "super::");
            seen.extend(segments_after(&line, &in_module));
            for to in seen {
                if &to != name && files.contains_key(&to) {
                    edges.entry(to).or_default().push(shown(src, file, n));
                }
            }
        }
    }
    graph
}

/// A cycle, as the nodes on it with the first place each edge is seen, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        node: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap();
                let mut cycle: Vec<String> = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for to in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(graph, to, marks, path) {
                return Some(c);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(c) = visit(graph, node, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// Every cycle's nodes, one cycle per group of modules that reach each other.
fn find_cycles(graph: &Graph) -> Vec<Vec<String>> {
    fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for to in graph.get(&n).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    }
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reach(graph, n))).collect();
    let mut grouped = BTreeSet::new();
    let mut cycles = Vec::new();
    for node in graph.keys() {
        if grouped.contains(node) || !reaches[node].contains(node) {
            continue;
        }
        let group: BTreeSet<String> = reaches[node]
            .iter()
            .filter(|o| reaches[*o].contains(node))
            .cloned()
            .collect();
        let within: Graph = graph
            .iter()
            .filter(|(n, _)| group.contains(*n))
            .map(|(n, e)| {
                let e = e
                    .iter()
                    .filter(|(to, _)| group.contains(*to))
                    .map(|(to, at)| (to.clone(), at.clone()))
                    .collect();
                (n.clone(), e)
            })
            .collect();
        cycles.extend(find_cycle(&within));
        grouped.extend(group);
    }
    cycles
}

fn describe(graph: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|w| {
            let at = &graph[&w[0]][&w[1]];
            format!("  {} -> {} ({})", w[0], w[1], at.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every crate of the workspace: its name and source directory.
fn crate_sources() -> Vec<(&'static str, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the controllers crate sits in the workspace")
        .to_path_buf();
    vec![
        ("hostlet-api", root.join("api/src")),
        ("hostlet-runtime", root.join("runtime/src")),
        ("hostlet-controllers", root.join("controllers/src")),
        ("hostlet", root.join("src")),
    ]
}

#[test]
fn the_top_level_modules_of_every_crate_depend_on_each_other_one_way() {
    let mut failures = Vec::new();
    for (name, src) in crate_sources() {
        let graph = top_level_graph(&src);
        assert!(graph.len() > 2, "{name}: modules found: {:?}", graph.keys());
        for c in find_cycles(&graph) {
            failures.push(format!(
                "import cycle between the modules of {name}:\n{}",
                describe(&graph, &c)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_files_of_each_module_of_every_crate_depend_on_each_other_one_way() {
    let mut checked = BTreeSet::new();
    let mut failures = Vec::new();
    for (name, src) in crate_sources() {
        for dir in std::fs::read_dir(&src).unwrap().flatten().map(|e| e.path()) {
            if !dir.is_dir() {
                continue;
            }
            let graph = sibling_graph(&src, &dir);
            let module = dir.file_name().unwrap().to_string_lossy().into_owned();
            checked.insert(format!("{name}::{module}"));
            for cycle in find_cycles(&graph) {
                failures.push(format!(
                    "import cycle inside {name}::{module}:\n{}",
                    describe(&graph, &cycle)
                ));
            }
        }
    }
    assert!(
        checked.contains("hostlet-controllers::pods") && checked.contains("hostlet::cli"),
        "modules checked: {checked:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_scan_sees_grouped_and_nested_paths() {
    assert_eq!(segments_after("use crate::a::b;", "crate::"), ["a"]);
    assert_eq!(
        segments_after("use crate::{a::X, b, c::{d, e}};", "crate::"),
        ["a", "b", "c"]
    );
    assert_eq!(
        segments_after("let x = crate::a::f(hostlet_crate::b::g());", "crate::"),
        ["a"]
    );
    let mut g = Graph::new();
    g.entry("a".into())
        .or_default()
        .insert("b".into(), vec!["a.rs:1".into()]);
    g.entry("b".into())
        .or_default()
        .insert("c".into(), vec!["b.rs:2".into()]);
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into())
        .or_default()
        .insert("a".into(), vec!["c.rs:3".into()]);
    let cycle = find_cycle(&g).unwrap();
    assert_eq!(cycle, ["a", "b", "c", "a"]);
    g.entry("d".into())
        .or_default()
        .insert("e".into(), vec!["d.rs:4".into()]);
    g.entry("e".into())
        .or_default()
        .insert("d".into(), vec!["e.rs:5".into()]);
    assert_eq!(find_cycles(&g).len(), 2);
    assert!(describe(&g, &cycle).contains("c -> a (c.rs:3)"));
}

/// The controllers stay readable one file at a time: a file past this many lines holds more than one
/// concern and is split by concern. The pod planner, one pure decision table, is the exception.
const MOST_LINES: usize = 1_000;

#[test]
fn no_controller_file_is_longer_than_a_thousand_lines_but_the_planner() {
    let src = crate_sources()
        .into_iter()
        .find(|(name, _)| *name == "hostlet-controllers")
        .map(|(_, src)| src)
        .expect("the controllers crate is listed");
    let files = rust_files_under(&src);
    assert!(files.len() > 20, "files found: {}", files.len());
    let long: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("pods/planner.rs"))
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MOST_LINES).then(|| format!("{} ({n} lines)", shown(&src, f, n)))
        })
        .collect();
    assert!(long.is_empty(), "files over {MOST_LINES} lines: {long:?}");
}

/// A function past this many lines (its signature to its closing brace, closures in it included) does
/// more than one step of its concern; its steps become functions of their own.
const MOST_FN_LINES: usize = 150;

/// The functions over [`MOST_FN_LINES`] today: (file, function, why it is still long). The guard fails
/// when one of them is back under the limit, so the list only shrinks.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    (
        "api/src/validation.rs",
        "validate_container",
        "one check after another over a container's fields; its probes and mounts can go to helpers",
    ),
    (
        "controllers/src/agent/mod.rs",
        "Agent::start",
        "builds the caches and every controller in turn; each controller's wiring can be a function",
    ),
    (
        "controllers/src/etcd_member/api.rs",
        "db_join",
        "the join route's admission checks and the member add in one handler",
    ),
    (
        "controllers/src/pods/controller/execute.rs",
        "Shared::execute",
        "one match arm per planner step; each arm can become a method",
    ),
    (
        "controllers/src/pods/controller/mod.rs",
        "start_with_runtime",
        "wires the manifest merger, the etcd sources, the image collector and the reconciler",
    ),
    (
        "controllers/src/pods/status.rs",
        "build_status",
        "every container's status and the pod's conditions in one pass",
    ),
    (
        "controllers/src/snapshots/sync.rs",
        "RemoteSync::sync",
        "the upload pass and the per-name retention pass in one function",
    ),
    (
        "controllers/src/upkeep/controller.rs",
        "UpkeepController::reconcile",
        "the whole maintenance turn (look, lock, compact, defragment, settle) as one sequence",
    ),
];

/// The non-test functions of one file and their lengths, and the files its `#[cfg(test)] mod x;` name.
#[derive(Default)]
struct Functions {
    file: PathBuf,
    /// (function, lines); an impl's or a trait's function is named `Type::function`.
    found: Vec<(String, usize)>,
    /// Each test module declared here: its file (either layout) and the directory its children live in.
    test_paths: Vec<PathBuf>,
    /// The impl's type or the trait being visited.
    owner: Option<String>,
}

impl Functions {
    fn measure(&mut self, name: String, sig: &syn::Signature, body: &syn::Block) {
        let first = sig.fn_token.span.start().line;
        let last = body.brace_token.span.close().end().line;
        self.found.push((name, last - first + 1));
    }

    fn owned(&self, ident: &syn::Ident) -> String {
        match &self.owner {
            Some(o) => format!("{o}::{ident}"),
            None => ident.to_string(),
        }
    }

    /// Where the module `name` declared in this file lives, as rustc looks for it.
    fn declared(&mut self, name: &syn::Ident, attrs: &[syn::Attribute]) {
        let dir = self.file.parent().expect("a file has a directory");
        let stem = self.file.file_stem().unwrap_or_default();
        let children = if ["mod", "lib", "main"].iter().any(|s| stem == *s) {
            dir.to_path_buf()
        } else {
            dir.join(stem)
        };
        let path = attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(dir.join(s.value())),
                _ => None,
            },
            _ => None,
        });
        match path {
            Some(p) => self.test_paths.push(p),
            None => {
                self.test_paths.push(children.join(format!("{name}.rs")));
                self.test_paths.push(children.join(name.to_string()));
            }
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for Functions {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        } else if m.content.is_none() {
            self.declared(&m.ident, &m.attrs);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            self.measure(f.sig.ident.to_string(), &f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_only(&i.attrs) {
            return;
        }
        let owner = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        syn::visit::visit_item_impl(self, i);
        self.owner = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.measure(self.owned(&f.sig.ident), &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        if is_test_only(&t.attrs) {
            return;
        }
        let outer = self.owner.replace(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.owner = outer;
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if is_test_only(&f.attrs) {
            return;
        }
        if let Some(body) = &f.default {
            self.measure(self.owned(&f.sig.ident), &f.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn functions_of(file: &Path, text: &str) -> Functions {
    let parsed = syn::parse_file(text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut f = Functions {
        file: file.to_path_buf(),
        ..Functions::default()
    };
    syn::visit::Visit::visit_file(&mut f, &parsed);
    f
}

#[test]
fn the_function_scan_measures_non_test_functions_with_their_closures() {
    let text = r#"
fn free(
    a: u8,
) {
    let c = || {
        a;
    };
}
impl<T> Thing<T> {
    pub async fn method(&self) {}
}
trait Does {
    fn provided(&self) {
        1;
    }
    fn required(&self);
}
#[test]
fn a_test() {}
#[cfg(test)]
mod tests {
    fn helper() {}
}
#[cfg(test)]
mod fake;
#[cfg(test)]
#[path = "other_tests.rs"]
mod other;
"#;
    let f = functions_of(Path::new("/w/src/pods/controller.rs"), text);
    let found: Vec<(&str, usize)> = f.found.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    assert_eq!(
        found,
        [("free", 7), ("Thing::method", 1), ("Does::provided", 3)]
    );
    assert_eq!(
        f.test_paths,
        [
            PathBuf::from("/w/src/pods/controller/fake.rs"),
            PathBuf::from("/w/src/pods/controller/fake"),
            PathBuf::from("/w/src/pods/other_tests.rs"),
        ]
    );
}

#[test]
fn no_function_is_longer_than_the_limit_but_the_listed_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the controllers crate sits in the workspace");
    let mut scanned = Vec::new();
    for (_, src) in crate_sources() {
        for file in rust_files_under(&src) {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            scanned.push(functions_of(&file, &text));
        }
    }
    let test_paths: Vec<&PathBuf> = scanned.iter().flat_map(|f| &f.test_paths).collect();
    let mut long: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut counted = 0;
    for f in &scanned {
        if test_paths.iter().any(|t| f.file.starts_with(t)) {
            continue;
        }
        let shown = f.file.strip_prefix(root).unwrap_or(&f.file).display();
        for (name, lines) in &f.found {
            counted += 1;
            if *lines > MOST_FN_LINES {
                long.insert((shown.to_string(), name.clone()), *lines);
            }
        }
    }
    assert!(counted > 1_000, "only {counted} functions found");
    let mut failures = Vec::new();
    for ((file, name), lines) in &long {
        if !LONG_FUNCTIONS
            .iter()
            .any(|(f, n, _)| f == file && n == name)
        {
            failures.push(format!(
                "{file}: {name} is {lines} lines (the limit is {MOST_FN_LINES}): split it into its steps"
            ));
        }
    }
    for (file, name, _) in LONG_FUNCTIONS {
        if !long.contains_key(&(file.to_string(), name.to_string())) {
            failures.push(format!(
                "{file}: {name} is listed in LONG_FUNCTIONS but is no longer over {MOST_FN_LINES} lines (or is gone): remove it from the list"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
