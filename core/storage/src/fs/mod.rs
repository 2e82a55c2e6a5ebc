//! The filesystem abstraction (SPEC §3): every file and directory call made
//! by `storage`, `journal` and `partitions` goes through [`Fs`] and
//! [`FsFile`], so the same code runs on the real disk ([`RealFs`], compio on
//! io_uring) and on the deterministic in-memory model ([`SimFs`]) whose
//! crashes drop unsynced state. [`CountingFs`] wraps either and counts
//! syncs and written bytes, for benchmarks that report a path's disk cost.
//!
//! Buffers follow compio's ownership model: a buffer is moved into a call and
//! handed back with the result ([`BufResult`]), never copied by the
//! abstraction. Errors are plain [`std::io::Error`]s carrying real errno
//! values, so callers can tell a local disk fault (EIO, ENOSPC, EACCES) from
//! a missing file.
//!
//! The traits use `async fn` without `Send` bounds on purpose: replog is
//! thread-per-core, every future stays on the shard that created it, and the
//! code is generic over the implementation (never `dyn`).

mod counting;
mod real;
mod sim;

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::time::Duration;

pub use compio::buf::{BufResult, IntoInner, IoBuf};
pub use counting::{CountingFile, CountingFs, FsCounts};
pub use real::{RealFile, RealFs};
pub use sim::{CrashMode, FaultKind, SimFile, SimFs};

/// errno for an I/O error reported by the device.
pub const EIO: i32 = 5;
/// errno for a full device.
pub const ENOSPC: i32 = 28;
/// errno for a permission refusal.
pub const EACCES: i32 = 13;
/// errno for an exceeded disk quota (a full disk, as far as this user goes).
pub const EDQUOT: i32 = 122;

/// True when `err` is a fault of this node's own disk (EIO, ENOSPC,
/// EACCES), as opposed to a missing file or bad input. Peers should stop
/// asking a replica whose disk reports these.
pub fn is_local_disk_fault(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(EIO | ENOSPC | EACCES))
}

/// True when `err` says the disk (or the user's quota on it) is full:
/// ENOSPC or EDQUOT. Unlike the other local faults this one passes once
/// space is freed, so a write that failed with it may be retried; nothing
/// else about the disk is in doubt.
pub fn is_no_space(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// How a file is opened. Mirrors the POSIX flags the callers need; build it
/// with the constructors ([`OpenOptions::read_only`],
/// [`OpenOptions::read_write`], [`OpenOptions::create_read_write`]) or the
/// chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// Open for reading.
    pub read: bool,
    /// Open for writing.
    pub write: bool,
    /// Create the file when it does not exist.
    pub create: bool,
    /// Fail with `AlreadyExists` when the file exists (implies create).
    pub create_new: bool,
    /// Truncate the file to zero length on open.
    pub truncate: bool,
}

impl OpenOptions {
    /// Read-only access to an existing file.
    pub const fn read_only() -> Self {
        Self {
            read: true,
            write: false,
            create: false,
            create_new: false,
            truncate: false,
        }
    }

    /// Read and write access to an existing file.
    pub const fn read_write() -> Self {
        Self {
            read: true,
            write: true,
            create: false,
            create_new: false,
            truncate: false,
        }
    }

    /// Read and write access, creating the file when absent (never
    /// truncating). compio's `File::create` opens write-only; this is the
    /// variant callers that read back what they wrote need.
    pub const fn create_read_write() -> Self {
        Self {
            read: true,
            write: true,
            create: true,
            create_new: false,
            truncate: false,
        }
    }

    /// Sets [`OpenOptions::truncate`].
    pub const fn truncate(mut self, truncate: bool) -> Self {
        self.truncate = truncate;
        self
    }

    /// Sets [`OpenOptions::create_new`].
    pub const fn create_new(mut self, create_new: bool) -> Self {
        self.create_new = create_new;
        self
    }
}

