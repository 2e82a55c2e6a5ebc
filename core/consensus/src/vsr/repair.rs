//! Journal repair and the state-transfer hooks, as methods of [`Replica`].
//!
//! A replica missing bodies between its applied point and its head (or the
//! head of a view it is about to start) asks one peer at a time for a slice
//! of at most 128 ops, highest missing slice first, so that every prepare
//! that comes back can be verified down the hash chain from a header the
//! log already trusts. A peer serves what it holds, first announcing
//! `RangeEvicted{retained_from}` when the slice starts below the oldest op
//! it still retains. A slice that brings nothing moves on to the next peer;
//! when every peer has been tried and the ones that answered all retain
//! only ops above what is needed, the replica concludes `FloorRefused` and
//! emits [`Effect::StartStateTransfer`]. The driver installs the transfer
//! with `set_commit_floor`, `set_sequence`, `clear_pipeline`,
//! `advance_commit_max` and `finish_state_transfer`; until then the replica
//! acknowledges nothing and applies nothing.

use common::{Op, ReplicaId};
use std::collections::BTreeMap;

use super::io::{Effect, FrameError, Handled, Ignored, Status};
use super::journal::Retained;
use super::message::{Message, Prepare};
use super::replica::{RepairSession, Replica};

/// Prepares served per RequestPrepares.
pub const REPAIR_CHUNK_MAX: u64 = 128;

/// The identity recorded for an applied point whose prepare identity is not
/// known (a state-transfer install: the offer names `commit_op` but not its
/// identity). Zero is the reference's "unsealed, nothing to verify" value;
/// a real identity of zero has odds of 2^-64 and op 0 legitimately has it.
pub const UNKNOWN_CHECKSUM: u128 = 0;

/// Unverified repaired prepares buffered while waiting for their anchor.
const REPAIR_BUFFER_MAX: usize = 512;

/// Journal repair's state: the session open with one peer, the repaired
/// prepares waiting for the ops below them, which peers were tried since
/// progress was last made, and where each peer said its retained range
/// starts.
#[derive(Debug, Clone, Default)]
pub(super) struct RepairState {
    /// The open session, if any.
    pub session: Option<RepairSession>,
    /// Repaired prepares not yet chained into the journal, by op.
    pub buffer: BTreeMap<u64, Prepare>,
    /// Peers tried without progress, one bit per replica.
    pub tried: u32,
    /// The first op each peer said it still retains (`RangeEvicted`).
    pub evicted: BTreeMap<u8, u64>,
    /// Prepares repaired since the replica was made (progress detection).
    pub repaired_total: u64,
}

impl Replica {
    fn repair_target(&self) -> Option<u64> {
        match self.status {
            Status::Normal => Some(self.head()),
            Status::ViewChange => self.votes.pending_view.as_ref().map(|m| m.op_head.0),
            Status::Recovering => None,
        }
    }

    /// Open a repair session if the journal has holes below its target and
    /// none is open.
    pub(super) fn maybe_repair(&mut self) {
        if self.transferring || self.repair.session.is_some() {
            return;
        }
        let Some(target) = self.repair_target() else {
            return;
        };
        let Some(first) = self.journal.first_missing(self.commit_min, target) else {
            self.repair.tried = 0;
            self.repair.evicted.clear();
            self.timers.repair.stop();
            return;
        };
        let mut last = target;
        while last > first && self.journal.entry(last).is_some() {
            last -= 1;
        }
        let from_op = first.max(last.saturating_sub(REPAIR_CHUNK_MAX - 1));
        match self.choose_repair_peer(last) {
            Some(peer) => {
                let nonce = self.next_nonce();
                self.repair.session = Some(RepairSession {
                    nonce,
                    peer,
                    from_op,
                    to_op: last,
                    mark: self.repair.repaired_total,
                });
                self.send(
                    peer,
                    Message::RequestPrepares {
                        nonce,
                        from_op: Op(from_op),
                        to_op: Op(last),
                    },
                );
                self.timers.repair.start();
            }
            None => {
                let refused = !self.repair.evicted.is_empty()
                    && self.repair.evicted.values().all(|r| *r > first);
                if refused {
                    self.conclude_floor_refused(target);
                } else {
                    // Every peer tried without progress: wait, then go again.
                    self.repair.tried = 0;
                    self.repair.evicted.clear();
                    if !self.timers.repair.running() {
                        self.timers.repair.start();
                    }
                }
            }
        }
    }

