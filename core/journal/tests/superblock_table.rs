//! The shard's superblock table under batching, crashes, faults, torn
//! writes and bit rot, on the simulated filesystem: every group reads its
//! previous or its new record after a reboot, never another's, never
//! garbage, and never "no record" once its write returned.
#![allow(clippy::unwrap_used)]

use common::{GroupId, Offset, Op, ReplicaId};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures::executor::block_on;
use futures::future::join_all;
use journal::{
    SuperblockError, SuperblockStore, SuperblockTable, TABLE_NAMES, TableKey, TableSuperblock,
    VsrState,
};
use storage::fs::{CrashMode, EIO, ENOSPC, FaultKind, Fs, SimFs};

fn dir() -> PathBuf {
    PathBuf::from("/shard")
}

fn key(group: u64) -> TableKey {
    TableKey {
        group: GroupId(group),
        incarnation: group * 10 + 1,
    }
}

fn state(group: u64, n: u32) -> VsrState {
    VsrState {
        cluster: 0xC1,
        replica_id: ReplicaId(2),
        replica_count: 3,
        view: n,
        log_view: n,
        commit_max: Op(u64::from(n) * 10 + group),
        checkpoint_op: Op(group),
        checkpoint_checksum: u128::from(group),
        offset_frontier: Offset(u64::from(n) * 1000),
    }
}

fn fresh(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(&dir()).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
    });
    fs
}

fn open(fs: &SimFs) -> Result<Rc<SuperblockTable<SimFs>>, SuperblockError> {
    block_on(SuperblockTable::open(fs.clone(), &dir())).map(Rc::new)
}

/// Writes, for every group in `groups`, states 1..=n, each returning.
fn write_states(fs: &SimFs, groups: &[u64], n: u32) {
    let table = open(fs).unwrap();
    block_on(async {
        for i in 1..=n {
            for g in groups {
                table.write(key(*g), &state(*g, i)).await.unwrap();
            }
        }
    });
}

#[test]
fn given_writers_of_one_step_when_batched_should_write_each_copy_once() {
    let fs = fresh(1);
    fs.set_yielding(true);
    let table = open(&fs).unwrap();
    let groups: Vec<u64> = (1..=300).collect();
    let calls_before = fs.total_calls();
    let next: Vec<_> = groups.iter().map(|g| (*g, state(*g, 1))).collect();
    let results = block_on(join_all(next.iter().map(|(g, s)| table.write(key(*g), s))));
    assert!(results.iter().all(Result::is_ok));
    let stats = table.stats();
    assert_eq!((stats.batches, stats.batch_max), (1, 300), "{stats:?}");
    // One write of the 300 adjacent slots and one sync, per copy.
    assert_eq!(fs.total_calls() - calls_before, 4);
    // A second step's writers: the next views, and a free among them.
    let next: Vec<_> = groups
        .iter()
        .filter(|g| **g != 7)
        .map(|g| (*g, state(*g, 2)))
        .collect();
    let results = block_on(join_all(next.iter().map(|(g, s)| table.write(key(*g), s))));
    assert!(results.iter().all(Result::is_ok));
    block_on(table.free(key(7))).unwrap();
    drop(table);
    fs.crash_with(CrashMode::DropAll);
    let table = open(&fs).unwrap();
    assert_eq!(table.keys().len(), 299);
    for g in groups {
        let want = (g != 7).then(|| state(g, 2));
        assert_eq!(table.state(key(g)), want, "group {g}");
    }
}

/// Every fault one batch can meet: each kind of call at each of its first
/// positions, and torn writes of each copy.
type ArmFault = Box<dyn Fn(&SimFs)>;

fn faults() -> Vec<ArmFault> {
    let mut out: Vec<ArmFault> = vec![Box::new(|_| {})];
    for kind in [FaultKind::Write, FaultKind::Sync] {
        for nth in 1..=4 {
            for errno in [EIO, ENOSPC] {
                out.push(Box::new(move |fs: &SimFs| fs.fail_nth(kind, nth, errno)));
            }
        }
    }
    for nth in 1..=4 {
        for keep in [0, 1, 100, 127, 128, 200, 300] {
            out.push(Box::new(move |fs: &SimFs| fs.tear_nth_write(nth, keep)));
        }
    }
    out
}

