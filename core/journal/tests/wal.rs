//! The metadata WAL under crashes, torn writes and corruption on the
//! simulated filesystem.
#![allow(clippy::unwrap_used)]

use common::{GroupId, Op};
use futures::executor::block_on;
use journal::build_prepare;
use journal::{MetadataWal, WalError};
use std::path::{Path, PathBuf};
use storage::fs::{CrashMode, EIO, FaultKind, Fs, SimFs};

fn path() -> PathBuf {
    PathBuf::from("/meta/wal")
}

fn fresh(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(Path::new("/meta")).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
    });
    fs
}

fn open(fs: &SimFs) -> Result<(MetadataWal<SimFs>, journal::WalRecovery), WalError> {
    block_on(MetadataWal::open(fs, &path(), 64))
}

/// A chain of prepares starting at op 1, bodies of varying length.
struct Chain {
    head: (u64, u128),
}

impl Chain {
    fn new() -> Self {
        Self { head: (0, 0) }
    }

    fn next(&mut self) -> Vec<u8> {
        let op = self.head.0 + 1;
        let body: Vec<u8> = (0..(op * 37 % 300) as usize)
            .map(|i| (i as u64 ^ op) as u8)
            .collect();
        let frame = build_prepare(Op(op), self.head.1, GroupId(0), &body);
        let checksum = u128::from_le_bytes(frame[..16].try_into().unwrap());
        self.head = (op, checksum);
        frame
    }
}

#[test]
fn given_appends_when_reopened_should_recover_every_entry_and_read_them() {
    let fs = fresh(1);
    let mut chain = Chain::new();
    let frames: Vec<Vec<u8>> = (0..10).map(|_| chain.next()).collect();
    block_on(async {
        let (mut wal, rec) = MetadataWal::open(&fs, &path(), 64).await.unwrap();
        assert_eq!(rec.entries, 0);
        for f in &frames[..4] {
            wal.append(f.clone()).await.unwrap();
        }
        wal.append_batch(frames[4..].to_vec()).await.unwrap();
    });
    fs.crash_with(CrashMode::DropAll);
    let (wal, rec) = open(&fs).unwrap();
    assert_eq!(
        (rec.entries, rec.first_op, rec.last_op),
        (10, Some(Op(1)), Some(Op(10)))
    );
    assert_eq!(rec.truncated_bytes, 0);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(block_on(wal.read(i as u64 + 1)).unwrap().as_ref(), Some(f));
    }
    assert_eq!(wal.head(), Some(chain.head));
}

#[test]
fn given_random_crashes_when_rebooted_should_keep_every_acknowledged_append() {
    for seed in 0..300u64 {
        let fs = fresh(seed);
        let mut chain = Chain::new();
        let mut acked = 0u64;
        for round in 0..4u64 {
            let (mut wal, rec) = open(&fs).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let last = rec.last_op.map_or(0, |op| op.0);
            assert!(
                last >= acked,
                "seed {seed}: acknowledged op {acked} lost (have {last})"
            );
            // Resume the chain from what survived.
            if last < chain.head.0 {
                chain = Chain::new();
                for _ in 0..last {
                    chain.next();
                }
            }
            acked = last;
            let appends = (seed + round) % 5 + 1;
            for i in 0..appends {
                if (seed ^ i) % 7 == 3 {
                    fs.tear_nth_write(1, ((seed * 31 + i) % 200) as usize);
                }
                let result = if i % 2 == 0 {
                    block_on(wal.append(chain.next()))
                } else {
                    block_on(wal.append_batch(vec![chain.next(), chain.next()]))
                };
                match result {
                    Ok(()) => acked = chain.head.0,
                    Err(_) => break,
                }
            }
            fs.clear_faults();
            fs.crash();
        }
        let (_, rec) = open(&fs).unwrap();
        assert!(rec.last_op.map_or(0, |op| op.0) >= acked, "seed {seed}");
    }
}

