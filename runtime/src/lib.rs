//! hostlet's controller machinery: etcd informers, shared typed caches, work queues, the controller loop,
//! metrics and shutdown. It knows nothing of pods or snapshots.
//!
//! The pieces, each in its own module:
//! - [`etcd`]: the only place that builds etcd clients ([`Etcd`]); retries on another endpoint.
//! - [`nodeapi`]: a worker's way to the cluster, the voters' node API; [`cluster`]: what writers write
//!   through, etcd or that API ([`ClusterClient`]).
//! - [`informer`]: keeps a [`Store`] equal to an etcd prefix, values decoded by the caller ([`Informer`]).
//! - [`members`]: the same for the cluster's members, by polling ([`MemberInformer`]).
//! - [`store`]: the shared cache ([`Store`] readers, one [`Writer`]) and its change feed.
//! - [`queue`]: the work queue ([`WorkQueue`]); [`backoff`]: delays ([`ExponentialBackoff`]).
//! - [`controller`]: triggers → queue → reconcile ([`Controller`]).
//! - [`metrics`]: the shared registry ([`Metrics`]); [`shutdown`]: drain then abort ([`Shutdown`]).
//! - [`readiness`]: the components behind `/readyz` ([`Readiness`], one [`ComponentHandle`] each).
//! - `testkit` (feature `testkit`): real etcd processes for tests.

pub mod backoff;
pub mod cluster;
pub mod controller;
pub mod etcd;
pub mod factory;
pub mod informer;
pub mod members;
pub mod metrics;
pub mod nodeapi;
pub mod queue;
pub mod readiness;
pub mod shutdown;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod watchhub;

pub use backoff::ExponentialBackoff;
pub use cluster::ClusterClient;
pub use controller::{spawn, Action, Controller, ErrorAction, Run};
pub use etcd::{Etcd, EtcdConfig, EtcdError, TlsFiles};
pub use factory::InformerFactory;
pub use informer::{Informer, Invalid, Object};
pub use members::{
    Leadership, Member, MemberInformer, MemberStatus, Members, MembersFeed, Pace, Statuses,
};
pub use metrics::Metrics;
pub use queue::{QueueKey, WorkQueue};
pub use readiness::{ComponentHandle, ComponentState, Readiness, ReadinessReport};
pub use shutdown::Shutdown;
pub use store::{Change, Changes, Store, Writer};
