//! `hostlet node …`: the cluster's nodes, from their records and heartbeats.

use std::collections::HashSet;
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::objects::NodeInfo;
use hostlet_api::Key;

use super::cluster::{print_structured, print_table, ClusterArgs, Output};
use super::exit::CliError;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List nodes: Ready while their agent's heartbeat lease lives.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a node's record: the etcd leader removes the node's member (never the last voter), and the
    /// node's agent, if it still runs, backs its member data up and rejoins as a new member.
    Delete {
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, serde::Serialize)]
struct NodeView {
    #[serde(flatten)]
    info: NodeInfo,
    ready: bool,
}

pub async fn run(cmd: NodeCommand) -> Result<ExitCode, CliError> {
    match cmd {
        NodeCommand::Ls { cluster } => ls(&cluster).await,
        NodeCommand::Delete { name, cluster } => delete(&name, &cluster).await,
    }
}

async fn delete(name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let key = cluster.keys().node(name);
    let deleted = etcd.delete(&key).await?;
    if deleted == 0 {
        return Err(CliError::not_found(format!(
            "no node {name:?} ({key} does not exist)"
        )));
    }
    println!("node/{name} deleted; its etcd member is being removed");
    Ok(ExitCode::SUCCESS)
}

async fn ls(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let (leases, _) = etcd.get_prefix(keys.leases_prefix()).await?;
    let alive: HashSet<String> = leases
        .iter()
        .filter_map(|kv| match keys.parse(&String::from_utf8_lossy(kv.key())) {
            Some(Key::Lease { node }) => Some(node),
            _ => None,
        })
        .collect();
    let (nodes, _) = etcd.get_prefix(keys.nodes_prefix()).await?;
    let views: Vec<NodeView> = nodes
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .map(|info| NodeView {
            ready: alive.contains(&info.name),
            info,
        })
        .collect();
    if cluster.output != Output::Table {
        print_structured(&views, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.info.name.clone(),
                if v.ready { "Ready" } else { "NotReady" }.to_string(),
                v.info.address.clone(),
                v.info.member_name.clone().unwrap_or_else(|| "-".into()),
                v.info.peer_url.clone().unwrap_or_else(|| "-".into()),
                v.info.version.clone(),
                humantime::format_rfc3339_seconds(v.info.started.0).to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME", "STATUS", "ADDRESS", "MEMBER", "PEER URL", "VERSION", "STARTED",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}
