//! The shard's pump: one task that owns the [`Shard`] and feeds it its
//! inputs one at a time.
//!
//! It is a biased select, in priority order, over: stop, the tick timer,
//! and the bounded inbox that connection reader tasks and client handlers
//! fill. Biased, because an unbiased `select!` draws from a process-wide
//! random source the simulator cannot seed. The tick timer is created
//! once per period with its deadline fixed, and re-armed only after it
//! fired, so a busy inbox delays a tick by at most the input being served,
//! never pushes it back. The inbox is a `futures` mpsc channel; receiving
//! from it is cancel-safe, so losing the select to the timer loses no
//! input. Frames already waiting behind the one received are taken with
//! it and served together ([`Shard::on_frames`]). No socket is read here: readers live in their own tasks (compio
//! reads are not cancel-safe).

use std::time::Duration;

use bytes::Bytes;
use common::{GroupId, ReplicaId};
use futures::channel::{mpsc, oneshot};
use futures::{FutureExt, StreamExt};

use crate::call::Envelope;
use crate::catalog::GroupSpec;
use crate::env::Env;
use crate::metadata_host::MetaCall;
use crate::shard::{GroupError, Shard};
use crate::snapshot::{SnapshotDetail, SnapshotReply};

/// The most frames the pump takes from its inbox to serve together.
const FRAMES_AT_ONCE: usize = 256;

/// One input to a shard.
#[derive(Debug)]
pub enum Input {
    /// A frame from a peer replica's same-index shard.
    Frame {
        /// The connection's peer.
        from: ReplicaId,
        /// Header and body.
        bytes: Bytes,
    },
    /// A client call.
    Call(Envelope),
    /// Create a group (the metadata plane's effect).
    CreateGroup {
        /// What to create.
        spec: GroupSpec,
        /// The outcome.
        done: oneshot::Sender<Result<(), GroupError>>,
    },
    /// Delete a group (the metadata plane's effect).
    DeleteGroup {
        /// What to delete.
        group: GroupId,
        /// The outcome.
        done: oneshot::Sender<Result<(), GroupError>>,
    },
    /// A call to the metadata plane (shard 0 only).
    Meta(MetaCall),
    /// The partition groups the committed metadata names: create the
    /// missing ones this shard owns, delete the ones it holds that are not
    /// named (boot reconciliation).
    Reconcile {
        /// Every live group of the replica.
        live: Vec<GroupSpec>,
    },
    /// The metadata plane committed a purge generation for a group: its
    /// state-transfer install refuses offers behind it.
    PurgeCommitted {
        /// The group.
        group: GroupId,
        /// The committed generation.
        generation: u64,
    },
    /// The group's topic changed its retention settings (the metadata
    /// plane's effect).
    Reconfigure {
        /// The group.
        group: GroupId,
        /// Message expiry, µs (0 = never).
        message_expiry_us: u64,
        /// The sealed segments' size ceiling (0 = none).
        retained_bytes_max: u64,
    },
    /// A snapshot of the shard for an observer (the metrics endpoint).
    Snapshot {
        /// With or without the per-group entries.
        detail: SnapshotDetail,
        /// Where it goes.
        reply: SnapshotReply,
    },
}

/// The sending half of a shard's inbox.
pub type Inbox = mpsc::Sender<Input>;

/// A bounded inbox of `capacity` inputs: senders see `Full` past it and
/// drop (frames; VSR retransmits) or answer `Overloaded` (calls).
pub fn inbox(capacity: usize) -> (Inbox, mpsc::Receiver<Input>) {
    mpsc::channel(capacity)
}

impl<E: Env> Shard<E> {
    /// Serves one input.
    pub async fn on_input(&mut self, input: Input) {
        match input {
            Input::Frame { from, bytes } => {
                let _ = self.on_frame(from, bytes).await;
            }
            Input::Call(envelope) => self.on_call(envelope).await,
            // Routed effects drop their receiver (nobody waits on another
            // shard's create), so a failure is logged here or never seen.
            Input::CreateGroup { spec, done } => {
                let group = spec.group;
                let result = self.create_group(spec).await;
                match &result {
                    Ok(()) | Err(GroupError::AlreadyExists(_)) => {}
                    Err(error) => tracing::error!(group = group.0, %error, "create failed"),
                }
                let _ = done.send(result);
            }
            Input::DeleteGroup { group, done } => {
                let result = self.delete_group(group).await;
                match &result {
                    Ok(()) | Err(GroupError::Unknown(_)) => {}
                    Err(error) => tracing::error!(group = group.0, %error, "delete failed"),
                }
                let _ = done.send(result);
            }
            Input::Meta(call) => self.on_meta(call).await,
            Input::Reconcile { live } => self.reconcile(&live).await,
            Input::PurgeCommitted { group, generation } => {
                self.learn_purge_generation(group, generation);
            }
            Input::Reconfigure {
                group,
                message_expiry_us,
                retained_bytes_max,
            } => {
                self.reconfigure_group(group, message_expiry_us, retained_bytes_max)
                    .await;
            }
            Input::Snapshot { detail, reply } => reply.send(self.snapshot(detail)),
        }
    }
}

/// Runs the pump until `stop` fires (or every inbox sender is gone), then
/// flushes every group's committed messages, records which groups stopped
/// cleanly, and returns the shard.
pub async fn run<E: Env>(
    mut shard: Shard<E>,
    mut inbox: mpsc::Receiver<Input>,
    mut stop: oneshot::Receiver<()>,
) -> Shard<E> {
    let env = shard.env();
    let period = shard.config().tick.max(Duration::from_micros(1));
    let mut deadline = env.now() + period;
    let mut tick = env.sleep_until(deadline).fuse();
    loop {
        futures::select_biased! {
            _ = stop => break,
            () = tick => {
                shard.on_tick().await;
                // A tick that ran late does not make the next ones bunch
                // up: the next deadline is a period after the later of the
                // planned one and now.
                deadline = (deadline + period).max(env.now());
                tick = env.sleep_until(deadline).fuse();
            }
            input = inbox.next() => match input {
                Some(Input::Frame { from, bytes }) => {
                    // The frames already waiting behind it are served
                    // with it, the groups side by side (`Shard::on_frames`).
                    let mut frames = vec![(from, bytes)];
                    let mut after = None;
                    while frames.len() < FRAMES_AT_ONCE {
                        match inbox.try_recv() {
                            Ok(Input::Frame { from, bytes }) => frames.push((from, bytes)),
                            Ok(other) => {
                                after = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let _ = shard.on_frames(frames).await;
                    if let Some(input) = after {
                        shard.on_input(input).await;
                    }
                }
                Some(input) => shard.on_input(input).await,
                None => break,
            },
        }
    }
    shard.flush_all().await;
    let (clean, not) = shard.record_clean_stops().await;
    if clean + not > 0 {
        tracing::info!(
            shard = shard.config().shard.0,
            clean,
            restart_under_the_rule = not,
            "groups recorded for a clean restart"
        );
    }
    shard
}
