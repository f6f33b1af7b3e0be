//! docs/architecture.md against the code: every code span that is a Rust path of this project
//! (`learners::stall::assess`, `Informer::run_with`, `api::authz::authorize(..)`) names an item the
//! sources define, in a file, module, type or trait that the path's earlier segments name. A failure names
//! the span and where its last segment is defined, if anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::reference::root;
use crate::source_scan::rust_files;

const DOC: &str = "docs/architecture.md";

/// Each crate's sources and the names a path gives the crate.
const CRATES: [(&str, [&str; 2]); 4] = [
    ("api/src", ["api", "hostlet_api"]),
    ("runtime/src", ["runtime", "hostlet_runtime"]),
    ("controllers/src", ["controllers", "hostlet_controllers"]),
    ("src", ["hostlet", "crate"]),
];

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The crates the workspace depends on, as paths name them: a span that starts with one is not ours.
fn outside_crates() -> BTreeSet<String> {
    let path = root().join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: BTreeSet<String> = ["std", "core", "alloc"].map(String::from).into();
    let mut listed = false;
    for line in text.lines() {
        if line.starts_with('[') {
            listed = line.trim() == "[workspace.dependencies]";
        } else if let Some((name, _)) = line.split_once('=').filter(|_| listed) {
            let name = name.trim().replace('-', "_");
            if is_ident(&name) && !name.starts_with("hostlet") {
                out.insert(name);
            }
        }
    }
    out
}

/// The code spans of a Markdown text, outside fenced blocks; a span broken over lines is joined.
fn code_spans(doc: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.replace('\n', " "))
        .collect()
}

/// The span as the segments of a path of this project, if it is one: `a::b` (an argument list after it
/// dropped), every segment an identifier, the first not an outside crate. Keys, flags, metric names and
/// commands have no `::` between identifiers and are left alone.
fn project_path(span: &str, outside: &BTreeSet<String>) -> Option<Vec<String>> {
    let path = match span.find('(') {
        Some(at) if span.ends_with(')') => &span[..at],
        Some(_) => return None,
        None => span,
    };
    let segments: Vec<&str> = path.split("::").collect();
    if segments.len() < 2 || !segments.iter().all(|s| is_ident(s)) {
        return None;
    }
    if outside.contains(segments[0]) {
        return None;
    }
    Some(segments.into_iter().map(String::from).collect())
}

/// Every item name the sources define (test code included: the doc names fakes), with where: the file
/// and the names around it (its crate's, its file's modules, the inline modules, type or trait it is in).
#[derive(Default)]
struct Defs {
    found: BTreeMap<String, Vec<(String, BTreeSet<String>)>>,
    file: String,
    around: Vec<String>,
}

impl Defs {
    fn add(&mut self, name: &syn::Ident) {
        let around = self.around.iter().cloned().collect();
        self.found
            .entry(name.to_string())
            .or_default()
            .push((self.file.clone(), around));
    }

    fn within(&mut self, name: String, visit: impl FnOnce(&mut Self)) {
        self.around.push(name);
        visit(self);
        self.around.pop();
    }

    fn scan(&mut self, file: &Path) {
        let shown = file.strip_prefix(root()).unwrap_or(file);
        let (dir, names) = CRATES
            .iter()
            .filter(|(dir, _)| shown.starts_with(dir))
            .max_by_key(|(dir, _)| dir.len())
            .unwrap_or_else(|| panic!("{}: not in a crate's sources", shown.display()));
        let mut around: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let modules = shown
            .strip_prefix(dir)
            .expect("under its crate")
            .with_extension("");
        around.extend(
            modules
                .iter()
                .map(|m| m.to_string_lossy().into_owned())
                .filter(|m| !["mod", "lib", "main"].contains(&m.as_str())),
        );
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", shown.display()));
        self.file = shown.display().to_string();
        self.around = around;
        syn::visit::Visit::visit_file(self, &parsed);
    }

    /// Whether `path`'s last segment is defined where each earlier segment is one of the names around it.
    fn defines(&self, path: &[String]) -> bool {
        let (name, earlier) = path.split_last().expect("a path has segments");
        self.found.get(name).is_some_and(|places| {
            places
                .iter()
                .any(|(_, around)| earlier.iter().all(|s| around.contains(s)))
        })
    }
}

fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// The names a `pub use` makes visible here (a re-export defines its name in this module too).
fn reexported(tree: &syn::UseTree, out: &mut Vec<syn::Ident>) {
    match tree {
        syn::UseTree::Path(p) => reexported(&p.tree, out),
        syn::UseTree::Name(n) => out.push(n.ident.clone()),
        syn::UseTree::Rename(r) => out.push(r.rename.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| reexported(t, out)),
        syn::UseTree::Glob(_) => {}
    }
}

