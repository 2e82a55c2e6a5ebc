//! The simulated filesystem's own contract: what survives a crash, and
//! the injected faults.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use futures::executor::block_on;
use storage::fs::{
    CrashMode, EACCES, EDQUOT, EIO, ENOSPC, FaultKind, Fs, FsFile, OpenOptions, SimFs,
    is_local_disk_fault, is_no_space,
};

fn p(s: &str) -> &Path {
    Path::new(s)
}

async fn write_file(fs: &SimFs, path: &str, data: &[u8]) -> storage::fs::SimFile {
    let f = fs
        .open(p(path), OpenOptions::create_read_write())
        .await
        .unwrap();
    let storage::fs::BufResult(r, _) = f.write_all_at(data.to_vec(), 0).await;
    r.unwrap();
    f
}

#[test]
fn given_synced_file_and_dir_when_crashed_should_survive_under_every_seed() {
    for seed in 0..50 {
        block_on(async {
            let fs = SimFs::new(seed);
            fs.create_dir(p("/d")).await.unwrap();
            fs.sync_dir(p("/")).await.unwrap();
            let f = write_file(&fs, "/d/a", b"durable").await;
            f.sync_all().await.unwrap();
            fs.sync_dir(p("/d")).await.unwrap();
            let storage::fs::BufResult(r, _) = f.write_all_at(b"XX".to_vec(), 7).await;
            r.unwrap();
            fs.crash();
            let got = fs.contents(p("/d/a")).unwrap();
            assert!(
                got == b"durable" || got == b"durableX" || got == b"durableXX",
                "seed {seed}: {got:?}"
            );
        });
    }
}

#[test]
fn given_unsynced_create_when_crashed_should_sometimes_vanish_and_file_sync_does_not_save_name() {
    let mut vanished = 0;
    for seed in 0..64 {
        block_on(async {
            let fs = SimFs::new(seed);
            let f = write_file(&fs, "/x", b"data").await;
            // Syncing the file makes its bytes durable, not its name.
            f.sync_all().await.unwrap();
            fs.crash();
            if !fs.exists(p("/x")).await.unwrap() {
                vanished += 1;
            } else {
                assert_eq!(fs.contents(p("/x")).unwrap(), b"data");
            }
        });
    }
    assert!(vanished > 0 && vanished < 64, "vanished {vanished} of 64");
}

#[test]
fn given_unsynced_rename_when_crashed_should_be_kept_or_undone_whole() {
    let (mut kept, mut undone) = (0, 0);
    for seed in 0..64 {
        block_on(async {
            let fs = SimFs::new(seed);
            let a = write_file(&fs, "/a.tmp", b"new").await;
            a.sync_all().await.unwrap();
            let b = write_file(&fs, "/a", b"old").await;
            b.sync_all().await.unwrap();
            fs.sync_dir(p("/")).await.unwrap();
            fs.rename(p("/a.tmp"), p("/a")).await.unwrap();
            fs.crash_with(if seed % 2 == 0 {
                CrashMode::Seeded
            } else {
                CrashMode::KeepAll
            });
            match fs.contents(p("/a")).unwrap().as_slice() {
                b"new" => {
                    kept += 1;
                    assert!(!fs.exists(p("/a.tmp")).await.unwrap());
                }
                b"old" => {
                    undone += 1;
                    assert_eq!(fs.contents(p("/a.tmp")).unwrap(), b"new");
                }
                other => panic!("seed {seed}: {other:?}"),
            }
        });
    }
    assert!(kept > 0 && undone > 0);
}

#[test]
fn given_synced_dir_when_crashed_should_keep_rename_and_unlink() {
    block_on(async {
        let fs = SimFs::new(3);
        write_file(&fs, "/a", b"1").await.sync_all().await.unwrap();
        write_file(&fs, "/b", b"2").await.sync_all().await.unwrap();
        fs.sync_dir(p("/")).await.unwrap();
        fs.rename(p("/a"), p("/c")).await.unwrap();
        fs.remove_file(p("/b")).await.unwrap();
        fs.sync_dir(p("/")).await.unwrap();
        fs.crash_with(CrashMode::DropAll);
        let names: Vec<_> = fs
            .read_dir(p("/"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("c")]);
    });
}

#[test]
fn given_drop_all_crash_when_reopened_should_see_only_synced_bytes_and_stale_handles_fail() {
    block_on(async {
        let fs = SimFs::new(1);
        let f = write_file(&fs, "/f", b"abc").await;
        f.sync_data().await.unwrap();
        fs.sync_dir(p("/")).await.unwrap();
        let storage::fs::BufResult(r, _) = f.write_all_at(b"def".to_vec(), 3).await;
        r.unwrap();
        f.set_len(1).await.unwrap();
        fs.crash_with(CrashMode::DropAll);
        assert_eq!(fs.contents(p("/f")).unwrap(), b"abc");
        let err = f.len().await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(EIO));
    });
}

