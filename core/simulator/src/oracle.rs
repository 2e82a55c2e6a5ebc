//! The oracle: what clients were told, and the safety properties every
//! observation must agree with.
//!
//! Every produced message carries its batch's tag and its index in the
//! batch in its payload, and every tag is sent once (a retry after an
//! outcome-unknown answer sends a fresh tag), so a value identifies
//! itself wherever it is read. The oracle keeps:
//! - each tag's fate: acknowledged (`Answer::Committed`), unknown (the
//!   call was cut off, timed out or answered `Indeterminate`), pending, or
//!   never applied (only refusals that promise nothing changed);
//! - the base offset an acknowledgement confirmed: message `i` of that
//!   batch must be served at exactly base + `i`, before and after;
//! - every `(offset → value)` any replica ever served, per group, and
//!   every `value → offset`, so two values at one offset (across replicas
//!   and over time) and one value at two offsets are caught at once;
//! - per consumer, the stored offsets a read may legitimately return.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use common::{ConsumerKind, GroupId};

/// A safety or liveness property of SPEC §5 and §9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Property {
    /// An acknowledged produce is not readable after healing.
    AcknowledgedLost,
    /// A value that was never sent (or sent to another group) was read.
    UnknownValue,
    /// Two different values were served at one offset.
    TwoValuesAtOffset,
    /// One value was served at two offsets.
    ValueAtTwoOffsets,
    /// A message of an acknowledged produce was served at an offset other
    /// than the one its answer confirmed (base offset + index).
    NotAtConfirmedOffset,
    /// A read skipped an offset or went backwards.
    OffsetsNotDense,
    /// Part of a batch was read without the rest of it.
    BatchTorn,
    /// A produce whose every answer promised nothing changed was applied.
    RefusedButApplied,
    /// A well-formed request was refused as the client's mistake.
    UnexpectedRefusal,
    /// A stored consumer offset was read back as a value no store could
    /// have left.
    ConsumerOffsetWrong,
    /// A replica's view or commit went backwards within one boot.
    Regressed,
    /// After healing and the quiet period the replicas did not converge.
    NotConverged,
    /// Converged replicas hold different messages or segment bytes.
    ReplicasDiverge,
    /// Code under test panicked (an assertion on its own invariants).
    Panicked,
    /// A message erased by a purge was read after the purge applied, or
    /// is in the final log.
    PurgedValueRead,
    /// A replica's or a partition's `invariants()` failed after a step.
    Invariant,
    /// A message is gone from a converged log although retention could
    /// not have removed it yet (or its topic expires nothing).
    RemovedBeforeExpiry,
    /// A session's consumer-group membership differs from what the
    /// committed joins, leaves and session ends left.
    MembershipWrong,
    /// A poll by timestamp started anywhere but at a batch stamped at or
    /// after the time asked, or a poll's batches' timestamps went
    /// backwards.
    TimestampWrong,
}

impl Property {
    /// A short name for the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::AcknowledgedLost => "acknowledged-lost",
            Self::UnknownValue => "unknown-value",
            Self::TwoValuesAtOffset => "two-values-at-one-offset",
            Self::ValueAtTwoOffsets => "one-value-at-two-offsets",
            Self::NotAtConfirmedOffset => "not-at-confirmed-offset",
            Self::OffsetsNotDense => "offsets-not-dense",
            Self::BatchTorn => "batch-torn",
            Self::RefusedButApplied => "refused-but-applied",
            Self::UnexpectedRefusal => "unexpected-refusal",
            Self::ConsumerOffsetWrong => "consumer-offset-wrong",
            Self::Regressed => "regressed",
            Self::NotConverged => "not-converged",
            Self::ReplicasDiverge => "replicas-diverge",
            Self::Panicked => "panicked",
            Self::PurgedValueRead => "purged-value-read",
            Self::Invariant => "invariant",
            Self::RemovedBeforeExpiry => "removed-before-expiry",
            Self::MembershipWrong => "membership-wrong",
            Self::TimestampWrong => "timestamp-wrong",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A property that did not hold, with what showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The property.
    pub property: Property,
    /// What was seen, as a sentence.
    pub detail: String,
}

impl Violation {
    pub(crate) fn new(property: Property, detail: impl Into<String>) -> Self {
        Self {
            property,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.property, self.detail)
    }
}

impl std::error::Error for Violation {}

/// The payload prefix of every simulated message.
const PAYLOAD_MAGIC: &[u8; 4] = b"SIM1";

