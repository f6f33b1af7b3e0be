//! [`RejoinController`]: notices that this member must rejoin and prepares the rejoin.
//!
//! One key. It reconciles when the member cache changes (the members, or a status naming another
//! cluster), when the tombstone request key does, and when the supervisor says etcd exited removed; its
//! clocks (a removal confirmed a moment later, the other members asked every [`ASK_PEERS_EVERY`]) are its
//! own requeues. It fails closed: a removal is believed only from two looks that agree, or from two rounds
//! of the other members' answers that agree; silence or a look that fails never counts.
//!
//! Once it has decided and prepared the rejoin ([`RejoinEffects::perform`]), it hands the target to whoever
//! awaits [`RejoinOutcome`] and does nothing more. It reads and acts through [`RejoinEffects`]; its
//! sequencing is tested on [`super::fake`] on paused time.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hostlet_runtime::controller::backoff;
use hostlet_runtime::{Action, Controller, Metrics, Run};
use tokio::sync::{oneshot, Mutex};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::effects::{EtcdRejoin, RejoinEffects};
use super::handler::{confirmed_by_peers, PeersSay, RejoinCause, RejoinWatch};
use super::rejoin::{Rejoin, RejoinTarget};

/// The controller's name: its queue and reconcile metrics carry it.
pub const CONTROLLER: &str = "rejoin";

/// How often the other members are asked directly when nothing prompts it sooner (a member left behind
/// may still answer for itself with a stale member list).
pub const ASK_PEERS_EVERY: Duration = Duration::from_secs(120);
/// Least time between two rounds of asking the other members, whatever prompts them.
pub const ASK_PEERS_GAP: Duration = Duration::from_secs(10);
/// Between two looks or asks that must agree before a removal is believed.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(1);

/// The rejoin's clocks, kept between reconciles.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Clocks {
    /// Since when the cache has left this member out; a fresh look [`CONFIRM_AFTER`] later must agree.
    left_out_since: Option<Instant>,
    /// A first round of asking that said something, and when it ended; the next round must agree.
    first_round: Option<(PeersSay, Instant)>,
    /// When the last first round began.
    last_ask: Option<Instant>,
    /// When the other members are asked next, unprompted.
    next_ask: Instant,
}

impl Clocks {
    fn new(now: Instant) -> Self {
        Clocks {
            left_out_since: None,
            first_round: None,
            last_ask: None,
            next_ask: now + ASK_PEERS_EVERY,
        }
    }

    /// Starts or stops the removal's confirmation clock on what the cache shows now.
    fn observe(&mut self, left_out: bool, now: Instant) {
        match (left_out, self.left_out_since) {
            (false, _) => self.left_out_since = None,
            (true, None) => self.left_out_since = Some(now),
            (true, Some(_)) => {}
        }
    }
}

/// Which round of asking the other members is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    First,
    /// The one that must agree with the first.
    Second,
}

/// What one reconcile does, besides the request key and the supervisor's signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Take the fresh look that confirms the cache leaving this member out.
    confirm_list: bool,
    ask: Option<Round>,
}

/// What is due now, from the clocks and what the cache shows (`prompted`: a status names another
/// cluster).
fn plan(c: &Clocks, prompted: bool, now: Instant) -> Plan {
    let confirm_list = c.left_out_since.is_some_and(|t| now >= t + CONFIRM_AFTER);
    let ask = match &c.first_round {
        Some((_, at)) => (now >= *at + CONFIRM_AFTER).then_some(Round::Second),
        None => {
            let rested = c.last_ask.is_none_or(|t| now >= t + ASK_PEERS_GAP);
            (rested && (prompted || now >= c.next_ask)).then_some(Round::First)
        }
    };
    Plan { confirm_list, ask }
}

/// When to look again without a trigger: the earliest clock that falls due.
fn wake(c: &Clocks, prompted: bool) -> Instant {
    let mut at = c.next_ask;
    if let Some(t) = c.left_out_since {
        at = at.min(t + CONFIRM_AFTER);
    }
    if let Some((_, t)) = &c.first_round {
        at = at.min(*t + CONFIRM_AFTER);
    }
    // Prompted but asked only just now: again once the gap has passed.
    if let (true, Some(t)) = (prompted, c.last_ask) {
        at = at.min(t + ASK_PEERS_GAP);
    }
    at
}

