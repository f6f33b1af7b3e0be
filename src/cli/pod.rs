//! `hostlet pod …`: pod manifests.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::validation::{resolve, validate, SourceKind, SourcedPod};
use hostlet_api::{parse_manifest_list, PodManifest};

#[derive(Debug, Subcommand)]
pub enum PodCommand {
    /// Check manifests offline: every error with its field path (exit 1), or each pod named valid (exit 0).
    Validate {
        /// Manifest file (YAML or JSON; one manifest, a list, or several YAML documents); `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
    },
}

pub fn execute(cmd: PodCommand) -> ExitCode {
    match cmd {
        PodCommand::Validate { file } => validate_file(&file),
    }
}

/// Reads `file` (`-` for stdin) whole.
pub fn read_input(file: &std::path::Path) -> Result<(String, Vec<u8>), String> {
    if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("<stdin>: {e}"))?;
        return Ok(("<stdin>".to_string(), buf));
    }
    let shown = file.display().to_string();
    match std::fs::read(file) {
        Ok(b) => Ok((shown, b)),
        Err(e) => Err(format!("{shown}: {e}")),
    }
}

/// The verdict on each manifest of one input: `(name, errors)` in input order; empty errors = valid.
pub fn judge(origin: &str, bytes: &[u8]) -> Result<Vec<(String, Vec<String>)>, String> {
    let items = parse_manifest_list(bytes).map_err(|e| format!("{origin}: {e}"))?;
    let mut verdicts: Vec<(String, Vec<String>)> = Vec::new();
    let mut valid: Vec<(usize, PodManifest)> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Err(e) => verdicts.push((format!("{origin}[{i}]"), vec![e.to_string()])),
            Ok(m) => {
                let name = if m.id.is_empty() {
                    format!("{origin}[{i}]")
                } else {
                    m.id.clone()
                };
                let errors: Vec<String> = validate(&m).iter().map(ToString::to_string).collect();
                if errors.is_empty() {
                    valid.push((verdicts.len(), m));
                }
                verdicts.push((name, errors));
            }
        }
    }
    // Pods that are valid alone may still collide with each other (same id, same host port).
    let sourced = valid
        .iter()
        .map(|(slot, m)| SourcedPod {
            source: SourceKind::File,
            origin: format!("{origin} item {slot}"),
            ordinal: *slot,
            manifest: m.clone(),
        })
        .collect();
    for (pod, reason) in resolve(sourced).rejected {
        verdicts[pod.ordinal].1.push(reason);
    }
    Ok(verdicts)
}

fn validate_file(file: &std::path::Path) -> ExitCode {
    let (origin, bytes) = match read_input(file) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hostlet: {e}");
            return ExitCode::FAILURE;
        }
    };
    let verdicts = match judge(&origin, &bytes) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hostlet: {e}");
            return ExitCode::FAILURE;
        }
    };
    if verdicts.is_empty() {
        println!("{origin}: no pods (an empty set is valid)");
        return ExitCode::SUCCESS;
    }
    let mut ok = true;
    for (name, errors) in &verdicts {
        if errors.is_empty() {
            println!("{name}: valid");
        } else {
            ok = false;
            println!("{name}: invalid");
            for e in errors {
                println!("  {e}");
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
