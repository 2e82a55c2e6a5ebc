//! The replica core: state, inputs, outputs, and normal operation.
//!
//! A [`Replica`] is one replica of one VSR group. It owns no clock, socket
//! or file: the driver feeds it frames ([`Replica::on_frame`]), ticks
//! ([`Replica::on_tick`]) and client requests
//! ([`Replica::on_client_request`]), then drains [`Action`]s with
//! [`Replica::take_actions`]: frames to send, replies to clients and
//! [`Effect`]s to carry out.
//!
//! Durability gate: whenever `view` or `log_view` changes the core emits
//! [`Effect::PersistState`] and withholds every frame to a replica until the
//! driver reports the write with [`Replica::on_persisted`]. Local progress
//! (journaling, applying) is never withheld, only what peers could act on:
//! a vote or an ack in a view the superblock does not yet hold could be
//! forgotten by a crash, and a replica that forgets a vote can vote twice.
//!
//! Normal operation (this file): the primary of view `v` for group `g` is
//! replica `(v + g) mod N`. It orders requests into prepares (at most 32 in
//! flight), journals each one itself and sends it to every backup (star
//! topology by default, or down a chain; see docs/consensus.md). A backup journals prepares in the
//! primary's order and answers a cumulative PrepareOk for the highest op up
//! to which its journal is contiguous. The primary commits an op once a
//! replication quorum holds it, applies it, replies to the client, and
//! advances backups by the `commit` carried in every prepare and in the
//! `Commit` heartbeat. View change lives in `view_change.rs`, repair and
//! state-transfer hooks in `repair.rs`.

use super::io::{
    Action, AppliedState, Config, DurableState, Effect, FrameError, Handled, Ignored,
    LoggedJournal, OP_MAX, REPLICAS_MAX, RequestOutcome, Status, Topology, VIEW_MAX,
};
use super::journal::{Inserted, Journal};
use super::merge::Quorums;
use super::message::{
    Frame, Message, OPERATION_REGISTER, Prepare, PrepareHeader, Reply, ReplyStatus, Request,
    body_checksum,
};
use super::pipeline::Pipeline;
use super::timeout::{Timeout, TimeoutConfig};
use crate::client_table::{ClientTable, RequestCheck};
use common::{GroupId, Op, Prng, ReplicaId};

/// A restarted replica's catch-up state (quorum-invisible while set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovery {
    /// Per-boot nonce a probe answer must echo.
    pub incarnation: u128,
    /// The primary's head when it answered: the replica may vote and ack
    /// only once its journal reaches it.
    pub barrier: Option<u64>,
    /// For a replica that lost its superblock (its disk was replaced): the
    /// views its peers' frames carried since boot (see [`RejoinBound`]).
    pub rejoin: Option<RejoinBound>,
    /// The census report of this boot, fixed when it began: what it
    /// applied and that op's identity as known then (learning the identity
    /// later must not change a report peers already ranked).
    pub report: super::message::Census,
}

/// Bit 127 of a RequestStartView's incarnation: the prober rejoins after a
/// lost disk and asks every `Normal` backup to report its view.
pub const REJOIN_PROBE: u128 = 1 << 127;

/// What a rejoining replica learned of its peers' views (see
/// [`Replica::restart_rejoining`]): per peer, the highest view its frames
/// carried since this boot (a replica's view is durable before it sends in
/// it and never goes down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RejoinBound {
    views: [Option<u32>; REPLICAS_MAX as usize],
}

impl Default for RejoinBound {
    fn default() -> Self {
        Self {
            views: [None; REPLICAS_MAX as usize],
        }
    }
}

impl RejoinBound {
    /// Records a frame from `from` in `view`.
    pub fn heard(&mut self, from: u8, view: u32) {
        if let Some(slot) = self.views.get_mut(usize::from(from)) {
            *slot = Some(slot.map_or(view, |v| v.max(view)));
        }
    }

    /// The lowest view this replica may join, once `quorum` peers were
    /// heard: the `quorum`-th lowest of their views. Every set of `quorum`
    /// peers holds a member of the quorum that formed the latest view this
    /// replica may have acknowledged in (so one view at least that one),
    /// and the lowest such set's highest view is this; a single peer's view
    /// raised by a view change that never formed does not hold it back.
    pub fn lowest_view(&self, quorum: usize) -> Option<u32> {
        let mut views: Vec<u32> = self.views.iter().flatten().copied().collect();
        if quorum == 0 || views.len() < quorum {
            return None;
        }
        views.sort_unstable();
        views.get(quorum - 1).copied()
    }
}

/// Refuse a frame whose numbers no real log reaches, before acting on any
/// of it.
fn check_ranges(view: u32, message: &Message) -> Result<(), FrameError> {
    if view > VIEW_MAX {
        return Err(FrameError::OutOfRange {
            value: u64::from(view),
        });
    }
    let mut values: Vec<u64> = Vec::new();
    match message {
        Message::Prepare(p) | Message::RepairPrepare(p) => {
            values.extend([p.header.op.0, p.header.commit.0]);
        }
        Message::PrepareOk { op, .. } | Message::RepairDone { op, .. } => values.push(op.0),
        Message::Commit { commit, .. } => values.push(commit.0),
        Message::DoViewChange(d) => values.extend([d.op.0, d.commit.0]),
        Message::StartView(sv) => values.extend([sv.op.0, sv.commit.0]),
        Message::RequestPrepares { from_op, to_op, .. } => values.extend([from_op.0, to_op.0]),
        Message::RangeEvicted { retained_from, .. } => values.push(retained_from.0),
        Message::StartViewChange
        | Message::RequestStartView { .. }
        | Message::Ping { .. }
        | Message::Pong { .. } => {}
    }
    match values.into_iter().find(|v| *v > OP_MAX) {
        Some(value) => Err(FrameError::OutOfRange { value }),
        None => Ok(()),
    }
}

/// The replica's timers.
#[derive(Debug, Clone)]
pub(super) struct Timers {
    pub prepare: Timeout,
    pub commit_message: Timeout,
    pub normal_heartbeat: Timeout,
    pub start_view_change: Timeout,
    pub do_view_change: Timeout,
    pub view_change_status: Timeout,
    pub request_start_view: Timeout,
    pub repair: Timeout,
    pub state_transfer: Timeout,
}

impl Timers {
    /// Every timer, in the order `on_tick` fires them.
    fn all(&self) -> [&Timeout; 9] {
        [
            &self.normal_heartbeat,
            &self.start_view_change,
            &self.do_view_change,
            &self.prepare,
            &self.commit_message,
            &self.request_start_view,
            &self.view_change_status,
            &self.repair,
            &self.state_transfer,
        ]
    }

    fn all_mut(&mut self) -> [&mut Timeout; 9] {
        [
            &mut self.normal_heartbeat,
            &mut self.start_view_change,
            &mut self.do_view_change,
            &mut self.prepare,
            &mut self.commit_message,
            &mut self.request_start_view,
            &mut self.view_change_status,
            &mut self.repair,
            &mut self.state_transfer,
        ]
    }

    fn new(t: &TimeoutConfig) -> Self {
        Self {
            prepare: Timeout::new(t.prepare_ticks),
            commit_message: Timeout::new(t.commit_message_ticks),
            normal_heartbeat: Timeout::new(t.normal_heartbeat_ticks),
            start_view_change: Timeout::new(t.start_view_change_message_ticks),
            do_view_change: Timeout::new(t.do_view_change_message_ticks),
            view_change_status: Timeout::new(t.view_change_status_ticks),
            request_start_view: Timeout::new(t.request_start_view_message_ticks),
            repair: Timeout::new(t.repair_ticks),
            state_transfer: Timeout::new(t.state_transfer_ticks),
        }
    }
}

/// An open repair session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RepairSession {
    pub nonce: u128,
    pub peer: u8,
    pub from_op: u64,
    pub to_op: u64,
    /// `repaired_total` when the session opened (progress detection).
    pub mark: u64,
}

