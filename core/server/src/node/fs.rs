//! The filesystem a replica's shards run on: the real one (io_uring),
//! with every sync timed into the shard's fsync histogram.
//!
//! A wrapper here rather than a hook in `storage`: the storage, journal
//! and partition code stay free of clocks (the simulator runs them on a
//! virtual one), and the cost is one `Instant` pair per sync — noise
//! beside the sync itself. Everything else is forwarded unchanged.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use storage::fs::{
    BufResult, DirEntry, Fs, FsFile, IoBuf, Metadata, OpenOptions, RealFile, RealFs,
};

/// [`RealFs`] with timed syncs.
#[derive(Debug, Clone)]
pub struct MeteredFs {
    fsync: Histogram,
}

impl MeteredFs {
    /// The real filesystem, its syncs observed into `fsync` (seconds).
    pub fn new(fsync: Histogram) -> Self {
        Self { fsync }
    }
}

/// A [`RealFile`] with timed syncs.
#[derive(Debug)]
pub struct MeteredFile {
    inner: RealFile,
    fsync: Histogram,
}

async fn timed<T>(fsync: &Histogram, sync: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    let started = Instant::now();
    let result = sync.await;
    fsync.observe(started.elapsed().as_secs_f64());
    result
}

impl Fs for MeteredFs {
    type File = MeteredFile;

    async fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<MeteredFile> {
        let inner = RealFs.open(path, opts).await?;
        Ok(MeteredFile {
            inner,
            fsync: self.fsync.clone(),
        })
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path).await
    }

    async fn create_dir(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir(path).await
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir_all(path).await
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_dir(path).await
    }

    async fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        RealFs.read_dir(path).await
    }

    async fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        RealFs.metadata(path).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        timed(&self.fsync, RealFs.sync_dir(path)).await
    }

    async fn sleep(&self, duration: Duration) {
        RealFs.sleep(duration).await;
    }

    async fn yield_now(&self) {
        RealFs.yield_now().await;
    }
}

impl FsFile for MeteredFile {
    async fn read_at(&self, buf: Vec<u8>, pos: u64, max: usize) -> BufResult<usize, Vec<u8>> {
        self.inner.read_at(buf, pos, max).await
    }

    async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        self.inner.write_at(buf, pos).await
    }

    async fn sync_data(&self) -> io::Result<()> {
        timed(&self.fsync, self.inner.sync_data()).await
    }

    async fn sync_all(&self) -> io::Result<()> {
        timed(&self.fsync, self.inner.sync_all()).await
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
