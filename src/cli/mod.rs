//! Subcommands of the `hostlet` binary.

pub mod cluster;
pub mod etcd;
pub mod pod;
pub mod run;
