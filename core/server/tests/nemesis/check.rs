//! The nemesis checker: what the producer's ledger says was sent and
//! confirmed, against what each replica serves from offset 0 of each
//! partition. A plain function over data, so its own tests can feed it
//! crafted histories and count each kind of failure.

use std::collections::{BTreeMap, BTreeSet};

/// One batch the producer sent, as its ledger records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The batch number, in send order (the payloads carry it).
    pub batch: u64,
    /// The partition it was sent to.
    pub partition: u32,
    /// The base offset the confirmation named; `None` when the send
    /// failed, timed out or was answered without a confirmation.
    pub confirmed: Option<u64>,
}

/// The payload of message `index` of batch `batch`.
pub fn payload(batch: u64, index: u32) -> String {
    format!("b{batch:08}-{index}")
}

/// The batch and index a payload names, if it is one of [`payload`]'s.
pub fn parse_payload(text: &str) -> Option<(u64, u32)> {
    let (batch, index) = text.strip_prefix('b')?.split_once('-')?;
    Some((batch.parse().ok()?, index.parse().ok()?))
}

/// What one read of one partition shows against the ledger; each list
/// holds batch numbers (or, for `phantom`, offsets).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Confirmed batches with a message read at no offset at all.
    pub lost: Vec<u64>,
    /// Confirmed batches whose confirmed offsets hold some other message.
    pub reminted: Vec<u64>,
    /// Confirmed batches with a message read at more than one offset.
    pub duplicated_confirmed: Vec<u64>,
    /// Unconfirmed batches with a message read at more than one offset.
    pub duplicated_unconfirmed: Vec<u64>,
    /// Confirmed batches whose base offset is not past that of every
    /// batch confirmed in the partition before it (in send order).
    pub reordered: Vec<u64>,
    /// Offsets missing below the last one read, plus offsets read out of
    /// order or twice: 0 when the offsets run densely from 0.
    pub gaps: u64,
    /// Offsets holding a message this partition was never sent.
    pub phantom: Vec<u64>,
    /// Unconfirmed batches read anyway (allowed: a send can commit after
    /// its client gave up).
    pub unconfirmed_held: u64,
    /// Messages read.
    pub held: u64,
}

/// One read of one partition: (offset, payload) in the order served.
pub type Read = Vec<(u64, String)>;

/// One replica's reads, by partition; `None` when it could not be read.
pub type ReplicaReads = Option<Vec<Read>>;

/// The verdict on one partition over every replica's read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionReport {
    /// The partition.
    pub partition: u32,
    /// Per category, the worst replica's findings.
    pub worst: Findings,
    /// Whether every replica's read was present and identical.
    pub replicas_agree: bool,
}

/// Checks one replica's read of `partition` (offset, payload pairs in the
/// order served) against `ledger`, whose batches hold `batch_len`
/// messages each.
pub fn check_read(
    ledger: &[Sent],
    partition: u32,
    batch_len: u32,
    read: &[(u64, String)],
) -> Findings {
    let sent: BTreeMap<u64, &Sent> = ledger
        .iter()
        .filter(|s| s.partition == partition)
        .map(|s| (s.batch, s))
        .collect();
    let mut findings = Findings {
        held: read.len() as u64,
        ..Findings::default()
    };
    let mut expected = 0u64;
    let mut found: BTreeMap<(u64, u32), Vec<u64>> = BTreeMap::new();
    let mut at: BTreeMap<u64, &str> = BTreeMap::new();
    for (offset, text) in read {
        if *offset > expected {
            findings.gaps += offset - expected;
        } else if *offset < expected {
            findings.gaps += 1;
        }
        expected = expected.max(offset + 1);
        at.entry(*offset).or_insert(text.as_str());
        match parse_payload(text) {
            Some((batch, index)) if index < batch_len && sent.contains_key(&batch) => {
                found.entry((batch, index)).or_default().push(*offset);
            }
            _ => findings.phantom.push(*offset),
        }
    }
    let mut highest_confirmed: Option<u64> = None;
    for (batch, s) in &sent {
        let copies = |index: u32| found.get(&(*batch, index)).map_or(0, Vec::len);
        let duplicated = (0..batch_len).any(|i| copies(i) > 1);
        let Some(base) = s.confirmed else {
            if duplicated {
                findings.duplicated_unconfirmed.push(*batch);
            }
            if (0..batch_len).any(|i| copies(i) > 0) {
                findings.unconfirmed_held += 1;
            }
            continue;
        };
        if duplicated {
            findings.duplicated_confirmed.push(*batch);
        }
        if (0..batch_len).any(|i| copies(i) == 0) {
            findings.lost.push(*batch);
        }
        let want = |i: u32| payload(*batch, i);
        if (0..batch_len).any(|i| {
            at.get(&(base + u64::from(i)))
                .is_some_and(|held| *held != want(i))
        }) {
            findings.reminted.push(*batch);
        }
        if highest_confirmed.is_some_and(|highest| base <= highest) {
            findings.reordered.push(*batch);
        }
        highest_confirmed = highest_confirmed.max(Some(base));
    }
    findings
}

