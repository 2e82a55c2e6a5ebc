//! Client calls: reads answered after their read check, replicated calls
//! submitted through the shard's session with the group and answered when
//! their ops commit.

use std::collections::BTreeSet;

use common::{GroupId, Offset, Op};
use consensus::vsr::{OPERATION_REGISTER, ReplyStatus, RequestOutcome};
use partitions::{ClientOp, ClientRequest, KeyedAppend, MessageBus, Partition, PartitionError};
use storage::fs::Fs;
use storage::{BatchView, Integrity};

use super::group::Group;
use super::{Shard, ShardPartition};
use crate::call::{Answer, Call, CallError, Envelope, ReplyTx};
use crate::env::Env;
use crate::placement::shard_of;
use crate::session::{Session, SessionStep};

/// Calls a group queues while its session is being opened.
const QUEUED_CALLS_MAX: usize = 4096;
/// Ticks a read waits for its primary's read check before it is answered
/// `Unavailable` (the primary may be cut off from its backups).
const READ_CHECK_TICKS_MAX: u64 = 100;
/// Reads a group holds while their read check is out.
const PENDING_READS_MAX: usize = 4096;

/// Ticks a call whose primary lost its view waits to learn whether its op
/// survived the view change before it is answered `Indeterminate`.
const ORPHAN_TICKS_MAX: u64 = 1_000;

/// A replicated call waiting for its commit.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) reply: ReplyTx,
    /// The op it was prepared as, when this replica prepared it.
    pub(super) op: Option<Op>,
}

/// A call this replica prepared as `op` and then stopped being the
/// group's primary, waiting to learn what became of the op.
#[derive(Debug)]
pub(super) struct Orphan {
    pub(super) reply: ReplyTx,
    op: Op,
    /// The tick this replica was found no longer primary.
    since_tick: u64,
}

/// A call that reads the group's state, waiting until its primary has
/// confirmed that it still leads its view (`consensus::vsr::read_check`):
/// a poll, a consumer-offset read, or an offset store naming an offset
/// past this replica's end, which a newer view may already have
/// committed.
#[derive(Debug)]
pub(super) struct PendingRead {
    /// The read-check round that must be confirmed.
    round: u64,
    call: Call,
    reply: ReplyTx,
    /// The tick it arrived at.
    since_tick: u64,
}

impl<E: Env> Shard<E> {
    /// A client call. The answer goes to `envelope.reply`, now or when the
    /// op commits.
    pub async fn on_call(&mut self, envelope: Envelope) {
        self.take_call(envelope).await;
        self.reschedule_touched();
    }

