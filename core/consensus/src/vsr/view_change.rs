//! View change (StartViewChange, DoViewChange, StartView) and the
//! RequestStartView probe, as methods of [`Replica`].
//!
//! Flow: a backup whose primary went quiet enters view `v + 1` (status
//! ViewChange, durable before any send) and broadcasts StartViewChange.
//! With StartViewChange from `f` others it sends its DoViewChange — its
//! `log_view`, head, commit point and the suffix of up to 128 headers above
//! it — to the new primary. The new primary merges a view-change quorum of
//! them (`merge.rs`), installs the merged headers, repairs any body it
//! lacks from the voters that offered it, and only then starts the view:
//! `log_view = view`, persisted, StartView broadcast, uncommitted ops
//! re-entered into the pipeline. A backup adopts a StartView by installing
//! its headers (dropping what disagrees) and acknowledging what it holds.
//!
//! A restarted replica (see `Replica::restart`) never votes: it only probes
//! with RequestStartView and adopts the StartView that echoes its
//! incarnation, whose head becomes its barrier.

use super::io::{Effect, FrameError, Handled, Ignored, Status};
use super::merge::{DVC_HEADERS_MAX, MergedLog, merge};
use super::message::{DoViewChange, Message, PrepareHeader, StartView, SuffixSlot};
use super::replica::{REJOIN_PROBE, Replica};
use common::Op;

/// The votes of one view change: who sent StartViewChange, the
/// DoViewChange messages a candidate primary collected, whether this
/// replica sent its own, and the merged log waiting to be persisted.
#[derive(Debug, Clone)]
pub(super) struct Votes {
    /// StartViewChange senders, one bit per replica.
    pub svc_from: u32,
    /// DoViewChange messages by sender.
    pub dvcs: Vec<Option<DoViewChange>>,
    /// Whether this replica sent its DoViewChange.
    pub dvc_sent: bool,
    /// The merged log of a view this replica starts as primary, until its
    /// view is durable.
    pub pending_view: Option<MergedLog>,
}

impl Votes {
    pub(super) fn new(replica_count: u8) -> Self {
        Self {
            svc_from: 0,
            dvcs: vec![None; usize::from(replica_count)],
            dvc_sent: false,
            pending_view: None,
        }
    }

    /// Forgets every vote (a view started or adopted, or a new one begun).
    pub(super) fn reset(&mut self) {
        self.svc_from = 0;
        for d in self.dvcs.iter_mut() {
            *d = None;
        }
        self.dvc_sent = false;
        self.pending_view = None;
    }
}

impl Replica {
    /// Remember a view newer than ours seen on traffic we dropped, and
    /// probe its primary (at most once per probe timeout).
    pub(super) fn note_newer_view(&mut self, view: u32) {
        if view <= self.view {
            return;
        }
        self.observed_newer_view = self.observed_newer_view.max(view);
        if !self.timers.request_start_view.running() {
            self.timers.request_start_view.start();
            self.send_request_start_view(Some(view));
        }
    }

    /// Probe the primary of `target` (or everyone).
    pub(super) fn send_request_start_view(&mut self, target: Option<u32>) {
        let message = self.request_start_view_message();
        match target {
            Some(view) => {
                let primary = self.primary_of(view);
                self.send(primary, message);
            }
            None => self.broadcast(message),
        }
    }

    /// Probe one replica (a census answer).
    pub(super) fn send_request_start_view_to(&mut self, to: u8) {
        let message = self.request_start_view_message();
        self.send(to, message);
    }

    fn request_start_view_message(&self) -> Message {
        Message::RequestStartView {
            incarnation: self.recovering.map_or(0, |r| r.incarnation),
            census: self.census_report(),
        }
    }