/// One replica of one VSR group.
#[derive(Debug, Clone)]
pub struct Replica {
    pub(super) config: Config,
    pub(super) quorums: Quorums,
    pub(super) status: Status,
    pub(super) view: u32,
    pub(super) log_view: u32,
    pub(super) durable_view: u32,
    pub(super) durable_log_view: u32,
    pub(super) commit_min: u64,
    pub(super) commit_min_checksum: u128,
    pub(super) commit_max: u64,
    /// The highest op this replica sent a PrepareOk for (since boot: the
    /// journal is memory-only, so nothing from before a restart is held).
    pub(super) acknowledged_max: u64,
    /// The head of the log this replica started its current view with as
    /// primary: ops up to it may have been committed (and acknowledged to
    /// clients) by an earlier primary, so nothing is served as the current
    /// state until they are committed again here.
    pub(super) view_start_op: u64,
    /// The head of this replica's log before a state-transfer install cut
    /// the suffix above the installed op, in its current log view (0 when
    /// none was cut). The cut ops belonged to that view's log, which a
    /// DoViewChange reports: a vote must not present the log as ending
    /// below them (see `build_do_view_change`). Cleared with a new log.
    pub(super) cut_head: u64,
    /// The highest op whose body the replica log held when this replica
    /// resumed from it (0 otherwise). The log may lack ops below it that
    /// the replica applied in the step it received them (never logged
    /// above the applied point), so the journal's contiguous frontier no
    /// longer shows what it acknowledged: a vote must not nack ops up to
    /// here (blackout seed 75100955: a resumed backup nacked the op it had
    /// acknowledged, and an op the old primary committed was truncated).
    pub(super) resumed_head: u64,
    pub(super) journal: Journal,
    pub(super) pipeline: Pipeline,
    pub(super) client_table: ClientTable,
    pub(super) prng: Prng,
    pub(super) timers: Timers,
    pub(super) ticks: u64,
    pub(super) last_timestamp: u64,
    pub(super) heartbeat_counter: u64,
    pub(super) heartbeat_seen: u64,
    /// Heartbeats this primary sent while it could not propose: the
    /// identity of `commit_min` unknown and nothing in its log naming it.
    pub(super) identity_unknown_heartbeats: u64,
    /// The votes of the view change in progress (view_change.rs).
    pub(super) votes: super::view_change::Votes,
    pub(super) recovering: Option<Recovery>,
    pub(super) observed_newer_view: u32,
    /// The newest view a normal-heartbeat timeout asked about instead of
    /// electing: asked once, it is not asked about again, so a peer that
    /// keeps sending from a view that never formed (a restarted replica
    /// probing from the view change it crashed in) cannot hold off an
    /// election for ever.
    pub(super) asked_newer_view: u32,
    /// Journal repair: the session, its buffer and what peers said
    /// (repair.rs).
    pub(super) repair: super::repair::RepairState,
    pub(super) nonce_counter: u64,
    pub(super) transferring: bool,
    pub(super) census: super::census::CensusBook,
    pub(super) census_views_started: u64,
    /// Times this replica started waiting in place (`restart_in_place`).
    pub(super) restarts_in_place: u64,
    /// Frames from peers that changed nothing, per [`Ignored`] reason.
    frames_ignored: [u64; Ignored::ALL.len()],
    pub(super) read_checks: super::read_check::ReadChecks,
    held: Vec<(u8, Frame)>,
    actions: Vec<Action>,
}

impl Replica {
    fn blank(config: Config, durable: DurableState, applied: AppliedState) -> Self {
        assert!(
            config.replica_count >= 1 && config.replica_count <= REPLICAS_MAX,
            "replica_count out of range"
        );
        assert!(
            config.replica.0 < config.replica_count,
            "replica index out of range"
        );
        assert!(durable.log_view <= durable.view, "log_view ahead of view");
        let seed = config.seed
            ^ config.group.0.rotate_left(17)
            ^ u64::from(config.replica.0).wrapping_mul(0x9E37_79B9);
        Self {
            quorums: Quorums::new(config.replica_count),
            status: Status::Normal,
            view: durable.view,
            log_view: durable.log_view,
            durable_view: durable.view,
            durable_log_view: durable.log_view,
            commit_min: applied.commit_min.0,
            commit_min_checksum: applied.checksum,
            acknowledged_max: 0,
            view_start_op: 0,
            cut_head: 0,
            resumed_head: 0,
            commit_max: durable.commit.max(applied.commit_min).0,
            journal: Journal::new(applied.commit_min.0.saturating_add(1)),
            pipeline: Pipeline::new(),
            client_table: ClientTable::new(config.clients_max),
            prng: Prng::new(seed),
            timers: Timers::new(&config.timeouts),
            ticks: 0,
            last_timestamp: 0,
            heartbeat_counter: 0,
            heartbeat_seen: 0,
            identity_unknown_heartbeats: 0,
            votes: super::view_change::Votes::new(config.replica_count),
            recovering: None,
            observed_newer_view: 0,
            asked_newer_view: 0,
            repair: super::repair::RepairState::default(),
            nonce_counter: 0,
            transferring: false,
            census: super::census::CensusBook::default(),
            census_views_started: 0,
            restarts_in_place: 0,
            frames_ignored: [0; Ignored::ALL.len()],
            read_checks: super::read_check::ReadChecks::default(),
            held: Vec::new(),
            actions: Vec::new(),
            config,
        }
    }

    /// A replica of a freshly formatted group: view 0, empty log, normal.
    pub fn new(config: Config) -> Self {
        let mut r = Self::blank(config, DurableState::default(), AppliedState::default());
        r.enter_normal_timers();
        r
    }

    /// A replica restarting with its superblock and applied state but an
    /// empty journal. With peers it comes back quorum-invisible: it probes
    /// for the current view and neither votes nor acknowledges until its
    /// journal reaches the head the primary reports (docs/consensus.md,
    /// "Restart rule"). A single replica has nobody to forget for, so it
    /// resumes at once.
    pub fn restart(config: Config, durable: DurableState, applied: AppliedState) -> Self {
        Self::restart_probing(config, durable, applied, false)
    }

    fn restart_probing(
        config: Config,
        durable: DurableState,
        applied: AppliedState,
        rejoin: bool,
    ) -> Self {
        let mut r = Self::blank(config, durable, applied);
        if config.replica_count == 1 {
            r.log_view = r.view;
            r.enter_normal_timers();
            if r.log_view != r.durable_log_view {
                r.persist();
            }
            return r;
        }
        r.census = super::census::CensusBook::new(config.replica_count);
        r.begin_probing(rejoin);
        r
    }

    /// Quorum-invisible from here: draw this boot's incarnation and probe
    /// everyone for the current view.
    fn begin_probing(&mut self, rejoin: bool) {
        let drawn = (u128::from(self.prng.next_u64()) << 64 | u128::from(self.prng.next_u64())) | 1;
        // The top bit tells the peers whether to report their views.
        let incarnation = if rejoin {
            drawn | REJOIN_PROBE
        } else {
            drawn & !REJOIN_PROBE
        };
        self.status = Status::Recovering;
        // The durable commit bound may name ops of a history a whole-group
        // restart then replaced (census.rs); the primary's answer says
        // what is committed.
        self.commit_max = self.commit_min;
        self.recovering = Some(Recovery {
            incarnation,
            barrier: None,
            rejoin: rejoin.then(RejoinBound::default),
            report: super::message::Census {
                log_view: self.log_view,
                op: Op(self.commit_min),
                checksum: self.commit_min_checksum,
            },
        });
        self.timers.request_start_view.start();
        self.send_request_start_view(None);
    }