    async fn take_call(&mut self, envelope: Envelope) {
        let Envelope { group, call, reply } = envelope;
        let owner = shard_of(group, self.config.shard_count);
        if owner != self.config.shard {
            // The server forwards in-process before calling; a misrouted
            // call is the caller's bug, answered rather than trusted.
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
            return;
        }
        let Some(g) = self.visits.touch(&mut self.groups, group) else {
            self.stats.calls += 1;
            let _ = reply.send(Err(CallError::UnknownGroup { group }));
            return;
        };
        if let Some(reason) = g.partition.fenced() {
            self.stats.calls += 1;
            let _ = reply.send(Err(CallError::Fenced {
                reason: reason.to_owned(),
            }));
            return;
        }
        if call.writes_data()
            && let Some(full) = g.partition.space_refusal()
        {
            // Refused before it waits for the session: the partition would
            // refuse it at submit anyway.
            self.stats.calls += 1;
            let _ = reply.send(Err(partition_error(full)));
            return;
        }
        if let Err(refusal) = primary_check(&g.partition).and_then(|()| purge_check(g, &call)) {
            self.stats.calls += 1;
            let _ = reply.send(Err(refusal));
            return;
        }
        let reads_state = match &call {
            Call::Poll(_) | Call::GetOffset { .. } => true,
            Call::StoreOffset { offset, .. } => *offset >= g.partition.offset_frontier(),
            _ => false,
        };
        if reads_state {
            let round = match g.partition.read_fence().await {
                Ok(round) => round,
                Err(error) => {
                    self.stats.calls += 1;
                    let _ = reply.send(Err(partition_error(error)));
                    return;
                }
            };
            if !g.partition.replica().read_confirmed(round) {
                if g.reads.len() >= PENDING_READS_MAX {
                    let _ = reply.send(Err(CallError::Unavailable {
                        reason: "too many reads waiting for the group's read check",
                    }));
                    return;
                }
                g.reads.push_back(PendingRead {
                    round,
                    call,
                    reply,
                    since_tick: self.tick,
                });
                self.reading_groups.insert(group);
                return;
            }
        }
        if let Call::Produce { key, .. } = &call
            && key.replay
            && key.key != 0
            && let Some(answer) = replayed_send(g, key.key, key.vouched)
        {
            self.stats.calls += 1;
            let _ = reply.send(answer);
            return;
        }
        if call.is_replicated() {
            if g.queued.len() >= QUEUED_CALLS_MAX {
                let _ = reply.send(Err(CallError::Unavailable {
                    reason: "too many calls waiting for the group",
                }));
                return;
            }
            g.queued.push_back((call, reply));
            self.pump_session(group).await;
            self.settle().await;
            return;
        }
        self.stats.calls += 1;
        let answer = answer_locally(&mut g.partition, call).await;
        let _ = reply.send(answer);
        // A poll with auto-commit may have started an internal op.
        self.settle().await;
    }

    /// Answers the reads whose read check came back, and refuses those
    /// whose group lost its primary or waited too long.
    async fn serve_reads(&mut self) {
        if self.reading_groups.is_empty() {
            return;
        }
        let reading: Vec<GroupId> = self.reading_groups.iter().copied().collect();
        for id in reading {
            let Some(g) = self.visits.touch(&mut self.groups, id) else {
                self.reading_groups.remove(&id);
                continue;
            };
            let mut stores_queued = false;
            while let Some(front) = g.reads.front() {
                let refusal = match g.partition.fenced() {
                    Some(reason) => Some(CallError::Fenced {
                        reason: reason.to_owned(),
                    }),
                    None => primary_check(&g.partition)
                        .and_then(|()| purge_check(g, &front.call))
                        .err(),
                };
                let confirmed =
                    refusal.is_none() && g.partition.replica().read_confirmed(front.round);
                let expired = self.tick.saturating_sub(front.since_tick) > READ_CHECK_TICKS_MAX;
                if !confirmed && refusal.is_none() && !expired {
                    // Rounds only grow, so the reads behind wait too.
                    break;
                }
                let Some(read) = g.reads.pop_front() else {
                    break;
                };
                if let Some(refusal) = refusal {
                    self.stats.calls += 1;
                    let _ = read.reply.send(Err(refusal));
                    continue;
                }
                if !confirmed {
                    self.stats.calls += 1;
                    let _ = read.reply.send(Err(CallError::Unavailable {
                        reason: "the primary could not confirm that it still leads its view",
                    }));
                    continue;
                }
                if read.call.is_replicated() {
                    // An offset store checked against the confirmed state:
                    // the session path refuses it if it is still past the
                    // end.
                    g.queued.push_back((read.call, read.reply));
                    stores_queued = true;
                    continue;
                }
                self.stats.calls += 1;
                let answer = answer_locally(&mut g.partition, read.call).await;
                let _ = read.reply.send(answer);
            }
            if g.reads.is_empty() {
                self.reading_groups.remove(&id);
            }
            if stores_queued {
                self.pump_session(id).await;
            }
        }
    }