#[test]
fn given_a_fault_at_any_step_of_a_batch_then_a_crash_when_rebooted_each_group_should_read_old_or_new()
 {
    let mut cases = 0;
    // Groups 1..=3 rewrite, 4 is freed, 5 is new, 6 stays as it was.
    for (f, fault) in faults().iter().enumerate() {
        for seed in 0..8u64 {
            for mode in [CrashMode::Seeded, CrashMode::KeepAll, CrashMode::DropAll] {
                let fs = fresh(seed * 1000 + f as u64);
                write_states(&fs, &[1, 2, 3, 4, 6], 2);
                fs.set_yielding(true);
                let table = open(&fs).unwrap();
                fault(&fs);
                let next = [1, 2, 3, 5].map(|g| (g, state(g, 3)));
                let (writes, freed) = block_on(async {
                    let writes = join_all(next.iter().map(|(g, s)| table.write(key(*g), s)));
                    futures::join!(writes, table.free(key(4)))
                });
                fs.clear_faults();
                drop(table);
                fs.crash_with(mode);
                let what = format!("fault {f} seed {seed} {mode:?}");
                let table = open(&fs).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(table.lost(), 0, "{what}");
                for (g, result) in [1, 2, 3, 5].into_iter().zip(&writes) {
                    let got = table.state(key(g)).map(|s| s.view);
                    let old = (g != 5).then_some(2);
                    if result.is_ok() {
                        assert_eq!(got, Some(3), "{what}: group {g} lost its record");
                    } else {
                        assert!(
                            got == old || got == Some(3),
                            "{what}: group {g} read {got:?}"
                        );
                    }
                    if let Some(s) = table.state(key(g)) {
                        assert_eq!(s, state(g, s.view), "{what}: group {g}");
                    }
                }
                let four = table.state(key(4)).map(|s| s.view);
                if freed.is_ok() {
                    assert_eq!(four, None, "{what}: a freed record came back");
                } else {
                    assert!(matches!(four, None | Some(2)), "{what}: {four:?}");
                }
                assert_eq!(table.state(key(6)), Some(state(6, 2)), "{what}");
                // Whatever the crash left, the table takes new records.
                block_on(table.write(key(8), &state(8, 1))).unwrap();
                cases += 1;
            }
        }
    }
    assert!(cases > 1000, "{cases}");
}

#[test]
fn given_a_failed_batch_when_retried_should_complete_and_survive_a_crash() {
    let fs = fresh(3);
    write_states(&fs, &[1, 2], 1);
    fs.set_yielding(true);
    let table = open(&fs).unwrap();
    fs.fail_nth(FaultKind::Sync, 2, EIO);
    let next = [1, 2].map(|g| (g, state(g, 2)));
    let results = block_on(join_all(next.iter().map(|(g, s)| table.write(key(*g), s))));
    // One batch carried both: both saw its failure.
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert_eq!(table.stats().failed, 1);
    let next = [1, 2].map(|g| (g, state(g, 3)));
    let results = block_on(join_all(next.iter().map(|(g, s)| table.write(key(*g), s))));
    assert!(results.iter().all(Result::is_ok));
    drop(table);
    fs.crash_with(CrashMode::DropAll);
    let table = open(&fs).unwrap();
    assert_eq!(table.state(key(1)), Some(state(1, 3)));
    assert_eq!(table.state(key(2)), Some(state(2, 3)));
}

#[test]
fn given_one_rotted_copy_when_read_should_use_the_other_and_the_next_write_repairs() {
    for name in TABLE_NAMES {
        let fs = fresh(5);
        write_states(&fs, &[1, 2, 3], 4);
        // Slot 1 (group 2): a flipped bit in its payload.
        fs.rot_byte(&dir().join(name), 128 + 40, 0x10).unwrap();
        let table = open(&fs).unwrap();
        assert_eq!(table.lost(), 0);
        assert_eq!(table.state(key(2)), Some(state(2, 4)), "{name} rotted");
        block_on(table.write(key(2), &state(2, 5))).unwrap();
        drop(table);
        // The other copy rots now: the repaired one answers.
        let other = TABLE_NAMES.iter().find(|n| **n != name).unwrap();
        fs.rot_byte(&dir().join(other), 128 + 40, 0x10).unwrap();
        let table = open(&fs).unwrap();
        assert_eq!(
            table.state(key(2)),
            Some(state(2, 5)),
            "{name} then {other}"
        );
    }
}

#[test]
fn given_both_copies_of_a_slot_rotted_when_opened_should_refuse_the_groups_that_existed() {
    let fs = fresh(6);
    write_states(&fs, &[1, 2, 3], 2);
    for name in TABLE_NAMES {
        fs.rot_byte(&dir().join(name), 128 + 40, 0x10).unwrap();
    }
    let table = open(&fs).unwrap();
    assert_eq!(table.lost(), 1);
    // Group 2's record is gone: as a group that existed at boot it must not
    // start fresh; the others read theirs.
    let mut two = TableSuperblock::new(Rc::clone(&table), key(2), true);
    let err = block_on(two.read_latest()).unwrap_err();
    assert!(
        matches!(
            err,
            SuperblockError::TableSlotsLost {
                group: GroupId(2),
                lost: 1,
                ..
            }
        ),
        "{err}"
    );
    let mut one = TableSuperblock::new(Rc::clone(&table), key(1), true);
    assert_eq!(block_on(one.read_latest()).unwrap(), Some(state(1, 2)));
    // A group created after the table opened never had a record to lose.
    let mut created = TableSuperblock::new(Rc::clone(&table), key(9), false);
    assert_eq!(block_on(created.read_latest()).unwrap(), None);
    block_on(created.write(&state(9, 1))).unwrap();
    // The lost slot is never handed out: it is evidence, not free space.
    drop((two, one, created, table));
    let table = open(&fs).unwrap();
    assert_eq!(table.lost(), 1);
    assert_eq!(table.state(key(9)), Some(state(9, 1)));
}

