//! The snapshot scheduler: scheduled and on-demand snapshots of the local member, verified, optionally
//! compressed, recorded in etcd, with exact retention.

pub mod file;
pub mod retention;
pub mod schedule;
