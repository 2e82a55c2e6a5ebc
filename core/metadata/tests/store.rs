//! The durable metadata store on the simulated filesystem: boot by
//! snapshot + WAL replay, and a power cut at every filesystem call of a
//! commit and of a snapshot (seeded and drop-everything crashes): after
//! reboot the state is the last acknowledged one, or the one the
//! interrupted commit would have made; never anything else.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};

use common::Op;
use futures::executor::block_on;
use metadata::{
    MetadataOp, MetadataState, MetadataStore, OpOrigin, SNAPSHOT_FILE, StoreConfig, StoreError,
    WAL_FILE,
};
use storage::fs::{CrashMode, Fs, SimFs};
use support::*;

fn dir() -> PathBuf {
    PathBuf::from("/data/metadata")
}

fn fresh(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(Path::new("/data")).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
    });
    fs
}

fn open(fs: &SimFs) -> Result<MetadataStore<SimFs>, StoreError> {
    let config = StoreConfig {
        snapshot_every_ops: 4,
        ..StoreConfig::default()
    };
    block_on(MetadataStore::open(fs, &dir(), config)).map(|(s, _)| s)
}

/// A history touching every kind of object, with one refusal.
fn history() -> Vec<MetadataOp> {
    vec![
        create_user("iggy"),
        create_stream("s"),
        create_topic(0, "t", 3),
        create_group(0, 0, "g"),
        join(0, 0, 0, 1),
        create_stream("s"), // refused: replays as refused
        MetadataOp::PurgeTopic {
            stream: 0.into(),
            topic: 0.into(),
        },
        create_topic(0, "u", 2),
        join(0, 0, 0, 2),
        MetadataOp::DeleteTopic {
            stream: 0.into(),
            topic: "u".into(),
        },
    ]
}

fn commit(store: &mut MetadataStore<SimFs>, op: &MetadataOp) -> Result<(), StoreError> {
    let next = store.next_op();
    block_on(store.commit(next, op, OpOrigin::default())).map(|_| ())
}

/// The states after each prefix of `ops` (index 0: nothing applied).
fn expected_states(ops: &[MetadataOp]) -> Vec<MetadataState> {
    let mut st = MetadataState::new();
    let mut out = vec![st.clone()];
    for (i, op) in ops.iter().enumerate() {
        let _ = st.apply(Op(i as u64 + 1), op);
        out.push(st.clone());
    }
    out
}

#[test]
fn given_committed_ops_when_rebooted_after_losing_everything_unsynced_should_replay_them() {
    let fs = fresh(1);
    let ops = history();
    let mut store = open(&fs).unwrap();
    for op in &ops {
        commit(&mut store, op).unwrap();
    }
    let want = store.state().clone();
    assert_eq!(want, *expected_states(&ops).last().unwrap());
    drop(store);
    fs.crash_with(CrashMode::DropAll);
    let (store, report) =
        block_on(MetadataStore::open(&fs, &dir(), StoreConfig::default())).unwrap();
    assert_eq!(*store.state(), want);
    assert_eq!(
        (report.snapshot_op, report.replayed),
        (None, ops.len() as u64)
    );
}

#[test]
fn given_snapshots_between_commits_when_rebooted_should_load_snapshot_and_replay_the_rest() {
    let fs = fresh(2);
    let ops = history();
    let mut store = open(&fs).unwrap();
    for op in &ops[..6] {
        commit(&mut store, op).unwrap();
    }
    assert!(store.snapshot_due());
    block_on(store.snapshot()).unwrap();
    assert_eq!(store.wal_ops(), 0);
    for op in &ops[6..] {
        commit(&mut store, op).unwrap();
    }
    let want = store.state().clone();
    drop(store);
    fs.crash_with(CrashMode::DropAll);
    let (store, report) =
        block_on(MetadataStore::open(&fs, &dir(), StoreConfig::default())).unwrap();
    assert_eq!(*store.state(), want);
    assert_eq!(report.snapshot_op, Some(Op(6)));
    assert_eq!(report.replayed, (ops.len() - 6) as u64);
    // The WAL was compacted: it holds only the ops after the snapshot.
    let wal = fs.contents(&dir().join(WAL_FILE)).unwrap();
    assert!(wal.len() < 256 * (ops.len() - 6 + 1));
}

