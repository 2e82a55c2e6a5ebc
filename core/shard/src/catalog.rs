//! The groups a shard holds on disk, and their crash-safe creation and
//! deletion.
//!
//! Layout, under the shard's directory:
//!
//! ```text
//! superblocks.a|b          every group's superblock record (the shard's
//!                           table, journal::superblock_table)
//! g-<group:020>/            a group: its partition directory
//!     group.meta            the group's spec (this module's codec)
//!     *.log, *.index, consumers/, groups/ …
//! g-<group:020>.deleted/    a group being deleted (finished at boot)
//! ```
//!
//! A group exists exactly when its directory holds a valid `group.meta`.
//! Creation writes the directory, makes its name durable, then replaces
//! `group.meta` durably (sibling, sync, rename, directory sync): a crash
//! before the rename leaves a directory without a spec, which boot removes
//! as a create that never finished. Deletion first renames the directory
//! to its `.deleted` name and syncs the shard directory — that rename is
//! the commit point, so a crash after it can never resurrect the group —
//! then removes the files and the directory. Boot finishes any `.deleted`
//! it finds.

use std::io;
use std::path::{Path, PathBuf};

use common::GroupId;
use common::le_cursor::{u32_at, u64_at};
use storage::fs::{FileKind, Fs, FsFile, replace_file_durably};
use xxhash_rust::xxh3::xxh3_64;

/// The spec file's name inside a group directory.
pub const SPEC_FILE: &str = "group.meta";
const SPEC_SIBLING: &str = ".new";
const SPEC_MAGIC: [u8; 4] = *b"RGS1";
const SPEC_LEN: usize = 4 + 8 + 4 + 8 + 8 + 8 + 1 + 8;
/// A spec with a size ceiling: `RGS1`'s fields, then the ceiling. A spec
/// without one is still written as `RGS1`, byte for byte as before.
const SPEC_MAGIC_SIZED: [u8; 4] = *b"RGS2";
const SPEC_LEN_SIZED: usize = SPEC_LEN + 8;
const DELETED_SUFFIX: &str = ".deleted";
/// Nesting a group directory may have (consumers/, groups/); deeper trees
/// are not ours and are left for an operator.
const TREE_DEPTH_MAX: usize = 4;

/// What a group is: everything needed to open it again at boot. Written
/// once at creation; the metadata plane is its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpec {
    /// The consensus group.
    pub group: GroupId,
    /// The partition id stamped into every batch header.
    pub partition_id: u32,
    /// The partition's incarnation (never reused after a delete).
    pub incarnation: u64,
    /// Segment size in bytes.
    pub segment_size_bytes: u64,
    /// Flush once this many committed messages wait.
    pub messages_required_to_save: u64,
    /// Sync every flush and hold the reply until it returned.
    pub enforce_fsync: bool,
    /// Messages older than this are removed by retention (µs; 0 = never).
    pub message_expiry_us: u64,
    /// Retention keeps the sealed segments' bytes within this (0 = no
    /// ceiling): the partition's share of its topic's size ceiling.
    pub retained_bytes_max: u64,
    /// Created on a replica rejoining after its disk was replaced, by an
    /// op it may have acknowledged in its earlier life: the group starts
    /// under the restart rule from nothing (`PartitionConfig::rejoin`).
    pub rejoin: bool,
}

impl GroupSpec {
    /// A spec with the partition plane's defaults.
    pub fn new(group: GroupId, partition_id: u32) -> Self {
        Self {
            group,
            partition_id,
            incarnation: 0,
            segment_size_bytes: storage::LogConfig::default().segment_size_bytes,
            messages_required_to_save: partitions::MESSAGES_REQUIRED_TO_SAVE_DEFAULT,
            enforce_fsync: false,
            message_expiry_us: 0,
            retained_bytes_max: 0,
            rejoin: false,
        }
    }

    /// Whether retention has anything to remove for this group: its
    /// messages expire or its sealed segments have a size ceiling.
    pub const fn retains(&self) -> bool {
        self.message_expiry_us > 0 || self.retained_bytes_max > 0
    }

