//! Timeouts counted in ticks, with exponential backoff and seeded jitter.
//!
//! The core has no clock: the driver calls `on_tick` at a fixed interval
//! (10 ms in the reference) and every timer counts those ticks. Retransmit
//! and election timers back off as `after * 2^min(attempts, 4)` plus a
//! uniform jitter in `[0, backoff]` drawn from [`Prng`], seeded per replica
//! and group, so two replicas that timed out together do not keep
//! colliding, and a run is still reproducible from its seed.

use common::Prng;

/// Default tick counts (reference §8.4; one tick is 10 ms in production).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutConfig {
    /// Primary retransmits un-acked prepares.
    pub prepare_ticks: u64,
    /// Primary heartbeat (`Commit`) interval.
    pub commit_message_ticks: u64,
    /// Backup's primary-liveness window.
    pub normal_heartbeat_ticks: u64,
    /// StartViewChange retransmit.
    pub start_view_change_message_ticks: u64,
    /// DoViewChange retransmit.
    pub do_view_change_message_ticks: u64,
    /// A view change stuck this long escalates to the next view.
    pub view_change_status_ticks: u64,
    /// RequestStartView re-probe.
    pub request_start_view_message_ticks: u64,
    /// Repair re-request after a stalled slice.
    pub repair_ticks: u64,
    /// A started state transfer that has not been installed is abandoned
    /// (and repair retried) after this many ticks.
    pub state_transfer_ticks: u64,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            prepare_ticks: 25,
            commit_message_ticks: 50,
            normal_heartbeat_ticks: 500,
            start_view_change_message_ticks: 50,
            do_view_change_message_ticks: 50,
            view_change_status_ticks: 500,
            request_start_view_message_ticks: 100,
            repair_ticks: 100,
            state_transfer_ticks: 1000,
        }
    }
}

impl TimeoutConfig {
    /// Every timeout divided by `factor` (at least 2 ticks), for fast
    /// simulations; the ratios between timeouts are kept.
    pub fn scaled_down(factor: u64) -> Self {
        let d = Self::default();
        let f = factor.max(1);
        let s = |t: u64| (t / f).max(2);
        Self {
            prepare_ticks: s(d.prepare_ticks),
            commit_message_ticks: s(d.commit_message_ticks),
            normal_heartbeat_ticks: s(d.normal_heartbeat_ticks),
            start_view_change_message_ticks: s(d.start_view_change_message_ticks),
            do_view_change_message_ticks: s(d.do_view_change_message_ticks),
            view_change_status_ticks: s(d.view_change_status_ticks),
            request_start_view_message_ticks: s(d.request_start_view_message_ticks),
            repair_ticks: s(d.repair_ticks),
            state_transfer_ticks: s(d.state_transfer_ticks),
        }
    }
}

/// One timer: armed with a tick count, fires when it reaches zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    after_ticks: u64,
    attempts: u32,
    remaining_ticks: Option<u64>,
}

impl Timeout {
    /// A stopped timer that fires `after_ticks` after being started.
    pub const fn new(after_ticks: u64) -> Self {
        Self {
            after_ticks,
            attempts: 0,
            remaining_ticks: None,
        }
    }

    /// Arm for `after_ticks`, clearing the backoff.
    pub fn start(&mut self) {
        self.attempts = 0;
        self.remaining_ticks = Some(self.after_ticks.max(1));
    }

    /// Arm for `after_ticks` plus up to a quarter of it in jitter: used by
    /// the election timers so that backups do not time out in lockstep.
    pub fn start_jittered(&mut self, prng: &mut Prng) {
        self.attempts = 0;
        let jitter = prng.below_inclusive(self.after_ticks / 4);
        self.remaining_ticks = Some(self.after_ticks.max(1) + jitter);
    }

    /// Disarm.
    pub fn stop(&mut self) {
        self.remaining_ticks = None;
        self.attempts = 0;
    }

    /// Re-arm after a firing with exponential backoff and jitter.
    pub fn backoff(&mut self, prng: &mut Prng) {
        self.attempts = self.attempts.saturating_add(1);
        let backoff = self.after_ticks.max(1) << self.attempts.min(4);
        let jitter = prng.below_inclusive(backoff);
        self.remaining_ticks = Some(backoff + jitter);
    }

    /// Whether the timer is armed.
    pub const fn running(&self) -> bool {
        self.remaining_ticks.is_some()
    }

    /// The tick, counted from the next one (1), on which it fires; `None`
    /// when stopped.
    pub const fn fires_in(&self) -> Option<u64> {
        self.remaining_ticks
    }

    /// Counts `n` ticks none of which fires it (`n` below
    /// [`Self::fires_in`]), as `n` calls of [`Self::tick`] would.
    pub fn skip(&mut self, n: u64) {
        if let Some(r) = self.remaining_ticks.as_mut() {
            debug_assert!(n < *r, "skipping past a firing");
            *r = r.saturating_sub(n).max(1);
        }
    }

    /// Count one tick; true when the timer fires (it is then disarmed until
    /// re-armed by `start` or `backoff`).
    pub fn tick(&mut self) -> bool {
        match self.remaining_ticks {
            Some(r) if r <= 1 => {
                self.remaining_ticks = None;
                true
            }
            Some(r) => {
                self.remaining_ticks = Some(r - 1);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_started_timer_when_ticked_should_fire_once_at_deadline() {
        let mut t = Timeout::new(3);
        t.start();
        assert!(!t.tick());
        assert!(!t.tick());
        assert!(t.tick());
        assert!(!t.tick());
        assert!(!t.running());
    }

    #[test]
    fn given_a_timer_when_ticks_are_skipped_short_of_firing_should_fire_on_the_same_tick() {
        for after in [1u64, 2, 7, 50] {
            for skipped in 0..after {
                let mut eager = Timeout::new(after);
                let mut lazy = Timeout::new(after);
                eager.start();
                lazy.start();
                assert_eq!(lazy.fires_in(), Some(after));
                for _ in 0..skipped {
                    assert!(!eager.tick());
                }
                lazy.skip(skipped);
                assert_eq!(lazy, eager, "after {after}, skipped {skipped}");
                assert_eq!(lazy.fires_in(), Some(after - skipped));
            }
        }
        let mut stopped = Timeout::new(5);
        stopped.skip(100);
        assert_eq!(stopped.fires_in(), None);
    }

    #[test]
    fn given_repeated_backoff_should_cap_at_sixteen_times_plus_jitter() {
        let mut prng = Prng::new(1);
        let mut t = Timeout::new(10);
        for _ in 0..10 {
            t.backoff(&mut prng);
        }
        let mut ticks = 0;
        while !t.tick() {
            ticks += 1;
        }
        assert!(ticks < 10 * 16 * 2);
        assert!(ticks + 1 >= 10 * 16);
    }
}
