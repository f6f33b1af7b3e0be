//! Records the git commit the binary is built from, for `hostlet_build_info` and `--version`.

use std::process::Command;

fn main() {
    // Outside a git checkout (e.g. a source tarball) the commit is unknown rather than a build failure.
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=HOSTLET_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves (a commit or a checkout), not on every build.
    let git_path = |p: &str| {
        Command::new("git")
            .args(["rev-parse", "--git-path", p])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(head) = git_path("HEAD") {
        println!("cargo:rerun-if-changed={head}");
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(r) = text.strip_prefix("ref: ").and_then(|r| git_path(r.trim())) {
                println!("cargo:rerun-if-changed={r}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