/// The payload of message `index` of batch `tag`, padded with `filler`
/// bytes so batches vary in size.
pub(crate) fn payload(tag: u64, index: u32, filler: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + filler);
    out.extend_from_slice(PAYLOAD_MAGIC);
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    // The filler is derived from the identity, so a flipped byte anywhere
    // in the payload is a different value.
    out.extend((0..filler).map(|i| (tag as u8) ^ (index as u8) ^ (i as u8)));
    out
}

/// The `(tag, index)` a payload names, if it is one of ours and intact.
pub(crate) fn identify(payload: &[u8]) -> Option<(u64, u32)> {
    let (magic, rest) = payload.split_first_chunk::<4>()?;
    if magic != PAYLOAD_MAGIC {
        return None;
    }
    let (tag, rest) = rest.split_first_chunk::<8>()?;
    let (index, filler) = rest.split_first_chunk::<4>()?;
    let (tag, index) = (u64::from_le_bytes(*tag), u32::from_le_bytes(*index));
    let intact = filler
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (tag as u8) ^ (index as u8) ^ (i as u8));
    intact.then_some((tag, index))
}

/// What became of a produced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Sent; no final answer yet.
    Pending,
    /// Acknowledged: it must be readable.
    Acknowledged,
    /// Outcome unknown: it may be readable (whole) or not at all.
    Unknown,
    /// Every answer promised nothing changed: it must never be readable.
    NeverApplied,
}

#[derive(Debug, Clone)]
struct Sent {
    group: GroupId,
    messages: u32,
    fate: Fate,
    /// The base offset the acknowledgement named, if it named one.
    confirmed_base: Option<u64>,
    /// A purge of its group applied after it landed: it must never be
    /// read again.
    purged: bool,
    /// The tick it was first sent: the primary stamps it no earlier, so
    /// retention removes it no earlier than its topic's expiry after this.
    sent_tick: u64,
}

/// What reads of one consumer's stored offset may return. A write is a
/// store (`Some(offset)`) or a delete (`None`); never stored and deleted
/// read the same: nothing.
#[derive(Debug, Clone, Default)]
struct OffsetExpectation {
    /// The last acknowledged write (`None`: never written, or deleted).
    acknowledged: Option<u64>,
    /// Writes whose outcome is unknown since then: each may have landed.
    unknown_since: BTreeSet<Option<u64>>,
    /// Writes that may still be waiting somewhere (timed out): they may
    /// land at any time, even after a later acknowledged write.
    unknown_forever: BTreeSet<Option<u64>>,
}

/// The key of one stored offset in a group: a lone consumer or a
/// consumer group, and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Consumer {
    pub(crate) kind: ConsumerKind,
    pub(crate) id: u32,
}

impl fmt::Display for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ConsumerKind::Consumer => write!(f, "consumer {}", self.id),
            ConsumerKind::ConsumerGroup => write!(f, "consumer group {}", self.id),
        }
    }
}

/// The oracle.
#[derive(Debug, Default)]
pub(crate) struct Oracle {
    sent: BTreeMap<u64, Sent>,
    at_offset: BTreeMap<GroupId, BTreeMap<u64, (u64, u32)>>,
    value_at: BTreeMap<(u64, u32), (GroupId, u64)>,
    offsets: BTreeMap<(GroupId, Consumer), OffsetExpectation>,
}

impl Oracle {
    /// A batch `tag` of `messages` messages was sent to `group` at `tick`.
    pub(crate) fn produced(&mut self, tag: u64, group: GroupId, messages: u32, tick: u64) {
        self.sent.insert(
            tag,
            Sent {
                group,
                messages,
                fate: Fate::Pending,
                confirmed_base: None,
                purged: false,
                sent_tick: tick,
            },
        );
    }

    /// The final word on batch `tag`.
    pub(crate) fn settle(&mut self, tag: u64, fate: Fate) {
        if let Some(s) = self.sent.get_mut(&tag) {
            s.fate = fate;
        }
    }

