//! Consumer-offset files and the purge generation under crashes and
//! faults on the simulated filesystem.
#![allow(clippy::unwrap_used)]

use futures::executor::block_on;
use partitions::offset_storage::{OFFSET_RECORD_LEN, REPLACEMENT_SUFFIX};
use partitions::{
    OffsetRecord, OffsetRecordError, PurgeGeneration, commit_offset_replacement,
    delete_persisted_offset, discard_offset_replacement, load_offsets_dir, offset_replacement_id,
    persist_purge_generation, read_purge_generation, stage_offset_replacement,
};
use std::path::{Path, PathBuf};
use storage::fs::{EIO, FaultKind, Fs, FsFile, OpenOptions, SimFs};

fn dir() -> PathBuf {
    PathBuf::from("/p/offsets/consumers")
}

fn fresh(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(&dir()).await.unwrap();
        for d in ["/", "/p", "/p/offsets"] {
            fs.sync_dir(Path::new(d)).await.unwrap();
        }
    });
    fs
}

/// Stores `value` for consumer `id` the way the partition does: stage,
/// commit, sync the directory.
fn store(fs: &SimFs, id: u32, value: u64) {
    block_on(async {
        let path = dir().join(id.to_string());
        stage_offset_replacement(fs, &path, value).await.unwrap();
        commit_offset_replacement(fs, &path).await.unwrap();
        fs.sync_dir(&dir()).await.unwrap();
    });
}

fn load(fs: &SimFs) -> Vec<(u32, u64)> {
    block_on(load_offsets_dir(fs, &dir())).unwrap().offsets
}