#[test]
fn given_a_commit_at_the_wrong_op_when_committed_should_refuse_and_write_nothing() {
    let fs = fresh(3);
    let mut store = open(&fs).unwrap();
    commit(&mut store, &create_stream("a")).unwrap();
    let err = block_on(store.commit(Op(1), &create_stream("b"), OpOrigin::default()));
    assert!(matches!(err, Err(StoreError::Apply(_))));
    let err = block_on(store.commit(Op(3), &create_stream("b"), OpOrigin::default()));
    assert!(matches!(err, Err(StoreError::Apply(_))));
    let bad = MetadataOp::CreateStream {
        name: String::new(),
        created_at_us: 0,
    };
    assert!(matches!(
        block_on(store.commit(Op(2), &bad, OpOrigin::default())),
        Err(StoreError::Encode(_))
    ));
    assert_eq!(store.applied(), Op(1));
    drop(store);
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(open(&fs).unwrap().applied(), Op(1));
}

#[test]
fn given_a_corrupt_snapshot_when_booted_should_refuse_rather_than_forget_committed_ops() {
    let fs = fresh(4);
    let mut store = open(&fs).unwrap();
    for op in &history()[..3] {
        commit(&mut store, op).unwrap();
    }
    block_on(store.snapshot()).unwrap();
    drop(store);
    fs.rot_byte(&dir().join(SNAPSHOT_FILE), 20, 0x40).unwrap();
    assert!(matches!(open(&fs), Err(StoreError::Snapshot { .. })));
}

#[test]
fn given_a_stale_sibling_when_booted_should_sweep_it() {
    let fs = fresh(5);
    let store = open(&fs).unwrap();
    drop(store);
    let stray = dir().join(format!("{SNAPSHOT_FILE}.tmp"));
    block_on(async {
        let f = fs
            .open(&stray, storage::fs::OpenOptions::create_read_write())
            .await
            .unwrap();
        drop(f);
    });
    let _ = open(&fs).unwrap();
    assert!(!block_on(fs.exists(&stray)).unwrap());
}

/// One step of a crash run.
#[derive(Clone, Copy)]
enum Step {
    Commit(usize),
    Snapshot,
}

/// Runs `steps` with the power cut after `cut` filesystem calls, crashes,
/// reboots and checks the state. Returns whether every step completed
/// (then larger cuts test nothing new).
fn crash_run(seed: u64, mode: CrashMode, cut: u64, steps: &[Step], ops: &[MetadataOp]) -> bool {
    let states = expected_states(ops);
    let fs = fresh(seed);
    let mut store = open(&fs).unwrap();
    fs.cut_power_after(cut);
    // `acked`: ops acknowledged; `maybe`: an op whose commit failed and may
    // or may not have reached the disk.
    let mut acked = 0usize;
    let mut maybe = None;
    let mut completed = true;
    for step in steps {
        let res = match step {
            Step::Commit(i) => {
                let r = commit(&mut store, &ops[*i]);
                match r {
                    Ok(()) => acked = i + 1,
                    Err(_) => maybe = Some(i + 1),
                }
                r.map(|_| ())
            }
            Step::Snapshot => block_on(store.snapshot()),
        };
        if res.is_err() {
            completed = false;
            break;
        }
    }
    drop(store);
    fs.crash_with(mode);
    let store = open(&fs).unwrap_or_else(|e| panic!("seed {seed} cut {cut}: boot failed: {e}"));
    let got = store.state();
    let ok = *got == states[acked] || maybe.is_some_and(|m| *got == states[m]);
    assert!(
        ok,
        "seed {seed} cut {cut}: rebooted at op {} with {acked} acknowledged",
        got.applied().0
    );
    for name in [WAL_FILE, SNAPSHOT_FILE] {
        let sibling = dir().join(format!("{name}.tmp"));
        assert!(!block_on(fs.exists(&sibling)).unwrap(), "sibling left");
    }
    // The rebooted store keeps working.
    let mut store = store;
    let next = store.applied().0 as usize;
    if next < ops.len() {
        commit(&mut store, &ops[next]).unwrap();
        assert_eq!(*store.state(), states[next + 1]);
    }
    completed
}

