//! `hostlet run`: the agent.
//!
//! Order of a start: bind both listeners (a taken port fails before anything is created), serve
//! `/metrics`, `/healthz`, `/readyz` at once, start (or join, or connect to) etcd, register the node, serve
//! the API, then wait for SIGTERM/SIGINT. A stop goes the other way, the same after a revocation: the
//! API closes, the agent's tasks drain (controllers, then writers, then caches), the node's lease is
//! revoked, etcd gets SIGTERM (SIGKILL after 15 s). A second signal exits at once.

use std::net::{IpAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hostlet_api::objects::{NodeInfo, NodeRole, Timestamp};
use hostlet_api::KeyLayout;
use hostlet_controllers::agent::{
    boot, BootConfig, Datastore, Ended, MemberSettings, Running, SnapshotParts,
};
use hostlet_controllers::disk::{self, DiskPressure, DiskWatch};
use hostlet_controllers::etcd_member::{
    self, DataDirLock, JoinRole, MemberConfig, MemberLayout, MemberMetrics,
};
use hostlet_controllers::pki::{client_tls_files, ClusterToken};
use hostlet_controllers::pods::controller::PodControllerConfig;
use hostlet_controllers::pods::docker::connect_docker;
use hostlet_controllers::sources::url::UrlSourceConfig;
use hostlet_controllers::tombstone::{self, reset::ResetConfig};
use hostlet_runtime::{ComponentHandle, Metrics, Readiness, TlsFiles};
use tokio_util::sync::CancellationToken;

use crate::cli::cluster::{AgentInfo, RunPointer};
use crate::config::{LogFormat, Role, RunConfig};
use crate::server::{self, Listeners};

mod flags;
mod reset;

use flags::*;
use reset::*;

/// Runs the agent with `cfg` (or prints the configuration with `--print-config`).
pub fn run(cfg: RunConfig) -> ExitCode {
    if cfg.print_config {
        let yaml = yaml_serde::to_string(&EffectiveConfig::from(&cfg)).unwrap_or_default();
        print!("{yaml}");
        return ExitCode::SUCCESS;
    }
    init_logging(cfg.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hostlet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(agent(cfg));
    // Tasks still running (and the etcd child they own, if a failure cut the stop short) end here.
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(Some(rejoin)) => reexec_to_rejoin(&rejoin),
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("hostlet: {e:#}");
            exit_of(&e)
        }
    }
}

