//! The pod reconciler: runs the pods of this node on Docker, the way the kubelet does.
//!
//! A reconcile reads the desired pod (the informer's store of `/hostlet/hosts/<node>/pods/`) and the
//! observed one (the Docker-event-fed cache of [`observed`]), computes a plan as plain data
//! ([`planner::plan`] → [`planner::Step`]s) and executes it through the [`runtime::ContainerRuntime`] seam,
//! whose Docker implementation is [`docker::DockerRuntime`].
//!
//! - [`runtime`]: the seam; [`docker`]: bollard behind it; [`spec`]: manifest → container specs, with the
//!   hardening of `hostlet_api::security`; [`cgroups`]: the pods' parent cgroup and its limits.
//! - [`observed`]: one list, then Docker's event stream, a slow safety relist.
//! - [`planner`]: the pure plan; [`backoff`]: CrashLoopBackOff and the pull backoff.
//! - [`probes`]: liveness/readiness/startup workers, their findings in [`probe_results`]; [`status`]:
//!   PodStatus and events to etcd.
//! - [`controller`]: the controller on the runtime crate's loop, its entry point and
//!   [`controller::PodsHandle`]; [`http`]: `/pods`, `/pods/<id>`, `/stats/<pod>/<container>`;
//!   [`metrics`]: the Prometheus families.
//! - `fake` (tests only): an in-memory engine behind the seam, on which the controller's sequencing is
//!   tested without Docker (`controller/fake_tests.rs`).

pub mod access;
pub mod backoff;
pub mod cgroups;
pub mod configs;
pub mod controller;
pub mod docker;
#[cfg(test)]
pub mod fake;
pub mod http;
pub mod image_dir;
pub mod images;
pub mod logfile;
pub mod metrics;
pub mod observed;
pub mod peer_images;
pub mod planner;
pub mod probe_results;
pub mod probes;
pub mod runtime;
pub mod spec;
pub mod status;
