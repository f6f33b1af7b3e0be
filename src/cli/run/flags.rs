//! `hostlet run`'s flags turned into what the process and the boot are set up with.

use super::*;

/// What the process keeps beside the agent, made before anything serves: the metrics registry, readiness and
/// its components, the disk watch.
pub(super) struct ProcessParts {
    pub(super) metrics: Metrics,
    pub(super) member_metrics: MemberMetrics,
    pub(super) readiness: Readiness,
    pub(super) node_ready: ComponentHandle,
    pub(super) docker_ready: ComponentHandle,
    pub(super) caches_ready: ComponentHandle,
    pub(super) disk: DiskPressure,
    pub(super) disk_events:
        std::sync::Arc<std::sync::OnceLock<hostlet_controllers::events::EventRecorder>>,
}

impl ProcessParts {
    pub(super) fn new(
        cfg: &RunConfig,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<ProcessParts> {
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
        Ok(ProcessParts {
            metrics,
            member_metrics,
            readiness,
            node_ready,
            docker_ready,
            caches_ready,
            disk,
            disk_events,
        })
    }
}

/// The boot's configuration from the flags.
pub(super) fn boot_config(
    cfg: &RunConfig,
    node: &str,
    keys: KeyLayout,
    snapshot_key: Option<std::sync::Arc<hostlet_controllers::snapshots::encryption::SnapshotKey>>,
    parts: ProcessParts,
) -> anyhow::Result<BootConfig> {
    let advertise = advertise_address(cfg);
    let listen_ip = cfg.listen.ip();
    let api_host = if listen_ip.is_unspecified() {
        advertise.clone()
    } else {
        listen_ip.to_string()
    };
    let datastore = if cfg.embedded_etcd() {
        Datastore::Member(Box::new(member_config(cfg, node, &advertise)?))
    } else {
        Datastore::External {
            endpoints: cfg.etcd_endpoints.clone(),
            tls: external_tls(cfg)?,
            token: cfg.token.clone(),
        }
    };
    Ok(BootConfig {
        node: node.to_string(),
        keys,
        data_dir: cfg.data_dir.clone(),
        datastore,
        insecure: cfg.etcd_insecure,
        voters: cfg.etcd_voters,
        cert_lifetime: cfg.cert_lifetime,
        node_info: node_info(cfg, node, &advertise),
        api_host_port: host_port(&api_host, cfg.listen.port()),
        member: member_settings(cfg, snapshot_key, &parts.disk)?,
        pods: pods_config(cfg, node, parts.docker_ready, parts.caches_ready)?,
        metrics: parts.metrics,
        member_metrics: parts.member_metrics,
        readiness: parts.readiness,
        node_ready: parts.node_ready,
        disk: parts.disk,
    })
}

/// The node record as the flags make it; the boot adds the member's part and the API's URL.
pub(super) fn node_info(cfg: &RunConfig, node: &str, advertise: &str) -> NodeInfo {
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
        cert_expires: None,
        cert_serials: Vec::new(),
        labels: own_labels(cfg, node),
        images: Default::default(),
    }
}

/// The labels a node states about itself: the built-in ones (its role is added once the boot knows it)
/// and `--node-label`.
fn own_labels(cfg: &RunConfig, node: &str) -> std::collections::BTreeMap<String, String> {
    use hostlet_api::labels;
    let mut out = std::collections::BTreeMap::new();
    out.insert(labels::HOSTNAME.to_string(), node.to_string());
    out.insert(
        labels::ARCH.to_string(),
        labels::go_arch(std::env::consts::ARCH).to_string(),
    );
    out.insert(labels::OS.to_string(), std::env::consts::OS.to_string());
    if let Some(d) = cfg.failure_domain.as_deref().filter(|d| !d.is_empty()) {
        match labels::check(labels::FAILURE_DOMAIN, d) {
            Ok(()) => {
                out.insert(labels::FAILURE_DOMAIN.to_string(), d.to_string());
            }
            Err(e) => {
                tracing::warn!("--failure-domain is not a label value, so no label says it: {e}")
            }
        }
    }
    for device in present_devices(&cfg.allowed_devices) {
        out.insert(device, "true".to_string());
    }
    for l in &cfg.node_label {
        if let Ok((k, v)) = labels::parse_own(l) {
            out.insert(k, v);
        }
    }
    out
}

