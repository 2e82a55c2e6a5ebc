//! Read checks: a primary serves a read from its own state only after
//! enough backups have vouched, after the read arrived, that they are
//! still in its view.
//!
//! Why: a primary cut off from its backups keeps believing it leads its
//! view until a frame of a newer view reaches it. Writes are safe (it can
//! commit nothing without a quorum), but a read it answers from its own
//! state can miss a write the newer view's primary already acknowledged:
//! a consumer offset read back older than the store the client saw
//! succeed.
//!
//! The rule (docs/consensus.md §2, "Reads"). A read that arrives at time
//! `t0` takes the next round `r` of this primary's read checks; the primary
//! broadcasts `Ping { r }` and a backup answers `Pong { r }` only while it
//! is `Normal`, quorum-visible and in the Ping's view. The read is served
//! once `n − q_vc` backups (`q_vc` the view-change quorum) have echoed a
//! round `≥ r` in this view and the primary is still a caught-up primary.
//! Then no view newer than this one had started before `t0`: starting one
//! takes `q_vc` replicas that entered it (views never go back, and a view
//! is durable before a replica sends in it), and the primary plus its
//! echoing backups are `n − q_vc + 1` replicas that were all still in this
//! view after `t0` — any `q_vc` replicas include one of them. So every
//! write acknowledged before `t0` was committed in this view or an older
//! one, and a caught-up primary has applied it.
//!
//! Cost: nothing for groups of one or two replicas (`n − q_vc = 0`: no
//! newer view can start without this primary), otherwise one round trip
//! per read, shared by every read that arrives while a round is being
//! sent: at most one round is outstanding, and the reads that arrive
//! meanwhile wait for the next one, which goes out as soon as the
//! outstanding one is confirmed. A round whose Pongs are lost is sent
//! again every `commit_message_ticks`.

use super::io::{Handled, Ignored, Status};
use super::message::Message;
use super::replica::Replica;

/// A primary's read-check rounds. Round numbers grow for the replica's
/// whole life (never reused across views), so a Pong names exactly the
/// Ping it answers; echoes count only in the view they were sent in.
#[derive(Debug, Clone, Default)]
pub(super) struct ReadChecks {
    /// The highest round broadcast (0: none yet).
    sent: u64,
    /// The highest round a read waits for (`≥ sent`).
    wanted: u64,
    /// The highest round confirmed by enough backups.
    confirmed: u64,
    /// The view the echoes below were made in.
    echo_view: u32,
    /// Per replica, the highest round it echoed in `echo_view`.
    echoed: Vec<u64>,
    /// Ticks since `sent` was last broadcast.
    since_sent: u64,
}

impl Replica {
    /// Backups that must echo a round before a read may be served:
    /// `n − q_vc` (0 for groups of one or two replicas).
    fn read_echoes_needed(&self) -> usize {
        usize::from(self.config.replica_count).saturating_sub(self.quorums.view_change)
    }

    /// The round a read arriving now must see confirmed before it is
    /// served from this replica's state ([`Replica::read_confirmed`]).
    /// Starts the round at once when none is outstanding. The caller has
    /// checked that this replica is a caught-up primary; if it is not, the
    /// round is never confirmed.
    pub fn read_fence(&mut self) -> u64 {
        if self.read_echoes_needed() == 0 {
            return 0;
        }
        let checks = &mut self.read_checks;
        if checks.wanted == checks.sent {
            // The latest round is already out: a backup may have echoed it
            // before this read arrived, so the read needs the next one.
            checks.wanted = checks.sent.saturating_add(1);
        }
        let round = checks.wanted;
        self.send_read_round_if_free();
        round
    }

    /// Whether a read fenced at `round` may now be served from this
    /// replica's state.
    pub fn read_confirmed(&self, round: u64) -> bool {
        self.is_caught_up_primary() && round <= self.read_checks.confirmed
    }

