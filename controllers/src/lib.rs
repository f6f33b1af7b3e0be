//! hostlet controllers.
pub mod etcd_member;
pub mod events;
pub mod learners;
pub mod members;
pub mod pods;
pub mod snapshots;
pub mod sources;
