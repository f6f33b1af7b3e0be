//! `hostlet events`: what happened on a node, oldest first; `--follow` keeps printing new ones.

use std::process::ExitCode;

use clap::Args;
use hostlet_api::objects::Event;

use super::cluster::{print_structured, print_table, ClusterArgs, Output};
use super::exit::CliError;

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this pod's events.
    #[arg(long)]
    pub pod: Option<String>,
    /// Every node's events, not only this node's.
    #[arg(short = 'A', long)]
    pub all_nodes: bool,
    /// Keep printing events as they come.
    #[arg(short, long)]
    pub follow: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// When it last happened: a repeated event is one event whose count grows.
fn last_seen(e: &Event) -> hostlet_api::objects::Timestamp {
    e.last_timestamp.unwrap_or(e.timestamp)
}

fn row(e: &Event) -> Vec<String> {
    vec![
        humantime::format_rfc3339_seconds(last_seen(e).0).to_string(),
        e.count.to_string(),
        e.node.clone(),
        e.kind.clone(),
        e.reason.clone(),
        e.pod.clone().unwrap_or_else(|| "-".into()),
        e.container.clone().unwrap_or_else(|| "-".into()),
        e.message.clone(),
    ]
}

const HEADER: [&str; 8] = [
    "LAST SEEN",
    "COUNT",
    "NODE",
    "TYPE",
    "REASON",
    "POD",
    "CONTAINER",
    "MESSAGE",
];

fn print_one(e: &Event, output: Output) {
    if output.structured() {
        println!("{}", serde_json::to_string(e).unwrap_or_default());
    } else {
        println!("{}", row(e).join("  "));
    }
}

pub async fn run(args: EventsArgs) -> Result<ExitCode, CliError> {
    let etcd = args.cluster.connect().await?;
    let keys = args.cluster.keys();
    let prefix = if args.all_nodes {
        keys.all_events_prefix()
    } else {
        keys.events_prefix(&args.cluster.node())
    };
    let wanted = |e: &Event| {
        args.pod
            .as_deref()
            .is_none_or(|p| e.pod.as_deref() == Some(p))
    };
    let (kvs, rev) = etcd.get_prefix(&prefix).await?;
    let mut events: Vec<Event> = kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Event>(kv.value()).ok())
        .filter(|e| wanted(e))
        .collect();
    events.sort_by_key(last_seen);
    if !args.follow {
        match args.cluster.output {
            o if o.structured() => print_structured(&events, o),
            _ => print_table(&HEADER, &events.iter().map(row).collect::<Vec<_>>()),
        }
        return Ok(ExitCode::SUCCESS);
    }
    // One listener for the whole follow, from before the first line: a fresh one per turn would miss a ^C
    // that arrives while a line is printed.
    let mut interrupt = {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::interrupt()).map_err(|e| format!("listening for ^C: {e}"))?
    };
    if !args.cluster.output.structured() {
        println!("{}", HEADER.join("  "));
    }
    for e in &events {
        print_one(e, args.cluster.output);
    }
    let (_watcher, mut stream) = etcd.watch_prefix(&prefix, rev + 1).await?;
    loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(ExitCode::SUCCESS),
            msg = stream.message() => match msg {
                Ok(Some(resp)) => {
                    for ev in resp.events() {
                        if ev.event_type() != etcd_client::EventType::Put {
                            continue;
                        }
                        if let Some(e) = ev.kv().and_then(|kv| serde_json::from_slice::<Event>(kv.value()).ok()) {
                            if wanted(&e) {
                                print_one(&e, args.cluster.output);
                            }
                        }
                    }
                }
                Ok(None) => return Err(CliError::unreachable("the event watch ended (etcd went away)")),
                Err(e) => return Err(CliError::unreachable(format!("watching events: {e}"))),
            }
        }
    }
}
