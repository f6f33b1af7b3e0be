//! hostlet's controller machinery. Knows nothing of pods or snapshots.

pub mod backoff;
pub mod etcd;
pub mod informer;
pub mod metrics;
pub mod queue;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use backoff::ExponentialBackoff;
pub use etcd::{Etcd, EtcdConfig, EtcdError, TlsFiles};
pub use informer::{Informer, Invalid, Object};
pub use metrics::Metrics;
pub use queue::{QueueKey, WorkQueue};
pub use store::{Changes, Store, Writer};
