//! The clean-stop record: what lets a replica of a group of several come
//! back after a clean stop as a full member instead of a quorum-invisible
//! one.
//!
//! A replica's prepare journal lives in memory, so after a restart it
//! cannot know what it acknowledged, and the restart rule
//! (docs/consensus.md §4) keeps it out of every quorum until the current
//! primary has told it the view's head. When every replica restarts at
//! once nobody can answer, and the group would stay unavailable for ever.
//!
//! A replica that stops cleanly can know better. If, when it stops, its
//! log head is its applied op (every prepare it ever acknowledged is
//! applied and durable in its files) and it is `Normal` in a view whose
//! log it installed, it has forgotten nothing: it is the same as a replica
//! that was cut off from the network. It writes this record last, after
//! every flush, and nothing is sent after it. The next boot takes the
//! record (reads it and removes it durably before the group sends
//! anything) and, if it matches the superblock, resumes as a member of
//! that view. A crash after that boot finds no record and restarts under
//! the rule again.
//!
//! ```text
//! 0   magic "RCS1"
//! 4   view u32
//! 8   log_view u32
//! 12  op u64        the applied op (= the log head at the stop)
//! 20  checksum u128 the applied op's identity
//! 36  xxh3-64 of bytes 0..36
//! ```

use common::Op;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use common::le_cursor::LeCursor;
use consensus::{push_trailer, split_verified_trailer};
use storage::fs::{Fs, FsFile, OpenOptions, replace_file_durably};

/// The record's file name in a group's directory.
pub const CLEAN_STOP_FILE: &str = "clean-stop";
/// Suffix of the sibling a write goes through (swept as staging).
const SIBLING_SUFFIX: &str = ".staging";
const MAGIC: [u8; 4] = *b"RCS1";
const SIZE: usize = 44;

/// What a cleanly stopped replica of a group knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanStop {
    /// Its view.
    pub view: u32,
    /// The latest view whose log it installed (equal to `view`).
    pub log_view: u32,
    /// Its applied op, which was also its log head.
    pub op: Op,
    /// The identity of that op.
    pub checksum: u128,
}

impl CleanStop {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIZE);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.view.to_le_bytes());
        out.extend_from_slice(&self.log_view.to_le_bytes());
        out.extend_from_slice(&self.op.0.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        push_trailer(&mut out);
        out
    }

    /// Decodes a record; `None` for anything but the exact layout.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != SIZE {
            return None;
        }
        let body = split_verified_trailer(bytes).ok()?;
        let mut c = LeCursor::new(body);
        if c.take(4).ok()? != MAGIC {
            return None;
        }
        Some(Self {
            view: c.u32().ok()?,
            log_view: c.u32().ok()?,
            op: Op(c.u64().ok()?),
            checksum: c.u128().ok()?,
        })
    }
}

fn path_in(dir: &Path) -> PathBuf {
    dir.join(CLEAN_STOP_FILE)
}

/// Writes the record durably into `dir` (sibling, sync, rename, directory
/// sync).
///
/// # Errors
/// The filesystem's error; a failed write leaves no usable record.
pub async fn record_clean_stop<F: Fs>(fs: &F, dir: &Path, stop: &CleanStop) -> io::Result<()> {
    replace_file_durably(fs, &path_in(dir), stop.encode(), SIBLING_SUFFIX).await
}

/// Takes the record from `dir`: reads it, then removes it and syncs the
/// directory, and only then returns it. `None` when there is none, when
/// it does not decode (it is removed all the same), or when it could not
/// be removed durably (a record that might survive this boot must not be
/// trusted by it: a crash later in this boot would find it again).
pub async fn take_clean_stop<F: Fs>(fs: &F, dir: &Path) -> Option<CleanStop> {
    let bytes = take_file(fs, dir, CLEAN_STOP_FILE, SIZE as u64).await?;
    let decoded = CleanStop::decode(&bytes);
    if decoded.is_none() {
        tracing::warn!(dir = %dir.display(), "clean-stop record does not decode; restarting as a replica that may have forgotten");
    }
    decoded
}

/// The file of a shard's clean-stop records, in the shard's directory:
/// one file for every partition group of the shard, so a clean stop costs
/// one durable write and a boot one read and one removal, whatever the
/// number of groups.
pub const CLEAN_STOPS_FILE: &str = "clean-stops";
const SET_MAGIC: [u8; 4] = *b"RCSS";
const SET_HEADER: usize = 4 + 1 + 4;
const SET_ENTRY: usize = 8 + 4 + 4 + 8 + 16;
/// Ceiling on the records one file holds (a shard's groups).
pub const CLEAN_STOPS_MAX: u32 = 1 << 20;

