//! The durable record that a replica holds no history below its frontier.
//!
//! A converge (after a failed install at runtime, or at boot from an
//! interrupted install's marker) leaves the partition as one empty segment
//! at the offer's frontier, applied at the offer's `commit_op`. The op log
//! and the offset space then agree with the group's, but every message below
//! the frontier is missing here. [`TRANSFER_NEEDED_FILE`] records that fact
//! so that it survives a reboot: while it stands the partition reports
//! `state_transfer_needed()`, refuses to serve an offer, answers polls below
//! the frontier with `PollError::HistoryMissing`, and stays out of every
//! quorum (see `Partition::missing_history`). Only a completed install
//! removes it.
//!
//! The file is written like the install marker: a checksummed record in a
//! synced sibling, renamed over the name, then the directory synced. A
//! record that does not verify is read as present, at the superblock's
//! frontier: the replica then asks for a transfer it may not need rather
//! than serve history it may not hold.

use common::{Offset, Op};
use std::io;
use std::path::Path;

use common::le_cursor::{LeField, tiles};
use storage::fs::{Fs, FsFile, OpenOptions, replace_file_durably};
use xxhash_rust::xxh3::xxh3_64;

use crate::offset_storage::REPLACEMENT_SUFFIX;

/// File in the partition directory recording that history below the
/// frontier is missing and a state transfer is needed.
pub const TRANSFER_NEEDED_FILE: &str = "transfer.needed";
/// "RTN1" as a little-endian u32.
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RTN1");

// The record's fields, each declared once for the encoder and the decoder.
const MAGIC: LeField<u32> = LeField::at(0);
const COMMIT_OP: LeField<u64> = LeField::at(4);
const FRONTIER: LeField<u64> = LeField::at(12);
/// xxh3-64 of every byte before it.
const SUM: LeField<u64> = LeField::at(20);
const RECORD_LEN: usize = SUM.end();
const _: () = assert!(tiles(
    RECORD_LEN,
    &[
        MAGIC.range(),
        COMMIT_OP.range(),
        FRONTIER.range(),
        SUM.range()
    ]
));

/// What the record says: the converge left the partition applied at
/// `commit_op` with nothing held below `frontier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingHistory {
    /// The op the converged partition is applied at.
    pub commit_op: Op,
    /// The offset below which nothing is held.
    pub frontier: Offset,
}

impl MissingHistory {
    fn encode(self) -> Vec<u8> {
        let mut out = vec![0u8; RECORD_LEN];
        MAGIC.put(&mut out, RECORD_MAGIC);
        COMMIT_OP.put(&mut out, self.commit_op.0);
        FRONTIER.put(&mut out, self.frontier.0);
        let sum = xxh3_64(&out[..SUM.start()]);
        SUM.put(&mut out, sum);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = <&[u8; RECORD_LEN]>::try_from(bytes).ok()?;
        if MAGIC.get(bytes) != RECORD_MAGIC {
            return None;
        }
        if SUM.get(bytes) != xxh3_64(&bytes[..SUM.start()]) {
            return None;
        }
        Some(Self {
            commit_op: Op(COMMIT_OP.get(bytes)),
            frontier: Offset(FRONTIER.get(bytes)),
        })
    }
}

/// Makes `record` durable in `dir` (sibling, sync, rename, directory sync).
///
/// # Errors
/// The filesystem's error; the previous record (if any) still stands.
pub async fn write_missing_history<F: Fs>(
    fs: &F,
    dir: &Path,
    record: MissingHistory,
) -> io::Result<()> {
    replace_file_durably(
        fs,
        &dir.join(TRANSFER_NEEDED_FILE),
        record.encode(),
        REPLACEMENT_SUFFIX,
    )
    .await
}

/// Reads the record in `dir`. A record that does not verify is read as
/// present with `fallback` (the superblock's applied point and frontier).
///
/// # Errors
/// The filesystem's error other than `NotFound`.
pub async fn read_missing_history<F: Fs>(
    fs: &F,
    dir: &Path,
    fallback: MissingHistory,
) -> io::Result<Option<MissingHistory>> {
    let path = dir.join(TRANSFER_NEEDED_FILE);
    let bytes = match fs.open(&path, OpenOptions::read_only()).await {
        Ok(file) => file.read_to_end_bounded(RECORD_LEN as u64 + 1).await?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(MissingHistory::decode(&bytes).unwrap_or_else(|| {
        tracing::warn!(path = %path.display(), "transfer-needed record does not verify; keeping the partition lagging at its frontier");
        fallback
    })))
}

/// Removes the record (and a sibling a crash left), then syncs `dir`.
///
/// # Errors
/// The filesystem's error; the record may still stand.
pub async fn clear_missing_history<F: Fs>(fs: &F, dir: &Path) -> io::Result<()> {
    let path = dir.join(TRANSFER_NEEDED_FILE);
    let mut sibling = path.as_os_str().to_os_string();
    sibling.push(REPLACEMENT_SUFFIX);
    for p in [Path::new(&sibling), path.as_path()] {
        match fs.remove_file(p).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    fs.sync_dir(dir).await
}

#[cfg(test)]
mod tests {
    use super::MissingHistory;
    use common::{Offset, Op};

    #[test]
    fn record_round_trips_and_rejects_rot() {
        let m = MissingHistory {
            commit_op: Op(9),
            frontier: Offset(40),
        };
        let mut bytes = m.encode();
        assert_eq!(MissingHistory::decode(&bytes), Some(m));
        bytes[6] ^= 1;
        assert_eq!(MissingHistory::decode(&bytes), None);
        assert_eq!(MissingHistory::decode(&bytes[..10]), None);
    }
}