/// What a directory entry or a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Anything else (symlink, socket, device…).
    Other,
}

/// The metadata callers need from a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    /// Length in bytes (for a directory, whatever the filesystem reports).
    pub len: u64,
    /// What the path names.
    pub kind: FileKind,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's file name (not a path).
    pub name: OsString,
    /// What the entry names.
    pub kind: FileKind,
}

impl DirEntry {
    /// The name as UTF-8, or `None` when it is not valid UTF-8 (replog never
    /// creates such names, so callers treat them as foreign).
    pub fn name_str(&self) -> Option<&str> {
        self.name.to_str()
    }
}

/// A filesystem: namespace operations, plus the timers callers use for
/// retry backoff (so the simulator can run them without a clock).
#[allow(async_fn_in_trait)] // thread-per-core: futures never cross threads.
pub trait Fs: Clone + 'static {
    /// An open file of this filesystem.
    type File: FsFile;

    /// Opens (or creates, per `opts`) the file at `path`.
    async fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Self::File>;
    /// Renames `from` to `to`, replacing `to` if it is a file. Durable only
    /// after [`Fs::sync_dir`] of the directories involved.
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Unlinks a file. Durable only after [`Fs::sync_dir`] of its parent.
    async fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Creates one directory; fails with `AlreadyExists` if it exists.
    async fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Creates a directory and any missing parents; an existing directory is
    /// not an error.
    async fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory.
    async fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Lists a directory (without `.` and `..`), in no guaranteed order.
    async fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;
    /// Metadata of `path` (following symlinks).
    async fn metadata(&self, path: &Path) -> io::Result<Metadata>;
    /// Makes the directory's entries (creates, renames, unlinks) durable.
    /// A file's own `sync_all` does **not** do this.
    async fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Sleeps for `duration` (virtual time in the simulator).
    async fn sleep(&self, duration: Duration);
    /// Lets other tasks on this shard run before continuing.
    async fn yield_now(&self);

    /// True when `path` exists (a `NotFound` from [`Fs::metadata`] is
    /// `false`; any other error propagates).
    async fn exists(&self, path: &Path) -> io::Result<bool> {
        match self.metadata(path).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// An open file. Positional I/O only: there is no shared cursor, so two
/// readers of one handle cannot disturb each other.
#[allow(async_fn_in_trait)] // thread-per-core: futures never cross threads.
#[allow(clippy::len_without_is_empty)] // `len` is an async stat, not a container size.
pub trait FsFile: 'static {
    /// Reads up to `max` bytes at `pos`, appending them to `buf` (bounded
    /// also by `buf.capacity() - buf.len()`, which must be nonzero for the
    /// call to make progress). Returns the count, 0 at end of file; may read
    /// fewer bytes than asked.
    async fn read_at(&self, buf: Vec<u8>, pos: u64, max: usize) -> BufResult<usize, Vec<u8>>;
    /// Writes up to all of `buf` at `pos`; may write fewer bytes.
    async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B>;
    /// Makes the file's data (and the size needed to read it) durable.
    async fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and all its metadata durable.
    async fn sync_all(&self) -> io::Result<()>;
    /// Truncates or extends the file to `len` bytes. Durable after a sync.
    async fn set_len(&self, len: u64) -> io::Result<()>;
    /// The current length of the file.
    async fn len(&self) -> io::Result<u64>;
    /// Reserves disk space for `len` bytes from 0 without changing the
    /// file's length (`FALLOC_FL_KEEP_SIZE`). Best effort: an
    /// implementation without the call returns `Ok(())`.
    async fn preallocate(&self, len: u64) -> io::Result<()>;

    /// Reads exactly `len` bytes at `pos` into a fresh buffer, looping over
    /// short reads. End of file before `len` bytes is `UnexpectedEof`.
    async fn read_exact_at(&self, len: usize, pos: u64) -> io::Result<Vec<u8>> {
        self.read_exact_into(Vec::with_capacity(len), len, pos)
            .await
    }

    /// Like [`FsFile::read_exact_at`] but reuses `buf` (cleared first; it
    /// grows when its capacity is below `len`).
    async fn read_exact_into(&self, mut buf: Vec<u8>, len: usize, pos: u64) -> io::Result<Vec<u8>> {
        buf.clear();
        buf.reserve_exact(len);
        while buf.len() < len {
            let filled = buf.len();
            let BufResult(res, back) = self.read_at(buf, pos + filled as u64, len - filled).await;
            buf = back;
            if res? == 0 {
                return Err(unexpected_eof(pos, len, filled));
            }
        }
        Ok(buf)
    }

    /// Reads the whole file, refusing (with `InvalidData`) one longer than
    /// `max_bytes` before allocating: for small records (superblocks,
    /// offsets) whose size on disk is untrusted input.
    async fn read_to_end_bounded(&self, max_bytes: u64) -> io::Result<Vec<u8>> {
        let len = self.len().await?;
        if len > max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file of {len} bytes exceeds the {max_bytes}-byte ceiling"),
            ));
        }
        self.read_exact_at(len as usize, 0).await
    }

    /// Writes all of `buf` at `pos`, looping over short writes. A write that
    /// makes no progress is `WriteZero`.
    async fn write_all_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<(), B> {
        let total = buf.buf_len();
        let BufResult(res, buf) = self.write_at(buf, pos).await;
        let mut written = match res {
            Ok(n) => n,
            Err(e) => return BufResult(Err(e), buf),
        };
        if written >= total {
            return BufResult(Ok(()), buf);
        }
        // Short write: continue with a slice of the same buffer (no copy).
        let mut slice = buf.slice(written..);
        loop {
            let BufResult(res, back) = self.write_at(slice, pos + written as u64).await;
            match res {
                Ok(0) => {
                    let err = io::Error::new(io::ErrorKind::WriteZero, "write made no progress");
                    return BufResult(Err(err), back.into_inner());
                }
                Ok(n) => {
                    written += n;
                    let inner = back.into_inner();
                    if written >= total {
                        return BufResult(Ok(()), inner);
                    }
                    slice = inner.slice(written..);
                }
                Err(e) => return BufResult(Err(e), back.into_inner()),
            }
        }
    }
}

