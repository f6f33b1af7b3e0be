//! Subcommands of the `hostlet` binary.

pub mod cert;
pub mod cluster;
pub mod configs;
pub mod drain;
pub mod etcd;
pub mod etcd_upgrade;
pub mod etcd_upkeep;
pub mod events;
pub mod exit;
pub mod node;
pub mod node_admin;
pub mod pod;
pub mod pod_access;
pub mod podset;
pub mod progress;
pub mod run;
pub mod token;
