//! `hostlet cert …`: certificates for people. `cert admin` writes an admin's client certificate, key and the
//! cluster CA into a directory, for the CLI (`--etcd-endpoints` and the three TLS flags) and etcdctl from a
//! workstation; the agents' APIs take it for every route.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use hostlet_controllers::etcd_member::MemberLayout;
use hostlet_controllers::pki::write_file;

use super::cluster::ClusterArgs;
use super::exit::CliError;

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Write an admin certificate, its key and the cluster CA into a directory (on a host holding the CA key).
    Admin {
        /// The directory to write `admin.crt`, `admin.key` (0600) and `ca.crt` into: a new one (made 0700) or
        /// one that is 0700; files already there are not overwritten.
        #[arg(long, value_name = "DIR", value_parser = crate::paths::absolute)]
        out: PathBuf,
        /// Who the certificate is for (`CN=admin:<name>`), as the agents' logs and refusals name it.
        #[arg(long, value_name = "NAME", default_value = "admin")]
        name: String,
        /// How long it is valid (`30d`, `1y`).
        #[arg(long, value_name = "DURATION", default_value = "90d", value_parser = humantime::parse_duration)]
        valid_for: Duration,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

pub fn run(cmd: CertCommand) -> Result<ExitCode, CliError> {
    match cmd {
        CertCommand::Admin {
            out,
            name,
            valid_for,
            cluster,
        } => admin(&out, &name, valid_for, &cluster),
    }
}

fn admin(
    out: &Path,
    name: &str,
    valid_for: Duration,
    cluster: &ClusterArgs,
) -> Result<ExitCode, CliError> {
    if !hostlet_api::field::is_dns_subdomain(name) {
        return Err(CliError::refused(format!(
            "--name {name:?}: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        )));
    }
    if valid_for < Duration::from_secs(60) {
        return Err(CliError::refused("--valid-for: at least a minute"));
    }
    let tls = MemberLayout::new(cluster.data_dir()).tls();
    let ca = tls.load_ca().map_err(|e| {
        CliError::not_found(format!(
            "no cluster CA key in {} ({e}): run this on a host that holds it (a voter)",
            tls.dir.display()
        ))
    })?;
    let files = [
        out.join("admin.crt"),
        out.join("admin.key"),
        out.join("ca.crt"),
    ];
    if let Some(there) = files.iter().find(|f| f.exists()) {
        return Err(CliError::refused(format!(
            "{} exists: give an empty or new --out directory",
            there.display()
        )));
    }
    let cert = ca
        .issue_admin(name, valid_for)
        .map_err(|e| CliError::from(format!("issuing the certificate: {e}")))?;
    // The key goes into a 0700 directory: a new one, or one that already is.
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        match std::fs::metadata(out) {
            Ok(m) if !m.is_dir() => {
                return Err(CliError::refused(format!(
                    "{}: not a directory",
                    out.display()
                )))
            }
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                return Err(CliError::refused(format!(
                    "{} is open to others (mode {:o}): give a new directory, or one that is 0700",
                    out.display(),
                    m.permissions().mode() & 0o777
                )))
            }
            Ok(_) => {}
            Err(_) => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(out)
                .map_err(|e| CliError::from(format!("{}: {e}", out.display())))?,
        }
    }
    for (path, contents, mode) in [
        (&files[1], cert.key.as_str(), 0o600),
        (&files[0], cert.cert.as_str(), 0o644),
        (&files[2], ca.cert.as_str(), 0o644),
    ] {
        write_file(path, contents, mode).map_err(|e| CliError::from(e.to_string()))?;
    }
    println!(
        "wrote {}, {} and {} (admin:{name}, valid for {})",
        files[0].display(),
        files[1].display(),
        files[2].display(),
        humantime::format_duration(valid_for)
    );
    Ok(ExitCode::SUCCESS)
}
