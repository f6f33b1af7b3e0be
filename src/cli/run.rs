//! `hostlet run`: the agent.

use std::process::ExitCode;

use crate::config::RunConfig;

/// Runs the agent with `cfg`. Until the controllers are wired in, it reports the configuration it would
/// run with.
pub fn run(cfg: RunConfig) -> ExitCode {
    let yaml = serde_yaml::to_string(&EffectiveConfig::from(&cfg)).unwrap_or_default();
    print!("{yaml}");
    ExitCode::SUCCESS
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
