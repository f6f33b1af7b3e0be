//! Restart delays: CrashLoopBackOff for containers that keep exiting, and the image pull backoff.

use std::time::Duration;

use hostlet_runtime::ExponentialBackoff;
use tokio::time::Instant;

/// The first wait of a crash loop (the first restart itself is immediate).
pub const CRASH_INITIAL: Duration = Duration::from_secs(10);
pub const CRASH_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before exiting starts the series again.
pub const CRASH_RESET_AFTER: Duration = Duration::from_secs(600);

/// The waits of a crash loop and of failed pulls: [`CRASH_INITIAL`] doubling to [`CRASH_MAX`].
fn crash_series() -> ExponentialBackoff {
    ExponentialBackoff::new(CRASH_INITIAL, CRASH_MAX)
}

/// CrashLoopBackOff of one container of a pod: restarts wait 0, 10, 20, 40 … 300 s; a run of 10 minutes
/// resets the series. A value type: the planner computes the next state, the executor stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CrashLoopBackoff {
    /// Waits given since the series (re)started; the next exit gets the series' wait of this number
    /// (none while it is 0: the first restart is immediate).
    waits: u32,
    /// When the container was last started by hostlet (`None` for adopted containers).
    last_start: Option<Instant>,
}

impl CrashLoopBackoff {
    /// The wait before restarting a container that exited at `now`, and the state after it.
    #[must_use]
    pub fn after_exit(&self, now: Instant) -> (Duration, CrashLoopBackoff) {
        let ran_long = self
            .last_start
            .is_some_and(|s| now.saturating_duration_since(s) >= CRASH_RESET_AFTER);
        let (wait, waits) = if ran_long || self.waits == 0 {
            (Duration::ZERO, 1)
        } else {
            (
                crash_series().delay_for(self.waits - 1),
                self.waits.saturating_add(1),
            )
        };
        (
            wait,
            CrashLoopBackoff {
                waits,
                last_start: self.last_start,
            },
        )
    }

    /// Records that the container was (re)started at `now`: its run time counts from here.
    pub fn started(&mut self, now: Instant) {
        self.last_start = Some(now);
    }
}

/// The wait after the `failures`-th failed pull in a row: 10 s doubling to 300 s.
pub fn pull_backoff(failures: u32) -> Duration {
    crash_series().delay_for(failures.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container that crashes 2 s after every start: the waits are 0, 10, 20, 40, 80, 160, 300, 300 s.
    #[tokio::test(start_paused = true)]
    async fn crash_loop_waits_double_to_five_minutes() {
        let mut b = CrashLoopBackoff::default();
        let mut waits = Vec::new();
        b.started(Instant::now());
        for _ in 0..8 {
            tokio::time::advance(Duration::from_secs(2)).await;
            let (wait, next) = b.after_exit(Instant::now());
            waits.push(wait.as_secs());
            b = next;
            tokio::time::advance(wait).await;
            b.started(Instant::now());
        }
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn ten_minutes_of_running_resets_the_series() {
        let mut b = CrashLoopBackoff::default();
        for _ in 0..4 {
            b.started(Instant::now());
            tokio::time::advance(Duration::from_secs(1)).await;
            b = b.after_exit(Instant::now()).1;
        }
        b.started(Instant::now());
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(
            b.after_exit(Instant::now()).0,
            Duration::from_secs(80),
            "9m59s is not long enough"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let (wait, next) = b.after_exit(Instant::now());
        assert_eq!(wait, Duration::ZERO, "a 10 minute run restarts at once");
        b = next;
        b.started(Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.after_exit(Instant::now()).0, CRASH_INITIAL);
    }

    #[tokio::test(start_paused = true)]
    async fn an_adopted_container_restarts_at_once_on_its_first_exit() {
        let b = CrashLoopBackoff::default();
        assert_eq!(b.after_exit(Instant::now()).0, Duration::ZERO);
    }

    #[test]
    fn pull_waits_double_to_five_minutes() {
        let waits: Vec<u64> = (1..=7).map(|n| pull_backoff(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(pull_backoff(u32::MAX), CRASH_MAX);
    }
}
