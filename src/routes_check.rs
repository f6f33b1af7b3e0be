//! The route table against the code and the docs: every route the sources add goes through the table's
//! helper (`hostlet_controllers::routes::serve`), so a route without an entry cannot be written, and
//! docs/reference.md's "Routes" table is the table.

use crate::reference::{compare, root, table};
use crate::source_scan::{is_test_only, rust_files};

/// Router methods that add a route or a sub-router of their own.
const ADDING: [&str; 5] = ["route", "route_service", "nest", "nest_service", "fallback"];

/// Where a route may be added by hand: the table's helper, and the metrics listener (no API there).
const ALLOWED: [(&str, &str); 2] = [
    ("controllers/src/routes.rs", "serve"),
    ("src/server.rs", "metrics_router"),
];

/// (file, enclosing function, method) of every route added outside tests.
#[derive(Default)]
struct Added {
    file: String,
    function: String,
    found: Vec<(String, String, String)>,
}

impl<'ast> syn::visit::Visit<'ast> for Added {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            let outer = std::mem::replace(&mut self.function, f.sig.ident.to_string());
            syn::visit::visit_item_fn(self, f);
            self.function = outer;
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            let outer = std::mem::replace(&mut self.function, f.sig.ident.to_string());
            syn::visit::visit_impl_item_fn(self, f);
            self.function = outer;
        }
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        let m = c.method.to_string();
        if ADDING.contains(&m.as_str()) {
            self.found
                .push((self.file.clone(), self.function.clone(), m));
        }
        syn::visit::visit_expr_method_call(self, c);
    }
}

fn scan(added: &mut Added, file: &str, text: &str) {
    let parsed = syn::parse_file(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    added.file = file.to_string();
    syn::visit::Visit::visit_file(added, &parsed);
}

fn by_hand(added: &Added) -> Vec<String> {
    added
        .found
        .iter()
        .filter(|(file, function, _)| {
            !ALLOWED
                .iter()
                .any(|(f, func)| file == f && function == func)
        })
        .map(|(file, function, m)| format!("{file}: {function}() calls .{m}(…)"))
        .collect()
}

#[test]
fn the_scan_finds_routes_added_by_hand_outside_tests() {
    let mut added = Added::default();
    scan(
        &mut added,
        "x.rs",
        r#"
        fn router() -> Router { Router::new().route("/new", get(h)).nest("/v2", other) }
        impl S { fn router(&self) -> Router { serve(Router::new(), &routes::PODS, h) } }
        #[cfg(test)]
        mod tests { fn fake() { Router::new().route("/fake", get(h)); } }
        "#,
    );
    assert_eq!(
        by_hand(&added),
        // The outer call of a chain first.
        [
            "x.rs: router() calls .nest(…)",
            "x.rs: router() calls .route(…)"
        ]
    );
}

#[test]
fn every_route_goes_through_the_table() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["src", "api/src", "runtime/src", "controllers/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut added = Added::default();
    for path in files {
        let file = path
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        // Test-only files: fakes of other servers.
        if file.ends_with("/tests.rs") || file.ends_with("_tests.rs") || file.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        scan(&mut added, &file, &text);
    }
    let problems = by_hand(&added);
    assert!(
        problems.is_empty(),
        "routes added outside the route table (add an entry to hostlet_api::routes and serve it with \
         hostlet_controllers::routes::serve):\n{}",
        problems.join("\n")
    );
    // The helper is still where the scan allows it.
    for (file, function) in ALLOWED {
        assert!(
            added
                .found
                .iter()
                .any(|(f, func, _)| f == file && func == function),
            "{file}: {function}() adds no route any more: update ALLOWED"
        );
    }
}

#[test]
fn the_routes_match_the_reference() {
    let code: Vec<Vec<String>> = hostlet_api::routes::route_rows()
        .into_iter()
        .map(|r| r.iter().map(|c| c.replace('`', "")).collect())
        .collect();
    let doc = std::fs::read_to_string(root().join("docs/reference.md")).expect("docs/reference.md");
    let problems = compare(
        "routes",
        &["method", "path", "who may call", "body limit", "what for"],
        2,
        &code,
        &table(&doc, "Routes"),
    );
    assert!(
        problems.is_empty(),
        "{}\nthe table's rows:\n{}",
        problems.join("\n"),
        hostlet_api::routes::route_rows()
            .iter()
            .map(|r| format!("| {} | `{}` | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
