#![allow(clippy::unwrap_used)]

use super::*;
use futures::executor::block_on;
use storage::fs::{CrashMode, SimFs};

fn dir() -> PathBuf {
    PathBuf::from("/p")
}

fn path() -> PathBuf {
    dir().join(REPLICA_LOG_FILE)
}

fn fresh() -> SimFs {
    let fs = SimFs::new(7);
    block_on(async {
        fs.create_dir_all(&dir()).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
    });
    fs
}

/// Prepares 1..=n chained from identity 0, bodies of `op` bytes.
fn chain(n: u64) -> Vec<Prepare> {
    let mut parent = 0;
    (1..=n)
        .map(|op| {
            let body = Bytes::from(vec![op as u8; op as usize]);
            let mut header = PrepareHeader {
                checksum: 0,
                checksum_body: body_checksum(&body),
                parent,
                client: 9,
                request_checksum: 0,
                view: 1,
                op: Op(op),
                commit: Op(op - 1),
                timestamp: op,
                request: op,
                operation: 3,
                group: GroupId(4),
                user_id: 1,
            };
            header.checksum = header.compute_checksum();
            parent = header.checksum;
            Prepare { header, body }
        })
        .collect()
}

/// A journal of ops `from..=to` of `log`, the ops in `headers_only`
/// without their bodies.
fn journal(log: &[Prepare], from: u64, to: u64, headers_only: &[u64], view: u32) -> LoggedJournal {
    LoggedJournal {
        view,
        log_view: view,
        commit: Op(from.saturating_sub(1)),
        cut_head: Op(0),
        visible: true,
        ops: (from..=to)
            .map(|op| {
                let p = &log[op as usize - 1];
                let body = (!headers_only.contains(&op)).then(|| p.clone());
                (p.header, body)
            })
            .collect(),
    }
}

fn open(fs: &SimFs, applied: u64) -> (ReplicaLog<SimFs>, Replayed) {
    open_in(fs, applied, LogMode::SYNCED)
}

fn open_in(fs: &SimFs, applied: u64, mode: LogMode) -> (ReplicaLog<SimFs>, Replayed) {
    block_on(ReplicaLog::open(fs, &path(), applied, mode)).unwrap()
}

#[test]
fn given_records_of_a_changing_journal_when_reopened_should_replay_the_last_journal() {
    let fs = fresh();
    let log = chain(8);
    let (mut w, replayed) = open(&fs, 0);
    assert_eq!(replayed, Replayed::Empty);
    let steps = [
        journal(&log, 1, 3, &[], 1),
        journal(&log, 1, 5, &[4], 1),
        // Op 4's body arrives.
        journal(&log, 1, 5, &[], 1),
        // Ops 1 and 2 applied: no longer in the core's journal, still
        // logged until a boot's applied point passes them; an install cut
        // the log view's log at op 9 before.
        LoggedJournal {
            cut_head: Op(9),
            ..journal(&log, 3, 6, &[], 2)
        },
    ];
    let applied = [0, 0, 0, 2];
    for (step, applied) in steps.iter().zip(applied) {
        // An idle group lets its descriptor go; the next record reopens.
        w.release_handle();
        assert!(!w.holds_handle());
        assert!(block_on(w.record(&fs, step, applied, 0)).unwrap());
        assert!(w.holds_handle());
        assert!(
            !block_on(w.record(&fs, step, applied, 0)).unwrap(),
            "nothing changed: no write"
        );
    }
    let (_, replayed) = open(&fs, 0);
    let mut expected = journal(&log, 1, 6, &[], 2);
    expected.commit = Op(2);
    expected.cut_head = Op(9);
    assert_eq!(replayed, Replayed::Journal(expected));
    let (_, replayed) = open(&fs, 2);
    let mut expected = journal(&log, 3, 6, &[], 2);
    expected.cut_head = Op(9);
    assert_eq!(replayed, Replayed::Journal(expected));
}

