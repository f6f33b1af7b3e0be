//! `hostlet`: the per-host agent (`hostlet run`) and the operator's CLI beside it.

mod cli;
mod config;
mod paths;
mod server;

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
    /// Pods: validate manifests.
    #[command(subcommand)]
    Pod(cli::pod::PodCommand),
    /// The cluster's etcd: snapshots.
    #[command(subcommand)]
    Etcd(cli::etcd::EtcdCommand),
    /// The cluster's nodes.
    #[command(subcommand)]
    Node(cli::node::NodeCommand),
    /// What happened: events of this node's pods and etcd member.
    Events(cli::events::EventsArgs),
}

fn main() -> ExitCode {
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
        Command::Etcd(cmd) => cli::etcd::execute(cmd),
        Command::Node(cmd) => cli::pod::block_on(cli::node::run(cmd)),
        Command::Events(args) => cli::pod::block_on(cli::events::run(args)),
    }
}

fn fail(e: anyhow::Error) -> ExitCode {
    if let Some(clap_err) = e.downcast_ref::<clap::Error>() {
        let _ = clap_err.print();
        return ExitCode::from(2);
    }
    eprintln!("hostlet: {e:#}");
    ExitCode::from(2)
}
