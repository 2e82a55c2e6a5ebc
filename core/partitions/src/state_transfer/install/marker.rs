//! The install marker: the durable record of an install in flight (its
//! op, identity and frontier), written before the superblock record that
//! carries the new frontier and removed last, and the boot step that reads
//! it to tell an interrupted install from synced data gone missing.

use common::{Offset, Op};
use std::io;
use std::path::Path;

use journal::SuperblockStore;
use storage::fs::{Fs, FsFile};
use xxhash_rust::xxh3::xxh3_64;

use super::{remove_if_present, segment_files};
use crate::bus::MessageBus;
use crate::offset_storage::REPLACEMENT_SUFFIX;
use crate::partition::Partition;

/// File in the partition directory naming an install in flight.
pub const INSTALL_MARKER_FILE: &str = "install.pending";
const MARKER_MAGIC: &[u8; 4] = b"RIM1";
const MARKER_LEN: usize = 4 + 8 + 16 + 8 + 8;

/// The record of an install in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InstallMarker {
    pub commit_op: u64,
    pub checksum: u128,
    pub frontier: u64,
}

impl InstallMarker {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MARKER_LEN);
        out.extend_from_slice(MARKER_MAGIC);
        out.extend_from_slice(&self.commit_op.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.extend_from_slice(&self.frontier.to_le_bytes());
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != MARKER_LEN || &bytes[..4] != MARKER_MAGIC {
            return None;
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if u64_at(MARKER_LEN - 8) != xxh3_64(&bytes[..MARKER_LEN - 8]) {
            return None;
        }
        let mut checksum = [0u8; 16];
        checksum.copy_from_slice(&bytes[12..28]);
        Some(Self {
            commit_op: u64_at(4),
            checksum: u128::from_le_bytes(checksum),
            frontier: u64_at(28),
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
        crate::state_transfer::missing::write_missing_history(
            fs,
            dir,
            crate::state_transfer::missing::MissingHistory {
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