/// Checks every partition in `0..partitions`: `reads[r]` is replica `r`'s
/// read, one list per partition, or `None` when that replica could not
/// be read. The findings kept are each category's worst replica's.
pub fn check(
    ledger: &[Sent],
    partitions: u32,
    batch_len: u32,
    reads: &[ReplicaReads],
) -> Vec<PartitionReport> {
    (0..partitions)
        .map(|partition| {
            let p = partition as usize;
            let per_replica: Vec<Option<&Read>> = reads
                .iter()
                .map(|r| r.as_ref().and_then(|r| r.get(p)))
                .collect();
            let distinct: BTreeSet<Option<&Read>> = per_replica.iter().copied().collect();
            let replicas_agree = distinct.len() == 1 && per_replica.iter().all(Option::is_some);
            let mut worst = Findings::default();
            for read in per_replica.into_iter().flatten() {
                let f = check_read(ledger, partition, batch_len, read);
                let keep = |w: &mut Vec<u64>, f: Vec<u64>| {
                    if f.len() > w.len() {
                        *w = f;
                    }
                };
                keep(&mut worst.lost, f.lost);
                keep(&mut worst.reminted, f.reminted);
                keep(&mut worst.duplicated_confirmed, f.duplicated_confirmed);
                keep(&mut worst.duplicated_unconfirmed, f.duplicated_unconfirmed);
                keep(&mut worst.reordered, f.reordered);
                keep(&mut worst.phantom, f.phantom);
                worst.gaps = worst.gaps.max(f.gaps);
                worst.unconfirmed_held = worst.unconfirmed_held.max(f.unconfirmed_held);
                worst.held = worst.held.max(f.held);
            }
            PartitionReport {
                partition,
                worst,
                replicas_agree,
            }
        })
        .collect()
}

/// The sum over partitions of the worst findings, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub lost: u64,
    pub reminted: u64,
    pub duplicated_confirmed: u64,
    pub duplicated_unconfirmed: u64,
    pub reordered: u64,
    pub gaps: u64,
    pub phantom: u64,
    pub unconfirmed_held: u64,
    pub held: u64,
    pub replicas_agree: bool,
}

/// Adds up `reports`.
pub fn totals(reports: &[PartitionReport]) -> Totals {
    let n = |v: &Vec<u64>| v.len() as u64;
    reports.iter().fold(
        Totals {
            replicas_agree: true,
            ..Totals::default()
        },
        |t, r| Totals {
            lost: t.lost + n(&r.worst.lost),
            reminted: t.reminted + n(&r.worst.reminted),
            duplicated_confirmed: t.duplicated_confirmed + n(&r.worst.duplicated_confirmed),
            duplicated_unconfirmed: t.duplicated_unconfirmed + n(&r.worst.duplicated_unconfirmed),
            reordered: t.reordered + n(&r.worst.reordered),
            gaps: t.gaps + r.worst.gaps,
            phantom: t.phantom + n(&r.worst.phantom),
            unconfirmed_held: t.unconfirmed_held + r.worst.unconfirmed_held,
            held: t.held + r.worst.held,
            replicas_agree: t.replicas_agree && r.replicas_agree,
        },
    )
}
