//! [`ShardBus`], the message bus each partition of the shard sends
//! through: frames out to the environment, replies into the shard's queue.

use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use common::{GroupId, ReplicaId};
use consensus::vsr::wire;
use consensus::vsr::{Frame, Reply};
use partitions::MessageBus;

use crate::env::{Env, Sent};

/// Replies the shard's partitions delivered, awaiting matching to calls.
pub(super) type ReplyQueue = Rc<RefCell<Vec<(GroupId, Reply)>>>;

/// The [`MessageBus`] a shard gives each of its partitions: frames leave
/// as bytes through the environment, replies go to the shard's queue.
pub struct ShardBus<E: Env> {
    pub(super) env: Rc<E>,
    pub(super) cluster: u128,
    pub(super) group: GroupId,
    pub(super) replies: ReplyQueue,
    pub(super) sent: Rc<RefCell<(u64, u64)>>,
}

impl<E: Env> ShardBus<E> {
    fn send(&self, to: ReplicaId, frame: Bytes) {
        let outcome = self.env.send_to_peer(to, frame);
        let mut sent = self.sent.borrow_mut();
        sent.0 += 1;
        if outcome == Sent::Dropped {
            sent.1 += 1;
        }
    }
}

impl<E: Env> MessageBus for ShardBus<E> {
    fn send_to_replica(&self, to: ReplicaId, frame: Frame) {
        self.send(to, wire::encode(self.cluster, &frame));
    }

    fn send_to_client(&self, reply: Reply) {
        self.replies.borrow_mut().push((self.group, reply));
    }

    fn send_wire_to_replica(&self, to: ReplicaId, frame: Bytes) {
        self.send(to, frame);
    }
}
