//! `hostlet completion <shell>`: scripts a shell can load, naming the commands.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_hostlet");

fn completion(shell: &str) -> String {
    let o = Command::new(BIN)
        .args(["completion", shell])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{shell}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn each_shell_gets_a_script_naming_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let script = completion(shell);
        assert!(!script.trim().is_empty(), "{shell}: empty script");
        for word in [
            "run",
            "pod",
            "validate",
            "snapshot",
            "restore",
            "members",
            "completion",
        ] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
}

#[test]
fn the_bash_script_parses() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostlet.bash");
    std::fs::write(&file, completion("bash")).unwrap();
    let o = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        o.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn an_unknown_shell_is_refused_with_the_choices() {
    let o = Command::new(BIN)
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tcsh") && err.contains("bash"), "{err}");
}
