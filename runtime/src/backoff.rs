//! Exponential backoff with optional jitter and a reset after a quiet period.
//!
//! The one backoff of the workspace. Used by the informers (0.8 s → 30 s, jittered, reset after two quiet
//! minutes) and the work queue's per-key retries (5 ms → 1000 s); the controllers use it for their own
//! retry loops (etcd restarts, join attempts, writers waiting for etcd or Docker) and for the arithmetic of
//! the crash-loop and image pull backoffs, whose state they keep per container.

use std::time::Duration;

use tokio::time::Instant;

/// Delays that grow by `factor` from `initial` up to `max`.
///
/// ```
/// use std::time::Duration;
/// use hostlet_runtime::ExponentialBackoff;
/// let mut b = ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(b.next_delay(), Duration::from_millis(100));
/// assert_eq!(b.next_delay(), Duration::from_millis(200));
/// b.reset();
/// assert_eq!(b.next_delay(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
    factor: f64,
    jitter: f64,
    reset_after: Option<Duration>,
    /// Delays given at `initial` before the growth starts (at least 1).
    steady: u32,
    attempt: u32,
    last: Option<Instant>,
}

impl ExponentialBackoff {
    /// Doubling from `initial` to `max`, no jitter, never reset by itself.
    pub fn new(initial: Duration, max: Duration) -> Self {
        ExponentialBackoff {
            initial,
            max: max.max(initial),
            factor: 2.0,
            jitter: 0.0,
            reset_after: None,
            steady: 1,
            attempt: 0,
            last: None,
        }
    }

    /// The informers' backoff: ≈0.8 s doubling to 30 s, ±25 % jitter, reset after 2 quiet minutes.
    pub fn for_informer() -> Self {
        ExponentialBackoff::new(Duration::from_millis(800), Duration::from_secs(30))
            .with_jitter(0.25)
            .with_reset_after(Duration::from_secs(120))
    }

    #[must_use]
    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor.max(1.0);
        self
    }

    /// Spreads each delay uniformly over `±fraction` of itself (capped at `max`), so that many clients
    /// failing together do not retry together.
    #[must_use]
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// Starts over when no delay was asked for during `quiet`: a failure after a long healthy stretch is
    /// a new incident, not the next step of the old one.
    #[must_use]
    pub fn with_reset_after(mut self, quiet: Duration) -> Self {
        self.reset_after = Some(quiet);
        self
    }

    /// The first `count` delays are all `initial`; the growth starts after them. For a refusal that
    /// usually clears within a few tries, retried briskly before backing off.
    #[must_use]
    pub fn with_steady_start(mut self, count: u32) -> Self {
        self.steady = count.max(1);
        self
    }

    /// The un-jittered delay before retry number `attempt` (0-based).
    pub fn delay_for(&self, attempt: u32) -> Duration {
        let grown = attempt.saturating_sub(self.steady - 1);
        let secs = self.initial.as_secs_f64() * self.factor.powi(grown.min(1000) as i32);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The next delay; advances the sequence.
    pub fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if let (Some(quiet), Some(last)) = (self.reset_after, self.last) {
            if now.duration_since(last) >= quiet {
                self.attempt = 0;
            }
        }
        self.last = Some(now);
        let base = self.delay_for(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        if self.jitter == 0.0 {
            return base;
        }
        let spread = rand::random_range(-self.jitter..=self.jitter);
        Duration::from_secs_f64((base.as_secs_f64() * (1.0 + spread)).max(0.0)).min(self.max)
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.attempt = 0;
        self.last = None;
    }

    /// Delays handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(1000));
        assert_eq!(b.delay_for(0), Duration::from_millis(5));
        assert_eq!(b.delay_for(1), Duration::from_millis(10));
        assert_eq!(b.delay_for(10), Duration::from_millis(5120));
        assert_eq!(b.delay_for(30), Duration::from_secs(1000));
        assert_eq!(b.delay_for(u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn jitter_stays_within_its_fraction_and_the_cap() {
        let mut b = ExponentialBackoff::for_informer();
        for attempt in 0..20 {
            let base = b.delay_for(attempt);
            let d = b.next_delay();
            assert!(d <= Duration::from_secs(30));
            assert!(
                d.as_secs_f64() >= base.as_secs_f64() * 0.75 - 1e-9,
                "{d:?} < {base:?}"
            );
            assert!(
                d.as_secs_f64() <= base.as_secs_f64() * 1.25 + 1e-9,
                "{d:?} > {base:?}"
            );
        }
    }

    #[test]
    fn a_steady_start_holds_the_first_delay_then_grows() {
        let b = ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30))
            .with_steady_start(3);
        let got: Vec<u64> = (0..9).map(|a| b.delay_for(a).as_secs()).collect();
        assert_eq!(got, [1, 1, 1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.delay_for(u32::MAX), Duration::from_secs(30));
        let plain = ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let zero = plain.clone().with_steady_start(0);
        for a in 0..8 {
            assert_eq!(
                zero.delay_for(a),
                plain.delay_for(a),
                "0 and 1 are the plain series"
            );
        }
    }

    #[test]
    fn next_delay_follows_delay_for_and_reset_starts_over() {
        let mut b = ExponentialBackoff::new(Duration::from_millis(500), Duration::from_secs(10))
            .with_steady_start(2);
        let got: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        let want: Vec<Duration> = (0..8).map(|a| b.delay_for(a)).collect();
        assert_eq!(got, want);
        assert_eq!(b.attempts(), 8);
        assert_eq!(got.last(), Some(&Duration::from_secs(10)));
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.next_delay(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_resets_after_a_quiet_period() {
        let mut b = ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30))
            .with_reset_after(Duration::from_secs(120));
        assert_eq!(b.next_delay(), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(b.next_delay(), Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }
}