    /// Starts waiting for a view as a restarted replica does
    /// ([`Replica::restart`]), in place and keeping its applied state: the
    /// durable view and log view, the applied op and identity, a fresh
    /// incarnation. Only sound when nothing was acknowledged past the
    /// applied state and no view is waiting to be persisted (the caller
    /// checks; census.rs, "A member that never restarted"). The driver's
    /// queue, the PRNG, the tick count, the client table and the census
    /// reports heard carry over.
    pub(super) fn restart_in_place(&mut self) {
        let durable = DurableState {
            view: self.durable_view,
            log_view: self.durable_log_view,
            commit: Op(self.commit_max),
        };
        let applied = AppliedState {
            commit_min: Op(self.commit_min),
            checksum: self.commit_min_checksum,
        };
        let mut fresh = Self::blank(self.config, durable, applied);
        fresh.prng = self.prng.clone();
        fresh.ticks = self.ticks;
        fresh.last_timestamp = self.last_timestamp;
        fresh.observed_newer_view = self.observed_newer_view;
        fresh.census_views_started = self.census_views_started;
        fresh.restarts_in_place = self.restarts_in_place + 1;
        fresh.frames_ignored = self.frames_ignored;
        fresh.client_table = std::mem::replace(
            &mut self.client_table,
            ClientTable::new(self.config.clients_max),
        );
        fresh.census = std::mem::take(&mut self.census);
        fresh.actions = std::mem::take(&mut self.actions);
        *self = fresh;
        self.begin_probing(false);
    }

    /// A replica whose disk was replaced: nothing durable, and possibly
    /// acknowledgements from an earlier life in views it cannot name. It
    /// restarts as [`Replica::restart`] does from the zero state, and in
    /// addition learns a lower bound for its view from its peers before it
    /// adopts any: every frame a peer sends carries the peer's view
    /// (durable before the send), a `Normal` backup answers its probe with
    /// a probe of its own (a view report), and it adopts a StartView only
    /// once `f + 1` peers were heard and only of a view at least the
    /// highest they reported. Any `f + 1` of the others meet the quorum
    /// that formed the latest view this replica may have acknowledged in,
    /// so a primary left behind in an older view cannot take it in
    /// (docs/consensus.md §4, "Rejoin after a lost disk").
    /// Its `durable` state names no view it adopted (a caller that knows
    /// one bounds the view by it and calls [`Replica::restart`]).
    pub fn restart_rejoining(config: Config, durable: DurableState, applied: AppliedState) -> Self {
        Self::restart_probing(config, durable, applied, true)
    }

    /// Frames from peers that changed nothing here for `reason`, since
    /// this replica was made (a restart in place keeps the counts).
    pub fn frames_ignored(&self, reason: Ignored) -> u64 {
        self.frames_ignored[reason.index()]
    }

    /// Counts a frame the driver above the core chose not to hand it
    /// (see [`Ignored::HistoryMissing`]).
    pub fn count_ignored(&mut self, reason: Ignored) {
        self.frames_ignored[reason.index()] += 1;
    }

    /// How many times this replica started a view by census after every
    /// replica of its group restarted (docs/consensus.md §4).
    pub fn census_views_started(&self) -> u64 {
        self.census_views_started
    }

    /// How many times this replica gave up its vote and started waiting in
    /// place, as a restarted replica does (docs/consensus.md §4, "A member
    /// that never restarted"). Each begins a new life for what must not go
    /// back within one: `commit_max` falls to the applied op, as it does
    /// after a restart.
    pub fn restarts_in_place(&self) -> u64 {
        self.restarts_in_place
    }

    /// Whether this replica is still learning its peers' views after a
    /// disk replacement.
    pub fn is_rejoining(&self) -> bool {
        self.recovering.is_some_and(|r| r.rejoin.is_some())
    }

    /// A replica that stopped cleanly: `Normal` in its durable view, whose
    /// log it had installed, with nothing acknowledged past its applied
    /// state (its log head was its applied op when it stopped). It has
    /// forgotten nothing, so unlike [`Replica::restart`] it votes and
    /// acknowledges at once, like a replica that was only cut off. The
    /// caller vouches for the clean stop (a record written after the last
    /// send of the previous boot and removed durably before this one's
    /// first); with `durable.log_view != durable.view` this is
    /// [`Replica::restart`].
    pub fn resume(config: Config, durable: DurableState, applied: AppliedState) -> Self {
        if durable.log_view != durable.view || applied.commit_min < durable.commit {
            return Self::restart(config, durable, applied);
        }
        let mut r = Self::blank(config, durable, applied);
        r.log_view = r.view;
        r.enter_normal_timers();
        r
    }

    /// A replica whose journal survived its restart in a durable log
    /// synced before every frame that vouched for it (a `persisted`
    /// group's prepare log). It has forgotten nothing it acknowledged, so
    /// unlike [`Replica::restart`] it votes at once, like a replica that
    /// was only cut off: `Normal` as a backup of its view when it had
    /// installed that view's log; otherwise (a primary, whose pipeline is
    /// gone, or one caught in a view change) it starts a view change, in
    /// its view when it had not installed that view's log and past it
    /// when it was that view's primary. The log's view and log view raise
    /// the superblock's (the log is synced first) and are persisted before
    /// any send, and the log's commit point and cut head are restored. A
    /// log written while the replica was invisible, one that does not
    /// refill the journal (an op out of order, a broken chain), or one
    /// with ops above an applied op whose identity is unknown gives
    /// [`Replica::restart`]; so does a single replica, which committed
    /// nothing past what it applied (docs/consensus.md §4, "Resume from a
    /// durable journal").
    pub fn resume_with_log(
        config: Config,
        durable: DurableState,
        applied: AppliedState,
        log: &LoggedJournal,
    ) -> Self {
        let view = durable.view.max(log.view);
        let log_view = durable.log_view.max(log.log_view);
        // Ops above an applied op whose identity is unknown (a transfer
        // installed without it) cannot be shown to continue its history.
        let unverifiable = applied.checksum == 0 && applied.commit_min.0 > 0 && !log.ops.is_empty();
        if config.replica_count == 1 || !log.visible || log_view > view || unverifiable {
            return Self::restart(config, durable, applied);
        }
        let mut r = Self::blank(config, durable, applied);
        r.commit_max = r.commit_max.max(log.commit.0);
        r.cut_head = log.cut_head.0;
        if r.journal
            .restore(&log.ops, applied.commit_min.0, applied.checksum)
            .is_err()
        {
            return Self::restart(config, durable, applied);
        }
        let headers: Vec<PrepareHeader> = log.ops.iter().map(|(h, _)| *h).collect();
        r.learn_timestamps(&headers);
        r.resumed_head = log
            .ops
            .iter()
            .filter(|(_, body)| body.is_some())
            .map(|(h, _)| h.op.0)
            .max()
            .unwrap_or(0);
        r.acknowledged_max = r.journal.contiguous_to(r.commit_min);
        r.view = view;
        r.log_view = log_view;
        if log_view < view {
            r.start_view_change(view);
        } else if r.primary_of(view) == config.replica.0 {
            r.start_view_change(view.saturating_add(1));
        } else {
            if (view, log_view) != (durable.view, durable.log_view) {
                r.persist();
            }
            // No commit walk here: the driver sets up its applied state
            // from this replica's `commit_min` before it carries out any
            // effect, and the next heartbeat or commit walks the log.
            r.enter_normal_timers();
        }
        r
    }

    /// This replica's journal as a durable log must hold it (see
    /// [`LoggedJournal`]): the driver of a group whose journal is durable
    /// writes it, synced, before it sends the frames of the step.
    pub fn logged_journal(&self) -> LoggedJournal {
        LoggedJournal {
            view: self.view,
            log_view: self.log_view,
            commit: Op(self.commit_max),
            cut_head: Op(self.cut_head),
            visible: self.recovering.is_none(),
            ops: self.journal.unapplied(self.commit_min),
        }
    }

    // ----- accessors -------------------------------------------------------