    /// Broadcasts the wanted round when no other round is outstanding.
    fn send_read_round_if_free(&mut self) {
        let checks = &mut self.read_checks;
        if checks.wanted <= checks.sent || checks.sent > checks.confirmed {
            return;
        }
        checks.sent = checks.wanted;
        checks.since_sent = 0;
        let round = checks.sent;
        if self.is_primary() {
            self.broadcast(Message::Ping { round });
        }
    }

    /// Tick: an outstanding round whose Pongs did not come back is sent
    /// again (same round: it was made after every read that waits on it).
    pub(super) fn on_read_check_tick(&mut self) {
        let checks = &mut self.read_checks;
        if checks.sent <= checks.confirmed {
            return;
        }
        checks.since_sent = checks.since_sent.saturating_add(1);
        if checks.since_sent < self.config.timeouts.commit_message_ticks {
            return;
        }
        checks.since_sent = 0;
        let round = checks.sent;
        if self.is_primary() {
            self.broadcast(Message::Ping { round });
        }
    }

    /// Ticks until [`Self::on_read_check_tick`] would send again
    /// (`u64::MAX` with no round outstanding).
    pub(super) fn read_check_due_in(&self) -> u64 {
        let checks = &self.read_checks;
        if checks.sent <= checks.confirmed {
            return u64::MAX;
        }
        self.config
            .timeouts
            .commit_message_ticks
            .saturating_sub(checks.since_sent)
            .max(1)
    }

    /// Counts `n` ticks of an outstanding round that send nothing.
    pub(super) fn skip_read_check_ticks(&mut self, n: u64) {
        let checks = &mut self.read_checks;
        if checks.sent > checks.confirmed {
            checks.since_sent = checks.since_sent.saturating_add(n);
        }
    }

    /// A backup: vouch for the Ping's view if it is ours and we follow its
    /// primary. A deposed primary's Ping is answered with the newer view.
    pub(super) fn on_ping(&mut self, from: u8, view: u32, round: u64) -> Handled {
        if let Some(handled) = self.heard_other_view(from, view) {
            return handled;
        }
        // A replica still recovering (a replaced disk above all) may hold
        // a view older than one it voted in before; it vouches for
        // nothing until a primary has told it the view.
        if self.recovering.is_some() {
            return Handled::Ignored(Ignored::Invisible);
        }
        if self.status != Status::Normal {
            return Handled::Ignored(Ignored::NotNormal);
        }
        if from != self.primary_of(view) || from == self.config.replica.0 {
            return Handled::Ignored(Ignored::NotFromAuthority);
        }
        self.send(from, Message::Pong { round });
        Handled::Taken
    }

    /// The primary: count a backup's echo, confirm what enough backups
    /// have echoed, and send the next wanted round.
    pub(super) fn on_pong(&mut self, from: u8, view: u32, round: u64) -> Handled {
        if let Some(reason) = self.other_view(view) {
            return Handled::Ignored(reason);
        }
        if !self.is_primary() {
            return Handled::Ignored(Ignored::NotPrimary);
        }
        let needed = self.read_echoes_needed();
        let count = usize::from(self.config.replica_count);
        let checks = &mut self.read_checks;
        if checks.echo_view != view || checks.echoed.len() != count {
            checks.echo_view = view;
            checks.echoed = vec![0; count];
        }
        // A Pong can only echo a round this replica sent.
        let round = round.min(checks.sent);
        let Some(slot) = checks.echoed.get_mut(usize::from(from)) else {
            return Handled::Taken;
        };
        *slot = (*slot).max(round);
        if needed == 0 {
            return Handled::Taken;
        }
        let mut echoes = checks.echoed.clone();
        echoes.sort_unstable_by(|a, b| b.cmp(a));
        let confirmed = echoes.get(needed - 1).copied().unwrap_or(0);
        if confirmed > checks.confirmed {
            checks.confirmed = confirmed;
            self.send_read_round_if_free();
        }
        Handled::Taken
    }
}
