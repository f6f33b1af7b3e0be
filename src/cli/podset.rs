//! `hostlet podset …`: pod sets (one pod on every matching node) and their rollouts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Subcommand;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use hostlet_api::podset::{self, PodSetStatus, Revision};
use hostlet_api::{Key, KeyLayout};
use hostlet_runtime::Etcd;

use super::cluster::{print_structured, ClusterArgs, Output, Table};
use super::exit::{CliError, Exit};

#[derive(Debug, Subcommand)]
pub enum PodSetCommand {
    /// Check a pod set (a Kubernetes apps/v1 DaemonSet) and write it to `/hostlet/podsets/<name>`; the etcd
    /// leader's agent runs its pod on every matching node and rolls template changes out.
    Apply {
        /// The set's file (YAML or JSON); `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List pod sets: DESIRED CURRENT READY UP-TO-DATE AVAILABLE NODE-SELECTOR AGE, as `kubectl get ds`.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show one pod set and its status (YAML unless -o json).
    Get {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a pod set; the leader's controller removes its pods from every node.
    Delete {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// A set's rollouts: status, history, undo, restart, pause, resume.
    #[command(subcommand)]
    Rollout(RolloutCommand),
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Where the rollout stands; with --watch, every change until it completes (exit 0) or fails (exit 1).
    Status {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        /// Keep printing where it stands until it ends.
        #[arg(short = 'w', long)]
        watch: bool,
        /// With --watch: give up after this long (exit 1).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// The set's revisions, oldest first.
    History {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Write an earlier revision's template back (default: the one before the newest).
    Undo {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        /// The revision to go back to (`rollout history` lists them).
        #[arg(long, value_name = "N")]
        to_revision: Option<u64>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Restart every node's pod of the set, by the rollout's rules (a new revision that differs only in an
    /// annotation).
    Restart {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Stop replacing pods: nodes keep what they run until `resume`.
    Pause {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Carry on with a paused rollout.
    Resume {
        /// The pod set's name, as `podset ls` shows it.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// The template annotation `rollout restart` sets (as kubectl's `kubectl.kubernetes.io/restartedAt`).
pub const RESTARTED_AT: &str = "hostlet.io/restartedAt";

pub async fn run(cmd: PodSetCommand) -> Result<ExitCode, CliError> {
    match cmd {
        PodSetCommand::Apply { file, cluster } => apply(&file, &cluster).await,
        PodSetCommand::Ls { cluster } => ls(&cluster).await,
        PodSetCommand::Get { name, cluster } => get(&name, &cluster).await,
        PodSetCommand::Delete { name, cluster } => delete(&name, &cluster).await,
        PodSetCommand::Rollout(r) => match r {
            RolloutCommand::Status {
                name,
                watch,
                timeout,
                cluster,
            } => status(&name, watch, timeout, &cluster).await,
            RolloutCommand::History { name, cluster } => history(&name, &cluster).await,
            RolloutCommand::Undo {
                name,
                to_revision,
                cluster,
            } => undo(&name, to_revision, &cluster).await,
            RolloutCommand::Restart { name, cluster } => {
                let at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
                change(&name, &cluster, "restarted", |v| {
                    let t = v
                        .pointer_mut("/spec/template")
                        .and_then(|t| t.as_object_mut())
                        .ok_or("spec.template is not a mapping")?;
                    let meta = t
                        .entry("metadata")
                        .or_insert_with(|| serde_json::json!({}))
                        .as_object_mut()
                        .ok_or("spec.template.metadata is not a mapping")?;
                    let ann = meta
                        .entry("annotations")
                        .or_insert_with(|| serde_json::json!({}))
                        .as_object_mut()
                        .ok_or("spec.template.metadata.annotations is not a mapping")?;
                    ann.insert(RESTARTED_AT.into(), serde_json::Value::String(at.clone()));
                    Ok(())
                })
                .await
            }
            RolloutCommand::Pause { name, cluster } => paused(&name, true, &cluster).await,
            RolloutCommand::Resume { name, cluster } => paused(&name, false, &cluster).await,
        },
    }
}

fn refused_set(origin: &str, errors: &[hostlet_api::FieldError]) -> CliError {
    for e in errors {
        eprintln!("  {e}");
    }
    CliError::refused(format!("{origin}: invalid pod set, nothing applied"))
}

async fn apply(file: &std::path::Path, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let (origin, bytes) = super::pod::read_input(file)?;
    let set = podset::parse(&bytes).map_err(|es| refused_set(&origin, &es))?;
    let stored = podset::to_stored(&bytes)
        .ok_or_else(|| CliError::refused(format!("{origin}: not YAML or JSON")))?;
    let etcd = cluster.connect().await?;
    let key = cluster.keys().podset(&set.name);
    let before = etcd.get(&key).await?;
    let verb = match &before {
        None => "created",
        Some(kv) if kv.value() == stored.as_slice() => "unchanged",
        Some(_) => "configured",
    };
    if verb != "unchanged" {
        etcd.put(&key, stored).await?;
    }
    println!("podset/{} {verb}", set.name);
    Ok(ExitCode::SUCCESS)
}

/// One set with what the controller says of it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SetView {
    /// The pod set's name, as `podset ls` shows it.
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<serde_json::Value>,
    /// Why the stored set does not read (the controller leaves its pods as they are).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<PodSetStatus>,
    #[serde(skip)]
    node_selector: String,
    #[serde(skip)]
    created: Option<SystemTime>,
}

async fn read_sets(etcd: &Etcd, keys: &KeyLayout) -> Result<Vec<SetView>, CliError> {
    let (kvs, _) = etcd.get_prefix(keys.podsets_prefix()).await?;
    let mut sets: std::collections::BTreeMap<String, SetView> = Default::default();
    fn view<'a>(
        sets: &'a mut std::collections::BTreeMap<String, SetView>,
        name: &str,
    ) -> &'a mut SetView {
        sets.entry(name.to_string()).or_insert_with(|| SetView {
            name: name.to_string(),
            spec: None,
            error: None,
            status: None,
            node_selector: String::new(),
            created: None,
        })
    }
    for kv in &kvs {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match keys.parse(&key) {
            Some(Key::PodSet { name }) => {
                let v = view(&mut sets, &name);
                v.spec = yaml_serde::from_slice(kv.value()).ok();
                match podset::parse(kv.value()) {
                    Ok(s) => {
                        v.node_selector = s
                            .node_selector
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(",");
                    }
                    Err(es) => v.error = Some(hostlet_api::field::describe(&es)),
                }
            }
            Some(Key::PodSetStatus { name }) => {
                view(&mut sets, &name).status = serde_json::from_slice(kv.value()).ok();
            }
            Some(Key::PodSetRevision { name, .. }) => {
                if let Ok(r) = serde_json::from_slice::<Revision>(kv.value()) {
                    let v = view(&mut sets, &name);
                    v.created = Some(v.created.map_or(r.created.0, |c| c.min(r.created.0)));
                }
            }
            _ => {}
        }
    }
    // A set being deleted still has a status until its pods are gone; it is not listed.
    Ok(sets.into_values().filter(|s| s.spec.is_some()).collect())
}

fn age(t: Option<SystemTime>) -> String {
    let Some(t) = t else { return "-".into() };
    let secs = SystemTime::now()
        .duration_since(t)
        .unwrap_or_default()
        .as_secs();
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

async fn ls(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let sets = read_sets(&etcd, &cluster.keys()).await?;
    if cluster.output.structured() {
        print_structured(&sets, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = sets
        .iter()
        .map(|s| {
            let st = s.status.clone().unwrap_or_default();
            let n = |v: u64| v.to_string();
            vec![
                s.name.clone(),
                n(st.desired_number_scheduled),
                n(st.current_number_scheduled),
                n(st.number_ready),
                n(st.updated_number_scheduled),
                n(st.number_available),
                if s.error.is_some() {
                    "<invalid>".into()
                } else if s.node_selector.is_empty() {
                    "<none>".into()
                } else {
                    s.node_selector.clone()
                },
                age(s.created),
            ]
        })
        .collect();
    Table::print(
        &[
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE-SELECTOR",
            "AGE",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

async fn one(etcd: &Etcd, keys: &KeyLayout, name: &str) -> Result<SetView, CliError> {
    read_sets(etcd, keys)
        .await?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| CliError::not_found(format!("no pod set {name:?} (hostlet podset ls)")))
}

async fn get(name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let set = one(&etcd, &cluster.keys(), name).await?;
    let output = if cluster.output == Output::Json {
        Output::Json
    } else {
        Output::Yaml
    };
    print_structured(&set, output);
    Ok(ExitCode::SUCCESS)
}

async fn delete(name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let removed = etcd.delete(cluster.keys().podset(name)).await?;
    if removed == 0 {
        return Err(CliError::not_found(format!(
            "no pod set {name:?} (hostlet podset ls)"
        )));
    }
    println!("podset/{name} deleted; the leader's controller removes its pods from every node");
    Ok(ExitCode::SUCCESS)
}

/// One line on where a rollout stands, and whether it has ended (Some(true): complete, Some(false): failed).
fn said(st: &PodSetStatus, generation: i64) -> (String, Option<bool>) {
    if st.observed_generation < generation {
        return (
            "waiting for the controller to see the newest change".into(),
            None,
        );
    }
    let failed = st
        .condition("RolloutFailed")
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone());
    let reverted = st.condition("Reverted").is_some_and(|c| c.status == "True");
    let complete = st.rollout.as_ref().is_some_and(|r| r.complete);
    match (failed, reverted, complete) {
        (Some(f), true, true) => {
            return (
                format!(
                    "reverted: revision {} rolled out to {} nodes again after a failed rollout ({f})",
                    st.update_revision, st.desired_number_scheduled
                ),
                Some(true),
            )
        }
        (Some(f), true, false) => {
            return (
                format!(
                    "reverting to revision {} after a failed rollout ({f}): {} of {} updated, {} available",
                    st.update_revision,
                    st.updated_number_scheduled,
                    st.desired_number_scheduled,
                    st.number_available
                ),
                None,
            )
        }
        (Some(f), false, _) => return (format!("rollout failed: {f}"), Some(false)),
        _ => {}
    }
    if st.condition("Paused").is_some_and(|c| c.status == "True") {
        return (
            format!(
                "rollout of revision {} is paused: {} of {} updated",
                st.update_revision, st.updated_number_scheduled, st.desired_number_scheduled
            ),
            None,
        );
    }
    if complete {
        return (
            format!(
                "revision {} successfully rolled out to {} nodes",
                st.update_revision, st.desired_number_scheduled
            ),
            Some(true),
        );
    }
    (
        format!(
            "waiting for the rollout of revision {} to finish: {} of {} updated, {} available",
            st.update_revision,
            st.updated_number_scheduled,
            st.desired_number_scheduled,
            st.number_available
        ),
        None,
    )
}

async fn status(
    name: &str,
    watch: bool,
    timeout: Option<Duration>,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let set = etcd
        .get(keys.podset(name))
        .await?
        .ok_or_else(|| CliError::not_found(format!("no pod set {name:?} (hostlet podset ls)")))?;
    let generation = set.mod_revision();
    let status_key = keys.podset_status(name);
    let (current, rev) = etcd.get_prefix(&status_key).await?;
    let read = |v: &[u8]| serde_json::from_slice::<PodSetStatus>(v).ok();
    let mut last = String::new();
    let mut show = |st: &PodSetStatus| -> Option<bool> {
        let (line, ended) = said(st, generation);
        if line != last {
            println!("{line}");
            last = line;
        }
        ended
    };
    let ended = current
        .iter()
        .find(|kv| kv.key() == status_key.as_bytes())
        .and_then(|kv| read(kv.value()))
        .map(|st| show(&st));
    let code = |ended: Option<bool>| match ended {
        Some(true) => ExitCode::SUCCESS,
        Some(false) => Exit::Failed.into(),
        None => ExitCode::SUCCESS,
    };
    if ended.is_none() {
        show(&PodSetStatus {
            observed_generation: -1,
            ..Default::default()
        });
    }
    if !watch || ended.flatten().is_some() {
        return Ok(code(ended.flatten()));
    }
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let (_watcher, mut stream) = etcd.watch_prefix(&status_key, rev + 1).await?;
    loop {
        let msg = match deadline {
            Some(d) => match tokio::time::timeout_at(d, stream.message()).await {
                Ok(m) => m,
                Err(_) => {
                    return Err(CliError::from(format!(
                        "the rollout of {name} did not end within {}",
                        humantime::format_duration(timeout.unwrap_or_default())
                    )))
                }
            },
            None => stream.message().await,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return Err(CliError::unreachable("the watch ended (etcd went away)")),
            Err(e) => return Err(CliError::unreachable(format!("watching {status_key}: {e}"))),
        };
        for ev in resp.events() {
            if let Some(st) = ev.kv().and_then(|kv| read(kv.value())) {
                if let Some(e) = show(&st) {
                    return Ok(code(Some(e)));
                }
            }
        }
    }
}

async fn revisions(etcd: &Etcd, keys: &KeyLayout, name: &str) -> Result<Vec<Revision>, CliError> {
    let (kvs, _) = etcd.get_prefix(keys.podset_revisions_prefix(name)).await?;
    let mut out: Vec<Revision> = kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    out.sort_by_key(|r| r.revision);
    Ok(out)
}

async fn history(name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let set = one(&etcd, &keys, name).await?;
    let revs = revisions(&etcd, &keys, name).await?;
    if cluster.output.structured() {
        print_structured(&revs, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let update = set.status.as_ref().map(|s| s.update_revision);
    let rows: Vec<Vec<String>> = revs
        .iter()
        .map(|r| {
            let images = r
                .template
                .pointer("/spec/containers")
                .and_then(|c| c.as_array())
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| c.get("image").and_then(|i| i.as_str()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                r.revision.to_string(),
                r.hash.clone(),
                humantime::format_rfc3339_seconds(r.created.0).to_string(),
                images,
                if Some(r.revision) == update {
                    "current".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    Table::print(&["REVISION", "HASH", "CREATED", "IMAGES", ""], &rows);
    Ok(ExitCode::SUCCESS)
}

/// Reads the set, changes its stored value, and writes it back only if nobody wrote meanwhile.
async fn change(
    name: &str,
    cluster: &ClusterArgs,
    verb: &str,
    edit: impl Fn(&mut serde_json::Value) -> Result<(), &'static str>,
) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let key = cluster.keys().podset(name);
    for _ in 0..5 {
        let kv = etcd.get(&key).await?.ok_or_else(|| {
            CliError::not_found(format!("no pod set {name:?} (hostlet podset ls)"))
        })?;
        let mut v: serde_json::Value = yaml_serde::from_slice(kv.value()).map_err(|e| {
            CliError::refused(format!("{key} does not parse ({e}); apply it again"))
        })?;
        edit(&mut v).map_err(|e| CliError::refused(format!("{key}: {e}")))?;
        let value = serde_json::to_vec_pretty(&v).map_err(|e| CliError::from(e.to_string()))?;
        podset::parse(&value).map_err(|es| refused_set(&key, &es))?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        if etcd.txn(txn).await?.succeeded() {
            println!("podset/{name} {verb}");
            return Ok(ExitCode::SUCCESS);
        }
    }
    Err(CliError::from(format!(
        "{key} kept changing under this command; try again"
    )))
}

async fn paused(name: &str, pause: bool, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let verb = if pause { "paused" } else { "resumed" };
    change(name, cluster, verb, |v| {
        let spec = v
            .pointer_mut("/spec")
            .and_then(|s| s.as_object_mut())
            .ok_or("spec is not a mapping")?;
        if pause {
            spec.insert("paused".into(), serde_json::Value::Bool(true));
        } else {
            spec.remove("paused");
        }
        Ok(())
    })
    .await
}

async fn undo(name: &str, to: Option<u64>, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let set = one(&etcd, &keys, name).await?;
    let revs = revisions(&etcd, &keys, name).await?;
    let update = set.status.as_ref().map_or(0, |s| s.update_revision);
    let target = match to {
        Some(n) => revs.iter().find(|r| r.revision == n).ok_or_else(|| {
            CliError::not_found(format!(
                "pod set {name} has no revision {n} (hostlet podset rollout history {name})"
            ))
        })?,
        None => revs
            .iter()
            .rev()
            .find(|r| r.revision < update)
            .ok_or_else(|| {
                CliError::not_found(format!("pod set {name} has no revision before {update}"))
            })?,
    };
    let template = target.template.clone();
    let verb = format!("rolled back to revision {}", target.revision);
    change(name, cluster, &verb, move |v| {
        *v.pointer_mut("/spec/template")
            .ok_or("spec.template is missing")? = template.clone();
        Ok(())
    })
    .await
}