    /// The spec file's bytes: magic, fields little-endian, xxh3-64 trailer
    /// (`RGS2` with the size ceiling last when there is one).
    pub fn encode(&self) -> Vec<u8> {
        let sized = self.retained_bytes_max > 0;
        let mut out = Vec::with_capacity(SPEC_LEN_SIZED + 8);
        out.extend_from_slice(if sized {
            &SPEC_MAGIC_SIZED
        } else {
            &SPEC_MAGIC
        });
        out.extend_from_slice(&self.group.0.to_le_bytes());
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&self.segment_size_bytes.to_le_bytes());
        out.extend_from_slice(&self.messages_required_to_save.to_le_bytes());
        out.push(u8::from(self.enforce_fsync) | (u8::from(self.rejoin) << 1));
        out.extend_from_slice(&self.message_expiry_us.to_le_bytes());
        if sized {
            out.extend_from_slice(&self.retained_bytes_max.to_le_bytes());
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes a spec file, failing closed.
    ///
    /// # Errors
    /// [`SpecError`] for each way the bytes are not a spec.
    pub fn decode(bytes: &[u8]) -> Result<Self, SpecError> {
        let length = SpecError::Length { len: bytes.len() };
        let sized = match bytes.len() {
            n if n == SPEC_LEN + 8 => false,
            n if n == SPEC_LEN_SIZED + 8 => true,
            _ => return Err(length),
        };
        // Either length starts with the RGS1 fields and ends with the
        // trailer; RGS2's ceiling sits between them.
        let (Some(fields), Some((body, trailer))) = (
            bytes.first_chunk::<SPEC_LEN>(),
            bytes.split_last_chunk::<8>(),
        ) else {
            return Err(length);
        };
        if u64::from_le_bytes(*trailer) != xxh3_64(body) {
            return Err(SpecError::Checksum);
        }
        let magic = if sized { SPEC_MAGIC_SIZED } else { SPEC_MAGIC };
        if fields[..4] != magic {
            return Err(SpecError::Magic);
        }
        let retained_bytes_max = match body.last_chunk::<8>() {
            Some(ceiling) if sized => u64::from_le_bytes(*ceiling),
            _ => 0,
        };
        // RGS2 exists to carry a ceiling; one of 0 is written as RGS1.
        if sized && retained_bytes_max == 0 {
            return Err(SpecError::ZeroCeiling);
        }
        // Bit 0 enforce_fsync, bit 1 rejoin; any other bit is refused.
        let flags = fields[40];
        if flags & !0b11 != 0 {
            return Err(SpecError::Flag { value: flags });
        }
        let enforce_fsync = flags & 1 != 0;
        let rejoin = flags & 0b10 != 0;
        let spec = Self {
            group: GroupId(u64_at(fields, 4)),
            partition_id: u32_at(fields, 12),
            incarnation: u64_at(fields, 16),
            segment_size_bytes: u64_at(fields, 24),
            messages_required_to_save: u64_at(fields, 32),
            enforce_fsync,
            message_expiry_us: u64_at(fields, 41),
            retained_bytes_max,
            rejoin,
        };
        if spec.segment_size_bytes == 0 {
            return Err(SpecError::ZeroSegmentSize);
        }
        Ok(spec)
    }
}

/// Why a `group.meta` file is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecError {
    /// Not the spec's length.
    Length {
        /// Bytes present.
        len: usize,
    },
    /// The trailer does not match.
    Checksum,
    /// Not a spec file.
    Magic,
    /// The fsync flag is neither 0 nor 1.
    Flag {
        /// The byte found.
        value: u8,
    },
    /// A segment size of zero.
    ZeroSegmentSize,
    /// An `RGS2` spec whose size ceiling is 0.
    ZeroCeiling,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Length { len } => write!(
                f,
                "group spec is {len} bytes, expected {} or {}",
                SPEC_LEN + 8,
                SPEC_LEN_SIZED + 8
            ),
            Self::Checksum => write!(f, "group spec checksum mismatch"),
            Self::Magic => write!(f, "group spec has the wrong magic"),
            Self::Flag { value } => write!(f, "group spec fsync flag is {value}, not 0 or 1"),
            Self::ZeroSegmentSize => write!(f, "group spec has a segment size of 0"),
            Self::ZeroCeiling => write!(f, "sized group spec (RGS2) has a size ceiling of 0"),
        }
    }
}

impl std::error::Error for SpecError {}

/// The directory of `group` under the shard directory `root`.
pub fn group_dir(root: &Path, group: GroupId) -> PathBuf {
    root.join(format!("g-{:020}", group.0))
}

fn deleted_dir(root: &Path, group: GroupId) -> PathBuf {
    root.join(format!("g-{:020}{DELETED_SUFFIX}", group.0))
}

