//! The pod controller on the fake engine, with a real etcd: its sequencing (infra first, one container
//! replaced alone, adoption across a restart, a death between create and start, deletion with the grace,
//! an engine that stops answering), without Docker. Each agent runs on a runtime of its own, so that a
//! test can end it as a process ends: at once, whatever it was doing.

use std::sync::Arc;
use std::time::Duration;

use hostlet_api::naming::Role;
use hostlet_api::objects::{ContainerState, PodPhase, PodStatus};
use hostlet_api::KeyLayout;
use hostlet_runtime::testkit::{eventually, TestEtcd};
use hostlet_runtime::{Etcd, InformerFactory, Metrics};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{start_with_runtime, PodControllerConfig, PodsHandle};
use crate::pods::fake::{FakeRuntime, Op};
use crate::pods::runtime::{ContainerInfo, RunState};

const WAIT: Duration = Duration::from_secs(20);
const IMAGE: &str = "busybox:latest";

/// One agent: its own runtime, as its own process would have.
struct Agent {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    metrics: Metrics,
    handle: PodsHandle<FakeRuntime>,
}

impl Drop for Agent {
    // A runtime may not be dropped inside another: its tasks are dropped where they stand, as at a
    // process's end.
    fn drop(&mut self) {
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}

struct Harness {
    etcd: TestEtcd,
    client: Etcd,
    rt: FakeRuntime,
    data: tempfile::TempDir,
    layout: KeyLayout,
    node: String,
    agent: Option<Agent>,
}

impl Harness {
    async fn start() -> Harness {
        let etcd = TestEtcd::start().await;
        let client = etcd.connect().await;
        let node = "fake-node".to_string();
        let mut h = Harness {
            rt: FakeRuntime::new(&node, &[IMAGE]),
            etcd,
            client,
            data: tempfile::tempdir().expect("a temporary directory"),
            layout: KeyLayout::default(),
            node,
            agent: None,
        };
        h.start_agent().await;
        h
    }

    async fn start_agent(&mut self) {
        assert!(self.agent.is_none());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let config = self.etcd.config();
        let client = runtime
            .spawn(async move { Etcd::connect(config).await })
            .await
            .expect("the connect task")
            .expect("an etcd client");
        let mut cfg = PodControllerConfig::new(&self.node, self.data.path().join("data"));
        cfg.cgroup_root = self.data.path().join("cgroup");
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        let (handle, task) = {
            let _in = runtime.enter();
            let informers = InformerFactory::new(client, metrics.clone(), shutdown.clone());
            start_with_runtime(cfg, Arc::new(self.rt.clone()), &informers)
                .expect("the controller starts")
        };
        self.agent = Some(Agent {
            runtime: Some(runtime),
            shutdown,
            task,
            metrics,
            handle,
        });
    }