struct State {
    clocks: Clocks,
    /// Prepared: nothing more to do.
    done: bool,
    /// Decided but not prepared yet (no node to rejoin through was found, etcd did not answer, the
    /// tombstone could not be written): tried again, never dropped.
    pending: Option<RejoinCause>,
}

/// How soon a rejoin decided but not prepared is tried again.
const PREPARE_AGAIN: Duration = Duration::from_secs(5);

/// Resolves to where the agent rejoins, once the controller has prepared a rejoin; to `None` when it
/// stopped without one (shutdown, or a rejoin it could not prepare by itself).
pub type RejoinOutcome = oneshot::Receiver<RejoinTarget>;

/// The rejoin controller. Build it with [`RejoinController::new`], start it with [`hostlet_runtime::spawn`].
pub struct RejoinController<E = EtcdRejoin> {
    effects: E,
    registry: Metrics,
    state: Mutex<State>,
    outcome: std::sync::Mutex<Option<oneshot::Sender<RejoinTarget>>>,
}

impl RejoinController {
    /// The controller on etcd, and the outcome to await.
    pub fn new(
        watch: RejoinWatch,
        rejoin: Rejoin,
        metrics: &Metrics,
    ) -> (Arc<Self>, RejoinOutcome) {
        RejoinController::with_effects(EtcdRejoin { watch, rejoin }, metrics)
    }
}

impl<E: RejoinEffects> RejoinController<E> {
    /// The controller on `effects`, and the outcome to await.
    pub fn with_effects(effects: E, metrics: &Metrics) -> (Arc<Self>, RejoinOutcome) {
        let (tx, rx) = oneshot::channel();
        let this = RejoinController {
            effects,
            registry: metrics.clone(),
            state: Mutex::new(State {
                clocks: Clocks::new(Instant::now()),
                done: false,
                pending: None,
            }),
            outcome: std::sync::Mutex::new(Some(tx)),
        };
        (Arc::new(this), rx)
    }

    /// One look, and the rejoin once it is decided.
    pub async fn reconcile(&self) -> Action {
        let mut st = self.state.lock().await;
        if st.done {
            return Action::AwaitChange;
        }
        let decided = match st.pending.take() {
            Some(c) => Some(c),
            None => self.decide(&mut st.clocks).await,
        };
        let Some(cause) = decided else {
            let prompted = self.effects.another_cluster_in_sight();
            let at = wake(&st.clocks, prompted);
            return Action::Requeue(at.saturating_duration_since(Instant::now()));
        };
        let Some(target) = self.effects.perform(cause.clone()).await else {
            // A rejoin once decided is not given up because one step failed for now.
            st.pending = Some(cause);
            return Action::Requeue(PREPARE_AGAIN);
        };
        st.done = true;
        // The request is answered only now: a rejoin that could not be prepared keeps it.
        self.effects.clear_request().await;
        let tx = self
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(target);
        }
        Action::AwaitChange
    }

    /// Whether this member must rejoin now, and why; moves the clocks along.
    async fn decide(&self, clocks: &mut Clocks) -> Option<RejoinCause> {
        let w = &self.effects;
        if let Some(cause) = w.requested().await {
            return Some(cause);
        }
        if let Some(cause) = w.removed_by_etcd().await {
            return Some(cause);
        }
        clocks.observe(w.left_out_of_cache(), Instant::now());
        let p = plan(clocks, w.another_cluster_in_sight(), Instant::now());
        if p.confirm_list {
            if let Some(cause) = w.confirm_removed_from_list().await {
                return Some(cause);
            }
            // Not confirmed: a look still leaving this member out starts the clock again.
            clocks.left_out_since = None;
            clocks.observe(w.left_out_of_cache(), Instant::now());
        }
        match p.ask {
            Some(Round::First) => {
                let now = Instant::now();
                clocks.last_ask = Some(now);
                clocks.next_ask = now + ASK_PEERS_EVERY;
                let said = w.ask_peers().await;
                if said != PeersSay::Nothing {
                    clocks.first_round = Some((said, Instant::now()));
                }
            }
            Some(Round::Second) => {
                let second = w.ask_peers().await;
                if let Some((first, _)) = clocks.first_round.take() {
                    if let Some(cause) = confirmed_by_peers(&first, second, w.member_id()) {
                        return Some(cause);
                    }
                }
            }
            None => {}
        }
        None
    }
}

