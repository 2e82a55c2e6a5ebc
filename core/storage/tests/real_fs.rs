//! The same round trips on the real filesystem (compio, io_uring) in a
//! temporary directory.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;

use storage::IndexPolicy;
use storage::fs::{BufResult, FileKind, Fs, FsFile, OpenOptions, RealFs};
use storage::{LogConfig, SegmentedLog};
use storage::{WalkStop, log_file_name};
use support::{batch, read_all};

fn config(fsync: bool, preallocate: bool) -> LogConfig {
    LogConfig {
        segment_size_bytes: 64 * 1024,
        index: IndexPolicy {
            stride_bytes: 4_096,
        },
        fsync,
        preallocate,
        ..LogConfig::default()
    }
}

#[compio::test]
async fn given_real_fs_when_using_every_call_should_behave_like_posix() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = RealFs;
    let dir = tmp.path().join("a/b");
    fs.create_dir_all(&dir).await.unwrap();
    fs.create_dir_all(&dir).await.unwrap();
    assert_eq!(fs.metadata(&dir).await.unwrap().kind, FileKind::Dir);

    let path = dir.join("f");
    let f = fs
        .open(&path, OpenOptions::create_read_write())
        .await
        .unwrap();
    let BufResult(r, _) = f.write_all_at(b"hello world".to_vec(), 0).await;
    r.unwrap();
    f.sync_data().await.unwrap();
    assert_eq!(f.read_exact_at(5, 6).await.unwrap(), b"world");
    assert!(f.read_exact_at(20, 0).await.is_err());
    f.set_len(5).await.unwrap();
    f.sync_all().await.unwrap();
    assert_eq!(f.len().await.unwrap(), 5);
    f.preallocate(1 << 20).await.unwrap();
    assert_eq!(
        f.len().await.unwrap(),
        5,
        "KEEP_SIZE preallocation keeps the length"
    );
    let BufResult(r, buf) = f.read_at(Vec::with_capacity(64), 0, 64).await;
    assert_eq!(r.unwrap(), 5);
    assert_eq!(buf, b"hello");
    drop(f);

    fs.rename(&path, &dir.join("g")).await.unwrap();
    fs.sync_dir(&dir).await.unwrap();
    assert!(!fs.exists(&path).await.unwrap());
    assert_eq!(fs.metadata(&dir.join("g")).await.unwrap().len, 5);

    // More entries than one read_dir slice, so the listing yields.
    for i in 0..600 {
        std::fs::File::create(dir.join(format!("n{i}"))).unwrap();
    }
    let entries = fs.read_dir(&dir).await.unwrap();
    assert_eq!(entries.len(), 601);
    assert!(entries.iter().all(|e| e.kind == FileKind::File));

    fs.remove_file(&dir.join("g")).await.unwrap();
    assert!(fs.remove_dir(&dir).await.is_err(), "not empty");
    let e = fs
        .open(&dir.join("missing"), OpenOptions::read_only())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    fs.yield_now().await;
    fs.sleep(std::time::Duration::from_millis(1)).await;
}

#[compio::test]
async fn given_real_fs_when_appending_across_segments_should_read_back_and_recover_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p0");
    for (fsync, preallocate) in [(false, false), (true, true)] {
        let _ = std::fs::remove_dir_all(&dir);
        let (mut log, _) = SegmentedLog::open(RealFs, &dir, config(fsync, preallocate), 0)
            .await
            .unwrap();
        let mut batches = Vec::new();
        for i in 0..200u64 {
            let base = log.next_offset();
            let (r, b) = log.append(batch(base, 10_000 + i * 10, 4, 300)).await;
            r.unwrap();
            batches.push(b);
        }
        log.sync().await.unwrap();
        let metas: Vec<_> = log.segments().copied().collect();
        assert!(
            metas.len() > 3,
            "rotation at 64 KiB: {} segments",
            metas.len()
        );
        for m in &metas[..metas.len() - 1] {
            assert!(
                m.size_bytes >= 64 * 1024 && m.size_bytes < 64 * 1024 + batches[0].len() as u64
            );
        }
        assert_eq!(read_all(&log).await, batches);

        // By offset and by timestamp, in sealed and active segments.
        for i in [0usize, 1, 57, 120, 199] {
            let off = i as u64 * 4 + 3;
            let r = log.read_by_offset(off, 1).await.unwrap();
            assert_eq!(r.batches().next().unwrap().bytes(), batches[i].as_slice());
            let r = log
                .read_by_timestamp(10_000 + i as u64 * 10 - 5, 1)
                .await
                .unwrap();
            assert_eq!(r.batches().next().unwrap().bytes(), batches[i].as_slice());
        }
        drop(log);

        let (log, report) = SegmentedLog::open(RealFs, &dir, config(fsync, preallocate), 0)
            .await
            .unwrap();
        assert!(
            report.truncated.is_empty() && report.rebuilt_indexes.is_empty(),
            "{report:?}"
        );
        assert_eq!(report.next_offset(), Some(800));
        assert_eq!(read_all(&log).await, batches);
    }
}

#[compio::test]
async fn given_torn_tail_on_real_disk_when_recovered_should_truncate_physically() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p1");
    let (mut log, _) = SegmentedLog::open(RealFs, &dir, config(false, false), 0)
        .await
        .unwrap();
    let mut batches = Vec::new();
    for i in 0..5u64 {
        let base = log.next_offset();
        let (r, b) = log.append(batch(base, 100 + i, 2, 100)).await;
        r.unwrap();
        batches.push(b);
    }
    log.sync().await.unwrap();
    let size = log.segments().last().unwrap().size_bytes;
    drop(log);
    let path = dir.join(log_file_name(0));
    let half = batch(10, 200, 2, 100);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&half[..half.len() / 2])
        .unwrap();

    let (mut log, report) = SegmentedLog::open(RealFs, &dir, config(false, false), 0)
        .await
        .unwrap();
    assert_eq!(report.truncated.len(), 1);
    assert!(matches!(
        report.truncated[0].reason,
        WalkStop::Incomplete { .. }
    ));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        size,
        "cut on disk, not just in memory"
    );
    let (r, b) = log.append(batch(10, 200, 2, 100)).await;
    assert_eq!(r.unwrap().position, size);
    batches.push(b);
    assert_eq!(read_all(&log).await, batches);
}