/// Encodes a shard's records, one per group, in increasing group order.
///
/// ```text
/// 0   magic "RCSS"
/// 4   version u8 (1)
/// 5   count u32
/// 9   count × { group u64, view u32, log_view u32, op u64, checksum u128 }
/// ..  xxh3-64 of everything before
/// ```
pub fn encode_clean_stops(stops: &BTreeMap<u64, CleanStop>) -> Vec<u8> {
    let mut out = Vec::with_capacity(SET_HEADER + stops.len() * SET_ENTRY + 8);
    out.extend_from_slice(&SET_MAGIC);
    out.push(1);
    out.extend_from_slice(&u32::try_from(stops.len()).unwrap_or(u32::MAX).to_le_bytes());
    for (group, stop) in stops {
        out.extend_from_slice(&group.to_le_bytes());
        out.extend_from_slice(&stop.view.to_le_bytes());
        out.extend_from_slice(&stop.log_view.to_le_bytes());
        out.extend_from_slice(&stop.op.0.to_le_bytes());
        out.extend_from_slice(&stop.checksum.to_le_bytes());
    }
    push_trailer(&mut out);
    out
}

/// Decodes a shard's records; `None` for anything but the exact layout
/// (the count is checked against the ceiling and the bytes present before
/// anything is allocated; groups strictly increasing).
pub fn decode_clean_stops(bytes: &[u8]) -> Option<BTreeMap<u64, CleanStop>> {
    let body = split_verified_trailer(bytes).ok()?;
    let mut c = LeCursor::new(body);
    if c.take(4).ok()? != SET_MAGIC || c.u8().ok()? != 1 {
        return None;
    }
    let count = c.u32().ok()?;
    if count > CLEAN_STOPS_MAX || body.len() != SET_HEADER + count as usize * SET_ENTRY {
        return None;
    }
    let mut stops = BTreeMap::new();
    let mut last = None;
    for _ in 0..count {
        let group = c.u64().ok()?;
        if last.is_some_and(|l| group <= l) {
            return None;
        }
        last = Some(group);
        let stop = CleanStop {
            view: c.u32().ok()?,
            log_view: c.u32().ok()?,
            op: Op(c.u64().ok()?),
            checksum: c.u128().ok()?,
        };
        stops.insert(group, stop);
    }
    Some(stops)
}

/// Writes a shard's records durably into its directory (sibling, sync,
/// rename, directory sync); an empty set writes nothing.
///
/// # Errors
/// The filesystem's error; no usable record is left then.
pub async fn record_clean_stops<F: Fs>(
    fs: &F,
    dir: &Path,
    stops: &BTreeMap<u64, CleanStop>,
) -> io::Result<()> {
    if stops.is_empty() {
        return Ok(());
    }
    if stops.len() > CLEAN_STOPS_MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} clean-stop records exceed the ceiling of {CLEAN_STOPS_MAX}",
                stops.len()
            ),
        ));
    }
    replace_file_durably(
        fs,
        &dir.join(CLEAN_STOPS_FILE),
        encode_clean_stops(stops),
        SIBLING_SUFFIX,
    )
    .await
}

/// Takes a shard's records from its directory, as [`take_clean_stop`]
/// takes one group's: removed durably before they are returned; empty when
/// there are none, when they do not decode, or when the removal failed.
pub async fn take_clean_stops<F: Fs>(fs: &F, dir: &Path) -> BTreeMap<u64, CleanStop> {
    let max = (SET_HEADER + CLEAN_STOPS_MAX as usize * SET_ENTRY + 8) as u64;
    let Some(bytes) = take_file(fs, dir, CLEAN_STOPS_FILE, max).await else {
        return BTreeMap::new();
    };
    decode_clean_stops(&bytes).unwrap_or_else(|| {
        tracing::warn!(dir = %dir.display(), "shard clean-stop records do not decode; every group restarts as one that may have forgotten");
        BTreeMap::new()
    })
}

