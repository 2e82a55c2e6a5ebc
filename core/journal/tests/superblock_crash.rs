//! The superblock under crashes, faults, torn writes and bit rot, on the
//! simulated filesystem: a reboot reads the previous or the new record,
//! never garbage, and never "no record" once a write returned.
#![allow(clippy::unwrap_used)]

use common::ReplicaId;
use common::{Offset, Op};
use futures::executor::block_on;
use journal::SLOT_NAMES;
use journal::{FileSuperblock, Superblock, SuperblockError, SuperblockStore, VsrState};
use std::path::{Path, PathBuf};
use storage::fs::{CrashMode, EACCES, EIO, ENOSPC, FaultKind, Fs, SimFs};

fn dir() -> PathBuf {
    PathBuf::from("/group")
}

fn state(n: u32) -> VsrState {
    VsrState {
        cluster: 0xC1,
        replica_id: ReplicaId(2),
        replica_count: 3,
        view: n,
        log_view: n,
        commit_max: Op(u64::from(n) * 10),
        checkpoint_op: Op(0),
        checkpoint_checksum: 0,
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

fn read(fs: &SimFs) -> Result<Option<VsrState>, SuperblockError> {
    block_on(FileSuperblock::new(fs.clone(), &dir()).read_latest())
}

/// Writes states 1..=n, each completing.
fn write_states(fs: &SimFs, n: u32) {
    block_on(async {
        let mut sb = FileSuperblock::new(fs.clone(), &dir());
        assert_eq!(sb.read_latest().await.unwrap(), None);
        for i in 1..=n {
            sb.write(&state(i)).await.unwrap();
        }
    });
}

/// Every fault a write can meet: each kind of call, at each of the first
/// few positions, with each errno, plus torn writes of each copy.
/// Arms one fault on the filesystem.
type ArmFault = Box<dyn Fn(&SimFs)>;

fn faults() -> Vec<ArmFault> {
    let mut out: Vec<ArmFault> = vec![Box::new(|_| {})];
    for kind in [FaultKind::Open, FaultKind::Write, FaultKind::Sync] {
        for nth in 1..=4 {
            for errno in [EIO, ENOSPC, EACCES] {
                out.push(Box::new(move |fs: &SimFs| fs.fail_nth(kind, nth, errno)));
            }
        }
    }
    for nth in 1..=2 {
        for keep in [0, 1, 27, 50, 101] {
            out.push(Box::new(move |fs: &SimFs| fs.tear_nth_write(nth, keep)));
        }
    }
    out
}

#[test]
fn given_fault_at_any_step_then_crash_when_rebooted_should_read_previous_or_new() {
    let mut cases = 0;
    for prior in [0u32, 1, 3] {
        for (f, fault) in faults().iter().enumerate() {
            for seed in 0..12u64 {
                for mode in [CrashMode::Seeded, CrashMode::KeepAll, CrashMode::DropAll] {
                    let fs = fresh(seed * 1000 + f as u64);
                    write_states(&fs, prior);
                    let returned = block_on(async {
                        let mut sb = FileSuperblock::new(fs.clone(), &dir());
                        sb.read_latest().await.unwrap();
                        fault(&fs);
                        sb.write(&state(prior + 1)).await.is_ok()
                    });
                    fs.clear_faults();
                    fs.crash_with(mode);
                    let got = read(&fs).unwrap_or_else(|e| {
                        panic!("prior {prior} fault {f} seed {seed} {mode:?}: {e}")
                    });
                    let got = got.map(|s| s.view);
                    if returned {
                        assert_eq!(got, Some(prior + 1), "acknowledged write lost");
                    } else if prior == 0 {
                        assert!(matches!(got, None | Some(1)), "got {got:?}");
                    } else {
                        assert!(
                            got == Some(prior) || got == Some(prior + 1),
                            "prior {prior} fault {f} seed {seed} {mode:?}: got {got:?}"
                        );
                    }
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 2000);
}

#[test]
fn given_failed_write_when_retried_should_complete_and_survive_crash() {
    let fs = fresh(7);
    write_states(&fs, 2);
    block_on(async {
        let mut sb = FileSuperblock::new(fs.clone(), &dir());
        sb.read_latest().await.unwrap();
        fs.fail_nth(FaultKind::Sync, 2, EIO);
        assert!(sb.write(&state(3)).await.is_err());
        sb.write(&state(3)).await.unwrap();
        sb.write(&state(4)).await.unwrap();
    });
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(read(&fs).unwrap().map(|s| s.view), Some(4));
}

#[test]
fn given_one_corrupt_copy_when_read_should_use_the_other_and_next_write_repairs() {
    for slot in SLOT_NAMES {
        let fs = fresh(1);
        write_states(&fs, 5);
        fs.rot_byte(&dir().join(slot), 40, 0x10).unwrap();
        assert_eq!(read(&fs).unwrap(), Some(state(5)), "{slot} rotted");
        block_on(async {
            let mut sb = FileSuperblock::new(fs.clone(), &dir());
            assert_eq!(sb.read_latest().await.unwrap(), Some(state(5)));
            sb.write(&state(6)).await.unwrap();
        });
        // Both copies are good again: rot the other one.
        let other = SLOT_NAMES.iter().find(|s| **s != slot).unwrap();
        fs.rot_byte(&dir().join(other), 40, 0x10).unwrap();
        assert_eq!(read(&fs).unwrap(), Some(state(6)));
    }
}

#[test]
fn given_both_copies_corrupt_when_read_should_refuse_with_both_reasons() {
    let fs = fresh(1);
    write_states(&fs, 3);
    for slot in SLOT_NAMES {
        fs.rot_byte(&dir().join(slot), 30, 0x01).unwrap();
    }
    match read(&fs) {
        Err(SuperblockError::Unreadable {
            a: Some(_),
            b: Some(_),
            ..
        }) => {}
        other => panic!("expected Unreadable, got {other:?}"),
    }
}

#[test]
fn given_missing_first_copy_and_corrupt_second_when_read_should_refuse_not_start_fresh() {
    // B is only ever created after A is durable, so this shape is not a
    // crash: refusing is the only safe answer.
    let fs = fresh(1);
    write_states(&fs, 3);
    block_on(fs.remove_file(&dir().join(SLOT_NAMES[0]))).unwrap();
    fs.rot_byte(&dir().join(SLOT_NAMES[1]), 30, 0x01).unwrap();
    assert!(matches!(
        read(&fs),
        Err(SuperblockError::Unreadable {
            a: None,
            b: Some(_),
            ..
        })
    ));
}

#[test]
fn given_first_write_torn_before_second_copy_exists_when_read_should_start_fresh() {
    let fs = fresh(1);
    block_on(async {
        let mut sb = FileSuperblock::new(fs.clone(), &dir());
        sb.read_latest().await.unwrap();
        fs.tear_nth_write(1, 20);
        assert!(sb.write(&state(1)).await.is_err());
    });
    fs.crash_with(CrashMode::KeepAll);
    assert_eq!(read(&fs).unwrap(), None);
}

#[test]
fn given_downgrade_when_both_copies_have_unknown_version_should_refuse() {
    let fs = fresh(1);
    write_states(&fs, 3);
    for slot in SLOT_NAMES {
        fs.rot_byte(&dir().join(slot), 4, 0x02).unwrap();
    }
    assert!(matches!(read(&fs), Err(SuperblockError::Unreadable { .. })));
}

#[test]
fn given_empty_directory_when_read_should_be_fresh() {
    let fs = fresh(1);
    assert_eq!(read(&fs).unwrap(), None);
}

#[test]
fn given_durable_state_when_frontier_advanced_or_reset_should_never_lower_except_reset() {
    let fs = fresh(3);
    block_on(async {
        let store = FileSuperblock::new(fs.clone(), &dir());
        let mut d = Superblock::open(store, state(0)).await.unwrap();
        assert_eq!(
            d.advance_offset_frontier(Offset(500)).await.unwrap(),
            Offset(500)
        );
        assert_eq!(
            d.advance_offset_frontier(Offset(200)).await.unwrap(),
            Offset(500)
        );
        d.persist_view(4, 3, Op(77)).await.unwrap();
        assert_eq!((d.state().view, d.state().log_view), (4, 3));
        d.reset_offset_frontier(Offset(0)).await.unwrap();
        assert_eq!(d.state().offset_frontier, Offset(0));
    });
    fs.crash_with(CrashMode::DropAll);
    let s = read(&fs).unwrap().unwrap();
    assert_eq!(
        (s.view, s.log_view, s.commit_max, s.offset_frontier),
        (4, 3, Op(77), Offset(0))
    );
}

#[test]
fn given_fresh_group_when_opened_should_write_initial_record_at_once() {
    let fs = fresh(3);
    block_on(async {
        let store = FileSuperblock::new(fs.clone(), &dir());
        Superblock::open(store, state(0)).await.unwrap();
    });
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(read(&fs).unwrap(), Some(state(0)));
}

#[test]
fn given_failed_frontier_write_when_reported_should_keep_durable_value() {
    let fs = fresh(3);
    block_on(async {
        let store = FileSuperblock::new(fs.clone(), &dir());
        let mut d = Superblock::open(store, state(0)).await.unwrap();
        d.advance_offset_frontier(Offset(10)).await.unwrap();
        fs.fail_nth(FaultKind::Write, 1, ENOSPC);
        assert!(d.advance_offset_frontier(Offset(20)).await.is_err());
        assert_eq!(d.state().offset_frontier, Offset(10));
    });
}

#[test]
fn given_crash_during_record_applied_when_rebooted_should_read_old_or_new_triple() {
    let old = (Op(40), 0xAAu128, Offset(400));
    let new = (Op(90), 0xBBu128, Offset(950));
    let mut cases = 0;
    for (f, fault) in faults().iter().enumerate() {
        for seed in 0..6u64 {
            for mode in [CrashMode::Seeded, CrashMode::KeepAll, CrashMode::DropAll] {
                let fs = fresh(seed * 977 + f as u64);
                block_on(async {
                    let store = FileSuperblock::new(fs.clone(), &dir());
                    let mut d = Superblock::open(store, state(0)).await.unwrap();
                    d.persist_view(3, 3, Op(80)).await.unwrap();
                    d.record_applied(old.0, old.1, old.2).await.unwrap();
                });
                let returned = block_on(async {
                    let mut store = FileSuperblock::new(fs.clone(), &dir());
                    store.read_latest().await.unwrap();
                    let mut d = Superblock::open(store, state(0)).await.unwrap();
                    fault(&fs);
                    d.record_applied(new.0, new.1, new.2).await.is_ok()
                });
                fs.clear_faults();
                fs.crash_with(mode);
                let s = read(&fs).unwrap().unwrap();
                let got = (s.checkpoint_op, s.checkpoint_checksum, s.offset_frontier);
                assert_eq!((s.view, s.log_view, s.commit_max), (3, 3, Op(80)));
                if returned {
                    assert_eq!(got, new, "acknowledged applied point lost");
                } else {
                    assert!(got == old || got == new, "fault {f} seed {seed}: {got:?}");
                }
                cases += 1;
            }
        }
    }
    assert!(cases > 500);
}

#[test]
fn given_applied_point_when_recorded_lower_should_keep_it_and_reset_should_move_it() {
    let fs = fresh(5);
    block_on(async {
        let store = FileSuperblock::new(fs.clone(), &dir());
        let mut d = Superblock::open(store, state(0)).await.unwrap();
        d.record_applied(Op(50), 0x50, Offset(500)).await.unwrap();
        d.record_applied(Op(30), 0x30, Offset(300)).await.unwrap();
        d.record_applied(Op(50), 0x51, Offset(600)).await.unwrap();
        let s = *d.state();
        assert_eq!(
            (s.checkpoint_op, s.checkpoint_checksum, s.offset_frontier),
            (Op(50), 0x50, Offset(500))
        );
        // A purge: the applied point and the frontier restart.
        d.reset_applied(Op(49), 0x49, Offset(0)).await.unwrap();
    });
    fs.crash_with(CrashMode::DropAll);
    let s = read(&fs).unwrap().unwrap();
    assert_eq!(
        (s.checkpoint_op, s.checkpoint_checksum, s.offset_frontier),
        (Op(49), 0x49, Offset(0))
    );
}