#[test]
fn given_armed_faults_when_called_should_fail_the_nth_call_with_errno() {
    block_on(async {
        let fs = SimFs::new(9);
        fs.fail_nth(FaultKind::Open, 2, EACCES);
        fs.open(p("/one"), OpenOptions::create_read_write())
            .await
            .unwrap();
        let e = fs
            .open(p("/two"), OpenOptions::create_read_write())
            .await
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(EACCES));
        assert!(is_local_disk_fault(&e));
        assert!(
            !fs.exists(p("/two")).await.unwrap(),
            "a failed open creates nothing"
        );

        let f = fs.open(p("/one"), OpenOptions::read_write()).await.unwrap();
        fs.fail_nth(FaultKind::Write, 1, ENOSPC);
        let storage::fs::BufResult(r, _) = f.write_all_at(vec![1u8; 10], 0).await;
        assert_eq!(r.unwrap_err().raw_os_error(), Some(ENOSPC));
        assert_eq!(f.len().await.unwrap(), 0);

        fs.fail_nth(FaultKind::Sync, 1, EIO);
        assert_eq!(f.sync_data().await.unwrap_err().raw_os_error(), Some(EIO));
        f.sync_data().await.unwrap();

        fs.rename(p("/one"), p("/uno")).await.unwrap();
        fs.fail_nth(FaultKind::Remove, 1, EIO);
        assert_eq!(
            fs.remove_file(p("/uno")).await.unwrap_err().raw_os_error(),
            Some(EIO)
        );
        fs.fail_nth(FaultKind::Rename, 1, EIO);
        assert!(fs.rename(p("/uno"), p("/dos")).await.is_err());
        fs.fail_nth(FaultKind::ReadDir, 1, EIO);
        assert!(fs.read_dir(p("/")).await.is_err());
        fs.fail_nth(FaultKind::Read, 1, EIO);
        let storage::fs::BufResult(r, _) = f.read_at(Vec::with_capacity(4), 0, 4).await;
        assert_eq!(r.unwrap_err().raw_os_error(), Some(EIO));
    });
}

#[test]
fn given_a_full_disk_when_files_grow_should_land_what_fits_and_give_back_what_shrinks() {
    block_on(async {
        let fs = SimFs::new(6);
        let f = write_file(&fs, "/f", b"0123").await;
        fs.fill_disk(3, EDQUOT);
        // Overwrites within the file always land.
        let storage::fs::BufResult(r, _) = f.write_all_at(b"ab".to_vec(), 0).await;
        r.unwrap();
        let storage::fs::BufResult(r, _) = f.write_all_at(b"xyzwvu".to_vec(), 2).await;
        let e = r.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(EDQUOT));
        assert!(is_no_space(&e));
        assert_eq!(
            fs.contents(p("/f")).unwrap(),
            b"abxyzwv",
            "three bytes of room landed"
        );
        assert!(f.set_len(8).await.is_err(), "no room left");
        f.set_len(4).await.unwrap();
        f.set_len(7).await.unwrap();
        assert!(
            f.set_len(8).await.is_err(),
            "what shrank came back, no more"
        );
        fs.free_disk();
        f.set_len(1 << 20).await.unwrap();
        fs.fill_disk(0, ENOSPC);
        let e = f.set_len((1 << 20) + 1).await.unwrap_err();
        assert!(is_no_space(&e));
    });
}

#[test]
fn given_torn_write_when_crashed_with_keep_all_should_hold_only_the_prefix() {
    block_on(async {
        let fs = SimFs::new(5);
        let f = write_file(&fs, "/t", b"").await;
        fs.sync_dir(p("/")).await.unwrap();
        fs.tear_nth_write(1, 3);
        let storage::fs::BufResult(r, _) = f.write_all_at(b"abcdef".to_vec(), 0).await;
        assert_eq!(r.unwrap_err().raw_os_error(), Some(EIO));
        fs.crash_with(CrashMode::KeepAll);
        assert_eq!(fs.contents(p("/t")).unwrap(), b"abc");
    });
}

#[test]
fn given_short_read_when_read_exact_should_loop_to_completion() {
    block_on(async {
        let fs = SimFs::new(5);
        let f = write_file(&fs, "/s", b"0123456789").await;
        fs.short_nth_read(1, 2);
        let storage::fs::BufResult(r, buf) = f.read_at(Vec::with_capacity(10), 0, 10).await;
        assert_eq!(r.unwrap(), 2);
        assert_eq!(buf, b"01");
        fs.short_nth_read(1, 3);
        assert_eq!(f.read_exact_at(10, 0).await.unwrap(), b"0123456789");
        let e = f.read_exact_at(11, 0).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    });
}