/// Reads `dir/name` (at most `max` bytes), then removes it and syncs the
/// directory; `None` when it is absent, unreadable, or not removed.
async fn take_file<F: Fs>(fs: &F, dir: &Path, name: &str, max: u64) -> Option<Vec<u8>> {
    let path = dir.join(name);
    if !fs.exists(&path).await.unwrap_or(false) {
        return None;
    }
    let read = async {
        let file = fs.open(&path, OpenOptions::read_only()).await?;
        file.read_to_end_bounded(max + 1).await
    };
    let bytes = match read.await {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "clean-stop record unreadable");
            None
        }
    };
    let removed = async {
        fs.remove_file(&path).await?;
        fs.sync_dir(dir).await
    };
    if let Err(error) = removed.await {
        tracing::warn!(path = %path.display(), %error, "clean-stop record not removed; not trusting it");
        return None;
    }
    bytes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use storage::fs::SimFs;

    fn stop() -> CleanStop {
        CleanStop {
            view: 3,
            log_view: 3,
            op: Op(77),
            checksum: 0xABCD_EF01_2345_6789_0000_1111_2222_3333,
        }
    }

    #[test]
    fn given_a_record_when_encoded_should_decode_and_refuse_any_change() {
        let bytes = stop().encode();
        assert_eq!(bytes.len(), SIZE);
        assert_eq!(CleanStop::decode(&bytes), Some(stop()));
        for at in 0..SIZE {
            let mut bad = bytes.clone();
            bad[at] ^= 0x04;
            assert_eq!(CleanStop::decode(&bad), None, "byte {at}");
        }
        assert_eq!(CleanStop::decode(&bytes[..SIZE - 1]), None);
    }

    fn set() -> BTreeMap<u64, CleanStop> {
        (1..=3u64)
            .map(|g| {
                let mut s = stop();
                s.op += g;
                (g << 8, s)
            })
            .collect()
    }

    #[test]
    fn given_a_shard_set_when_encoded_should_decode_and_refuse_any_change() {
        let bytes = encode_clean_stops(&set());
        assert_eq!(decode_clean_stops(&bytes), Some(set()));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(decode_clean_stops(&bad), None, "byte {at}");
        }
        for len in 0..bytes.len() {
            assert_eq!(decode_clean_stops(&bytes[..len]), None, "len {len}");
        }
        assert_eq!(
            decode_clean_stops(&encode_clean_stops(&BTreeMap::new())),
            Some(BTreeMap::new())
        );
    }

    #[test]
    fn given_a_set_with_a_huge_count_or_unordered_groups_when_decoded_should_refuse() {
        // A count past the ceiling under a valid trailer: refused before
        // anything is allocated for it.
        let mut out = SET_MAGIC.to_vec();
        out.push(1);
        out.extend_from_slice(&u32::MAX.to_le_bytes());
        push_trailer(&mut out);
        assert_eq!(decode_clean_stops(&out), None);
        // Two entries with the same group.
        let mut bytes = encode_clean_stops(&set());
        let second = SET_HEADER + SET_ENTRY;
        let first_group = bytes[SET_HEADER..SET_HEADER + 8].to_vec();
        bytes[second..second + 8].copy_from_slice(&first_group);
        let len = bytes.len() - 8;
        bytes.truncate(len);
        push_trailer(&mut bytes);
        assert_eq!(decode_clean_stops(&bytes), None);
    }

    #[test]
    fn given_a_recorded_set_when_taken_should_return_it_once_and_survive_a_power_cut() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let fs = SimFs::new(2);
            let dir = Path::new("/shard-0");
            fs.create_dir_all(dir).await.unwrap();
            fs.sync_dir(Path::new("/")).await.unwrap();
            assert!(take_clean_stops(&fs, dir).await.is_empty());
            record_clean_stops(&fs, dir, &BTreeMap::new())
                .await
                .unwrap();
            assert!(!fs.exists(&dir.join(CLEAN_STOPS_FILE)).await.unwrap());
            record_clean_stops(&fs, dir, &set()).await.unwrap();
            fs.crash_with(storage::fs::CrashMode::DropAll);
            assert_eq!(take_clean_stops(&fs, dir).await, set());
            fs.crash_with(storage::fs::CrashMode::DropAll);
            assert!(
                take_clean_stops(&fs, dir).await.is_empty(),
                "taken once, durably"
            );
        });
    }

    #[test]
    fn given_a_recorded_stop_when_taken_should_return_it_once_and_leave_nothing() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let fs = SimFs::new(1);
            let dir = Path::new("/g");
            fs.create_dir_all(dir).await.unwrap();
            fs.sync_dir(Path::new("/")).await.unwrap();
            assert_eq!(take_clean_stop(&fs, dir).await, None);
            record_clean_stop(&fs, dir, &stop()).await.unwrap();
            // Durable: it survives a power cut.
            fs.crash_with(storage::fs::CrashMode::DropAll);
            assert_eq!(take_clean_stop(&fs, dir).await, Some(stop()));
            assert_eq!(take_clean_stop(&fs, dir).await, None, "taken once");
            // Its removal is durable too.
            fs.crash_with(storage::fs::CrashMode::DropAll);
            assert_eq!(take_clean_stop(&fs, dir).await, None);
            // Garbage is removed and not trusted.
            let file = fs
                .open(&dir.join(CLEAN_STOP_FILE), OpenOptions::create_read_write())
                .await
                .unwrap();
            let storage::fs::BufResult(res, _) = file.write_all_at(vec![7u8; SIZE], 0).await;
            res.unwrap();
            assert_eq!(take_clean_stop(&fs, dir).await, None);
            assert!(!fs.exists(&dir.join(CLEAN_STOP_FILE)).await.unwrap());
        });
    }
}
