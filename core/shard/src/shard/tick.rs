//! The shard's tick: which groups are due, their own ticks side by side,
//! and the passes spread over ticks (scrub, file handles, retention).

use std::collections::{BTreeMap, BTreeSet};

use common::GroupId;
use partitions::state_transfer::DriverOutput;

use super::group::{Group, PURGE_RETRY_TICKS};
use super::{EnvClock, Shard};
use crate::env::Env;

/// How many ticks between two retention passes of a group.
const RETENTION_EVERY_TICKS: u64 = 100;
/// Groups a tick's scrub visits at most (so thousands of groups without
/// sealed segments cost a bounded few lookups per tick).
const SCRUB_GROUPS_PER_TICK: usize = 8;
/// Ticks in which the handle pass sees every group once (about 5 s at the
/// default 10 ms tick).
const HANDLE_PASS_TICKS: u64 = 512;
/// Due groups whose own ticks run at once (see [`Shard::on_tick`]): enough
/// to share the filesystem's commits among many groups' syncs, few enough
/// that the files they open stay well inside the descriptor budget.
pub(super) const TICK_GROUPS_AT_ONCE: usize = 64;
/// Idle groups with unsynced writes a tick's handle pass flushes at most
/// (each is an fsync and an applied-point record).
const HANDLE_SYNCS_PER_TICK: u32 = 2;

impl<E: Env> Shard<E> {
    /// One tick: every group's consensus timeouts, its transfer driver,
    /// its flush thresholds and (every hundred ticks) its retention; then
    /// the sessions and queued calls.
    pub async fn on_tick(&mut self) {
        self.tick += 1;
        self.stats.ticks += 1;
        let now_us = u64::try_from(self.env.now().as_micros()).unwrap_or(u64::MAX);
        let retention_due = self.tick.is_multiple_of(RETENTION_EVERY_TICKS);
        self.tick_metadata().await;
        // Effects of group 0 may have reached groups: any that became due
        // now is visited below.
        self.reschedule_touched();
        // The due groups leave the map for the pass, so that their own
        // ticks can run side by side (below); what needs the whole shard
        // (sending, reporting, sessions) is collected and done after it.
        let tick = self.tick;
        let mut due = self.take_due(tick);
        // Each group's own tick (timeouts, flush thresholds, the applied
        // point's time-based record, retention) touches only that group's
        // files, so up to `TICK_GROUPS_AT_ONCE` of them run at once: a record
        // is three syncs in a row (log, client table, superblock), and a
        // shard with hundreds of groups due at once (a burst of produces
        // across partitions, a failover's view changes) otherwise waits
        // for every group's syncs one after another, long enough to miss its
        // own heartbeats. The syncs of different files run side by side and
        // the filesystem commits them together. Durable order within a group
        // is unchanged; on a simulated disk every call completes when made,
        // so the groups run in the same order as one at a time.
        let retention = self.retention;
        for chunk in due.chunks_mut(TICK_GROUPS_AT_ONCE) {
            let ticks = chunk
                .iter_mut()
                .map(|(id, g)| g.own_tick(*id, tick, now_us, retention_due.then_some(&retention)));
            futures::future::join_all(ticks).await;
        }
        let (outputs, waiting) = self.visit_due(due, tick).await;
        self.visits.settled_tick = tick;
        self.visits
            .touched
            .extend(outputs.iter().map(|(id, _)| *id));
        for (id, out) in outputs {
            self.carry_out(id, out);
        }
        for id in waiting {
            self.pump_session(id).await;
        }
        self.scrub().await;
        self.release_handles().await;
        self.settle().await;
    }

    /// Group 0's tick, on the shard that hosts it: its consensus timeouts
    /// and its metadata transfer, with what they produced carried out.
    async fn tick_metadata(&mut self) {
        let Some(host) = self.metadata.as_mut() else {
            return;
        };
        if let Err(error) = host.group.on_tick().await {
            tracing::warn!(%error, "metadata tick failed");
        }
        let out = host.transfer.on_tick(&mut host.group);
        self.send_frames(out);
        self.after_metadata_input().await;
    }

    /// The groups due by `tick`, taken out of the map and the schedule in
    /// schedule order.
    fn take_due(&mut self, tick: u64) -> Vec<(GroupId, Group<E>)> {
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.visits.schedule.first() {
            if at > tick {
                break;
            }
            self.visits.schedule.pop_first();
            if let Some(g) = self.groups.remove(&id) {
                due.push((id, g));
            }
        }
        due
    }

