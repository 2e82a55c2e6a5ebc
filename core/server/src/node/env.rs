//! The compio implementation of the shard's environment seam: the wall
//! clock measured from the shard's start, compio timers and tasks, the
//! real filesystem (io_uring) with its syncs timed ([`MeteredFs`]), and
//! one bounded send queue per peer replica that the replica bus's writer
//! task drains.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::ReplicaId;
use futures::channel::mpsc;
use prometheus_client::metrics::histogram::Histogram;
use shard::{Env, LocalFuture, Sent};

use super::fs::MeteredFs;

/// Frames queued per peer before sends drop (VSR retransmits).
pub const PEER_QUEUE_FRAMES: usize = 1024;

/// One shard's world on compio.
#[derive(Debug)]
pub struct CompioEnv {
    origin: Instant,
    fs: MeteredFs,
    peers: RefCell<BTreeMap<u8, mpsc::Sender<Bytes>>>,
    dropped: Cell<u64>,
}

impl Default for CompioEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl CompioEnv {
    /// An environment whose clock starts now, with no peer connected
    /// (its syncs are timed into a histogram nobody reads).
    pub fn new() -> Self {
        Self::with_fsync(Histogram::new([]))
    }

    /// As [`CompioEnv::new`], with the shard's fsync histogram.
    pub fn with_fsync(fsync: Histogram) -> Self {
        Self {
            origin: Instant::now(),
            fs: MeteredFs::new(fsync),
            peers: RefCell::new(BTreeMap::new()),
            dropped: Cell::new(0),
        }
    }

    /// Routes sends to `peer` into `queue` (a connection became ready), or
    /// stops them (`None`: the connection is gone; sends drop).
    pub fn set_peer(&self, peer: ReplicaId, queue: Option<mpsc::Sender<Bytes>>) {
        let mut peers = self.peers.borrow_mut();
        match queue {
            Some(q) => {
                peers.insert(peer.0, q);
            }
            None => {
                peers.remove(&peer.0);
            }
        }
    }

    /// Frames dropped because a peer was not connected or its queue was
    /// full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

impl Env for CompioEnv {
    type Fs = MeteredFs;

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep_until(&self, deadline: Duration) -> LocalFuture {
        Box::pin(compio::time::sleep_until(self.origin + deadline))
    }

    fn spawn(&self, task: LocalFuture) {
        compio::runtime::spawn(task).detach();
    }

    fn send_to_peer(&self, to: ReplicaId, frame: Bytes) -> Sent {
        let mut peers = self.peers.borrow_mut();
        let sent = match peers.get_mut(&to.0) {
            Some(queue) => queue.try_send(frame).is_ok(),
            None => false,
        };
        if sent {
            Sent::Queued
        } else {
            self.dropped.set(self.dropped.get() + 1);
            Sent::Dropped
        }
    }

    fn fs(&self) -> &MeteredFs {
        &self.fs
    }
}