fn plan() -> Vec<Step> {
    let mut steps: Vec<Step> = (0..4).map(Step::Commit).collect();
    steps.push(Step::Snapshot);
    steps.extend((4..7).map(Step::Commit));
    steps.push(Step::Snapshot);
    steps.extend((7..10).map(Step::Commit));
    steps
}

#[test]
fn given_a_power_cut_at_every_call_of_commits_and_snapshots_when_everything_unsynced_is_lost_should_boot_to_the_last_acknowledged_state()
 {
    let ops = history();
    let steps = plan();
    let mut cut = 0;
    while !crash_run(0, CrashMode::DropAll, cut, &steps, &ops) {
        cut += 1;
        assert!(cut < 10_000, "the plan never completes");
    }
    assert!(cut > 20, "the plan made only {cut} filesystem calls");
}

#[test]
fn given_a_power_cut_at_every_call_with_seeded_crashes_should_boot_to_the_last_acknowledged_state()
{
    let ops = history();
    let steps = plan();
    for seed in 1..=8u64 {
        let mut cut = 0;
        while !crash_run(seed, CrashMode::Seeded, cut, &steps, &ops) {
            cut += 1;
            assert!(cut < 10_000, "the plan never completes");
        }
    }
}

#[test]
fn given_a_process_crash_that_keeps_the_page_cache_should_keep_every_acknowledged_op() {
    let ops = history();
    let steps = plan();
    let mut cut = 0;
    while !crash_run(0, CrashMode::KeepAll, cut, &steps, &ops) {
        cut += 1;
        assert!(cut < 10_000);
    }
}

#[test]
fn given_skipped_ops_when_rebooted_should_replay_them_as_occupied_op_numbers() {
    let fs = fresh(6);
    let mut store = open(&fs).unwrap();
    commit(&mut store, &create_stream("a")).unwrap();
    block_on(store.commit_skip(Op(2), OpOrigin::default())).unwrap();
    commit(&mut store, &create_stream("b")).unwrap();
    assert!(matches!(
        block_on(store.commit_skip(Op(2), OpOrigin::default())),
        Err(StoreError::Apply(_))
    ));
    let want = store.state().clone();
    assert_eq!(want.applied(), Op(3));
    drop(store);
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(*open(&fs).unwrap().state(), want);
}

#[test]
fn given_a_power_cut_at_every_call_of_an_install_when_rebooted_should_hold_the_old_or_the_installed_state()
 {
    let ops = history();
    let states = expected_states(&ops);
    for mode in [CrashMode::DropAll, CrashMode::Seeded, CrashMode::KeepAll] {
        let mut cut = 0;
        loop {
            let fs = fresh(cut + 40);
            let mut store = open(&fs).unwrap();
            for op in &ops[..3] {
                commit(&mut store, op).unwrap();
            }
            let old = store.state().clone();
            let new = states[ops.len()].clone();
            fs.cut_power_after(cut);
            let res = block_on(store.install(new.clone()));
            drop(store);
            fs.crash_with(mode);
            let rebooted = open(&fs).unwrap();
            if res.is_ok() {
                assert_eq!(*rebooted.state(), new, "cut {cut}");
                break;
            }
            assert!(
                *rebooted.state() == old || *rebooted.state() == new,
                "cut {cut}: booted at op {}",
                rebooted.applied().0
            );
            cut += 1;
            assert!(cut < 1_000);
        }
        assert!(cut >= 4, "an install is at least write, sync, rename, sync");
    }
}

#[test]
fn given_an_install_not_ahead_of_the_store_when_installed_should_refuse() {
    let fs = fresh(7);
    let mut store = open(&fs).unwrap();
    for op in &history()[..3] {
        commit(&mut store, op).unwrap();
    }
    let behind = expected_states(&history())[2].clone();
    assert!(matches!(
        block_on(store.install(behind)),
        Err(StoreError::Apply(_))
    ));
    assert_eq!(store.applied(), Op(3));
}