    /// The rest of each due group's visit once its own tick ran: its
    /// transfer driver, a fence to report, a purge it owes; then it is
    /// rescheduled and put back. Returns the driver outputs to carry out
    /// and the groups with calls waiting for their session.
    async fn visit_due(
        &mut self,
        due: Vec<(GroupId, Group<E>)>,
        tick: u64,
    ) -> (Vec<(GroupId, DriverOutput)>, Vec<GroupId>) {
        let mut outputs = Vec::new();
        let mut waiting = Vec::new();
        let tick_us = u64::try_from(self.config.tick.as_micros()).unwrap_or(u64::MAX);
        let clock = EnvClock(&*self.env);
        for (id, mut g) in due {
            self.stats.group_visits += 1;
            g.note_view(id);
            // An idle driver's tick would do nothing.
            if !g.driver.is_idle(&g.partition) {
                let out = g
                    .driver
                    .on_tick(&mut g.partition, &mut self.slots, &clock)
                    .await;
                outputs.push((id, out));
            }
            if g.partition.fenced().is_some() && !g.fenced_reported {
                outputs.push((id, DriverOutput::default()));
            }
            g.propose_missing_purge(id, tick);
            if !g.queued.is_empty() {
                waiting.push(id);
            }
            // Rescheduled while its state is still in cache; what runs
            // after the pass reschedules the groups it reaches again.
            g.due_at = next_visit(&g, tick_us, tick);
            self.visits.schedule.insert((g.due_at, id));
            self.groups.insert(id, g);
        }
        (outputs, waiting)
    }

    /// Up to `count` groups in id order after `after`, wrapping round to the
    /// first: the next share of a pass over every group.
    fn groups_in_turn(&self, after: GroupId, count: usize) -> Vec<GroupId> {
        self.groups
            .range(GroupId(after.0.saturating_add(1))..)
            .chain(self.groups.range(..=after))
            .map(|(id, _)| *id)
            .take(count)
            .collect()
    }

    /// This tick's share of letting file handles go: groups in turn after
    /// the last one seen, so that each is seen about once per
    /// [`HANDLE_PASS_TICKS`]. A group whose log has nothing unsynced closes
    /// its files (reopened on next use). One with writes still unsynced
    /// and no new op since the pass last saw it (a single replica's, which
    /// nothing else syncs before its segment seals) is flushed first, a
    /// few per tick. So the descriptor limit bounds the partitions in use,
    /// not those hosted (docs/architecture.md, the "Descriptors" paragraph).
    /// A group with no new op since the pass last saw it also lets go of
    /// the bodies it kept for repair (`Partition::release_retained`).
    async fn release_handles(&mut self) {
        let count = self.groups.len() as u64;
        if count == 0 || !self.tick.is_multiple_of((HANDLE_PASS_TICKS / count).max(1)) {
            return;
        }
        let per_tick = usize::try_from(count.div_ceil(HANDLE_PASS_TICKS)).unwrap_or(usize::MAX);
        let order = self.groups_in_turn(self.handles_after, per_tick);
        let mut syncs = 0;
        for id in order {
            self.handles_after = id;
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            // A group with no new op for a whole pass gives its bodies kept
            // for repair back to the shard's budget.
            let head = g.partition.replica().op().0;
            if g.partition.retained_bytes() > 0 && g.retained_seen_op == Some(head) {
                g.partition.release_retained();
            }
            g.retained_seen_op = Some(head);
            if !g.partition.holds_handles() || g.partition.release_handles() {
                continue;
            }
            // Idle: no op since the pass last saw it, a pass ago.
            let op = g.partition.replica().op().0;
            let idle = g.handles_seen_op == Some(op);
            g.handles_seen_op = Some(op);
            if !idle
                || syncs >= HANDLE_SYNCS_PER_TICK
                || g.partition.fenced().is_some()
                || g.partition.installing()
            {
                continue;
            }
            syncs += 1;
            // A failed flush fences the group: it must be visited to
            // report that.
            let Some(g) = self.visits.touch(&mut self.groups, id) else {
                continue;
            };
            match g.partition.flush_committed_messages().await {
                Ok(_) => {
                    g.partition.release_handles();
                }
                Err(error) => tracing::warn!(group = id.0, %error, "flush of an idle group failed"),
            }
        }
    }

