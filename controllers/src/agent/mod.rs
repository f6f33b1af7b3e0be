//! The agent's assembly: which shared caches are built and which controllers run on them, in one place.
//! `hostlet run` prepares what this needs (flags, listeners, the local etcd member or an external cluster,
//! the event recorder) and calls [`Agent::start`]; what the agent does is decided here.
//!
//! On an agent that runs its own etcd member: the shared caches ([`Caches`]), the learner manager and
//! member removal, the rejoin, the snapshot scheduler and upkeep. On every agent: the pod controller and
//! its manifest sources.

mod boot;

pub use boot::{
    arrival_events, boot, counts_tombstone, ApiTlsReload, Arrival, ArrivalEvent, BootConfig,
    Datastore, Ended, MemberSettings, Running, DRAIN,
};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, Etcd, EtcdConfig, InformerFactory, Metrics, Run};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::caches::Caches;
use crate::etcd_member::{bootstrap::client_tls_files, StartedMember};
use crate::events::EventRecorder;
use crate::pods::controller::{start_pod_controller, PodControllerConfig, PodsHandle};
use crate::pods::docker::DockerRuntime;
use crate::snapshots::controller::SnapshotController;
use crate::snapshots::policy::{S3Flags, SnapshotSettings};
use crate::snapshots::scheduler::SnapshotScheduler;
use crate::tombstone;
use crate::upkeep::{self, EtcdUpkeep};

/// How long a stopping agent waits for a rejoin that is under way to hand its target back.
const REJOIN_HANDOVER: Duration = Duration::from_secs(2);

/// What the concerns of a local member need beyond the member itself.
pub struct MemberParts<'a> {
    pub member: &'a StartedMember,
    /// Client certificates for the local member and its peers (`false` under `--etcd-insecure`).
    pub tls: bool,
    pub settings: MemberSettings,
    /// The supervisor's db size gauge, which upkeep keeps fresh too.
    pub db_size: prometheus::IntGaugeVec,
}

/// The snapshot scheduler's settings as the flags give them.
pub struct SnapshotParts {
    pub dir: PathBuf,
    pub schedule: String,
    pub retention: u32,
    pub compress: bool,
    pub disabled: bool,
    pub s3: S3Flags,
    /// `--snapshot-encryption-key-file`'s key.
    pub key: Option<Arc<crate::snapshots::encryption::SnapshotKey>>,
    /// Free space under the snapshot dir.
    pub disk: Option<crate::disk::DiskPressure>,
}

/// Everything [`Agent::start`] takes.
pub struct AgentParts<'a> {
    /// etcd, or on a worker the voters' node API: what every informer reads and every writer writes.
    pub client: ClusterClient,
    pub keys: KeyLayout,
    pub node: String,
    /// The agent's one event recorder.
    pub events: EventRecorder,
    pub metrics: Metrics,
    /// `None` on an agent of an external etcd cluster, and on a worker.
    pub member: Option<MemberParts<'a>>,
    /// A worker's data dir (`None` where the agent runs a member or uses an external cluster).
    pub worker: Option<crate::etcd_member::MemberLayout>,
    pub pods: PodControllerConfig,
    /// The whole process's stop, which a rejoin or a worker's member request fires (the controllers'
    /// own stop, given to [`Agent::start`], may fire alone: a revoked worker's agent stops its controllers
    /// and keeps answering).
    pub process_stop: CancellationToken,
}