    /// This replica's index.
    pub fn replica(&self) -> ReplicaId {
        self.config.replica
    }

    /// Replicas in the group.
    pub fn replica_count(&self) -> u8 {
        self.config.replica_count
    }

    /// The group.
    pub fn group(&self) -> GroupId {
        self.config.group
    }

    /// The current view.
    pub fn view(&self) -> u32 {
        self.view
    }

    /// The latest view in which this replica installed a log.
    pub fn log_view(&self) -> u32 {
        self.log_view
    }

    /// The view this replica is known to be current in: its view while it
    /// is `Normal` in it, else the last view whose log it installed. A
    /// replica that keeps timing out into views no peer joined (one that
    /// waits for a state transfer, and is not heard) has a high `view`
    /// that says nothing about how current a peer's offer is.
    pub fn established_view(&self) -> u32 {
        if self.status == Status::Normal {
            self.view
        } else {
            self.log_view
        }
    }

    /// The protocol status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Highest op applied locally.
    pub fn commit_min(&self) -> Op {
        Op(self.commit_min)
    }

    /// Identity of op `commit_min`.
    pub fn commit_min_checksum(&self) -> u128 {
        self.commit_min_checksum
    }

    /// Highest op known committed in the group.
    pub fn commit_max(&self) -> Op {
        Op(self.commit_max)
    }

    /// The head of the log (the sequencer).
    pub fn op(&self) -> Op {
        Op(self.head())
    }

    /// [`Self::op`] as the core's own arithmetic uses it.
    pub(super) fn head(&self) -> u64 {
        self.journal.head(self.commit_min).max(self.commit_max)
    }

    /// The primary of `view` for this group: `(view + group) mod N`.
    pub fn primary_index(&self, view: u32) -> ReplicaId {
        ReplicaId(self.primary_of(view))
    }

    /// [`Self::primary_index`] as the core's own indexing uses it.
    pub(super) fn primary_of(&self, view: u32) -> u8 {
        let n = u64::from(self.config.replica_count);
        let p = (u64::from(view) + self.config.group.0 % n) % n;
        u8::try_from(p).unwrap_or(0)
    }

    /// Whether this replica is the primary of its view and serving it.
    pub fn is_primary(&self) -> bool {
        self.status == Status::Normal
            && self.recovering.is_none()
            && self.primary_of(self.view) == self.config.replica.0
    }

    /// A primary that may admit requests and serve state transfer: normal,
    /// not transferring, everything known committed is applied, and the log
    /// it started its view with is committed again.
    pub fn is_caught_up_primary(&self) -> bool {
        self.is_primary()
            && !self.transferring
            && self.commit_min == self.commit_max
            && self.commit_min >= self.view_start_op
    }

    /// A primary whose applied state is everything it knows committed, not
    /// transferring itself: it may serve a state transfer of that state.
    /// Unlike [`Self::is_caught_up_primary`] the log it started its view
    /// with need not be committed again: its applied state is committed
    /// whatever happens to those ops, and the backups that would commit
    /// them again may be the very ones waiting for this transfer (they
    /// lack ops no peer retains). Requiring it deadlocked a group whose
    /// primary started its view with two uncommitted ops while both backups
    /// needed a transfer (wipe 21300034 with retention and purges).
    pub fn serves_applied_state(&self) -> bool {
        self.is_primary() && !self.transferring && self.commit_min == self.commit_max
    }

    /// A replica other than `requester`, quorum-visible, not transferring,
    /// with everything it knows committed applied, that may serve it a
    /// state transfer without being a primary: as a `Normal` backup to its
    /// view's primary (nobody else can serve a primary missing ops no peer
    /// retains), or as a member of a view change to anyone (no primary
    /// exists while no view forms, and the requester may be the vote the
    /// view change needs: mixed 22008104). The rule of both planes.
    pub fn serves_transfer_as_non_primary(&self, requester: ReplicaId) -> bool {
        let settled = requester != self.config.replica
            && self.is_quorum_visible()
            && !self.transferring
            && self.commit_min == self.commit_max;
        let backup_to_its_primary =
            self.status == Status::Normal && self.primary_of(self.view) == requester.0;
        settled && (backup_to_its_primary || self.status == Status::ViewChange)
    }

    /// Whether this replica may vote and acknowledge (false while a
    /// restarted replica catches up).
    pub fn is_quorum_visible(&self) -> bool {
        self.recovering.is_none()
    }

    /// The highest op this replica acknowledged with a PrepareOk since it
    /// booted. A state-transfer install must not land below it: the ack
    /// may be part of the quorum that committed that op, and the install
    /// erases the journal above its op.
    pub fn acknowledged_max(&self) -> Op {
        Op(self.acknowledged_max)
    }

    /// Whether a state transfer is outstanding.
    pub fn is_transferring(&self) -> bool {
        self.transferring
    }

    /// Whether a repair session (fetching missing headers or prepares from
    /// a peer) is open.
    pub fn is_repairing(&self) -> bool {
        self.repair.session.is_some()
    }

    /// The superblock state this replica needs durable now.
    pub fn durable_state(&self) -> DurableState {
        DurableState {
            view: self.view,
            log_view: self.log_view,
            commit: Op(self.commit_max),
        }
    }

    /// The client table (replicated state, updated at apply).
    pub fn client_table(&self) -> &ClientTable {
        &self.client_table
    }

    /// The client table, for a state-transfer install.
    pub fn client_table_mut(&mut self) -> &mut ClientTable {
        &mut self.client_table
    }

    /// Prepares in the primary's pipeline.
    pub fn pipeline_len(&self) -> usize {
        self.pipeline.len()
    }

    /// The prepare at `op` if this replica's journal holds its body.
    pub fn journal_entry(&self, op: Op) -> Option<&Prepare> {
        self.journal.entry(op.0)
    }

    /// The header at `op` if this replica's journal still knows it (with
    /// its body, as a canonical header, or spilled after apply).
    pub fn journal_header(&self, op: Op) -> Option<&PrepareHeader> {
        self.journal.header(op.0)
    }

    /// The newest op this replica's journal knows (retained applied ops
    /// and the log above them) whose request carried `request_checksum`
    /// (nonzero), with the driver's locator when its body was spilled.
    /// A producer's replay of a send it may already have made is looked
    /// up here before it is ordered again.
    pub fn find_request_checksum(&self, request_checksum: u128) -> Option<(Op, Option<u64>)> {
        self.journal
            .find_request_checksum(request_checksum)
            .map(|(op, locator)| (Op(op), locator))
    }

    /// Lets go of the body of applied op `op`, which the driver can read
    /// back at `locator` when a peer's repair needs it
    /// ([`Effect::ReadBack`]). Returns the body's length, or `None` when no
    /// applied body is held at `op` (pruned, spilled already, or above the
    /// applied point).
    pub fn spill_applied(&mut self, op: Op, locator: u64) -> Option<u32> {
        self.journal.spill(op.0, locator, self.commit_min)
    }

    /// The oldest op this replica still serves to a peer's repair.
    pub fn retained_from(&self) -> Op {
        Op(self.journal.retained_from())
    }

    /// Everything produced since the last call, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    // ----- outputs ---------------------------------------------------------

    pub(super) fn effect(&mut self, effect: Effect) {
        self.actions.push(Action::Effect(effect));
    }

    /// Queue a frame to `to`, held back while `(view, log_view)` is not
    /// durable.
    pub(super) fn send(&mut self, to: u8, message: Message) {
        if to == self.config.replica.0 {
            return;
        }
        let frame = Frame {
            group: self.config.group,
            replica: self.config.replica,
            view: self.view,
            message,
        };
        if self.view != self.durable_view || self.log_view != self.durable_log_view {
            self.held.push((to, frame));
        } else {
            self.actions.push(Action::Send {
                to: ReplicaId(to),
                frame,
            });
        }
    }