    pub(super) fn on_normal_heartbeat_timeout(&mut self) {
        if self.status != Status::Normal || self.primary_of(self.view) == self.config.replica.0 {
            return;
        }
        self.timers.normal_heartbeat.start_jittered(&mut self.prng);
        if self.recovering.is_some() {
            self.send_request_start_view(None);
            return;
        }
        if self.observed_newer_view > self.view.max(self.asked_newer_view) {
            // Maybe we only missed an election: ask before electing, once
            // per view seen. A view already asked about does not count
            // again: a restarted peer probing from a view that never formed
            // re-notes it between every two timeouts.
            let target = self.observed_newer_view;
            self.observed_newer_view = 0;
            self.asked_newer_view = target;
            self.send_request_start_view(Some(target));
            return;
        }
        self.start_view_change(self.view.saturating_add(1));
    }

    fn reset_view_change_state(&mut self) {
        self.votes.reset();
    }

    /// Enter view `view` as a candidate participant.
    pub(super) fn start_view_change(&mut self, view: u32) {
        assert!(
            self.recovering.is_none(),
            "a recovering replica never votes"
        );
        assert!(view >= self.view, "views never go backwards");
        self.view = view;
        self.status = Status::ViewChange;
        self.reset_view_change_state();
        self.votes.svc_from = 1u32 << self.config.replica.0;
        self.pipeline.clear();
        if self.observed_newer_view <= view {
            self.observed_newer_view = 0;
        }
        self.persist();
        self.timers.normal_heartbeat.stop();
        self.timers.prepare.stop();
        self.timers.commit_message.stop();
        self.timers.start_view_change.start();
        self.timers.do_view_change.stop();
        self.timers
            .view_change_status
            .start_jittered(&mut self.prng);
        self.broadcast(Message::StartViewChange);
        self.check_svc_quorum();
    }

    pub(super) fn on_start_view_change(&mut self, from: u8, view: u32) -> Handled {
        // A member in a view change may be weighing whether its vote is
        // useless; a waiting replica tells it so in its view (census.rs).
        // The vote itself is still ignored (`Invisible`) by a waiting one.
        self.answer_member_with_report(from, view);
        if self.recovering.is_some() || view < self.view {
            self.note_newer_view(view);
            return Handled::Ignored(if self.recovering.is_some() {
                Ignored::Invisible
            } else {
                Ignored::StaleView
            });
        }
        if view > self.view {
            self.start_view_change(view);
        }
        if self.status == Status::Normal {
            if self.is_primary() {
                // The sender missed our StartView.
                let sv = self.start_view_message(0);
                self.send(from, Message::StartView(sv));
                return Handled::Taken;
            }
            return Handled::Ignored(Ignored::AlreadyInView);
        }
        self.votes.svc_from |= 1u32 << from;
        self.check_svc_quorum();
        Handled::Taken
    }

    fn check_svc_quorum(&mut self) {
        if self.status != Status::ViewChange || self.votes.dvc_sent {
            return;
        }
        let others = (self.votes.svc_from & !(1u32 << self.config.replica.0)).count_ones() as usize;
        if others >= self.quorums.max_faulty() {
            self.send_do_view_change();
        }
    }