    /// Opens the group's session when calls wait for it, and submits the
    /// waiting calls once it is open.
    pub(super) async fn pump_session(&mut self, group: GroupId) {
        let now_us = u64::try_from(self.env.now().as_micros()).unwrap_or(u64::MAX);
        let tick = self.tick;
        let client = self.client;
        let Some(g) = self.visits.touch(&mut self.groups, group) else {
            return;
        };
        if g.queued.is_empty() || g.partition.fenced().is_some() {
            return;
        }
        if let Err(refusal) = primary_check(&g.partition) {
            for (_, reply) in g.queued.drain(..) {
                let _ = reply.send(Err(refusal.clone()));
            }
            return;
        }
        let session = match g.session.step(tick) {
            SessionStep::Submit(session) => session,
            SessionStep::Wait => return,
            SessionStep::Register => {
                register(g, client, tick, now_us, group).await;
                return;
            }
        };
        submit_queued(
            g,
            session,
            client,
            now_us,
            group,
            &mut self.in_flight_groups,
        )
        .await;
    }

    /// Matches the replies the partitions delivered to waiting calls, and
    /// submits the calls of sessions that just opened (whose submission
    /// may deliver replies in turn; bounded, as each round opens a session
    /// at most once per group).
    pub(super) async fn settle(&mut self) {
        self.serve_reads().await;
        for _ in 0..4 {
            let opened = self.settle_replies();
            if opened.is_empty() {
                break;
            }
            for group in opened {
                self.pump_session(group).await;
            }
        }
        self.reschedule_touched();
    }

    /// Matches delivered replies to waiting calls; returns the groups whose
    /// session opened.
    fn settle_replies(&mut self) -> Vec<GroupId> {
        let replies = std::mem::take(&mut *self.replies.borrow_mut());
        let mut opened = Vec::new();
        for (group, reply) in replies {
            if reply.client != self.client {
                continue;
            }
            let Some(g) = self.groups.get_mut(&group) else {
                continue;
            };
            if reply.operation == OPERATION_REGISTER {
                if g.session.on_register_reply(&reply) {
                    opened.push(group);
                }
                continue;
            }
            let Some(flight) = g.in_flight.remove(&reply.request) else {
                continue;
            };
            self.stats.calls += 1;
            let answer = match reply.status {
                ReplyStatus::Ok => Ok(Answer::Committed {
                    op: reply.op,
                    // Set when the partition applied the batch, and kept
                    // with the cached reply, so a retry answered from the
                    // client table reports the original offsets.
                    base_offset: (reply.operation == consensus::vsr::OPERATION_APPEND)
                        .then_some(Offset(reply.result)),
                }),
                ReplyStatus::AlreadyApplied => Err(CallError::AlreadyApplied {
                    reason: "its reply is no longer cached",
                }),
                ReplyStatus::NoSession | ReplyStatus::Fenced => {
                    g.session = Session::Closed;
                    Err(CallError::Unavailable {
                        reason: "the group lost this shard's session",
                    })
                }
            };
            let _ = flight.reply.send(answer);
        }
        // Calls whose primary moved away will not be answered by this
        // replica's core. One it prepared itself waits until this replica
        // has applied that op and can tell whether it is the call's;
        // otherwise its caller learns the outcome is unknown.
        let (tick, client) = (self.tick, self.client);
        let flying: Vec<GroupId> = self.in_flight_groups.iter().copied().collect();
        for id in flying {
            let Some(g) = self.groups.get_mut(&id) else {
                self.in_flight_groups.remove(&id);
                continue;
            };
            if !g.in_flight.is_empty() && !g.partition.replica().is_primary() {
                for (request, flight) in std::mem::take(&mut g.in_flight) {
                    match flight.op {
                        Some(op) => {
                            let orphan = Orphan {
                                reply: flight.reply,
                                op,
                                since_tick: tick,
                            };
                            g.orphans.insert(request, orphan);
                        }
                        None => {
                            let _ = flight.reply.send(Err(outcome_unknown()));
                        }
                    }
                }
                g.session = Session::Closed;
            }
            if !g.orphans.is_empty() {
                settle_orphans(g, client, tick);
            }
            if g.in_flight.is_empty() && g.orphans.is_empty() {
                self.in_flight_groups.remove(&id);
            }
        }
        opened
    }
}

