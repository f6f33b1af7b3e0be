//! The snapshot scheduler: scheduled and on-demand snapshots of the local member, verified, optionally
//! compressed, recorded in etcd, with exact retention.

pub mod encryption;
pub mod file;
pub mod remote;
pub mod restore;
pub mod retention;
pub mod schedule;
pub mod scheduler;
pub mod take;
