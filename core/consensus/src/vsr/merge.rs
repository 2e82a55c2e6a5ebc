//! The DoViewChange merge: from a quorum of votes, the log the new view
//! starts with.
//!
//! The rule (reference/consensus.md §11.2, Viewstamped Replication
//! Revisited §4.2): the senders with the highest `log_view` are canonical;
//! their logs are prefixes of one log, so the new head is the highest
//! canonical op. An op above the commit point may be dropped only with
//! proof that it cannot have committed: a nack quorum, sized so that it can
//! never coexist with a replication quorum for the same op. Silence, a blank
//! slot or a disagreement is never proof; when the merge cannot decide it
//! waits (`AwaitingRepair`) or reports `Deadlocked`, and never drops an op
//! that might have committed.

use std::collections::BTreeMap;

use common::Op;

use super::message::{DoViewChange, PrepareHeader, SuffixSlot};

/// Headers carried in one DoViewChange/StartView suffix (one bit each in
/// the `u128` bitsets).
pub const DVC_HEADERS_MAX: usize = 128;

/// Replica counts and quorum sizes for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorums {
    /// Replicas in the group.
    pub replica_count: u8,
    /// Acks (including the primary's own) that commit an op.
    pub replication: usize,
    /// DoViewChange votes (including the candidate's) that start a view.
    pub view_change: usize,
    /// Nacks that prove an op never committed.
    pub nack_prepare: usize,
}

impl Quorums {
    /// Reference §8.3: replication = 2 for n = 2 else min(⌈n/2⌉, 3); view
    /// change = 2 for n = 2 else n − replication + 1; nack = n − replication
    /// + 1 (a nack quorum and a replication quorum always intersect).
    pub fn new(replica_count: u8) -> Self {
        let n = usize::from(replica_count.max(1));
        let replication = if n == 2 { 2 } else { n.div_ceil(2).min(3) };
        let view_change = if n == 2 { 2 } else { n - replication + 1 };
        Self {
            replica_count: replica_count.max(1),
            replication,
            view_change,
            nack_prepare: n - replication + 1,
        }
    }

    /// Faulty replicas tolerated: ⌊(n − 1)/2⌋.
    pub fn max_faulty(&self) -> usize {
        (usize::from(self.replica_count) - 1) / 2
    }
}

/// The log a view change settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedLog {
    /// The new head.
    pub op_head: Op,
    /// The highest op any voter knew committed.
    pub commit_max: Op,
    /// Canonical headers, high to low, from `op_head` down to the commit
    /// point (including the committed op's header when a voter knew it).
    pub headers: Vec<PrepareHeader>,
    /// Per op above `commit_max`: bit `r` set when replica `r` offered its
    /// body.
    pub holders: BTreeMap<u64, u32>,
}

/// Why a merge cannot produce a log yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeStall {
    /// Fewer votes than the view-change quorum.
    AwaitingQuorum,
    /// Some op is undecidable with the votes so far; more may settle it.
    AwaitingRepair {
        /// The undecidable op.
        op: Op,
    },
    /// Every replica voted and an op is still undecidable, or the votes
    /// contradict each other: the view cannot start safely.
    Deadlocked {
        /// The op at which the merge gave up.
        op: Op,
    },
}

/// A vote the merge works on: the sender and its DoViewChange.
pub type Vote<'a> = (u8, &'a DoViewChange);

fn slot(dvc: &DoViewChange, op: u64) -> Option<(usize, &SuffixSlot)> {
    let i = usize::try_from(dvc.op.0.checked_sub(op)?).ok()?;
    dvc.suffix.get(i).map(|s| (i, s))
}

fn header_at(dvc: &DoViewChange, op: u64) -> Option<PrepareHeader> {
    match slot(dvc, op)? {
        (_, SuffixSlot::Header(h)) => Some(*h),
        (_, SuffixSlot::Blank) => None,
    }
}

fn bit(set: u128, i: usize) -> bool {
    i < 128 && set & (1u128 << i) != 0
}

/// Whether `d` proves by its own vote that it never acknowledged `op`:
/// its log ends below it, or it nacks it.
fn nacked(d: &DoViewChange, op: u64) -> bool {
    d.op.0 < op || slot(d, op).is_some_and(|(i, _)| bit(d.nack_bitset, i))
}