/// Replaces the file at `path` with `bytes` so that a crash at any point
/// leaves either the old content or the new, never a mix: write a sibling
/// (`path` + `sibling_suffix`, truncated first), `sync_all` it, rename it
/// over `path`, then sync the parent directory (the rename is the commit
/// point; without the directory sync it could be undone by a crash). A
/// sibling left behind by a crash is the caller's to sweep.
pub async fn replace_file_durably<F: Fs>(
    fs: &F,
    path: &Path,
    bytes: Vec<u8>,
    sibling_suffix: &str,
) -> io::Result<()> {
    let mut sibling = path.as_os_str().to_os_string();
    sibling.push(sibling_suffix);
    let sibling = std::path::PathBuf::from(sibling);
    let file = fs
        .open(&sibling, OpenOptions::create_read_write().truncate(true))
        .await?;
    let BufResult(res, _) = file.write_all_at(bytes, 0).await;
    res?;
    file.sync_all().await?;
    drop(file);
    fs.rename(&sibling, path).await?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs.sync_dir(parent).await
}

fn unexpected_eof(pos: u64, len: usize, filled: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("end of file after {filled} of {len} bytes read at position {pos}"),
    )
}

/// Builds an `io::Error` carrying a raw errno, as the kernel would report it.
pub fn errno_error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// A future that returns `Pending` once (waking itself) so the executor
/// runs other ready tasks before resuming the caller.
#[derive(Debug, Default)]
pub(crate) struct YieldNow {
    yielded: bool,
}

impl std::future::Future for YieldNow {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.yielded {
            return std::task::Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}
