//! The message bus a partition talks through, and an in-memory one.
//!
//! A [`Partition`](crate::Partition) never opens a socket: it hands frames
//! for its peers and replies for its clients to a [`MessageBus`]. The shard
//! implements it over its replica connections; tests use
//! [`InMemoryNetwork`], which mirrors the fault model of
//! `consensus::vsr::harness` (seeded drop, duplication and delay, so frames
//! also arrive out of order) and is driven by ticks, never by wall time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::Bytes;
use consensus::vsr::{Frame, Prng, Reply};

/// Where a partition's outputs go. Sending never blocks and never fails:
/// the bus may drop a frame (VSR retransmits) but must not reorder what it
/// reports as delivered to a client.
pub trait MessageBus {
    /// Sends `frame` to replica `to` of the same group.
    fn send_to_replica(&self, to: u8, frame: Frame);
    /// Delivers a reply to the client it names.
    fn send_to_client(&self, reply: Reply);
    /// Sends an encoded frame (256-byte consensus header and body, as a
    /// socket carries it) to replica `to`: the state-transfer commands,
    /// which the driver encodes and the receiving side decodes and checks.
    fn send_wire_to_replica(&self, to: u8, frame: Bytes);
}

/// Fault knobs of an [`InMemoryNetwork`] (per-mille chances, tick delays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetworkFaults {
    /// Chance a frame is dropped.
    pub drop_per_mille: u64,
    /// Chance a frame is delivered twice.
    pub duplicate_per_mille: u64,
    /// Largest extra delivery delay in ticks (delays reorder frames).
    pub delay_ticks_max: u64,
}

#[derive(Debug)]
struct NetworkState {
    prng: Prng,
    faults: NetworkFaults,
    now: u64,
    /// (due tick, sequence) → (destination, frame): a deterministic queue.
    in_flight: BTreeMap<(u64, u64), (u8, Frame)>,
    /// The same for encoded frames: (destination, sender, bytes).
    wire_in_flight: BTreeMap<(u64, u64), (u8, u8, Bytes)>,
    sequence: u64,
    replies: Vec<Vec<Reply>>,
    frames_sent: u64,
    frames_dropped: u64,
    isolated: Option<u8>,
}

/// A seeded in-memory network between the replicas of one group.
#[derive(Debug, Clone)]
pub struct InMemoryNetwork {
    state: Rc<RefCell<NetworkState>>,
}

/// One replica's endpoint on an [`InMemoryNetwork`].
#[derive(Debug, Clone)]
pub struct InMemoryBus {
    replica: u8,
    state: Rc<RefCell<NetworkState>>,
}

impl InMemoryNetwork {
    /// A network for `replicas` replicas whose faults follow `seed`.
    pub fn new(seed: u64, replicas: u8, faults: NetworkFaults) -> Self {
        Self {
            state: Rc::new(RefCell::new(NetworkState {
                prng: Prng::new(seed),
                faults,
                now: 0,
                in_flight: BTreeMap::new(),
                wire_in_flight: BTreeMap::new(),
                sequence: 0,
                replies: vec![Vec::new(); usize::from(replicas)],
                frames_sent: 0,
                frames_dropped: 0,
                isolated: None,
            })),
        }
    }

    /// The endpoint replica `replica` sends through.
    pub fn endpoint(&self, replica: u8) -> InMemoryBus {
        InMemoryBus {
            replica,
            state: Rc::clone(&self.state),
        }
    }

    /// Changes the fault mix (e.g. to heal the network).
    pub fn set_faults(&self, faults: NetworkFaults) {
        self.state.borrow_mut().faults = faults;
    }

    /// Cuts replica `replica` off (every frame to or from it is dropped),
    /// or heals the cut with `None`.
    pub fn isolate(&self, replica: Option<u8>) {
        self.state.borrow_mut().isolated = replica;
    }

    /// Advances one tick and returns the frames due now, in a deterministic
    /// order, as `(destination, frame)`.
    pub fn tick(&self) -> Vec<(u8, Frame)> {
        let mut s = self.state.borrow_mut();
        s.now += 1;
        let now = s.now;
        let due: Vec<(u64, u64)> = s.in_flight.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
        due.into_iter()
            .filter_map(|k| s.in_flight.remove(&k))
            .collect()
    }