    /// This replica's vote: its log tail from the head down to the commit
    /// point. A missing header is a blank, which proves nothing. An op above
    /// the contiguous journal frontier is nacked: PrepareOk is cumulative
    /// and sent only for a contiguous journal, and entries above the commit
    /// point leave the journal only when they were not the log's (a
    /// conflicting primary prepare or a new view's log), so this replica
    /// never acknowledged that op in a way a commit could count; except up
    /// to the last body a resumed replica log held (`resumed_head`: the
    /// log need not show every op below it). Ops above the head are
    /// nacked implicitly by `op`.
    pub(super) fn build_do_view_change(&self) -> DoViewChange {
        // A state-transfer install cut this log view's suffix above the
        // installed op: the log did not end there, so the vote reports
        // the old head with blanks (it proves nothing about those ops but
        // the nacks it can truthfully give). Without it, the only voters
        // of the highest log view could present that log as ending at the
        // installed op and outvote an op committed in it (durable-journal
        // harness seed 13345).
        let op = self.head().max(self.cut_head);
        let commit = self.commit_max.min(op);
        let frontier = self.journal.contiguous_to(self.commit_min);
        let mut suffix = Vec::new();
        let mut present = 0u128;
        let mut nack = 0u128;
        let mut x = op;
        while x >= 1 && x >= commit && suffix.len() < DVC_HEADERS_MAX {
            if x > frontier && x > commit && x > self.resumed_head {
                nack |= 1u128 << suffix.len();
            }
            // A header that does not chain to the one above it (a
            // timestamp not below it: an op a restarted primary ordered
            // before it learned the earlier op's) would make peers refuse
            // the whole vote; only the commit point's header can be so,
            // and a blank there proves nothing either way.
            let above = match suffix.last() {
                Some(SuffixSlot::Header(a)) => Some(*a),
                _ => None,
            };
            match self.journal.header(x) {
                Some(h) if above.is_some_and(|a| !chains(&a, h)) => suffix.push(SuffixSlot::Blank),
                Some(h) => {
                    if self.journal.entry(x).is_some() {
                        present |= 1u128 << suffix.len();
                    }
                    suffix.push(SuffixSlot::Header(*h));
                }
                None => suffix.push(SuffixSlot::Blank),
            }
            x -= 1;
        }
        DoViewChange {
            log_view: self.log_view,
            op: Op(op),
            commit: Op(commit),
            suffix,
            nack_bitset: nack,
            present_bitset: present,
        }
    }

    fn send_do_view_change(&mut self) {
        let dvc = self.build_do_view_change();
        self.votes.dvc_sent = true;
        let primary = self.primary_of(self.view);
        if primary == self.config.replica.0 {
            let me = usize::from(self.config.replica.0);
            if self.votes.dvcs[me].is_none() {
                self.votes.dvcs[me] = Some(dvc);
            }
            self.try_merge();
        } else {
            self.send(primary, Message::DoViewChange(dvc));
            self.timers.do_view_change.start();
        }
    }

    fn validate_do_view_change(view: u32, dvc: &DoViewChange) -> Result<(), FrameError> {
        let bad = |reason| Err(FrameError::MalformedViewMessage { reason });
        if dvc.log_view > view {
            return bad("log_view ahead of view");
        }
        if dvc.commit.0 > dvc.op.0 {
            return bad("commit ahead of op");
        }
        if dvc.suffix.len() > DVC_HEADERS_MAX {
            return bad("suffix longer than 128 headers");
        }
        let len = dvc.suffix.len();
        let beyond = if len >= 128 { 0 } else { !0u128 << len };
        if (dvc.nack_bitset | dvc.present_bitset) & beyond != 0 {
            return bad("bitset bit beyond the suffix");
        }
        let mut previous: Option<PrepareHeader> = None;
        for (i, slot) in dvc.suffix.iter().enumerate() {
            let expected_op = dvc.op.0.checked_sub(i as u64);
            match slot {
                SuffixSlot::Header(h) => {
                    if Some(h.op.0) != expected_op {
                        return bad("suffix ops not consecutive from the head");
                    }
                    if !h.verify() {
                        return bad("suffix header fails its identity checksum");
                    }
                    if let Some(p) = previous
                        && p.op.0 == h.op.0 + 1
                        && !chains(&p, h)
                    {
                        return bad("suffix headers do not hash-chain");
                    }
                    previous = Some(*h);
                }
                SuffixSlot::Blank => {
                    if expected_op.is_none_or(|o| o == 0) {
                        return bad("suffix runs below op 1");
                    }
                    previous = None;
                }
            }
        }
        Ok(())
    }

