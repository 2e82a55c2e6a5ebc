//! The replica core's in-memory journal of prepares.
//!
//! The core owns its log (the partition plane's journal is memory-only, so
//! there is nothing for the driver to own): `Effect::Journal` tells the
//! driver what was appended, but the core never waits on it.
//!
//! Three things live here:
//! - `entries`: prepares whose bodies are held. Above `commit_min` every
//!   entry belongs to the log of the replica's `log_view` (the invariant the
//!   commit walk relies on); at or below it, the last few applied ops are
//!   retained to serve repair, from `retained_from` upward without holes.
//! - `headers`: canonical headers above `commit_min` whose bodies may still
//!   be missing (learned from a StartView suffix or a merged log).
//! - `anchor`: a committed op's identity learned from a heartbeat.
//! - `spilled`: applied ops whose bodies the driver let go of because it
//!   can read them back from its own storage (a partition's segments).
//!   Each keeps its header and the driver's locator. Together with the
//!   applied entries they still cover `retained_from..=commit_min`
//!   without holes, the spilled ones always the oldest.
//!
//! A repaired prepare is accepted only when its identity matches what the
//! log expects at its op: a known header, the `parent` of the header one op
//! above, or the anchor. Repair therefore verifies top-down along the hash
//! chain and can never smuggle a stale op from an old view into the log.

use std::collections::BTreeMap;

use super::message::{Prepare, PrepareHeader};

/// The in-memory log.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    entries: BTreeMap<u64, Prepare>,
    headers: BTreeMap<u64, PrepareHeader>,
    anchor: Option<(u64, u128)>,
    retained_from: u64,
    spilled: BTreeMap<u64, Spilled>,
}

/// An applied op whose body the journal no longer holds: the driver can
/// read it back at `locator` (what the locator means is the driver's
/// business; a partition uses the batch's base offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spilled {
    /// The op's header: the identity a read-back body must match.
    pub header: PrepareHeader,
    /// Where the driver finds the body.
    pub locator: u64,
    /// The body's length in bytes.
    pub len: u32,
}

/// One op of a retained range, as the journal holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retained {
    /// The whole prepare is in memory.
    Held(Prepare),
    /// Only the header is; the body must be read back.
    Spilled(Spilled),
}

impl Retained {
    /// The op.
    pub fn op(&self) -> u64 {
        match self {
            Retained::Held(p) => p.header.op.0,
            Retained::Spilled(s) => s.header.op.0,
        }
    }
}

/// Why a durable log could not refill a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreRefused {
    /// An op at or below the applied point, or not above the one before.
    OutOfOrder {
        /// The op.
        op: u64,
    },
    /// A body whose header is not the one logged with it.
    BodyMismatch {
        /// The op.
        op: u64,
    },
    /// An op whose parent is not the identity of the op below it.
    Unchained {
        /// The op.
        op: u64,
    },
}

/// What an insertion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// The prepare was new to the journal.
    New,
    /// The journal already held this exact prepare.
    Duplicate,
    /// The prepare does not match what the log expects at its op.
    Rejected,
}

impl Journal {
    /// An empty journal whose first retainable op is `retained_from`.
    pub fn new(retained_from: u64) -> Self {
        Self {
            retained_from,
            ..Self::default()
        }
    }

    pub(super) fn headers_iter(&self) -> impl Iterator<Item = (u64, &PrepareHeader)> {
        self.headers.iter().map(|(op, h)| (*op, h))
    }

    pub(super) fn headers_get(&self, op: u64) -> Option<&PrepareHeader> {
        self.headers.get(&op)
    }

    pub(super) fn entries_iter(&self) -> impl Iterator<Item = (u64, &Prepare)> {
        self.entries.iter().map(|(op, p)| (*op, p))
    }

    /// The oldest op this journal can still serve.
    pub fn retained_from(&self) -> u64 {
        self.retained_from
    }

    /// The prepare at `op`, if its body is held.
    pub fn entry(&self, op: u64) -> Option<&Prepare> {
        self.entries.get(&op)
    }