    /// Puts every group an input reached back into the schedule at the
    /// tick it is next due ([`next_visit`]).
    pub(super) fn reschedule_touched(&mut self) {
        if self.visits.touched.is_empty() {
            return;
        }
        let tick_us = u64::try_from(self.config.tick.as_micros()).unwrap_or(u64::MAX);
        let mut touched = std::mem::take(&mut self.visits.touched);
        for id in touched.drain(..) {
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            let at = next_visit(g, tick_us, self.visits.settled_tick);
            if at != g.due_at {
                self.visits.schedule.remove(&(g.due_at, id));
                g.due_at = at;
            }
            self.visits.schedule.insert((at, id));
        }
        // The buffer is kept for the next input.
        self.visits.touched = touched;
    }

    /// This tick's share of scrubbing: groups in turn after the last one
    /// scrubbed, until the byte budget is spent or a few groups were
    /// visited. Damage found is repaired by the group itself
    /// (`Partition::note_damage`).
    async fn scrub(&mut self) {
        let mut budget = self.config.scrub_bytes_per_tick;
        if budget == 0 || self.groups.is_empty() {
            return;
        }
        let order = self.groups_in_turn(self.scrub_after, SCRUB_GROUPS_PER_TICK);
        for id in order {
            self.scrub_after = id;
            let Some(g) = self.visits.touch(&mut self.groups, id) else {
                continue;
            };
            let read = g.partition.scrub_step(budget).await;
            budget = budget.saturating_sub(read);
            if budget == 0 {
                break;
            }
        }
    }
}

/// Which groups a tick visits, and what an input owes the schedule.
#[derive(Default)]
pub(super) struct Visits {
    /// Every group by the tick it is next due at: a tick visits only the
    /// groups whose entry has come (docs/architecture.md, "What a tick
    /// costs").
    pub(super) schedule: BTreeSet<(u64, GroupId)>,
    /// Groups an input reached since the last rescheduling (a group may
    /// appear more than once).
    pub(super) touched: Vec<GroupId>,
    /// The last tick whose due groups have all been visited: an input
    /// catches a group up to it before handing it anything.
    pub(super) settled_tick: u64,
}

impl Visits {
    /// The group `id`, caught up on the ticks it was not visited for
    /// (through the settled tick), so it is exactly where ticking it every
    /// tick would have left it, and marked for rescheduling. Every input to
    /// a group goes through here.
    pub(super) fn touch<'a, E: Env>(
        &mut self,
        groups: &'a mut BTreeMap<GroupId, Group<E>>,
        id: GroupId,
    ) -> Option<&'a mut Group<E>> {
        let g = groups.get_mut(&id)?;
        if g.counted_to < self.settled_tick {
            g.partition.skip_ticks(self.settled_tick - g.counted_to);
            g.counted_to = self.settled_tick;
        }
        self.touched.push(id);
        Some(g)
    }
}

/// The shard tick a group is next due at, after `settled` (the last tick
/// whose due groups were all visited): the next one while it has work
/// every tick needs (a running transfer, calls waiting for its session, a
/// fence not yet reported), its retention tick when its topic has a
/// retention setting, its purge retry while it owes a committed purge,
/// otherwise when the partition says
/// (`Partition::ticks_until_due`).
fn next_visit<E: Env>(g: &Group<E>, tick_us: u64, settled: u64) -> u64 {
    let every_tick = !g.queued.is_empty()
        || (g.partition.fenced().is_some() && !g.fenced_reported)
        || !g.driver.is_idle(&g.partition);
    let due_in = if every_tick {
        1
    } else {
        g.partition.ticks_until_due(tick_us)
    };
    let mut at = g.counted_to.saturating_add(due_in);
    // A committed purge the partition has not applied: its primary
    // proposes it on a visit (`propose_missing_purge`), and a group with
    // no timers of its own (a single replica's) would never be visited.
    if g.owes_purge() {
        let retry = g.purge_proposed.map_or(g.counted_to + 1, |(_, proposed)| {
            proposed + PURGE_RETRY_TICKS
        });
        at = at.min(retry);
    }
    if g.spec.retains() {
        let next_pass = (g.counted_to / RETENTION_EVERY_TICKS + 1) * RETENTION_EVERY_TICKS;
        at = at.min(next_pass);
    }
    at.max(settled + 1)
}
