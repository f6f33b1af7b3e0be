//! `hack/install.sh`: the host install into a scratch root — binary, unit, `/etc/default/hostlet`, the
//! data dir, etcd.service masked, hostlet.service enabled — checked file by file and with
//! `systemd-analyze verify`; a second run changes nothing, an edited default file is kept, `--dry-run`
//! changes nothing, the uninstall keeps the data unless `--purge`. Also: every flag of `hostlet run` has
//! its `HOSTLET_*` variable, and the default file names only those.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");
const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn install(root: &Path, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(Path::new(REPO).join("hack/install.sh"))
        .arg("--root")
        .arg(root)
        .arg("--binary")
        .arg(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Every path under `root`, relative, sorted: what a dry run must leave as it was.
fn tree(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                walk(&p, root, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn link(root: &Path, path: &str) -> Option<String> {
    std::fs::read_link(root.join(path))
        .ok()
        .map(|p| p.display().to_string())
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn install_verify_reinstall_and_uninstall_in_a_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();

    let o = install(root, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let bin = root.join("usr/local/bin/hostlet");
    assert_eq!(std::fs::read(&bin).unwrap(), std::fs::read(BIN).unwrap());
    assert_eq!(mode(&bin), 0o755);
    let unit = root.join("etc/systemd/system/hostlet.service");
    assert_eq!(
        std::fs::read(&unit).unwrap(),
        std::fs::read(Path::new(REPO).join("deploy/hostlet.service")).unwrap()
    );
    let default = root.join("etc/default/hostlet");
    assert!(std::fs::read_to_string(&default)
        .unwrap()
        .contains("#HOSTLET_SERVER="));
    // It may hold the token.
    assert_eq!(mode(&default), 0o600);
    assert_eq!(mode(&root.join("var/lib/hostlet")), 0o700);
    assert_eq!(
        link(root, "etc/systemd/system/etcd.service").as_deref(),
        Some("/dev/null"),
        "etcd.service masked"
    );
    assert_eq!(
        link(
            root,
            "etc/systemd/system/multi-user.target.wants/hostlet.service"
        )
        .as_deref(),
        Some("/etc/systemd/system/hostlet.service"),
        "hostlet.service enabled"
    );

    // systemd-analyze resolves the unit's targets from the root: give it this system's own units.
    let system_units = Path::new("/usr/lib/systemd/system");
    assert!(
        system_units.join("multi-user.target").exists(),
        "systemd's units are missing: install systemd (hack/install-deps.sh)"
    );
    std::fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    let o = Command::new("cp")
        .arg("-a")
        .arg(system_units)
        .arg(root.join("usr/lib/systemd"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("/etc/systemd/system/hostlet.service")
        .current_dir(root)
        .output()
        .expect("systemd-analyze (package systemd, hack/install-deps.sh)");
    assert!(v.status.success(), "systemd-analyze verify: {}", text(&v));
    assert_eq!(text(&v).trim(), "", "no warning about the unit");

    // Again: nothing to do. An edited default file stays as it is.
    std::fs::write(&default, "HOSTLET_NODE_NAME=edited\n").unwrap();
    let before = tree(root);
    let o = install(root, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !text(&o).lines().any(|l| l.starts_with("+ ")),
        "a second install acts on nothing:\n{}",
        text(&o)
    );
    assert_eq!(tree(root), before);
    assert_eq!(
        std::fs::read_to_string(&default).unwrap(),
        "HOSTLET_NODE_NAME=edited\n"
    );

    // Uninstall: the service goes, the settings and the data stay.
    std::fs::write(root.join("var/lib/hostlet/token"), "kept\n").unwrap();
    let o = install(root, &["--uninstall", "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(tree(root), before_with_token(&before));
    let o = install(root, &["--uninstall"]);
    assert!(o.status.success(), "{}", text(&o));
    for gone in [
        "usr/local/bin/hostlet",
        "etc/systemd/system/hostlet.service",
        "etc/systemd/system/multi-user.target.wants/hostlet.service",
        "etc/systemd/system/etcd.service",
    ] {
        assert!(
            std::fs::symlink_metadata(root.join(gone)).is_err(),
            "{gone} removed"
        );
    }
    assert_eq!(
        std::fs::read_to_string(root.join("var/lib/hostlet/token")).unwrap(),
        "kept\n"
    );
    assert!(default.exists());
    assert!(text(&o).contains("kept: /var/lib/hostlet"), "{}", text(&o));

    let o = install(root, &["--uninstall", "--purge"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!root.join("var/lib/hostlet").exists());
    assert!(!default.exists());
}

fn before_with_token(before: &[String]) -> Vec<String> {
    let mut v = before.to_vec();
    v.push("var/lib/hostlet/token".to_string());
    v.sort();
    v
}

#[test]
fn dry_run_prints_every_step_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let o = install(root, &["--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(tree(root).is_empty(), "dry run wrote {:?}", tree(root));
    let out = text(&o);
    let r = root.display();
    for step in [
        format!("would: install -D -m 0755 {BIN} {r}/usr/local/bin/hostlet"),
        format!("would: install -D -m 0644 {REPO}/deploy/hostlet.service {r}/etc/systemd/system/hostlet.service"),
        format!("would: install -D -m 0600 {REPO}/deploy/hostlet.default {r}/etc/default/hostlet"),
        format!("would: install -d -m 0700 {r}/var/lib/hostlet"),
        format!("would: ln -sfn /dev/null {r}/etc/systemd/system/etcd.service"),
        format!("would: ln -sfn /etc/systemd/system/hostlet.service {r}/etc/systemd/system/multi-user.target.wants/hostlet.service"),
    ] {
        assert!(out.contains(&step), "missing {step:?} in:\n{out}");
    }

    // A unit file of the admin's own where the mask would go is refused, not overwritten.
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    std::fs::write(root.join("etc/systemd/system/etcd.service"), "[Unit]\n").unwrap();
    let o = install(root, &[]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("/etc/systemd/system/etcd.service exists and is not a link"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/systemd/system/etcd.service")).unwrap(),
        "[Unit]\n"
    );
}

#[test]
fn every_run_flag_has_its_variable_and_the_default_file_names_only_those() {
    let help = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let mut vars = Vec::new();
    for line in help.lines().map(str::trim_start) {
        let Some(rest) = line.strip_prefix("--") else {
            continue;
        };
        let flag = rest.split([' ', '=', '<']).next().unwrap_or_default();
        if ["help", "print-config"].contains(&flag) {
            continue;
        }
        let want = format!("HOSTLET_{}", flag.to_uppercase().replace('-', "_"));
        assert!(
            help.contains(&format!("[env: {want}")),
            "--{flag} has no {want}:\n{help}"
        );
        vars.push(want);
    }
    assert!(vars.len() > 25, "{vars:?}");

    let default = std::fs::read_to_string(Path::new(REPO).join("deploy/hostlet.default")).unwrap();
    for line in default.lines() {
        let Some((key, _)) = line.trim_start_matches('#').split_once('=') else {
            continue;
        };
        if key.contains(' ') || key == "RUST_LOG" {
            continue;
        }
        assert!(
            vars.iter().any(|v| v == key),
            "deploy/hostlet.default names {key}, which no flag of `hostlet run` reads"
        );
    }
}
