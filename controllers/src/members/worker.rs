//! The worker loop both membership controllers share: take a key from the queue, reconcile it, requeue as
//! the reconcile asks, count it. One worker per controller: their reconciles read and write one shared
//! record each, and there is only ever a handful of keys.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use hostlet_runtime::metrics::ControllerMetrics;
use hostlet_runtime::{QueueKey, WorkQueue};
use tokio_util::sync::CancellationToken;

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run this key again after the delay.
    Requeue(Duration),
    /// Nothing more until a trigger adds the key again.
    AwaitChange,
}

/// Runs `reconcile` over the queue's keys until `shutdown` fires. A failed or panicking reconcile is
/// counted and its key retried after `retry` (the membership controllers poll, so a short flat retry
/// serves them better than a growing backoff).
pub async fn run_worker<K, F, Fut, E>(
    name: &str,
    queue: &WorkQueue<K>,
    metrics: &ControllerMetrics,
    retry: Duration,
    shutdown: &CancellationToken,
    reconcile: F,
) where
    K: QueueKey,
    F: Fn(K) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: std::fmt::Display,
{
    loop {
        let key = tokio::select! {
            _ = shutdown.cancelled() => return,
            k = queue.get() => match k {
                Some(k) => k,
                None => return,
            },
        };
        let started = tokio::time::Instant::now();
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => {
                queue.done(&key);
                return;
            }
            r = AssertUnwindSafe(reconcile(key.clone())).catch_unwind() => r,
        };
        metrics.duration.observe(started.elapsed().as_secs_f64());
        queue.done(&key);
        match outcome {
            Ok(Ok(Action::Requeue(after))) => {
                metrics.requeue.inc();
                queue.forget(&key);
                queue.add_after(key, after);
            }
            Ok(Ok(Action::AwaitChange)) => {
                metrics.success.inc();
                queue.forget(&key);
            }
            Ok(Err(e)) => {
                metrics.error.inc();
                metrics.errors.inc();
                tracing::warn!(controller = name, key = ?key, error = %e, retry_in = ?retry, "reconcile failed");
                queue.add_after(key, retry);
            }
            Err(_) => {
                metrics.errors.inc();
                metrics.panics.inc();
                tracing::error!(controller = name, key = ?key, "reconcile panicked");
                queue.add_after(key, retry);
            }
        }
    }
}