    pub(super) fn on_do_view_change(
        &mut self,
        from: u8,
        view: u32,
        dvc: DoViewChange,
    ) -> Result<Handled, FrameError> {
        Self::validate_do_view_change(view, &dvc)?;
        if self.recovering.is_some() || view < self.view {
            self.note_newer_view(view);
            return Ok(Handled::Ignored(if self.recovering.is_some() {
                Ignored::Invisible
            } else {
                Ignored::StaleView
            }));
        }
        if view > self.view {
            self.start_view_change(view);
        }
        if self.primary_of(view) != self.config.replica.0 {
            return Ok(Handled::Ignored(Ignored::NotPrimary));
        }
        if self.status == Status::Normal {
            let sv = self.start_view_message(0);
            self.send(from, Message::StartView(sv));
            return Ok(Handled::Taken);
        }
        let slot = usize::from(from);
        if self.votes.dvcs[slot].is_none() {
            self.votes.dvcs[slot] = Some(dvc);
        }
        let me = usize::from(self.config.replica.0);
        if self.votes.dvcs[me].is_none() {
            self.votes.dvcs[me] = Some(self.build_do_view_change());
            self.votes.dvc_sent = true;
        }
        self.try_merge();
        Ok(Handled::Taken)
    }

    fn try_merge(&mut self) {
        if self.status != Status::ViewChange {
            return;
        }
        if self.votes.pending_view.is_some() {
            self.try_start_view();
            return;
        }
        let votes: Vec<(u8, &DoViewChange)> = self
            .votes
            .dvcs
            .iter()
            .enumerate()
            .filter_map(|(r, d)| d.as_ref().map(|d| (r as u8, d)))
            .collect();
        let Ok(merged) = merge(&votes, self.quorums) else {
            return;
        };
        self.install_pending(merged);
    }

    fn install_pending(&mut self, merged: MergedLog) {
        self.raise_commit_max(merged.commit_max.0);
        let before = self.head();
        self.learn_timestamps(&merged.headers);
        self.journal
            .install_log(&merged.headers, merged.op_head.0, self.commit_min);
        if let Some(h) = merged.headers.iter().find(|h| h.op.0 == self.commit_min) {
            self.learn_commit_min_checksum(h.checksum);
        }
        self.resolve_commit_min_checksum();
        if before > merged.op_head.0 {
            self.effect(Effect::TruncateJournal {
                from_op: merged.op_head + 1,
            });
        }
        self.repair.session = None;
        self.repair.tried = 0;
        self.votes.pending_view = Some(merged);
        self.try_start_view();
        self.maybe_repair();
    }

    /// Start the pending view once every uncommitted op's body is held.
    pub(super) fn try_start_view(&mut self) {
        let Some(merged) = &self.votes.pending_view else {
            return;
        };
        if self.status != Status::ViewChange {
            return;
        }
        let op_head = merged.op_head;
        let from = self.commit_max + 1;
        if (from..=op_head.0).any(|op| self.journal.entry(op).is_none()) {
            return;
        }
        self.votes.pending_view = None;
        self.start_view(op_head.0);
    }

    pub(super) fn start_view(&mut self, op_head: u64) {
        self.status = Status::Normal;
        self.forget_census_reports();
        // A new primary's commit point can trail ops an earlier primary
        // committed and acknowledged (the DVC quorum may not have heard of
        // the commit): until it commits its whole starting log again, its
        // applied state is not the group's, and reads of it would go back
        // in time (simulator seed 1000005, partition profile).
        self.view_start_op = op_head;
        self.log_view = self.view;
        self.cut_head = 0;
        self.persist();
        self.pipeline.clear();
        let me = 1u32 << self.config.replica.0;
        for op in (self.commit_max + 1)..=op_head {
            if let Some(h) = self.journal.header(op).copied() {
                self.last_timestamp = self.last_timestamp.max(h.timestamp);
                self.pipeline.push(h, me);
            }
        }
        self.reset_view_change_state();
        self.repair.session = None;
        self.enter_normal_timers();
        let sv = self.start_view_message(0);
        self.broadcast(Message::StartView(sv));
        let ops: Vec<u64> = self.pipeline.iter().map(|e| e.header.op.0).collect();
        for op in ops {
            if let Some(p) = self.journal.entry(op).cloned() {
                self.broadcast(Message::Prepare(p));
            }
        }
        self.try_commit();
        self.maybe_repair();
    }