/// Answers the calls of `g` whose primary lost its view, where the
/// outcome is known. A call is its client's request number, never sent
/// again, and a prepare keeps its op through a view change, so once this
/// replica has applied the op a call was prepared as, the op's header
/// says it all: the call's request (it committed, whichever view
/// committed it), or another one (the view change dropped the call, and
/// nothing of it will ever apply: the caller may send it again). A call
/// whose op's header is gone, or that waited `ORPHAN_TICKS_MAX` ticks, is
/// answered `Indeterminate`.
fn settle_orphans<E: Env>(g: &mut Group<E>, client: u128, tick: u64) {
    let known: Vec<(u64, Result<Answer, CallError>)> = g
        .orphans
        .iter()
        .filter_map(|(&request, orphan)| {
            orphan_outcome(&g.partition, orphan, request, client, tick).map(|a| (request, a))
        })
        .collect();
    for (request, answer) in known {
        if let Some(orphan) = g.orphans.remove(&request) {
            let _ = orphan.reply.send(answer);
        }
    }
}

/// What an orphaned call is known to have come to, if anything yet.
fn orphan_outcome<B: MessageBus, S: journal::SuperblockStore, F: Fs>(
    partition: &Partition<B, S, F>,
    orphan: &Orphan,
    request: u64,
    client: u128,
    tick: u64,
) -> Option<Result<Answer, CallError>> {
    let replica = partition.replica();
    let op = orphan.op;
    if replica.commit_min() < op {
        let waited = tick.saturating_sub(orphan.since_tick);
        return (waited > ORPHAN_TICKS_MAX).then(|| Err(outcome_unknown()));
    }
    let Some(header) = replica.journal_header(op) else {
        return Some(Err(outcome_unknown()));
    };
    if header.client != client || header.request != request {
        return Some(Err(CallError::Unavailable {
            reason: "a view change dropped the op before it committed",
        }));
    }
    let base_offset = (header.operation == consensus::vsr::OPERATION_APPEND)
        .then(|| replica.journal_entry(op))
        .flatten()
        .and_then(|p| BatchView::decode_exact(&p.body, Integrity::LayoutOnly, u64::MAX).ok())
        .map(|view| Offset(view.header().base_offset));
    Some(Ok(Answer::Committed { op, base_offset }))
}

/// What a replayed send (a client's same-session resend of a request it
/// got no answer for) already came to on this primary, if anything: one
/// still waiting or being committed is answered `Indeterminate` (the
/// client sends it again), a committed one with its original op and
/// offsets. `None`: the send is not known here, and is ordered as new.
///
/// A primary's journal holds every op that can still commit in its view
/// (a view's log is complete), so a send missing from it above the
/// applied point never will; below it, the journal holds the retained
/// applied ops (`retention_ops`). When those may not reach back to the
/// original (a restart or an install since, or more appends than that
/// within the SDK's replay window), a miss proves nothing: the answer is
/// `ReplayUnplaced`, naming since when this partition boot's journal holds
/// every op, so that the client's replica can vouch for a send it first
/// received after that (`vouched`); otherwise the client replays until
/// its budget ends, an error rather than a second copy.
fn replayed_send<E: Env>(
    g: &Group<E>,
    key: u128,
    vouched: u64,
) -> Option<Result<Answer, CallError>> {
    let queued = g
        .queued
        .iter()
        .any(|(call, _)| matches!(call, Call::Produce { key: k, .. } if k.key == key));
    if queued {
        return Some(Err(CallError::Indeterminate {
            reason: "the original send is still waiting to be ordered",
        }));
    }
    Some(match g.partition.keyed_append(key, vouched)? {
        KeyedAppend::Pending(_) => Err(CallError::Indeterminate {
            reason: "the original send is still being committed",
        }),
        KeyedAppend::Committed {
            op,
            base_offset: Some(base_offset),
        } => Ok(Answer::Committed {
            op,
            base_offset: Some(base_offset),
        }),
        KeyedAppend::Unknown { since } => Err(CallError::ReplayUnplaced { since }),
        KeyedAppend::Committed {
            base_offset: None, ..
        } => Err(CallError::AlreadyApplied {
            reason: "the original send committed and its batch is no longer held",
        }),
    })
}

