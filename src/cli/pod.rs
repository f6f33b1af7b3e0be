//! `hostlet pod …`: pod manifests.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::manifest::Form;
use hostlet_api::objects::{PodStatus, Timestamp};
use hostlet_api::validation::{resolve, validate, SourceKind, SourcedPod};
use hostlet_api::{parse_manifest_list, Key, PodManifest};

use super::cluster::{print_structured, print_table, ClusterArgs, Output};
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
    },
    /// Validate, then write each pod to `/hostlet/hosts/<node>/pods/<id>`. Nothing is written if any is invalid.
    Apply {
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List pods with their status.
    Ls {
        /// Every node's pods, not only this node's.
        #[arg(short = 'A', long)]
        all_nodes: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show one pod: its manifest and status (YAML unless -o json).
    Get {
        id: String,
        /// The form of the manifest shown: a Kubernetes v1 Pod or the 2014 manifest (default: as written).
        #[arg(long, value_enum, value_name = "FORM")]
        format: Option<ManifestFormat>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a pod's key; the agent stops and removes its containers.
    Delete {
        id: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

pub fn execute(cmd: PodCommand) -> ExitCode {
    match cmd {
        PodCommand::Validate {
            file,
            allowed_host_paths,
        } => validate_file(&file, allowed_host_paths.as_deref()),
        PodCommand::Apply { file, cluster } => block_on(apply(&file, &cluster)),
        PodCommand::Ls { all_nodes, cluster } => block_on(ls(all_nodes, &cluster)),
        PodCommand::Get {
            id,
            format,
            cluster,
        } => block_on(get(&id, format, &cluster)),
        PodCommand::Delete { id, cluster } => block_on(delete(&id, &cluster)),
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
    let verdicts = judge(&origin, &bytes, None)?;
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
}

async fn views(
    cluster: &ClusterArgs,
    node: Option<&str>,
    only: Option<&str>,
) -> Result<Vec<PodView>, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let hosts = format!("{}/hosts/", keys.prefix());
    let (kvs, _) = etcd.get_prefix(&hosts).await?;
    let mut map: std::collections::BTreeMap<(String, String), PodView> = Default::default();
    for kv in &kvs {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let (n, id, is_status) = match keys.parse(&key) {
            Some(Key::Pod { node, pod }) => (node, pod, false),
            Some(Key::PodStatus { node, pod }) => (node, pod, true),
            _ => continue,
        };
        if node.is_some_and(|want| want != n) || only.is_some_and(|want| want != id) {
            continue;
        }
        let view = map
            .entry((n.clone(), id.clone()))
            .or_insert_with(|| PodView {
                id,
                node: n,
                manifest: None,
                status: None,
            });
        if is_status {
            view.status = serde_json::from_slice(kv.value()).ok();
        } else {
            view.manifest = Some(match hostlet_api::parse_manifest(kv.value()) {
                Ok(m) => manifest_value(&m, m.form),
                Err(e) => serde_json::json!({ "invalid": e.to_string() }),
            });
        }
    }
    Ok(map.into_values().collect())
}

fn age(since: Option<Timestamp>) -> String {
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

async fn ls(all_nodes: bool, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let node = cluster.node();
    let views = views(cluster, (!all_nodes).then_some(node.as_str()), None).await?;
    if cluster.output != Output::Table {
        print_structured(&views, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let s = v.status.as_ref();
            let (ready, total) = s
                .map(|s| {
                    (
                        s.containers.iter().filter(|c| c.ready).count(),
                        s.containers.len(),
                    )
                })
                .unwrap_or((0, 0));
            vec![
                v.id.clone(),
                v.node.clone(),
                s.map(|s| format!("{:?}", s.phase))
                    .unwrap_or_else(|| "Pending".into()),
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
            ]
        })
        .collect();
    print_table(
        &["ID", "NODE", "PHASE", "READY", "RESTARTS", "AGE", "SOURCE"],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// The two forms a manifest can be shown in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ManifestFormat {
    /// `apiVersion: v1`, `kind: Pod`, `metadata`, `spec`.
    V1,
    /// The 2014 manifest: `version`, `id`, `containers` (with today's fields).
    Legacy,
}

/// A manifest as JSON in the form asked for (through the serialiser that writes the keys, so it reads
/// back as the same pod).
fn manifest_value(m: &PodManifest, form: Form) -> serde_json::Value {
    let shown = match form {
        Form::V1 => hostlet_api::v1::as_v1(m),
        Form::Legacy => hostlet_api::v1::as_legacy(m),
    };
    serde_json::from_str(&hostlet_api::parse::to_json(&shown)).unwrap_or_default()
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
    let form = format.map(|f| match f {
        ManifestFormat::V1 => Form::V1,
        ManifestFormat::Legacy => Form::Legacy,
    });
    if let (Some(form), Some(shown)) = (form, &view.manifest) {
        // The view holds the manifest as written; a readable one is shown in the form asked for.
        if let Ok(m) = hostlet_api::parse_manifest(shown.to_string().as_bytes()) {
            view.manifest = Some(manifest_value(&m, form));
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

fn validate_file(file: &std::path::Path, allowed: Option<&[PathBuf]>) -> ExitCode {
    let (origin, bytes) = match read_input(file) {
        Ok(v) => v,
        Err(e) => return e.report(),
    };
    let verdicts = match judge(&origin, &bytes, allowed) {
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