    /// The StartView for the current log: head, commit point and the
    /// headers from the head down to the commit point (at most 128).
    pub(super) fn start_view_message(&self, incarnation: u128) -> StartView {
        let op = self.head();
        let mut suffix = Vec::new();
        let mut x = op;
        while x >= 1 && x >= self.commit_max && suffix.len() < DVC_HEADERS_MAX {
            match self.journal.header(x) {
                Some(h) => suffix.push(*h),
                None => break,
            }
            x -= 1;
        }
        StartView {
            op: Op(op),
            commit: Op(self.commit_max),
            suffix,
            incarnation,
        }
    }

    fn validate_start_view(sv: &StartView) -> Result<(), FrameError> {
        let bad = |reason| Err(FrameError::MalformedViewMessage { reason });
        if sv.commit.0 > sv.op.0 {
            return bad("commit ahead of op");
        }
        if sv.suffix.len() > DVC_HEADERS_MAX {
            return bad("suffix longer than 128 headers");
        }
        for (i, h) in sv.suffix.iter().enumerate() {
            if sv.op.0.checked_sub(i as u64) != Some(h.op.0) {
                return bad("suffix ops not consecutive from the head");
            }
            if !h.verify() {
                return bad("suffix header fails its identity checksum");
            }
            if i > 0 && sv.suffix[i - 1].parent != h.checksum {
                return bad("suffix headers do not hash-chain");
            }
        }
        Ok(())
    }

    pub(super) fn on_start_view(
        &mut self,
        from: u8,
        view: u32,
        sv: StartView,
    ) -> Result<Handled, FrameError> {
        Self::validate_start_view(&sv)?;
        if from != self.primary_of(view) {
            return Ok(Handled::Ignored(Ignored::NotFromAuthority));
        }
        if let Some(recovery) = self.recovering {
            // Only an answer to our own probe tells us a head at least as
            // high as anything we acknowledged before the restart.
            if sv.incarnation != recovery.incarnation {
                return Ok(Handled::Ignored(Ignored::NotOurProbe));
            }
            if view < self.view {
                return Ok(Handled::Ignored(Ignored::StaleView));
            }
            // Without a superblock, only f + 1 peers' views bound ours.
            if let Some(bound) = recovery.rejoin {
                // A majority of the group, and never more than the others.
                let n = usize::from(self.config.replica_count);
                let quorum = (n / 2 + 1).min(n - 1);
                if bound.lowest_view(quorum).is_none_or(|lowest| view < lowest) {
                    return Ok(Handled::Ignored(Ignored::NotOurProbe));
                }
            }
        } else if view < self.view {
            return Ok(Handled::Ignored(Ignored::StaleView));
        } else if view == self.view && self.status == Status::Normal {
            return Ok(Handled::Ignored(Ignored::AlreadyInView));
        }
        if sv.op.0 < self.commit_min {
            return Ok(Handled::Ignored(Ignored::BehindApplied));
        }
        self.view = view;
        self.log_view = view;
        self.cut_head = 0;
        self.status = Status::Normal;
        self.forget_census_reports();
        self.reset_view_change_state();
        self.pipeline.clear();
        if self.observed_newer_view <= view {
            self.observed_newer_view = 0;
        }
        self.raise_commit_max(sv.commit.0);
        let before = self.head();
        self.learn_timestamps(&sv.suffix);
        self.journal
            .install_log(&sv.suffix, sv.op.0, self.commit_min);
        if let Some(h) = sv.suffix.iter().find(|h| h.op.0 == self.commit_min) {
            self.learn_commit_min_checksum(h.checksum);
        }
        self.resolve_commit_min_checksum();
        if before > sv.op.0 {
            self.effect(Effect::TruncateJournal {
                from_op: Op(sv.op.0 + 1),
            });
        }
        self.persist();
        if let Some(recovery) = &mut self.recovering {
            recovery.barrier = Some(sv.op.0);
            // The view is durable now: the restart rule's bound again.
            recovery.rejoin = None;
        }
        self.timers.request_start_view.stop();
        self.heartbeat_seen = 0;
        self.repair.session = None;
        self.repair.tried = 0;
        self.enter_normal_timers();
        self.after_journal_change();
        Ok(Handled::Taken)
    }

