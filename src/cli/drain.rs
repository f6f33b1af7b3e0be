//! `hostlet node cordon|uncordon|drain`: taking a node out of the pod sets' hands before maintenance.

use std::process::ExitCode;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::objects::NodeInfo;
use hostlet_api::{podset, Key};
use hostlet_controllers::events::{EventKind, EventRecorder};
use hostlet_runtime::Etcd;

use super::cluster::ClusterArgs;
use super::exit::CliError;

/// How often a drain looks whether the pods it removed have stopped.
const LOOK: Duration = Duration::from_millis(500);

/// Records an event on the node's own list, where `hostlet events` on it shows it.
async fn node_event(etcd: &Etcd, cluster: &ClusterArgs, node: &str, reason: &str, message: String) {
    let events = EventRecorder::new(etcd.clone(), cluster.keys(), node);
    events.node_event(EventKind::Normal, reason, message).await;
    events.flush(Duration::from_secs(5)).await;
}

pub async fn cordon(name: &str, on: bool, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let said = set_cordon(&etcd, cluster, name, on).await?;
    println!("node {name} {said}");
    Ok(ExitCode::SUCCESS)
}

async fn set_cordon(
    etcd: &Etcd,
    cluster: &ClusterArgs,
    name: &str,
    on: bool,
) -> Result<&'static str, CliError> {
    let said = super::node_admin::edit_admin(etcd, &cluster.keys(), name, |admin, _| {
        let was = admin.unschedulable;
        admin.unschedulable = on;
        Ok(vec![match (was, on) {
            (true, true) => "already cordoned",
            (false, true) => "cordoned",
            (true, false) => "uncordoned",
            (false, false) => "was not cordoned",
        }
        .to_string()])
    })
    .await?;
    let said = match said.first().map(String::as_str) {
        Some("cordoned") => {
            node_event(
                etcd,
                cluster,
                name,
                "NodeCordoned",
                "cordoned: no new pod set pods go to this node".into(),
            )
            .await;
            "cordoned"
        }
        Some("uncordoned") => {
            node_event(
                etcd,
                cluster,
                name,
                "NodeCordoned",
                "uncordoned: pod sets place pods on this node again".into(),
            )
            .await;
            "uncordoned"
        }
        Some("already cordoned") => "already cordoned",
        _ => "was not cordoned",
    };
    Ok(said)
}

/// Hands etcd leadership away from the node's member when it leads; what was done, if anything.
async fn move_leadership(
    etcd: &Etcd,
    name: &str,
    info: &NodeInfo,
) -> Result<Option<String>, CliError> {
    let Some(id) = info
        .member_id
        .as_deref()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
    else {
        return Ok(None);
    };
    let members = etcd.member_list().await?;
    let mut leader = None;
    let mut answering = Vec::new();
    for m in members.iter().filter(|m| !m.is_learner()) {
        let Some(url) = m.client_urls().first() else {
            continue;
        };
        if let Ok(s) = etcd.status_of(url).await {
            leader = leader.or(Some(s.leader()).filter(|l| *l != 0));
            answering.push((m.id(), m.name().to_string()));
        }
    }
    if leader != Some(id) {
        return Ok(None);
    }
    // Only to a voter that answers: leadership handed to a dead one would not move.
    let Some(to) = answering.into_iter().find(|(m, _)| *m != id) else {
        return Err(CliError::refused(format!(
            "node {name} leads etcd and no other voter answers: leadership cannot move, so it is not drained"
        )));
    };
    etcd.move_leader(to.0).await?;
    Ok(Some(format!(
        "etcd leadership moved from {name} to {} ({:x})",
        to.1, to.0
    )))
}

pub async fn drain(
    name: &str,
    timeout: Duration,
    delete_local: bool,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let info = etcd
        .get(keys.node(name))
        .await?
        .and_then(|kv| serde_json::from_slice::<NodeInfo>(kv.value()).ok())
        .ok_or_else(|| CliError::not_found(format!("no node {name:?} (hostlet node ls)")))?;
    println!(
        "node {name} {}",
        set_cordon(&etcd, cluster, name, true).await?
    );
    if let Some(moved) = move_leadership(&etcd, name, &info).await? {
        println!("{moved}");
    }
    let (pods, _) = etcd.get_prefix(keys.pods_prefix(name)).await?;
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for kv in &pods {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let Some(Key::Pod { pod, .. }) = keys.parse(&key) else {
            continue;
        };
        let owner = hostlet_api::parse_manifest(kv.value())
            .ok()
            .and_then(|m| m.annotations.get(podset::OWNER).cloned());
        if owner.is_none() && !delete_local {
            kept.push(pod);
            continue;
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        if etcd.txn(txn).await?.succeeded() {
            match &owner {
                Some(set) => println!("removing pod {pod} (pod set {set})"),
                None => println!("removing pod {pod}"),
            }
            removed.push(pod);
        }
    }
    // The node's agent stops each pod with its grace period and then removes its status.
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = usize::MAX;
    loop {
        let mut running = Vec::new();
        for pod in &removed {
            if etcd.get(keys.pod_status(name, pod)).await?.is_some() {
                running.push(pod.as_str());
            }
        }
        if running.is_empty() {
            break;
        }
        if running.len() != said {
            println!(
                "waiting for {} pods to stop: {}",
                running.len(),
                running.join(", ")
            );
            said = running.len();
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CliError::from(format!(
                "node {name}: {} pods had not stopped within {} ({}); the node stays cordoned",
                running.len(),
                humantime::format_duration(timeout),
                running.join(", ")
            )));
        }
        tokio::time::sleep(LOOK).await;
    }
    let summary = format!(
        "drained: {} pods removed{}",
        removed.len(),
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                ", {} of its own pods left running ({}; --delete-local-pods removes them)",
                kept.len(),
                kept.join(", ")
            )
        }
    );
    node_event(&etcd, cluster, name, "NodeDrained", summary.clone()).await;
    println!("node {name} {summary}");
    Ok(ExitCode::SUCCESS)
}
