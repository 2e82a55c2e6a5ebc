//! Whole-group restart: the census, as methods of [`Replica`].
//!
//! The restart rule (docs/consensus.md §4) keeps a restarted replica out of
//! every quorum until a `Normal` primary tells it the head. When every
//! replica of a group restarted at once (a power loss, a kill -9 of the
//! whole cluster) there is no such primary, and the rule alone waits for
//! ever. The census ends that wait without giving up the rule's promise.
//!
//! A replica still waiting for its first answer (`Recovering`, no barrier)
//! puts a *report* in every probe: its durable applied point (op and
//! identity) and log view; the frame carries its durable view. A waiting
//! replica that hears a report answers with its own (at most once per probe
//! interval per peer), so reports travel both ways.
//!
//! Once a waiting replica holds a report from **every** other replica of
//! the group, each heard within the freshness window, nobody in the group
//! remembers anything past its durable applied state: a replica that does
//! (a `Normal` one, or one that adopted a view since boot) sends no report.
//! Applied ops are committed, and committed history is one chain, so the
//! applied states are prefixes of one another and the longest one, `D`,
//! holds everything any replica still holds. The replica with that longest
//! state (among equals one that knows its identity, then the lowest index)
//! — and only it — starts a new view:
//! the lowest view above every reported view whose primary it is, with its
//! applied state as the whole log (head `D`, commit `D`). It answers every
//! report's incarnation with a StartView, so each peer adopts it under the
//! ordinary rule (barrier `D`) and catches up by repair or state transfer.
//!
//! **A member that never restarted.** A replica that created the group
//! after the others had moved it on (it lagged on the metadata plane), or
//! the one survivor of a view change whose other voters then restarted,
//! sends no report: it runs view changes alone (a `Normal` one times out
//! into them), and a census of the others would wait for it for ever.
//! Such a replica — in a view change, not transferring, no view waiting
//! to be persisted — that holds fresh reports from so many others that
//! the rest, itself included, cannot complete a view change, and holds
//! nothing (journaled or known committed) past both its applied state
//! and the longest applied state reported to it, starts waiting in place
//! ([`Replica::restart_in_place`]) and reports its applied state. The
//! census starts from the longest report, which then holds every
//! committed op this replica knows of; and no report changes while the
//! census counts, since a waiting replica applies nothing before it
//! adopts a view. Its vote could not have formed a view, so giving it up
//! costs nothing; while enough non-reporting replicas remain to form one,
//! it keeps it.
//!
//! What is lost: ops committed above `D` — durable on no replica. Every
//! replica computes the same candidate from the same reports (a waiting
//! replica's report does not change within a boot: it applies nothing
//! before it adopts a view), so two census views cannot start from
//! different states. Nothing waits on a replica that cannot report (down
//! for good): the census needs all `N`, because a missing replica may hold
//! a longer applied state, and starting without it could reuse op numbers
//! it applied (a fork). See docs/consensus.md §4, "Whole-group restart".

use super::io::Status;
use super::message::{Census, Message};
use super::replica::Replica;
use common::Op;

/// What one peer reported, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Heard {
    /// The peer's per-boot probe nonce (a StartView answer echoes it).
    incarnation: u128,
    /// The peer's durable view (the frame's view).
    view: u32,
    /// Its durable applied state.
    report: Census,
    /// This replica's tick when the report arrived.
    at_tick: u64,
}

/// The reports a waiting replica holds, one slot per replica index.
#[derive(Debug, Clone, Default)]
pub(super) struct CensusBook {
    heard: Vec<Option<Heard>>,
    /// Per peer, this replica's tick when it last answered a report.
    answered_at: Vec<Option<u64>>,
}

impl CensusBook {
    pub fn new(replica_count: u8) -> Self {
        Self {
            heard: vec![None; usize::from(replica_count)],
            answered_at: vec![None; usize::from(replica_count)],
        }
    }

    /// Peer `from` sent a frame only a replica that is not waiting sends:
    /// a report held from it no longer describes it. Dropped, not barred:
    /// a frame delayed from before the peer's reboot may arrive after its
    /// new report, and the peer's next probe carries the report again.
    pub(super) fn void(&mut self, from: u8) {
        if let Some(heard) = self.heard.get_mut(usize::from(from)) {
            *heard = None;
        }
    }
}

