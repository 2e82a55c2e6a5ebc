//! The environment seam: the shard's only contact with the world.
//!
//! Everything a shard needs from outside — time, timers, tasks, the
//! replica bus and the filesystem — comes through [`Env`]. The server
//! implements it over compio (wall clock, io_uring, TCP connections), the
//! simulator over its deterministic executor (virtual clock, simulated
//! network, `SimFs`), and this crate's tests over [`crate::testing`]. No
//! shard code reads a clock, opens a socket or spawns a thread any other
//! way, which is what lets one seed replay a whole cluster.
//!
//! Client replies do not pass through the trait: every client call carries
//! its own reply handle ([`crate::ReplyTx`], a oneshot channel), which
//! works the same under compio and a deterministic executor because it
//! wakes through the task's `Waker`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use common::ReplicaId;
use storage::fs::Fs;

/// A boxed, non-`Send` future: shards are thread-per-core.
pub type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// What became of a frame handed to [`Env::send_to_peer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Queued for the peer (it may still be lost on the way).
    Queued,
    /// Dropped at once: the peer's queue is full or it is not connected.
    /// VSR retransmits, so the sender only counts it.
    Dropped,
}

/// The world as a shard sees it. One value per shard; cheap to share
/// through an `Rc`.
pub trait Env: 'static {
    /// The filesystem the shard's groups live on.
    type Fs: Fs;

    /// Monotonic time since an arbitrary origin fixed for the process (or
    /// the simulated run). Never decreases.
    fn now(&self) -> Duration;

    /// A timer that completes once [`Env::now`] has reached `deadline`.
    /// The deadline is fixed when the timer is created, not when it is
    /// first polled, so a busy pump cannot push its tick back.
    fn sleep_until(&self, deadline: Duration) -> LocalFuture;

    /// Runs `task` on this shard's executor, in the background.
    fn spawn(&self, task: LocalFuture);

    /// Hands `frame` (a consensus header and body) to the same-index shard
    /// of replica `to`. Never blocks; may drop.
    fn send_to_peer(&self, to: ReplicaId, frame: Bytes) -> Sent;

    /// The filesystem.
    fn fs(&self) -> &Self::Fs;
}
