//! An in-process [`Env`] for tests and benchmarks: a virtual clock, a
//! seeded network between the shards of several replicas, and `SimFs`.
//!
//! Nothing here reads the wall clock or the OS: time moves only when a
//! test calls [`TestClock::advance`], frames move only when it calls
//! [`TestNet::deliver`], so a seed replays a run exactly. The network's
//! fault model is the partition harness's (seeded drop, duplication and
//! delay, isolation of one replica), keyed by shard index, so a frame sent
//! by shard `s` of one replica reaches shard `s` of another. The simulator
//! adds per-link faults and one-way cuts on top (splits, asymmetric
//! partitions), set and healed by the driver.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use common::ReplicaId;
use consensus::vsr::Prng;
use partitions::NetworkFaults;
use storage::fs::SimFs;

use crate::env::{Env, LocalFuture, Sent};
use crate::placement::ShardIndex;

/// A virtual monotonic clock with timers.
#[derive(Debug, Default)]
pub struct TestClock {
    now: Cell<Duration>,
    waiting: RefCell<Vec<(Duration, Waker)>>,
}

impl TestClock {
    /// A clock at zero.
    pub fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    /// The time.
    pub fn now(&self) -> Duration {
        self.now.get()
    }

    /// Moves time forward and wakes the timers now due.
    pub fn advance(&self, by: Duration) {
        let now = self.now.get() + by;
        self.now.set(now);
        let due: Vec<Waker> = {
            let mut waiting = self.waiting.borrow_mut();
            let (due, later): (Vec<_>, Vec<_>) = waiting.drain(..).partition(|(at, _)| *at <= now);
            *waiting = later;
            due.into_iter().map(|(_, w)| w).collect()
        };
        for waker in due {
            waker.wake();
        }
    }
}

struct Sleep {
    clock: Rc<TestClock>,
    deadline: Duration,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.clock.now() >= self.deadline {
            return Poll::Ready(());
        }
        self.clock
            .waiting
            .borrow_mut()
            .push((self.deadline, cx.waker().clone()));
        Poll::Pending
    }
}

/// A frame in flight.
#[derive(Debug, Clone)]
pub struct Packet {
    /// The sender.
    pub from: ReplicaId,
    /// The destination replica.
    pub to: ReplicaId,
    /// The shard index on both ends.
    pub shard: ShardIndex,
    /// Header and body.
    pub bytes: Bytes,
}

#[derive(Debug)]
struct NetState {
    prng: Prng,
    faults: NetworkFaults,
    now_tick: u64,
    sequence: u64,
    in_flight: BTreeMap<(u64, u64), Packet>,
    isolated: BTreeSet<u8>,
    /// Directed links `(from, to)` that carry nothing.
    cut: BTreeSet<(u8, u8)>,
    /// Per-link fault mixes that replace `faults` on that link.
    link_faults: BTreeMap<(u8, u8), NetworkFaults>,
    sent: u64,
    dropped: u64,
    duplicated: u64,
}

impl NetState {
    fn blocked(&self, from: ReplicaId, to: ReplicaId) -> bool {
        self.isolated.contains(&from.0)
            || self.isolated.contains(&to.0)
            || self.cut.contains(&(from.0, to.0))
    }
}

/// A seeded network between the shards of a cluster.
#[derive(Debug, Clone)]
pub struct TestNet {
    state: Rc<RefCell<NetState>>,
}

impl TestNet {
    /// A network whose faults follow `seed`.
    pub fn new(seed: u64, faults: NetworkFaults) -> Self {
        Self {
            state: Rc::new(RefCell::new(NetState {
                prng: Prng::new(seed),
                faults,
                now_tick: 0,
                sequence: 0,
                in_flight: BTreeMap::new(),
                isolated: BTreeSet::new(),
                cut: BTreeSet::new(),
                link_faults: BTreeMap::new(),
                sent: 0,
                dropped: 0,
                duplicated: 0,
            })),
        }
    }

    /// Changes the fault mix.
    pub fn set_faults(&self, faults: NetworkFaults) {
        self.state.borrow_mut().faults = faults;
    }

    /// Cuts `replica` off (frames to and from it are dropped) or heals it.
    pub fn set_isolated(&self, replica: ReplicaId, isolated: bool) {
        let mut s = self.state.borrow_mut();
        if isolated {
            s.isolated.insert(replica.0);
        } else {
            s.isolated.remove(&replica.0);
        }
    }