    pub(super) fn broadcast(&mut self, message: Message) {
        for to in 0..self.config.replica_count {
            if to != self.config.replica.0 {
                self.send(to, message.clone());
            }
        }
    }

    /// Ask the driver to persist the current `(view, log_view)`.
    pub(super) fn persist(&mut self) {
        self.effect(Effect::PersistState {
            view: self.view,
            log_view: self.log_view,
            commit: Op(self.commit_max),
        });
    }

    /// The driver wrote `(view, log_view)` to the superblock. Frames held
    /// for exactly that state are released; frames of an older view are
    /// dropped (they are stale, and their sends were never promised).
    pub fn on_persisted(&mut self, view: u32, log_view: u32) {
        if (view, log_view) <= (self.durable_view, self.durable_log_view) {
            return;
        }
        self.durable_view = view;
        self.durable_log_view = log_view;
        if self.view == view && self.log_view == log_view {
            let held = std::mem::take(&mut self.held);
            for (to, frame) in held {
                if frame.view == view {
                    self.actions.push(Action::Send {
                        to: ReplicaId(to),
                        frame,
                    });
                }
            }
        }
    }

    // ----- inputs ----------------------------------------------------------

    /// Handle one decoded frame from a peer.
    pub fn on_frame(&mut self, frame: Frame) -> Result<Handled, FrameError> {
        if frame.group != self.config.group {
            return Err(FrameError::WrongGroup { group: frame.group });
        }
        let from = frame.replica.0;
        if from >= self.config.replica_count || from == self.config.replica.0 {
            return Err(FrameError::BadSender {
                replica: ReplicaId(from),
            });
        }
        check_ranges(frame.view, &frame.message)?;
        let view = frame.view;
        if let Some(bound) = self.recovering.as_mut().and_then(|r| r.rejoin.as_mut()) {
            bound.heard(from, view);
        }
        // A replica that is waiting for the census sends nothing but its
        // probes, each with its report, and answers to repair: any of these
        // frames shows that its sender stopped waiting, so a report held
        // from it is stale. A repair request counts: a waiting replica has
        // no repair target (`Recovering`), while one that adopted a view
        // asks for the ops below its barrier at once, often the only frame
        // a member hears from it before it votes elsewhere (seed 1007353:
        // a member counted such a reporter as waiting, gave up its vote
        // and left two voters of five).
        let stops_waiting = match &frame.message {
            Message::Prepare(_)
            | Message::PrepareOk { .. }
            | Message::Commit { .. }
            | Message::StartViewChange
            | Message::DoViewChange(_)
            | Message::StartView(_)
            | Message::RequestPrepares { .. }
            | Message::Ping { .. }
            | Message::Pong { .. } => true,
            Message::RequestStartView { census, .. } => census.is_none(),
            _ => false,
        };
        if stops_waiting {
            self.census.void(from);
        }
        let handled = match frame.message {
            Message::Prepare(p) => self.on_prepare(from, view, p)?,
            Message::PrepareOk {
                op,
                prepare_checksum,
            } => self.on_prepare_ok(from, view, op.0, prepare_checksum),
            Message::Commit {
                commit,
                commit_checksum,
                timestamp_monotonic,
            } => self.on_commit(from, view, commit.0, commit_checksum, timestamp_monotonic),
            Message::StartViewChange => self.on_start_view_change(from, view),
            Message::DoViewChange(dvc) => self.on_do_view_change(from, view, dvc)?,
            Message::StartView(sv) => self.on_start_view(from, view, sv)?,
            Message::RequestStartView {
                incarnation,
                census,
            } => {
                let reported = census.is_some();
                if let Some(report) = census {
                    self.on_census_report(from, view, incarnation, report);
                }
                let answered = self.on_request_start_view(from, view, incarnation);
                // A report is always taken (it is recorded or voids an
                // older one), whatever the probe itself did.
                if reported { Handled::Taken } else { answered }
            }
            Message::RequestPrepares {
                nonce,
                from_op,
                to_op,
            } => self.on_request_prepares(from, nonce, from_op.0, to_op.0)?,
            Message::RepairPrepare(p) => self.on_repair_prepare(p)?,
            Message::RepairDone { nonce, op } => self.on_repair_done(from, nonce, op.0),
            Message::RangeEvicted {
                nonce,
                retained_from,
            } => self.on_range_evicted(from, nonce, retained_from.0),
            Message::Ping { round } => self.on_ping(from, view, round),
            Message::Pong { round } => self.on_pong(from, view, round),
        };
        if let Handled::Ignored(reason) = handled {
            self.count_ignored(reason);
        }
        Ok(handled)
    }

    /// Count one tick: fire due timers, in a fixed order.
    pub fn on_tick(&mut self) {
        self.ticks += 1;
        let t = &mut self.timers;
        let heartbeat = t.normal_heartbeat.tick();
        let svc = t.start_view_change.tick();
        let dvc = t.do_view_change.tick();
        let prepare = t.prepare.tick();
        let commit = t.commit_message.tick();
        let rsv = t.request_start_view.tick();
        let status = t.view_change_status.tick();
        let repair = t.repair.tick();
        let transfer = t.state_transfer.tick();
        if heartbeat {
            self.on_normal_heartbeat_timeout();
        }
        if svc {
            self.on_start_view_change_timeout();
        }
        if dvc {
            self.on_do_view_change_timeout();
        }
        if prepare {
            self.on_prepare_timeout();
        }
        if commit {
            self.on_commit_message_timeout();
        }
        if rsv {
            self.on_request_start_view_timeout();
        }
        if status {
            self.on_view_change_status_timeout();
        }
        if repair {
            self.on_repair_timeout();
        }
        if transfer {
            self.on_state_transfer_timeout();
        }
        if self.status == Status::Recovering {
            self.maybe_start_census_view();
        }
        self.on_read_check_tick();
    }

    /// How many ticks from now the next one that does anything is: the
    /// `k`-th next [`Self::on_tick`] may fire a timer (or must run, as
    /// every tick of a recovering replica or of an outstanding read check
    /// does); the `k − 1` before it would only count. `u64::MAX` when no
    /// timer is armed. A driver with many quiet groups ticks each one only
    /// when it is due and counts the rest with [`Self::skip_ticks`], which
    /// leaves the replica exactly as ticking it would have.
    pub fn ticks_until_due(&self) -> u64 {
        if self.status == Status::Recovering {
            return 1;
        }
        let timers = self
            .timers
            .all()
            .into_iter()
            .filter_map(Timeout::fires_in)
            .min()
            .unwrap_or(u64::MAX);
        timers.min(self.read_check_due_in()).max(1)
    }

    /// Counts `n` ticks in which nothing is due (`n` below
    /// [`Self::ticks_until_due`]), as `n` calls of [`Self::on_tick`]
    /// would. Inputs (frames, requests, persists) must not arrive between
    /// the ticks counted: the driver catches a quiet replica up before it
    /// hands it anything.
    pub fn skip_ticks(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        debug_assert!(n < self.ticks_until_due(), "skipping past a due tick");
        self.ticks = self.ticks.saturating_add(n);
        for timer in self.timers.all_mut() {
            timer.skip(n);
        }
        self.skip_read_check_ticks(n);
    }

    /// A client request routed to this group.
    pub fn on_client_request(&mut self, request: Request) -> RequestOutcome {
        let op = match self.admit(&request) {
            Ok(op) => op,
            Err(outcome) => return outcome,
        };
        let mut header = self.next_prepare_header(&request, op);
        header.checksum = header.compute_checksum();
        let prepare = Prepare {
            header,
            body: request.body,
        };
        let inserted = self
            .journal
            .insert_authoritative(prepare.clone(), self.commit_min);
        assert_eq!(inserted, Inserted::New, "the primary's next op is new");
        self.effect(Effect::Journal {
            prepare: prepare.clone(),
        });
        self.pipeline.push(header, 1u32 << self.config.replica.0);
        match self.config.topology {
            Topology::Star => self.broadcast(Message::Prepare(prepare)),
            Topology::Chain => {
                let next = self.ring_successor();
                self.send(next, Message::Prepare(prepare));
            }
        }
        if !self.timers.prepare.running() {
            self.timers.prepare.start();
        }
        self.try_commit();
        RequestOutcome::Prepared { op: Op(op) }
    }