impl<E: RejoinEffects> Run for RejoinController<E> {
    /// Runs until `shutdown` fires.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // The rejoin waits only for the request key's cache, as it reads nothing else before acting.
        let request = self.effects.request_store();
        Controller::new(CONTROLLER, self.clone(), &self.registry)
            .triggers(futures::stream::iter([()]))
            .watches(&request, |_| Some(()))
            .triggers(self.effects.changes())
            .run(
                |(), this: Arc<Self>| async move { Ok::<_, Infallible>(this.reconcile().await) },
                backoff,
                shutdown,
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn removed() -> PeersSay {
        PeersSay::Removed {
            by: "http://127.0.0.1:1".into(),
        }
    }

    #[test]
    fn the_plan_follows_the_clocks() {
        let t0 = Instant::now();
        let fresh = Clocks::new(t0);
        let asked = |at: Instant| Clocks {
            last_ask: Some(at),
            next_ask: at + ASK_PEERS_EVERY,
            ..Clocks::new(t0)
        };
        let plan_of = |confirm_list, ask| Plan { confirm_list, ask };
        #[rustfmt::skip]
        let cases: Vec<(&str, Clocks, bool, Instant, Plan)> = vec![
            ("nothing due at the start", fresh.clone(), false, t0, plan_of(false, None)),
            ("a status naming another cluster asks at once", fresh.clone(), true, t0, plan_of(false, Some(Round::First))),
            ("unprompted, the others are asked every 2 minutes", fresh.clone(), false, t0 + ASK_PEERS_EVERY, plan_of(false, Some(Round::First))),
            ("prompted again within the gap: not yet", asked(t0), true, t0 + s(9), plan_of(false, None)),
            ("prompted again after the gap", asked(t0), true, t0 + ASK_PEERS_GAP, plan_of(false, Some(Round::First))),
            ("unprompted after the gap: not before the period", asked(t0), false, t0 + s(60), plan_of(false, None)),
            (
                "left out just now: the fresh look waits a moment",
                Clocks { left_out_since: Some(t0), ..fresh.clone() }, false, t0 + Duration::from_millis(999), plan_of(false, None),
            ),
            (
                "left out a moment ago: the fresh look",
                Clocks { left_out_since: Some(t0), ..fresh.clone() }, false, t0 + CONFIRM_AFTER, plan_of(true, None),
            ),
            (
                "a first round that said something: the second a moment later",
                Clocks { first_round: Some((removed(), t0)), ..asked(t0) }, false, t0 + CONFIRM_AFTER, plan_of(false, Some(Round::Second)),
            ),
            (
                "the second round not before the moment has passed",
                Clocks { first_round: Some((removed(), t0)), ..asked(t0) }, true, t0 + Duration::from_millis(500), plan_of(false, None),
            ),
        ];
        for (what, clocks, prompted, now, want) in cases {
            assert_eq!(plan(&clocks, prompted, now), want, "{what}");
        }
    }

    #[test]
    fn the_wake_is_the_earliest_clock() {
        let t0 = Instant::now();
        let fresh = Clocks::new(t0);
        assert_eq!(wake(&fresh, false), t0 + ASK_PEERS_EVERY);
        assert_eq!(
            wake(&fresh, true),
            t0 + ASK_PEERS_EVERY,
            "never asked: no gap to wait for"
        );
        let asked = Clocks {
            last_ask: Some(t0),
            next_ask: t0 + ASK_PEERS_EVERY,
            ..fresh.clone()
        };
        assert_eq!(wake(&asked, false), t0 + ASK_PEERS_EVERY);
        assert_eq!(
            wake(&asked, true),
            t0 + ASK_PEERS_GAP,
            "prompted: once the gap has passed"
        );
        let left_out = Clocks {
            left_out_since: Some(t0 + s(3)),
            ..asked.clone()
        };
        assert_eq!(wake(&left_out, true), t0 + s(3) + CONFIRM_AFTER);
        let confirming = Clocks {
            first_round: Some((removed(), t0 + s(1))),
            ..asked
        };
        assert_eq!(wake(&confirming, false), t0 + s(1) + CONFIRM_AFTER);
    }

    #[test]
    fn the_removal_clock_starts_once_and_stops_when_the_member_is_back() {
        let t0 = Instant::now();
        let mut c = Clocks::new(t0);
        c.observe(true, t0);
        c.observe(true, t0 + s(5));
        assert_eq!(c.left_out_since, Some(t0), "the first sight counts");
        c.observe(false, t0 + s(6));
        assert_eq!(c.left_out_since, None);
    }
}
