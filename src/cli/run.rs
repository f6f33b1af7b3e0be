//! `hostlet run`: the agent.
//!
//! Order of a start: bind both listeners (a taken port fails before anything is created), serve
//! `/metrics`, `/healthz`, `/readyz` at once, start (or join, or connect to) etcd, register the node, serve
//! the API, then wait for SIGTERM/SIGINT. A stop goes the other way: the API closes, the node's lease is
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
use hostlet_controllers::disk::{self, DiskWatch};
use hostlet_controllers::etcd_member::{
    self, bootstrap::client_tls_files, ClusterToken, DataDirLock, JoinRole, MemberConfig,
    MemberLayout, MemberMetrics,
};
use hostlet_controllers::pods::controller::PodControllerConfig;
use hostlet_controllers::pods::docker::connect_docker;
use hostlet_controllers::sources::url::UrlSourceConfig;
use hostlet_controllers::tombstone::{self, reset::ResetConfig};
use hostlet_runtime::{Metrics, Readiness, TlsFiles};
use tokio_util::sync::CancellationToken;

use crate::cli::cluster::{AgentInfo, RunPointer};
use crate::config::{LogFormat, Role, RunConfig};
use crate::server::{self, Listeners};

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

/// The host's primary address: the first non-loopback address its name resolves to, else loopback.
fn primary_address() -> String {
    let host = crate::config::hostname();
    (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.find(|a| a.is_ipv4() && !a.ip().is_loopback()))
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".to_string())
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

/// Runs the agent until it stops; `Some` when it stopped to rejoin the cluster there.
async fn agent(mut cfg: RunConfig) -> anyhow::Result<Option<tombstone::rejoin::RejoinTarget>> {
    etcd_member::install_crypto_provider();
    if cfg.cluster_reset {
        return cluster_reset(&cfg).await.map(|()| None);
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
    let metrics = Metrics::new();
    metrics
        .register_build_info(env!("CARGO_PKG_VERSION"), env!("HOSTLET_GIT_COMMIT"))
        .context("registering the build info metric")?;
    let member_metrics = MemberMetrics::register(metrics.registry())
        .context("registering the etcd member metrics")?;
    let readiness = Readiness::default();
    // Every component is on the list before anything serves: `/readyz` must not say ready while a
    // component that registers later (the node record, Docker, the caches) has not started.
    let node_ready = readiness.register("node");
    let docker_ready = readiness.register("docker");
    let caches_ready = readiness.register("caches");
    readiness.register(etcd_member::READINESS_COMPONENT);
    // Free space under the data dir and Docker's root, watched from before the member starts.
    let mut watched = vec![cfg.data_dir.clone()];
    if !cfg.snapshot_dir().starts_with(&cfg.data_dir) {
        watched.push(cfg.snapshot_dir());
    }
    let (disk_watch, disk) = DiskWatch::new(
        watched,
        crate::config::parse_percent(&cfg.disk_min_free).map_err(anyhow::Error::msg)?,
        metrics.registry(),
        readiness.register(disk::READINESS_COMPONENT),
    )
    .context("registering the disk metrics")?;
    let disk_watch = match connect_docker(cfg.docker_host.as_deref()) {
        Ok(d) => disk_watch.with_docker(d),
        Err(_) => disk_watch,
    };
    let disk_events = disk_watch.events();
    tokio::spawn(disk_watch.run(shutdown.clone()));

    let metrics_server = tokio::spawn(server::serve_metrics(
        listeners.metrics,
        server::metrics_router(metrics.clone(), readiness.clone()),
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

    let advertise = advertise_address(&cfg);
    let listen_ip = cfg.listen.ip();
    let api_host = if listen_ip.is_unspecified() {
        advertise.clone()
    } else {
        listen_ip.to_string()
    };
    let datastore = if cfg.embedded_etcd() {
        Datastore::Member(Box::new(member_config(&cfg, &node, &advertise)?))
    } else {
        Datastore::External {
            endpoints: cfg.etcd_endpoints.clone(),
            tls: external_tls(&cfg)?,
            token: cfg.token.clone(),
        }
    };
    let boot_cfg = BootConfig {
        node: node.clone(),
        keys,
        data_dir: cfg.data_dir.clone(),
        datastore,
        insecure: cfg.etcd_insecure,
        voters: cfg.etcd_voters,
        node_info: node_info(&cfg, &node, &advertise),
        api_host_port: host_port(&api_host, cfg.listen.port()),
        member: member_settings(&cfg, snapshot_key, &disk)?,
        pods: pods_config(&cfg, &node, docker_ready, caches_ready)?,
        metrics,
        member_metrics,
        readiness,
        node_ready,
        disk,
    };
    let Some(running) = boot(boot_cfg, &shutdown).await? else {
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
        server::api_router(running.api_routes.clone(), running.token.clone()),
        running.api_tls.clone(),
        shutdown.clone(),
    ));
    tracing::info!(node = %node, api = %cfg.listen, metrics = %cfg.metrics_listen, "hostlet running");

    let failed = tokio::select! {
        biased;
        _ = shutdown.cancelled() => None,
        r = wait_server(api_server) => (!shutdown.is_cancelled()).then_some(r),
    };
    shutdown.cancel();
    let ended = running.stop().await;
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

/// The node record as the flags make it; the boot adds the member's part and the API's URL.
fn node_info(cfg: &RunConfig, node: &str, advertise: &str) -> NodeInfo {
    NodeInfo {
        name: node.to_string(),
        address: advertise.to_string(),
        member_name: None,
        member_id: None,
        peer_url: None,
        client_url: None,
        api_url: None,
        version: env!("CARGO_PKG_VERSION").to_string(),
        started: Timestamp::now(),
        role: match cfg.role {
            Role::Auto => None,
            Role::Voter => Some(NodeRole::Voter),
            Role::Worker => Some(NodeRole::Worker),
        },
        failure_domain: cfg.failure_domain.clone().filter(|d| !d.is_empty()),
        member_since: None,
    }
}

/// What a member's controllers are set up with, from the flags.
fn member_settings(
    cfg: &RunConfig,
    snapshot_key: Option<std::sync::Arc<hostlet_controllers::snapshots::encryption::SnapshotKey>>,
    disk: &hostlet_controllers::disk::DiskPressure,
) -> anyhow::Result<MemberSettings> {
    Ok(MemberSettings {
        server: cfg.server.clone(),
        token: cfg.token.clone(),
        learner_stall_timeout: cfg.learner_stall_timeout,
        voter_replace_after: cfg.voter_replace_after,
        snapshots: SnapshotParts {
            dir: cfg.snapshot_dir(),
            schedule: cfg.snapshot_schedule.clone(),
            retention: cfg.snapshot_retention,
            compress: cfg.snapshot_compress,
            disabled: cfg.disable_snapshots,
            s3: cfg.s3.flags(Some(cfg.snapshot_s3_retention)),
            key: snapshot_key,
            disk: Some(disk.clone()),
        },
        upkeep: upkeep_config(cfg)?,
    })
}

/// The pod controller's configuration, from the flags.
fn pods_config(
    cfg: &RunConfig,
    node: &str,
    docker_ready: hostlet_runtime::ComponentHandle,
    caches_ready: hostlet_runtime::ComponentHandle,
) -> anyhow::Result<PodControllerConfig> {
    let mut pods_cfg = PodControllerConfig::new(node, &cfg.data_dir);
    pods_cfg.key_prefix = cfg.key_prefix.clone();
    pods_cfg.docker_host = cfg.docker_host.clone();
    pods_cfg.pause_image = cfg.pause_image.clone();
    pods_cfg.log_limits = hostlet_controllers::pods::docker::LogLimits {
        max_size_bytes: crate::config::parse_byte_size(&cfg.container_log_max_size)
            .map_err(|e| anyhow::anyhow!("--container-log-max-size: {e}"))?,
        max_files: cfg.container_log_max_files,
    };
    pods_cfg.allowed_host_paths = cfg.allowed_host_paths.clone();
    pods_cfg.pod_security = cfg
        .pod_security
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--pod-security: {e}"))?;
    pods_cfg.pids_limit = Some(cfg.pod_pids_limit);
    pods_cfg.image_gc = Some(cfg.image_gc().map_err(anyhow::Error::msg)?);
    pods_cfg.cgroup_parent = cfg.pods_cgroup_parent.clone().filter(|p| !p.is_empty());
    pods_cfg.reserved_cpu_millis = cfg
        .pods_reserved_cpu
        .as_deref()
        .map(crate::config::parse_cpu_millis)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--pods-reserved-cpu: {e}"))?;
    pods_cfg.reserved_memory_bytes = cfg
        .pods_reserved_memory
        .as_deref()
        .map(crate::config::parse_byte_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--pods-reserved-memory: {e}"))?
        .map(|b| i64::try_from(b).unwrap_or(i64::MAX));
    pods_cfg.reserved_host_ports = [
        (cfg.etcd_client_port, "the etcd client port"),
        (cfg.etcd_peer_port, "the etcd peer port"),
        (cfg.listen.port(), "the agent's API"),
        (cfg.metrics_listen.port(), "the agent's metrics"),
    ]
    .into_iter()
    .map(|(p, what)| (p, what.to_string()))
    .chain(
        cfg.reserved_host_ports
            .iter()
            .map(|p| (*p, "--reserved-host-ports".to_string())),
    )
    .filter(|(p, _)| *p != 0)
    .collect();
    pods_cfg.docker_readiness = Some(docker_ready);
    pods_cfg.caches_readiness = Some(caches_ready);
    pods_cfg.manifest_path = cfg.manifest_path.clone();
    pods_cfg.manifest_url = cfg.manifest_url.as_ref().map(|u| {
        let mut c = UrlSourceConfig::new(u.clone());
        c.headers = cfg.manifest_url_header.clone();
        c.max_bytes = cfg.manifest_url_max_bytes;
        c
    });
    Ok(pods_cfg)
}

/// What the CLI beside the agent reads to find the cluster.
fn save_agent_info(cfg: &RunConfig, node: &str, running: &Running) {
    let agent_info = AgentInfo {
        node: node.to_string(),
        endpoints: running.endpoints.clone(),
        key_prefix: cfg.key_prefix.clone(),
        tls: running.etcd_tls,
        api_url: Some(running.api_url.clone()),
        snapshots: Some(crate::cli::cluster::AgentSnapshotSettings {
            dir: cfg.snapshot_dir(),
            schedule: cfg.snapshot_schedule.clone(),
            retention: cfg.snapshot_retention,
            compress: cfg.snapshot_compress,
            disabled: cfg.disable_snapshots,
            s3: cfg.s3.flags(Some(cfg.snapshot_s3_retention)).policy,
            s3_virtual_hosted: cfg.s3.snapshot_s3_virtual_hosted_style,
            s3_ca_file: cfg.s3.snapshot_s3_ca_file.clone(),
            s3_credentials_file: cfg.s3.snapshot_s3_credentials_file.clone(),
            s3_allow_http: cfg.s3.snapshot_s3_allow_http,
        }),
    };
    if let Err(e) =
        std::fs::create_dir_all(&cfg.data_dir).and_then(|()| agent_info.save(&cfg.data_dir))
    {
        tracing::warn!(error = %e, "cannot write {}", AgentInfo::path(&cfg.data_dir).display());
    }
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

/// The etcd flags beyond hostlet's own: the quota, then `--etcd-arg`s (checked when parsed).
fn etcd_args(cfg: &RunConfig) -> anyhow::Result<Vec<String>> {
    let mut args = Vec::new();
    if let Some(q) = &cfg.etcd_quota_backend_bytes {
        let bytes = crate::config::parse_byte_size(q)
            .map_err(|e| anyhow::anyhow!("--etcd-quota-backend-bytes: {e}"))?;
        args.push(format!("--quota-backend-bytes={bytes}"));
    }
    for a in &cfg.etcd_arg {
        args.push(
            hostlet_controllers::etcd_member::process::check_etcd_arg(a)
                .map_err(|e| anyhow::anyhow!("--etcd-arg {e}"))?,
        );
    }
    Ok(args)
}

/// The upkeep controller's settings from the flags.
fn upkeep_config(cfg: &RunConfig) -> anyhow::Result<hostlet_controllers::upkeep::UpkeepConfig> {
    use hostlet_controllers::upkeep::{Retention, Threshold, UpkeepConfig, DEFAULT_QUOTA};
    let retention = Retention::parse(&cfg.etcd_compaction_retention)
        .map_err(|e| anyhow::anyhow!("--etcd-compaction-retention: {e}"))?;
    let ratio = crate::config::parse_percent(&cfg.etcd_defrag_threshold)
        .map_err(|e| anyhow::anyhow!("--etcd-defrag-threshold: {e}"))?;
    let min_free = crate::config::parse_byte_size(&cfg.etcd_defrag_min_free)
        .map_err(|e| anyhow::anyhow!("--etcd-defrag-min-free: {e}"))?;
    let schedule = cfg
        .etcd_defrag_schedule
        .as_deref()
        .map(hostlet_controllers::snapshots::schedule::Schedule::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--etcd-defrag-schedule: {e}"))?;
    let quota = match &cfg.etcd_quota_backend_bytes {
        Some(q) => crate::config::parse_byte_size(q)
            .map_err(|e| anyhow::anyhow!("--etcd-quota-backend-bytes: {e}"))?,
        None => DEFAULT_QUOTA,
    };
    Ok(UpkeepConfig {
        retention,
        threshold: Threshold { ratio, min_free },
        schedule,
        quota: if quota == 0 { DEFAULT_QUOTA } else { quota },
        ..UpkeepConfig::default()
    })
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

/// The embedded member's settings, from the flags.
fn member_config(cfg: &RunConfig, node: &str, advertise: &str) -> anyhow::Result<MemberConfig> {
    Ok(MemberConfig {
        node_name: node.to_string(),
        hostname: crate::config::hostname(),
        data_dir: cfg.data_dir.clone(),
        advertise_address: advertise.to_string(),
        client_port: cfg.etcd_client_port,
        peer_port: cfg.etcd_peer_port,
        etcd_binary: cfg.etcd_binary.clone(),
        insecure: cfg.etcd_insecure,
        server: cfg.server.clone(),
        token: cfg.token.clone(),
        extra_sans: match cfg.listen.ip() {
            IpAddr::V4(ip) if !ip.is_unspecified() => vec![ip.to_string()],
            _ => Vec::new(),
        },
        key_prefix: cfg.key_prefix.clone(),
        etcd_args: etcd_args(cfg)?,
        role: match cfg.role {
            Role::Auto => JoinRole::Auto,
            Role::Voter => JoinRole::Voter,
            Role::Worker => JoinRole::Worker,
        },
        disk: None,
    })
}

/// The address the node advertises: the flag, else the host's primary address.
fn advertise_address(cfg: &RunConfig) -> String {
    cfg.advertise_address
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(primary_address)
}

/// `--cluster-reset`: a new single-member cluster from this member's data or a snapshot, then exit.
async fn cluster_reset(cfg: &RunConfig) -> anyhow::Result<()> {
    if !cfg.embedded_etcd() {
        anyhow::bail!(
            "--cluster-reset resets the local member; it cannot go with --etcd-endpoints"
        );
    }
    let _lock = DataDirLock::acquire_if_exists(&cfg.data_dir)?;
    // A fresh host restoring a lost cluster from a snapshot is prepared as a first node is; what that
    // creates goes again if the reset is refused.
    let layout = MemberLayout::new(&cfg.data_dir);
    let fresh = cfg.cluster_reset_restore_path.is_some()
        && !layout.member_dir().exists()
        && !layout.token_file().exists();
    let created = if fresh {
        let mcfg = member_config(cfg, &cfg.node_name(), &advertise_address(cfg))?;
        etcd_member::bootstrap::prepare_fresh_reset(&mcfg)
            .context("preparing this fresh host for the reset")?
    } else {
        Vec::new()
    };
    let outcome = reset_with(cfg).await;
    if outcome.is_err() {
        etcd_member::bootstrap::remove_created(&created);
    }
    outcome
}

async fn reset_with(cfg: &RunConfig) -> anyhow::Result<()> {
    // The key first: a reset that cannot open its snapshot must not download it.
    let key = cfg.snapshot_key()?;
    // An object is downloaded beside the data (checked for size), checked as a snapshot with the rest,
    // restored, then removed.
    let downloaded = match &cfg.cluster_reset_restore_path {
        Some(p) if p.to_string_lossy().starts_with("s3://") => Some(
            crate::cli::etcd::download_s3(&p.to_string_lossy(), &cfg.s3, &cfg.data_dir)
                .await
                .map_err(|e| anyhow::anyhow!("--cluster-reset-restore-path: {e}"))?,
        ),
        _ => None,
    };
    let reset = ResetConfig {
        data_dir: cfg.data_dir.clone(),
        hostname: crate::config::hostname(),
        client_port: cfg.etcd_client_port,
        peer_port: cfg.etcd_peer_port,
        etcd_binary: cfg.etcd_binary.clone(),
        restore_tool: None,
        insecure: cfg.etcd_insecure,
        restore_path: downloaded
            .clone()
            .or_else(|| cfg.cluster_reset_restore_path.clone()),
        key,
        lost: cfg.cluster_reset_lost.clone(),
    };
    tracing::info!(data_dir = %cfg.data_dir.display(), restore = ?reset.restore_path, "cluster reset");
    let outcome = tombstone::reset::cluster_reset(&reset).await;
    if let Some(d) = &downloaded {
        let _ = std::fs::remove_file(d);
        if let Some(dir) = d.parent() {
            let _ = std::fs::remove_dir(dir); // only when empty
        }
    }
    let outcome = outcome?;
    print!("{}", tombstone::reset::next_steps(&outcome, &cfg.data_dir));
    Ok(())
}

async fn wait_server(h: tokio::task::JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    match h.await {
        Ok(r) => r.and_then(|()| Err(anyhow::anyhow!("the API server stopped"))),
        Err(e) => Err(anyhow::anyhow!("the API server failed: {e}")),
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The client certificate flags of `--etcd-endpoints`: none, or all three.
fn external_tls(cfg: &RunConfig) -> anyhow::Result<Option<TlsFiles>> {
    match (&cfg.etcd_ca_file, &cfg.etcd_cert_file, &cfg.etcd_key_file) {
        (None, None, None) => {
            // Endpoints on this host's own data dir: use its client certificate.
            let tls = MemberLayout::new(&cfg.data_dir).tls();
            let https = cfg.etcd_endpoints.iter().any(|e| e.starts_with("https://"));
            Ok((https && tls.is_complete()).then(|| client_tls_files(&tls)))
        }
        (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        })),
        _ => anyhow::bail!(
            "--etcd-ca-file, --etcd-cert-file and --etcd-key-file go together (client certificate authentication)"
        ),
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
