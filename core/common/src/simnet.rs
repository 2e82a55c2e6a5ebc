//! The simulated network every deterministic test drives: one model of a
//! link's faults and one queue of frames in flight, shared by the
//! consensus harness (the `vsr_harness` crate), the partition tests'
//! `InMemoryNetwork` and the shard's `TestNet` (and through it the
//! simulator), each of which is a thin view that chooses its payload and
//! its fault mix.
//!
//! Time is a tick count the caller passes in; randomness is a [`Prng`]
//! the caller lends to each send, so a view can share one stream with the
//! rest of its harness. Nothing here reads a clock or spawns anything.

use std::collections::{BTreeMap, BTreeSet};

use crate::Prng;

/// Fault knobs of a network (per-mille chances, tick delays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetworkFaults {
    /// Chance a frame is dropped.
    pub drop_per_mille: u64,
    /// Chance a frame is delivered twice.
    pub duplicate_per_mille: u64,
    /// Largest extra delivery delay in ticks (delays reorder frames).
    pub delay_ticks_max: u64,
}

/// How one send is drawn. A fault that is `None` is off and costs no
/// draw, so a view whose fault is switched off keeps the random stream it
/// had before the fault existed; `Some(0)` draws and never fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkDraw {
    /// Per-mille chance the frame is lost.
    pub drop_per_mille: Option<u64>,
    /// Per-mille chance the frame arrives twice.
    pub duplicate_per_mille: Option<u64>,
    /// Each copy arrives `1 + uniform(0..=delay_extra_max)` ticks later.
    pub delay_extra_max: u64,
    /// Per-mille chance, per copy, of a further `uniform(0..=ticks)`.
    pub long_delay: Option<(u64, u64)>,
}

impl LinkDraw {
    /// The draw of a network with `faults`, every fault drawn even at 0
    /// (the shard's `TestNet`).
    pub fn always(faults: NetworkFaults) -> Self {
        Self {
            drop_per_mille: Some(faults.drop_per_mille),
            duplicate_per_mille: Some(faults.duplicate_per_mille),
            delay_extra_max: faults.delay_ticks_max,
            long_delay: None,
        }
    }

    /// The draw of a network with `faults`, a fault at 0 not drawn (the
    /// partition tests' `InMemoryNetwork`).
    pub fn when_set(faults: NetworkFaults) -> Self {
        Self {
            drop_per_mille: (faults.drop_per_mille > 0).then_some(faults.drop_per_mille),
            duplicate_per_mille: (faults.duplicate_per_mille > 0)
                .then_some(faults.duplicate_per_mille),
            delay_extra_max: faults.delay_ticks_max,
            long_delay: None,
        }
    }
}

/// What became of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The link is cut or an end isolated: nothing was drawn.
    Blocked,
    /// The fault draw lost it on the wire.
    Lost,
    /// Queued, once or (duplicated) twice.
    Queued {
        /// 1 or 2.
        copies: u8,
    },
}

/// Frames in flight between numbered replicas, and which links carry
/// nothing.
#[derive(Debug, Clone)]
pub struct SimNet<P> {
    /// (due tick, sequence) → (from, to, payload): a deterministic queue.
    in_flight: BTreeMap<(u64, u64), (u8, u8, P)>,
    sequence: u64,
    isolated: BTreeSet<u8>,
    /// Directed links `(from, to)` that carry nothing.
    cut: BTreeSet<(u8, u8)>,
    sent: u64,
    dropped: u64,
    duplicated: u64,
}

impl<P> Default for SimNet<P> {
    fn default() -> Self {
        Self {
            in_flight: BTreeMap::new(),
            sequence: 0,
            isolated: BTreeSet::new(),
            cut: BTreeSet::new(),
            sent: 0,
            dropped: 0,
            duplicated: 0,
        }
    }
}

impl<P: Clone> SimNet<P> {
    /// An empty network with every link up.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `from → to` carries nothing now.
    pub fn blocked(&self, from: u8, to: u8) -> bool {
        self.isolated.contains(&from)
            || self.isolated.contains(&to)
            || self.cut.contains(&(from, to))
    }

    /// Sends `payload` from `from` to `to` at tick `now`: blocked without a
    /// draw, else drawn by `draw` from `prng` and queued for a later tick.
    pub fn send(
        &mut self,
        now: u64,
        prng: &mut Prng,
        draw: &LinkDraw,
        (from, to): (u8, u8),
        payload: P,
    ) -> Fate {
        self.sent += 1;
        if self.blocked(from, to) {
            self.dropped += 1;
            return Fate::Blocked;
        }
        if draw.drop_per_mille.is_some_and(|p| prng.chance(p, 1000)) {
            self.dropped += 1;
            return Fate::Lost;
        }
        let copies = if draw
            .duplicate_per_mille
            .is_some_and(|p| prng.chance(p, 1000))
        {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = 1 + prng.below_inclusive(draw.delay_extra_max);
            if let Some((per_mille, ticks)) = draw.long_delay
                && prng.chance(per_mille, 1000)
            {
                delay += prng.below_inclusive(ticks);
            }
            self.sequence += 1;
            let key = (now + delay, self.sequence);
            self.in_flight.insert(key, (from, to, payload.clone()));
        }
        Fate::Queued { copies }
    }