/// What a member's controllers are set up with, from the flags.
pub(super) fn member_settings(
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
        upgrade: hostlet_controllers::upgrade::UpgradeConfig {
            check_interval: cfg.etcd_binary_check_interval,
            allow_small: cfg.etcd_allow_single_member_upgrade,
            ..Default::default()
        },
    })
}

/// The pod controller's configuration, from the flags.
pub(super) fn pods_config(
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
    pods_cfg.allowed_devices = cfg.allowed_devices.clone();
    pods_cfg.pod_security = cfg
        .pod_security
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--pod-security: {e}"))?;
    pods_cfg.pids_limit = Some(cfg.pod_pids_limit);
    pods_cfg.image_gc = Some(cfg.image_gc().map_err(anyhow::Error::msg)?);
    pods_cfg.images_dirs = vec![cfg.data_dir.join("images")];
    pods_cfg.images_dirs.extend(cfg.images_dir.clone());
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
pub(super) fn save_agent_info(cfg: &RunConfig, node: &str, running: &Running) {
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

/// The etcd flags beyond hostlet's own: the quota, then `--etcd-arg`s (checked when parsed).
pub(super) fn etcd_args(cfg: &RunConfig) -> anyhow::Result<Vec<String>> {
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
pub(super) fn upkeep_config(
    cfg: &RunConfig,
) -> anyhow::Result<hostlet_controllers::upkeep::UpkeepConfig> {
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
        backend_settle: backend_settle(&etcd_args(cfg)?)?,
        ..UpkeepConfig::default()
    })
}

/// How long after a write every member's figures count it: two of etcd's backend commits (every
/// `--backend-batch-interval`, 100 ms unless an `--etcd-arg` says otherwise) and a margin.
fn backend_settle(etcd_args: &[String]) -> anyhow::Result<std::time::Duration> {
    const MARGIN: std::time::Duration = std::time::Duration::from_millis(50);
    let given = etcd_args
        .iter()
        .filter_map(|a| a.strip_prefix("--backend-batch-interval="))
        .next_back();
    let interval = match given {
        None => std::time::Duration::from_millis(100),
        Some(v) => humantime::parse_duration(v).map_err(|e| {
            anyhow::anyhow!("--etcd-arg backend-batch-interval={v}: {e} (a duration, e.g. 200ms)")
        })?,
    };
    Ok(2 * interval + MARGIN)
}

/// The embedded member's settings, from the flags.
pub(super) fn member_config(
    cfg: &RunConfig,
    node: &str,
    advertise: &str,
) -> anyhow::Result<MemberConfig> {
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
        cert_lifetime: cfg.cert_lifetime,
    })
}

/// The address the node advertises: the flag, else the host's primary address.
pub(super) fn advertise_address(cfg: &RunConfig) -> String {
    cfg.advertise_address
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(primary_address)
}

pub(super) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The client certificate flags of `--etcd-endpoints`: none, or all three.
pub(super) fn external_tls(cfg: &RunConfig) -> anyhow::Result<Option<TlsFiles>> {
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

/// The host's primary address: the first non-loopback address its name resolves to, else loopback.
pub(super) fn primary_address() -> String {
    let host = crate::config::hostname();
    (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.find(|a| a.is_ipv4() && !a.ip().is_loopback()))
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

/// The node labels (`hostlet.io/device.<name>`) of the devices present now that the `allowed` globs let
/// pods have: character and block devices only, a link (`/dev/serial/by-id/…`) named by its own name.
fn present_devices(allowed: &[String]) -> std::collections::BTreeSet<String> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = std::collections::BTreeSet::new();
    for g in allowed {
        let Ok(paths) = glob::glob(g) else { continue };
        for path in paths.flatten() {
            let is_device = std::fs::metadata(&path)
                .is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device());
            let label = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(hostlet_api::labels::device_label);
            if let (true, Some(l)) = (is_device, label) {
                out.insert(l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_settle_follows_the_batch_interval_etcd_is_given() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(backend_settle(&[]).unwrap(), ms(250));
        let args = ["--snapshot-count=10000".to_string()];
        assert_eq!(backend_settle(&args).unwrap(), ms(250));
        let args = ["--backend-batch-interval=400ms".to_string()];
        assert_eq!(backend_settle(&args).unwrap(), ms(850));
        let args = ["--backend-batch-interval=1.5s".to_string()];
        assert_eq!(backend_settle(&args).unwrap(), ms(3050));
        let args = ["--backend-batch-interval=soon".to_string()];
        let e = backend_settle(&args).unwrap_err().to_string();
        assert!(e.contains("backend-batch-interval=soon"), "{e}");
    }
}