impl Replica {
    /// This replica entered a view as `Normal` (it started one, or adopted
    /// a StartView): every report it holds may be stale. Its view has a
    /// `Normal` primary, which answers each waiting peer's probe, so a
    /// reporter may adopt this view (and journal and acknowledge ops in
    /// it) without ever sending this replica a frame that voids its
    /// report. Kept, such a report let a member that later fell into a
    /// view change lead a census from it, below ops the reporter had
    /// since acknowledged, and drop ops a quorum had committed (mixed
    /// 33006971: the reporter had acknowledged op 74, the census started
    /// at 73). Reports heard from here on were sent in this view or later.
    pub(super) fn forget_census_reports(&mut self) {
        self.census = CensusBook::default();
    }

    /// Probes carry a report while the census may still be needed: this
    /// replica restarted and adopted no view yet.
    pub(super) fn census_report(&self) -> Option<Census> {
        if self.status != Status::Recovering {
            return None;
        }
        self.recovering
            .filter(|r| r.barrier.is_none())
            .map(|r| r.report)
    }

    /// Whether this replica's journal holds another op than `report`'s at
    /// its op: `None` when it cannot tell (no entry there, or the report's
    /// identity unknown), `Some(false)` when it holds the very op.
    fn journal_disagrees_with(&self, report: &Census) -> Option<bool> {
        if report.checksum == super::UNKNOWN_CHECKSUM {
            return None;
        }
        let header = self.journal.header(report.op.0)?;
        Some(header.checksum != report.checksum)
    }