    /// Whether this primary orders `request` now: the op it would get, or
    /// the outcome that answers it instead (refusals reply to the client).
    fn admit(&mut self, request: &Request) -> Result<u64, RequestOutcome> {
        if request.client == crate::client_table::CLIENT_RESERVED {
            return Err(RequestOutcome::ReservedClient);
        }
        if !self.is_caught_up_primary() {
            return Err(RequestOutcome::Unavailable);
        }
        if self
            .pipeline
            .contains_request(request.client, request.request)
        {
            return Err(RequestOutcome::InFlight);
        }
        let register = request.operation == OPERATION_REGISTER;
        if register && (request.request != 0 || request.session != 0) {
            return Err(self.refuse(request, ReplyStatus::NoSession));
        }
        if !register && request.request == 0 {
            return Err(self.refuse(request, ReplyStatus::NoSession));
        }
        match self
            .client_table
            .check(request.client, request.session, request.request)
        {
            RequestCheck::New => {}
            RequestCheck::Duplicate(reply) => {
                self.actions.push(Action::Reply(reply));
                return Err(RequestOutcome::Answered);
            }
            RequestCheck::AlreadyApplied => {
                return Err(self.refuse(request, ReplyStatus::AlreadyApplied));
            }
            RequestCheck::NoSession => return Err(self.refuse(request, ReplyStatus::NoSession)),
            RequestCheck::Fenced => return Err(self.refuse(request, ReplyStatus::Fenced)),
        }
        if self.pipeline.is_full() {
            return Err(RequestOutcome::Unavailable);
        }
        let op = self.head() + 1;
        if op == self.commit_min + 1 && !self.commit_min_checksum_known() {
            // Chaining to an unknown identity would fork the hash chain;
            // the client retries once the log or a peer has named it.
            return Err(RequestOutcome::Unavailable);
        }
        Ok(op)
    }

    /// The header of the prepare that orders `request` as `op`, its
    /// checksum not yet computed; advances the prepare clock.
    fn next_prepare_header(&mut self, request: &Request, op: u64) -> PrepareHeader {
        let parent = self.parent_of(op);
        // After the parent's, whoever ordered it: the clock is this
        // replica's ticks since it booted, which a restarted primary's
        // trails (simulator seed 12100326).
        let after_parent = self
            .journal
            .header(op - 1)
            .map_or(0, |h| h.timestamp.saturating_add(1));
        self.last_timestamp = self
            .last_timestamp
            .saturating_add(1)
            .max(self.ticks)
            .max(after_parent);
        PrepareHeader {
            checksum: 0,
            checksum_body: body_checksum(&request.body),
            parent,
            client: request.client,
            request_checksum: request.request_checksum,
            view: self.view,
            op: Op(op),
            commit: Op(self.commit_max),
            timestamp: self.last_timestamp,
            request: request.request,
            operation: request.operation,
            group: self.config.group,
            user_id: request.user_id,
        }
    }

    fn refuse(&mut self, request: &Request, status: ReplyStatus) -> RequestOutcome {
        self.actions.push(Action::Reply(Reply {
            client: request.client,
            request: request.request,
            op: Op(0),
            commit: Op(self.commit_max),
            timestamp: 0,
            operation: request.operation,
            status,
            session: 0,
            result: 0,
        }));
        RequestOutcome::Answered
    }

    /// The identity op `op` must chain to.
    /// Moves the clock past every header learned from a view's log, the
    /// commit point's included (which the journal does not keep), so the
    /// next op this replica orders is timestamped after them.
    pub(super) fn learn_timestamps(&mut self, headers: &[PrepareHeader]) {
        if let Some(latest) = headers.iter().map(|h| h.timestamp).max() {
            self.last_timestamp = self.last_timestamp.max(latest);
        }
    }

    pub(super) fn parent_of(&self, op: u64) -> u128 {
        let below = op - 1;
        if below == self.commit_min {
            return self.commit_min_checksum;
        }
        self.journal.header(below).map_or(0, |h| h.checksum)
    }

    // ----- normal operation ------------------------------------------------

    pub(super) fn enter_normal_timers(&mut self) {
        self.timers.start_view_change.stop();
        self.timers.do_view_change.stop();
        self.timers.view_change_status.stop();
        if self.primary_of(self.view) == self.config.replica.0 {
            self.timers.normal_heartbeat.stop();
            // A single replica has nobody to heartbeat (and nothing to
            // abdicate to): its quiet groups then have no timer at all.
            if self.config.replica_count > 1 {
                self.timers.commit_message.start();
            }
            if self.pipeline.is_empty() {
                self.timers.prepare.stop();
            } else {
                self.timers.prepare.start();
            }
        } else {
            self.timers.commit_message.stop();
            self.timers.prepare.stop();
            self.timers.normal_heartbeat.start_jittered(&mut self.prng);
        }
    }

    fn on_prepare(&mut self, from: u8, view: u32, prepare: Prepare) -> Result<Handled, FrameError> {
        self.check_prepare(&prepare)?;
        if let Some(reason) = self.prepare_ignored(from, view) {
            if reason == Ignored::NewerView {
                self.note_newer_view(view);
            }
            return Ok(Handled::Ignored(reason));
        }
        self.timers.normal_heartbeat.start_jittered(&mut self.prng);
        self.last_timestamp = self.last_timestamp.max(prepare.header.timestamp);
        let commit = prepare.header.commit.0;
        let op = prepare.header.op.0;
        let before = self.head();
        match self
            .journal
            .insert_authoritative(prepare.clone(), self.commit_min)
        {
            Inserted::New => {
                if op <= before {
                    self.effect(Effect::TruncateJournal { from_op: Op(op) });
                }
                self.effect(Effect::Journal {
                    prepare: prepare.clone(),
                });
                self.forward_down_chain(view, prepare);
            }
            Inserted::Duplicate | Inserted::Rejected => {
                if op <= self.commit_min {
                    self.ack_applied(op, prepare.header.checksum);
                }
            }
        }
        self.raise_commit_max(commit);
        self.after_journal_change();
        Ok(Handled::Taken)
    }

    /// A prepare's own checksums, and its header's group: the frame's
    /// group was checked, and the prepare names its group too, under the
    /// checksum.
    pub(super) fn check_prepare(&self, prepare: &Prepare) -> Result<(), FrameError> {
        if !prepare.verify() {
            return Err(FrameError::BadChecksum {
                op: prepare.header.op,
            });
        }
        if prepare.header.group != self.config.group {
            return Err(FrameError::WrongGroup {
                group: prepare.header.group,
            });
        }
        Ok(())
    }

    /// Why a verified prepare of view `view` from `from` changes nothing
    /// here, if it does not.
    fn prepare_ignored(&self, from: u8, view: u32) -> Option<Ignored> {
        // In a chain the predecessor forwards what it journaled in this
        // view, which is this view's log, so it carries the primary's
        // authority as much as the primary's own send does.
        let predecessor =
            (self.config.replica.0 + self.config.replica_count - 1) % self.config.replica_count;
        let from_authority = from == self.primary_of(view)
            || (self.config.topology == Topology::Chain && from == predecessor);
        if view > self.view {
            Some(Ignored::NewerView)
        } else if view < self.view {
            Some(Ignored::StaleView)
        } else if self.status != Status::Normal {
            Some(Ignored::NotNormal)
        } else if !from_authority {
            Some(Ignored::NotFromAuthority)
        } else if self.primary_of(view) == self.config.replica.0 {
            Some(Ignored::OwnView)
        } else if self.transferring {
            Some(Ignored::Transferring)
        } else {
            None
        }
    }