/// What a directory listing of the shard root holds, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Group directories, ascending.
    pub groups: Vec<GroupId>,
    /// Deletions to finish.
    pub deleted: Vec<GroupId>,
    /// Names that are not ours (left alone, logged).
    pub foreign: Vec<String>,
}

/// Lists the shard root (created, and its name made durable, when
/// missing).
///
/// # Errors
/// The I/O error of the listing.
pub async fn list<F: Fs>(fs: &F, root: &Path) -> io::Result<Listing> {
    if !fs.exists(root).await? {
        fs.create_dir_all(root).await?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs.sync_dir(parent).await?;
        }
    }
    let mut listing = Listing::default();
    for entry in fs.read_dir(root).await? {
        let name = entry.name_str().map(str::to_owned);
        match name.as_deref().and_then(parse_name) {
            Some((group, false)) if entry.kind == FileKind::Dir => listing.groups.push(group),
            Some((group, true)) if entry.kind == FileKind::Dir => listing.deleted.push(group),
            _ => listing
                .foreign
                .push(name.unwrap_or_else(|| entry.name.to_string_lossy().into_owned())),
        }
    }
    listing.groups.sort();
    listing.deleted.sort();
    Ok(listing)
}

fn parse_name(name: &str) -> Option<(GroupId, bool)> {
    let rest = name.strip_prefix("g-")?;
    let (digits, deleted) = match rest.strip_suffix(DELETED_SUFFIX) {
        Some(d) => (d, true),
        None => (rest, false),
    };
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((GroupId(digits.parse().ok()?), deleted))
}

