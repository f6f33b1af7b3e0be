//! `hostlet etcd upgrade status`: each member's running and on-disk etcd release, and where its agent's
//! rolling upgrade stands (from `/hostlet/etcd/upgrades/`), with the maintenance lock's holder.

use std::process::ExitCode;

use hostlet_api::objects::EtcdUpgradeState;
use hostlet_controllers::etcd_member::gate;
use hostlet_controllers::upkeep::lock;
use serde::Serialize;

use super::cluster::{print_structured, print_table, ClusterArgs};
use super::exit::CliError;

#[derive(Debug, Serialize)]
struct Row {
    member: String,
    node: Option<String>,
    /// What the member's `/version` says now.
    running: Option<String>,
    /// The release of the binary its agent would start, as the agent last saw it.
    on_disk: Option<String>,
    phase: Option<String>,
    message: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    cluster_version: Option<String>,
    lock: Option<String>,
    members: Vec<Row>,
}

pub async fn status(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let tls = cluster.etcd_config()?.tls;
    let keys = cluster.keys();
    let list = etcd.member_list().await?;
    let urls: Vec<String> = list
        .iter()
        .map(|m| m.client_urls().first().cloned().unwrap_or_default())
        .collect();
    let versions = gate::member_versions(&urls, tls.as_ref()).await;
    let (kvs, _) = etcd.get_prefix(keys.etcd_upgrades_prefix()).await?;
    let records: Vec<(String, EtcdUpgradeState)> = kvs
        .iter()
        .filter_map(|kv| {
            let node = String::from_utf8_lossy(kv.key())
                .trim_start_matches(&keys.etcd_upgrades_prefix())
                .to_string();
            match serde_json::from_slice::<EtcdUpgradeState>(kv.value()) {
                Ok(r) => Some((node, r)),
                Err(e) => {
                    eprintln!("warning: {}: unreadable upgrade record: {e}", node);
                    None
                }
            }
        })
        .collect();
    let mut cluster_version = None;
    let mut rows = Vec::new();
    for (m, v) in list.iter().zip(versions) {
        let v = v.unwrap_or_default();
        if cluster_version.is_none() {
            cluster_version = v.cluster.map(|c| c.minor_text());
        }
        let rec = records.iter().find(|(_, r)| r.member == m.name());
        rows.push(Row {
            member: m.name().to_string(),
            node: rec.map(|(n, _)| n.clone()),
            running: v.server.map(|s| s.to_string()),
            on_disk: rec.map(|(_, r)| r.on_disk.clone()),
            phase: rec.map(|(_, r)| r.phase.to_string()),
            message: rec
                .map(|(_, r)| r.message.clone())
                .filter(|m| !m.is_empty()),
        });
    }
    let report = Report {
        cluster_version,
        lock: lock::holder(&etcd, &keys).await?,
        members: rows,
    };
    if cluster.output.structured() {
        print_structured(&report, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let cells: Vec<Vec<String>> = report
        .members
        .iter()
        .map(|r| {
            vec![
                r.member.clone(),
                text(&r.node),
                text(&r.running),
                text(&r.on_disk),
                text(&r.phase),
                text(&r.message),
            ]
        })
        .collect();
    print_table(
        &[
            "MEMBER",
            "NODE",
            "RUNNING",
            "ON DISK",
            "PHASE",
            "WAITING FOR",
        ],
        &cells,
    );
    println!(
        "\ncluster version: {}; maintenance lock: {}",
        text(&report.cluster_version),
        report.lock.as_deref().unwrap_or("free")
    );
    Ok(ExitCode::SUCCESS)
}
