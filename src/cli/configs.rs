//! `hostlet config …` and `hostlet secret …`: ConfigMaps and Secrets, cluster-wide objects that pods use
//! by name. A secret's values are never printed unless asked for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use hostlet_api::configs::{ConfigMap, Secret, SecretsEncryption};
use hostlet_api::manifest::ConfigKind;
use hostlet_api::KeyLayout;
use hostlet_controllers::secrets::SecretKeys;
use serde::Serialize;

use super::cluster::{print_structured, ClusterArgs, Output, Table};
use super::exit::CliError;
use super::pod::{block_on, read_input};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a ConfigMap (YAML or JSON) and write it; pods that mount it see the change within seconds.
    Apply {
        /// The ConfigMap file; `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Write a ConfigMap from literal values and files (replacing one of that name).
    Create {
        /// The object's name (a DNS subdomain).
        name: String,
        #[command(flatten)]
        from: FromArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the ConfigMaps.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show one ConfigMap (YAML unless -o json).
    Get {
        /// The object's name (a DNS subdomain).
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a ConfigMap. Pods that mount it keep the files they have; a pod not yet started waits for it.
    Delete {
        /// The object's name (a DNS subdomain).
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Validate a Secret (YAML or JSON, type Opaque, `data` in base64 or `stringData`) and write it.
    Apply {
        /// The Secret file; `-` reads stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Write an Opaque Secret from files and literal values (replacing one of that name). Prefer
    /// `--from-file KEY=-` (stdin) or a file to `--from-literal`: a command line is seen by every user
    /// of the host and kept in shell history.
    Create {
        /// The object's name (a DNS subdomain).
        name: String,
        #[command(flatten)]
        from: FromArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the Secrets (names, types and key counts; never values).
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show one Secret with each value replaced by its length, unless --show-values.
    Get {
        /// The object's name (a DNS subdomain).
        name: String,
        /// Print the values (base64, as in `data`).
        #[arg(long)]
        show_values: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a Secret. Pods that mount it keep the files they have; a pod not yet started waits for it.
    Delete {
        /// The object's name (a DNS subdomain).
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Put the next secret key in force and reseal every Secret under it (run on a node of the cluster).
    RotateKey {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Debug, clap::Args)]
pub struct FromArgs {
    /// A key and its value, `KEY=VALUE`; repeatable.
    #[arg(long = "from-literal", value_name = "KEY=VALUE")]
    literals: Vec<String>,
    /// A file's bytes under `KEY` (`KEY=PATH`), or under the file's name (`PATH`); `KEY=-` reads stdin.
    #[arg(long = "from-file", value_name = "[KEY=]PATH")]
    files: Vec<String>,
}

pub fn execute_config(cmd: ConfigCommand) -> ExitCode {
    let kind = ConfigKind::ConfigMap;
    match cmd {
        ConfigCommand::Apply { file, cluster } => block_on(apply(kind, &file, &cluster)),
        ConfigCommand::Create {
            name,
            from,
            cluster,
        } => block_on(create(kind, &name, &from, &cluster)),
        ConfigCommand::Ls { cluster } => block_on(ls(kind, &cluster)),
        ConfigCommand::Get { name, cluster } => block_on(get(kind, &name, true, &cluster)),
        ConfigCommand::Delete { name, cluster } => block_on(delete(kind, &name, &cluster)),
    }
}

pub fn execute_secret(cmd: SecretCommand) -> ExitCode {
    let kind = ConfigKind::Secret;
    match cmd {
        SecretCommand::Apply { file, cluster } => block_on(apply(kind, &file, &cluster)),
        SecretCommand::Create {
            name,
            from,
            cluster,
        } => block_on(create(kind, &name, &from, &cluster)),
        SecretCommand::Ls { cluster } => block_on(ls(kind, &cluster)),
        SecretCommand::Get {
            name,
            show_values,
            cluster,
        } => block_on(get(kind, &name, show_values, &cluster)),
        SecretCommand::Delete { name, cluster } => block_on(delete(kind, &name, &cluster)),
        SecretCommand::RotateKey { cluster } => block_on(rotate_key(&cluster)),
    }
}

/// One object of either kind, normalised and checked.
enum Object {
    ConfigMap(ConfigMap),
    Secret(Secret),
}

impl Object {
    fn parse(kind: ConfigKind, bytes: &[u8]) -> Result<Object, hostlet_api::ParseError> {
        Ok(match kind {
            ConfigKind::ConfigMap => Object::ConfigMap(ConfigMap::parse(bytes)?),
            ConfigKind::Secret => Object::Secret(Secret::parse(bytes)?),
        })
    }

    /// An object as etcd holds it, a secret opened. Messages never quote a secret's text.
    fn stored(kind: ConfigKind, bytes: &[u8], keys: Option<&SecretKeys>) -> Result<Object, String> {
        match Object::parse(kind, bytes) {
            Ok(Object::Secret(s)) if s.encrypted.is_some() => match keys {
                Some(k) => k.open(&s).map(Object::Secret),
                None => Err(NO_MATERIAL.to_string()),
            },
            Ok(o) => Ok(o),
            Err(_) if kind == ConfigKind::Secret => Err("not a Secret".to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn of_entries(kind: ConfigKind, name: &str, entries: BTreeMap<String, Vec<u8>>) -> Object {
        match kind {
            ConfigKind::ConfigMap => Object::ConfigMap(ConfigMap::from_entries(name, entries)),
            ConfigKind::Secret => Object::Secret(Secret::from_entries(name, entries)),
        }
    }

    fn name(&self) -> &str {
        match self {
            Object::ConfigMap(c) => &c.metadata.name,
            Object::Secret(s) => &s.metadata.name,
        }
    }

    fn validate(&self) -> Vec<hostlet_api::FieldError> {
        match self {
            Object::ConfigMap(c) => c.validate(),
            Object::Secret(s) => s.validate(),
        }
    }

    fn entries(&self) -> BTreeMap<String, Vec<u8>> {
        match self {
            Object::ConfigMap(c) => c.entries(),
            Object::Secret(s) => s.entries(),
        }
    }

    fn to_json(&self) -> String {
        match self {
            Object::ConfigMap(c) => serde_json::to_string(c),
            Object::Secret(s) => serde_json::to_string(s),
        }
        .unwrap_or_default()
    }
}

const NO_MATERIAL: &str = "this data dir holds no material to seal or open secrets (tls/ca.key or token): run this on a node of the cluster, or give its --data-dir";

/// What seals and opens secrets from this host: its node's material.
fn secret_keys(cluster: &ClusterArgs) -> Option<SecretKeys> {
    SecretKeys::for_node(&cluster.data_dir(), None)
}

/// The key id new writes use.
async fn active_key(etcd: &hostlet_runtime::Etcd, keys: &KeyLayout) -> Result<String, CliError> {
    let v = etcd.get(keys.secrets_encryption()).await?;
    SecretsEncryption::active(v.as_ref().map(|kv| kv.value())).map_err(CliError::refused)
}

fn key_of(keys: &KeyLayout, kind: ConfigKind, name: &str) -> String {
    match kind {
        ConfigKind::ConfigMap => keys.config_map(name),
        ConfigKind::Secret => keys.secret(name),
    }
}

fn prefix_of(keys: &KeyLayout, kind: ConfigKind) -> String {
    match kind {
        ConfigKind::ConfigMap => keys.config_maps_prefix(),
        ConfigKind::Secret => keys.secrets_prefix(),
    }
}

/// Checks the object and writes it; says created, configured or unchanged.
async fn write(
    kind: ConfigKind,
    obj: Object,
    origin: &str,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let errors = obj.validate();
    if !errors.is_empty() {
        eprintln!("{origin}: invalid");
        for e in &errors {
            eprintln!("  {e}");
        }
        return Err(CliError::refused(format!(
            "{origin}: nothing written: fix the errors above"
        )));
    }
    let secret_keys = secret_keys(cluster);
    if kind == ConfigKind::Secret && secret_keys.is_none() {
        return Err(CliError::refused(NO_MATERIAL));
    }
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let key = key_of(&keys, kind, obj.name());
    let verb = match etcd.get(&key).await? {
        None => "created",
        Some(kv) => match Object::stored(kind, kv.value(), secret_keys.as_ref()) {
            Ok(old) if old.to_json() == obj.to_json() => "unchanged",
            _ => "configured",
        },
    };
    if verb != "unchanged" {
        let value = match (&obj, &secret_keys) {
            (Object::Secret(s), Some(k)) => {
                let id = active_key(&etcd, &keys).await?;
                serde_json::to_string(&k.seal(s, &id).map_err(CliError::from)?)
                    .map_err(|e| CliError::from(e.to_string()))?
            }
            _ => obj.to_json(),
        };
        etcd.put(&key, value).await?;
    }
    println!("{}/{} {verb}", kind.noun(), obj.name());
    Ok(ExitCode::SUCCESS)
}

async fn apply(kind: ConfigKind, file: &Path, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let (origin, bytes) = read_input(file)?;
    let obj =
        Object::parse(kind, &bytes).map_err(|e| CliError::refused(format!("{origin}: {e}")))?;
    write(kind, obj, &origin, cluster).await
}

async fn create(
    kind: ConfigKind,
    name: &str,
    from: &FromArgs,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let entries = gather(from)?;
    let obj = Object::of_entries(kind, name, entries);
    write(kind, obj, &format!("{} {name:?}", kind.noun()), cluster).await
}

/// The keys and values of `--from-literal` and `--from-file`, each key once.
fn gather(from: &FromArgs) -> Result<BTreeMap<String, Vec<u8>>, CliError> {
    let mut out = BTreeMap::new();
    let mut add = |key: String, value: Vec<u8>, what: &str| -> Result<(), CliError> {
        hostlet_api::configs::check_data_key(&key)
            .map_err(|why| CliError::refused(format!("{what}: {why}")))?;
        if out.insert(key.clone(), value).is_some() {
            return Err(CliError::refused(format!(
                "{what}: key {key:?} given twice"
            )));
        }
        Ok(())
    };
    for l in &from.literals {
        // The value is never echoed: only the key is named.
        let Some((k, v)) = l.split_once('=') else {
            return Err(CliError::refused(
                "--from-literal: expected KEY=VALUE (no '=' found)".to_string(),
            ));
        };
        add(k.to_string(), v.as_bytes().to_vec(), "--from-literal")?;
    }
    for f in &from.files {
        let (key, path) = match f.split_once('=') {
            Some((k, p)) => (k.to_string(), PathBuf::from(p)),
            None => {
                let p = PathBuf::from(f);
                let Some(base) = p.file_name().map(|b| b.to_string_lossy().into_owned()) else {
                    return Err(CliError::refused(format!(
                        "--from-file {f:?}: no file name to use as the key; give KEY=PATH"
                    )));
                };
                (base, p)
            }
        };
        let (_, bytes) = read_input(&path)?;
        add(key, bytes, &format!("--from-file {}", path.display()))?;
    }
    if out.is_empty() {
        return Err(CliError::refused(
            "give at least one --from-literal or --from-file".to_string(),
        ));
    }
    Ok(out)
}

#[derive(Serialize)]
struct Listed {
    /// The object's name (a DNS subdomain).
    name: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<String>,
    keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn ls(kind: ConfigKind, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let prefix = prefix_of(&keys, kind);
    let (kvs, _) = etcd.get_prefix(&prefix).await?;
    let secret_keys = secret_keys(cluster);
    let mut listed = Vec::new();
    for kv in kvs {
        let name = String::from_utf8_lossy(kv.key())
            .trim_start_matches(prefix.as_str())
            .to_string();
        let parsed = Object::stored(kind, kv.value(), secret_keys.as_ref());
        let (type_, names, error) = match parsed {
            Ok(Object::Secret(s)) => (s.type_.clone(), s.entries().into_keys().collect(), None),
            Ok(o) => (None, o.entries().into_keys().collect(), None),
            Err(e) => (None, Vec::new(), Some(e)),
        };
        listed.push(Listed {
            name,
            type_,
            keys: names,
            error,
        });
    }
    if cluster.output.structured() {
        print_structured(&listed, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let secret = kind == ConfigKind::Secret;
    let mut header = vec!["NAME"];
    if secret {
        header.push("TYPE");
    }
    header.push("DATA");
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|l| {
            let mut r = vec![l.name.clone()];
            if secret {
                r.push(l.type_.clone().unwrap_or_default());
            }
            r.push(match &l.error {
                Some(e) => format!("unreadable: {e}"),
                None => l.keys.len().to_string(),
            });
            r
        })
        .collect();
    Table::print(&header, &rows);
    Ok(ExitCode::SUCCESS)
}

async fn get(
    kind: ConfigKind,
    name: &str,
    show_values: bool,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let Some(kv) = etcd.get(key_of(&keys, kind, name)).await? else {
        return Err(CliError::not_found(format!("no {} {name:?}", kind.noun())));
    };
    let output = if cluster.output == Output::Table {
        Output::Yaml
    } else {
        cluster.output
    };
    match Object::stored(kind, kv.value(), secret_keys(cluster).as_ref()) {
        Ok(Object::ConfigMap(c)) => print_structured(&c, output),
        Ok(Object::Secret(s)) if show_values => print_structured(&s, output),
        Ok(Object::Secret(s)) => print_structured(&s.redacted(), output),
        Err(why) => {
            return Err(CliError::refused(format!(
                "{} {name:?}: {why}",
                kind.noun()
            )));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn delete(kind: ConfigKind, name: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    if etcd.delete(key_of(&keys, kind, name)).await? == 0 {
        return Err(CliError::not_found(format!("no {} {name:?}", kind.noun())));
    }
    println!("{}/{name} deleted", kind.noun());
    Ok(ExitCode::SUCCESS)
}

/// Names the next key id, then reseals every secret under it (each only if nobody wrote it meanwhile;
/// then it is read again). Refuses before changing anything if a secret cannot be opened.
async fn rotate_key(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let Some(secret_keys) = secret_keys(cluster) else {
        return Err(CliError::refused(NO_MATERIAL));
    };
    let etcd = cluster.connect().await?;
    let keys = cluster.keys();
    let (kvs, _) = etcd.get_prefix(keys.secrets_prefix()).await?;
    for kv in &kvs {
        if let Err(why) = Object::stored(ConfigKind::Secret, kv.value(), Some(&secret_keys)) {
            return Err(CliError::refused(format!(
                "{}: {why}; nothing changed",
                String::from_utf8_lossy(kv.key())
            )));
        }
    }
    let current = active_key(&etcd, &keys).await?;
    let next = SecretsEncryption::next(&current)
        .ok_or_else(|| CliError::refused(format!("no key id after {current}")))?;
    let record = serde_json::to_string(&SecretsEncryption {
        key_id: next.clone(),
    })
    .map_err(|e| CliError::from(e.to_string()))?;
    etcd.put(keys.secrets_encryption(), record).await?;
    let mut resealed = 0;
    for kv in kvs {
        let key = kv.key().to_vec();
        let mut kv = Some(kv);
        // A secret written meanwhile is read again; a deleted one is left gone.
        for _ in 0..5 {
            let Some(cur) = kv.take() else { break };
            let Ok(Object::Secret(open)) =
                Object::stored(ConfigKind::Secret, cur.value(), Some(&secret_keys))
            else {
                break;
            };
            let sealed = secret_keys.seal(&open, &next).map_err(CliError::from)?;
            let value =
                serde_json::to_string(&sealed).map_err(|e| CliError::from(e.to_string()))?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    cur.mod_revision(),
                )])
                .and_then([TxnOp::put(key.clone(), value, None)]);
            if etcd.txn(txn).await?.succeeded() {
                resealed += 1;
                break;
            }
            kv = etcd.get(&key).await?;
        }
    }
    println!("secret key {next} in force (was {current}); {resealed} secrets resealed");
    Ok(ExitCode::SUCCESS)
}
