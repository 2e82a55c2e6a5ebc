//! An in-process [`Env`] for tests and benchmarks: a virtual clock, a
//! seeded network between the shards of several replicas, and `SimFs`.
//!
//! Nothing here reads the wall clock or the OS: time moves only when a
//! test calls [`TestClock::advance`], frames move only when it calls
//! [`TestNet::deliver`], so a seed replays a run exactly. The network is
//! the workspace's one simulated network (`common::simnet`: seeded drop,
//! duplication and delay, isolation), carrying a shard index, so a frame
//! sent by shard `s` of one replica reaches shard `s` of another. The simulator
//! adds per-link faults and one-way cuts on top (splits, asymmetric
//! partitions), set and healed by the driver.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use common::simnet::{Fate, LinkDraw, NetworkFaults, SimNet};
use common::{Prng, ReplicaId};
use storage::fs::SimFs;

use crate::env::{Env, LocalFuture, Sent};
use crate::placement::ShardIndex;

/// A virtual monotonic clock with timers.
#[derive(Debug, Default)]
pub struct TestClock {
    now: Cell<Duration>,
    /// The timer heap: (deadline, arming order) → the sleeper to wake.
    waiting: RefCell<BTreeMap<(Duration, u64), Waker>>,
    armed: Cell<u64>,
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
        // Woken in deadline order, ties in the order they were armed.
        loop {
            let due = {
                let mut waiting = self.waiting.borrow_mut();
                match waiting.first_key_value() {
                    Some((&(at, _), _)) if at <= now => waiting.pop_first(),
                    _ => None,
                }
            };
            let Some((_, waker)) = due else {
                break;
            };
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
        let armed = self.clock.armed.get();
        self.clock.armed.set(armed + 1);
        self.clock
            .waiting
            .borrow_mut()
            .insert((self.deadline, armed), cx.waker().clone());
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
    net: SimNet<(ShardIndex, Bytes)>,
    /// Per-link fault mixes that replace `faults` on that link.
    link_faults: BTreeMap<(u8, u8), NetworkFaults>,
}

/// A seeded network between the shards of a cluster: a view of the
/// workspace's [`SimNet`] that draws every fault (even at 0) and loses a
/// frame whose link is cut while it is on the wire.
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
                net: SimNet::new(),
                link_faults: BTreeMap::new(),
            })),
        }
    }

    /// Changes the fault mix.
    pub fn set_faults(&self, faults: NetworkFaults) {
        self.state.borrow_mut().faults = faults;
    }

    /// Cuts `replica` off (frames to and from it are dropped) or heals it.
    pub fn set_isolated(&self, replica: ReplicaId, isolated: bool) {
        self.state
            .borrow_mut()
            .net
            .set_isolated(replica.0, isolated);
    }

    /// Cuts the directed link `from → to` (frames on it are dropped, the
    /// other direction is untouched) or restores it.
    pub fn set_link_cut(&self, from: ReplicaId, to: ReplicaId, cut: bool) {
        self.state.borrow_mut().net.set_link_cut(from.0, to.0, cut);
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
        s.net.heal();
        s.link_faults.clear();
        s.faults = faults;
    }

    /// Frames queued and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.state.borrow().net.in_flight()
    }

    /// Advances the network by one tick and returns the frames due, in a
    /// deterministic order. A cut made while a frame was on the wire
    /// loses it too.
    pub fn deliver(&self) -> Vec<Packet> {
        let mut s = self.state.borrow_mut();
        s.now_tick += 1;
        let now = s.now_tick;
        s.net
            .take_due(now, true)
            .into_iter()
            .map(|(from, to, (shard, bytes))| Packet {
                from: ReplicaId(from),
                to: ReplicaId(to),
                shard,
                bytes,
            })
            .collect()
    }

    /// Frames sent and dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        self.state.borrow().net.counts()
    }

    /// Frames the network delivered twice so far.
    pub fn duplicated(&self) -> u64 {
        self.state.borrow().net.duplicated()
    }

    fn send(&self, packet: Packet) -> Sent {
        let mut s = self.state.borrow_mut();
        let link = (packet.from.0, packet.to.0);
        let faults = s.link_faults.get(&link).copied().unwrap_or(s.faults);
        let now = s.now_tick;
        let NetState { prng, net, .. } = &mut *s;
        match net.send(
            now,
            prng,
            &LinkDraw::always(faults),
            link,
            (packet.shard, packet.bytes),
        ) {
            Fate::Blocked => Sent::Dropped,
            // Lost on the wire: the sender cannot tell.
            Fate::Lost | Fate::Queued { .. } => Sent::Queued,
        }
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