    /// Cuts the directed link `from → to` (frames on it are dropped, the
    /// other direction is untouched) or restores it.
    pub fn set_link_cut(&self, from: ReplicaId, to: ReplicaId, cut: bool) {
        let mut s = self.state.borrow_mut();
        if cut {
            s.cut.insert((from.0, to.0));
        } else {
            s.cut.remove(&(from.0, to.0));
        }
    }

    /// Gives the directed link `from → to` its own fault mix, or (with
    /// `None`) returns it to the network-wide one.
    pub fn set_link_faults(&self, from: ReplicaId, to: ReplicaId, faults: Option<NetworkFaults>) {
        let mut s = self.state.borrow_mut();
        match faults {
            Some(faults) => s.link_faults.insert((from.0, to.0), faults),
            None => s.link_faults.remove(&(from.0, to.0)),
        };
    }

    /// Removes every isolation, cut and per-link fault mix, and sets the
    /// network-wide mix to `faults`. Frames already in flight stay.
    pub fn heal(&self, faults: NetworkFaults) {
        let mut s = self.state.borrow_mut();
        s.isolated.clear();
        s.cut.clear();
        s.link_faults.clear();
        s.faults = faults;
    }

    /// Frames queued and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.state.borrow().in_flight.len()
    }

    /// Advances the network by one tick and returns the frames due, in a
    /// deterministic order.
    pub fn deliver(&self) -> Vec<Packet> {
        let mut s = self.state.borrow_mut();
        s.now_tick += 1;
        let now = s.now_tick;
        let due: Vec<(u64, u64)> = s.in_flight.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
        let mut out = Vec::with_capacity(due.len());
        for key in due {
            let Some(p) = s.in_flight.remove(&key) else {
                continue;
            };
            // A cut made while the frame was on the wire loses it too.
            if s.blocked(p.from, p.to) {
                s.dropped += 1;
            } else {
                out.push(p);
            }
        }
        out
    }

    /// Frames sent and dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.state.borrow();
        (s.sent, s.dropped)
    }

    /// Frames the network delivered twice so far.
    pub fn duplicated(&self) -> u64 {
        self.state.borrow().duplicated
    }

    fn send(&self, packet: Packet) -> Sent {
        let mut s = self.state.borrow_mut();
        s.sent += 1;
        if s.blocked(packet.from, packet.to) {
            s.dropped += 1;
            return Sent::Dropped;
        }
        let faults = s
            .link_faults
            .get(&(packet.from.0, packet.to.0))
            .copied()
            .unwrap_or(s.faults);
        if s.prng.chance(faults.drop_per_mille, 1000) {
            s.dropped += 1;
            return Sent::Queued;
        }
        let copies = if s.prng.chance(faults.duplicate_per_mille, 1000) {
            s.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = 1 + s.prng.below_inclusive(faults.delay_ticks_max);
            s.sequence += 1;
            let key = (s.now_tick + delay, s.sequence);
            s.in_flight.insert(key, packet.clone());
        }
        Sent::Queued
    }
}

/// One shard's environment on a [`TestNet`].
pub struct TestEnv {
    replica: ReplicaId,
    shard: ShardIndex,
    clock: Rc<TestClock>,
    net: TestNet,
    fs: SimFs,
    spawned: RefCell<Vec<LocalFuture>>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("replica", &self.replica)
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl TestEnv {
    /// The environment of shard `shard` of replica `replica`.
    pub fn new(
        replica: ReplicaId,
        shard: ShardIndex,
        clock: Rc<TestClock>,
        net: TestNet,
        fs: SimFs,
    ) -> Rc<Self> {
        Rc::new(Self {
            replica,
            shard,
            clock,
            net,
            fs,
            spawned: RefCell::new(Vec::new()),
        })
    }

    /// Tasks handed to [`Env::spawn`] since the last call, for the test's
    /// executor.
    pub fn take_spawned(&self) -> Vec<LocalFuture> {
        std::mem::take(&mut *self.spawned.borrow_mut())
    }
}

impl Env for TestEnv {
    type Fs = SimFs;

    fn now(&self) -> Duration {
        self.clock.now()
    }

    fn sleep_until(&self, deadline: Duration) -> LocalFuture {
        Box::pin(Sleep {
            clock: Rc::clone(&self.clock),
            deadline,
        })
    }

    fn spawn(&self, task: LocalFuture) {
        self.spawned.borrow_mut().push(task);
    }

    fn send_to_peer(&self, to: ReplicaId, frame: Bytes) -> Sent {
        self.net.send(Packet {
            from: self.replica,
            to,
            shard: self.shard,
            bytes: frame,
        })
    }

    fn fs(&self) -> &SimFs {
        &self.fs
    }
}
