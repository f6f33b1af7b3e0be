//! The agent's assembly: which shared caches are built and which controllers run on them, in one place.
//! `hostlet run` prepares what this needs (flags, listeners, the local etcd member or an external cluster,
//! the event recorder) and calls [`Agent::start`]; what the agent does is decided here.
//!
//! On an agent that runs its own etcd member: the shared caches ([`Caches`]), the learner manager and
//! member removal, the rejoin, the snapshot scheduler and upkeep. On every agent: the pod controller and
//! its manifest sources. Every task they run is in the agent's [`TaskSet`].
//!
//! The boot ([`boot()`]) decides the host's [`role`](role::Role) once and hands it to that role's file:
//! `member.rs`, `worker.rs`, `external.rs`; what the three share is in `common.rs`.

mod arrival;
mod boot;
mod common;
mod external;
mod member;
mod role;
mod running;
mod tasks;
mod worker;

pub use arrival::{arrival_events, counts_tombstone, Arrival, ArrivalEvent};
pub use boot::boot;
pub use running::{ApiTlsReload, BootConfig, Datastore, Ended, MemberSettings, Running, DRAIN};
pub use tasks::{Drained, Stage, TaskSet};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hostlet_api::KeyLayout;
use hostlet_runtime::{ClusterClient, Etcd, EtcdConfig, InformerFactory, Metrics, Run};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::caches::Caches;
use crate::etcd_member::StartedMember;
use crate::events::EventRecorder;
use crate::pki::client_tls_files;
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
    /// own stop, the task set's, may fire alone: a revoked worker's agent stops its controllers and keeps
    /// answering).
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
    /// Where to rejoin, once the rejoin controller has prepared it (its task is in the task set).
    rejoin: Option<oneshot::Receiver<Option<tombstone::rejoin::RejoinTarget>>>,
    /// A worker's request to become a member, once one came.
    become_member: Option<oneshot::Receiver<Option<hostlet_api::objects::MemberRequest>>>,
    /// A worker's caches.
    pub worker: Option<crate::placement::worker::WorkerCaches>,
    /// The revoked certificates of deleted nodes.
    pub revocations: crate::pki::Revocations,
    /// Every informer of this agent: the feeders it starts go to the task set.
    informers: InformerFactory,
}

