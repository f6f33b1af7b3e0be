//! The snapshot scheduler: scheduled and on-demand snapshots of the local member, verified, optionally
//! compressed, recorded in etcd, with exact retention.

pub mod catalogue;
pub mod controller;
pub mod effects;
pub mod encryption;
#[cfg(test)]
mod fake;
pub mod file;
pub mod metrics;
pub mod policy;
pub mod remote;
pub mod request;
pub mod restore;
pub mod retention;
pub mod schedule;
pub mod scheduler;
pub mod sync;
pub mod take;
