//! The message bus a partition talks through, and an in-memory one.
//!
//! A [`Partition`](crate::Partition) never opens a socket: it hands frames
//! for its peers and replies for its clients to a [`MessageBus`]. The shard
//! implements it over its replica connections; tests use
//! [`InMemoryNetwork`], a view of the workspace's simulated network
//! (`common::simnet`: seeded drop, duplication and delay, so frames also
//! arrive out of order), driven by ticks, never by wall time.

use common::{Prng, ReplicaId};
use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use common::simnet::{LinkDraw, NetworkFaults, SimNet};
use consensus::vsr::{Frame, Reply};

/// Where a partition's outputs go. Sending never blocks and never fails:
/// the bus may drop a frame (VSR retransmits) but must not reorder what it
/// reports as delivered to a client.
pub trait MessageBus {
    /// Sends `frame` to replica `to` of the same group.
    fn send_to_replica(&self, to: ReplicaId, frame: Frame);
    /// Delivers a reply to the client it names.
    fn send_to_client(&self, reply: Reply);
    /// Sends an encoded frame (256-byte consensus header and body, as a
    /// socket carries it) to replica `to`: the state-transfer commands,
    /// which the driver encodes and the receiving side decodes and checks.
    fn send_wire_to_replica(&self, to: ReplicaId, frame: Bytes);
}

/// What the in-memory wire carries: a decoded frame, or an encoded one.
#[derive(Debug, Clone)]
enum Carried {
    Frame(Frame),
    Wire(Bytes),
}

#[derive(Debug)]
struct NetworkState {
    prng: Prng,
    faults: NetworkFaults,
    now: u64,
    net: SimNet<Carried>,
    /// Encoded frames that came due, as `(destination, sender, bytes)`,
    /// until [`InMemoryNetwork::take_wire`] takes them.
    wire_due: Vec<(u8, u8, Bytes)>,
    replies: Vec<Vec<Reply>>,
}

/// A seeded in-memory network between the replicas of one group: a view
/// of the workspace's [`SimNet`] whose faults at 0 cost no draw.
#[derive(Debug, Clone)]
pub struct InMemoryNetwork {
    state: Rc<RefCell<NetworkState>>,
}

/// One replica's endpoint on an [`InMemoryNetwork`].
#[derive(Debug, Clone)]
pub struct InMemoryBus {
    replica: ReplicaId,
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
                net: SimNet::new(),
                wire_due: Vec::new(),
                replies: vec![Vec::new(); usize::from(replicas)],
            })),
        }
    }

    /// The endpoint replica `replica` sends through.
    pub fn endpoint(&self, replica: ReplicaId) -> InMemoryBus {
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
    pub fn isolate(&self, replica: Option<ReplicaId>) {
        let mut s = self.state.borrow_mut();
        s.net.heal();
        if let Some(r) = replica {
            s.net.set_isolated(r.0, true);
        }
    }

    /// Advances one tick and returns the frames due now, in a deterministic
    /// order, as `(destination, frame)`.
    pub fn tick(&self) -> Vec<(u8, Frame)> {
        let mut s = self.state.borrow_mut();
        s.now += 1;
        let now = s.now;
        let mut frames = Vec::new();
        // A cut stops new sends only; what is on the wire arrives.
        for (from, to, carried) in s.net.take_due(now, false) {
            match carried {
                Carried::Frame(frame) => frames.push((to, frame)),
                Carried::Wire(bytes) => s.wire_due.push((to, from, bytes)),
            }
        }
        frames
    }

    /// The encoded frames due by the current tick (advanced by
    /// [`Self::tick`]), in a deterministic order, as `(destination, sender,
    /// frame)`.
    pub fn take_wire(&self) -> Vec<(u8, u8, Bytes)> {
        std::mem::take(&mut self.state.borrow_mut().wire_due)
    }

    /// The replies replica `replica` delivered to clients since the last
    /// call.
    pub fn take_replies(&self, replica: ReplicaId) -> Vec<Reply> {
        let mut s = self.state.borrow_mut();
        s.replies
            .get_mut(replica.index())
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether no frame is in flight.
    pub fn is_idle(&self) -> bool {
        let s = self.state.borrow();
        s.net.in_flight() == 0 && s.wire_due.is_empty()
    }

    /// Frames sent and frames dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        self.state.borrow().net.counts()
    }
}

impl NetworkState {
    fn send(&mut self, from: u8, to: u8, carried: Carried) {
        let draw = LinkDraw::when_set(self.faults);
        let now = self.now;
        self.net
            .send(now, &mut self.prng, &draw, (from, to), carried);
    }
}

impl MessageBus for InMemoryBus {
    fn send_to_replica(&self, to: ReplicaId, frame: Frame) {
        debug_assert_ne!(to, self.replica, "a replica never sends to itself");
        let from = frame.replica.0;
        self.state
            .borrow_mut()
            .send(from, to.0, Carried::Frame(frame));
    }

    fn send_to_client(&self, reply: Reply) {
        let mut s = self.state.borrow_mut();
        if let Some(q) = s.replies.get_mut(self.replica.index()) {
            q.push(reply);
        }
    }

    fn send_wire_to_replica(&self, to: ReplicaId, frame: Bytes) {
        debug_assert_ne!(to, self.replica, "a replica never sends to itself");
        self.state
            .borrow_mut()
            .send(self.replica.0, to.0, Carried::Wire(frame));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use common::{GroupId, Op, ReplicaId};
    use consensus::vsr::Message;

    fn frame(n: u64) -> Frame {
        Frame {
            group: GroupId(1),
            replica: ReplicaId(0),
            view: 0,
            message: Message::PrepareOk {
                op: Op(n),
                prepare_checksum: 0,
            },
        }
    }

    #[test]
    fn given_quiet_network_when_ticked_should_deliver_everything_in_order() {
        let net = InMemoryNetwork::new(1, 2, NetworkFaults::default());
        let bus = net.endpoint(ReplicaId(0));
        for n in 0..5 {
            bus.send_to_replica(ReplicaId(1), frame(n));
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
            let bus = net.endpoint(ReplicaId(0));
            for n in 0..200 {
                bus.send_to_replica(ReplicaId(1), frame(n));
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