    /// The encoded frames due by the current tick (advanced by
    /// [`Self::tick`]), in a deterministic order, as `(destination, sender,
    /// frame)`.
    pub fn take_wire(&self) -> Vec<(u8, u8, Bytes)> {
        let mut s = self.state.borrow_mut();
        let now = s.now;
        let due: Vec<(u64, u64)> = s
            .wire_in_flight
            .range(..(now + 1, 0))
            .map(|(k, _)| *k)
            .collect();
        due.into_iter()
            .filter_map(|k| s.wire_in_flight.remove(&k))
            .collect()
    }

    /// The replies replica `replica` delivered to clients since the last
    /// call.
    pub fn take_replies(&self, replica: u8) -> Vec<Reply> {
        let mut s = self.state.borrow_mut();
        s.replies
            .get_mut(usize::from(replica))
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether no frame is in flight.
    pub fn is_idle(&self) -> bool {
        let s = self.state.borrow();
        s.in_flight.is_empty() && s.wire_in_flight.is_empty()
    }

    /// Frames sent and frames dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.state.borrow();
        (s.frames_sent, s.frames_dropped)
    }
}

impl NetworkState {
    /// The fault draw for one frame from `from` to `to`: the due keys of
    /// its copies (none when dropped).
    fn schedule(&mut self, from: u8, to: u8) -> Vec<(u64, u64)> {
        self.frames_sent += 1;
        let f = self.faults;
        let cut = self.isolated.is_some_and(|r| r == to || r == from);
        if cut || (f.drop_per_mille > 0 && self.prng.chance(f.drop_per_mille, 1000)) {
            self.frames_dropped += 1;
            return Vec::new();
        }
        let copies = if f.duplicate_per_mille > 0 && self.prng.chance(f.duplicate_per_mille, 1000) {
            2
        } else {
            1
        };
        (0..copies)
            .map(|_| {
                let delay = 1 + self.prng.below_inclusive(f.delay_ticks_max);
                self.sequence += 1;
                (self.now + delay, self.sequence)
            })
            .collect()
    }

    fn enqueue(&mut self, to: u8, frame: Frame) {
        for key in self.schedule(frame.replica, to) {
            self.in_flight.insert(key, (to, frame.clone()));
        }
    }

    fn enqueue_wire(&mut self, from: u8, to: u8, frame: Bytes) {
        for key in self.schedule(from, to) {
            self.wire_in_flight.insert(key, (to, from, frame.clone()));
        }
    }
}

impl MessageBus for InMemoryBus {
    fn send_to_replica(&self, to: u8, frame: Frame) {
        debug_assert_ne!(to, self.replica, "a replica never sends to itself");
        self.state.borrow_mut().enqueue(to, frame);
    }

    fn send_to_client(&self, reply: Reply) {
        let mut s = self.state.borrow_mut();
        if let Some(q) = s.replies.get_mut(usize::from(self.replica)) {
            q.push(reply);
        }
    }

    fn send_wire_to_replica(&self, to: u8, frame: Bytes) {
        debug_assert_ne!(to, self.replica, "a replica never sends to itself");
        self.state
            .borrow_mut()
            .enqueue_wire(self.replica, to, frame);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use consensus::vsr::Message;

    fn frame(n: u64) -> Frame {
        Frame {
            group: 1,
            replica: 0,
            view: 0,
            message: Message::PrepareOk {
                op: n,
                prepare_checksum: 0,
            },
        }
    }

    #[test]
    fn given_quiet_network_when_ticked_should_deliver_everything_in_order() {
        let net = InMemoryNetwork::new(1, 2, NetworkFaults::default());
        let bus = net.endpoint(0);
        for n in 0..5 {
            bus.send_to_replica(1, frame(n));
        }
        let got = net.tick();
        assert_eq!(got.len(), 5);
        assert_eq!(got[3].1, frame(3));
        assert!(net.is_idle());
    }

    #[test]
    fn given_same_seed_when_faulty_should_replay_identically() {
        let faults = NetworkFaults {
            drop_per_mille: 200,
            duplicate_per_mille: 200,
            delay_ticks_max: 5,
        };
        let run = || {
            let net = InMemoryNetwork::new(42, 2, faults);
            let bus = net.endpoint(0);
            for n in 0..200 {
                bus.send_to_replica(1, frame(n));
            }
            let mut out = Vec::new();
            for _ in 0..10 {
                out.extend(net.tick());
            }
            out
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.len() != 200, "faults changed nothing");
    }
}