    /// A backup acknowledges a prepare it already applied. A new primary
    /// whose view-change quorum had not heard of a commit proposes those
    /// ops again; a backup that applied them would otherwise never ack
    /// them (it acks only above its commit point), and with the third
    /// replica transferring — which a not-yet-caught-up primary cannot
    /// serve — the group never commits again (replog-sim seed 284, mixed).
    /// Only an op whose identity this replica knows to be `checksum` is
    /// acknowledged.
    fn ack_applied(&mut self, op: u64, checksum: u128) {
        if self.status != Status::Normal || self.recovering.is_some() || self.transferring {
            return;
        }
        let known = if op == self.commit_min {
            self.commit_min_checksum
        } else {
            self.journal.header(op).map_or(0, |h| h.checksum)
        };
        if known == 0 || known != checksum {
            return;
        }
        let primary = self.primary_of(self.view);
        self.send(
            primary,
            Message::PrepareOk {
                op: Op(op),
                prepare_checksum: checksum,
            },
        );
    }

    /// The next replica in the ring.
    fn ring_successor(&self) -> u8 {
        (self.config.replica.0 + 1) % self.config.replica_count
    }

    /// Chain topology: pass a newly journaled prepare on to the successor,
    /// unless the successor is the primary (the chain has ended).
    fn forward_down_chain(&mut self, view: u32, prepare: Prepare) {
        if self.config.topology != Topology::Chain {
            return;
        }
        let next = self.ring_successor();
        if next != self.primary_of(view) {
            self.send(next, Message::Prepare(prepare));
        }
    }

    /// Re-evaluate everything that depends on the journal: the restart
    /// barrier, the cumulative ack, the commit walk, repair and a pending
    /// view start.
    pub(super) fn after_journal_change(&mut self) {
        self.check_barrier();
        self.send_prepare_ok();
        self.commit_walk();
        if self.status == Status::ViewChange {
            self.try_start_view();
        }
        self.maybe_repair();
    }

    /// A backup acknowledges the highest op up to which its journal is
    /// contiguous; the hash chain makes the ack cover every op below.
    pub(super) fn send_prepare_ok(&mut self) {
        if self.status != Status::Normal
            || self.recovering.is_some()
            || self.transferring
            || self.primary_of(self.view) == self.config.replica.0
        {
            return;
        }
        let op = self.journal.contiguous_to(self.commit_min);
        if op <= self.commit_min {
            return;
        }
        let Some(prepare_checksum) = self.journal.entry(op).map(|p| p.header.checksum) else {
            return;
        };
        let primary = self.primary_of(self.view);
        self.acknowledged_max = self.acknowledged_max.max(op);
        self.send(
            primary,
            Message::PrepareOk {
                op: Op(op),
                prepare_checksum,
            },
        );
    }

    fn on_prepare_ok(&mut self, from: u8, view: u32, op: u64, checksum: u128) -> Handled {
        if let Some(reason) = self.other_view(view) {
            return Handled::Ignored(reason);
        }
        if !self.is_primary() {
            return Handled::Ignored(Ignored::NotPrimary);
        }
        if self.transferring {
            return Handled::Ignored(Ignored::Transferring);
        }
        if self.pipeline.ack(from, op, checksum) {
            self.try_commit();
        }
        Handled::Taken
    }

    /// What a Commit or Ping of another view comes to: a newer view is
    /// asked for; a deposed primary still heartbeating or checking reads
    /// is told the view when this replica leads it. `None` for this view.
    pub(super) fn heard_other_view(&mut self, from: u8, view: u32) -> Option<Handled> {
        if view > self.view {
            self.note_newer_view(view);
            return Some(Handled::Ignored(Ignored::NewerView));
        }
        if view < self.view {
            if self.is_primary() {
                let sv = self.start_view_message(0);
                self.send(from, Message::StartView(sv));
                return Some(Handled::Taken);
            }
            return Some(Handled::Ignored(Ignored::StaleView));
        }
        None
    }

