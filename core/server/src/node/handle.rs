//! How code on any thread reaches the shards of this replica: one inbox
//! per shard, a call routed to the shard that owns its group, metadata
//! ops and queries to shard 0. Every call carries a oneshot reply; a shard
//! answers each exactly once (or drops the handle when it stops, which
//! reads here as [`CallError::Overloaded`] / [`MetaError::Unavailable`]).

use common::GroupId;
use futures::SinkExt;
use futures::channel::oneshot;
use metadata::{MetadataOp, MetadataState, Outcome};
use shard::{Answer, Call, CallError, Envelope, Inbox, Input, MetaCall, MetaError, shard_of};

/// The inboxes of every shard of this replica, by shard index.
#[derive(Debug, Clone)]
pub struct ShardHandles {
    inboxes: Vec<Inbox>,
}

impl ShardHandles {
    /// Handles over `inboxes` (index = shard index; at least one).
    pub fn new(inboxes: Vec<Inbox>) -> Self {
        assert!(!inboxes.is_empty(), "a replica runs at least one shard");
        Self { inboxes }
    }

    /// Shards of this replica.
    pub fn shard_count(&self) -> u16 {
        // At most u16::MAX shards are ever configured.
        self.inboxes.len() as u16
    }

    /// The raw inboxes (for the replica bus's reader tasks).
    pub fn inboxes(&self) -> &[Inbox] {
        &self.inboxes
    }

    /// Runs `call` on the group's shard and waits for its answer.
    pub async fn call(&self, group: GroupId, call: Call) -> Result<Answer, CallError> {
        let index = usize::from(shard_of(group, self.shard_count()).0);
        let (reply, answer) = oneshot::channel();
        let mut inbox = self.inboxes[index].clone();
        let input = Input::Call(Envelope { group, call, reply });
        if inbox.send(input).await.is_err() {
            return Err(CallError::Overloaded);
        }
        answer.await.unwrap_or(Err(CallError::Overloaded))
    }

    /// Replicates a metadata op and waits for its outcome.
    pub async fn meta_submit(&self, op: MetadataOp, user_id: u32) -> Result<Outcome, MetaError> {
        let (reply, answer) = oneshot::channel();
        let mut inbox = self.inboxes[0].clone();
        let input = Input::Meta(MetaCall::Submit { op, user_id, reply });
        if inbox.send(input).await.is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Reads the applied metadata state on shard 0's thread.
    pub async fn meta_query<T, Q>(&self, query: Q) -> Result<T, MetaError>
    where
        T: Send + 'static,
        Q: FnOnce(&MetadataState) -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let mut inbox = self.inboxes[0].clone();
        let input = Input::Meta(MetaCall::Query(Box::new(move |state| {
            let _ = tx.send(query(state));
        })));
        if inbox.send(input).await.is_err() {
            return Err(stopped());
        }
        rx.await.map_err(|_| MetaError::NotHosted)
    }
}

fn stopped() -> MetaError {
    MetaError::Unavailable {
        reason: "the metadata shard stopped",
    }
}
