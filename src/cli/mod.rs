//! Subcommands of the `hostlet` binary.

pub mod pod;
pub mod run;