    /// The reason a frame of `view` is ignored for not being of this
    /// replica's view, when it is not.
    pub(super) fn other_view(&self, view: u32) -> Option<Ignored> {
        match view.cmp(&self.view) {
            std::cmp::Ordering::Greater => Some(Ignored::NewerView),
            std::cmp::Ordering::Less => Some(Ignored::StaleView),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// Primary: commit the consecutive run of quorum-acknowledged ops at
    /// the head of the pipeline, then apply.
    pub(super) fn try_commit(&mut self) {
        while let Some(head) = self.pipeline.head() {
            if (head.ok_from.count_ones() as usize) < self.quorums.replication {
                break;
            }
            let op = head.header.op.0;
            self.pipeline.pop_head();
            self.raise_commit_max(op);
        }
        if self.pipeline.is_empty() {
            self.timers.prepare.stop();
        }
        self.commit_walk();
    }

    /// Raise `commit_max` (monotone).
    pub fn advance_commit_max(&mut self, commit: Op) {
        self.raise_commit_max(commit.0);
    }

    /// [`Self::advance_commit_max`] in the core's own arithmetic.
    pub(super) fn raise_commit_max(&mut self, commit: u64) {
        if commit > self.commit_max {
            self.commit_max = commit;
        }
        assert!(
            self.commit_max >= self.commit_min,
            "commit_max below commit_min"
        );
    }

    /// Apply every committed op the journal holds, in order.
    pub(super) fn commit_walk(&mut self) {
        if self.transferring {
            return;
        }
        self.resolve_commit_min_checksum();
        if !self.commit_min_checksum_known() {
            return;
        }
        let mut applied = false;
        while self.commit_min < self.commit_max {
            let op = self.commit_min + 1;
            let Some(prepare) = self.journal.entry(op).cloned() else {
                break;
            };
            assert_eq!(
                prepare.header.parent, self.commit_min_checksum,
                "replica {} op {op}: journal entry does not chain to the applied prefix",
                self.config.replica.0
            );
            self.apply(prepare);
            applied = true;
        }
        if applied {
            self.journal
                .prune_applied(self.commit_min, self.config.retention_ops);
            self.check_barrier();
        }
    }

    fn apply(&mut self, prepare: Prepare) {
        let h = prepare.header;
        let mut reply = Reply {
            client: h.client,
            request: h.request,
            op: h.op,
            commit: h.op,
            timestamp: h.timestamp,
            operation: h.operation,
            status: ReplyStatus::Ok,
            session: 0,
            result: 0,
        };
        let mut duplicate = false;
        if h.client != crate::client_table::CLIENT_RESERVED {
            if h.operation == OPERATION_REGISTER {
                reply.session = h.op.0;
                match self
                    .client_table
                    .register(h.client, h.user_id, h.op, reply.clone())
                {
                    Ok((session, fresh)) => {
                        duplicate = !fresh;
                        reply.session = session;
                    }
                    Err(_) => duplicate = true,
                }
            } else {
                duplicate = !self
                    .client_table
                    .commit(h.client, h.request, h.op, reply.clone());
            }
        }
        if duplicate && let Some(cached) = self.client_table.cached_reply(h.client, h.request) {
            reply = cached;
        }
        self.commit_min = h.op.0;
        self.commit_min_checksum = h.checksum;
        self.effect(Effect::Apply { prepare, duplicate });
        if self.is_primary() && h.client != crate::client_table::CLIENT_RESERVED {
            self.actions.push(Action::Reply(reply));
        }
    }

    fn on_commit(
        &mut self,
        from: u8,
        view: u32,
        commit: u64,
        checksum: u128,
        timestamp: u64,
    ) -> Handled {
        if let Some(handled) = self.heard_other_view(from, view) {
            return handled;
        }
        if self.status != Status::Normal {
            return Handled::Ignored(Ignored::NotNormal);
        }
        if self.primary_of(view) == self.config.replica.0 {
            return Handled::Ignored(Ignored::OwnView);
        }
        if from != self.primary_of(view) {
            return Handled::Ignored(Ignored::NotFromAuthority);
        }
        if timestamp > self.heartbeat_seen {
            self.heartbeat_seen = timestamp;
            self.timers.normal_heartbeat.start_jittered(&mut self.prng);
        }
        if commit > self.commit_min {
            self.journal.set_anchor(commit, checksum);
        } else if commit == self.commit_min {
            // An install that did not carry its op's identity learns it
            // from the primary's heartbeat at that op.
            self.learn_commit_min_checksum(checksum);
        }
        self.raise_commit_max(commit);
        self.after_journal_change();
        Handled::Taken
    }

    fn on_commit_message_timeout(&mut self) {
        if !self.is_primary() {
            return;
        }
        self.timers.commit_message.start();
        if self.observed_newer_view > self.view {
            if self.observed_newer_view > self.asked_newer_view {
                // Ask that view's primary once: it answers with a StartView
                // if the view formed.
                self.asked_newer_view = self.observed_newer_view;
                self.send_request_start_view(Some(self.observed_newer_view));
                return;
            }
            if self.recovering.is_none() {
                // Asked, and no StartView came: the view may never have
                // formed (a peer restarted from a view change it started
                // probes from it, and re-notes it on every probe). Left
                // here, a primary would ask for ever and, with no backup
                // of its view to elect, the group would wait for good
                // (simulator seed 16100645: group 0's two live replicas
                // each the primary of a different old view). A view change
                // past ours lets the group move on and that peer adopt a
                // view at least its own.
                self.start_view_change(self.view.saturating_add(1));
            }
            return;
        }
        if self.abdicate_if_identity_unlearnable() {
            return;
        }
        self.heartbeat_counter += 1;
        // Backups learn what is committed from the heartbeat. A primary
        // still applying (one waiting for a state transfer) names its
        // commit_max when its log holds that op's header: otherwise its
        // backups, one commit short, stay behind it, and it refuses their
        // offers as behind what it knows committed (replog-sim
        // 19700007: stuck for good).
        let (commit, commit_checksum) = match self.journal.header(self.commit_max) {
            Some(h) if self.commit_max > self.commit_min => (self.commit_max, h.checksum),
            _ => (self.commit_min, self.commit_min_checksum),
        };
        let message = Message::Commit {
            commit: Op(commit),
            commit_checksum,
            timestamp_monotonic: self.heartbeat_counter,
        };
        self.broadcast(message);
    }

    /// Primary: steps down when it cannot propose and cannot learn why.
    ///
    /// A primary whose applied op came from a state transfer may not know
    /// that op's identity (the offer carries none), and every proposal
    /// chains to it. Backups learn it from the primary's heartbeat; the
    /// primary learns it only from its log (a header at or above the op)
    /// or a view change's merge, and its log is empty above an install at
    /// its head. Peers that learned the identity from a heartbeat hold it
    /// without the header, so even a merge cannot name it. Waiting is
    /// then forever: the group looks healthy and refuses every request
    /// (vsr_sim seed 10087433). After a backup's election timeout worth of
    /// heartbeats in that state, it starts a view change to the next view,
    /// whose primary is another replica; it learns the identity from that
    /// primary's heartbeat. A view change is always safe; this costs one
    /// per such install, and none while a transfer is outstanding (the
    /// install that follows may still name it).
    fn abdicate_if_identity_unlearnable(&mut self) -> bool {
        let stuck = !self.transferring
            && !self.commit_min_checksum_known()
            && self
                .journal
                .header(self.commit_min.saturating_add(1))
                .is_none();
        if !stuck {
            self.identity_unknown_heartbeats = 0;
            return false;
        }
        self.identity_unknown_heartbeats = self.identity_unknown_heartbeats.saturating_add(1);
        let t = &self.config.timeouts;
        let limit = (t.normal_heartbeat_ticks / t.commit_message_ticks.max(1)).max(1);
        if self.identity_unknown_heartbeats < limit {
            return false;
        }
        self.identity_unknown_heartbeats = 0;
        self.start_view_change(self.view.saturating_add(1));
        true
    }

    /// Primary: retransmit un-acknowledged prepares to the replicas that
    /// have not acknowledged them.
    fn on_prepare_timeout(&mut self) {
        if !self.is_primary() || self.pipeline.is_empty() {
            return;
        }
        self.timers.prepare.backoff(&mut self.prng);
        let all = if self.config.replica_count >= 32 {
            u32::MAX
        } else {
            (1u32 << self.config.replica_count) - 1
        };
        let mut sends = Vec::new();
        for entry in self.pipeline.iter() {
            let missing = all & !entry.ok_from;
            if missing == 0 {
                continue;
            }
            if let Some(p) = self.journal.entry(entry.header.op.0) {
                sends.push((missing, p.clone()));
            }
        }
        for (missing, prepare) in sends {
            for to in 0..self.config.replica_count {
                if missing & (1u32 << to) != 0 {
                    self.send(to, Message::Prepare(prepare.clone()));
                }
            }
        }
    }

    /// Sequencer control for a state-transfer install: SET the head to
    /// `op`, dropping the journal above it, in either direction.
    ///
    /// A primary keeps its log: above the commit point it *is* the view's
    /// log (ops other replicas may have acknowledged and committed), and it
    /// already chains to the installed prefix because every journal entry
    /// above `commit_min` belongs to the current log.
    pub fn set_sequence(&mut self, op: Op) {
        let op = op.0;
        let head = self.head();
        if self.is_primary() || op >= head {
            return;
        }
        self.cut_head = self.cut_head.max(head);
        self.journal.truncate_from(op + 1, self.commit_min);
        self.effect(Effect::TruncateJournal {
            from_op: Op(op + 1),
        });
    }

    /// Drop the pipeline (state-transfer install). A primary rebuilds it
    /// from its journal with only its own acknowledgement, so uncommitted
    /// ops are retransmitted and re-acknowledged rather than forgotten.
    pub fn clear_pipeline(&mut self) {
        self.pipeline.clear();
        self.timers.prepare.stop();
        if !self.is_primary() {
            return;
        }
        let me = 1u32 << self.config.replica.0;
        for op in (self.commit_max + 1)..=self.head() {
            let Some(h) = self.journal.entry(op).map(|p| p.header) else {
                break;
            };
            self.pipeline.push(h, me);
        }
        if !self.pipeline.is_empty() {
            self.timers.prepare.start();
        }
    }

    pub(super) fn next_nonce(&mut self) -> u128 {
        self.nonce_counter += 1;
        u128::from(self.config.replica.0) << 96
            | u128::from(self.nonce_counter) << 32
            | u128::from(self.prng.next_u64() as u32)
    }
}

#[cfg(test)]
mod rejoin_bound_tests {
    use super::RejoinBound;

    #[test]
    fn given_peer_views_when_bounded_should_take_the_quorum_th_lowest_once_enough_were_heard() {
        let mut b = RejoinBound::default();
        assert_eq!(b.lowest_view(3), None);
        b.heard(1, 4);
        b.heard(2, 4);
        assert_eq!(b.lowest_view(3), None, "two of five heard");
        b.heard(3, 5);
        assert_eq!(b.lowest_view(3), Some(5));
        // One more peer in view 4: a single raised view no longer holds
        // the bound up.
        b.heard(4, 4);
        assert_eq!(b.lowest_view(3), Some(4));
        // A peer's view only goes up.
        b.heard(1, 2);
        assert_eq!(b.lowest_view(3), Some(4));
        b.heard(1, 7);
        b.heard(2, 7);
        assert_eq!(b.lowest_view(3), Some(7));
        // Out of range senders are ignored, never a panic.
        b.heard(200, 9);
        assert_eq!(b.lowest_view(0), None);
    }
}
