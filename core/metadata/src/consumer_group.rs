//! Consumer groups: members (one per client session) and the assignment of
//! a topic's partitions to them.
//!
//! # Assignment
//!
//! [`ConsumerGroup::rebalance`] is a pure function of the members, their
//! current partitions and the topic's partition list, so every replica
//! computes the same assignment. It guarantees:
//!
//! - every partition is owned by exactly one member (when there is one);
//! - member counts differ by at most one (`n / m` or `n / m + 1`);
//! - a member that stays keeps `min(owned, quota)` of its partitions: the
//!   `n % m` larger quotas go to the members already holding the most
//!   (ties to the lower member id), each keeps its lowest partitions up to
//!   its quota, and only the freed and unowned partitions move, in
//!   ascending order, to members under quota in member-id order.
//!
//! The generation advances whenever the membership or the assignment
//! changes; SYNC_CONSUMER_GROUP reports it so a client can tell a
//! reassignment from a repeat.

use std::collections::{BTreeMap, BTreeSet};

use common::PartitionId;

/// A consumer group's id within its topic (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ConsumerGroupId(pub u32);

/// A member's id within its group (from 0, never reused in the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemberId(pub u32);

/// A client session, as the login reply numbers it. Membership belongs to
/// the session: when it ends, the session leaves every group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SessionId(pub u64);

/// One member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's id in the group.
    pub id: MemberId,
    /// The session that joined.
    pub session: SessionId,
    /// The partitions assigned to it, ascending.
    pub partitions: Vec<PartitionId>,
}

/// A consumer group of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroup {
    /// The group's id in its topic.
    pub id: ConsumerGroupId,
    /// Its name, unique in the topic.
    pub name: String,
    /// Advances on every change of membership or assignment.
    pub generation: u64,
    /// The next member id to hand out.
    pub next_member_id: u32,
    /// The members by id.
    pub members: BTreeMap<MemberId, Member>,
}

impl ConsumerGroup {
    /// An empty group.
    pub fn new(id: ConsumerGroupId, name: String) -> Self {
        Self {
            id,
            name,
            generation: 0,
            next_member_id: 0,
            members: BTreeMap::new(),
        }
    }

    /// The member the session joined as.
    pub fn member_of(&self, session: SessionId) -> Option<&Member> {
        self.members.values().find(|m| m.session == session)
    }

    /// Adds the session as a member (no-op if it is one) and rebalances.
    /// Returns false if the member id space is exhausted.
    pub(crate) fn join(&mut self, session: SessionId, partitions: &[PartitionId]) -> bool {
        if self.member_of(session).is_some() {
            return true;
        }
        let Some(next) = self.next_member_id.checked_add(1) else {
            return false;
        };
        let id = MemberId(self.next_member_id);
        self.next_member_id = next;
        self.members.insert(
            id,
            Member {
                id,
                session,
                partitions: Vec::new(),
            },
        );
        self.generation += 1;
        self.rebalance(partitions);
        true
    }

    /// Removes the session's membership and rebalances; false if it was not
    /// a member.
    pub(crate) fn leave(&mut self, session: SessionId, partitions: &[PartitionId]) -> bool {
        let Some(id) = self.member_of(session).map(|m| m.id) else {
            return false;
        };
        self.members.remove(&id);
        self.generation += 1;
        self.rebalance(partitions);
        true
    }

    /// Recomputes the assignment over `partitions` (ascending, the topic's
    /// current partitions); advances the generation if anything moved.
    pub(crate) fn rebalance(&mut self, partitions: &[PartitionId]) {
        let next = assign(&self.members, partitions);
        let mut changed = false;
        for (id, owned) in next {
            if let Some(member) = self.members.get_mut(&id)
                && member.partitions != owned
            {
                member.partitions = owned;
                changed = true;
            }
        }
        if changed {
            self.generation += 1;
        }
    }
}

/// The balanced, sticky assignment described in the module documentation.
fn assign(
    members: &BTreeMap<MemberId, Member>,
    partitions: &[PartitionId],
) -> BTreeMap<MemberId, Vec<PartitionId>> {
    let mut out: BTreeMap<MemberId, Vec<PartitionId>> =
        members.keys().map(|id| (*id, Vec::new())).collect();
    if members.is_empty() {
        return out;
    }
    let live: BTreeSet<PartitionId> = partitions.iter().copied().collect();
    let m = members.len();
    let base = live.len() / m;
    let extra = live.len() % m;

    // Larger quotas to those holding the most live partitions now.
    let mut by_holding: Vec<(usize, MemberId)> = members
        .values()
        .map(|mem| {
            let held = mem.partitions.iter().filter(|p| live.contains(p)).count();
            (held, mem.id)
        })
        .collect();
    by_holding.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let quota: BTreeMap<MemberId, usize> = by_holding
        .iter()
        .enumerate()
        .map(|(rank, (_, id))| (*id, base + usize::from(rank < extra)))
        .collect();

    // Keep what each may keep; a partition is kept by one member only even
    // if a corrupt input listed it twice.
    let mut taken: BTreeSet<PartitionId> = BTreeSet::new();
    for mem in members.values() {
        let q = quota.get(&mem.id).copied().unwrap_or(0);
        let kept = out.entry(mem.id).or_default();
        for p in &mem.partitions {
            if kept.len() == q {
                break;
            }
            if live.contains(p) && taken.insert(*p) {
                kept.push(*p);
            }
        }
    }
    // Hand out the rest, ascending, to members under quota.
    let mut free = live.iter().filter(|p| !taken.contains(p));
    for (id, owned) in &mut out {
        let q = quota.get(id).copied().unwrap_or(0);
        while owned.len() < q {
            match free.next() {
                Some(p) => owned.push(*p),
                None => break,
            }
        }
        owned.sort_unstable();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(n: u32) -> Vec<PartitionId> {
        (0..n).map(PartitionId).collect()
    }

    #[test]
    fn given_three_members_and_seven_partitions_when_joined_should_split_3_2_2() {
        let mut g = ConsumerGroup::new(ConsumerGroupId(0), "g".into());
        for s in 0..3 {
            assert!(g.join(SessionId(s), &parts(7)));
        }
        let mut counts: Vec<usize> = g.members.values().map(|m| m.partitions.len()).collect();
        counts.sort_unstable();
        assert_eq!(counts, vec![2, 2, 3]);
    }

    #[test]
    fn given_member_leaves_when_rebalanced_should_keep_the_others_partitions() {
        let mut g = ConsumerGroup::new(ConsumerGroupId(0), "g".into());
        for s in 0..3 {
            g.join(SessionId(s), &parts(6));
        }
        let before: BTreeMap<MemberId, Vec<PartitionId>> = g
            .members
            .values()
            .map(|m| (m.id, m.partitions.clone()))
            .collect();
        assert!(g.leave(SessionId(1), &parts(6)));
        for m in g.members.values() {
            for p in &before[&m.id] {
                assert!(m.partitions.contains(p), "member {:?} lost {p:?}", m.id);
            }
            assert_eq!(m.partitions.len(), 3);
        }
    }
}