/// A failure to start one of the agent's controllers.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("starting the learner manager and member removal: {0}")]
    Membership(#[from] crate::membership::SpawnError),
    #[error("--snapshot-schedule: {0}")]
    Snapshots(String),
    #[error("starting voter placement: {0}")]
    Placement(prometheus::Error),
    #[error("starting the upkeep controller: {0}")]
    Upkeep(prometheus::Error),
    #[error("starting the pod controller: {0}")]
    Pods(#[from] crate::pods::controller::PodControllerError),
}

/// A running agent's handles.
pub struct Agent {
    /// The shared caches (an agent that runs its own member).
    pub caches: Option<Caches>,
    /// The pod controller, for its HTTP routes.
    pub pods: PodsHandle<DockerRuntime>,
    rejoin: Option<JoinHandle<Option<tombstone::rejoin::RejoinTarget>>>,
    /// A worker's wait for a request to become a member.
    become_member: Option<JoinHandle<Option<hostlet_api::objects::MemberRequest>>>,
    /// A worker's caches.
    pub worker: Option<crate::placement::worker::WorkerCaches>,
    /// The revoked certificates of deleted nodes.
    pub revocations: crate::etcd_member::revocation::Revocations,
    /// Every controller's task, by name: [`Agent::drain`] waits for them.
    controllers: Vec<(&'static str, JoinHandle<()>)>,
}

impl Agent {
    /// Builds the caches and starts every controller; all stop with `shutdown`. A rejoin, once
    /// prepared, fires the process's stop itself and leaves its target for [`Agent::rejoin_target`].
    pub fn start(parts: AgentParts<'_>, shutdown: &CancellationToken) -> Result<Agent, AgentError> {
        let AgentParts {
            client,
            keys,
            node,
            events,
            metrics,
            member,
            worker,
            pods,
            process_stop,
        } = parts;
        let mut caches = None;
        let mut rejoin = None;
        let mut become_member = None;
        let mut worker_caches = None;
        let mut controllers: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
        // Every prefix informer of this agent comes from here: one per prefix, shared by its readers.
        let informers = match &client {
            ClusterClient::Etcd(etcd) => {
                InformerFactory::new(etcd.clone(), metrics.clone(), shutdown.clone())
            }
            ClusterClient::NodeApi(api) => {
                InformerFactory::through(api.clone(), metrics.clone(), shutdown.clone())
            }
        };
        let revocations = match &client {
            ClusterClient::Etcd(_) => crate::etcd_member::revocation::Revocations::new(
                crate::etcd_member::revocation::certificates_store(&informers, &keys),
            ),
            ClusterClient::NodeApi(_) => crate::etcd_member::revocation::Revocations::none(),
        };
        if let Some(layout) = worker {
            let w = crate::placement::worker::WorkerCaches::start(&informers, &keys, &node, layout);
            become_member = Some(crate::placement::worker::await_request(
                w.request.clone(),
                events.clone(),
                process_stop.clone(),
            ));
            worker_caches = Some(w);
        }
        if let Some(mp) = member {
            let m = mp.member;
            let etcd = m.etcd.clone();
            if mp.tls {
                // etcd reads this list on each new connection: a deleted worker's certificates go with it.
                match m.layout.tls().load_ca() {
                    Ok(ca) => {
                        tokio::spawn(crate::etcd_member::revocation::keep_crl(
                            revocations.clone(),
                            Arc::new(ca),
                            m.layout.tls().crl(),
                            shutdown.clone(),
                        ));
                    }
                    Err(e) => tracing::warn!(
                        error = %crate::etcd_member::error_chain(&e),
                        "no CA key: this member cannot keep the revocation list"
                    ),
                }
            }
            let c = Caches::start(&informers, &keys, &node, Some(&m.local_client_url));
            m.follow(c.members.clone());
            let tls = mp.tls.then(|| client_tls_files(&m.layout.tls()));

            let membership = crate::membership::membership_controllers(
                &etcd,
                &c,
                &keys,
                &node,
                &m.local_client_url,
                tls.as_ref(),
                mp.settings.learner_stall_timeout,
                &events,
                &metrics,
            )?;
            controllers.push(started("learners", membership.learners, shutdown));
            controllers.push(started("member-removal", membership.removal, shutdown));

            let placement = crate::placement::Placement::new(
                etcd.clone(),
                keys.clone(),
                &node,
                c.placement(),
                events.clone(),
                mp.settings.voter_replace_after,
                &metrics,
            )
            .map_err(AgentError::Placement)?;
            controllers.push(started("placement", Arc::new(placement), shutdown));

            let (rejoin_controller, target) = start_rejoin(
                &etcd,
                &c,
                &keys,
                &node,
                &events,
                &metrics,
                &mp,
                shutdown,
                &process_stop,
            );
            controllers.push(("rejoin", rejoin_controller));
            rejoin = Some(target);

            let mut local = EtcdConfig::new([m.local_client_url.clone()]);
            if let Some(tls) = &tls {
                local = local.with_tls(tls.clone());
            }
            let s = mp.settings.snapshots;
            let settings = SnapshotSettings {
                node: node.clone(),
                dir: s.dir,
                keys: keys.clone(),
                schedule: s.schedule,
                retention: s.retention,
                compress: s.compress,
                disabled: s.disabled,
                jitter: Duration::from_secs(5),
                local,
                s3: s.s3,
                key: s.key,
                disk: s.disk,
            };
            let scheduler =
                SnapshotScheduler::new(settings, etcd.clone(), events.clone(), &metrics)
                    .map_err(|e| AgentError::Snapshots(e.to_string()))?;
            let scheduler = Arc::new(scheduler);
            let snapshots = SnapshotController::new(scheduler.clone(), c.snapshots(), &metrics);
            controllers.push(started("snapshots", Arc::new(snapshots), shutdown));

            let lock = upkeep::lock_store(&informers, &keys);
            let upgrade = crate::upgrade::UpgradeController::new(
                Arc::new(crate::upgrade::EtcdUpgrade {
                    etcd: etcd.clone(),
                    keys: keys.clone(),
                    node: node.clone(),
                    member_name: m.member_name.clone(),
                    local_client_url: m.local_client_url.clone(),
                    tls: tls.clone(),
                    binary: m.binary().to_path_buf(),
                    members: c.members.clone(),
                    records: crate::upgrade::records_store(&informers, &keys),
                    restarter: m.restarter(),
                    gate: m.version_gate(),
                    snapshots: scheduler.clone(),
                    events: events.clone(),
                    lock: lock.clone(),
                }),
                mp.settings.upgrade,
                &metrics,
            );
            controllers.push(started("etcd-upgrade", Arc::new(upgrade), shutdown));
            let etcd_upkeep = EtcdUpkeep::new(
                etcd.clone(),
                keys.clone(),
                &node,
                m.local_client_url.clone(),
                Arc::new(move || scheduler.in_progress()),
                Duration::from_secs(600),
            )
            .with_events(events.clone())
            .with_caches(c.members.clone(), lock.clone());
            let upkeep = upkeep::UpkeepController::new(
                Arc::new(etcd_upkeep),
                mp.settings.upkeep,
                &metrics,
                mp.db_size,
            )
            .map_err(AgentError::Upkeep)?
            .with_lock(lock);
            controllers.push(started("upkeep", Arc::new(upkeep), shutdown));
            caches = Some(c);
        }

        let mut pods = pods;
        pods.events = Some(events);
        let (pods, task) = start_pod_controller(pods, &informers)?;
        controllers.push(("pods", task));
        Ok(Agent {
            caches,
            pods,
            rejoin,
            become_member,
            worker: worker_caches,
            revocations,
            controllers,
        })
    }

    /// Once `shutdown` has fired: waits up to `within` for every controller to finish the reconcile it is
    /// in (one cut off in the middle of an etcd write or a container create leaves work half done); the
    /// names of those still running then, which are left to the runtime's end.
    pub async fn drain(&mut self, within: Duration) -> Vec<&'static str> {
        drain_tasks(std::mem::take(&mut self.controllers), within).await
    }

    /// Once a worker's agent has stopped: the request to become a member, if that is what stopped it.
    pub async fn member_request(&mut self) -> Option<hostlet_api::objects::MemberRequest> {
        let task = self.become_member.take()?;
        match tokio::time::timeout(REJOIN_HANDOVER, task).await {
            Ok(done) => done.ok().flatten(),
            Err(_) => None,
        }
    }

    /// Once the agent has stopped: where to rejoin, if a rejoin is what stopped it. One still under way
    /// after a short wait is given up.
    pub async fn rejoin_target(self) -> Option<tombstone::rejoin::RejoinTarget> {
        let mut task = self.rejoin?;
        match tokio::time::timeout(REJOIN_HANDOVER, &mut task).await {
            Ok(done) => done.ok().flatten(),
            Err(_) => {
                task.abort();
                None
            }
        }
    }
}

/// Waits up to `within`, in all, for `tasks`; the names of those not finished by then.
async fn drain_tasks(
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    within: Duration,
) -> Vec<&'static str> {
    let deadline = tokio::time::Instant::now() + within;
    let mut left = Vec::new();
    for (name, task) in tasks {
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(controller = name, error = %e, "controller task ended badly")
            }
            Err(_) => left.push(name),
        }
    }
    left
}