    /// SIGTERM: the controller drains and returns.
    async fn stop_agent(&mut self) {
        let mut a = self.agent.take().expect("an agent");
        a.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), &mut a.task)
            .await
            .expect("the controller stops within 10 s")
            .expect("the controller's task");
        drop(a);
    }

    /// The process ends at once, whatever it was doing.
    fn kill_agent(&mut self) {
        drop(self.agent.take().expect("an agent"));
    }

    fn reconciles(&self) -> f64 {
        let text = self.agent.as_ref().expect("an agent").metrics.encode_text();
        text.lines()
            .filter(|l| l.starts_with("hostlet_reconcile_total{controller=\"pods\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn put(&self, id: &str, manifest: &str) {
        self.client
            .put(self.layout.pod(&self.node, id), manifest)
            .await
            .expect("put");
    }

    async fn status(&self, id: &str) -> Option<PodStatus> {
        let kv = self
            .client
            .get(self.layout.pod_status(&self.node, id))
            .await
            .expect("get")?;
        serde_json::from_slice(kv.value()).ok()
    }

    async fn wait_status(&self, id: &str, what: &str, pred: impl Fn(&PodStatus) -> bool) {
        eventually(what, WAIT, || async {
            self.status(id).await.filter(|s| pred(s)).map(|_| ())
        })
        .await
    }

    async fn wait_running(&self, id: &str) {
        self.wait_status(id, &format!("pod {id} running and ready"), |s| {
            s.phase == PodPhase::Running && s.ready
        })
        .await
    }

    /// Puts the two-container pod `id` and waits until it runs; its running containers.
    async fn run_pod(&self, id: &str) -> Vec<(String, String)> {
        self.put(id, &pod(id, "sleep, \"3600\"")).await;
        self.wait_running(id).await;
        self.running(id)
    }

    /// `(container name, id)` of the pod's running containers, the infra one named `infra`.
    fn running(&self, pod: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .rt
            .pod(pod)
            .into_iter()
            .filter(|c| c.state.is_running())
            .map(|c| (name(&c), c.id))
            .collect();
        v.sort();
        v
    }
}

fn name(c: &ContainerInfo) -> String {
    match c.labels.role {
        Role::Infra => "infra".to_string(),
        _ => c.labels.container.clone(),
    }
}

fn pod(id: &str, b_command: &str) -> String {
    format!(
        "version: v1beta1\nid: {id}\nterminationGracePeriodSeconds: 3\ncontainers:\n  \
         - {{ name: a, image: {IMAGE}, command: [sleep, \"3600\"] }}\n  \
         - {{ name: b, image: {IMAGE}, command: [{b_command}] }}\n"
    )
}

/// Operations made after the first `from`, that change containers.
fn changes(ops: &[Op], from: usize) -> Vec<Op> {
    ops[from..]
        .iter()
        .filter(|o| !matches!(o, Op::Pull { .. }))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_infra_container_runs_before_the_apps_that_join_it() {
    let h = Harness::start().await;
    h.run_pod("web").await;

    let containers = h.rt.pod("web");
    assert_eq!(containers.len(), 3, "{containers:#?}");
    let infra = containers
        .iter()
        .find(|c| c.labels.role == Role::Infra)
        .expect("an infra container");
    let ops = h.rt.ops();
    let started = |id: &str| ops.iter().position(|o| *o == Op::Start { id: id.into() });
    let infra_started = started(&infra.id).expect("the infra container started");
    for app in containers.iter().filter(|c| c.labels.role == Role::App) {
        assert_eq!(app.joined_to.as_deref(), Some(infra.id.as_str()));
        assert!(
            started(&app.id).is_some_and(|at| at > infra_started),
            "{ops:#?}"
        );
    }
    // The pods' parent cgroup got its limits, under the configured root.
    let parent = h.data.path().join("cgroup");
    let written = std::fs::read_dir(&parent)
        .expect("the cgroup root made")
        .filter_map(Result::ok)
        .any(|d| d.path().join("memory.max").exists());
    assert!(written, "no memory.max under {}", parent.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_container_is_replaced_alone() {
    let h = Harness::start().await;
    let before = h.run_pod("web").await;
    let old_b = before.iter().find(|(n, _)| n == "b").expect("b").1.clone();
    let from = h.rt.ops().len();

    h.put("web", &pod("web", "sleep, \"7200\"")).await;
    let after = eventually("b replaced", WAIT, || async {
        let now = h.running("web");
        (now.len() == 3 && !now.iter().any(|(_, id)| *id == old_b)).then_some(now)
    })
    .await;
    for kept in ["a", "infra"] {
        let id = |v: &[(String, String)]| v.iter().find(|(n, _)| n == kept).cloned();
        assert_eq!(id(&after), id(&before), "{kept} kept");
    }
    let new_b = after.iter().find(|(n, _)| n == "b").expect("b").1.clone();
    let spec = h.rt.spec(&new_b).expect("the new b's spec");
    assert!(
        spec.command.iter().chain(&spec.args).any(|a| a == "7200"),
        "{spec:?}"
    );
    let made = changes(&h.rt.ops(), from);
    assert_eq!(
        made.iter()
            .filter(|o| matches!(o, Op::Stop { .. } | Op::Signal { .. }))
            .collect::<Vec<_>>(),
        vec![&Op::Signal {
            id: old_b.clone(),
            signal: "SIGTERM".into()
        }],
        "only the old b stopped: {made:#?}"
    );
    assert_eq!(
        made.iter()
            .filter(|o| matches!(o, Op::Create { .. }))
            .count(),
        1,
        "{made:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_the_pod_and_changes_nothing() {
    let mut h = Harness::start().await;
    let before = h.run_pod("web").await;
    h.stop_agent().await;
    let from = h.rt.ops().len();

    // The engine is slow to list: the pod must not be planned on a view that does not hold its
    // containers yet.
    h.rt.hold_lists();
    h.start_agent().await;
    eventually("the agent's list under way", WAIT, || async {
        (h.rt.lists_waited() > 0).then_some(())
    })
    .await;
    assert_eq!(
        h.rt.ops().len(),
        from,
        "nothing done before the engine listed"
    );
    h.rt.release_lists();
    // The new agent has looked at the pod once every store is ready; then a second pod is made, which
    // the agent reconciles after the first.
    eventually("the restarted agent's first reconcile", WAIT, || async {
        (h.reconciles() >= 1.0).then_some(())
    })
    .await;
    h.run_pod("other").await;
    assert_eq!(h.running("web"), before);
    let made: Vec<Op> = changes(&h.rt.ops(), from)
        .into_iter()
        .filter(|o| match o {
            Op::Create { name } => !name.contains("other"),
            Op::Start { id } | Op::Stop { id, .. } | Op::Signal { id, .. } | Op::Remove { id } => {
                before.iter().any(|(_, b)| b == id)
            }
            Op::Pull { .. } => false,
        })
        .collect();
    assert!(made.is_empty(), "the adopted pod was touched: {made:#?}");
    let status = h.status("web").await.expect("web's status");
    assert!(status.containers.iter().all(|c| c.restart_count == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_between_create_and_start_leaves_one_container_that_the_next_starts() {
    let mut h = Harness::start().await;
    h.rt.hold_starts("b");
    h.put("web", &pod("web", "sleep, \"3600\"")).await;
    let held = eventually("b created and its start held", WAIT, || async {
        h.rt.pod("web")
            .into_iter()
            .find(|c| c.labels.container == "b" && c.state == RunState::Created)
    })
    .await;
    h.kill_agent();
    h.rt.release_starts();
    let from = h.rt.ops().len();

    h.start_agent().await;
    h.wait_running("web").await;
    let bs: Vec<ContainerInfo> =
        h.rt.pod("web")
            .into_iter()
            .filter(|c| c.labels.container == "b")
            .collect();
    assert_eq!(bs.len(), 1, "{bs:#?}");
    assert_eq!(
        bs[0].id, held.id,
        "the container made before the kill is the one that runs"
    );
    let made = changes(&h.rt.ops(), from);
    assert!(made.contains(&Op::Start { id: held.id }), "{made:#?}");
    assert!(
        made.iter().all(|o| matches!(o, Op::Start { .. })),
        "the next agent only starts what was made: {made:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_containers_all_finished_releases_its_infra_container() {
    let h = Harness::start().await;
    let manifest = pod("job", "sleep, \"3600\"").replace(
        "terminationGracePeriodSeconds: 3\n",
        "terminationGracePeriodSeconds: 3\nrestartPolicy: OnFailure\n",
    );
    h.put("job", &manifest).await;
    h.wait_running("job").await;
    let running = h.running("job");
    let infra = running
        .iter()
        .find(|(n, _)| n == "infra")
        .expect("infra")
        .1
        .clone();
    let from = h.rt.ops().len();
    for (_, id) in running.iter().filter(|(n, _)| n != "infra") {
        h.rt.exit(id, 0);
    }
    h.wait_status("job", "the pod succeeded", |s| {
        s.phase == PodPhase::Succeeded
    })
    .await;
    eventually("the infra container released", WAIT, || async {
        h.rt.pod("job")
            .iter()
            .all(|c| c.id != infra || !c.state.is_running())
            .then_some(())
    })
    .await;
    let made = changes(&h.rt.ops(), from);
    assert!(
        !made.iter().any(|o| matches!(o, Op::Create { .. })),
        "nothing restarted under OnFailure after exit 0: {made:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_stopped_with_its_grace_removed_and_its_status_goes() {
    let h = Harness::start().await;
    h.rt.ignore_sigterm("a");
    let web = h.run_pod("web").await;
    let keep = h.run_pod("keep").await;

    h.client
        .delete(h.layout.pod(&h.node, "web"))
        .await
        .expect("delete");
    eventually("web's containers and status gone", WAIT, || async {
        (h.rt.pod("web").is_empty() && h.status("web").await.is_none()).then_some(())
    })
    .await;
    // b honours SIGTERM; a ignores it and is killed once the pod's 3 s grace is over.
    let term = |id: &str| Op::Signal {
        id: id.into(),
        signal: "SIGTERM".into(),
    };
    let kill = |id: &str| Op::Signal {
        id: id.into(),
        signal: "SIGKILL".into(),
    };
    let id = |name: &str| web.iter().find(|(n, _)| n == name).expect(name).1.clone();
    let (a, b) = (id("a"), id("b"));
    let ops = h.rt.ops();
    assert!(
        ops.contains(&term(&b)) && !ops.contains(&kill(&b)),
        "{ops:#?}"
    );
    let termed = h.rt.asked_at(&term(&a)).expect("a got SIGTERM");
    let killed = h.rt.asked_at(&kill(&a)).expect("a got SIGKILL");
    assert!(
        killed.duration_since(termed) >= Duration::from_secs(3),
        "SIGKILL {:?} after SIGTERM, within the grace",
        killed.duration_since(termed)
    );
    assert_eq!(h.running("keep"), keep, "the other pod untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_stops_answering_loses_no_container_and_a_change_waits_for_it() {
    let h = Harness::start().await;
    let before = h.run_pod("web").await;

    h.rt.set_reachable(false);
    h.wait_status("web", "the status says the engine is unreachable", |s| {
        s.message.contains("unreachable")
    })
    .await;
    let from = h.rt.ops().len();
    let looked = h.reconciles();
    h.put("web", &pod("web", "sleep, \"7200\"")).await;
    eventually(
        "a reconcile of the change while the engine is down",
        WAIT,
        || async { (h.reconciles() > looked).then_some(()) },
    )
    .await;
    assert_eq!(
        h.rt.ops().len(),
        from,
        "nothing asked of a down engine succeeded"
    );
    assert_eq!(h.running("web"), before);

    h.rt.set_reachable(true);
    let after = eventually(
        "the change applied once the engine answers",
        WAIT,
        || async {
            let now = h.running("web");
            let b = now.iter().find(|(n, _)| n == "b")?;
            (now.len() == 3 && !before.contains(b)).then_some(now)
        },
    )
    .await;
    for kept in ["a", "infra"] {
        let id = |v: &[(String, String)]| v.iter().find(|(n, _)| n == kept).cloned();
        assert_eq!(id(&after), id(&before), "{kept} kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_engine_reports_failed_but_that_ran_is_kept() {
    let h = Harness::start().await;
    h.rt.start_answers_error("b");
    h.put("web", &pod("web", "sleep, \"3600\"")).await;
    // The engine started b and said so on its event stream; its answer to the start, an error, comes
    // after the controller has seen the event.
    let b = eventually("b's start event seen by the controller", WAIT, || async {
        let shared = &h.agent.as_ref()?.handle.shared;
        shared
            .cache
            .pod("web")
            .containers
            .into_iter()
            .find(|c| c.labels.container == "b" && c.state.is_running())
    })
    .await;
    h.rt.release_errors();
    h.wait_status("web", "web running with b never restarted", |s| {
        s.phase == PodPhase::Running
            && s.ready
            && s.containers
                .iter()
                .all(|c| c.restart_count == 0 && matches!(c.state, ContainerState::Running { .. }))
    })
    .await;
    let bs: Vec<String> = h
        .running("web")
        .into_iter()
        .filter(|(n, _)| n == "b")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(bs, vec![b.id], "the b that runs is the one started first");
}
