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

/// The shell's own parser accepts the script (`zsh -n`, `fish --no-execute`; both installed by
/// `hack/install-deps.sh --tests`).
fn parses_in(shell: &str, check: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("hostlet.{shell}"));
    std::fs::write(&file, completion(shell)).unwrap();
    let o = Command::new(shell)
        .args(check)
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{shell} (hack/install-deps.sh --tests installs it): {e}"));
    assert!(
        o.status.success(),
        "{shell} {check:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_zsh_script_parses() {
    parses_in("zsh", &["-n"]);
}

#[test]
fn the_fish_script_parses() {
    parses_in("fish", &["--no-execute"]);
}

/// Loaded into bash, the script completes a partial word the way a user's Tab would.
#[test]
fn bash_completes_a_partial_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostlet.bash");
    std::fs::write(&file, completion("bash")).unwrap();
    let complete = |line: &str| {
        let script = format!(
            r#"source "$1"
COMP_LINE={line:?}
COMP_POINT=${{#COMP_LINE}}
read -r -a COMP_WORDS <<< "$COMP_LINE"
case "$COMP_LINE" in *" ") COMP_WORDS+=("") ;; esac
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_hostlet hostlet "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s
' "${{COMPREPLY[@]}}""#
        );
        let o = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("bash")
            .arg(&file)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut words: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .filter(|w| !w.is_empty())
            .collect();
        words.sort();
        words
    };
    assert_eq!(complete("hostlet etcd sn"), vec!["snapshot".to_string()]);
    let after_snapshot = complete("hostlet etcd snapshot ");
    for word in ["save", "ls", "restore", "prune"] {
        assert!(
            after_snapshot.iter().any(|w| w == word),
            "{word} not offered: {after_snapshot:?}"
        );
    }
    assert_eq!(complete("hostlet completion fi"), vec!["fish".to_string()]);
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
