//! [`CountingFs`]: any [`Fs`] with its disk work counted — syncs of files
//! and directories, writes and the bytes they wrote, reads and the bytes
//! they returned — so a benchmark or a test can state what a code path
//! costs the disk per operation (fsyncs per op, bytes written per byte
//! produced, bytes read in one step) rather than only how long it took.
//!
//! The counters sit behind an `Rc` shared by the filesystem, its clones and
//! every file opened through them (thread-per-core: nothing crosses a
//! thread), so two wrappers over the same inner filesystem keep separate
//! books: give the superblock its own and its syncs are told apart from the
//! log's. Everything else is forwarded unchanged.

use std::cell::Cell;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use super::{BufResult, DirEntry, Fs, FsFile, IoBuf, Metadata, OpenOptions};

/// A snapshot of a [`CountingFs`]'s counters. Only calls that succeeded
/// are counted; a short write counts the bytes it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsCounts {
    /// `FsFile::sync_data` calls.
    pub sync_data_calls: u64,
    /// `FsFile::sync_all` calls.
    pub sync_all_calls: u64,
    /// `Fs::sync_dir` calls.
    pub sync_dir_calls: u64,
    /// `FsFile::write_at` calls (a looping `write_all_at` counts each).
    pub write_calls: u64,
    /// Bytes the writes wrote.
    pub written_bytes: u64,
    /// `FsFile::read_at` calls (a looping `read_exact_at` counts each).
    pub read_calls: u64,
    /// Bytes the reads returned.
    pub read_bytes: u64,
}

impl FsCounts {
    /// File syncs of either kind (`sync_data` and `sync_all`).
    pub const fn file_syncs(&self) -> u64 {
        self.sync_data_calls + self.sync_all_calls
    }

    /// Every sync that waits for the device: files and directories.
    pub const fn syncs(&self) -> u64 {
        self.file_syncs() + self.sync_dir_calls
    }

    /// What happened between `earlier` and `self` (counters only grow).
    pub fn since(&self, earlier: &FsCounts) -> FsCounts {
        debug_assert!(self.written_bytes >= earlier.written_bytes);
        FsCounts {
            sync_data_calls: self.sync_data_calls - earlier.sync_data_calls,
            sync_all_calls: self.sync_all_calls - earlier.sync_all_calls,
            sync_dir_calls: self.sync_dir_calls - earlier.sync_dir_calls,
            write_calls: self.write_calls - earlier.write_calls,
            written_bytes: self.written_bytes - earlier.written_bytes,
            read_calls: self.read_calls - earlier.read_calls,
            read_bytes: self.read_bytes - earlier.read_bytes,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    sync_data_calls: Cell<u64>,
    sync_all_calls: Cell<u64>,
    sync_dir_calls: Cell<u64>,
    write_calls: Cell<u64>,
    written_bytes: Cell<u64>,
    read_calls: Cell<u64>,
    read_bytes: Cell<u64>,
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get() + by);
}

/// `F` with every sync and write counted (see the module documentation).
/// Clones share the counters.
#[derive(Debug, Clone)]
pub struct CountingFs<F: Fs> {
    inner: F,
    counters: Rc<Counters>,
}

impl<F: Fs> CountingFs<F> {
    /// `inner`, counted from zero.
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            counters: Rc::default(),
        }
    }

    /// The counts so far, over this filesystem, its clones and their files.
    pub fn counts(&self) -> FsCounts {
        let c = &self.counters;
        FsCounts {
            sync_data_calls: c.sync_data_calls.get(),
            sync_all_calls: c.sync_all_calls.get(),
            sync_dir_calls: c.sync_dir_calls.get(),
            write_calls: c.write_calls.get(),
            written_bytes: c.written_bytes.get(),
            read_calls: c.read_calls.get(),
            read_bytes: c.read_bytes.get(),
        }
    }

    /// The wrapped filesystem.
    pub const fn inner(&self) -> &F {
        &self.inner
    }
}

/// A file opened through a [`CountingFs`].
#[derive(Debug)]
pub struct CountingFile<T> {
    inner: T,
    counters: Rc<Counters>,
}

impl<F: Fs> Fs for CountingFs<F> {
    type File = CountingFile<F::File>;

    async fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Self::File> {
        let inner = self.inner.open(path, opts).await?;
        Ok(CountingFile {
            inner,
            counters: Rc::clone(&self.counters),
        })
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path).await
    }

    async fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir(path).await
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path).await
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir(path).await
    }

    async fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.read_dir(path).await
    }

    async fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        self.inner.metadata(path).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path).await?;
        bump(&self.counters.sync_dir_calls, 1);
        Ok(())
    }

    async fn sleep(&self, duration: Duration) {
        self.inner.sleep(duration).await;
    }

    async fn yield_now(&self) {
        self.inner.yield_now().await;
    }
}