/// A call whose primary lost its view with no way to tell its outcome.
fn outcome_unknown() -> CallError {
    CallError::Indeterminate {
        reason: "the primary lost its view before the op committed",
    }
}

/// A call this replica answers from its own state: a read (after its read
/// check), a flush or the counters.
async fn answer_locally<E: Env>(
    partition: &mut ShardPartition<E>,
    call: Call,
) -> Result<Answer, CallError> {
    match call {
        Call::Poll(request) => partition
            .poll(&request)
            .await
            .map(Answer::Polled)
            .map_err(|e| match e {
                partitions::PollError::HistoryMissing { .. } => CallError::Unavailable {
                    reason: "history missing until a state transfer",
                },
                other => CallError::Local {
                    reason: other.to_string(),
                },
            }),
        Call::GetOffset { kind, id } => Ok(Answer::Offset(partition.stored_offset(kind, id))),
        Call::Flush => partition
            .flush_committed_messages()
            .await
            .map(|_| Answer::Done)
            .map_err(partition_error),
        Call::Stats => Ok(Answer::Stats(partition.stats())),
        // Replicated calls go through the group's session.
        replicated => Err(CallError::Rejected {
            reason: format!("{} is replicated", replicated.name()),
        }),
    }
}

fn primary_check<B: MessageBus, S: journal::SuperblockStore, F: Fs>(
    partition: &Partition<B, S, F>,
) -> Result<(), CallError> {
    let replica = partition.replica();
    if partition.state_transfer_needed().is_some() || partition.missing_history().is_some() {
        return Err(CallError::Unavailable {
            reason: "state transfer in progress",
        });
    }
    if !replica.is_primary() {
        let view = replica.view();
        return Err(CallError::NotPrimary {
            view,
            primary: replica.primary_index(view),
        });
    }
    if !replica.is_caught_up_primary() {
        return Err(CallError::Unavailable {
            reason: "view change in progress",
        });
    }
    Ok(())
}

/// Refuses a call that reads or writes the partition's messages or
/// offsets while it owes a purge group 0 committed: a poll would return
/// what was purged, and a produce or offset store the purge would erase
/// once applied. The primary proposes the purge ahead of waiting calls
/// (`propose_missing_purge`); the caller retries.
fn purge_check<E: Env>(g: &Group<E>, call: &Call) -> Result<(), CallError> {
    let touches_data = matches!(
        call,
        Call::Produce { .. }
            | Call::Poll(_)
            | Call::GetOffset { .. }
            | Call::StoreOffset { .. }
            | Call::DeleteOffset { .. }
    );
    if touches_data && g.owes_purge() {
        return Err(CallError::Unavailable {
            reason: "a committed purge is not applied yet",
        });
    }
    Ok(())
}

fn partition_error(error: PartitionError) -> CallError {
    match error {
        PartitionError::Fenced { .. } => CallError::Fenced {
            reason: error.to_string(),
        },
        PartitionError::NoSpace { .. } => CallError::NoSpace {
            reason: error.to_string(),
        },
        PartitionError::InstallInProgress { .. } => CallError::Unavailable {
            reason: "the partition is installing a state transfer",
        },
        PartitionError::InvalidOp(_)
        | PartitionError::StoreOffsetBeyondEnd { .. }
        | PartitionError::PurgeGenerationZero => CallError::Rejected {
            reason: error.to_string(),
        },
        other => CallError::Local {
            reason: other.to_string(),
        },
    }
}