    /// The header at `op`, from an entry, a known canonical header or a
    /// spilled applied op.
    pub fn header(&self, op: u64) -> Option<&PrepareHeader> {
        self.headers
            .get(&op)
            .or_else(|| self.entries.get(&op).map(|p| &p.header))
            .or_else(|| self.spilled.get(&op).map(|s| &s.header))
    }

    /// The newest op this journal knows whose header carries
    /// `request_checksum` (nonzero), with the spilled locator when only
    /// its header is held. Looks at every op it holds: at most the
    /// retained applied ops and the log above them.
    pub fn find_request_checksum(&self, request_checksum: u128) -> Option<(u64, Option<u64>)> {
        if request_checksum == 0 {
            return None;
        }
        let matches = |h: &PrepareHeader| h.request_checksum == request_checksum;
        let entry = self
            .entries
            .iter()
            .rev()
            .find(|(_, p)| matches(&p.header))
            .map(|(op, _)| (*op, None));
        let header = self
            .headers
            .iter()
            .rev()
            .find(|(_, h)| matches(h))
            .map(|(op, _)| (*op, None));
        let spilled = self
            .spilled
            .iter()
            .rev()
            .find(|(_, s)| matches(&s.header))
            .map(|(op, s)| (*op, Some(s.locator)));
        [entry, header, spilled]
            .into_iter()
            .flatten()
            .max_by_key(|(op, _)| *op)
    }

    /// Lets go of the body of applied op `op` (at or below `commit_min`),
    /// keeping its header and `locator`, where the driver can read it back.
    /// Returns the body's length, or `None` when no applied body is held
    /// at `op` (already spilled, pruned, or not applied).
    pub fn spill(&mut self, op: u64, locator: u64, commit_min: u64) -> Option<u32> {
        if op > commit_min {
            return None;
        }
        let prepare = self.entries.remove(&op)?;
        // Bodies are bounded far below 4 GiB by the frame ceiling.
        let len = u32::try_from(prepare.body.len()).unwrap_or(u32::MAX);
        self.spilled.insert(
            op,
            Spilled {
                header: prepare.header,
                locator,
                len,
            },
        );
        Some(len)
    }

    /// Applied ops whose bodies are spilled.
    #[cfg(test)]
    fn spilled_count(&self) -> usize {
        self.spilled.len()
    }

    /// Every op above `commit_min` the journal knows: its header, and its
    /// prepare when the body is held (op order). What a durable journal
    /// must hold to vouch for this replica's acknowledgements.
    pub fn unapplied(&self, commit_min: u64) -> Vec<(PrepareHeader, Option<Prepare>)> {
        let from = commit_min.saturating_add(1);
        let ops: std::collections::BTreeSet<u64> = self
            .headers
            .range(from..)
            .chain(self.entries.range(from..).map(|(op, p)| (op, &p.header)))
            .map(|(op, _)| *op)
            .collect();
        ops.into_iter()
            .filter_map(|op| {
                let body = self.entries.get(&op);
                let header = body.map(|p| &p.header).or_else(|| self.headers.get(&op))?;
                Some((*header, body.cloned()))
            })
            .collect()
    }

    /// Refill an empty journal from a durable log of the ops above
    /// `commit_min` (as [`Journal::unapplied`] gave them). Refused, leaving
    /// the journal empty, when an entry lies at or below `commit_min`,
    /// repeats an op, carries a body whose header is not the entry's, or
    /// breaks the hash chain with its neighbour (`commit_checksum` is the
    /// identity at `commit_min`, 0 when unknown).
    pub fn restore(
        &mut self,
        log: &[(PrepareHeader, Option<Prepare>)],
        commit_min: u64,
        commit_checksum: u128,
    ) -> Result<(), RestoreRefused> {
        let mut below: Option<&PrepareHeader> = None;
        for (header, body) in log {
            let op = header.op.0;
            if op <= commit_min || below.is_some_and(|b| b.op.0 >= op) {
                return Err(self.refuse(RestoreRefused::OutOfOrder { op }));
            }
            if body.as_ref().is_some_and(|p| p.header != *header) {
                return Err(self.refuse(RestoreRefused::BodyMismatch { op }));
            }
            let parent = match below {
                Some(b) if b.op.0 + 1 == op => Some(b.checksum),
                None if op == commit_min + 1 && commit_checksum != 0 => Some(commit_checksum),
                _ => None,
            };
            if parent.is_some_and(|p| p != header.parent) {
                return Err(self.refuse(RestoreRefused::Unchained { op }));
            }
            self.headers.insert(op, *header);
            if let Some(p) = body {
                self.entries.insert(op, p.clone());
            }
            below = Some(header);
        }
        Ok(())
    }

