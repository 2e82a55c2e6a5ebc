//! The rejoin marker: shard 0's durable note that this replica started on
//! an empty disk in a cluster that already held data (its disk was
//! replaced), so that it may have acknowledged ops in an earlier life.
//!
//! While the marker stands, group 0 and every partition group created by
//! an op the earlier life may have seen start under the restart rule from
//! nothing (quorum-invisible until caught up) instead of as new members.
//! Which ops those are: every op up to group 0's head at the moment this
//! replica's group 0 first became quorum-visible again (`through_op`).
//! An op past that head was proposed after this boot's probe was answered,
//! so after the earlier life was gone; its groups are new to every replica.
//! Until that head is known, every group created counts as rejoining.
//!
//! `rejoin` in the shard-0 directory: magic `RPLJ`, version u8 (1),
//! through op u64 (`u64::MAX` while unknown), little-endian, then the
//! state-artifact checksum trailer (xxh3-64) of those 13 bytes. Written through a synced sibling, renamed,
//! directory synced (`storage::fs::replace_file_durably`); never removed
//! (once `through_op` is known it only affects groups created by ops at or
//! below it, which all exist by then).

use std::io;
use std::path::Path;

use common::Op;
use consensus::{push_trailer, split_verified_trailer};
use storage::fs::{Fs, FsFile, OpenOptions, replace_file_durably};

/// The marker's file name in the shard-0 directory.
pub const REJOIN_FILE: &str = "rejoin";
const SIBLING_SUFFIX: &str = ".replacing";
const MAGIC: [u8; 4] = *b"RPLJ";
const BODY_LEN: usize = 4 + 1 + 8;
const LEN: usize = BODY_LEN + 8;
const UNKNOWN: u64 = u64::MAX;

/// What the marker records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejoin {
    /// Group 0's head when this replica first counted again; `None` until
    /// then.
    pub through_op: Option<Op>,
}

impl Rejoin {
    /// Whether a group created by op `op` may have been seen by this
    /// replica's earlier life.
    pub const fn covers(&self, op: Op) -> bool {
        match self.through_op {
            None => true,
            Some(through) => op.0 <= through.0,
        }
    }

    /// The marker's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.extend_from_slice(&MAGIC);
        out.push(1);
        out.extend_from_slice(&self.through_op.map_or(UNKNOWN, |op| op.0).to_le_bytes());
        push_trailer(&mut out);
        out
    }

    /// Decodes the marker, failing closed.
    ///
    /// # Errors
    /// A sentence saying why the bytes are not a marker.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != LEN {
            return Err(format!("{} bytes, expected {LEN}", bytes.len()));
        }
        let body = split_verified_trailer(bytes).map_err(|_| "checksum mismatch".to_owned())?;
        if body[..4] != MAGIC || body[4] != 1 {
            return Err("not a rejoin marker of version 1".into());
        }
        let mut through = [0u8; 8];
        through.copy_from_slice(&body[5..13]);
        let through = u64::from_le_bytes(through);
        Ok(Self {
            through_op: (through != UNKNOWN).then_some(Op(through)),
        })
    }
}

/// Reads the marker from `shard_dir`; `Ok(None)` when there is none.
///
/// # Errors
/// The filesystem's error, or `InvalidData` naming the file when it does
/// not decode (a damaged marker must stop the boot: guessing "no marker"
/// would let a replaced disk vote).
pub async fn read<F: Fs>(fs: &F, shard_dir: &Path) -> io::Result<Option<Rejoin>> {
    let path = shard_dir.join(REJOIN_FILE);
    if !fs.exists(&path).await? {
        return Ok(None);
    }
    let file = fs.open(&path, OpenOptions::read_only()).await?;
    let bytes = file.read_to_end_bounded(LEN as u64 + 1).await?;
    Rejoin::decode(&bytes).map(Some).map_err(|reason| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {reason}", path.display()),
        )
    })
}

/// Writes `marker` into `shard_dir` durably.
///
/// # Errors
/// The filesystem's error; the old marker (or none) stands then.
pub async fn write<F: Fs>(fs: &F, shard_dir: &Path, marker: &Rejoin) -> io::Result<()> {
    replace_file_durably(
        fs,
        &shard_dir.join(REJOIN_FILE),
        marker.encode(),
        SIBLING_SUFFIX,
    )
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn given_marker_when_encoded_should_round_trip_and_refuse_any_change() {
        for marker in [
            Rejoin { through_op: None },
            Rejoin {
                through_op: Some(Op(41)),
            },
        ] {
            let bytes = marker.encode();
            assert_eq!(Rejoin::decode(&bytes), Ok(marker));
            for len in 0..bytes.len() {
                assert!(Rejoin::decode(&bytes[..len]).is_err());
            }
            for bit in 0..bytes.len() * 8 {
                let mut b = bytes.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(Rejoin::decode(&b).is_err(), "bit {bit}");
            }
        }
    }

    #[test]
    fn given_through_op_when_asked_should_cover_only_ops_up_to_it() {
        assert!(Rejoin { through_op: None }.covers(Op(u64::MAX - 1)));
        let known = Rejoin {
            through_op: Some(Op(10)),
        };
        assert!(known.covers(Op(10)));
        assert!(!known.covers(Op(11)));
    }
}
