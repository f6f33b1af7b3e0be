//! The pod reconciler: runs the pods of this node on Docker, the way the kubelet does.
//!
//! A reconcile reads the desired pod (the store of `/hostlet/hosts/<node>/pods/`) and the observed one (the
//! Docker-event-fed cache of [`observed`]), computes a plan as plain data ([`planner::plan`] →
//! [`planner::Step`]s) and executes it through the [`runtime::ContainerRuntime`] seam, whose Docker
//! implementation is [`docker::DockerRuntime`].

pub mod backoff;
pub mod controller;
pub mod docker;
pub mod http;
pub mod metrics;
pub mod observed;
pub mod planner;
pub mod probes;
pub mod runtime;
pub mod spec;
pub mod status;
