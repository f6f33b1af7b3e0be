//! Lifecycle hooks as the kubelet runs them: `postStart` right after a container starts (it is not
//! Running until the hook returns; a failed hook kills it), `preStop` before its stop signal, within the
//! pod's grace period (a failed hook is an event, and the stop goes on).

use hostlet_api::manifest::{Container, HookAction, LifecycleHandler};

use super::*;

/// How long a `postStart` hook may run before it counts as failed.
pub(super) const POST_START_LIMIT: Duration = Duration::from_secs(120);

impl<R: ContainerRuntime> Shared<R> {
    /// Runs `hook` of container `c` (running as `id`) of `pod`, for at most `budget`.
    pub(super) async fn run_hook(
        &self,
        pod: &str,
        c: &Container,
        id: &str,
        hook: &LifecycleHandler,
        budget: Duration,
    ) -> Result<(), String> {
        let run = async {
            match hook.action() {
                None => Err("no handler: give one of exec, httpGet and sleep".to_string()),
                Some(HookAction::Sleep(secs)) => {
                    tokio::time::sleep(Duration::from_secs(secs.max(0) as u64)).await;
                    Ok(())
                }
                Some(HookAction::Exec(e)) => match self.rt.exec(id, &e.command, budget).await {
                    Ok(0) => Ok(()),
                    Ok(code) => Err(format!("command {:?} exited with {code}", e.command)),
                    Err(err) => Err(err.to_string()),
                },
                Some(HookAction::Http(h)) => {
                    let port = h.port.resolve(c).ok_or("unknown port")?;
                    let host = h
                        .host
                        .clone()
                        .filter(|h| !h.is_empty())
                        .or_else(|| {
                            self.cache
                                .pod(pod)
                                .infra()
                                .and_then(|i| i.ip)
                                .map(|ip| ip.to_string())
                        })
                        .ok_or("the pod has no address")?;
                    let path = h.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
                    let url = format!("http://{host}:{port}{path}");
                    match crate::pods::probes::probe_client()
                        .get(&url)
                        .timeout(budget)
                        .send()
                        .await
                    {
                        Ok(r) if (200..400).contains(&r.status().as_u16()) => Ok(()),
                        Ok(r) => Err(format!("GET {url}: HTTP {}", r.status().as_u16())),
                        Err(e) => Err(format!("GET {url}: {}", crate::http_failure(&e))),
                    }
                }
            }
        };
        match tokio::time::timeout(budget, run).await {
            Ok(r) => r,
            Err(_) => Err(format!("did not end within {}s", budget.as_secs())),
        }
    }

    /// After container `name` of `pod` started as `id`: its `postStart` hook, if it has one. A failed
    /// hook kills the container (its restart policy takes it from there); `false` then.
    pub(super) async fn post_start(
        &self,
        pod: &str,
        desired: Option<&DesiredPod>,
        name: &str,
        id: &str,
    ) -> bool {
        let Some(c) = desired.and_then(|d| d.manifest.all_containers().find(|c| c.name == name))
        else {
            return true;
        };
        let Some(hook) = c.post_start() else {
            return true;
        };
        let Err(why) = self.run_hook(pod, c, id, hook, POST_START_LIMIT).await else {
            return true;
        };
        self.status.event(
            pod,
            Some(name),
            "FailedPostStartHook",
            &format!("PostStartHook failed: {why}; the container is killed"),
            true,
        );
        if let Err(e) = self.rt.kill(id).await {
            tracing::warn!(pod, container = name, error = %e, "cannot kill a container whose postStart hook failed");
        }
        false
    }

    /// Stops the containers `steps` stop, side by side: each runs its `preStop` hook (within its grace
    /// period; a failed hook is an event) and then gets its stop signal (its own `lifecycle.stopSignal`,
    /// else its image's `STOPSIGNAL`, else SIGTERM). By container id: when its stop began (the grace
    /// counts from there) and how the signal went.
    pub(super) async fn stop_containers(
        &self,
        pod: &str,
        steps: &[Step],
        memory: &PodRuntimeState,
    ) -> HashMap<String, (Instant, Result<(), RuntimeError>)> {
        let stops = steps.iter().filter_map(|s| match s {
            Step::Terminate {
                id,
                container,
                grace,
                ..
            } => Some((id, container, memory.pre_stop.get(container), *grace)),
            _ => None,
        });
        futures::future::join_all(stops.map(|(id, name, c, grace)| async move {
            let began = Instant::now();
            if let Some((c, hook)) = c.and_then(|c| Some((c, c.pre_stop()?))) {
                if let Err(why) = self.run_hook(pod, c, id, hook, grace).await {
                    self.status.event(
                        pod,
                        Some(name),
                        "FailedPreStopHook",
                        &format!("PreStopHook failed: {why}; the stop goes on"),
                        true,
                    );
                }
            }
            let signalled = match self.rt.stop_signal(id).await {
                Ok(signal) => self.rt.signal(id, &signal).await,
                Err(e) => Err(e),
            };
            (id.clone(), (began, signalled))
        }))
        .await
        .into_iter()
        .collect()
    }
}