    /// The frames due by tick `now`, in (due, send) order, as `(from, to,
    /// payload)`. With `drop_blocked`, a frame whose link was cut while it
    /// was on the wire is lost too; without, a cut only stops new sends.
    pub fn take_due(&mut self, now: u64, drop_blocked: bool) -> Vec<(u8, u8, P)> {
        let later = self.in_flight.split_off(&(now + 1, 0));
        let due = std::mem::replace(&mut self.in_flight, later);
        let mut out = Vec::with_capacity(due.len());
        for (_, (from, to, payload)) in due {
            if drop_blocked && self.blocked(from, to) {
                self.dropped += 1;
            } else {
                out.push((from, to, payload));
            }
        }
        out
    }

    /// Cuts `replica` off (frames to and from it are dropped) or heals it.
    pub fn set_isolated(&mut self, replica: u8, isolated: bool) {
        if isolated {
            self.isolated.insert(replica);
        } else {
            self.isolated.remove(&replica);
        }
    }

    /// Cuts the directed link `from → to` or restores it.
    pub fn set_link_cut(&mut self, from: u8, to: u8, cut: bool) {
        if cut {
            self.cut.insert((from, to));
        } else {
            self.cut.remove(&(from, to));
        }
    }

    /// Splits replicas `0..replicas` in two: bit `r` of `side_b` set puts
    /// replica `r` on side B, and every link across the sides is cut.
    pub fn split(&mut self, replicas: u8, side_b: u32) {
        let side = |r: u8| r < 32 && side_b & (1u32 << r) != 0;
        for a in 0..replicas {
            for b in 0..replicas {
                if side(a) != side(b) {
                    self.cut.insert((a, b));
                }
            }
        }
    }

    /// Removes every isolation and cut. Frames in flight stay.
    pub fn heal(&mut self) {
        self.isolated.clear();
        self.cut.clear();
    }

    /// Frames queued and not yet due.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Frames sent and dropped so far (blocked or lost).
    pub fn counts(&self) -> (u64, u64) {
        (self.sent, self.dropped)
    }

    /// Sends delivered twice so far.
    pub fn duplicated(&self) -> u64 {
        self.duplicated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_quiet_link_when_sent_should_arrive_next_tick_in_send_order() {
        let mut net = SimNet::new();
        let mut prng = Prng::new(1);
        let draw = LinkDraw::always(NetworkFaults::default());
        for n in 0..5u32 {
            net.send(0, &mut prng, &draw, (0, 1), n);
        }
        assert!(net.take_due(0, true).is_empty());
        let got: Vec<u32> = net
            .take_due(1, true)
            .into_iter()
            .map(|(_, _, p)| p)
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert_eq!(net.in_flight(), 0);
    }

    #[test]
    fn given_a_cut_when_sent_or_in_flight_should_lose_the_frame_without_a_draw() {
        let mut net = SimNet::new();
        let mut prng = Prng::new(2);
        let draw = LinkDraw::always(NetworkFaults::default());
        net.send(0, &mut prng, &draw, (0, 1), 'a');
        net.split(3, 0b010);
        let before = prng.clone();
        assert_eq!(net.send(0, &mut prng, &draw, (0, 1), 'b'), Fate::Blocked);
        assert_eq!(prng, before, "a blocked send must not draw");
        assert_eq!(
            net.send(0, &mut prng, &draw, (0, 2), 'c'),
            Fate::Queued { copies: 1 }
        );
        // 'a' was on the wire when the split came: lost with drop_blocked.
        let got: Vec<char> = net
            .take_due(5, true)
            .into_iter()
            .map(|(_, _, p)| p)
            .collect();
        assert_eq!(got, vec!['c']);
        net.heal();
        assert!(!net.blocked(0, 1));
    }

    #[test]
    fn given_a_fault_switched_off_when_sent_should_not_draw_for_it() {
        let mut net = SimNet::new();
        let mut prng = Prng::new(3);
        let draw = LinkDraw::when_set(NetworkFaults::default());
        let mut reference = prng.clone();
        net.send(0, &mut prng, &draw, (0, 1), ());
        // Only the delay was drawn.
        reference.below_inclusive(0);
        assert_eq!(prng, reference);
    }

    #[test]
    fn given_one_seed_when_faulty_should_replay_identically_and_fault_something() {
        let faults = NetworkFaults {
            drop_per_mille: 200,
            duplicate_per_mille: 200,
            delay_ticks_max: 5,
        };
        let run = || {
            let mut net = SimNet::new();
            let mut prng = Prng::new(42);
            let draw = LinkDraw {
                long_delay: Some((100, 20)),
                ..LinkDraw::always(faults)
            };
            for n in 0..200u32 {
                net.send(0, &mut prng, &draw, (0, 1), n);
            }
            (net.take_due(100, true), net.counts(), net.duplicated())
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.1.1 > 0 && a.2 > 0, "faults changed nothing");
        assert_ne!(a.0.len(), 200);
    }
}
