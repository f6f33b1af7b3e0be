//! `hostlet node …`: the cluster's nodes, from their records and heartbeats.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::objects::{NodeInfo, PodPhase, PodStatus};
use hostlet_api::Key;

use super::cluster::{print_structured, print_table, ClusterArgs, Output};
use super::exit::CliError;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List nodes: Ready while their agent's heartbeat lease lives (`-o wide`: member id, URLs, pods, age).
    Ls {
        /// Add a LABELS column: each node's labels, its own and an admin's.
        #[arg(long)]
        show_labels: bool,
        /// Only the nodes whose labels match: `key=value`, `key!=value`, `key`, `!key`, comma-separated.
        #[arg(short = 'l', long = "selector")]
        selector: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Set (`key=value`) or remove (`key-`) labels of a node, as an admin: kept at
    /// `/hostlet/node-labels/<node>`, on top of the node's own (built in and `--node-label`), and the only
    /// way to set labels under hostlet.io/ and node-restriction.hostlet.io/.
    Label {
        /// The node's name, as `node ls` shows it.
        name: String,
        /// `key=value` to set, `key-` to remove.
        #[arg(required = true)]
        labels: Vec<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Mark a node unschedulable: no new pod set pods go there (those it runs stay until a drain).
    Cordon {
        /// The node's name, as `node ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Let pod sets place pods on a node again.
    Uncordon {
        /// The node's name, as `node ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Before maintenance: cordon the node, hand etcd leadership to another voter if it leads, then
    /// remove its pod set pods (each stops with its grace period) and wait until they have stopped.
    Drain {
        /// The node's name, as `node ls` shows it.
        name: String,
        /// How long to wait for the pods to stop.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Also remove the node's own pods (those no pod set wrote).
        #[arg(long)]
        delete_local_pods: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Each node's certificates as its record reports them, against what joins recorded: `recorded`,
    /// `revoked`, or `unrecorded` (issued before joins recorded serials: revoking the node cannot reach
    /// them; join it again); and whether they open etcd (a voter's do; a worker's from an earlier version
    /// still do until it runs this version, which renews them).
    Certs {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a node's record: the etcd leader removes the node's member (never the last voter), and the
    /// node's agent, if it still runs, backs its member data up and rejoins as a new member.
    Delete {
        /// The node's name, as `node ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, serde::Serialize)]
struct NodeView {
    #[serde(flatten)]
    info: NodeInfo,
    /// Its labels in force: its own, with an admin's on top (`labels` is the node's own).
    #[serde(rename = "effectiveLabels")]
    effective_labels: std::collections::BTreeMap<String, String>,
    ready: bool,
    /// In the etcd cluster now: `voter`, `learner`, or `worker` (no member). `role` in the record is the
    /// operator's pin; this is what the member list says.
    #[serde(rename = "currentRole")]
    current_role: &'static str,
    /// Cordoned (`hostlet node cordon`): no new pod set pods go there.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unschedulable: bool,
}

/// A node's place in the etcd cluster, from the member list: the member its record names, if any.
fn current_role(info: &NodeInfo, members: &[hostlet_runtime::Member]) -> &'static str {
    let named = |m: &&hostlet_runtime::Member| {
        info.member_id.as_deref() == Some(&format!("{:x}", m.id))
            || (!m.name.is_empty() && info.member_name.as_deref() == Some(m.name.as_str()))
    };
    match members.iter().find(named) {
        Some(m) if m.is_learner => "learner",
        Some(_) => "voter",
        None => "worker",
    }
}

/// The cluster's members, as `current_role` reads them.
async fn members(etcd: &hostlet_runtime::Etcd) -> Result<Vec<hostlet_runtime::Member>, CliError> {
    Ok(etcd
        .member_list()
        .await?
        .iter()
        .map(hostlet_runtime::Member::from)
        .collect())
}

pub async fn run(cmd: NodeCommand) -> Result<ExitCode, CliError> {
    match cmd {
        NodeCommand::Ls {
            show_labels,
            selector,
            cluster,
        } => ls(&cluster, show_labels, selector.as_deref()).await,
        NodeCommand::Label {
            name,
            labels,
            cluster,
        } => label(&name, &labels, &cluster).await,
        NodeCommand::Certs { cluster } => certs(&cluster).await,
        NodeCommand::Delete { name, cluster } => delete(&name, &cluster).await,
        NodeCommand::Cordon { name, cluster } => super::drain::cordon(&name, true, &cluster).await,
        NodeCommand::Uncordon { name, cluster } => {
            super::drain::cordon(&name, false, &cluster).await
        }
        NodeCommand::Drain {
            name,
            timeout,
            delete_local_pods,
            cluster,
        } => super::drain::drain(&name, timeout, delete_local_pods, &cluster).await,
    }
}

async fn delete(name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let key = cluster.keys().node(name);
    // What the node is decides what the deletion sets going: read before the record goes.
    let record = etcd
        .get(&key)
        .await?
        .and_then(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok());
    let role = match &record {
        Some(info) => {
            let members = members(&etcd).await?;
            Some(current_role(info, &members))
        }
        None => None,
    };
    if record.is_none() {
        return Err(CliError::not_found(format!(
            "no node {name:?} ({key} does not exist)"
        )));
    }
    // A worker's certificates are revoked first: once its record is gone it must not write it again.
    let worker = !matches!(role, Some("voter") | Some("learner"));
    let revoked = if worker {
        let r = hostlet_controllers::pki::update_certificates(&etcd, &cluster.keys(), name, |r| {
            r.revoke(hostlet_api::objects::Timestamp::now())
        })
        .await?;
        r.revoked.len()
    } else {
        0
    };
    etcd.delete(&key).await?;
    println!("node/{name} deleted; {}", after_delete(role));
    if worker {
        println!(
            "its certificates are revoked ({revoked} in all): the voters' etcd and every agent refuse them; it may join again only with a worker token made from now on"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One node's certificates for `node certs`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CertsView {
    name: String,
    serials: Vec<String>,
    state: &'static str,
    /// A voter's certificates, or a worker's that an earlier version issued.
    opens_etcd: bool,
    voter: bool,
}

/// What a node's reported serials are, by the record of what joins issued and revoked.
fn cert_state(serials: &[String], record: &hostlet_api::objects::NodeCertificates) -> &'static str {
    if serials.is_empty() {
        "unknown"
    } else if serials.iter().any(|s| record.revoked.contains(s)) {
        "revoked"
    } else if serials.iter().all(|s| record.issued.contains(s)) {
        "recorded"
    } else {
        "unrecorded"
    }
}

async fn certs(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let (nodes, _) = etcd.get_prefix(keys.nodes_prefix()).await?;
    let (records, _) = etcd.get_prefix(keys.certificates_prefix()).await?;
    let records: HashMap<String, hostlet_api::objects::NodeCertificates> = records
        .iter()
        .filter_map(|kv| match keys.parse(&String::from_utf8_lossy(kv.key())) {
            Some(Key::NodeCertificates { node }) => {
                Some((node, serde_json::from_slice(kv.value()).ok()?))
            }
            _ => None,
        })
        .collect();
    let views: Vec<CertsView> = nodes
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .map(|info| {
            let record = records.get(&info.name).cloned().unwrap_or_default();
            let state = cert_state(&info.cert_serials, &record);
            let voter = info.member_name.is_some();
            CertsView {
                opens_etcd: state != "revoked" && (voter || !record.worker_certs),
                voter,
                state,
                serials: info.cert_serials,
                name: info.name,
            }
        })
        .collect();
    if cluster.output.structured() {
        print_structured(&views, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let serials = if v.serials.is_empty() {
                "-".to_string()
            } else {
                v.serials.join(",")
            };
            let etcd = match (v.opens_etcd, v.voter) {
                (true, true) => "yes (voter)",
                (true, false) => "yes (old credentials)",
                (false, _) => "no",
            };
            vec![
                v.name.clone(),
                v.state.to_string(),
                etcd.to_string(),
                serials,
            ]
        })
        .collect();
    print_table(&["NAME", "CERTIFICATES", "OPENS ETCD", "SERIALS"], &rows);
    let old = views.iter().filter(|v| v.opens_etcd && !v.voter).count();
    if old > 0 {
        eprintln!(
            "{old} worker(s) hold certificates that open etcd, from before this version: start each with this version, which moves it to certificates from the node CA and has etcd refuse the old ones"
        );
    }
    let unrecorded = views.iter().filter(|v| v.state == "unrecorded").count();
    if unrecorded > 0 {
        eprintln!(
            "{unrecorded} node(s) hold certificates no join recorded: deleting them cannot revoke those; join each again (delete the node, then join it with a new worker token)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What happens once a node's record is gone, by what the node was.
fn after_delete(role: Option<&str>) -> &'static str {
    match role {
        Some("voter") => {
            "the etcd leader removes its voter (once a ready worker, if there is one, has joined as a learner \
             to replace it; never the last voter), and its agent, if it still runs, backs its member up and rejoins"
        }
        Some("learner") => "the etcd leader removes its learner member",
        Some(_) => {
            "it runs no etcd member (a worker), so the cluster's members do not change; its agent, if it \
             still runs, stops and leaves its pods running as they are"
        }
        None => "its etcd member, if it has one, is being removed",
    }
}

/// Applies `hostlet node label`'s changes to an admin's labels of a node whose own labels are `own`;
/// what it did, a line each.
fn change_labels(
    admin: &mut hostlet_api::labels::AdminLabels,
    own: &std::collections::BTreeMap<String, String>,
    changes: &[hostlet_api::labels::LabelChange],
) -> Result<Vec<String>, CliError> {
    use hostlet_api::labels::LabelChange;
    let mut said = Vec::new();
    for c in changes {
        match c {
            LabelChange::Set(k, v) => {
                let was = admin.labels.insert(k.clone(), v.clone());
                said.push(match was {
                    Some(w) if &w == v => format!("{k}={v} (unchanged)"),
                    Some(w) => format!("{k}={v} (was {w})"),
                    None => format!("{k}={v}"),
                });
            }
            LabelChange::Remove(k) => {
                if admin.labels.remove(k).is_some() {
                    said.push(format!("{k} removed"));
                } else if own.contains_key(k) {
                    return Err(CliError::refused(format!(
                        "label {k} is the node's own (built in, or its --node-label): change it where the node is started"
                    )));
                } else {
                    said.push(format!("{k} was not set"));
                }
            }
        }
    }
    Ok(said)
}

async fn label(name: &str, args: &[String], cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    use hostlet_api::labels::LabelChange;
    let changes = args
        .iter()
        .map(|a| LabelChange::parse(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::refused(format!("node label: {e}")))?;
    let etcd = cluster.connect().await?;
    let said = super::node_admin::edit_admin(&etcd, &cluster.keys(), name, |admin, own| {
        change_labels(admin, own, &changes)
    })
    .await?;
    println!("node {name}: {}", said.join(", "));
    Ok(ExitCode::SUCCESS)
}

async fn ls(
    cluster: &ClusterArgs,
    show_labels: bool,
    selector: Option<&str>,
) -> Result<ExitCode, CliError> {
    let selector = selector
        .map(hostlet_api::labels::Selector::parse)
        .transpose()
        .map_err(|e| CliError::refused(format!("--selector: {e}")))?;
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
    let members = members(&etcd).await?;
    let (nodes, _) = etcd.get_prefix(keys.nodes_prefix()).await?;
    let (admin, _) = etcd.get_prefix(keys.node_labels_prefix()).await?;
    let admin: HashMap<String, hostlet_api::labels::AdminLabels> = admin
        .iter()
        .filter_map(|kv| match keys.parse(&String::from_utf8_lossy(kv.key())) {
            Some(Key::NodeLabels { node }) => {
                Some((node, serde_json::from_slice(kv.value()).ok()?))
            }
            _ => None,
        })
        .collect();
    let views: Vec<NodeView> = nodes
        .iter()
        .filter_map(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .map(|info| NodeView {
            ready: alive.contains(&info.name),
            current_role: current_role(&info, &members),
            unschedulable: admin.get(&info.name).is_some_and(|a| a.unschedulable),
            effective_labels: hostlet_api::labels::effective(&info.labels, admin.get(&info.name)),
            info,
        })
        .filter(|v| {
            selector
                .as_ref()
                .is_none_or(|s| s.matches(&v.effective_labels))
        })
        .collect();
    if cluster.output.structured() {
        print_structured(&views, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let wide = cluster.output == Output::Wide;
    // Wide: each node's pods, counted from their status keys (running / all).
    let mut pods: HashMap<String, (usize, usize)> = HashMap::new();
    if wide {
        let hosts = format!("{}/hosts/", keys.prefix());
        let (kvs, _) = etcd.get_prefix(&hosts).await?;
        for kv in &kvs {
            if let Some(Key::PodStatus { node, .. }) =
                keys.parse(&String::from_utf8_lossy(kv.key()))
            {
                let running = serde_json::from_slice::<PodStatus>(kv.value())
                    .is_ok_and(|s| s.phase == PodPhase::Running);
                let e = pods.entry(node).or_default();
                e.0 += usize::from(running);
                e.1 += 1;
            }
        }
    }
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let mut row = vec![
                v.info.name.clone(),
                match (v.ready, v.unschedulable) {
                    (true, false) => "Ready",
                    (false, false) => "NotReady",
                    (true, true) => "Ready,SchedulingDisabled",
                    (false, true) => "NotReady,SchedulingDisabled",
                }
                .to_string(),
                v.current_role.to_string(),
                v.info.address.clone(),
                dash(&v.info.member_name),
                dash(&v.info.peer_url),
                v.info.version.clone(),
                humantime::format_rfc3339_seconds(v.info.started.0).to_string(),
                v.info
                    .cert_expires
                    .map(|t| humantime::format_rfc3339_seconds(t.0).to_string())
                    .unwrap_or_else(|| "-".into()),
            ];
            if show_labels {
                let labels: Vec<String> = v
                    .effective_labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                row.push(if labels.is_empty() {
                    "<none>".to_string()
                } else {
                    labels.join(",")
                });
            }
            if wide {
                let (running, all) = pods.get(&v.info.name).copied().unwrap_or((0, 0));
                row.extend([
                    dash(&v.info.member_id),
                    dash(&v.info.client_url),
                    dash(&v.info.api_url),
                    format!("{running}/{all}"),
                    super::pod::age(Some(v.info.started)),
                ]);
            }
            row
        })
        .collect();
    let mut header = vec![
        "NAME",
        "STATUS",
        "ROLE",
        "ADDRESS",
        "MEMBER",
        "PEER URL",
        "VERSION",
        "STARTED",
        "CERT EXPIRES",
    ];
    if show_labels {
        header.push("LABELS");
    }
    if wide {
        header.extend(["MEMBER ID", "CLIENT URL", "API URL", "PODS", "AGE"]);
    }
    print_table(&header, &rows);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_certificates_are_recorded_revoked_unrecorded_or_unknown() {
        let mut r = hostlet_api::objects::NodeCertificates::default();
        r.issue(["a".to_string(), "b".to_string()]);
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(cert_state(&s(&["a", "b"]), &r), "recorded");
        assert_eq!(cert_state(&s(&["a", "c"]), &r), "unrecorded");
        assert_eq!(cert_state(&[], &r), "unknown");
        r.revoke(hostlet_api::objects::Timestamp::from_unix(1));
        assert_eq!(cert_state(&s(&["a", "b"]), &r), "revoked");
    }
}