/// Sends the group's session a Register (request 0) and notes it in
/// flight; an outcome that opens nothing leaves the session as it was.
async fn register<E: Env>(g: &mut Group<E>, client: u128, tick: u64, now_us: u64, group: GroupId) {
    let request = ClientRequest {
        client,
        session: 0,
        request: 0,
        user_id: 0,
        op: ClientOp::Register,
    };
    match g.partition.submit(request, now_us).await {
        Ok(RequestOutcome::Prepared { .. } | RequestOutcome::InFlight) => {
            g.session = Session::Registering { since_tick: tick };
        }
        // A retried Register the table had answered: the cached
        // reply went out to this shard's client queue, and
        // `settle_replies` opens the session when it takes it.
        Ok(RequestOutcome::Answered) => {}
        // Not taking requests now (a view change, a transfer,
        // a full pipeline): the session stays as it was, the
        // calls keep waiting, and the next pump registers again.
        Ok(RequestOutcome::Unavailable) => {
            tracing::trace!(group = group.0, "register deferred: group unavailable");
        }
        // Never for this shard's id (only id 0 is reserved, and
        // bit 127 of this one is set); logged so a change there
        // is not silent.
        Ok(RequestOutcome::ReservedClient) => {
            tracing::error!(
                group = group.0,
                client,
                "register refused: reserved client id"
            );
        }
        Err(error) => tracing::warn!(group = group.0, %error, "register failed"),
    }
}

/// Submits the group's queued calls under `session`, in order: each one
/// the partition takes waits in flight for its commit, each one it refuses
/// is answered now.
async fn submit_queued<E: Env>(
    g: &mut Group<E>,
    session: u64,
    client: u128,
    now_us: u64,
    group: GroupId,
    in_flight_groups: &mut BTreeSet<GroupId>,
) {
    while let Some((call, reply)) = g.queued.pop_front() {
        let mut keyed = 0;
        let op = match call {
            Call::Produce { batch, key } => {
                keyed = key.key;
                ClientOp::Append(batch)
            }
            Call::StoreOffset { kind, id, offset } => ClientOp::StoreOffset { kind, id, offset },
            Call::DeleteOffset { kind, id } => ClientOp::DeleteOffset { kind, id },
            Call::Purge { generation } => ClientOp::Purge { generation },
            other => {
                let _ = reply.send(Err(CallError::Rejected {
                    reason: format!("{} is not replicated", other.name()),
                }));
                continue;
            }
        };
        let request_number = g.next_request;
        let request = ClientRequest {
            client,
            session,
            request: request_number,
            user_id: 0,
            op,
        };
        match g.partition.submit_keyed(request, keyed, now_us).await {
            Ok(RequestOutcome::Prepared { op }) => {
                g.next_request += 1;
                let flight = InFlight {
                    reply,
                    op: Some(op),
                };
                g.in_flight.insert(request_number, flight);
                in_flight_groups.insert(group);
            }
            Ok(RequestOutcome::InFlight | RequestOutcome::Answered) => {
                g.next_request += 1;
                g.in_flight
                    .insert(request_number, InFlight { reply, op: None });
                in_flight_groups.insert(group);
            }
            Ok(RequestOutcome::Unavailable) => {
                let _ = reply.send(Err(CallError::Unavailable {
                    reason: "the group is not taking requests (view change, transfer or full pipeline)",
                }));
            }
            Ok(RequestOutcome::ReservedClient) => {
                let _ = reply.send(Err(CallError::Rejected {
                    reason: "reserved client id".into(),
                }));
            }
            Err(error) => {
                let _ = reply.send(Err(partition_error(error)));
            }
        }
    }
}