/// An op no canonical voter names (a blank, and nothing canonical above
/// it) that lower log views agree on. The canonical op is either that
/// header, or another one which every holder of it never acknowledged
/// (a lower log view's different header is a nack, as below); when those
/// holders and the explicit nacks reach the nack quorum, the other one
/// cannot have committed, and keeping the agreed header is safe in both
/// cases. Voters holding different older headers leave it undecided.
fn older_header_safe_to_keep(
    votes: &[Vote<'_>],
    op: u64,
    log_view: u32,
    quorums: Quorums,
) -> Option<PrepareHeader> {
    let mut agreed: Option<PrepareHeader> = None;
    let mut nacks = 0;
    for (_, d) in votes {
        if nacked(d, op) {
            nacks += 1;
            continue;
        }
        if d.log_view >= log_view {
            continue;
        }
        let Some(h) = header_at(d, op) else {
            continue;
        };
        match agreed {
            Some(a) if a.checksum != h.checksum => return None,
            _ => agreed = Some(h),
        }
        nacks += 1;
    }
    agreed.filter(|_| nacks >= quorums.nack_prepare)
}

/// Merge the votes into the new view's log.
pub fn merge(votes: &[Vote<'_>], quorums: Quorums) -> Result<MergedLog, MergeStall> {
    if votes.len() < quorums.view_change {
        return Err(MergeStall::AwaitingQuorum);
    }
    let all_voted = votes.len() >= usize::from(quorums.replica_count);
    let stall = |op| {
        if all_voted {
            MergeStall::Deadlocked { op }
        } else {
            MergeStall::AwaitingRepair { op }
        }
    };
    let log_view = votes.iter().map(|(_, d)| d.log_view).max().unwrap_or(0);
    let canonical: Vec<&DoViewChange> = votes
        .iter()
        .filter(|(_, d)| d.log_view == log_view)
        .map(|(_, d)| *d)
        .collect();
    let mut commit_max = 0;
    for (_, d) in votes {
        commit_max = commit_max.max(d.commit.0);
        if let Some(h) = header_at(d, d.op.0) {
            commit_max = commit_max.max(h.commit.0.min(d.op.0));
        }
    }
    let op_canonical = canonical.iter().map(|d| d.op.0).max().unwrap_or(0);
    let mut op_head = op_canonical.max(commit_max);
    let mut headers: BTreeMap<u64, PrepareHeader> = BTreeMap::new();
    let mut holders = BTreeMap::new();

    let mut op = commit_max + 1;
    while op <= op_head {
        let mut chosen: Option<PrepareHeader> = None;
        let mut conflict = false;
        for d in &canonical {
            if let Some(h) = header_at(d, op) {
                match chosen {
                    Some(c) if c.checksum != h.checksum => conflict = true,
                    Some(_) => {}
                    None => chosen = Some(h),
                }
            }
        }
        // When no canonical voter holds the op's header, the header above
        // it still names it: its parent is the canonical op's checksum,
        // and a voter of any log view holding that header has the op.
        let mut named = chosen.map(|c| c.checksum).or_else(|| {
            canonical
                .iter()
                .find_map(|d| header_at(d, op + 1))
                .map(|h| h.parent)
        });
        if named.is_none()
            && let Some(h) = older_header_safe_to_keep(votes, op, log_view, quorums)
        {
            chosen = Some(h);
            named = Some(h.checksum);
        }
        if chosen.is_none()
            && let Some(parent) = named
        {
            chosen = votes
                .iter()
                .find_map(|(_, d)| header_at(d, op).filter(|h| h.checksum == parent));
        }
        let mut nacks = 0;
        let mut copies = 0u32;
        for (replica, d) in votes {
            if d.op.0 < op {
                nacks += 1;
                continue;
            }
            let Some((i, s)) = slot(d, op) else {
                continue; // does not cover the op: abstains
            };
            if bit(d.nack_bitset, i) {
                nacks += 1;
                continue;
            }
            let SuffixSlot::Header(h) = s else {
                continue; // a blank proves nothing
            };
            if named == Some(h.checksum) {
                if bit(d.present_bitset, i) {
                    copies |= 1u32 << replica;
                }
            } else if d.log_view < log_view && named.is_some() {
                // A lower log view's different header proves it acked
                // another op here. When nothing names the canonical op (a
                // blank with a blank or nothing above it), a lower log
                // view's header may be the committed one: it abstains.
                nacks += 1;
            }
        }
        if nacks >= quorums.nack_prepare {
            op_head = op - 1;
            break;
        }
        match chosen {
            Some(h) if !conflict && copies != 0 => {
                headers.insert(op, h);
                holders.insert(op, copies);
            }
            _ => return Err(stall(Op(op))),
        }
        op += 1;
    }
    // The committed op's header anchors the chain below the new ops. Only a
    // canonical sender, or one that knows the op committed, may supply it:
    // a lower log_view may hold a different, never-committed op there.
    let anchor = canonical
        .iter()
        .find_map(|d| header_at(d, commit_max))
        .or_else(|| {
            votes
                .iter()
                .filter(|(_, d)| d.commit.0 >= commit_max)
                .find_map(|(_, d)| header_at(d, commit_max))
        });
    if let Some(h) = anchor {
        headers.insert(commit_max, h);
    }
    if op_head < commit_max {
        return Err(MergeStall::Deadlocked {
            op: Op(op_head + 1),
        });
    }
    headers.retain(|op, _| *op <= op_head);
    let mut previous: Option<&PrepareHeader> = None;
    for h in headers.values() {
        if let Some(p) = previous
            && p.op.0 + 1 == h.op.0
            && h.parent != p.checksum
        {
            return Err(MergeStall::Deadlocked { op: h.op });
        }
        previous = Some(h);
    }
    Ok(MergedLog {
        op_head: Op(op_head),
        commit_max: Op(commit_max),
        headers: headers.into_values().rev().collect(),
        holders,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use common::{GroupId, Op};

    fn header(op: u64, parent: u128, salt: u64) -> PrepareHeader {
        let mut h = PrepareHeader {
            checksum: 0,
            checksum_body: 0,
            parent,
            client: 1,
            request_checksum: 0,
            view: 0,
            op: Op(op),
            commit: Op(0),
            timestamp: op * 10 + salt,
            request: op,
            operation: 3,
            group: GroupId(0),
            user_id: 0,
        };
        h.checksum = h.compute_checksum();
        h
    }

    fn log(n: u64, salt: u64) -> Vec<PrepareHeader> {
        let mut parent = 0;
        (1..=n)
            .map(|op| {
                let h = header(op, parent, salt);
                parent = h.checksum;
                h
            })
            .collect()
    }

    fn dvc(log: &[PrepareHeader], log_view: u32, commit: u64) -> DoViewChange {
        let op = log.len() as u64;
        let suffix: Vec<SuffixSlot> = log
            .iter()
            .rev()
            .take_while(|h| h.op.0 >= commit.max(1))
            .map(|h| SuffixSlot::Header(*h))
            .collect();
        let present = if suffix.len() >= 128 {
            u128::MAX
        } else {
            (1u128 << suffix.len()) - 1
        };
        DoViewChange {
            log_view,
            op: Op(op),
            commit: Op(commit),
            suffix,
            nack_bitset: 0,
            present_bitset: present,
        }
    }

    #[test]
    fn given_higher_log_view_when_merged_should_win_over_longer_log() {
        let old = log(6, 1);
        let new = log(4, 2);
        let a = dvc(&old, 1, 0);
        let b = dvc(&new, 2, 0);
        let merged = merge(&[(0, &a), (1, &b)], Quorums::new(3)).unwrap();
        assert_eq!(merged.op_head, Op(4));
        assert_eq!(merged.headers[0].checksum, new[3].checksum);
    }

    #[test]
    fn given_op_held_by_one_canonical_sender_when_merged_should_keep_it() {
        let l = log(5, 0);
        let a = dvc(&l, 1, 2);
        let b = dvc(&l[..3], 1, 2);
        let merged = merge(&[(0, &a), (1, &b)], Quorums::new(3)).unwrap();
        assert_eq!(
            merged.op_head,
            Op(5),
            "silence from the shorter log is no proof"
        );
    }

    #[test]
    fn given_nack_quorum_when_merged_should_truncate() {
        let l = log(5, 0);
        let a = dvc(&l, 1, 2);
        let b = dvc(&l[..3], 1, 2);
        let c = dvc(&l[..3], 1, 2);
        let mut a_blank = a.clone();
        a_blank.present_bitset = 0b1100; // ops 5 and 4 have no body anywhere
        let merged = merge(&[(0, &a_blank), (1, &b), (2, &c)], Quorums::new(3));
        // n = 3: nack quorum is 2, and b and c both end at 3.
        assert_eq!(merged.unwrap().op_head, Op(3));
    }

    #[test]
    fn given_missing_body_and_no_proof_when_merged_should_await() {
        let l = log(5, 0);
        let mut a = dvc(&l, 1, 2);
        a.present_bitset = 0b1110; // op 5's body missing
        let b = dvc(&l[..4], 1, 2);
        assert_eq!(
            merge(&[(0, &a), (1, &b)], Quorums::new(3)),
            Err(MergeStall::AwaitingRepair { op: Op(5) })
        );
    }

    /// The canonical voter lost op 4's header but holds op 5, whose parent
    /// names op 4; a lower log view's different op 4 is then a nack.
    #[test]
    fn given_canonical_blank_named_by_the_op_above_when_older_op_differs_should_truncate() {
        let common = log(3, 0);
        let mut canonical = common.clone();
        let mut parent = common[2].checksum;
        for op in 4..=5 {
            let h = header(op, parent, 7);
            parent = h.checksum;
            canonical.push(h);
        }
        let mut older = common.clone();
        older.push(header(4, common[2].checksum, 9));
        let mut a = dvc(&canonical, 2, 3);
        a.suffix[1] = SuffixSlot::Blank; // op 4
        a.present_bitset = 0b01; // op 5's body only
        a.nack_bitset = 0b11; // above its contiguous journal
        let b = dvc(&older, 1, 3);
        let merged = merge(&[(0, &a), (1, &b)], Quorums::new(3)).unwrap();
        assert_eq!(merged.op_head, Op(3), "op 4 never committed: truncated");
    }

    /// As above, but the lower log view holds the op the one above names:
    /// it supplies the header and the body.
    #[test]
    fn given_canonical_blank_named_by_the_op_above_when_older_op_matches_should_keep_it() {
        let l = log(5, 0);
        let mut a = dvc(&l, 2, 3);
        a.suffix[1] = SuffixSlot::Blank; // op 4
        a.present_bitset = 0b01;
        let b = dvc(&l[..4], 1, 3);
        let merged = merge(&[(0, &a), (1, &b)], Quorums::new(3)).unwrap();
        assert_eq!(merged.op_head, Op(5));
        assert_eq!(merged.holders[&4], 0b10);
        assert_eq!(merged.headers[1].checksum, l[3].checksum);
    }

    /// Nothing canonical names op 4 (the canonical voter's log was cut
    /// there), two lower log views agree on it and hold its body, and with
    /// the canonical nack they reach the nack quorum of five: whichever op
    /// the canonical log had, keeping theirs is safe.
    #[test]
    fn given_unnamed_op_when_lower_log_views_agree_with_nack_quorum_should_keep_theirs() {
        let l = log(4, 0);
        let mut a = dvc(&l, 2, 3);
        a.suffix[0] = SuffixSlot::Blank;
        a.present_bitset = 0;
        a.nack_bitset = 0b01;
        let b = dvc(&l, 0, 3);
        let c = dvc(&l, 0, 3);
        let merged = merge(&[(0, &a), (1, &b), (2, &c)], Quorums::new(5)).unwrap();
        assert_eq!(merged.op_head, Op(4));
        assert_eq!(merged.holders[&4], 0b110);
        // One lower voter alone is not enough proof: it waits.
        let other = log(4, 5);
        let c = dvc(&other, 0, 3);
        assert!(merge(&[(0, &a), (1, &b), (2, &c)], Quorums::new(5)).is_err());
    }

    #[test]
    fn given_quorum_sizes_should_match_reference() {
        let q = Quorums::new(3);
        assert_eq!((q.replication, q.view_change, q.nack_prepare), (2, 2, 2));
        let q = Quorums::new(5);
        assert_eq!((q.replication, q.view_change, q.nack_prepare), (3, 3, 3));
        let q = Quorums::new(1);
        assert_eq!((q.replication, q.view_change, q.nack_prepare), (1, 1, 1));
    }
}