// A function's body is not walked: what it defines inside cannot be named by a path.
impl<'ast> syn::visit::Visit<'ast> for Defs {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.add(&f.sig.ident);
    }
    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        self.add(&s.ident);
    }
    fn visit_item_union(&mut self, u: &'ast syn::ItemUnion) {
        self.add(&u.ident);
    }
    fn visit_item_type(&mut self, t: &'ast syn::ItemType) {
        self.add(&t.ident);
    }
    fn visit_item_const(&mut self, c: &'ast syn::ItemConst) {
        self.add(&c.ident);
    }
    fn visit_item_static(&mut self, s: &'ast syn::ItemStatic) {
        self.add(&s.ident);
    }
    fn visit_item_macro(&mut self, m: &'ast syn::ItemMacro) {
        if let Some(name) = &m.ident {
            self.add(name);
        }
    }
    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        self.add(&e.ident);
        self.within(e.ident.to_string(), |d| {
            e.variants.iter().for_each(|v| d.add(&v.ident))
        });
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.add(&m.ident);
        self.within(m.ident.to_string(), |d| syn::visit::visit_item_mod(d, m));
    }
    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.add(&t.ident);
        self.within(t.ident.to_string(), |d| syn::visit::visit_item_trait(d, t));
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        match type_name(&i.self_ty) {
            Some(ty) => self.within(ty, |d| syn::visit::visit_item_impl(d, i)),
            None => syn::visit::visit_item_impl(self, i),
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !matches!(u.vis, syn::Visibility::Inherited) {
            let mut names = Vec::new();
            reexported(&u.tree, &mut names);
            names.iter().for_each(|n| self.add(n));
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.add(&f.sig.ident);
    }
    fn visit_impl_item_const(&mut self, c: &'ast syn::ImplItemConst) {
        self.add(&c.ident);
    }
    fn visit_impl_item_type(&mut self, t: &'ast syn::ImplItemType) {
        self.add(&t.ident);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.add(&f.sig.ident);
    }
    fn visit_trait_item_const(&mut self, c: &'ast syn::TraitItemConst) {
        self.add(&c.ident);
    }
    fn visit_trait_item_type(&mut self, t: &'ast syn::TraitItemType) {
        self.add(&t.ident);
    }
}

#[test]
fn the_extractor_takes_project_paths_and_leaves_the_rest() {
    let outside: BTreeSet<String> = ["std", "tokio", "etcd_client"].map(String::from).into();
    let doc = "\
The decision, `learners::stall::assess`, and `Informer::run_with`; `api::authz::authorize(identity, verb,
target)` and `runtime::spawn(Arc<controller>, shutdown)`; `Running::stop()`.
Not these: `/hostlet/nodes/<node>`, `--etcd-binary`, `hostlet_etcd_version_info`, `workqueue_*{name}`,
`hostlet run`, `std::sync::Arc`, `tokio::spawn`, `etcd_client::Client`, `[::1]:2379`, `http://a:1`,
`refresh()`, `a::b(c`, `Store`.
```
 etcd ──► `fenced::Away`
```
";
    let taken: Vec<String> = code_spans(doc)
        .iter()
        .filter_map(|s| project_path(s, &outside))
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        taken,
        [
            "learners::stall::assess",
            "Informer::run_with",
            "api::authz::authorize",
            "runtime::spawn",
            "Running::stop",
        ]
    );
}

#[test]
fn the_definitions_are_found_with_what_is_around_them() {
    let mut defs = Defs::default();
    defs.scan(&root().join("src/architecture_check.rs"));
    defs.scan(&root().join("controllers/src/agent/mod.rs"));
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert!(defs.defines(&path("hostlet::architecture_check::Defs::defines")));
    assert!(defs.defines(&path("controllers::agent::Agent::start")));
    assert!(defs.defines(&path("agent::Agent")));
    assert!(!defs.defines(&path("controllers::agent::Defs")));
    assert!(!defs.defines(&path("agent::Agent::no_such_method")));
}

#[test]
fn the_architecture_names_only_what_the_sources_define() {
    let path = root().join(DOC);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let outside = outside_crates();
    let mut defs = Defs::default();
    for (dir, _) in CRATES {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        files.iter().for_each(|f| defs.scan(f));
    }
    let spans = code_spans(&doc);
    let paths: BTreeSet<Vec<String>> = spans
        .iter()
        .filter_map(|s| project_path(s, &outside))
        .collect();
    assert!(
        paths.len() > 40,
        "only {} paths taken from {DOC}: is the extractor still reading it?",
        paths.len()
    );
    let problems: Vec<String> = paths
        .iter()
        .filter(|p| !defs.defines(p))
        .map(|p| {
            let name = p.last().expect("a path has segments");
            let places: BTreeSet<&str> = defs
                .found
                .get(name)
                .into_iter()
                .flatten()
                .map(|(file, _)| file.as_str())
                .collect();
            let places = if places.is_empty() {
                "nowhere".to_string()
            } else {
                places.into_iter().collect::<Vec<_>>().join(", ")
            };
            format!(
                "{DOC} names `{}`, but no `{name}` is defined under {}; `{name}` is defined in: {places}",
                p.join("::"),
                p[..p.len() - 1].join("::"),
            )
        })
        .collect();
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