    /// The next peer to ask: a voter that offered the op's body during a
    /// view change, else the primary, else the ring after us; never one
    /// already tried this round.
    fn choose_repair_peer(&self, op: u64) -> Option<u8> {
        let n = self.config.replica_count;
        let me = self.config.replica.0;
        let untried = |r: u8| r != me && self.repair.tried & (1u32 << r) == 0;
        if let Some(holders) = self
            .votes
            .pending_view
            .as_ref()
            .and_then(|m| m.holders.get(&op))
        {
            for r in 0..n {
                if holders & (1u32 << r) != 0 && untried(r) {
                    return Some(r);
                }
            }
        }
        let primary = self.primary_of(self.view);
        if self.status == Status::Normal && untried(primary) {
            return Some(primary);
        }
        (1..n).map(|i| (me + i) % n).find(|r| untried(*r))
    }

    fn conclude_floor_refused(&mut self, target: u64) {
        let floor = self
            .repair
            .evicted
            .values()
            .min()
            .map_or(self.commit_min, |r| r.saturating_sub(1));
        let primary = self.primary_of(self.view);
        let peer = if primary != self.config.replica.0 && self.status == Status::Normal {
            primary
        } else {
            self.repair
                .evicted
                .iter()
                .max_by_key(|(_, r)| **r)
                .map_or(primary, |(p, _)| *p)
        };
        self.repair.session = None;
        self.repair.tried = 0;
        self.repair.evicted.clear();
        self.timers.repair.stop();
        self.transferring = true;
        self.timers.state_transfer.start();
        self.effect(Effect::StartStateTransfer {
            peer: ReplicaId(peer),
            floor: Op(floor),
            to_op: Op(target),
        });
    }

    pub(super) fn on_request_prepares(
        &mut self,
        from: u8,
        nonce: u128,
        from_op: u64,
        to_op: u64,
    ) -> Result<Handled, FrameError> {
        if from_op == 0 || from_op > to_op {
            return Err(FrameError::BadRange {
                from_op: Op(from_op),
                to_op: Op(to_op),
            });
        }
        if self.transferring {
            return Ok(Handled::Ignored(Ignored::Transferring));
        }
        let retained_from = self.journal.retained_from();
        let start = from_op.max(retained_from);
        if start > from_op {
            self.send(
                from,
                Message::RangeEvicted {
                    nonce,
                    retained_from: Op(retained_from),
                },
            );
        }
        let end = to_op.min(start.saturating_add(REPAIR_CHUNK_MAX - 1));
        let slice = self
            .journal
            .retained_range(start, end, REPAIR_CHUNK_MAX as usize);
        if slice.iter().any(|r| matches!(r, Retained::Spilled(_))) {
            // The driver reads the spilled bodies back and hands the slice
            // to `serve_read_back`, which answers as below.
            self.effect(Effect::ReadBack {
                to: ReplicaId(from),
                nonce,
                from_op: Op(start),
                slice,
            });
            return Ok(Handled::Taken);
        }
        let held = slice.into_iter().map(|r| match r {
            Retained::Held(p) => Some(p),
            Retained::Spilled(_) => None,
        });
        self.answer_request_prepares(from, nonce, start, held);
        Ok(Handled::Taken)
    }

    /// Answers a RequestPrepares slice that needed bodies read back
    /// ([`Effect::ReadBack`]): `read` holds, in the slice's op order from
    /// `from_op`, each prepare as read (or `None` where the read failed).
    /// A prepare that does not verify against the header retained at its
    /// op counts as failed. Everything at or below the highest failed op
    /// is announced evicted and not served, so the peer never receives a
    /// slice with a hole it would wait on.
    pub fn serve_read_back(
        &mut self,
        to: u8,
        nonce: u128,
        from_op: u64,
        read: Vec<Option<Prepare>>,
    ) {
        if self.transferring || to >= self.config.replica_count {
            return;
        }
        // Each slot must hold the op of its position, as retained here.
        let checked: Vec<Option<Prepare>> = read
            .into_iter()
            .zip(from_op..)
            .map(|(p, op)| {
                p.filter(|p| {
                    p.header.op.0 == op
                        && p.verify()
                        && self
                            .journal
                            .header(op)
                            .is_some_and(|h| h.checksum == p.header.checksum)
                })
            })
            .collect();
        self.answer_request_prepares(to, nonce, from_op, checked.into_iter());
    }