    /// Batch `tag` was acknowledged, at `base` when the answer named the
    /// base offset: every message of it already served must be there.
    pub(crate) fn acknowledged(&mut self, tag: u64, base: Option<u64>) -> Result<(), Violation> {
        let Some(s) = self.sent.get_mut(&tag) else {
            return Ok(());
        };
        s.fate = Fate::Acknowledged;
        s.confirmed_base = base;
        let (group, messages) = (s.group, s.messages);
        let Some(base) = base else {
            return Ok(());
        };
        for index in 0..messages {
            if let Some(&(g, offset)) = self.value_at.get(&(tag, index))
                && (g, offset) != (group, base + u64::from(index))
            {
                return Err(not_at_confirmed(tag, index, base, g, offset));
            }
        }
        Ok(())
    }

    /// Batches acknowledged with a confirmed base offset.
    pub(crate) fn confirmed(&self) -> u64 {
        self.sent
            .values()
            .filter(|s| s.confirmed_base.is_some())
            .count() as u64
    }

    /// Counts of batches by fate.
    pub(crate) fn count(&self, fate: Fate) -> u64 {
        self.sent.values().filter(|s| s.fate == fate).count() as u64
    }

    /// The highest offset any replica served for `group`.
    pub(crate) fn highest_offset(&self, group: GroupId) -> Option<u64> {
        self.at_offset
            .get(&group)
            .and_then(|m| m.last_key_value())
            .map(|(o, _)| *o)
    }

    /// One message a replica served.
    fn observe(&mut self, group: GroupId, offset: u64, payload: &[u8]) -> Result<(), Violation> {
        let Some(id) = identify(payload) else {
            return Err(Violation::new(
                Property::UnknownValue,
                format!(
                    "group {} offset {offset}: a payload of {} bytes no client sent",
                    group.0,
                    payload.len()
                ),
            ));
        };
        self.check_sent(group, offset, id)?;
        self.record_served(group, offset, id)
    }

    /// Message `id` (batch tag, index) served at `offset` of `group` is
    /// one a client sent there, not erased by a purge, at its batch's
    /// confirmed place if it has one.
    fn check_sent(&self, group: GroupId, offset: u64, id: (u64, u32)) -> Result<(), Violation> {
        let (tag, index) = id;
        match self.sent.get(&tag) {
            Some(s) if s.purged => Err(Violation::new(
                Property::PurgedValueRead,
                format!(
                    "group {} offset {offset}: message {index} of batch {tag}, which a purge erased",
                    group.0
                ),
            )),
            Some(s) if s.group == group && index < s.messages => {
                if let Some(base) = s.confirmed_base
                    && offset != base + u64::from(index)
                {
                    return Err(not_at_confirmed(tag, index, base, group, offset));
                }
                Ok(())
            }
            Some(s) => Err(Violation::new(
                Property::UnknownValue,
                format!(
                    "group {} offset {offset}: message {index} of batch {tag}, which was sent to group {} with {} messages",
                    group.0, s.group.0, s.messages
                ),
            )),
            None => Err(Violation::new(
                Property::UnknownValue,
                format!(
                    "group {} offset {offset}: batch {tag} was never sent",
                    group.0
                ),
            )),
        }
    }

    /// Records message `id` served at `offset` of `group`: no other value
    /// was ever served at that offset, nor this one at another.
    fn record_served(
        &mut self,
        group: GroupId,
        offset: u64,
        id: (u64, u32),
    ) -> Result<(), Violation> {
        let (tag, index) = id;
        let slot = self.at_offset.entry(group).or_default();
        if let Some(&earlier) = slot.get(&offset)
            && earlier != id
        {
            return Err(Violation::new(
                Property::TwoValuesAtOffset,
                format!(
                    "group {} offset {offset}: served as batch {} message {} before, now as batch {tag} message {index}",
                    group.0, earlier.0, earlier.1
                ),
            ));
        }
        slot.insert(offset, id);
        if let Some(&(g, earlier)) = self.value_at.get(&id)
            && (g, earlier) != (group, offset)
        {
            return Err(Violation::new(
                Property::ValueAtTwoOffsets,
                format!(
                    "batch {tag} message {index} served at offset {earlier} before, now at offset {offset} (group {})",
                    group.0
                ),
            ));
        }
        self.value_at.insert(id, (group, offset));
        Ok(())
    }

    /// A poll answer: its messages are dense, in order, and agree with
    /// every earlier observation.
    pub(crate) fn polled(
        &mut self,
        group: GroupId,
        messages: &[(u64, Vec<u8>)],
    ) -> Result<(), Violation> {
        for pair in messages.windows(2) {
            if pair[1].0 != pair[0].0 + 1 {
                return Err(Violation::new(
                    Property::OffsetsNotDense,
                    format!(
                        "group {}: a read returned offset {} after {}",
                        group.0, pair[1].0, pair[0].0
                    ),
                ));
            }
        }
        for (offset, payload) in messages {
            self.observe(group, *offset, payload)?;
        }
        Ok(())
    }