/// Reads a group's spec; `Ok(None)` when the file is absent (a create that
/// never finished).
///
/// # Errors
/// I/O errors, and [`SpecError`] as `InvalidData`.
pub async fn read_spec<F: Fs>(fs: &F, dir: &Path) -> io::Result<Option<GroupSpec>> {
    let path = dir.join(SPEC_FILE);
    if !fs.exists(&path).await? {
        return Ok(None);
    }
    let file = fs
        .open(&path, storage::fs::OpenOptions::read_only())
        .await?;
    let bytes = file
        .read_to_end_bounded((SPEC_LEN_SIZED + 8) as u64 + 1)
        .await?;
    GroupSpec::decode(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Creates the group directory and records its spec durably.
///
/// # Errors
/// The failing step's I/O error; a directory left without a spec is
/// removed at the next boot.
pub async fn create<F: Fs>(fs: &F, root: &Path, spec: &GroupSpec) -> io::Result<PathBuf> {
    let dir = group_dir(root, spec.group);
    fs.create_dir_all(&dir).await?;
    // The directory's name must be durable before anything inside it is
    // worth syncing.
    fs.sync_dir(root).await?;
    replace_file_durably(fs, &dir.join(SPEC_FILE), spec.encode(), SPEC_SIBLING).await?;
    Ok(dir)
}

/// Replaces an existing group's spec durably (its topic's retention
/// settings changed): a crash leaves the old spec or the new one whole.
///
/// # Errors
/// The failing step's I/O error; the old spec is then still in place.
pub async fn rewrite_spec<F: Fs>(fs: &F, root: &Path, spec: &GroupSpec) -> io::Result<()> {
    let dir = group_dir(root, spec.group);
    replace_file_durably(fs, &dir.join(SPEC_FILE), spec.encode(), SPEC_SIBLING).await
}

/// Deletes a group's directory: the rename to `.deleted` (made durable) is
/// the commit point, the removal after it may be finished by boot.
///
/// # Errors
/// The failing step's I/O error. A failure before the durable rename
/// leaves the group in place; after it, boot finishes the removal.
pub async fn delete<F: Fs>(fs: &F, root: &Path, group: GroupId) -> io::Result<()> {
    let dir = group_dir(root, group);
    let doomed = deleted_dir(root, group);
    if fs.exists(&dir).await? {
        fs.rename(&dir, &doomed).await?;
        fs.sync_dir(root).await?;
    }
    finish_delete(fs, root, group).await
}

/// Removes what a delete left under its `.deleted` name.
///
/// # Errors
/// The failing removal.
pub async fn finish_delete<F: Fs>(fs: &F, root: &Path, group: GroupId) -> io::Result<()> {
    let doomed = deleted_dir(root, group);
    if !fs.exists(&doomed).await? {
        return Ok(());
    }
    remove_tree(fs, &doomed, 0).await?;
    fs.sync_dir(root).await
}

/// Removes a group directory that has no spec (a create a crash cut
/// short): nothing in it was ever acknowledged.
///
/// # Errors
/// The failing removal.
pub async fn remove_unfinished<F: Fs>(fs: &F, root: &Path, group: GroupId) -> io::Result<()> {
    let dir = group_dir(root, group);
    let doomed = deleted_dir(root, group);
    fs.rename(&dir, &doomed).await?;
    fs.sync_dir(root).await?;
    finish_delete(fs, root, group).await
}

async fn remove_tree<F: Fs>(fs: &F, dir: &Path, depth: usize) -> io::Result<()> {
    if depth > TREE_DEPTH_MAX {
        return Err(io::Error::other(format!(
            "{}: nested deeper than a group directory can be; left for an operator",
            dir.display()
        )));
    }
    for entry in fs.read_dir(dir).await? {
        let path = dir.join(&entry.name);
        match entry.kind {
            FileKind::Dir => Box::pin(remove_tree(fs, &path, depth + 1)).await?,
            _ => fs.remove_file(&path).await?,
        }
    }
    fs.remove_dir(dir).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec() -> GroupSpec {
        GroupSpec {
            group: GroupId(1 << 40 | 3),
            partition_id: 3,
            incarnation: 2,
            segment_size_bytes: 4096,
            messages_required_to_save: 7,
            enforce_fsync: true,
            message_expiry_us: 99,
            retained_bytes_max: 0,
            rejoin: false,
        }
    }

    fn sized() -> GroupSpec {
        GroupSpec {
            retained_bytes_max: 12_288,
            ..spec()
        }
    }

    #[test]
    fn given_spec_when_encoded_should_round_trip() {
        assert_eq!(GroupSpec::decode(&spec().encode()), Ok(spec()));
        assert_eq!(GroupSpec::decode(&sized().encode()), Ok(sized()));
        for (enforce_fsync, rejoin) in [(false, false), (false, true), (true, true)] {
            let s = GroupSpec {
                enforce_fsync,
                rejoin,
                ..spec()
            };
            assert_eq!(GroupSpec::decode(&s.encode()), Ok(s));
        }
    }

    #[test]
    fn given_unknown_flag_bit_when_decoded_should_refuse() {
        let mut bytes = spec().encode();
        bytes[40] |= 0b100;
        let sum = xxh3_64(&bytes[..SPEC_LEN]);
        bytes[SPEC_LEN..].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(
            GroupSpec::decode(&bytes),
            Err(SpecError::Flag { value: 0b101 })
        );
    }

    #[test]
    fn given_every_strict_prefix_or_flipped_bit_when_decoded_should_refuse() {
        for bytes in [spec().encode(), sized().encode()] {
            for len in 0..bytes.len() {
                assert!(GroupSpec::decode(&bytes[..len]).is_err());
            }
            for bit in 0..bytes.len() * 8 {
                let mut b = bytes.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(GroupSpec::decode(&b).is_err(), "bit {bit}");
            }
        }
    }

    #[test]
    fn given_a_spec_without_ceiling_when_encoded_should_keep_the_rgs1_bytes() {
        let bytes = spec().encode();
        assert_eq!(&bytes[..4], b"RGS1");
        assert_eq!(bytes.len(), SPEC_LEN + 8);
        let bytes = sized().encode();
        assert_eq!(&bytes[..4], b"RGS2");
        assert_eq!(bytes.len(), SPEC_LEN_SIZED + 8);
        assert_eq!(&bytes[SPEC_LEN..SPEC_LEN_SIZED], &12_288u64.to_le_bytes());
    }

    #[test]
    fn given_an_rgs2_spec_with_a_zero_ceiling_when_decoded_should_refuse() {
        let mut bytes = sized().encode();
        bytes[SPEC_LEN..SPEC_LEN_SIZED].fill(0);
        let sum = xxh3_64(&bytes[..SPEC_LEN_SIZED]);
        bytes[SPEC_LEN_SIZED..].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(GroupSpec::decode(&bytes), Err(SpecError::ZeroCeiling));
    }

    #[test]
    fn given_names_when_parsed_should_take_only_ours() {
        assert_eq!(
            parse_name("g-00000000000000000042"),
            Some((GroupId(42), false))
        );
        assert_eq!(
            parse_name("g-00000000000000000042.deleted"),
            Some((GroupId(42), true))
        );
        assert_eq!(parse_name("g-42"), None);
        assert_eq!(parse_name("g-0000000000000000004x"), None);
        assert_eq!(parse_name("g-99999999999999999999"), None, "past u64");
        assert_eq!(parse_name("lost+found"), None);
    }
}