    /// Sends the slice starting at `from_op`: `RangeEvicted` above the
    /// highest op missing from it (if any), the prepares above that, then
    /// `RepairDone`.
    fn answer_request_prepares(
        &mut self,
        to: u8,
        nonce: u128,
        from_op: u64,
        slice: impl Iterator<Item = Option<Prepare>>,
    ) {
        let slice: Vec<Option<Prepare>> = slice.collect();
        let skip = slice.iter().rposition(Option::is_none).map_or(0, |i| i + 1);
        if skip > 0 {
            self.send(
                to,
                Message::RangeEvicted {
                    nonce,
                    retained_from: Op(from_op.saturating_add(skip as u64)),
                },
            );
        }
        let mut last = from_op.saturating_add(skip as u64).saturating_sub(1);
        for prepare in slice.into_iter().skip(skip).flatten() {
            last = prepare.header.op.0;
            self.send(to, Message::RepairPrepare(prepare));
        }
        self.send(
            to,
            Message::RepairDone {
                nonce,
                op: Op(last),
            },
        );
    }

    pub(super) fn on_repair_prepare(&mut self, prepare: Prepare) -> Result<Handled, FrameError> {
        self.check_prepare(&prepare)?;
        let op = prepare.header.op.0;
        if self.transferring {
            return Ok(Handled::Ignored(Ignored::Transferring));
        }
        if op <= self.commit_min || self.journal.entry(op).is_some() {
            return Ok(Handled::Ignored(Ignored::AlreadyHeld));
        }
        if self.repair.buffer.len() >= REPAIR_BUFFER_MAX && !self.repair.buffer.contains_key(&op) {
            return Ok(Handled::Ignored(Ignored::RepairBufferFull));
        }
        self.repair.buffer.insert(op, prepare);
        let inserted = self
            .journal
            .absorb(&mut self.repair.buffer, self.commit_min);
        if inserted.is_empty() {
            // Buffered until the ops below it arrive.
            return Ok(Handled::Taken);
        }
        for op in inserted {
            self.repair.repaired_total += 1;
            if let Some(p) = self.journal.entry(op).cloned() {
                self.last_timestamp = self.last_timestamp.max(p.header.timestamp);
                self.effect(Effect::Journal { prepare: p });
            }
        }
        self.after_journal_change();
        Ok(Handled::Taken)
    }

    pub(super) fn on_repair_done(&mut self, from: u8, nonce: u128, _op: u64) -> Handled {
        let Some(session) = self.repair.session else {
            return Handled::Ignored(Ignored::NoSuchRepair);
        };
        if session.nonce != nonce || session.peer != from {
            return Handled::Ignored(Ignored::NoSuchRepair);
        }
        self.repair.session = None;
        self.timers.repair.stop();
        if self.repair.repaired_total > session.mark {
            self.repair.tried = 0;
            self.repair.evicted.clear();
        } else {
            self.repair.tried |= 1u32 << from;
        }
        self.maybe_repair();
        Handled::Taken
    }

    pub(super) fn on_range_evicted(
        &mut self,
        from: u8,
        nonce: u128,
        retained_from: u64,
    ) -> Handled {
        match self.repair.session {
            Some(s) if s.nonce == nonce && s.peer == from => {
                self.repair.evicted.insert(from, retained_from);
                Handled::Taken
            }
            _ => Handled::Ignored(Ignored::NoSuchRepair),
        }
    }

    pub(super) fn on_repair_timeout(&mut self) {
        if let Some(session) = self.repair.session.take() {
            // A silent peer counts as tried.
            self.repair.tried |= 1u32 << session.peer;
        }
        self.maybe_repair();
    }

    pub(super) fn on_state_transfer_timeout(&mut self) {
        if self.transferring {
            self.transferring = false;
            self.after_journal_change();
        }
    }