#[test]
fn given_torn_last_append_when_reopened_should_truncate_physically_and_continue() {
    let fs = fresh(2);
    let mut chain = Chain::new();
    let first_len = block_on(async {
        let (mut wal, _) = MetadataWal::open(&fs, &path(), 64).await.unwrap();
        wal.append(chain.next()).await.unwrap();
        wal.append(chain.next()).await.unwrap();
        let len = wal.len_bytes();
        fs.tear_nth_write(1, 100);
        assert!(wal.append(chain.next()).await.is_err());
        // Poisoned until reopened.
        assert!(matches!(
            wal.append(chain.next()).await,
            Err(WalError::Poisoned { .. })
        ));
        len
    });
    fs.crash_with(CrashMode::KeepAll);
    let (mut wal, rec) = open(&fs).unwrap();
    assert_eq!(rec.last_op, Some(Op(2)));
    assert_eq!(rec.truncated_bytes, 100);
    assert_eq!(wal.len_bytes(), first_len);
    assert_eq!(
        block_on(fs.metadata(&path())).unwrap().len,
        first_len,
        "the torn tail is gone from the file, not just skipped"
    );
    let mut chain = Chain::new();
    chain.next();
    chain.next();
    block_on(wal.append(chain.next())).unwrap();
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(open(&fs).unwrap().1.last_op, Some(Op(3)));
}

#[test]
fn given_corruption_before_a_valid_entry_when_reopened_should_refuse_naming_offset() {
    let fs = fresh(3);
    let mut chain = Chain::new();
    let offset_of_third = block_on(async {
        let (mut wal, _) = MetadataWal::open(&fs, &path(), 64).await.unwrap();
        wal.append(chain.next()).await.unwrap();
        wal.append(chain.next()).await.unwrap();
        let at = wal.len_bytes();
        for _ in 0..3 {
            wal.append(chain.next()).await.unwrap();
        }
        at
    });
    fs.rot_byte(&path(), offset_of_third + 300, 0x04).unwrap();
    match open(&fs) {
        Err(WalError::InteriorCorruption { offset, .. }) => assert_eq!(offset, offset_of_third),
        other => panic!("expected interior corruption, got {other:?}"),
    }
    // Rot of the header (size field) of an interior entry is refused too.
    let fs = fresh(3);
    let mut chain = Chain::new();
    block_on(async {
        let (mut wal, _) = MetadataWal::open(&fs, &path(), 64).await.unwrap();
        for _ in 0..4 {
            wal.append(chain.next()).await.unwrap();
        }
    });
    fs.rot_byte(&path(), 49, 0x80).unwrap();
    assert!(matches!(
        open(&fs),
        Err(WalError::InteriorCorruption { offset: 0, .. })
    ));
}

#[test]
fn given_invalid_or_unchained_prepare_when_appended_should_refuse_and_write_nothing() {
    let fs = fresh(4);
    let mut chain = Chain::new();
    let (mut wal, _) = open(&fs).unwrap();
    block_on(wal.append(chain.next())).unwrap();
    let len = wal.len_bytes();
    let gap = build_prepare(Op(5), chain.head.1, GroupId(0), b"x");
    assert!(matches!(
        block_on(wal.append(gap)),
        Err(WalError::NotNextOp {
            expected: Op(2),
            op: Op(5)
        })
    ));
    let unchained = build_prepare(Op(2), 12345, GroupId(0), b"x");
    assert!(matches!(
        block_on(wal.append(unchained)),
        Err(WalError::ParentMismatch { op: Op(2) })
    ));
    let mut corrupt = chain.next();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(matches!(
        block_on(wal.append(corrupt)),
        Err(WalError::InvalidPrepare(_))
    ));
    assert_eq!(wal.len_bytes(), len);
}

#[test]
fn given_failed_sync_when_appending_should_not_acknowledge_and_poison() {
    let fs = fresh(5);
    let mut chain = Chain::new();
    let (mut wal, _) = open(&fs).unwrap();
    fs.fail_nth(FaultKind::Sync, 1, EIO);
    assert!(matches!(
        block_on(wal.append(chain.next())),
        Err(WalError::Io { .. })
    ));
    assert_eq!(wal.head(), None);
    fs.crash_with(CrashMode::DropAll);
    assert_eq!(open(&fs).unwrap().1.last_op, None);
}

#[test]
fn given_more_ops_than_slots_when_read_should_serve_only_recent_ones() {
    let fs = fresh(6);
    let mut chain = Chain::new();
    let (mut wal, _) = block_on(MetadataWal::open(&fs, &path(), 4)).unwrap();
    for _ in 0..10 {
        block_on(wal.append(chain.next())).unwrap();
    }
    assert_eq!(wal.indexed_ops(), Some((7, 10)));
    assert!(block_on(wal.read(6)).unwrap().is_none());
    assert!(block_on(wal.read(7)).unwrap().is_some());
}
