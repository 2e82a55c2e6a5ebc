//! The real filesystem: compio on io_uring. Must run inside a compio
//! runtime (the shard's).
//!
//! Directory listing is the one call compio lacks. [`RealFs::read_dir`]
//! walks `std::fs::read_dir` on the shard thread in slices of
//! [`READ_DIR_SLICE_ENTRIES`] entries and yields to the reactor between
//! slices: each slice costs about one `getdents64` call (the kernel fills a
//! 32 KiB buffer per call), so no single step blocks the reactor for long
//! even in a directory with many files, and there is no blocking thread
//! pool to depend on (shard runtimes run without one).

use std::io;
use std::path::Path;
use std::time::Duration;

use compio::buf::{BufResult, IntoInner, IoBuf};
use compio::io::AsyncReadAt;
use compio::io::AsyncWriteAt;

use super::{DirEntry, FileKind, Fs, FsFile, Metadata, OpenOptions, YieldNow};

/// Directory entries read between two yields to the reactor.
pub const READ_DIR_SLICE_ENTRIES: usize = 256;

/// The real filesystem (compio, io_uring). Stateless and free to clone.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

/// An open file on the real filesystem.
#[derive(Debug)]
pub struct RealFile {
    inner: compio::fs::File,
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else {
        FileKind::Other
    }
}

impl Fs for RealFs {
    type File = RealFile;

    async fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<RealFile> {
        let mut o = compio::fs::OpenOptions::new();
        o.read(opts.read)
            .write(opts.write)
            .create(opts.create)
            .create_new(opts.create_new)
            .truncate(opts.truncate);
        let inner = o.open(path).await?;
        Ok(RealFile { inner })
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        compio::fs::rename(from, to).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        compio::fs::remove_file(path).await
    }

    async fn create_dir(&self, path: &Path) -> io::Result<()> {
        compio::fs::create_dir(path).await
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        compio::fs::create_dir_all(path).await
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        compio::fs::remove_dir(path).await
    }

    async fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        let iter = std::fs::read_dir(path)?;
        for (i, entry) in iter.enumerate() {
            if i > 0 && i % READ_DIR_SLICE_ENTRIES == 0 {
                self.yield_now().await;
            }
            let entry = entry?;
            // `file_type` comes from the dirent's d_type on ext4/xfs: no stat.
            let kind = kind_of(entry.file_type()?);
            out.push(DirEntry {
                name: entry.file_name(),
                kind,
            });
        }
        Ok(out)
    }

    async fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let m = compio::fs::metadata(path).await?;
        let kind = if m.is_file() {
            FileKind::File
        } else if m.is_dir() {
            FileKind::Dir
        } else {
            FileKind::Other
        };
        Ok(Metadata { len: m.len(), kind })
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        // Opening a directory read-only and fsyncing it makes its entries
        // durable (Linux); compio's `File::open` opens read-only.
        let dir = compio::fs::File::open(path).await?;
        dir.sync_all().await
    }

    async fn sleep(&self, duration: Duration) {
        compio::time::sleep(duration).await;
    }

    async fn yield_now(&self) {
        YieldNow::default().await;
    }
}

impl FsFile for RealFile {
    async fn read_at(&self, buf: Vec<u8>, pos: u64, max: usize) -> BufResult<usize, Vec<u8>> {
        let start = buf.len();
        let end = start.saturating_add(max).min(buf.capacity());
        if end == start {
            return BufResult(Ok(0), buf);
        }
        // The slice view makes compio fill `buf[start..end]` and set the
        // vector's length to `start + n`: the read appends, with no copy.
        let BufResult(res, slice) = self.inner.read_at(buf.slice(start..end), pos).await;
        BufResult(res, slice.into_inner())
    }

    async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        let mut file = &self.inner;
        file.write_at(buf, pos).await
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data().await
    }

    async fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all().await
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len).await
    }

    async fn len(&self) -> io::Result<u64> {
        Ok(self.inner.metadata().await?.len())
    }

    async fn preallocate(&self, len: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            // Inline on the shard thread: shard runtimes have no blocking
            // pool, and allocating extents with KEEP_SIZE is a metadata-only
            // call. KEEP_SIZE leaves the length alone, so recovery never sees
            // a zero tail.
            rustix::fs::fallocate(&self.inner, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len)
                .map_err(io::Error::from)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            Ok(())
        }
    }
}
