//! hostlet controllers.
pub mod etcd_member;
pub mod events;
pub mod pods;
pub mod snapshots;
