//! `hostlet pod …`: pod manifests.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::manifest::Form;
use hostlet_api::objects::{PodStatus, Timestamp};
use hostlet_api::security::{check_level, PodSecurityLevel};
use hostlet_api::validation::{resolve, validate, SourceKind, SourcedPod};
use hostlet_api::{parse_manifest_list, Key, PodManifest};

use super::cluster::{print_structured, ClusterArgs, Output, Table};
use super::exit::{CliError, Exit};

#[derive(Debug, Subcommand)]
pub enum PodCommand {
    /// Check manifests offline: every error with its field path (exit 4), or each pod named valid (exit 0).
    Validate {
        /// Manifest file (YAML or JSON; one manifest, a list, or several YAML documents); `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        /// Also check hostDir volumes against these host directories, as `hostlet run
        /// --allowed-host-paths` does on this host (symlinks and `..` resolved).
        #[arg(long, value_delimiter = ',', value_name = "DIRS", value_parser = crate::paths::absolute)]
        allowed_host_paths: Option<Vec<PathBuf>>,
        /// Also check device volumes (hostPath of type CharDevice or BlockDevice) against these globs, as
        /// `hostlet run --allowed-devices` does on this host.
        #[arg(long, value_delimiter = ',', value_name = "GLOBS")]
        allowed_devices: Option<Vec<String>>,
        /// Check against this pod security level, as `hostlet run --pod-security` does on the host that
        /// will run the pods (validation is offline: it cannot ask the host).
        #[arg(long, value_name = "LEVEL", default_value = "baseline", value_parser = clap::builder::PossibleValuesParser::new(["privileged", "baseline", "restricted"]))]
        pod_security: String,
    },
    /// Validate, then write each pod to `/hostlet/hosts/<node>/pods/<id>`. Nothing is written if any is invalid.
    Apply {
        /// Manifest file (as for validate); `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List pods with their status (`-o wide`: node address, ports, containers, images; `-w`: then every change).
    Ls {
        /// Every node's pods, not only this node's.
        #[arg(short = 'A', long)]
        all_nodes: bool,
        /// After the list, print a line for each change of a pod (from an etcd watch) until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show one pod: its manifest and status (YAML unless -o json).
    Get {
        /// The pod's id, as `pod ls` shows it.
        id: String,
        /// The form of the manifest shown: a Kubernetes v1 Pod or the 2014 manifest (default: as written).
        #[arg(long, value_enum, value_name = "FORM")]
        format: Option<ManifestFormat>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a pod's key; the agent stops and removes its containers.
    Delete {
        /// The pod's id, as `pod ls` shows it.
        id: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Print what a container of a pod wrote (stdout and stderr), from the agent of the pod's node.
    Logs {
        /// The pod's id, on any node.
        id: String,
        /// The container (default: the pod's first app container).
        #[arg(short = 'c', long, value_name = "NAME")]
        container: Option<String>,
        /// Keep printing what it writes next, across log rotations, until interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
        /// The container's previous instance (before its last restart).
        #[arg(long, conflicts_with = "follow")]
        previous: bool,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
        /// Only lines written in this last while (`30s`, `5m`, `2h`).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// Lead each line with the time it was written (RFC 3339).
        #[arg(long)]
        timestamps: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Run a command in a running container of a pod; exits with the command's exit code.
    Exec {
        /// The pod's id, on any node.
        id: String,
        /// The container (default: the pod's first app container).
        #[arg(short = 'c', long, value_name = "NAME")]
        container: Option<String>,
        /// Pass this terminal's stdin to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Give the command a pseudo-terminal (with -i: an interactive shell).
        #[arg(short = 't', long)]
        tty: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

pub fn execute(cmd: PodCommand) -> ExitCode {
    match cmd {
        PodCommand::Validate {
            file,
            allowed_host_paths,
            allowed_devices,
            pod_security,
        } => validate_file(
            &file,
            allowed_host_paths.as_deref(),
            allowed_devices.as_deref(),
            pod_security.parse().unwrap_or_default(),
        ),
        PodCommand::Apply { file, cluster } => block_on(apply(&file, &cluster)),
        PodCommand::Ls {
            all_nodes,
            watch,
            cluster,
        } => block_on(ls(all_nodes, watch, &cluster)),
        PodCommand::Get {
            id,
            format,
            cluster,
        } => block_on(get(&id, format, &cluster)),
        PodCommand::Delete { id, cluster } => block_on(delete(&id, &cluster)),
        PodCommand::Logs {
            id,
            container,
            follow,
            previous,
            tail,
            since,
            timestamps,
            cluster,
        } => {
            let args = super::pod_access::LogsArgs {
                container,
                follow,
                previous,
                tail,
                since,
                timestamps,
            };
            block_on(async {
                let nodes = nodes_of(&cluster, &id).await?;
                super::pod_access::logs(&id, &nodes, &args, &cluster).await
            })
        }
        PodCommand::Exec {
            id,
            container,
            stdin,
            tty,
            command,
            cluster,
        } => {
            let args = super::pod_access::ExecArgs {
                container,
                stdin,
                tty,
                command,
            };
            block_on(async {
                let nodes = nodes_of(&cluster, &id).await?;
                super::pod_access::exec(&id, &nodes, &args, &cluster).await
            })
        }
    }
}

/// Runs one CLI action on a small runtime; an error is printed and exits with its code ([`Exit`]).
pub fn block_on<F: std::future::Future<Output = Result<ExitCode, CliError>>>(f: F) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::from(e.to_string()))
        .and_then(|rt| rt.block_on(f));
    match result {
        Ok(code) => code,
        Err(e) => e.report(),
    }
}

async fn apply(file: &std::path::Path, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let (origin, bytes) = read_input(file)?;
    // The level is the host's: its agent checks it when the pod arrives.
    let verdicts = judge(&origin, &bytes, None, None, None)?;
    if verdicts.iter().any(|(_, errors)| !errors.is_empty()) {
        for (name, errors) in verdicts.iter().filter(|(_, e)| !e.is_empty()) {
            eprintln!("{name}: invalid");
            for e in errors {
                eprintln!("  {e}");
            }
        }
        return Err(CliError::refused(format!(
            "{origin}: nothing applied: fix the errors above"
        )));
    }
    let pods: Vec<PodManifest> = parse_manifest_list(&bytes)
        .map_err(|e| format!("{origin}: {e}"))?
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    if pods.is_empty() {
        println!("{origin}: no pods");
        return Ok(ExitCode::SUCCESS);
    }
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let node = cluster.node();
    for m in &pods {
        let key = keys.pod(&node, &m.id);
        let before = etcd.get(&key).await?;
        let text = hostlet_api::parse::to_yaml(m);
        let verb = match &before {
            None => "created",
            Some(kv) => match hostlet_api::parse_manifest(kv.value()) {
                Ok(old) if &old == m => "unchanged",
                _ => "configured",
            },
        };
        if verb != "unchanged" {
            etcd.put(&key, text).await?;
        }
        println!("pod/{} {verb} (node {node})", m.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// One row of `pod ls`: a pod key and its status, either of which may be missing.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PodView {
    id: String,
    node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    manifest: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<PodStatus>,
    /// Only in `--watch` output: the pod's keys are gone.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
    /// The manifest as parsed, for the wide columns.
    #[serde(skip)]
    spec: Option<PodManifest>,
}

/// Pods by (node, id), built from their manifest and status keys.
type PodViews = std::collections::BTreeMap<(String, String), PodView>;

/// Applies one key (its value, or `None` when deleted) to `map`; returns the pod it concerns, if any.
fn apply_key(
    map: &mut PodViews,
    keys: &hostlet_api::KeyLayout,
    key: &str,
    value: Option<&[u8]>,
    node: Option<&str>,
    only: Option<&str>,
) -> Option<(String, String)> {
    let (n, id, is_status) = match keys.parse(key) {
        Some(Key::Pod { node, pod }) => (node, pod, false),
        Some(Key::PodStatus { node, pod }) => (node, pod, true),
        _ => return None,
    };
    if node.is_some_and(|want| want != n) || only.is_some_and(|want| want != id) {
        return None;
    }
    let slot = (n.clone(), id.clone());
    let view = map.entry(slot.clone()).or_insert_with(|| PodView {
        id,
        node: n,
        manifest: None,
        status: None,
        deleted: false,
        spec: None,
    });
    match (is_status, value) {
        (true, v) => view.status = v.and_then(|v| serde_json::from_slice(v).ok()),
        (false, None) => {
            view.manifest = None;
            view.spec = None;
        }
        (false, Some(v)) => match hostlet_api::parse_manifest(v) {
            Ok(m) => {
                view.manifest = Some(hostlet_api::parse::to_value(&m, m.form));
                view.spec = Some(m);
            }
            Err(e) => {
                view.manifest = Some(serde_json::json!({ "invalid": e.to_string() }));
                view.spec = None;
            }
        },
    }
    Some(slot)
}

async fn views(
    cluster: &ClusterArgs,
    node: Option<&str>,
    only: Option<&str>,
) -> Result<Vec<PodView>, CliError> {
    if let (Some(api), Some(node)) = (cluster.worker_node_api(), node) {
        let map = worker_views(&api?, &cluster.keys(), node, only).await?;
        return Ok(map.into_values().collect());
    }
    let etcd = cluster.connect().await?;
    let (map, _) = load_views(&etcd, &cluster.keys(), node, only).await?;
    Ok(map.into_values().collect())
}

/// Every pod's view and the revision they were read at.
async fn load_views(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
    node: Option<&str>,
    only: Option<&str>,
) -> Result<(PodViews, i64), CliError> {
    let hosts = format!("{}/hosts/", keys.prefix());
    let (kvs, rev) = etcd.get_prefix(&hosts).await?;
    let mut map = PodViews::new();
    for kv in &kvs {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        apply_key(&mut map, keys, &key, Some(kv.value()), node, only);
    }
    Ok((map, rev))
}

/// A worker's own pods, read through the voters' node API: its pod keys and its statuses, what it may
/// read.
async fn worker_views(
    api: &hostlet_runtime::nodeapi::NodeApiClient,
    keys: &hostlet_api::KeyLayout,
    node: &str,
    only: Option<&str>,
) -> Result<PodViews, CliError> {
    let mut map = PodViews::new();
    for prefix in [keys.pods_prefix(node), keys.statuses_prefix(node)] {
        let (kvs, _) = api.list(&prefix).await?;
        for kv in &kvs {
            apply_key(&mut map, keys, &kv.key, Some(&kv.value), Some(node), only);
        }
    }
    Ok(map)
}

/// The nodes that have a pod `id`, for `logs` and `exec`; beside a worker, the worker itself (its agent
/// answers for its own pods only).
async fn nodes_of(cluster: &ClusterArgs, id: &str) -> Result<Vec<String>, CliError> {
    if let Some(own) = super::pod_access::beside_worker(cluster) {
        return Ok(vec![own]);
    }
    let etcd = cluster.connect().await?;
    pod_nodes(&etcd, &cluster.keys(), id).await
}

/// The nodes that have a pod `id` (a pod key or a status).
pub async fn pod_nodes(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
    id: &str,
) -> Result<Vec<String>, CliError> {
    let (map, _) = load_views(etcd, keys, None, Some(id)).await?;
    let mut nodes: Vec<String> = map.into_keys().map(|(node, _)| node).collect();
    nodes.dedup();
    Ok(nodes)
}

/// How long ago, as kubectl writes it: `42s`, `5m`, `3h`, `2d`.
pub fn age(since: Option<Timestamp>) -> String {
    let Some(t) = since else { return "-".into() };
    let secs = std::time::SystemTime::now()
        .duration_since(t.0)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86400),
    }
}

const HEADER: [&str; 7] = ["ID", "NODE", "PHASE", "READY", "RESTARTS", "AGE", "SOURCE"];
const WIDE_HEADER: [&str; 4] = ["NODE ADDRESS", "PORTS", "CONTAINERS", "IMAGES"];
/// The AGE column, which changes with the clock alone.
const AGE_COLUMN: usize = 5;

/// One pod's row; `addresses` (node name → address) adds the wide columns.
fn pod_row(
    v: &PodView,
    addresses: Option<&std::collections::HashMap<String, String>>,
) -> Vec<String> {
    let s = v.status.as_ref();
    let (ready, total) = s
        .map(|s| {
            (
                s.containers.iter().filter(|c| c.ready).count(),
                s.containers.len(),
            )
        })
        .unwrap_or((0, 0));
    let phase = if v.deleted {
        "Deleted".to_string()
    } else {
        s.map(|s| format!("{:?}", s.phase))
            .unwrap_or_else(|| "Pending".into())
    };
    let mut row = vec![
        v.id.clone(),
        v.node.clone(),
        phase,
        format!("{ready}/{total}"),
        s.map(|s| {
            s.containers
                .iter()
                .map(|c| c.restart_count)
                .sum::<u32>()
                .to_string()
        })
        .unwrap_or_else(|| "0".into()),
        age(s.and_then(|s| s.started_at)),
        s.and_then(|s| s.source.clone())
            .unwrap_or_else(|| "etcd-key".into()),
    ];
    if let Some(addresses) = addresses {
        let list = |items: Vec<String>| {
            if items.is_empty() {
                "-".to_string()
            } else {
                items.join(",")
            }
        };
        let containers = v
            .spec
            .as_ref()
            .map(|m| m.containers.as_slice())
            .unwrap_or_default();
        let ports = containers
            .iter()
            .flat_map(|c| c.ports.iter())
            .filter(|p| p.host_port != 0)
            .map(|p| {
                let proto = p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                match p.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
                    Some(ip) => format!("{ip}:{}->{}/{proto}", p.host_port, p.container_port),
                    None => format!("{}->{}/{proto}", p.host_port, p.container_port),
                }
            })
            .collect();
        // The manifest's containers; a pod from another source has only its status.
        let (names, images): (Vec<String>, Vec<String>) = if containers.is_empty() {
            s.map(|s| {
                s.containers
                    .iter()
                    .map(|c| (c.name.clone(), c.image.clone()))
                    .unzip()
            })
            .unwrap_or_default()
        } else {
            containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone()))
                .unzip()
        };
        row.extend([
            addresses
                .get(&v.node)
                .cloned()
                .unwrap_or_else(|| "-".into()),
            list(ports),
            list(names),
            list(images),
        ]);
    }
    row
}

/// Node name → advertised address, from the node records (for the wide columns).
async fn node_addresses(
    etcd: &hostlet_runtime::Etcd,
    keys: &hostlet_api::KeyLayout,
) -> Result<std::collections::HashMap<String, String>, CliError> {
    let (kvs, _) = etcd.get_prefix(keys.nodes_prefix()).await?;
    Ok(kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<hostlet_api::objects::NodeInfo>(kv.value()).ok())
        .map(|n| (n.name, n.address))
        .collect())
}

async fn ls(all_nodes: bool, watch: bool, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let only_node = (!all_nodes).then_some(node.as_str());
    // Beside a worker: its own pods, once, through the voters (no other node's, no watch: it may not).
    if let (Some(api), false, false, false) = (
        cluster.worker_node_api(),
        all_nodes,
        watch,
        cluster.output == Output::Wide,
    ) {
        let map = worker_views(&api?, &cluster.keys(), &node, None).await?;
        if cluster.output.structured() {
            let views: Vec<&PodView> = map.values().collect();
            print_structured(&views, cluster.output);
        } else {
            let rows: Vec<Vec<String>> = map.values().map(|v| pod_row(v, None)).collect();
            let table = Table::new(&HEADER, &rows);
            let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
            println!("{}", table.line(&header));
            for row in &rows {
                println!("{}", table.line(row));
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let (mut map, rev) = load_views(&etcd, &keys, only_node, None).await?;
    let output = cluster.output;
    let mut addresses = match output {
        Output::Wide => Some(node_addresses(&etcd, &keys).await?),
        _ => None,
    };
    let header: Vec<&str> = match output {
        Output::Wide => HEADER.iter().chain(WIDE_HEADER.iter()).copied().collect(),
        _ => HEADER.to_vec(),
    };
    // What each pod's last printed line showed (AGE left out), so that a write that changes nothing
    // shown prints nothing.
    let mut shown: std::collections::HashMap<(String, String), Vec<String>> = Default::default();
    let mut seen = |slot: &(String, String), row: &[String]| {
        let mut key = row.to_vec();
        if key.len() > AGE_COLUMN {
            key[AGE_COLUMN].clear();
        }
        shown.insert(slot.clone(), key.clone()) != Some(key)
    };
    // Listening for ^C from before the first line, so that no interrupt falls between two polls.
    let mut interrupt = if watch {
        use tokio::signal::unix::{signal, SignalKind};
        Some(signal(SignalKind::interrupt()).map_err(|e| format!("listening for ^C: {e}"))?)
    } else {
        None
    };
    let table = if output.structured() {
        let views: Vec<&PodView> = map.values().collect();
        if watch {
            for v in &views {
                println!("{}", serde_json::to_string(v).unwrap_or_default());
            }
        } else {
            print_structured(&views, output);
            return Ok(ExitCode::SUCCESS);
        }
        None
    } else {
        let rows: Vec<Vec<String>> = map
            .values()
            .map(|v| pod_row(v, addresses.as_ref()))
            .collect();
        let mut table = Table::new(&header, &rows);
        if watch {
            // Room for the lines still to come: an id, a node name and a phase of common lengths.
            table = table.at_least(&[16, 8, 9, 5, 8, 4, 8, 15, 15]);
        }
        let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
        println!("{}", table.line(&header));
        for ((slot, _), row) in map.iter().zip(&rows) {
            seen(slot, row);
            println!("{}", table.line(row));
        }
        if !watch {
            return Ok(ExitCode::SUCCESS);
        }
        Some(table)
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let hosts = format!("{}/hosts/", keys.prefix());
    let (_watcher, mut stream) = etcd.watch_prefix(&hosts, rev + 1).await?;
    loop {
        let resp = tokio::select! {
            _ = async { interrupt.as_mut()?.recv().await } => return Ok(ExitCode::SUCCESS),
            msg = stream.message() => match msg {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(CliError::unreachable("the pod watch ended (etcd went away)")),
                Err(e) => return Err(CliError::unreachable(format!("watching pods: {e}"))),
            },
        };
        if resp.canceled() {
            return Err(CliError::unreachable(format!(
                "the pod watch was cancelled by etcd: {}",
                resp.cancel_reason()
            )));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let value = (ev.event_type() == etcd_client::EventType::Put).then(|| kv.value());
            let Some(slot) = apply_key(&mut map, &keys, &key, value, only_node, None) else {
                continue;
            };
            let gone = map
                .get(&slot)
                .is_some_and(|v| v.manifest.is_none() && v.status.is_none());
            if gone {
                if let Some(v) = map.get_mut(&slot) {
                    v.deleted = true;
                }
            }
            let Some(v) = map.get(&slot) else { continue };
            if addresses.as_ref().is_some_and(|a| !a.contains_key(&v.node)) {
                // A node not seen before: read the records again, once (a node without one shows `-`).
                let mut fresh = node_addresses(&etcd, &keys).await?;
                fresh.entry(v.node.clone()).or_insert_with(|| "-".into());
                addresses = Some(fresh);
            }
            let row = pod_row(v, addresses.as_ref());
            // JSON shows every change; the table only those that change what it shows.
            if table.is_none() || seen(&slot, &row) {
                match &table {
                    Some(t) => println!("{}", t.line(&row)),
                    None => println!("{}", serde_json::to_string(v).unwrap_or_default()),
                }
                let _ = std::io::stdout().flush();
            }
            if gone {
                map.remove(&slot);
            }
        }
    }
}

/// The two forms a manifest can be shown in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ManifestFormat {
    /// `apiVersion: v1`, `kind: Pod`, `metadata`, `spec`.
    V1,
    /// The 2014 manifest: `version`, `id`, `containers` (with today's fields).
    Legacy,
}

async fn get(
    id: &str,
    format: Option<ManifestFormat>,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let mut views = views(cluster, Some(&node), Some(id)).await?;
    let Some(mut view) = views.pop() else {
        return Err(CliError::not_found(format!("no pod {id:?} on node {node}")));
    };
    // A pod from a file, URL, HTTP or an etcd list has no pod key: its agent mirrors the manifest in the
    // status.
    if view.manifest.is_none() {
        view.manifest = view.status.as_mut().and_then(|s| s.manifest.take());
    }
    let form = format.map(|f| match f {
        ManifestFormat::V1 => Form::V1,
        ManifestFormat::Legacy => Form::Legacy,
    });
    if let (Some(form), Some(shown)) = (form, &view.manifest) {
        // The view holds the manifest as written; a readable one is shown in the form asked for.
        if let Ok(m) = hostlet_api::parse_manifest(shown.to_string().as_bytes()) {
            view.manifest = Some(hostlet_api::parse::to_value(&m, form));
        }
    }
    let output = if cluster.output == Output::Table {
        Output::Yaml
    } else {
        cluster.output
    };
    print_structured(&view, output);
    Ok(ExitCode::SUCCESS)
}

async fn delete(id: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let deleted = etcd.delete(keys.pod(&node, id)).await?;
    if deleted == 0 {
        let status = etcd.get(keys.pod_status(&node, id)).await?;
        return Err(match status {
            Some(_) => CliError::refused(format!(
                "pod {id:?} on node {node} has no etcd key: it comes from another source (file, URL or HTTP); remove it there"
            )),
            None => CliError::not_found(format!("no pod {id:?} on node {node}")),
        });
    }
    println!("pod/{id} deleted (node {node})");
    Ok(ExitCode::SUCCESS)
}

/// Reads `file` (`-` for stdin) whole.
pub fn read_input(file: &std::path::Path) -> Result<(String, Vec<u8>), CliError> {
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
        Err(e) => Err(super::exit::io_error(&shown, &e)),
    }
}

/// The verdict on each manifest of one input: `(name, errors)` in input order; empty errors = valid.
/// With `allowed`, hostDir volumes are checked against it as the agent checks them.
pub fn judge(
    origin: &str,
    bytes: &[u8],
    allowed: Option<&[PathBuf]>,
    devices: Option<&[String]>,
    level: Option<PodSecurityLevel>,
) -> Result<Vec<(String, Vec<String>)>, CliError> {
    // Input that is no manifest at all is refused like an invalid one.
    let items =
        parse_manifest_list(bytes).map_err(|e| CliError::refused(format!("{origin}: {e}")))?;
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
                let mut errors: Vec<String> =
                    validate(&m).iter().map(ToString::to_string).collect();
                if let Some(allowed) = allowed {
                    errors.extend(hostlet_controllers::pods::spec::host_path_violations(
                        &m, allowed,
                    ));
                }
                if let Some(devices) = devices {
                    errors.extend(hostlet_controllers::pods::spec::device_violations(
                        &m, devices,
                    ));
                }
                if let (Some(level), true) = (level, errors.is_empty()) {
                    errors.extend(check_level(&m, level).iter().map(ToString::to_string));
                }
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

fn validate_file(
    file: &std::path::Path,
    allowed: Option<&[PathBuf]>,
    devices: Option<&[String]>,
    level: PodSecurityLevel,
) -> ExitCode {
    let (origin, bytes) = match read_input(file) {
        Ok(v) => v,
        Err(e) => return e.report(),
    };
    let verdicts = match judge(&origin, &bytes, allowed, devices, Some(level)) {
        Ok(v) => v,
        Err(e) => return e.report(),
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
        Exit::Refused.into()
    }
}