    /// A store of `offset` (or a delete, `None`) for `consumer` settled.
    pub(crate) fn store_settled(
        &mut self,
        group: GroupId,
        consumer: Consumer,
        offset: Option<u64>,
        outcome: StoreOutcome,
    ) {
        let e = self.offsets.entry((group, consumer)).or_default();
        match outcome {
            StoreOutcome::Acknowledged => {
                e.acknowledged = offset;
                e.unknown_since.clear();
            }
            StoreOutcome::Unknown => {
                e.unknown_since.insert(offset);
            }
            StoreOutcome::MayLandLater => {
                e.unknown_forever.insert(offset);
            }
            StoreOutcome::NeverApplied => {}
        }
    }

    /// A read of `consumer`'s stored offset answered `got`.
    pub(crate) fn offset_read(
        &self,
        group: GroupId,
        consumer: Consumer,
        got: Option<u64>,
    ) -> Result<(), Violation> {
        let e = self
            .offsets
            .get(&(group, consumer))
            .cloned()
            .unwrap_or_default();
        let allowed = e.acknowledged == got
            || e.unknown_since.contains(&got)
            || e.unknown_forever.contains(&got);
        if allowed {
            return Ok(());
        }
        Err(Violation::new(
            Property::ConsumerOffsetWrong,
            format!(
                "group {} {consumer}: read {got:?}, the last acknowledged store was {:?} (unknown since: {:?}, may land: {:?})",
                group.0, e.acknowledged, e.unknown_since, e.unknown_forever
            ),
        ))
    }

    /// The whole log of `group` on a converged replica: dense from 0,
    /// agreeing with every observation, every acknowledged batch present,
    /// every batch whole or absent, nothing refused present.
    ///
    /// `expired_before`: when the group's topic expires messages, the tick
    /// before which a batch must have been sent for retention to have
    /// removed it by now. The log may then start past 0, and an
    /// acknowledged batch may be missing, but only a batch sent before
    /// that tick and not at or above the log's start; every offset ever
    /// served below the start must be such a batch's.
    pub(crate) fn final_log(
        &mut self,
        group: GroupId,
        messages: &[(u64, Vec<u8>)],
        expired_before: Option<u64>,
    ) -> Result<(), Violation> {
        let start = messages.first().map(|&(first, _)| first);
        self.check_log_start(group, start, expired_before)?;
        self.polled(group, messages)?;
        let mut seen: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
        for (offset, payload) in messages {
            if let Some((tag, index)) = identify(payload) {
                seen.entry(tag).or_default().push((index, *offset));
            }
        }
        for (tag, s) in self
            .sent
            .iter()
            .filter(|(_, s)| s.group == group && !s.purged)
        {
            let expired = expired_before.is_some_and(|before| {
                s.sent_tick < before
                    && s.confirmed_base
                        .is_none_or(|base| start.is_none_or(|first| base < first))
            });
            check_batch_in_log(group, *tag, s, seen.get(tag), expired)?;
        }
        Ok(())
    }