#[test]
fn given_bit_rot_when_read_should_return_flipped_byte() {
    block_on(async {
        let fs = SimFs::new(5);
        let f = write_file(&fs, "/r", b"\x00\x00\x00").await;
        fs.rot_byte(p("/r"), 1, 0x80).unwrap();
        assert_eq!(f.read_exact_at(3, 0).await.unwrap(), b"\x00\x80\x00");
    });
}

#[test]
fn given_directory_ops_when_misused_should_return_posix_errors() {
    block_on(async {
        let fs = SimFs::new(0);
        fs.create_dir_all(p("/a/b")).await.unwrap();
        fs.create_dir_all(p("/a/b")).await.unwrap();
        assert_eq!(
            fs.create_dir(p("/a")).await.unwrap_err().kind(),
            std::io::ErrorKind::AlreadyExists
        );
        write_file(&fs, "/a/b/f", b"x").await;
        assert!(fs.remove_dir(p("/a/b")).await.is_err(), "not empty");
        assert_eq!(
            fs.open(p("/a/missing"), OpenOptions::read_only())
                .await
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
        assert!(
            fs.open(
                p("/a/b/f"),
                OpenOptions::create_read_write().create_new(true)
            )
            .await
            .is_err()
        );
        fs.remove_file(p("/a/b/f")).await.unwrap();
        fs.remove_dir(p("/a/b")).await.unwrap();
        assert_eq!(
            fs.metadata(p("/a")).await.unwrap().kind,
            storage::fs::FileKind::Dir
        );
        fs.sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(fs.now(), std::time::Duration::from_millis(5));
    });
}

#[test]
fn given_power_cut_when_calls_continue_should_fail_everything_until_crash() {
    block_on(async {
        let fs = SimFs::new(2);
        let f = write_file(&fs, "/c", b"ab").await;
        fs.cut_power_after(1);
        f.sync_all().await.unwrap();
        let storage::fs::BufResult(r, _) = f.write_all_at(b"cd".to_vec(), 2).await;
        assert_eq!(r.unwrap_err().raw_os_error(), Some(EIO));
        assert!(fs.sync_dir(p("/")).await.is_err());
        assert!(
            fs.open(p("/d"), OpenOptions::create_read_write())
                .await
                .is_err()
        );
        fs.crash_with(CrashMode::KeepAll);
        // The name was never synced, but KeepAll keeps the create.
        assert_eq!(fs.contents(p("/c")).unwrap(), b"ab");
        assert!(
            fs.open(p("/d"), OpenOptions::create_read_write())
                .await
                .is_ok()
        );
    });
}

#[test]
fn given_power_cut_at_every_step_when_replacing_a_file_should_leave_old_or_new_content() {
    use storage::fs::replace_file_durably;
    for cut in 0..8 {
        for seed in 0..40 {
            block_on(async {
                let fs = SimFs::new(seed);
                fs.create_dir(p("/d")).await.unwrap();
                fs.sync_dir(p("/")).await.unwrap();
                replace_file_durably(&fs, p("/d/rec"), b"old-record".to_vec(), ".tmp")
                    .await
                    .unwrap();
                fs.cut_power_after(cut);
                let done = replace_file_durably(&fs, p("/d/rec"), b"NEW".to_vec(), ".tmp").await;
                fs.crash();
                let got = fs.contents(p("/d/rec")).unwrap();
                if done.is_ok() {
                    assert_eq!(got, b"NEW", "cut {cut} seed {seed}: completed replace lost");
                } else {
                    assert!(
                        got == b"old-record" || got == b"NEW",
                        "cut {cut} seed {seed}: {got:?}"
                    );
                }
                let f = fs
                    .open(p("/d/rec"), OpenOptions::read_only())
                    .await
                    .unwrap();
                assert!(f.read_to_end_bounded(4).await.is_err() || got == b"NEW");
                assert_eq!(f.read_to_end_bounded(64).await.unwrap(), got);
            });
        }
    }
}

/// Polls `future` with a no-op waker until ready; returns how many polls
/// came back pending.
fn pendings<F: std::future::Future>(future: F) -> u32 {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut pending = 0;
    while future.as_mut().poll(&mut cx).is_pending() {
        pending += 1;
        assert!(pending < 100, "a sync never completed");
    }
    pending
}

#[test]
fn given_slow_syncs_when_synced_should_suspend_one_to_four_times_and_fast_ones_never() {
    let fs = SimFs::new(9);
    let f = block_on(write_file(&fs, "/a", b"x"));
    assert_eq!(pendings(f.sync_all()), 0);
    assert_eq!(pendings(fs.sync_dir(p("/"))), 0);
    fs.set_slow_syncs(true);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let n = pendings(f.sync_data());
        assert!((1..=4).contains(&n), "a slow sync suspended {n} times");
        seen.insert(n);
        let n = pendings(fs.sync_dir(p("/")));
        assert!(
            (1..=4).contains(&n),
            "a slow directory sync suspended {n} times"
        );
    }
    assert!(seen.len() > 1, "every slow sync took as long: {seen:?}");
}