#[test]
fn given_freed_slots_when_new_groups_arrive_should_reuse_them_and_never_resurrect() {
    let fs = fresh(8);
    write_states(&fs, &[1, 2, 3, 4], 1);
    let table = open(&fs).unwrap();
    let freed = block_on(table.free_unless(|k| k.group.0 % 2 == 1)).unwrap();
    assert_eq!(freed, 2);
    block_on(table.write(key(20), &state(20, 1))).unwrap();
    block_on(table.write(key(21), &state(21, 1))).unwrap();
    drop(table);
    fs.crash_with(CrashMode::DropAll);
    let table = open(&fs).unwrap();
    let mut keys: Vec<u64> = table.keys().iter().map(|k| k.group.0).collect();
    keys.sort_unstable();
    assert_eq!(keys, [1, 3, 20, 21]);
    // The two new groups took the freed slots: the files did not grow.
    let len = fs.contents(&dir().join(TABLE_NAMES[1])).unwrap().len();
    assert_eq!(len, 4 * 128);
    // A later incarnation of a freed group id starts fresh.
    let later = TableKey {
        group: GroupId(2),
        incarnation: 99,
    };
    assert_eq!(table.state(later), None);
    assert_eq!(table.state(key(2)), None);
}

#[test]
fn given_a_torn_file_tail_when_opened_should_read_the_whole_slots() {
    let fs = fresh(9);
    write_states(&fs, &[1, 2], 3);
    // A slot half-written past the end of copy B (an extension torn).
    block_on(async {
        let file = fs
            .open(
                &dir().join(TABLE_NAMES[1]),
                storage::fs::OpenOptions::read_write(),
            )
            .await
            .unwrap();
        let storage::fs::BufResult(r, _) =
            storage::fs::FsFile::write_all_at(&file, vec![0xAB; 60], 256).await;
        r.unwrap();
    });
    let table = open(&fs).unwrap();
    assert_eq!(table.lost(), 0, "a torn B beside a zero A is a free slot");
    assert_eq!(table.state(key(1)), Some(state(1, 3)));
    assert_eq!(table.state(key(2)), Some(state(2, 3)));
}

#[test]
fn given_a_free_slot_torn_in_one_copy_when_a_new_group_tears_its_first_write_should_lose_nothing() {
    let fs = fresh(10);
    write_states(&fs, &[1, 2, 3], 1);
    // Group 2's slot as a free torn after copy A: zeros in A, torn bytes
    // in B.
    block_on(async {
        use storage::fs::{BufResult, FsFile, OpenOptions};
        for (name, bytes) in TABLE_NAMES.iter().zip([vec![0u8; 128], vec![0xAB; 60]]) {
            let file = fs
                .open(&dir().join(name), OpenOptions::read_write())
                .await
                .unwrap();
            let BufResult(r, _) = file.write_all_at(bytes, 128).await;
            r.unwrap();
            file.sync_data().await.unwrap();
        }
    });
    let table = open(&fs).unwrap();
    assert_eq!((table.lost(), table.state(key(2))), (0, None));
    // A new group's first write, torn in copy A, then a power cut.
    fs.tear_nth_write(1, 40);
    assert!(block_on(table.write(key(4), &state(4, 1))).is_err());
    drop(table);
    fs.clear_faults();
    fs.crash_with(CrashMode::KeepAll);
    let table = open(&fs).unwrap();
    assert_eq!(table.lost(), 0, "a torn first write beside old torn bytes");
    assert_eq!(table.state(key(1)), Some(state(1, 1)));
    assert_eq!(table.state(key(3)), Some(state(3, 1)));
}

#[test]
fn given_one_rotted_copy_when_opened_should_repair_it_before_any_write() {
    for name in TABLE_NAMES {
        let fs = fresh(11);
        write_states(&fs, &[1, 2, 3], 2);
        fs.rot_byte(&dir().join(name), 128 + 40, 0x10).unwrap();
        // Opened, and closed again with no write of group 2.
        let table = open(&fs).unwrap();
        assert_eq!(table.stats().batches, 1, "{name}: the repair batch");
        drop(table);
        fs.crash_with(CrashMode::DropAll);
        // The other copy rots now: the repaired one answers.
        let other = TABLE_NAMES.iter().find(|n| **n != name).unwrap();
        fs.rot_byte(&dir().join(other), 128 + 40, 0x10).unwrap();
        let table = open(&fs).unwrap();
        assert_eq!(table.lost(), 0, "{name} then {other}");
        assert_eq!(
            table.state(key(2)),
            Some(state(2, 2)),
            "{name} then {other}"
        );
        // And the later writes of the group keep growing its sequence.
        block_on(table.write(key(2), &state(2, 3))).unwrap();
        drop(table);
        fs.crash_with(CrashMode::DropAll);
        assert_eq!(open(&fs).unwrap().state(key(2)), Some(state(2, 3)));
    }
}