#[test]
fn given_a_suffix_replaced_by_a_new_view_when_reopened_should_hold_only_the_new_suffix() {
    let fs = fresh();
    let log = chain(6);
    let (mut w, _) = open(&fs, 0);
    block_on(w.record(&fs, &journal(&log, 1, 6, &[], 1), 0, 0)).unwrap();
    // A new view kept ops up to 3 and knows only 4's header above them.
    let mut new_view = journal(&log, 1, 4, &[4], 2);
    let mut other = log[3].header;
    other.client = 77;
    other.checksum = other.compute_checksum();
    new_view.ops[3] = (other, None);
    block_on(w.record(&fs, &new_view, 0, 0)).unwrap();
    let (_, replayed) = open(&fs, 0);
    assert_eq!(replayed, Replayed::Journal(new_view));
}

#[test]
fn given_an_append_cut_short_when_reopened_should_drop_only_that_record() {
    let fs = fresh();
    let log = chain(4);
    let (mut w, _) = open(&fs, 0);
    let first = journal(&log, 1, 2, &[], 1);
    block_on(w.record(&fs, &first, 0, 0)).unwrap();
    let synced = w.len_bytes();
    block_on(w.record(&fs, &journal(&log, 1, 4, &[], 1), 0, 0)).unwrap();
    let full = fs.contents(&path()).unwrap();
    for cut in [synced + 1, synced + 23, synced + 24, full.len() as u64 - 1] {
        let f = block_on(fs.open(&path(), OpenOptions::read_write())).unwrap();
        block_on(f.set_len(cut)).unwrap();
        block_on(f.sync_data()).unwrap();
        drop(f);
        let (w2, replayed) = open(&fs, 0);
        assert_eq!(replayed, Replayed::Journal(first.clone()), "cut at {cut}");
        assert_eq!(w2.len_bytes(), synced, "the unfinished record is cut off");
        // Put the whole second record back for the next cut.
        let f = block_on(fs.open(&path(), OpenOptions::read_write())).unwrap();
        let BufResult(r, _) = block_on(f.write_all_at(full.clone(), 0));
        r.unwrap();
        block_on(f.sync_data()).unwrap();
    }
}

#[test]
fn given_a_flipped_bit_anywhere_when_reopened_should_vouch_for_nothing_and_start_empty() {
    let log = chain(3);
    let fs = fresh();
    let (mut w, _) = open(&fs, 0);
    block_on(w.record(&fs, &journal(&log, 1, 2, &[], 1), 0, 0)).unwrap();
    block_on(w.record(&fs, &journal(&log, 1, 3, &[2], 1), 0, 0)).unwrap();
    let good = fs.contents(&path()).unwrap();
    for pos in 0..good.len() as u64 {
        let fs = fresh();
        let f = block_on(fs.open(&path(), OpenOptions::create_read_write())).unwrap();
        let BufResult(r, _) = block_on(f.write_all_at(good.clone(), 0));
        r.unwrap();
        block_on(f.sync_data()).unwrap();
        drop(f);
        fs.rot_byte(&path(), pos, 0x10).unwrap();
        let (w, replayed) = open(&fs, 0);
        assert!(
            matches!(replayed, Replayed::Damaged { .. }),
            "flip at {pos}: {replayed:?}"
        );
        assert_eq!(
            w.len_bytes(),
            0,
            "flip at {pos}: the damaged log is emptied"
        );
        assert!(fs.contents(&path()).unwrap().is_empty());
        let (_, again) = open(&fs, 0);
        assert_eq!(again, Replayed::Empty, "flip at {pos}");
    }
}