    /// `group`'s log starts at 0 (`start` is its first offset, `None`
    /// when it is empty) or, when its topic expires messages, past only
    /// offsets whose batches were sent before `expired_before`.
    fn check_log_start(
        &self,
        group: GroupId,
        start: Option<u64>,
        expired_before: Option<u64>,
    ) -> Result<(), Violation> {
        match expired_before {
            None => {
                if let Some(first) = start
                    && first != 0
                {
                    return Err(Violation::new(
                        Property::OffsetsNotDense,
                        format!("group {}: the log starts at offset {first}, not 0", group.0),
                    ));
                }
            }
            Some(before) => {
                // An empty log of an expiring group: every sealed segment
                // went and the active one is empty.
                let start = start.unwrap_or(u64::MAX);
                let gone = self
                    .at_offset
                    .get(&group)
                    .map(|m| m.range(..start))
                    .into_iter()
                    .flatten();
                for (&offset, &(tag, index)) in gone {
                    let sent = self.sent.get(&tag).map(|s| s.sent_tick);
                    if sent.is_none_or(|t| t >= before) {
                        return Err(Violation::new(
                            Property::RemovedBeforeExpiry,
                            format!(
                                "group {}: offset {offset} (batch {tag} message {index}, sent at tick {sent:?}) is gone; the log starts at {start}, and only batches sent before tick {before} may have expired",
                                group.0
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// A purge of `group` applied, while no client had a request on it in
    /// flight: every batch acknowledged or read before it is erased (and
    /// must never be read again), offsets start again at 0, and every
    /// stored consumer offset is gone. Writes whose outcome is unknown may
    /// still land after it, so they stay possible.
    pub(crate) fn purged(&mut self, group: GroupId) {
        let observed: BTreeSet<u64> = self
            .value_at
            .iter()
            .filter(|(_, (g, _))| *g == group)
            .map(|((tag, _), _)| *tag)
            .collect();
        self.value_at.retain(|_, (g, _)| *g != group);
        self.at_offset.remove(&group);
        for (tag, s) in self.sent.iter_mut().filter(|(_, s)| s.group == group) {
            if s.fate == Fate::Acknowledged || observed.contains(tag) {
                s.purged = true;
            }
        }
        for ((g, _), e) in &mut self.offsets {
            if *g == group {
                e.acknowledged = None;
            }
        }
    }

    /// The consumers whose stored offsets the oracle tracks in `group`.
    pub(crate) fn consumers(&self, group: GroupId) -> Vec<Consumer> {
        self.offsets
            .keys()
            .filter(|(g, _)| *g == group)
            .map(|(_, c)| *c)
            .collect()
    }
}

/// Batch `tag` (sent as `s`) against the `(index, offset)` parts of it a
/// converged log holds: an acknowledged batch is there unless `expired`,
/// a batch only ever refused is not, and one that is there is whole.
fn check_batch_in_log(
    group: GroupId,
    tag: u64,
    s: &Sent,
    parts: Option<&Vec<(u32, u64)>>,
    expired: bool,
) -> Result<(), Violation> {
    match (s.fate, parts) {
        (Fate::Acknowledged, None) if expired => {}
        (Fate::Acknowledged, None) => {
            return Err(Violation::new(
                Property::AcknowledgedLost,
                format!(
                    "group {}: batch {tag} ({} messages) was acknowledged and is not in the log",
                    group.0, s.messages
                ),
            ));
        }
        (Fate::NeverApplied, Some(_)) => {
            return Err(Violation::new(
                Property::RefusedButApplied,
                format!(
                    "group {}: batch {tag} was only ever refused with nothing changed, yet it is in the log",
                    group.0
                ),
            ));
        }
        (_, Some(parts)) => {
            let whole = parts.len() == s.messages as usize
                && parts.iter().enumerate().all(|(i, (index, offset))| {
                    *index == i as u32 && *offset == parts[0].1 + i as u64
                });
            if !whole {
                return Err(Violation::new(
                    Property::BatchTorn,
                    format!(
                        "group {}: batch {tag} of {} messages is in the log as {parts:?} (index, offset)",
                        group.0, s.messages
                    ),
                ));
            }
        }
        (_, None) => {}
    }
    Ok(())
}

fn not_at_confirmed(tag: u64, index: u32, base: u64, group: GroupId, offset: u64) -> Violation {
    Violation::new(
        Property::NotAtConfirmedOffset,
        format!(
            "group {}: batch {tag} was acknowledged at base offset {base}, yet its message {index} is served at offset {offset}",
            group.0
        ),
    )
}

/// How a consumer-offset store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOutcome {
    /// Committed.
    Acknowledged,
    /// Cut off or indeterminate: it landed before anything sent later, or
    /// not at all.
    Unknown,
    /// Timed out: it may still be waiting and land at any time.
    MayLandLater,
    /// Refused with nothing changed.
    NeverApplied,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn g(n: u64) -> GroupId {
        GroupId(n)
    }

    fn log(tag: u64, messages: u32, base: u64) -> Vec<(u64, Vec<u8>)> {
        (0..messages)
            .map(|i| (base + u64::from(i), payload(tag, i, 5)))
            .collect()
    }

    #[test]
    fn given_payload_when_identified_should_round_trip_and_refuse_any_flip() {
        let p = payload(77, 3, 20);
        assert_eq!(identify(&p), Some((77, 3)));
        for at in 0..p.len() {
            let mut bad = p.clone();
            bad[at] ^= 0x10;
            assert_ne!(identify(&bad), Some((77, 3)), "byte {at}");
        }
        assert_eq!(identify(b"SIM"), None);
    }

    #[test]
    fn given_two_values_at_one_offset_when_observed_should_report_it() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.produced(2, g(5), 2, 0);
        o.polled(g(5), &log(1, 2, 0)).unwrap();
        let v = o.polled(g(5), &log(2, 2, 0)).unwrap_err();
        assert_eq!(v.property, Property::TwoValuesAtOffset);
    }

    #[test]
    fn given_one_value_at_two_offsets_when_observed_should_report_it() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.polled(g(5), &log(1, 2, 0)).unwrap();
        let v = o.polled(g(5), &log(1, 2, 2)).unwrap_err();
        assert_eq!(v.property, Property::ValueAtTwoOffsets);
    }

    #[test]
    fn given_confirmed_base_when_served_elsewhere_should_report_it_either_order() {
        // Acknowledged first, served at another offset later.
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.produced(2, g(5), 1, 0);
        o.acknowledged(1, Some(1)).unwrap();
        o.polled(g(5), &log(2, 1, 0)).unwrap();
        o.polled(g(5), &log(1, 2, 1)).unwrap();
        assert_eq!(o.confirmed(), 1);
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.acknowledged(1, Some(3)).unwrap();
        let v = o.polled(g(5), &log(1, 2, 0)).unwrap_err();
        assert_eq!(v.property, Property::NotAtConfirmedOffset);
        // Served first, acknowledged at another base later.
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.polled(g(5), &log(1, 2, 0)).unwrap();
        let v = o.acknowledged(1, Some(4)).unwrap_err();
        assert_eq!(v.property, Property::NotAtConfirmedOffset);
        // No base named: nothing to check beyond the rest.
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.polled(g(5), &log(1, 2, 7)).unwrap();
        o.acknowledged(1, None).unwrap();
        assert_eq!(o.confirmed(), 0);
    }

    #[test]
    fn given_gap_when_polled_should_report_offsets_not_dense() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 3, 0);
        let mut l = log(1, 3, 0);
        l.remove(1);
        assert_eq!(
            o.polled(g(5), &l).unwrap_err().property,
            Property::OffsetsNotDense
        );
    }

    #[test]
    fn given_acknowledged_batch_missing_when_final_log_checked_should_report_it_lost() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.produced(2, g(5), 2, 0);
        o.settle(1, Fate::Unknown);
        o.settle(2, Fate::Acknowledged);
        // An unknown batch may be absent; the acknowledged one is there.
        o.final_log(g(5), &log(2, 2, 0), None).unwrap();
        let mut o2 = Oracle::default();
        o2.produced(1, g(5), 2, 0);
        o2.settle(1, Fate::Acknowledged);
        assert_eq!(
            o2.final_log(g(5), &[], None).unwrap_err().property,
            Property::AcknowledgedLost
        );
    }

    #[test]
    fn given_refused_batch_present_when_final_log_checked_should_report_it() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 0);
        o.settle(1, Fate::NeverApplied);
        assert_eq!(
            o.final_log(g(5), &log(1, 2, 0), None).unwrap_err().property,
            Property::RefusedButApplied
        );
    }