    pub(super) fn on_request_start_view(
        &mut self,
        from: u8,
        view: u32,
        incarnation: u128,
    ) -> Handled {
        if view > self.view {
            self.note_newer_view(view);
            return Handled::Ignored(Ignored::NewerView);
        }
        if self.is_primary() && self.log_view == self.view {
            let sv = self.start_view_message(incarnation);
            self.send(from, Message::StartView(sv));
            return Handled::Taken;
        }
        let mut handled = Handled::Ignored(Ignored::NotPrimary);
        if incarnation & REJOIN_PROBE != 0
            && self.status == Status::Normal
            && self.recovering.is_none()
        {
            // A replica rejoining after a lost disk: report our view (the
            // frame carries it) with a probe that asks for no answer
            // (incarnation 0), so it can bound its view by f + 1 of ours.
            self.send(
                from,
                Message::RequestStartView {
                    incarnation: 0,
                    census: None,
                },
            );
            handled = Handled::Taken;
        }
        if from == self.primary_of(self.view)
            && view == self.view
            && self.status == Status::Normal
            && self.recovering.is_none()
        {
            // Our primary restarted (or was deposed): it will not lead.
            self.start_view_change(self.view.saturating_add(1));
            handled = Handled::Taken;
        }
        handled
    }

    pub(super) fn on_start_view_change_timeout(&mut self) {
        if self.status != Status::ViewChange {
            return;
        }
        self.timers.start_view_change.backoff(&mut self.prng);
        self.broadcast(Message::StartViewChange);
    }

    pub(super) fn on_do_view_change_timeout(&mut self) {
        let primary = self.primary_of(self.view);
        if self.status != Status::ViewChange
            || !self.votes.dvc_sent
            || primary == self.config.replica.0
        {
            return;
        }
        self.timers.do_view_change.backoff(&mut self.prng);
        let dvc = self.build_do_view_change();
        self.send(primary, Message::DoViewChange(dvc));
    }

    pub(super) fn on_request_start_view_timeout(&mut self) {
        if self.status == Status::Recovering {
            self.timers.request_start_view.backoff(&mut self.prng);
            self.send_request_start_view(None);
        } else if self.observed_newer_view > self.view {
            self.timers.request_start_view.backoff(&mut self.prng);
            self.send_request_start_view(Some(self.observed_newer_view));
        }
    }

    pub(super) fn on_view_change_status_timeout(&mut self) {
        if self.status == Status::ViewChange && self.recovering.is_none() {
            self.start_view_change(self.view.saturating_add(1));
        }
    }

    /// A restarted replica becomes quorum-visible once its journal reaches
    /// the head the primary reported after the restart.
    pub(super) fn check_barrier(&mut self) {
        let Some(recovery) = self.recovering else {
            return;
        };
        let Some(barrier) = recovery.barrier else {
            return;
        };
        if self.status == Status::Normal
            && self
                .journal
                .contiguous_to(self.commit_min)
                .max(self.commit_min)
                >= barrier
        {
            self.recovering = None;
            self.census = super::census::CensusBook::default();
            self.send_prepare_ok();
        }
    }
}

/// Whether `above` (op n + 1) follows `below` (op n) in a log: it names
/// `below` as its parent and was ordered after it.
fn chains(above: &PrepareHeader, below: &PrepareHeader) -> bool {
    above.parent == below.checksum && above.timestamp > below.timestamp
}
