//! `hostlet token …`: worker join tokens. Each admits joins as a worker only, for a while or a number of
//! joins; etcd keeps its secret's SHA-256 only, so the token is shown once, when it is made.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Subcommand;
use hostlet_api::objects::{JoinToken, Timestamp};
use hostlet_controllers::pki::{put_worker_token, ClusterToken};
use serde::Serialize;

use super::cluster::{print_structured, ClusterArgs, Table};
use super::exit::CliError;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a worker token and print it, alone on stdout (it is not kept: copy it now).
    Create {
        /// It stops admitting joins after this long (`30m`, `24h`, `7d`); without: until revoked.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// It admits this many joins, then no more.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        uses: Option<u32>,
        /// Shown by `token ls`: what it is for.
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the worker tokens: id, description, expiry, uses, state (never a secret).
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Revoke a worker token: joins with it are refused from now on (nodes that joined with it stay).
    Revoke {
        /// The token's id, as `token ls` shows it.
        id: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

pub async fn run(cmd: TokenCommand) -> Result<ExitCode, CliError> {
    match cmd {
        TokenCommand::Create {
            ttl,
            uses,
            description,
            cluster,
        } => create(ttl, uses, description.unwrap_or_default(), &cluster).await,
        TokenCommand::Ls { cluster } => ls(&cluster).await,
        TokenCommand::Revoke { id, cluster } => revoke(&id, &cluster).await,
    }
}

async fn create(
    ttl: Option<Duration>,
    uses: Option<u32>,
    description: String,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    if description.len() > 256 || description.chars().any(char::is_control) {
        return Err(CliError::refused(
            "--description: at most 256 characters, no control characters",
        ));
    }
    // The CA fingerprint lets the joiner check whom it joins before it sends the secret.
    let token_file = cluster.data_dir().join("token");
    let fingerprint = std::fs::read_to_string(&token_file)
        .ok()
        .and_then(|t| ClusterToken::parse(&t).ok())
        .and_then(|t| t.ca_fingerprint);
    let etcd = cluster.connect().await?;
    let secret = put_worker_token(
        &etcd,
        &cluster.keys(),
        &description,
        ttl.map(|t| SystemTime::now() + t),
        uses,
        0,
    )
    .await?;
    let token = ClusterToken {
        ca_fingerprint: fingerprint,
        secret,
    };
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Listed {
    id: String,
    description: String,
    created: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uses: Option<u32>,
    used: u32,
    state: &'static str,
}

async fn ls(cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let (kvs, _) = etcd.get_prefix(cluster.keys().tokens_prefix()).await?;
    let now = SystemTime::now();
    let listed: Vec<Listed> = kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<JoinToken>(kv.value()).ok())
        .map(|t| Listed {
            state: t.state(now).as_str(),
            id: t.id,
            description: t.description,
            created: t.created,
            expires: t.expires,
            uses: t.uses,
            used: t.used,
        })
        .collect();
    if cluster.output.structured() {
        print_structured(&listed, cluster.output);
        return Ok(ExitCode::SUCCESS);
    }
    let header = ["ID", "STATE", "USES", "EXPIRES", "DESCRIPTION"];
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|l| {
            vec![
                l.id.clone(),
                l.state.to_string(),
                match l.uses {
                    Some(u) => format!("{}/{u}", l.used),
                    None => format!("{}/-", l.used),
                },
                l.expires.map_or("never".to_string(), |e| {
                    humantime::format_rfc3339_seconds(e.0).to_string()
                }),
                l.description.clone(),
            ]
        })
        .collect();
    Table::print(&header, &rows);
    Ok(ExitCode::SUCCESS)
}

async fn revoke(id: &str, cluster: &ClusterArgs) -> Result<ExitCode, CliError> {
    let etcd = cluster.connect().await?;
    let key = cluster.keys().join_token(id);
    let Some(kv) = etcd.get(&key).await? else {
        return Err(CliError::not_found(format!("no token {id:?}")));
    };
    let mut t: JoinToken = serde_json::from_slice(kv.value())
        .map_err(|e| CliError::refused(format!("token {id}: {e}")))?;
    t.revoked = true;
    let value = serde_json::to_vec(&t).map_err(|e| CliError::from(e.to_string()))?;
    etcd.put(&key, value).await?;
    println!("token {id} revoked");
    Ok(ExitCode::SUCCESS)
}