#[test]
fn given_offset_when_encoded_should_round_trip_and_reject_damage() {
    let r = OffsetRecord::encode(0x0102_0304_0506_0708);
    assert_eq!(r.len(), OFFSET_RECORD_LEN);
    assert_eq!(&r[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(
        OffsetRecord::decode(&r),
        Ok(OffsetRecord {
            offset: 0x0102_0304_0506_0708,
            checksummed: true
        })
    );
    for len in 0..OFFSET_RECORD_LEN {
        if len == 8 {
            continue;
        }
        assert_eq!(
            OffsetRecord::decode(&r[..len]),
            Err(OffsetRecordError::BadLength { len })
        );
    }
    for bit in 0..128 {
        let mut f = r;
        f[bit / 8] ^= 1 << (bit % 8);
        assert!(matches!(
            OffsetRecord::decode(&f),
            Err(OffsetRecordError::ChecksumMismatch { .. })
        ));
    }
    assert_eq!(
        OffsetRecord::decode(&7u64.to_le_bytes()),
        Ok(OffsetRecord {
            offset: 7,
            checksummed: false
        })
    );
}

#[test]
fn given_sibling_names_when_parsed_should_yield_ids_only_for_siblings() {
    assert_eq!(
        offset_replacement_id(&format!("42{REPLACEMENT_SUFFIX}")),
        Some(42)
    );
    assert_eq!(offset_replacement_id("42"), None);
    assert_eq!(
        offset_replacement_id(&format!("x{REPLACEMENT_SUFFIX}")),
        None
    );
}

#[test]
fn given_replacement_crashed_at_every_step_when_rebooted_should_hold_old_or_new() {
    for seed in 0..200u64 {
        for step in 0..4 {
            let fs = fresh(seed);
            store(&fs, 1, 100);
            store(&fs, 2, 7);
            let path = dir().join("1");
            let completed = block_on(async {
                // step 0: crash after staging; 1: after the rename;
                // 2: after the directory sync; 3: with a sync fault.
                if step == 3 {
                    fs.fail_nth(FaultKind::Sync, 1, EIO);
                }
                if stage_offset_replacement(&fs, &path, 250).await.is_err() {
                    return false;
                }
                if step == 0 {
                    return false;
                }
                commit_offset_replacement(&fs, &path).await.unwrap();
                if step == 1 {
                    return false;
                }
                fs.sync_dir(&dir()).await.unwrap();
                true
            });
            fs.clear_faults();
            fs.crash();
            let stored = block_on(load_offsets_dir(&fs, &dir())).unwrap();
            let one = stored.offsets.iter().find(|(id, _)| *id == 1).map(|e| e.1);
            if completed {
                assert_eq!(one, Some(250), "seed {seed} step {step}");
            } else {
                assert!(
                    one == Some(100) || one == Some(250),
                    "seed {seed} step {step}: {one:?}"
                );
            }
            assert!(stored.corrupt.is_empty(), "never a torn record");
            assert!(stored.offsets.contains(&(2, 7)));
            // Siblings never survive a boot.
            let names: Vec<_> = block_on(fs.read_dir(&dir()))
                .unwrap()
                .into_iter()
                .filter_map(|e| e.name_str().map(str::to_owned))
                .collect();
            assert!(
                names.iter().all(|n| offset_replacement_id(n).is_none()),
                "{names:?}"
            );
        }
    }
}

#[test]
fn given_discarded_replacement_when_loaded_should_keep_old_value() {
    let fs = fresh(1);
    store(&fs, 5, 10);
    let path = dir().join("5");
    block_on(async {
        stage_offset_replacement(&fs, &path, 99).await.unwrap();
        discard_offset_replacement(&fs, &path).await;
        // Discarding twice is harmless.
        discard_offset_replacement(&fs, &path).await;
    });
    assert_eq!(load(&fs), vec![(5, 10)]);
}

#[test]
fn given_deleted_offset_when_crashed_after_dir_sync_should_stay_deleted() {
    let fs = fresh(1);
    store(&fs, 5, 10);
    block_on(async {
        let path = dir().join("5");
        assert!(delete_persisted_offset(&fs, &path).await.unwrap());
        assert!(!delete_persisted_offset(&fs, &path).await.unwrap());
        fs.sync_dir(&dir()).await.unwrap();
    });
    fs.crash();
    assert_eq!(load(&fs), vec![]);
}

#[test]
fn given_corrupt_torn_and_foreign_files_when_loaded_should_remove_bad_and_keep_good() {
    let fs = fresh(1);
    store(&fs, 1, 11);
    store(&fs, 2, 22);
    store(&fs, 3, 33);
    fs.rot_byte(&dir().join("2"), 3, 0x01).unwrap();
    block_on(async {
        let torn = fs
            .open(&dir().join("4"), OpenOptions::create_read_write())
            .await
            .unwrap();
        let storage::fs::BufResult(res, _) = torn.write_all_at(vec![1u8, 2, 3], 0).await;
        res.unwrap();
        let foreign = fs
            .open(&dir().join("notes.txt"), OpenOptions::create_read_write())
            .await
            .unwrap();
        let storage::fs::BufResult(res, _) = foreign.write_all_at(vec![0u8; 40], 0).await;
        res.unwrap();
        fs.sync_dir(&dir()).await.unwrap();
    });
    let stored = block_on(load_offsets_dir(&fs, &dir())).unwrap();
    assert_eq!(stored.offsets, vec![(1, 11), (3, 33)]);
    assert_eq!(stored.corrupt.len(), 2);
    fs.crash();
    // The removals were made durable: a second boot sees the same.
    let again = block_on(load_offsets_dir(&fs, &dir())).unwrap();
    assert_eq!(again.offsets, vec![(1, 11), (3, 33)]);
    assert!(again.corrupt.is_empty());
    assert!(block_on(fs.exists(&dir().join("notes.txt"))).unwrap());
}

#[test]
fn given_missing_directory_when_loaded_should_be_empty() {
    let fs = SimFs::new(1);
    assert_eq!(
        block_on(load_offsets_dir(&fs, Path::new("/nowhere"))).unwrap(),
        Default::default()
    );
}

#[test]
fn given_purge_generation_when_persisted_should_survive_crash_at_every_step() {
    let pdir = PathBuf::from("/p");
    for seed in 0..100u64 {
        for fault in 0..3u64 {
            let fs = fresh(seed);
            block_on(persist_purge_generation(
                &fs,
                &pdir,
                PurgeGeneration {
                    generation: 1,
                    created_revision: 9,
                },
            ))
            .unwrap();
            match fault {
                1 => fs.fail_nth(FaultKind::Rename, 1, EIO),
                2 => fs.fail_nth(FaultKind::Sync, 2, EIO),
                _ => {}
            }
            let ok = block_on(persist_purge_generation(
                &fs,
                &pdir,
                PurgeGeneration {
                    generation: 2,
                    created_revision: 9,
                },
            ))
            .is_ok();
            fs.clear_faults();
            fs.crash();
            let got = block_on(read_purge_generation(&fs, &pdir, 9)).unwrap();
            if ok {
                assert_eq!(got, 2);
            } else {
                assert!(got == 1 || got == 2, "seed {seed} fault {fault}: {got}");
            }
        }
    }
}

#[test]
fn given_purge_generation_of_other_incarnation_or_absent_should_read_zero_and_corrupt_should_fail()
{
    let pdir = PathBuf::from("/p");
    let fs = fresh(1);
    assert_eq!(block_on(read_purge_generation(&fs, &pdir, 9)).unwrap(), 0);
    block_on(persist_purge_generation(
        &fs,
        &pdir,
        PurgeGeneration {
            generation: 4,
            created_revision: 9,
        },
    ))
    .unwrap();
    assert_eq!(block_on(read_purge_generation(&fs, &pdir, 8)).unwrap(), 0);
    assert_eq!(block_on(read_purge_generation(&fs, &pdir, 9)).unwrap(), 4);
    fs.rot_byte(&pdir.join("purge.gen"), 0, 0x01).unwrap();
    assert!(block_on(read_purge_generation(&fs, &pdir, 9)).is_err());
}