impl<T: FsFile> FsFile for CountingFile<T> {
    async fn read_at(&self, buf: Vec<u8>, pos: u64, max: usize) -> BufResult<usize, Vec<u8>> {
        let result = self.inner.read_at(buf, pos, max).await;
        if let BufResult(Ok(n), _) = &result {
            bump(&self.counters.read_calls, 1);
            bump(&self.counters.read_bytes, *n as u64);
        }
        result
    }

    async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        let result = self.inner.write_at(buf, pos).await;
        if let BufResult(Ok(n), _) = &result {
            bump(&self.counters.write_calls, 1);
            bump(&self.counters.written_bytes, *n as u64);
        }
        result
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data().await?;
        bump(&self.counters.sync_data_calls, 1);
        Ok(())
    }

    async fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all().await?;
        bump(&self.counters.sync_all_calls, 1);
        Ok(())
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len).await
    }

    async fn len(&self) -> io::Result<u64> {
        self.inner.len().await
    }

    async fn preallocate(&self, len: u64) -> io::Result<()> {
        self.inner.preallocate(len).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use futures::executor::block_on;

    use super::*;
    use crate::fs::{EIO, FaultKind, SimFs, replace_file_durably};

    fn fs() -> CountingFs<SimFs> {
        let sim = SimFs::new(7);
        block_on(sim.create_dir_all(Path::new("/d"))).unwrap();
        CountingFs::new(sim)
    }

    #[test]
    fn given_writes_and_syncs_when_counted_should_tally_each_kind_and_every_byte() {
        let fs = fs();
        block_on(async {
            let f = fs
                .open(Path::new("/d/a"), OpenOptions::create_read_write())
                .await
                .unwrap();
            f.write_all_at(vec![1u8; 100], 0).await.0.unwrap();
            f.write_all_at(vec![2u8; 28], 100).await.0.unwrap();
            f.sync_data().await.unwrap();
            f.sync_all().await.unwrap();
            fs.sync_dir(Path::new("/d")).await.unwrap();
            // Reads are counted; namespace calls are not.
            f.read_exact_at(128, 0).await.unwrap();
            fs.metadata(Path::new("/d/a")).await.unwrap();
        });
        let c = fs.counts();
        assert_eq!(
            c,
            FsCounts {
                sync_data_calls: 1,
                sync_all_calls: 1,
                sync_dir_calls: 1,
                write_calls: 2,
                written_bytes: 128,
                read_calls: 1,
                read_bytes: 128,
            }
        );
        assert_eq!((c.file_syncs(), c.syncs()), (2, 3));
        assert_eq!(
            fs.inner().contents(Path::new("/d/a")).unwrap(),
            [vec![1u8; 100], vec![2u8; 28]].concat()
        );
    }

    #[test]
    fn given_clones_and_a_second_wrapper_when_counted_should_share_books_only_with_clones() {
        let a = fs();
        let clone = a.clone();
        let other = CountingFs::new(a.inner().clone());
        block_on(async {
            replace_file_durably(&clone, Path::new("/d/x"), vec![0u8; 10], ".tmp")
                .await
                .unwrap();
            other.sync_dir(Path::new("/d")).await.unwrap();
        });
        let before = a.counts();
        assert_eq!(
            (
                before.sync_all_calls,
                before.sync_dir_calls,
                before.written_bytes
            ),
            (1, 1, 10)
        );
        assert_eq!(other.counts().syncs(), 1);
        block_on(a.sync_dir(Path::new("/d"))).unwrap();
        let delta = clone.counts().since(&before);
        assert_eq!(
            delta,
            FsCounts {
                sync_dir_calls: 1,
                ..FsCounts::default()
            }
        );
    }

    #[test]
    fn given_failing_sync_or_write_when_counted_should_not_count_it() {
        let fs = fs();
        block_on(async {
            let f = fs
                .open(Path::new("/d/a"), OpenOptions::create_read_write())
                .await
                .unwrap();
            fs.inner().fail_nth(FaultKind::Sync, 1, EIO);
            assert!(f.sync_data().await.is_err());
            fs.inner().fail_nth(FaultKind::Write, 1, EIO);
            assert!(f.write_at(vec![1u8; 8], 0).await.0.is_err());
        });
        assert_eq!(fs.counts(), FsCounts::default());
    }
}