    /// Each other replica's index and its report if one was heard within
    /// the freshness window, in index order.
    fn others_reports(&self) -> impl Iterator<Item = (u8, Option<Heard>)> + '_ {
        let window = self.census_window_ticks();
        let me = self.config.replica.0;
        self.census
            .heard
            .iter()
            .enumerate()
            .filter_map(move |(index, slot)| {
                let index = u8::try_from(index).ok().filter(|i| *i != me)?;
                let fresh = slot.filter(|h| self.ticks.saturating_sub(h.at_tick) <= window);
                Some((index, fresh))
            })
    }

    /// The reports a member that never restarted may count
    /// ([`Self::member_should_report`], [`Self::maybe_lead_census_as_member`]):
    /// fresh, and sent from this replica's view or a later one. A waiting
    /// replica leaves its waiting only by adopting a StartView of a view at
    /// least its own, and such a view's primary answers this replica's
    /// probe too (its view is at most that view), so no peer counted here
    /// can go where this replica, waiting in place, cannot follow. A report
    /// from an older view may be from a peer that since adopted an older
    /// view, whose primary ignores this replica's probes: counted as
    /// waiting, it took the third vote of five away for good (seeds
    /// 2016646, 2013461). Waiting replicas raise their view to a member's
    /// StartViewChange and answer it with their report
    /// ([`Self::answer_member_with_report`]), so the member hears reports
    /// of its view.
    fn member_reports(&self) -> impl Iterator<Item = (u8, Option<Heard>)> + '_ {
        let view = self.view;
        self.others_reports()
            .map(move |(index, heard)| (index, heard.filter(|h| h.view >= view)))
    }

    /// A waiting replica heard a StartViewChange of `view` from `from`, a
    /// member in a view change: it raises its own view to it (persisted
    /// before the answer leaves; it votes in no view, so the promise costs
    /// nothing but StartViews of older views, and a member counts only
    /// reports of its view or later, [`Self::member_reports`]) and answers
    /// with its report, at most once per probe interval per peer. A
    /// replica rejoining after a lost disk raises nothing: its view must be
    /// bounded by its peers' before it is persisted (§4, "Rejoin").
    pub(super) fn answer_member_with_report(&mut self, from: u8, view: u32) {
        if self.census_report().is_none() || self.recovering.is_some_and(|r| r.rejoin.is_some()) {
            return;
        }
        if view > self.view {
            self.view = view;
            self.persist();
        }
        if self.census.heard.len() != usize::from(self.config.replica_count) {
            self.census = CensusBook::new(self.config.replica_count);
        }
        let ticks = self.ticks;
        let interval = self.config.timeouts.request_start_view_message_ticks;
        let Some(at) = self.census.answered_at.get_mut(usize::from(from)) else {
            return;
        };
        if at.is_none_or(|at| ticks.saturating_sub(at) >= interval) {
            *at = Some(ticks);
            self.send_request_start_view_to(from);
        }
    }

    /// How long a report counts: longer than the longest probe interval
    /// (backoff caps at 16 times the base, plus as much jitter).
    fn census_window_ticks(&self) -> u64 {
        self.config
            .timeouts
            .request_start_view_message_ticks
            .max(1)
            .saturating_mul(34)
    }

    /// A peer's probe carried a report.
    pub(super) fn on_census_report(
        &mut self,
        from: u8,
        view: u32,
        incarnation: u128,
        report: Census,
    ) {
        if incarnation == 0 || report.log_view > view {
            return;
        }
        let waiting = self.census_report().is_some();
        if !waiting && !self.may_wait_in_place() {
            return;
        }
        if self.census.heard.len() != usize::from(self.config.replica_count) {
            self.census = CensusBook::new(self.config.replica_count);
        }
        let ticks = self.ticks;
        let Some(slot) = self.census.heard.get_mut(usize::from(from)) else {
            return;
        };
        *slot = Some(Heard {
            incarnation,
            view,
            report,
            at_tick: ticks,
        });
        if !waiting {
            if self.member_should_report() {
                self.restart_in_place();
            } else {
                self.maybe_lead_census_as_member();
                return;
            }
        }
        // Answer with ours, so the prober learns of us without waiting for
        // our next probe; once per probe interval per peer, so two waiting
        // replicas do not echo each other for ever.
        let interval = self.config.timeouts.request_start_view_message_ticks;
        let due = self
            .census
            .answered_at
            .get(usize::from(from))
            .copied()
            .flatten()
            .is_none_or(|at| ticks.saturating_sub(at) >= interval);
        if due {
            if let Some(at) = self.census.answered_at.get_mut(usize::from(from)) {
                *at = Some(ticks);
            }
            self.send_request_start_view_to(from);
        }
        self.maybe_start_census_view();
    }

    /// In a view change (a `Normal` replica has a view that works, or will
    /// time out into one), not transferring, and no view waiting to be
    /// persisted: such a replica may start waiting in place
    /// ([`Replica::restart_in_place`]) if what it holds is covered too
    /// (see [`Self::member_should_report`]).
    fn may_wait_in_place(&self) -> bool {
        self.status == Status::ViewChange
            && self.recovering.is_none()
            && !self.transferring
            && self.view == self.durable_view
            && self.log_view == self.durable_log_view
    }

    /// Whether a member in a view change that never restarted, having just
    /// heard a report, should start waiting and report too: the census
    /// waits for every member, and one that did not restart (it created
    /// the group after the others moved on, or it was the one survivor of
    /// a view change the restarted ones left behind) would otherwise never
    /// report. Two conditions. Nothing it holds may be lost: everything it
    /// journaled or knows committed past its applied state is at or below
    /// the longest applied state reported to it, which the census starts
    /// from (an op there that committed is in that state, committed
    /// history being one chain; one that did not may go). And its vote
    /// must be useless: the replicas it did not hear from recently, itself
    /// included, are too few to complete a view change. With enough of
    /// them left it keeps its vote, which a member that never restarted
    /// may need to form a view that answers the waiting ones.
    fn member_should_report(&self) -> bool {
        let fresh = self.member_reports().filter_map(|(_, heard)| heard);
        let (heard, longest) = fresh.fold((0usize, None::<Census>), |(n, longest), h| {
            let longer = longest.is_none_or(|l| h.report.op.0 > l.op.0);
            (n + 1, if longer { Some(h.report) } else { longest })
        });
        // Covered: nothing past what it applied, or nothing past the
        // longest report, or its entry at that report's op is another op
        // than the one the reporter applied (committed): then that entry
        // and every one chained above it never committed.
        let covered = self.head() == self.commit_min
            || longest.is_some_and(|l| {
                self.head() <= l.op.0 || self.journal_disagrees_with(&l) == Some(true)
            });
        covered
            && usize::from(self.config.replica_count).saturating_sub(heard)
                < self.quorums.view_change
    }

    /// A member in a view change that never restarted and holds more than
    /// any report (ops journaled past the longest applied state reported)
    /// cannot start waiting without dropping them, and the census waits
    /// for its report. When it holds a fresh report from every other
    /// replica and each reporter's applied state is a prefix of its log
    /// (applied here too, or its last op journaled here with the same
    /// identity: mixed 23000885), it leads instead: it starts the lowest view above every view it knows
    /// of whose primary it is, with its own log, as a view change would
    /// (mixed 21600101: a member with op 10 journaled, its peers waiting
    /// with 9 and 7 applied). Nobody else remembers anything past its
    /// reported applied state, each of which this member applied too, so
    /// its log holds every op that any replica still holds, and no
    /// committed op conflicts with the ops it journaled past them. Only it
    /// can start this view: the waiting replicas hold no report from it.
    fn maybe_lead_census_as_member(&mut self) {
        let mut highest_view = self.view.max(self.observed_newer_view);
        let mut answers = Vec::new();
        for (index, heard) in self.member_reports() {
            let Some(heard) = heard else {
                return;
            };
            // Its applied state must be a prefix of this log: applied here
            // too, or the same op (by identity) journaled here, the log's
            // entries being hash-chained down to what was applied.
            if heard.report.op.0 > self.commit_min
                && self.journal_disagrees_with(&heard.report) != Some(false)
            {
                return;
            }
            highest_view = highest_view.max(heard.view);
            answers.push((index, heard.incarnation));
        }
        let op_head = self.head();
        if ((self.commit_max + 1)..=op_head).any(|op| self.journal.entry(op).is_none()) {
            // A view starts only with every uncommitted body held.
            return;
        }
        let Some(view) = self.next_view_led_by_me(highest_view) else {
            return;
        };
        self.census_views_started += 1;
        self.view = view;
        self.census = CensusBook::default();
        self.observed_newer_view = 0;
        self.timers.request_start_view.stop();
        self.start_view(op_head);
        for (to, incarnation) in answers {
            let sv = self.start_view_message(incarnation);
            self.send(to, Message::StartView(sv));
        }
    }

    /// Starts the census view if every other replica reported recently and
    /// this one holds the longest applied state.
    pub(super) fn maybe_start_census_view(&mut self) {
        let Some(mine) = self.census_report() else {
            return;
        };
        // Give a live primary time to answer the boot probe first.
        let settle = self
            .config
            .timeouts
            .request_start_view_message_ticks
            .saturating_mul(2);
        if self.ticks < settle {
            return;
        }
        let me = self.config.replica.0;
        // Longest applied state first; among equals one whose identity is
        // known (a primary that cannot name its applied op's identity can
        // chain nothing to it and abdicates, and the group, with every
        // other member waiting or short of the census barrier, waited for
        // ever: blackout 21400232, whose candidate had applied op 16 by a
        // transfer that did not name it); then the lowest index. Every
        // replica ranks the same reports the same way.
        let rank = |report: &Census, index: u8| {
            (
                report.op.0,
                report.op.0 == 0 || report.checksum != super::UNKNOWN_CHECKSUM,
                std::cmp::Reverse(index),
            )
        };
        let mut best = (rank(&mine, me), me);
        let mut highest_view = self.view.max(self.observed_newer_view);
        // Decide first; this runs every tick of every recovering group,
        // and only the candidate needs the list of incarnations to answer.
        for (index, heard) in self.others_reports() {
            let Some(heard) = heard else {
                return;
            };
            highest_view = highest_view.max(heard.view);
            let ranked = rank(&heard.report, index);
            if ranked > best.0 {
                best = (ranked, index);
            }
        }
        if best.1 != me {
            return;
        }
        let Some(view) = self.next_view_led_by_me(highest_view) else {
            return;
        };
        // Every other slot was checked fresh above.
        let answers: Vec<(u8, u128)> = self
            .others_reports()
            .filter_map(|(index, heard)| Some((index, heard?.incarnation)))
            .collect();
        self.start_census_view(view);
        for (to, incarnation) in answers {
            let sv = self.start_view_message(incarnation);
            self.send(to, Message::StartView(sv));
        }
    }

    /// The lowest view above `above` whose primary is this replica.
    fn next_view_led_by_me(&self, above: u32) -> Option<u32> {
        let n = u32::from(self.config.replica_count);
        (1..=n)
            .filter_map(|step| above.checked_add(step))
            .filter(|v| *v <= super::io::VIEW_MAX)
            .find(|v| self.primary_of(*v) == self.config.replica.0)
    }

    /// Become the primary of `view` with the applied state as the log.
    fn start_census_view(&mut self, view: u32) {
        let before = self.head();
        self.journal
            .install_log(&[], self.commit_min, self.commit_min);
        if before > self.commit_min {
            self.effect(super::io::Effect::TruncateJournal {
                from_op: Op(self.commit_min + 1),
            });
        }
        self.census_views_started += 1;
        self.view = view;
        self.log_view = view;
        self.cut_head = 0;
        self.status = Status::Normal;
        self.recovering = None;
        self.census = CensusBook::default();
        self.observed_newer_view = 0;
        // Committed ops above the applied point were held by nobody; the
        // new view numbers its ops from here.
        self.commit_max = self.commit_min;
        self.view_start_op = self.commit_min;
        self.pipeline.clear();
        self.repair.session = None;
        self.repair.tried = 0;
        self.timers.request_start_view.stop();
        self.persist();
        self.enter_normal_timers();
        let sv = self.start_view_message(0);
        self.broadcast(Message::StartView(sv));
    }
}
