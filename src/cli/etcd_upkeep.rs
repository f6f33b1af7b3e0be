//! `hostlet etcd status|defrag|compact`: the members' sizes and alarms, and maintenance by hand through the
//! same lock as the agents' upkeep controllers.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use hostlet_controllers::etcd_member::gate;
use hostlet_controllers::upkeep::effects::{alarm_kinds, member_figures, quota_of};
use hostlet_controllers::upkeep::MaintenanceLock;
use hostlet_runtime::Etcd;
use serde::Serialize;

use super::cluster::{human_bytes, print_structured, print_table, ClusterArgs};
use super::exit::CliError;

/// A defragmentation of a large member may take this long.
const DEFRAG_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Serialize)]
struct StatusRow {
    member: String,
    id: String,
    role: String,
    db_size: Option<u64>,
    in_use: Option<u64>,
    /// Free share of the file, percent.
    fragmentation: Option<f64>,
    quota: Option<u64>,
    alarms: Vec<String>,
    leader: bool,
    raft_index: Option<u64>,
    error: Option<String>,
    /// From the member's `/version`: its etcd release, the cluster version it reports, and (etcd 3.6 on)
    /// the version of its data on disk.
    server_version: Option<String>,
    cluster_version: Option<String>,
    storage_version: Option<String>,
    /// What the version gate would warn about for the member's release (a published advisory, past
    /// upstream support).
    version_warnings: Vec<String>,
}

const HEADER: [&str; 12] = [
    "MEMBER",
    "ID",
    "ROLE",
    "VERSION",
    "CLUSTER",
    "STORAGE",
    "DB SIZE",
    "IN USE",
    "FRAGMENTED",
    "QUOTA",
    "ALARMS",
    "RAFT INDEX",
];