/// Starts `controller` the one way every controller is started, named for the drain.
fn started<C: Run>(
    name: &'static str,
    controller: Arc<C>,
    shutdown: &CancellationToken,
) -> (&'static str, JoinHandle<()>) {
    (name, hostlet_runtime::spawn(controller, shutdown.clone()))
}

/// The rejoin controller's task, and a task that stops the agent once it has prepared a rejoin.
#[allow(clippy::too_many_arguments)]
fn start_rejoin(
    etcd: &Etcd,
    caches: &Caches,
    keys: &KeyLayout,
    node: &str,
    events: &EventRecorder,
    metrics: &Metrics,
    mp: &MemberParts<'_>,
    shutdown: &CancellationToken,
    process_stop: &CancellationToken,
) -> (
    JoinHandle<()>,
    JoinHandle<Option<tombstone::rejoin::RejoinTarget>>,
) {
    let m = mp.member;
    let member_id = m.id();
    let watch = tombstone::handler::RejoinWatch {
        members: caches.members.clone(),
        request: caches.tombstone_request.clone(),
        etcd: etcd.clone(),
        keys: keys.clone(),
        node: node.to_string(),
        me: tombstone::standing::Identity {
            name: m.member_name.clone(),
            id: member_id,
        },
        local_url: m.local_client_url.clone(),
        removed: m.removed(),
    };
    let rejoin = tombstone::rejoin::Rejoin {
        etcd: etcd.clone(),
        keys: keys.clone(),
        node: node.to_string(),
        events: events.clone(),
        member_id,
        server: mp.settings.server.clone(),
        token: mp.settings.token.clone(),
        member_dir: m.layout.member_dir(),
        token_file: m.layout.token_file(),
        peer_tls: mp.tls.then(|| client_tls_files(&m.layout.tls())),
    };
    let (controller, outcome) =
        tombstone::controller::RejoinController::new(watch, rejoin, metrics);
    let task = hostlet_runtime::spawn(controller, shutdown.clone());
    let shutdown = process_stop.clone();
    let target = tokio::spawn(async move {
        let target = outcome.await.ok();
        if target.is_some() {
            shutdown.cancel();
        }
        target
    });
    (task, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_a_reconcile_under_way_and_names_one_that_does_not_end() {
        let shutdown = CancellationToken::new();
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A controller in the middle of a reconcile that needs 2 s more once told to stop.
        let busy = {
            let (shutdown, finished) = (shutdown.clone(), finished.clone());
            tokio::spawn(async move {
                shutdown.cancelled().await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let idle = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { shutdown.cancelled().await })
        };
        let stuck = tokio::spawn(std::future::pending::<()>());
        shutdown.cancel();
        let started = tokio::time::Instant::now();
        let left = drain_tasks(
            vec![("busy", busy), ("idle", idle), ("stuck", stuck)],
            Duration::from_secs(5),
        )
        .await;
        assert!(finished.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(left, vec!["stuck"]);
        // One deadline for all, not one each.
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
