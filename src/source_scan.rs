//! What the source scans of the tests share: the Rust files under a directory and whether an item is test
//! code. `controllers/tests/module_graph.rs` includes this file by path, so it must use nothing of the
//! binary.

use std::path::{Path, PathBuf};

/// Whether the attributes mark an item as test code: `#[test]`, `#[tokio::test]`, `#[cfg(test)]`.
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let p = a.path();
        p.is_ident("test")
            || p.segments.last().is_some_and(|s| s.ident == "test")
            || (p.is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
    })
}

/// Every `.rs` file under `dir`, in path order, so that what a scan reports reads the same each run.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}