    #[test]
    fn given_half_a_batch_when_final_log_checked_should_report_it_torn() {
        let mut o = Oracle::default();
        o.produced(1, g(5), 3, 0);
        o.settle(1, Fate::Unknown);
        let mut l = log(1, 3, 0);
        l.pop();
        assert_eq!(
            o.final_log(g(5), &l, None).unwrap_err().property,
            Property::BatchTorn
        );
    }

    #[test]
    fn given_an_expiring_group_when_final_log_starts_late_should_allow_only_expired_batches_gone() {
        // Batch 1 (offsets 0–1) sent at tick 5, batch 2 (2–3) at tick 50,
        // both acknowledged at their bases and served once.
        let setup = || {
            let mut o = Oracle::default();
            o.produced(1, g(5), 2, 5);
            o.produced(2, g(5), 2, 50);
            o.acknowledged(1, Some(0)).unwrap();
            o.acknowledged(2, Some(2)).unwrap();
            o.polled(g(5), &log(1, 2, 0)).unwrap();
            o.polled(g(5), &log(2, 2, 2)).unwrap();
            o
        };
        // Batch 1 expired (sent before tick 10): the log may start at 2.
        setup().final_log(g(5), &log(2, 2, 2), Some(10)).unwrap();
        // Nothing expired yet: the same log lost batch 1.
        assert_eq!(
            setup()
                .final_log(g(5), &log(2, 2, 2), Some(5))
                .unwrap_err()
                .property,
            Property::RemovedBeforeExpiry
        );
        // A topic that expires nothing: the log must start at 0.
        assert_eq!(
            setup()
                .final_log(g(5), &log(2, 2, 2), None)
                .unwrap_err()
                .property,
            Property::OffsetsNotDense
        );
        // Everything removed while batch 2 is too young for it.
        assert_eq!(
            setup().final_log(g(5), &[], Some(10)).unwrap_err().property,
            Property::RemovedBeforeExpiry
        );
        // An acknowledged batch never served, confirmed at or past the
        // start, is lost however old it is.
        let mut o = Oracle::default();
        o.produced(1, g(5), 2, 5);
        o.produced(2, g(5), 2, 5);
        o.acknowledged(1, Some(0)).unwrap();
        o.acknowledged(2, Some(2)).unwrap();
        assert_eq!(
            o.final_log(g(5), &log(1, 2, 0), Some(10))
                .unwrap_err()
                .property,
            Property::AcknowledgedLost
        );
    }

