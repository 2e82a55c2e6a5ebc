//! The disk's own sequential speed for the transfer's byte count, in the
//! directory the replicas use, measured in the same run: what a state
//! transfer on one machine has to do at the least is read the partition
//! on the source and write it on the target.
//!
//! The write goes through the page cache and ends with an `fsync`, timed
//! together (a transfer's install syncs what it wrote too). The read uses
//! `O_DIRECT` where the file system allows it, so it comes from the disk
//! and not from the pages the write just left in memory; where it does not
//! (tmpfs, another OS) the read is buffered, comes from the page cache, and
//! the report says so. Either way the replicas' own reads during the
//! transfer may well be served from the page cache (the partition was
//! written moments before): the comparison is with the disk, not with the
//! memory.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ClusterError;

/// Bytes per write and per read.
const CHUNK_BYTES: usize = 4 << 20;
/// `O_DIRECT`'s buffer, offset and length alignment (a page covers every
/// logical block size in use).
const DIRECT_ALIGN: usize = 4096;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const O_DIRECT: Option<i32> = Some(0o40000);
#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
const O_DIRECT: Option<i32> = Some(0o200000);
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
const O_DIRECT: Option<i32> = None;

/// The probe's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DiskSpeed {
    /// The probe file (deleted afterwards).
    pub path: PathBuf,
    /// Bytes written and read: the transfer's, rounded up to a whole chunk.
    pub bytes: u64,
    /// Writing them and the `fsync`, in seconds.
    pub write_seconds: f64,
    /// Reading them back, in seconds.
    pub read_seconds: f64,
    /// Whether the read bypassed the page cache (`O_DIRECT`).
    pub read_direct: bool,
    /// `bytes / write_seconds`, 10^6 B/s.
    pub write_megabytes_per_second: f64,
    /// `bytes / read_seconds`, 10^6 B/s.
    pub read_megabytes_per_second: f64,
    /// Read and write one after the other: `bytes / (write + read)`, the
    /// speed a copy from this disk to this disk could reach.
    pub read_write_megabytes_per_second: f64,
}

/// Writes `bytes` (rounded up to whole chunks) to a file in `dir`, syncs,
/// reads them back, deletes the file. Blocking.
pub fn probe(dir: &Path, bytes: u64) -> Result<DiskSpeed, ClusterError> {
    let path = dir.join("disk-probe");
    let chunks = bytes.div_ceil(CHUNK_BYTES as u64).max(1);
    let total = chunks * CHUNK_BYTES as u64;
    let outcome = write_then_read(&path, chunks);
    let _ = std::fs::remove_file(&path);
    let (write, read, read_direct) = outcome?;
    let mbps = |secs: f64| {
        if secs > 0.0 {
            total as f64 / secs / 1e6
        } else {
            0.0
        }
    };
    let (write_seconds, read_seconds) = (write.as_secs_f64(), read.as_secs_f64());
    Ok(DiskSpeed {
        path,
        bytes: total,
        write_seconds,
        read_seconds,
        read_direct,
        write_megabytes_per_second: mbps(write_seconds),
        read_megabytes_per_second: mbps(read_seconds),
        read_write_megabytes_per_second: mbps(write_seconds + read_seconds),
    })
}

fn write_then_read(path: &Path, chunks: u64) -> Result<(Duration, Duration, bool), ClusterError> {
    let io = |what: &str, source: std::io::Error| ClusterError::Io {
        what: format!("{what} {}", path.display()),
        source,
    };
    let mut backing = vec![0u8; CHUNK_BYTES + DIRECT_ALIGN];
    let start = backing
        .as_ptr()
        .align_offset(DIRECT_ALIGN)
        .min(DIRECT_ALIGN);
    let buf = &mut backing[start..start + CHUNK_BYTES];
    // Bytes no disk or hypervisor can compress or deduplicate away: a
    // xorshift stream, and a chunk counter in every block.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for word in buf.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    let started = Instant::now();
    let mut file = File::create(path).map_err(|e| io("creating", e))?;
    for c in 0..chunks {
        for block in buf.chunks_exact_mut(DIRECT_ALIGN) {
            block[..8].copy_from_slice(&c.to_le_bytes());
        }
        file.write_all(buf).map_err(|e| io("writing", e))?;
    }
    file.sync_all().map_err(|e| io("syncing", e))?;
    let write = started.elapsed();
    drop(file);

    let direct = O_DIRECT.and_then(|flag| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flag)
            .open(path)
            .ok()
    });
    let read_direct = direct.is_some();
    let started = Instant::now();
    let mut file = match direct {
        Some(file) => file,
        None => File::open(path).map_err(|e| io("opening", e))?,
    };
    let mut read = 0u64;
    loop {
        let n = match file.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io("reading", e)),
        };
        read += n as u64;
    }
    let read_time = started.elapsed();
    let want = chunks * CHUNK_BYTES as u64;
    if read != want {
        return Err(ClusterError::Io {
            what: format!("reading {} back", path.display()),
            source: std::io::Error::other(format!("{read} bytes of {want}")),
        });
    }
    Ok((write, read_time, read_direct))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_a_byte_count_when_probed_should_round_up_to_chunks_and_leave_no_file() {
        let dir = std::env::temp_dir().join(format!("replog-bench-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let speed = probe(&dir, CHUNK_BYTES as u64 + 1).unwrap();
        assert_eq!(speed.bytes, 2 * CHUNK_BYTES as u64);
        assert!(speed.write_seconds > 0.0 && speed.read_seconds > 0.0);
        let combined = speed.bytes as f64 / (speed.write_seconds + speed.read_seconds) / 1e6;
        assert!((speed.read_write_megabytes_per_second - combined).abs() < 1e-6);
        assert!(!speed.path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