pub async fn status(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let tls = cluster.etcd_config()?.tls;
    let list = etcd.member_list().await?;
    let figures = member_figures(&etcd, &list).await;
    let alarms = alarm_kinds(&etcd.alarms().await?);
    let leader = figures
        .iter()
        .filter_map(|m| m.status.map(|s| s.leader))
        .find(|l| *l != 0)
        .unwrap_or(0);
    let urls: Vec<String> = list
        .iter()
        .map(|m| m.client_urls().first().cloned().unwrap_or_default())
        .collect();
    let versions = gate::member_versions(&urls, tls.as_ref()).await;
    let mut rows = Vec::new();
    for ((m, f), v) in list.iter().zip(&figures).zip(versions) {
        let v = v.unwrap_or_default();
        let quota = match m.client_urls().first() {
            Some(u) => quota_of(u, tls.as_ref()).await,
            None => None,
        };
        let s = f.status;
        rows.push(StatusRow {
            member: f.name.clone(),
            id: format!("{:x}", f.id),
            role: if f.is_learner {
                "learner"
            } else if f.id == leader {
                "leader"
            } else {
                "follower"
            }
            .into(),
            db_size: s.map(|s| s.db_size),
            in_use: s.map(|s| s.in_use),
            fragmentation: s.map(|s| {
                if s.db_size == 0 {
                    0.0
                } else {
                    (s.free() as f64 * 1000.0 / s.db_size as f64).round() / 10.0
                }
            }),
            quota,
            alarms: alarms
                .iter()
                .filter(|(id, _)| *id == f.id)
                .map(|(_, a)| a.label().to_string())
                .collect(),
            leader: f.id == leader,
            raft_index: s.map(|s| s.raft_index),
            error: s.is_none().then(|| "does not answer".to_string()),
            server_version: v.server.map(|x| x.to_string()),
            cluster_version: v.cluster.map(|x| x.minor_text()),
            storage_version: v.storage,
            version_warnings: v
                .server
                .map(gate::warnings)
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
        });
    }
    if cluster.output.structured() {
        print_structured(&rows, cluster.output);
    } else {
        let opt = |v: Option<u64>| v.map(human_bytes).unwrap_or_else(|| "?".into());
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
                vec![
                    r.member.clone(),
                    r.id.clone(),
                    r.role.clone(),
                    match &r.server_version {
                        Some(v) if !r.version_warnings.is_empty() => format!("{v} (!)"),
                        v => text(v),
                    },
                    text(&r.cluster_version),
                    text(&r.storage_version),
                    opt(r.db_size),
                    opt(r.in_use),
                    r.fragmentation
                        .map(|f| format!("{f}%"))
                        .unwrap_or_else(|| "?".into()),
                    opt(r.quota),
                    if r.alarms.is_empty() {
                        "-".into()
                    } else {
                        r.alarms.join(",")
                    },
                    match (&r.error, r.raft_index) {
                        (Some(e), _) => e.clone(),
                        (None, Some(i)) => i.to_string(),
                        _ => "?".into(),
                    },
                ]
            })
            .collect();
        print_table(&HEADER, &cells);
        // (!) above: what the version gate warns about, once per release.
        let mut said = std::collections::BTreeSet::new();
        for w in rows.iter().flat_map(|r| &r.version_warnings) {
            if said.insert(w) {
                println!("(!) {w}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The lock for the CLI, or why not.
async fn take_lock(
    etcd: &Etcd,
    cluster: &ClusterArgs,
    operation: &str,
) -> Result<MaintenanceLock, CliError> {
    let holder = format!("cli@{}", crate::config::hostname());
    match MaintenanceLock::acquire(etcd, &cluster.keys(), &holder, operation).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(held)) => Err(CliError::refused(format!(
            "the maintenance lock is held by {held}: one compaction or defragmentation at a time; try again when it is done"
        ))),
        Err(e) if e.to_string().contains("space exceeded") => Err(CliError::refused(
            "etcd refuses writes (NOSPACE), the maintenance lock included: the agents' upkeep compacts, defragments and disarms by itself (see `hostlet events`, `hostlet etcd status`)",
        )),
        Err(e) => Err(CliError::from(e).context("cannot take the maintenance lock")),
    }
}

pub async fn defrag(cluster: &ClusterArgs, member: Option<&str>) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let list = etcd.member_list().await?;
    let figures = member_figures(&etcd, &list).await;
    if figures.iter().any(|m| m.is_learner) {
        return Err(CliError::refused(
            "a learner is catching up: defragment once it is promoted",
        ));
    }
    if let Some(silent) = figures.iter().find(|m| m.status.is_none()) {
        return Err(CliError::refused(format!(
            "member {} does not answer: defragmenting another could cost the quorum",
            silent.name
        )));
    }
    let leader = figures
        .iter()
        .filter_map(|m| m.status.map(|s| s.leader))
        .find(|l| *l != 0)
        .ok_or("no member reports a leader")?;
    let mut chosen: Vec<usize> = match member {
        Some(name) => {
            let i = figures
                .iter()
                .position(|m| m.name == name || format!("{:x}", m.id) == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = figures.iter().map(|m| m.name.as_str()).collect();
                    CliError::not_found(format!(
                        "--member {name:?}: no such member (members: {})",
                        names.join(", ")
                    ))
                })?;
            vec![i]
        }
        None => (0..figures.len()).collect(),
    };
    // Followers first, the leader last.
    chosen.sort_by_key(|i| (figures[*i].id == leader, figures[*i].id));
    let what = match member {
        Some(m) => format!("defrag {m}"),
        None => "defrag all".into(),
    };
    let lock = take_lock(&etcd, cluster, &what).await?;
    let result = async {
        for i in chosen {
            let m = &figures[i];
            let url = list[i]
                .client_urls()
                .first()
                .cloned()
                .ok_or_else(|| format!("member {} has no client URL", m.name))?;
            if m.id == leader && figures.len() > 1 {
                let to = figures
                    .iter()
                    .filter(|f| f.id != leader)
                    .min_by_key(|f| f.status.map(|s| s.free()).unwrap_or(u64::MAX))
                    .map(|f| (f.id, f.name.clone()));
                if let Some((to, name)) = to {
                    etcd.move_leader(to)
                        .await
                        .map_err(|e| format!("moving leadership to {name}: {e}"))?;
                    println!("leadership moved from {} to {name}", m.name);
                }
            }
            let before = m.status.map(|s| s.db_size).unwrap_or(0);
            let started = Instant::now();
            etcd.defragment_at(&url, DEFRAG_TIMEOUT)
                .await
                .map_err(|e| format!("defragmenting {}: {e}", m.name))?;
            let after = etcd
                .status_of(&url)
                .await
                .map(|s| human_bytes(s.db_size().max(0) as u64))
                .unwrap_or_else(|_| "?".into());
            println!(
                "defragmented {}: {} → {after} in {:.2}s",
                m.name,
                human_bytes(before),
                started.elapsed().as_secs_f64()
            );
        }
        Ok::<(), String>(())
    }
    .await;
    lock.release().await;
    result.map(|()| ExitCode::SUCCESS).map_err(CliError::from)
}

pub async fn compact(cluster: &ClusterArgs, keep: i64) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let current = etcd.revision().await?;
    let revision = current - keep.max(0);
    if revision <= 0 {
        return Err(CliError::refused(format!(
            "nothing to compact: the current revision is {current}"
        )));
    }
    let lock = take_lock(&etcd, cluster, &format!("compact {revision}")).await?;
    let started = Instant::now();
    let result = etcd.compact(revision, true).await;
    lock.release().await;
    match result {
        Ok(()) => {
            println!(
                "compacted the history up to revision {revision} in {:.2}s (defragment to return the space: hostlet etcd defrag)",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.is_compacted() => {
            println!("already compacted up to revision {revision}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(CliError::from(e).context(format!("compaction up to revision {revision}"))),
    }
}
