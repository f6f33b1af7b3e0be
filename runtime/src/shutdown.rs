//! The agent's shutdown: the first SIGINT/SIGTERM asks every task to drain, a second one asks to abort.
//! Every spawned task is tied to [`Shutdown::token`].

use tokio_util::sync::CancellationToken;

/// Two tokens: drain (first signal) and abort (second signal).
///
/// ```no_run
/// # async fn demo(tasks: tokio::task::JoinSet<()>) -> std::io::Result<()> {
/// let shutdown = hostlet_runtime::Shutdown::new();
/// shutdown.listen_for_signals()?;
/// // …hand `shutdown.token()` to every informer and controller, then:
/// shutdown.token().cancelled().await;
/// let abort = shutdown.abort_token();
/// tokio::select! {
///     _ = tasks.join_all() => {}      // drained
///     _ = abort.cancelled() => {}     // asked again: stop now
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    drain: CancellationToken,
    abort: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancelled when the agent should stop gracefully.
    pub fn token(&self) -> CancellationToken {
        self.drain.clone()
    }

    /// Cancelled when the agent should stop now.
    pub fn abort_token(&self) -> CancellationToken {
        self.abort.clone()
    }

    /// Asks for a graceful stop, or, when one was already asked for, for an immediate one.
    pub fn signal(&self) {
        if self.drain.is_cancelled() {
            self.abort.cancel();
        } else {
            self.drain.cancel();
        }
    }

    /// Turns SIGINT and SIGTERM into [`Shutdown::signal`] calls, in a background task.
    pub fn listen_for_signals(&self) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        Ok(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tracing::info!(
                    draining = !this.drain.is_cancelled(),
                    "shutdown signal received"
                );
                this.signal();
                if this.abort.is_cancelled() {
                    return;
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_signal_drains_second_aborts() {
        let s = Shutdown::new();
        s.signal();
        assert!(s.token().is_cancelled());
        assert!(!s.abort_token().is_cancelled());
        s.signal();
        assert!(s.abort_token().is_cancelled());
    }
}