#[test]
fn given_a_log_past_the_compaction_size_when_rewritten_should_keep_only_what_a_boot_needs() {
    let fs = fresh();
    // 64 KiB bodies: the log passes COMPACT_BYTES after ~256 ops.
    let mut parent = 0;
    let big: Vec<Prepare> = (1..=400u64)
        .map(|op| {
            let body = Bytes::from(vec![op as u8; 64 * 1024]);
            let mut header = chain(1)[0].header;
            header.op = Op(op);
            header.parent = parent;
            header.checksum_body = body_checksum(&body);
            header.checksum = header.compute_checksum();
            parent = header.checksum;
            Prepare { header, body }
        })
        .collect();
    let (mut w, _) = open(&fs, 0);
    for op in 1..=400u64 {
        // Each op is journaled, then applied and recorded two ops later.
        let applied = op.saturating_sub(1);
        let recorded = op.saturating_sub(3);
        let step = journal(&big, applied + 1, op, &[], 1);
        block_on(w.record(&fs, &step, applied, recorded)).unwrap();
        assert!(
            w.len_bytes() <= COMPACT_BYTES + 70 * 1024,
            "op {op}: {} bytes",
            w.len_bytes()
        );
    }
    let (_, replayed) = open(&fs, 397);
    let mut expected = journal(&big, 398, 400, &[], 1);
    expected.commit = Op(399);
    assert_eq!(replayed, Replayed::Journal(expected));
    // Ops above the recorded point but already applied survived compaction.
    let (_, replayed) = open(&fs, 396);
    let Replayed::Journal(j) = replayed else {
        panic!("the log vouches for nothing")
    };
    assert_eq!(j.ops.first().map(|(h, _)| h.op), Some(Op(397)));
}

#[test]
fn given_a_power_loss_mid_record_when_reopened_should_describe_a_synced_journal() {
    let log = chain(6);
    for seed in 0..64u64 {
        let fs = SimFs::new(seed);
        block_on(async {
            fs.create_dir_all(&dir()).await.unwrap();
            fs.sync_dir(Path::new("/")).await.unwrap();
        });
        let (mut w, _) = open(&fs, 0);
        let mut synced = Vec::new();
        for to in 1..=6u64 {
            let step = journal(&log, 1, to, &[], 1);
            if to == 6 {
                // The last record is written but the power goes before
                // its sync completes.
                fs.cut_power_after(1);
                let _ = block_on(w.record(&fs, &step, 0, 0));
            } else {
                block_on(w.record(&fs, &step, 0, 0)).unwrap();
                synced.push(step);
            }
        }
        fs.crash_with(CrashMode::Seeded);
        let (_, replayed) = open(&fs, 0);
        match replayed {
            Replayed::Journal(j) => assert!(
                j == journal(&log, 1, 6, &[], 1) || synced.last() == Some(&j),
                "seed {seed}: {j:?}"
            ),
            Replayed::Damaged { .. } => {}
            Replayed::Empty | Replayed::Stale { .. } => {
                panic!("seed {seed}: synced records lost: {replayed:?}")
            }
        }
    }
}

#[test]
fn given_a_withdrawn_log_when_reopened_should_vouch_for_nothing_until_the_next_record() {
    let fs = fresh();
    let log = chain(4);
    let (mut w, _) = open(&fs, 0);
    let step = journal(&log, 1, 3, &[], 1);
    block_on(w.record(&fs, &step, 0, 0)).unwrap();
    block_on(w.withdraw(&fs)).unwrap();
    let (mut w, replayed) = open(&fs, 0);
    let Replayed::Journal(j) = replayed else {
        panic!("a withdrawn log still describes its journal")
    };
    assert!(!j.visible, "a withdrawn log vouches for nothing");
    assert_eq!(j.ops, step.ops, "the ops stay for the record that follows");
    // An install moved the applied point to op 2 of another history: the
    // next record drops the ops above it and vouches again.
    let after = journal(&log, 3, 2, &[], 1);
    assert!(block_on(w.record(&fs, &after, 2, 2)).unwrap());
    let (_, replayed) = open(&fs, 2);
    let Replayed::Journal(j) = replayed else {
        panic!("the log vouches for nothing after the next record")
    };
    assert!(j.visible && j.ops.is_empty(), "{j:?}");
}