/// As `hostlet etcd snapshot restore` reports the same inputs: a restore path that does not exist exits
/// 3; a snapshot a reset will not use, a key file that cannot be used, or a reset refused for the
/// cluster's or the member's state exits 4; everything else is a failure (1).
fn exit_of(e: &anyhow::Error) -> ExitCode {
    use crate::cli::exit::Exit;
    use hostlet_controllers::snapshots::encryption::KeyFileError;
    use tombstone::reset::ResetError;
    for c in e.chain() {
        if c.downcast_ref::<KeyFileError>().is_some() {
            return Exit::Refused.into();
        }
        match c.downcast_ref::<ResetError>() {
            Some(ResetError::SnapshotMissing { .. }) => return Exit::NotFound.into(),
            Some(r) if r.is_refusal() => return Exit::Refused.into(),
            _ => {}
        }
    }
    ExitCode::FAILURE
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// First signal: cancel `shutdown`. Second: exit now (the etcd child dies with us through its
/// parent-death signal).
fn watch_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        for n in 0.. {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if n == 0 {
                tracing::info!("{name}: stopping");
                shutdown.cancel();
            } else {
                tracing::warn!("{name} again: exiting now");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

/// Whether `--token` is among the arguments (a secret any user of the host can read there).
fn token_on_command_line(args: impl Iterator<Item = String>) -> bool {
    args.take_while(|a| a != "--")
        .any(|a| a == "--token" || a.starts_with("--token="))
}

/// Runs the agent until it stops; `Some` when it stopped to rejoin the cluster there.
async fn agent(mut cfg: RunConfig) -> anyhow::Result<Option<tombstone::rejoin::RejoinTarget>> {
    etcd_member::install_crypto_provider();
    if cfg.cluster_reset {
        return cluster_reset(&cfg).await.map(|()| None);
    }
    if token_on_command_line(std::env::args()) {
        tracing::warn!("the token was given with --token, on the command line, where every user of this host can read it (ps, /proc/<pid>/cmdline); give it with --token-file, or HOSTLET_TOKEN in a 0600 environment file");
    }
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;

    // A key file that cannot be used stops the start before anything binds.
    let snapshot_key = cfg.snapshot_key()?.map(std::sync::Arc::new);
    let listeners = Listeners::bind(cfg.listen, cfg.metrics_listen)?;
    // Before anything reads or moves the member dir. A data dir that does not exist yet is locked once
    // the start has created it.
    let data_dir_lock = DataDirLock::acquire_if_exists(&cfg.data_dir)?;
    let node = cfg.node_name();
    let keys = KeyLayout::new(&cfg.key_prefix);
    let parts = ProcessParts::new(&cfg, &shutdown)?;

    let metrics_server = tokio::spawn(server::serve_metrics(
        listeners.metrics,
        server::metrics_router(parts.metrics.clone(), parts.readiness.clone()),
        shutdown.clone(),
    ));

    if cfg.token.as_deref().unwrap_or("").is_empty() {
        if let Some(path) = cfg.token_file.clone() {
            match wait_for_token_file(&path, &shutdown).await? {
                Some(t) => cfg.token = Some(t),
                None => {
                    tracing::info!("stopped while waiting for the token file");
                    return Ok(None);
                }
            }
        }
    }

    let disk_events = parts.disk_events.clone();
    let boot_cfg = boot_config(&cfg, &node, keys, snapshot_key, parts)?;
    let Some(mut running) = boot(boot_cfg, &shutdown).await? else {
        return Ok(None);
    };
    let _ = disk_events.set(running.events.clone());
    save_agent_info(&cfg, &node, &running);
    // So that the CLI finds this agent with no --data-dir; removed when the agent stops.
    let _run_pointer = RunPointer::leave(&cfg.data_dir);
    // Held until the agent has stopped.
    let _data_dir_lock = data_dir_lock.or_else(|| {
        DataDirLock::acquire(&cfg.data_dir)
            .map_err(|e| tracing::warn!("{e}"))
            .ok()
    });

    let api_server = tokio::spawn(server::serve_api(
        listeners.api,
        server::api_router(
            running.api_routes.clone(),
            running.token.clone(),
            running.roles.clone().map(|roles| server::CertAccess {
                node: running.node.clone(),
                roles,
                revocations: running.revocations(),
                deleted: running.revoked.clone(),
            }),
        ),
        running.api_tls.clone(),
        running.api_client_ca.clone(),
        running.api_tls_reload.clone(),
        server::ApiLimits::default(),
        shutdown.clone(),
    ));
    tracing::info!(node = %node, api = %cfg.listen, metrics = %cfg.metrics_listen, "hostlet running");

    let mut api_server = api_server;
    let mut server_ended = false;
    let revoked = running.revoked.clone();
    let mut failed = tokio::select! {
        biased;
        _ = shutdown.cancelled() => None,
        _ = revoked.cancelled() => None,
        r = wait_server(&mut api_server) => {
            server_ended = true;
            (!shutdown.is_cancelled()).then_some(r)
        }
    };
    if revoked.is_cancelled() && !shutdown.is_cancelled() && !server_ended {
        // Deleted: the controllers have stopped and the pods run on; the agent's tasks drain and the
        // lease goes now, and /readyz says why until the host's operator stops this agent.
        running.stop_revoked().await;
        failed = tokio::select! {
            biased;
            _ = shutdown.cancelled() => None,
            r = wait_server(&mut api_server) => {
                server_ended = true;
                (!shutdown.is_cancelled()).then_some(r)
            }
        };
    }
    // The one stop, revoked or not: the tasks drain, the lease goes, the member stops.
    shutdown.cancel();
    let ended = running.stop().await;
    if !server_ended {
        // Its graceful shutdown began with the stop.
        let _ = tokio::time::timeout(Duration::from_secs(3), api_server).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), metrics_server).await;
    if let Some(r) = failed {
        return r.context("--listen").map(|()| None);
    }
    tracing::info!("stopped");
    Ok(match ended {
        Ended::Stopped => None,
        Ended::Rejoin(t) => Some(t),
    })
}

/// `--token-file`: the token another node writes (the first node of a compose cluster, on a shared
/// volume), waited for while the file does not exist; `None` when asked to stop meanwhile. The writer
/// renames the file into place, so a file that is there but holds no token is an error, not a half-write.
async fn wait_for_token_file(
    path: &std::path::Path,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<String>> {
    let started = std::time::Instant::now();
    let mut told = None::<std::time::Instant>;
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                ClusterToken::parse(&text)
                    .with_context(|| format!("--token-file {}", path.display()))?;
                return Ok(Some(text.trim().to_string()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if told.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                    tracing::info!(
                        waited_seconds = started.elapsed().as_secs(),
                        "waiting for the token file {} to appear",
                        path.display()
                    );
                    told = Some(std::time::Instant::now());
                }
            }
            Err(e) => {
                return Err(e).with_context(|| format!("--token-file {}", path.display()));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Starts this same program again, in place (same pid), as a joiner: the tombstone makes the start back the
/// member dir up and join through `r.server`. Pods keep running meanwhile and are adopted.
fn reexec_to_rejoin(r: &tombstone::rejoin::RejoinTarget) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    let mut skip_value = false;
    for a in std::env::args_os().skip(1) {
        if skip_value {
            skip_value = false;
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--server" || s == "--token" {
            skip_value = true;
            continue;
        }
        if s.starts_with("--server=") || s.starts_with("--token=") {
            continue;
        }
        args.push(a);
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    tracing::info!(server = %r.server, "starting again to rejoin");
    let err = std::process::Command::new(exe)
        .args(args)
        .env("HOSTLET_SERVER", &r.server)
        .env("HOSTLET_TOKEN", &r.token)
        .exec();
    eprintln!("hostlet: cannot start again to rejoin: {err}");
    ExitCode::FAILURE
}

async fn wait_server(h: &mut tokio::task::JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    match h.await {
        Ok(r) => r.and_then(|()| Err(anyhow::anyhow!("the API server stopped"))),
        Err(e) => Err(anyhow::anyhow!("the API server failed: {e}")),
    }
}

/// The configuration in force, with derived defaults filled in (node name, snapshot dir).
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
struct EffectiveConfig<'a> {
    node_name: String,
    snapshot_dir: std::path::PathBuf,
    embedded_etcd: bool,
    #[serde(flatten)]
    flags: &'a RunConfig,
}

impl<'a> From<&'a RunConfig> for EffectiveConfig<'a> {
    fn from(c: &'a RunConfig) -> Self {
        EffectiveConfig {
            node_name: c.node_name(),
            snapshot_dir: c.snapshot_dir(),
            embedded_etcd: c.embedded_etcd(),
            flags: c,
        }
    }
}

#[cfg(test)]
mod token_tests {
    use super::token_on_command_line;

    #[test]
    fn a_token_on_the_command_line_is_noticed_and_a_token_file_is_not() {
        let args = |a: &[&str]| {
            a.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert!(token_on_command_line(args(&[
            "hostlet", "run", "--token", "H10::x"
        ])));
        assert!(token_on_command_line(args(&[
            "hostlet",
            "run",
            "--token=H10::x"
        ])));
        assert!(!token_on_command_line(args(&[
            "hostlet",
            "run",
            "--token-file",
            "/t"
        ])));
        assert!(!token_on_command_line(args(&[
            "hostlet",
            "run",
            "--token-file=/t"
        ])));
        assert!(!token_on_command_line(args(&["hostlet", "run"])));
        assert!(!token_on_command_line(args(&[
            "hostlet", "run", "--", "--token"
        ])));
    }
}