    const C9: Consumer = Consumer {
        kind: ConsumerKind::Consumer,
        id: 9,
    };

    #[test]
    fn given_stores_when_read_back_should_allow_only_what_may_have_landed() {
        let mut o = Oracle::default();
        o.offset_read(g(1), C9, None).unwrap();
        o.store_settled(g(1), C9, Some(4), StoreOutcome::Acknowledged);
        o.offset_read(g(1), C9, Some(4)).unwrap();
        assert_eq!(
            o.offset_read(g(1), C9, None).unwrap_err().property,
            Property::ConsumerOffsetWrong
        );
        o.store_settled(g(1), C9, Some(7), StoreOutcome::Unknown);
        o.offset_read(g(1), C9, Some(7)).unwrap();
        o.store_settled(g(1), C9, Some(2), StoreOutcome::Acknowledged);
        assert!(o.offset_read(g(1), C9, Some(7)).is_err());
        assert!(o.offset_read(g(1), C9, Some(4)).is_err());
        o.offset_read(g(1), C9, Some(2)).unwrap();
    }

    #[test]
    fn given_deletes_when_read_back_should_allow_nothing_only_where_a_delete_may_have_landed() {
        let mut o = Oracle::default();
        o.store_settled(g(1), C9, Some(4), StoreOutcome::Acknowledged);
        o.store_settled(g(1), C9, None, StoreOutcome::Acknowledged);
        o.offset_read(g(1), C9, None).unwrap();
        assert!(o.offset_read(g(1), C9, Some(4)).is_err());
        // A delete cut off may or may not have landed.
        o.store_settled(g(1), C9, Some(5), StoreOutcome::Acknowledged);
        o.store_settled(g(1), C9, None, StoreOutcome::Unknown);
        o.offset_read(g(1), C9, Some(5)).unwrap();
        o.offset_read(g(1), C9, None).unwrap();
        // An acknowledged store after it settles the question.
        o.store_settled(g(1), C9, Some(6), StoreOutcome::Acknowledged);
        assert!(o.offset_read(g(1), C9, None).is_err());
        // A delete that timed out may land at any time, even after.
        o.store_settled(g(1), C9, None, StoreOutcome::MayLandLater);
        o.store_settled(g(1), C9, Some(8), StoreOutcome::Acknowledged);
        o.offset_read(g(1), C9, None).unwrap();
        o.offset_read(g(1), C9, Some(8)).unwrap();
        assert!(o.offset_read(g(1), C9, Some(6)).is_err());
    }

    #[test]
    fn given_a_consumer_and_a_group_of_one_id_when_stored_should_be_kept_apart() {
        let group9 = Consumer {
            kind: ConsumerKind::ConsumerGroup,
            id: 9,
        };
        let mut o = Oracle::default();
        o.store_settled(g(1), C9, Some(4), StoreOutcome::Acknowledged);
        o.offset_read(g(1), group9, None).unwrap();
        assert!(o.offset_read(g(1), group9, Some(4)).is_err());
        o.store_settled(g(1), group9, Some(2), StoreOutcome::Acknowledged);
        o.offset_read(g(1), C9, Some(4)).unwrap();
        o.offset_read(g(1), group9, Some(2)).unwrap();
    }
}