#[test]
fn given_kept_records_when_the_process_dies_should_replay_them_in_the_same_machine_boot() {
    let fs = fresh();
    let log = chain(5);
    let boot = LogMode::kept(0xb007);
    let (mut w, _) = open_in(&fs, 0, boot);
    for to in 1..=5u64 {
        block_on(w.record(&fs, &journal(&log, 1, to, &[], 1), 0, 0)).unwrap();
    }
    assert_eq!(w.syncs(), 0, "kept records are not synced");
    // A kill -9: every page written survives.
    fs.crash_with(CrashMode::KeepAll);
    let (_, replayed) = open_in(&fs, 0, boot);
    assert_eq!(replayed, Replayed::Journal(journal(&log, 1, 5, &[], 1)));
}

#[test]
fn given_kept_records_when_the_machine_restarted_should_vouch_for_nothing_and_start_empty() {
    let log = chain(5);
    for crash in [CrashMode::KeepAll, CrashMode::Seeded, CrashMode::DropAll] {
        let fs = fresh();
        let (mut w, _) = open_in(&fs, 0, LogMode::kept(0xb007));
        for to in 1..=5u64 {
            block_on(w.record(&fs, &journal(&log, 1, to, &[], 1), 0, 0)).unwrap();
        }
        fs.crash_with(crash);
        // Another boot: whatever survived may miss any unsynced page.
        let (_, replayed) = open_in(&fs, 0, LogMode::kept(0xb008));
        assert!(
            matches!(
                replayed,
                Replayed::Stale {
                    written: 0xb007,
                    now: 0xb008
                } | Replayed::Empty
            ),
            "{crash:?}: {replayed:?}"
        );
        // Started again empty: nothing later builds on the stale records.
        let (_, replayed) = open_in(&fs, 0, LogMode::kept(0xb008));
        assert_eq!(replayed, Replayed::Empty, "{crash:?}");
    }
    // An unknown boot (tag 0) never vouches, even for itself.
    let fs = fresh();
    let (mut w, _) = open_in(&fs, 0, LogMode::kept(0));
    block_on(w.record(&fs, &journal(&log, 1, 2, &[], 1), 0, 0)).unwrap();
    let (_, replayed) = open_in(&fs, 0, LogMode::kept(0));
    assert!(matches!(replayed, Replayed::Stale { written: 0, .. }));
}

#[test]
fn given_a_kept_record_after_synced_ones_when_read_by_a_synced_log_of_another_boot_should_vouch_for_nothing()
 {
    let fs = fresh();
    let log = chain(3);
    let (mut w, _) = open(&fs, 0);
    block_on(w.record(&fs, &journal(&log, 1, 2, &[], 1), 0, 0)).unwrap();
    drop(w);
    let (mut w, _) = open_in(&fs, 0, LogMode::kept(5));
    block_on(w.record(&fs, &journal(&log, 1, 3, &[], 1), 0, 0)).unwrap();
    let (_, replayed) = open_in(
        &fs,
        0,
        LogMode {
            sync: true,
            boot_tag: 6,
        },
    );
    assert!(matches!(replayed, Replayed::Stale { written: 5, now: 6 }));
}

#[test]
fn given_boot_ids_should_tag_them_apart_and_never_zero() {
    assert_eq!(boot_tag_of(""), 0);
    assert_eq!(boot_tag_of(" \n"), 0);
    let a = boot_tag_of("6c1a3e0e-3f2d-4c8e-9a55-0f4c1b9d2e71\n");
    assert_ne!(a, 0);
    assert_eq!(a, boot_tag_of("6c1a3e0e-3f2d-4c8e-9a55-0f4c1b9d2e71"));
    assert_ne!(a, boot_tag_of("6c1a3e0e-3f2d-4c8e-9a55-0f4c1b9d2e72"));
}