    fn refuse(&mut self, why: RestoreRefused) -> RestoreRefused {
        self.headers.clear();
        self.entries.clear();
        why
    }

    /// The highest op with a known header, or `floor` if none is above it.
    pub fn head(&self, floor: u64) -> u64 {
        self.headers
            .last_key_value()
            .map_or(floor, |(op, _)| (*op).max(floor))
    }

    /// The identity the log expects at `op`, when it can tell.
    pub fn expected(&self, op: u64) -> Option<u128> {
        if let Some(h) = self.header(op) {
            return Some(h.checksum);
        }
        if let Some(above) = op.checked_add(1).and_then(|a| self.header(a)) {
            return Some(above.parent);
        }
        match self.anchor {
            Some((a, checksum)) if a == op => Some(checksum),
            _ => None,
        }
    }

    /// Record a committed op's identity (from the primary's heartbeat).
    pub fn set_anchor(&mut self, op: u64, checksum: u128) {
        if self.anchor.is_none_or(|(a, _)| a < op) {
            self.anchor = Some((op, checksum));
        }
    }

    /// Remove every entry and header above `commit_min` and at or above
    /// `from` (entries at or below `commit_min` are applied and stay).
    pub fn truncate_from(&mut self, from: u64, commit_min: u64) {
        let from = from.max(commit_min + 1);
        self.entries.retain(|op, _| *op < from);
        self.headers.retain(|op, _| *op < from);
    }

    /// Insert a prepare from the authority of the current view (the primary
    /// of the view in which it arrived). It overrides anything that
    /// disagrees: a different prepare at its op (and, because the chain
    /// above it hung off that prepare, every op above), and a header below
    /// it that it does not chain to.
    pub fn insert_authoritative(&mut self, prepare: Prepare, commit_min: u64) -> Inserted {
        let op = prepare.header.op.0;
        if op <= commit_min {
            return Inserted::Duplicate;
        }
        match self.header(op).copied() {
            Some(h) if h.checksum == prepare.header.checksum && self.entries.contains_key(&op) => {
                return Inserted::Duplicate;
            }
            Some(h) if h.checksum != prepare.header.checksum => {
                self.truncate_from(op, commit_min);
            }
            _ => {}
        }
        let below = op - 1;
        if below > commit_min
            && let Some(h) = self.header(below)
            && h.checksum != prepare.header.parent
        {
            // Everything at or below `below` down to the commit point chained
            // to a header this view's primary contradicts.
            self.entries.retain(|o, _| *o <= commit_min || *o > below);
            self.headers.retain(|o, _| *o > below);
        }
        self.headers.insert(op, prepare.header);
        self.entries.insert(op, prepare);
        Inserted::New
    }

    /// Insert a prepare only if it is the one the log expects at its op.
    pub fn insert_verified(&mut self, prepare: Prepare, commit_min: u64) -> Inserted {
        let op = prepare.header.op.0;
        if op <= commit_min {
            return Inserted::Duplicate;
        }
        if self.entries.contains_key(&op) {
            return Inserted::Duplicate;
        }
        if self.expected(op) != Some(prepare.header.checksum) {
            return Inserted::Rejected;
        }
        self.headers.insert(op, prepare.header);
        self.entries.insert(op, prepare);
        Inserted::New
    }

