//! Consumer-offset files and the purge generation under crashes and
//! faults on the simulated filesystem.
#![allow(clippy::unwrap_used)]

use common::{Offset, Op};
use futures::executor::block_on;
use partitions::{OFFSET_RECORD_LEN, REPLACEMENT_SUFFIX};
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
        stage_offset_replacement(fs, &path, OffsetRecord::settled(Offset(value)))
            .await
            .unwrap();
        commit_offset_replacement(fs, &path).await.unwrap();
        fs.sync_dir(&dir()).await.unwrap();
    });
}

fn load(fs: &SimFs) -> Vec<(u32, u64)> {
    present(&block_on(load_offsets_dir(fs, &dir())).unwrap().offsets)
}

fn present(records: &[(u32, OffsetRecord)]) -> Vec<(u32, u64)> {
    records
        .iter()
        .filter_map(|(id, r)| r.offset.map(|o| (*id, o.0)))
        .collect()
}

#[test]
fn given_record_when_encoded_should_round_trip_and_reject_damage() {
    let records = [
        OffsetRecord::settled(Offset(0x0102_0304_0506_0708)),
        OffsetRecord {
            offset: Some(Offset(u64::MAX)),
            op: Op(77),
            before: Some(Offset(0)),
        },
        OffsetRecord {
            offset: None,
            op: Op(u64::MAX),
            before: Some(Offset(12)),
        },
        OffsetRecord {
            offset: Some(Offset(3)),
            op: Op(1),
            before: None,
        },
    ];
    for record in records {
        let r = record.encode();
        assert_eq!(r.len(), OFFSET_RECORD_LEN);
        assert_eq!(OffsetRecord::decode(&r), Ok(record));
        for len in 0..OFFSET_RECORD_LEN {
            if len == 8 || len == 16 {
                continue;
            }
            assert_eq!(
                OffsetRecord::decode(&r[..len]),
                Err(OffsetRecordError::BadLength { len })
            );
        }
        for bit in 0..OFFSET_RECORD_LEN * 8 {
            let mut f = r;
            f[bit / 8] ^= 1 << (bit % 8);
            assert!(matches!(
                OffsetRecord::decode(&f),
                Err(OffsetRecordError::ChecksumMismatch { .. })
            ));
        }
    }
    // The offset sits at byte 0 in every layout.
    let r = OffsetRecord::settled(Offset(0x0102_0304_0506_0708)).encode();
    assert_eq!(&r[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
}

/// Encodes a 40-byte record with arbitrary field bytes and a valid
/// checksum, as a peer or a damaged disk could leave one.
fn forged(offset: u64, before: u64, flags: u8, reserved: u8) -> Vec<u8> {
    let mut b = vec![0u8; OFFSET_RECORD_LEN];
    b[..8].copy_from_slice(&offset.to_le_bytes());
    b[8..16].copy_from_slice(&5u64.to_le_bytes());
    b[16..24].copy_from_slice(&before.to_le_bytes());
    b[24] = flags;
    b[31] = reserved;
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..32]);
    b[32..].copy_from_slice(&sum.to_le_bytes());
    b
}

#[test]
fn given_checksummed_record_with_unknown_layout_when_decoded_should_fail_closed() {
    assert!(OffsetRecord::decode(&forged(1, 2, 3, 0)).is_ok());
    for (offset, before, flags, reserved) in [
        (1, 2, 3 | 4, 0), // an unknown flag bit
        (1, 2, 0x80, 0),  // another
        (1, 2, 3, 1),     // a reserved byte set
        (9, 0, 0, 0),     // a tombstone with an offset in its field
        (1, 4, 1, 0),     // no earlier value, yet one in its field
    ] {
        assert_eq!(
            OffsetRecord::decode(&forged(offset, before, flags, reserved)),
            Err(OffsetRecordError::BadFlags { flags }),
            "{offset} {before} {flags:#x} {reserved}"
        );
    }
}

#[test]
fn given_records_of_older_versions_when_decoded_should_read_as_settled() {
    // The 16-byte layout: the offset and its checksum.
    let mut v1 = 9u64.to_le_bytes().to_vec();
    v1.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&v1).to_le_bytes());
    assert_eq!(
        OffsetRecord::decode(&v1),
        Ok(OffsetRecord::settled(Offset(9)))
    );
    let mut bad = v1.clone();
    bad[0] ^= 1;
    assert!(matches!(
        OffsetRecord::decode(&bad),
        Err(OffsetRecordError::ChecksumMismatch { .. })
    ));
    // The bare 8-byte one.
    assert_eq!(
        OffsetRecord::decode(&7u64.to_le_bytes()),
        Ok(OffsetRecord::settled(Offset(7)))
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
                if stage_offset_replacement(&fs, &path, OffsetRecord::settled(Offset(250)))
                    .await
                    .is_err()
                {
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
            let offsets = present(&stored.offsets);
            let one = offsets.iter().find(|(id, _)| *id == 1).map(|e| e.1);
            if completed {
                assert_eq!(one, Some(250), "seed {seed} step {step}");
            } else {
                assert!(
                    one == Some(100) || one == Some(250),
                    "seed {seed} step {step}: {one:?}"
                );
            }
            assert!(stored.corrupt.is_empty(), "never a torn record");
            assert!(offsets.contains(&(2, 7)));
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
        stage_offset_replacement(&fs, &path, OffsetRecord::settled(Offset(99)))
            .await
            .unwrap();
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
    assert_eq!(present(&stored.offsets), vec![(1, 11), (3, 33)]);
    assert_eq!(stored.corrupt.len(), 2);
    fs.crash();
    // The removals were made durable: a second boot sees the same.
    let again = block_on(load_offsets_dir(&fs, &dir())).unwrap();
    assert_eq!(present(&again.offsets), vec![(1, 11), (3, 33)]);
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
