//! The install marker: the durable record of an install in flight (its
//! op, identity and frontier), written before the superblock record that
//! carries the new frontier and removed last, and the boot step that reads
//! it to tell an interrupted install from synced data gone missing.

use common::{Offset, Op};
use std::io;
use std::path::Path;

use common::le_cursor::{LeField, tiles};
use journal::SuperblockStore;
use storage::fs::{Fs, FsFile};
use xxhash_rust::xxh3::xxh3_64;

use super::{remove_if_present, segment_files};
use crate::bus::MessageBus;
use crate::offset_storage::REPLACEMENT_SUFFIX;
use crate::partition::Partition;

/// File in the partition directory naming an install in flight.
pub const INSTALL_MARKER_FILE: &str = "install.pending";
/// "RIM1" as a little-endian u32.
const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"RIM1");

// The marker's fields, each declared once for the encoder and the decoder.
const MAGIC: LeField<u32> = LeField::at(0);
const COMMIT_OP: LeField<u64> = LeField::at(4);
const CHECKSUM: LeField<u128> = LeField::at(12);
const FRONTIER: LeField<u64> = LeField::at(28);
/// xxh3-64 of every byte before it.
const SUM: LeField<u64> = LeField::at(36);
const MARKER_LEN: usize = SUM.end();
const _: () = assert!(tiles(
    MARKER_LEN,
    &[
        MAGIC.range(),
        COMMIT_OP.range(),
        CHECKSUM.range(),
        FRONTIER.range(),
        SUM.range()
    ]
));

/// The record of an install in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InstallMarker {
    pub commit_op: u64,
    pub checksum: u128,
    pub frontier: u64,
}

impl InstallMarker {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; MARKER_LEN];
        MAGIC.put(&mut out, MARKER_MAGIC);
        COMMIT_OP.put(&mut out, self.commit_op);
        CHECKSUM.put(&mut out, self.checksum);
        FRONTIER.put(&mut out, self.frontier);
        let sum = xxh3_64(&out[..SUM.start()]);
        SUM.put(&mut out, sum);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = <&[u8; MARKER_LEN]>::try_from(bytes).ok()?;
        if MAGIC.get(bytes) != MARKER_MAGIC {
            return None;
        }
        if SUM.get(bytes) != xxh3_64(&bytes[..SUM.start()]) {
            return None;
        }
        Some(Self {
            commit_op: COMMIT_OP.get(bytes),
            checksum: CHECKSUM.get(bytes),
            frontier: FRONTIER.get(bytes),
        })
    }
}

/// Boot step for an install a crash interrupted. Reads the marker; when it
/// matches the superblock's applied point and frontier (the install got
/// past its frontier record), every segment, staging and offset file is
/// removed and the directory synced, so the open that follows plants an
/// empty segment at the frontier: an empty, honestly lagging partition,
/// which the transfer-needed record ([`crate::state_transfer::missing`]), written before
/// the marker goes, keeps lagging across reboots until an install.
/// When it does not match, the superblock write never landed and the old
/// state stands. Either way the marker is removed last. Returns whether the
/// directory was converged.
///
/// An unreadable marker is treated as matching: the superblock frontier is
/// then kept, and nothing whose completeness is unknown is served.
pub(crate) async fn recover_interrupted_install<F: Fs>(
    fs: &F,
    dir: &Path,
    applied: (u64, u128, u64),
) -> io::Result<bool> {
    let path = dir.join(INSTALL_MARKER_FILE);
    let mut sibling = path.as_os_str().to_os_string();
    sibling.push(REPLACEMENT_SUFFIX);
    remove_if_present(fs, Path::new(&sibling)).await?;
    let bytes = match fs.open(&path, storage::fs::OpenOptions::read_only()).await {
        Ok(file) => file.read_to_end_bounded(MARKER_LEN as u64 + 1).await?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let marker = InstallMarker::decode(&bytes);
    let in_flight = marker.is_none_or(|m| (m.commit_op, m.checksum, m.frontier) == applied);
    if in_flight {
        tracing::warn!(dir = %dir.display(), frontier = applied.2, op = applied.0, "an install was interrupted after recording its frontier: converging to an empty partition");
        for file in segment_files(fs, dir).await? {
            remove_if_present(fs, &file).await?;
        }
        fs.sync_dir(dir).await?;
        crate::offsets::ConsumerOffsets::new(dir)
            .clear_all(fs)
            .await?;
        // Before the marker goes: once it is gone, only this record says
        // that nothing below the frontier is held here.
        crate::missing_history::write_missing_history(
            fs,
            dir,
            crate::missing_history::MissingHistory {
                commit_op: Op(applied.0),
                frontier: Offset(applied.2),
            },
        )
        .await?;
    } else {
        tracing::warn!(dir = %dir.display(), "an install was interrupted before recording its frontier: the old state stands");
    }
    fs.remove_file(&path).await?;
    fs.sync_dir(dir).await?;
    Ok(in_flight)
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// The install's last step; a failure only means a reboot converges.
    pub(super) async fn remove_install_marker(&self) {
        let path = self.dir.join(INSTALL_MARKER_FILE);
        let removed = async {
            remove_if_present(&self.fs, &path).await?;
            self.fs.sync_dir(&self.dir).await
        };
        if let Err(error) = removed.await {
            tracing::warn!(path = %path.display(), %error, "could not remove the install marker; a reboot converges this partition to empty");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::InstallMarker;

    #[test]
    fn marker_round_trips_and_rejects_rot() {
        let m = InstallMarker {
            commit_op: 7,
            checksum: 0xfeed,
            frontier: 42,
        };
        let mut bytes = m.encode();
        assert_eq!(InstallMarker::decode(&bytes), Some(m));
        bytes[5] ^= 1;
        assert_eq!(InstallMarker::decode(&bytes), None);
    }
}
