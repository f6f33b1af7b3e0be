//! Subcommands of the `hostlet` binary.

pub mod cluster;
pub mod etcd;
pub mod etcd_upkeep;
pub mod events;
pub mod node;
pub mod pod;
pub mod run;