    /// Insert every buffered prepare that verifies, highest op first (so one
    /// pass walks the whole chain down), leaving the rest buffered. Returns
    /// the ops inserted.
    pub fn absorb(&mut self, buffer: &mut BTreeMap<u64, Prepare>, commit_min: u64) -> Vec<u64> {
        let mut inserted = Vec::new();
        let ops: Vec<u64> = buffer.keys().rev().copied().collect();
        for op in ops {
            if op <= commit_min || self.entries.contains_key(&op) {
                buffer.remove(&op);
                continue;
            }
            if self.expected(op) == buffer.get(&op).map(|p| p.header.checksum)
                && let Some(p) = buffer.remove(&op)
                && self.insert_verified(p, commit_min) == Inserted::New
            {
                inserted.push(op);
            }
        }
        inserted
    }

    /// Replace the log above `commit_min` with a new view's log: `canonical`
    /// holds headers high to low ending at `head`. Entries that disagree are
    /// dropped; entries below the lowest canonical header are kept only
    /// while they chain down from it (an unverifiable entry could be a stale
    /// op of an old view, and the commit walk must never apply one).
    pub fn install_log(&mut self, canonical: &[PrepareHeader], head: u64, commit_min: u64) {
        self.truncate_from(head + 1, commit_min);
        self.headers.clear();
        for h in canonical {
            if h.op.0 <= commit_min || h.op.0 > head {
                continue;
            }
            if self
                .entries
                .get(&h.op.0)
                .is_some_and(|e| e.header.checksum != h.checksum)
            {
                self.entries.remove(&h.op.0);
            }
            self.headers.insert(h.op.0, *h);
        }
        // Walk down from the lowest canonical header (or the head when the
        // canonical list is empty) keeping only what chains.
        let (mut expected, mut op) = match self.headers.first_key_value() {
            Some((op, h)) => (Some(h.parent), *op - 1),
            None => (
                self.anchor.filter(|(a, _)| *a == head).map(|(_, c)| c),
                head,
            ),
        };
        while op > commit_min {
            let keep = match (self.entries.get(&op), expected) {
                (Some(e), Some(x)) if e.header.checksum == x => Some(e.header),
                _ => None,
            };
            match keep {
                Some(h) => {
                    self.headers.insert(op, h);
                    expected = Some(h.parent);
                }
                None => {
                    self.entries.retain(|o, _| *o <= commit_min || *o > op);
                    break;
                }
            }
            op -= 1;
        }
        if let Some((a, _)) = self.anchor
            && a <= commit_min
        {
            self.anchor = None;
        }
    }

    /// The highest op `x` such that every op in `(commit_min, x]` is held.
    pub fn contiguous_to(&self, commit_min: u64) -> u64 {
        let mut x = commit_min;
        for op in self.entries.range(commit_min + 1..).map(|(op, _)| *op) {
            if op != x + 1 {
                break;
            }
            x = op;
        }
        x
    }

    /// The first op in `(commit_min, target]` whose body is missing.
    pub fn first_missing(&self, commit_min: u64, target: u64) -> Option<u64> {
        let x = self.contiguous_to(commit_min);
        (x < target).then_some(x + 1)
    }

    /// After applying up to `commit_min`: forget headers now applied and
    /// evict bodies older than `retention_ops` applied ops.
    pub fn prune_applied(&mut self, commit_min: u64, retention_ops: u64) {
        while let Some((op, _)) = self.headers.first_key_value() {
            if *op > commit_min {
                break;
            }
            self.headers.pop_first();
        }
        let keep_from = commit_min.saturating_sub(retention_ops) + 1;
        while let Some((op, _)) = self.entries.first_key_value() {
            if *op >= keep_from {
                break;
            }
            self.entries.pop_first();
        }
        while let Some((op, _)) = self.spilled.first_key_value() {
            if *op >= keep_from {
                break;
            }
            self.spilled.pop_first();
        }
        self.retained_from = self.retained_from.max(keep_from.min(commit_min + 1));
        if self.anchor.is_some_and(|(a, _)| a <= commit_min) {
            self.anchor = None;
        }
    }

