//! `hostlet`: the per-host agent (`hostlet run`) and the operator's CLI beside it.

#[cfg(test)]
mod architecture_check;
mod cli;
mod config;
mod gate;
mod paths;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod routes_check;
mod server;
#[cfg(test)]
mod source_scan;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// hostlet runs pods on Docker from manifests kept in etcd, and runs and heals this host's etcd member.
#[derive(Debug, Parser)]
#[command(name = "hostlet", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (one per host).
    Run(Box<config::RunConfig>),
    /// Pods: validate manifests, apply them, list, get and delete pods, read their logs and exec in them.
    #[command(subcommand)]
    Pod(cli::pod::PodCommand),
    /// Pod sets: one pod on every node whose labels match, rolled out node by node (apply, list, get, delete, rollout).
    #[command(subcommand)]
    Podset(cli::podset::PodSetCommand),
    /// ConfigMaps, configuration that pods mount as files or read into their environment: apply, create, list, get and delete them.
    #[command(subcommand)]
    Config(cli::configs::ConfigCommand),
    /// Secrets, like ConfigMaps but sealed in etcd, shown only when asked for and on tmpfs on the node: apply, create, list, get and delete them, rotate-key.
    #[command(subcommand)]
    Secret(cli::configs::SecretCommand),
    /// Worker join tokens: create one (printed once), list them, revoke one.
    #[command(subcommand)]
    Token(cli::token::TokenCommand),
    /// Certificates for people: admin writes an admin's certificate, key and the cluster CA.
    #[command(subcommand)]
    Cert(cli::cert::CertCommand),
    /// The cluster's etcd: snapshots (save, list, prune, delete, restore), members, status, upgrade (status), and upkeep (defrag, compact).
    #[command(subcommand)]
    Etcd(cli::etcd::EtcdCommand),
    /// The cluster's nodes: list them, label them, cordon, uncordon and drain them, their certs, delete one.
    #[command(subcommand)]
    Node(cli::node::NodeCommand),
    /// What happened: events of this node's pods and etcd member.
    Events(cli::events::EventsArgs),
    /// Print a shell completion script, e.g. `hostlet completion bash > /etc/bash_completion.d/hostlet`.
    Completion {
        /// The shell to write the script for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    // Test builds only (feature `failpoints`): the faults FAILPOINTS names, e.g. a slow file write.
    #[cfg(feature = "failpoints")]
    let _failpoints = ::fail::FailScenario::setup();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(first) => {
            // Re-read with the config file applied under the flags and the environment.
            let run = if first.config.is_some() {
                match config::parse_run_args(std::env::args().skip(2)) {
                    Ok(c) => c,
                    Err(e) => return fail(e),
                }
            } else {
                *first
            };
            if let Err(e) = run.check() {
                return fail(anyhow::anyhow!(e));
            }
            cli::run::run(run)
        }
        Command::Pod(cmd) => cli::pod::execute(cmd),
        Command::Podset(cmd) => cli::pod::block_on(cli::podset::run(cmd)),
        Command::Config(cmd) => cli::configs::execute_config(cmd),
        Command::Secret(cmd) => cli::configs::execute_secret(cmd),
        Command::Token(cmd) => cli::pod::block_on(cli::token::run(cmd)),
        Command::Cert(cmd) => match cli::cert::run(cmd) {
            Ok(code) => code,
            Err(e) => e.report(),
        },
        Command::Etcd(cmd) => cli::etcd::execute(cmd),
        Command::Node(cmd) => cli::pod::block_on(cli::node::run(cmd)),
        Command::Events(args) => cli::pod::block_on(cli::events::run(args)),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "hostlet",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}

fn fail(e: anyhow::Error) -> ExitCode {
    if let Some(clap_err) = e.downcast_ref::<clap::Error>() {
        let _ = clap_err.print();
        return cli::exit::Exit::Usage.into();
    }
    eprintln!("hostlet: {e:#}");
    cli::exit::Exit::Usage.into()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command path below the root, e.g. `["etcd", "snapshot", "save"]`.
    fn paths(cmd: &clap::Command, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut path = prefix.clone();
            path.push(sub.get_name().to_string());
            out.push(path.clone());
            paths(sub, path, out);
        }
    }

    fn find<'a>(root: &'a clap::Command, path: &[String]) -> &'a clap::Command {
        path.iter().fold(root, |c, name| {
            c.find_subcommand(name).expect("path from the tree")
        })
    }

    #[test]
    fn snapshot_restore_needs_a_data_dir_unless_it_only_checks() {
        let parse = |args: &[&str]| {
            let argv = ["hostlet", "etcd", "snapshot", "restore", "/tmp/snap"];
            Cli::command().try_get_matches_from(argv.iter().chain(args))
        };
        assert!(parse(&["--check-only"]).is_ok());
        assert!(parse(&["--data-dir", "/tmp/d"]).is_ok());
        let err = parse(&[]).expect_err("no --data-dir");
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{err}"
        );
    }

    #[test]
    fn every_command_has_help_and_parents_name_their_children() {
        let root = Cli::command();
        root.clone().debug_assert();
        let mut all = Vec::new();
        paths(&root, Vec::new(), &mut all);
        assert!(all.len() > 10, "{all:?}");
        for path in std::iter::once(Vec::new()).chain(all.iter().cloned()) {
            let mut argv = vec!["hostlet".to_string()];
            argv.extend(path.iter().cloned());
            argv.push("--help".to_string());
            let err = Cli::command()
                .try_get_matches_from(&argv)
                .expect_err("--help stops the parse");
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{argv:?}");
            assert_eq!(err.exit_code(), 0, "{argv:?}");
            assert!(err.to_string().contains("Usage:"), "{argv:?}: {err}");
        }
        for path in &all {
            let cmd = find(&root, path);
            let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(!about.trim().is_empty(), "{path:?} has no about");
            // A parent's one line says what its children do: each child is named in it (`ls` as "list").
            let about = about.to_lowercase();
            // Every flag and positional says what it is for in `--help`.
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" || arg.is_hide_set() {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(
                    !help.trim().is_empty(),
                    "{path:?}: argument {id:?} has no help"
                );
            }
            for child in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                let word = match child.get_name() {
                    "ls" => "list",
                    n => n,
                };
                assert!(
                    about.contains(word),
                    "{path:?}: about {about:?} does not name {word:?}"
                );
            }
        }
    }
}