    /// State-transfer install: everything up to `floor` is now represented
    /// by installed state whose last op has identity `checksum`. Never
    /// moves `commit_min` backwards (asserted: the caller checks first).
    ///
    /// `checksum` may be [`UNKNOWN_CHECKSUM`]: the state-transfer offer
    /// names its op but not that op's identity (the reference's frame has
    /// no field for it). The replica then learns the identity from the
    /// first trusted source that names it (see
    /// [`Replica::commit_min_checksum_known`]) before it applies, proposes
    /// or acknowledges anything chained to it.
    pub fn set_commit_floor(&mut self, floor: Op, checksum: u128) {
        let floor = floor.0;
        assert!(
            floor >= self.commit_min,
            "set_commit_floor would rewind commit_min"
        );
        let checksum = if checksum == UNKNOWN_CHECKSUM {
            self.own_committed_identity(floor)
                .unwrap_or(UNKNOWN_CHECKSUM)
        } else {
            checksum
        };
        self.commit_min = floor;
        self.commit_min_checksum = checksum;
        self.journal.reset_floor(floor);
        self.repair.buffer.retain(|op, _| *op > floor);
        self.raise_commit_max(floor);
        self.resolve_commit_min_checksum();
    }

    /// The identity of op `op` when this replica's own log already names
    /// it as committed, read before an install drops the journal at and
    /// below its floor: `commit_min` itself, or, on the primary of the
    /// current view, the header its log holds at an op at or below
    /// `commit_max` (the primary's log is the view's canonical log, and an
    /// op it knows committed is the one every later view holds).
    ///
    /// Without this a primary that installed a transfer at its own head
    /// (the offer carries no identity) lost the header that named it and
    /// had no way to learn it again: backups learn from its heartbeat, it
    /// learns from nobody, so it refused every request as `Unavailable`
    /// while the group looked healthy (vsr_sim seeds 10002976, 10024589
    /// and sixteen more in 10,000,000..10,100,000).
    fn own_committed_identity(&self, op: u64) -> Option<u128> {
        if op == self.commit_min && self.commit_min_checksum_known() {
            return Some(self.commit_min_checksum);
        }
        if !self.is_primary() || op > self.commit_max {
            return None;
        }
        self.journal
            .header(op)
            .map(|h| h.checksum)
            .filter(|c| *c != UNKNOWN_CHECKSUM)
    }

    /// Whether the identity of op `commit_min` is known. Op 0 (nothing
    /// applied) has identity 0 by definition, and a replica alone in its
    /// group has nobody to learn from: its chain continues from whatever
    /// it recorded (a solo restart records 0, see the partition's boot).
    pub fn commit_min_checksum_known(&self) -> bool {
        self.commit_min == 0
            || self.commit_min_checksum != UNKNOWN_CHECKSUM
            || self.config.replica_count == 1
    }

    /// Learns an unknown applied identity from the log: the `parent` of a
    /// trusted header at `commit_min + 1` (a canonical header from a
    /// StartView or merge, or an entry inserted by the view's authority or
    /// verified down the hash chain) names it. Called wherever the log
    /// gains trusted headers; until it succeeds, the commit walk and the
    /// primary's proposals wait.
    pub(super) fn resolve_commit_min_checksum(&mut self) {
        if self.commit_min_checksum_known() {
            return;
        }
        if let Some(above) = self.journal.header(self.commit_min + 1) {
            self.learn_commit_min_checksum(above.parent);
        }
    }

    /// Records the identity of op `commit_min`, if it was unknown.
    pub(super) fn learn_commit_min_checksum(&mut self, checksum: u128) {
        if self.commit_min_checksum_known() || checksum == UNKNOWN_CHECKSUM {
            return;
        }
        self.commit_min_checksum = checksum;
    }

    /// A state-transfer session for this replica is live in its driver:
    /// keep the core waiting for it (no commit walk, no acknowledgements,
    /// no live prepares) and restart the state-transfer timer, so a pull
    /// longer than the timer is not abandoned to repair half way. Without
    /// this, a replica that resumed repairing between FloorRefused
    /// conclusions (or after a converge) applies and acknowledges the live
    /// tail, and every offer is behind it by the time it lands.
    pub fn hold_state_transfer(&mut self) {
        if !self.transferring {
            self.transferring = true;
            self.repair.session = None;
            self.timers.repair.stop();
        }
        self.timers.state_transfer.start();
    }

    /// The install is complete (or was abandoned): resume acknowledging,
    /// applying and repairing toward `commit_max`.
    pub fn finish_state_transfer(&mut self) {
        self.transferring = false;
        self.timers.state_transfer.stop();
        self.repair.session = None;
        self.repair.tried = 0;
        self.repair.evicted.clear();
        self.after_journal_change();
    }
}
