//! `hostlet run --cluster-reset`: a new single-member cluster from this member's data or a snapshot.

use super::*;

/// `--cluster-reset`: a new single-member cluster from this member's data or a snapshot, then exit.
pub(super) async fn cluster_reset(cfg: &RunConfig) -> anyhow::Result<()> {
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

pub(super) async fn reset_with(cfg: &RunConfig) -> anyhow::Result<()> {
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