    /// Forget everything at or below `floor` (a state-transfer install or a
    /// restart: nothing below the new applied point can be served).
    pub fn reset_floor(&mut self, floor: u64) {
        self.entries.retain(|op, _| *op > floor);
        self.headers.retain(|op, _| *op > floor);
        self.spilled.retain(|op, _| *op > floor);
        // Saturating: a floor is an op a caller checked against OP_MAX,
        // and this must not be the place an unchecked one panics.
        self.retained_from = floor.saturating_add(1);
        if self.anchor.is_some_and(|(a, _)| a <= floor) {
            self.anchor = None;
        }
    }

    /// Retained ops in `from..=to`, held or spilled, in op order, at most
    /// `max` of them.
    pub fn retained_range(&self, from: u64, to: u64, max: usize) -> Vec<Retained> {
        if from > to {
            return Vec::new();
        }
        let mut held = self.entries.range(from..=to).peekable();
        let mut spilled = self.spilled.range(from..=to).peekable();
        let mut out = Vec::new();
        while out.len() < max {
            let next = match (held.peek(), spilled.peek()) {
                (Some((h, _)), Some((s, _))) if s < h => {
                    spilled.next().map(|(_, s)| Retained::Spilled(*s))
                }
                (Some(_), _) => held.next().map(|(_, p)| Retained::Held(p.clone())),
                (None, Some(_)) => spilled.next().map(|(_, s)| Retained::Spilled(*s)),
                (None, None) => None,
            };
            match next {
                Some(r) => out.push(r),
                None => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bytes::Bytes;
    use common::{GroupId, Op};

    fn chain(n: u64) -> Vec<Prepare> {
        let mut parent = 0;
        (1..=n)
            .map(|op| {
                let mut header = PrepareHeader {
                    checksum: 0,
                    checksum_body: 0,
                    parent,
                    client: 1,
                    request_checksum: 0,
                    view: 0,
                    op: Op(op),
                    commit: Op(0),
                    timestamp: op,
                    request: op,
                    operation: 3,
                    group: GroupId(0),
                    user_id: 0,
                };
                header.checksum = header.compute_checksum();
                parent = header.checksum;
                Prepare {
                    header,
                    body: Bytes::new(),
                }
            })
            .collect()
    }

    /// A journal with ops 3..=5 above applied op 2: 3 and 5 with bodies,
    /// 4 only a header.
    fn logged_suffix(log: &[Prepare]) -> Vec<(PrepareHeader, Option<Prepare>)> {
        vec![
            (log[2].header, Some(log[2].clone())),
            (log[3].header, None),
            (log[4].header, Some(log[4].clone())),
        ]
    }

    #[test]
    fn given_a_journal_logged_above_its_applied_op_when_restored_should_be_the_same_journal() {
        let log = chain(5);
        let mut j = Journal::new(1);
        for p in &log[..3] {
            j.insert_authoritative(p.clone(), 2);
        }
        j.install_log(&[log[4].header, log[3].header], 5, 2);
        j.insert_verified(log[4].clone(), 2);
        let logged = j.unapplied(2);
        assert_eq!(logged, logged_suffix(&log));
        let mut restored = Journal::new(3);
        restored
            .restore(&logged, 2, log[1].header.checksum)
            .unwrap();
        assert_eq!(restored.unapplied(2), logged);
        assert_eq!(restored.contiguous_to(2), 3);
        assert_eq!(restored.head(2), 5);
    }

    #[test]
    fn given_a_damaged_log_when_restored_should_refuse_and_hold_nothing() {
        let log = chain(5);
        let good = logged_suffix(&log);
        let parent = log[1].header.checksum;
        let mut swapped = good.clone();
        swapped.swap(0, 1);
        let mut wrong_body = good.clone();
        wrong_body[0].1 = Some(log[0].clone());
        let mut unchained = good.clone();
        unchained[1].0.parent ^= 1;
        let cases = [
            (swapped, RestoreRefused::OutOfOrder { op: 3 }),
            (wrong_body, RestoreRefused::BodyMismatch { op: 3 }),
            (unchained, RestoreRefused::Unchained { op: 4 }),
        ];
        for (damaged, why) in cases {
            let mut j = Journal::new(3);
            assert_eq!(j.restore(&damaged, 2, parent), Err(why));
            assert!(j.unapplied(2).is_empty(), "{why:?} left entries behind");
        }
        let mut j = Journal::new(3);
        assert_eq!(
            j.restore(&good, 2, parent ^ 1),
            Err(RestoreRefused::Unchained { op: 3 }),
            "the first op must chain to the applied identity"
        );
        let mut j = Journal::new(4);
        assert_eq!(
            j.restore(&good, 3, 0),
            Err(RestoreRefused::OutOfOrder { op: 3 }),
            "an op at the applied point is refused"
        );
    }

    #[test]
    fn given_known_head_when_repair_arrives_out_of_order_should_verify_top_down() {
        let log = chain(5);
        let mut j = Journal::new(1);
        j.insert_authoritative(log[4].clone(), 0);
        let mut buffer: BTreeMap<u64, Prepare> = log[..4]
            .iter()
            .map(|p| (p.header.op.0, p.clone()))
            .collect();
        let inserted = j.absorb(&mut buffer, 0);
        assert_eq!(inserted, vec![4, 3, 2, 1]);
        assert_eq!(j.contiguous_to(0), 5);
    }

    #[test]
    fn given_unanchored_prepare_when_repaired_should_reject() {
        let log = chain(3);
        let mut j = Journal::new(1);
        assert_eq!(j.insert_verified(log[1].clone(), 0), Inserted::Rejected);
    }

    #[test]
    fn given_stale_entry_below_new_log_when_installed_should_drop_it() {
        let log = chain(4);
        let other = {
            let mut h = log[2].header;
            h.timestamp += 100;
            h.checksum = h.compute_checksum();
            h
        };
        let mut j = Journal::new(1);
        for p in &log[..3] {
            j.insert_authoritative(p.clone(), 0);
        }
        // The new view's log has a different op 3 and a new op 4 on top.
        let mut h4 = log[3].header;
        h4.parent = other.checksum;
        h4.checksum = h4.compute_checksum();
        j.install_log(&[h4, other], 4, 0);
        assert!(j.entry(3).is_none());
        assert_eq!(j.header(3).unwrap().checksum, other.checksum);
        assert!(j.entry(2).is_some(), "op 2 chains to the new op 3");
    }

    #[test]
    fn given_applied_bodies_spilled_when_ranged_should_interleave_in_op_order_and_prune_both() {
        let log = chain(6);
        let mut j = Journal::new(1);
        for p in &log {
            j.insert_authoritative(p.clone(), 0);
        }
        // Applied through op 5: op 6 is above the applied point.
        j.prune_applied(5, 100);
        assert_eq!(
            j.spill(6, 60, 5),
            None,
            "an op above the applied point is never spilled"
        );
        assert_eq!(j.spill(2, 20, 5), Some(0));
        assert_eq!(j.spill(4, 40, 5), Some(0));
        assert_eq!(j.spill(4, 40, 5), None, "spilled once");
        assert!(j.entry(2).is_none());
        assert_eq!(j.header(2), Some(&log[1].header), "the header stays known");
        let ops: Vec<(u64, bool)> = j
            .retained_range(1, 6, 10)
            .iter()
            .map(|r| (r.op(), matches!(r, Retained::Spilled(_))))
            .collect();
        assert_eq!(
            ops,
            [
                (1, false),
                (2, true),
                (3, false),
                (4, true),
                (5, false),
                (6, false)
            ]
        );
        assert_eq!(j.retained_range(2, 6, 2).len(), 2, "bounded by max");
        match &j.retained_range(4, 4, 1)[0] {
            Retained::Spilled(s) => assert_eq!((s.locator, s.header.op.0), (40, 4)),
            other => panic!("{other:?}"),
        }
        // Retention of 2 applied ops keeps 4 and 5: spilled op 2 goes too.
        j.prune_applied(5, 2);
        assert_eq!(j.spilled_count(), 1);
        assert_eq!(j.retained_range(1, 6, 10)[0].op(), 4);
        j.reset_floor(5);
        assert_eq!(j.spilled_count(), 0);
    }
}