impl Agent {
    /// Builds the caches and starts every controller, each task in `tasks` (the controllers stop with
    /// its [`Stage::Controllers`] token, the informers with [`Stage::Caches`]). A rejoin, once prepared,
    /// fires the process's stop itself and leaves its target for [`Agent::rejoin_target`].
    pub fn start(parts: AgentParts<'_>, tasks: &mut TaskSet) -> Result<Agent, AgentError> {
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
        let shutdown = &tasks.token(Stage::Controllers);
        let feeders = tasks.token(Stage::Caches);
        // Every prefix informer of this agent comes from here: one per prefix, shared by its readers.
        // The informers outlive the controllers, so that a reconcile under way reads live stores.
        let informers = match &client {
            ClusterClient::Etcd(etcd) => {
                InformerFactory::new(etcd.clone(), metrics.clone(), feeders)
            }
            ClusterClient::NodeApi(api) => {
                InformerFactory::through(api.clone(), metrics.clone(), feeders)
            }
        }
        .with_controller_stop(shutdown.clone());
        let revocations = match &client {
            ClusterClient::Etcd(_) => {
                crate::pki::Revocations::new(crate::pki::certificates_store(&informers, &keys))
            }
            ClusterClient::NodeApi(_) => crate::pki::Revocations::none(),
        };
        if let Some(layout) = worker {
            let w = crate::placement::worker::WorkerCaches::start(&informers, &keys, &node, layout);
            let (request, events, process_stop) =
                (w.request.clone(), events.clone(), process_stop.clone());
            let stop = shutdown.clone();
            become_member = Some(tasks.spawn_with_result(
                Stage::Controllers,
                "member request watch",
                async move {
                    // A revoked worker's controllers stop alone: so does this watch.
                    tokio::select! {
                        biased;
                        r = crate::placement::worker::wait_for_request(request, events, process_stop) => r,
                        _ = stop.cancelled() => None,
                    }
                },
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
                        let writers = tasks.token(Stage::Writers);
                        tasks.spawn(
                            Stage::Writers,
                            "revocation list",
                            crate::pki::keep_crl(
                                revocations.clone(),
                                Arc::new(ca),
                                m.layout.tls().crl(),
                                writers,
                            ),
                        );
                    }
                    Err(e) => tracing::warn!(
                        error = %crate::error_chain(&e),
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
            started(tasks, "learners", membership.learners, shutdown);
            started(tasks, "member-removal", membership.removal, shutdown);

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
            started(tasks, "placement", Arc::new(placement), shutdown);

            let podsets = crate::podsets::PodSets::new(
                etcd.clone(),
                keys.clone(),
                c.podsets(),
                events.clone(),
                &metrics,
            )
            .map_err(AgentError::Placement)?;
            started(tasks, "podsets", Arc::new(podsets), shutdown);

            rejoin = Some(start_rejoin(
                &etcd,
                &c,
                &keys,
                &node,
                &events,
                &metrics,
                &mp,
                tasks,
                &process_stop,
            ));

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
            started(tasks, "snapshots", Arc::new(snapshots), shutdown);

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
            started(tasks, "etcd-upgrade", Arc::new(upgrade), shutdown);
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
            started(tasks, "upkeep", Arc::new(upkeep), shutdown);
            caches = Some(c);
        }

        let mut pods = pods;
        pods.events = Some(events);
        let (pods, task) = start_pod_controller(pods, &informers)?;
        tasks.adopt(Stage::Controllers, "pods", task);
        let agent = Agent {
            caches,
            pods,
            rejoin,
            become_member,
            worker: worker_caches,
            revocations,
            informers,
        };
        agent.adopt_feeders(tasks);
        Ok(agent)
    }

    /// Hands the informers (and the caches' other feeders) started since the last call to `tasks`: the
    /// stop calls it again for those a late reader started.
    pub fn adopt_feeders(&self, tasks: &mut TaskSet) {
        for (name, task) in self.informers.take_tasks() {
            tasks.adopt(Stage::Caches, name, task);
        }
    }

    /// Once a worker's agent has stopped: the request to become a member, if that is what stopped it.
    pub async fn member_request(&mut self) -> Option<hostlet_api::objects::MemberRequest> {
        let outcome = self.become_member.take()?;
        match tokio::time::timeout(REJOIN_HANDOVER, outcome).await {
            Ok(done) => done.ok().flatten(),
            Err(_) => None,
        }
    }

    /// Once the agent has stopped: where to rejoin, if a rejoin is what stopped it. One still under way
    /// after a short wait is given up.
    pub async fn rejoin_target(&mut self) -> Option<tombstone::rejoin::RejoinTarget> {
        let outcome = self.rejoin.take()?;
        match tokio::time::timeout(REJOIN_HANDOVER, outcome).await {
            Ok(done) => done.ok().flatten(),
            Err(_) => None,
        }
    }
}

/// Starts `controller` the one way every controller is started, named for the drain.
fn started<C: Run>(
    tasks: &mut TaskSet,
    name: &'static str,
    controller: Arc<C>,
    shutdown: &CancellationToken,
) {
    tasks.spawn(Stage::Controllers, name, controller.run(shutdown.clone()));
}

/// Starts the rejoin controller, and a task that stops the agent once it has prepared a rejoin; where
/// to rejoin comes back through the result.
#[allow(clippy::too_many_arguments)]
fn start_rejoin(
    etcd: &Etcd,
    caches: &Caches,
    keys: &KeyLayout,
    node: &str,
    events: &EventRecorder,
    metrics: &Metrics,
    mp: &MemberParts<'_>,
    tasks: &mut TaskSet,
    process_stop: &CancellationToken,
) -> oneshot::Receiver<Option<tombstone::rejoin::RejoinTarget>> {
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
    let stop = tasks.token(Stage::Controllers);
    started(tasks, "rejoin", controller, &stop);
    let shutdown = process_stop.clone();
    // Not stopped by the drain: it ends with the rejoin controller, whose outcome it hands over.
    tasks.spawn_with_result(Stage::Controllers, "rejoin handover", async move {
        let target = outcome.await.ok();
        if target.is_some() {
            shutdown.cancel();
        }
        target
    })
}
