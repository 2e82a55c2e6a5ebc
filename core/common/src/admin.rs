//! The answer of replog's one admin command, `REPLOG_STATUS` (docs/formats.md
//! §17): what one replica knows of itself, its roster, and every consensus
//! group it hosts. The server encodes it; `replog-cli status` decodes it.
//! Both sides use this module, so the layout is written once.
//!
//! The decoder fails closed: every count is checked against the bytes
//! present before anything is allocated, reserved bytes must be zero, and
//! unknown enum values are refused.

use crate::le_cursor::{LeCursor, Truncated};

/// The command code of `REPLOG_STATUS`. The Iggy 0.11.0 protocol ends its
/// codes at 606; a code the SDK does not know travels as a non-replicated
/// request with the code at header offset 196, which is how the SDK's
/// `send_raw_with_response` sends it. An Iggy server answers it with
/// InvalidCommand (3).
pub const REPLOG_STATUS_CODE: u32 = 9000;

/// The record's magic.
pub const STATUS_MAGIC: [u8; 4] = *b"RRS1";

/// Bytes of one group entry.
pub const GROUP_ENTRY_LEN: usize = 104;

/// Roster entries at most (a replica id is a u8).
pub const ROSTER_MAX: usize = 256;

/// Bytes of a roster address at most (the longest socket address text).
pub const ADDRESS_MAX: usize = 64;

/// A group's VSR status, as the record carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// Serving a view.
    Normal,
    /// Electing the next primary.
    ViewChange,
    /// Restarted and not yet told the current view.
    Recovering,
}

impl GroupState {
    fn code(self) -> u8 {
        match self {
            Self::Normal => 0,
            Self::ViewChange => 1,
            Self::Recovering => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Normal),
            1 => Some(Self::ViewChange),
            2 => Some(Self::Recovering),
            _ => None,
        }
    }

    /// The word `replog-cli status` prints.
    pub fn word(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::ViewChange => "view change",
            Self::Recovering => "recovering",
        }
    }
}

/// A partition group's place in the namespace and its contents here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionStatus {
    /// Stream id.
    pub stream: u32,
    /// Topic id.
    pub topic: u32,
    /// Partition id.
    pub partition: u32,
    /// Messages held here.
    pub messages: u64,
    /// Bytes of segments held here.
    pub size_bytes: u64,
    /// The offset the next message gets here.
    pub next_offset: u64,
    /// Whether the partition is fenced (a failed install or converge; it
    /// serves nothing until restarted).
    pub fenced: bool,
}

/// A receiving state transfer in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferStatus {
    /// The serving peer.
    pub peer: u8,
    /// Bytes received so far.
    pub received_bytes: u64,
    /// Bytes the accepted manifest declares (0 before it is accepted).
    pub expected_bytes: u64,
}

/// One consensus group on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group id ([`crate::METADATA_GROUP`] is the metadata plane).
    pub group: u64,
    /// The shard hosting it.
    pub shard: u16,
    /// VSR status.
    pub state: GroupState,
    /// The view.
    pub view: u32,
    /// The view's primary.
    pub primary: u8,
    /// Whether this replica is that primary.
    pub primary_here: bool,
    /// The highest op in the log here.
    pub op: u64,
    /// The highest op applied here.
    pub commit_min: u64,
    /// The highest op known committed in the group.
    pub commit_max: u64,
    /// The partition, for a partition group whose name the metadata
    /// plane knows; `None` for the metadata group or a group being created
    /// or deleted.
    pub partition: Option<PartitionStatus>,
    /// A receiving transfer, if one is running.
    pub transfer: Option<TransferStatus>,
}

impl GroupStatus {
    /// Whether this is the metadata plane's group.
    pub fn is_metadata(&self) -> bool {
        crate::GroupId(self.group).is_metadata()
    }

    /// Ops known committed but not applied here yet.
    pub fn lag(&self) -> u64 {
        self.commit_max.saturating_sub(self.commit_min)
    }
}

/// A replica of the roster and where its clients connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterAddress {
    /// Replica id.
    pub id: u8,
    /// Its client listen address, as text (`127.0.0.1:8090`).
    pub client_address: String,
}

/// `REPLOG_STATUS`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// The answering replica.
    pub replica: u8,
    /// Every replica of the cluster (one entry for a single replica).
    pub roster: Vec<RosterAddress>,
    /// Shards of this replica.
    pub shards: u16,
    /// Shards that answered in time (their groups are listed; a busy or
    /// stopping shard's are not).
    pub shards_answered: u16,
    /// The groups of the shards that answered: the metadata group first,
    /// then by group id.
    pub groups: Vec<GroupStatus>,
}

/// Why a status record was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusError {
    /// Fewer bytes than the field at `offset` needs.
    Truncated {
        /// Where the missing field starts.
        offset: usize,
    },
    /// The record does not start with `RRS1`.
    BadMagic,
    /// A count is larger than the bytes behind it could hold, or than its
    /// ceiling.
    CountTooLarge {
        /// What was counted.
        what: &'static str,
        /// The count read.
        count: u64,
    },
    /// A field holds a value the layout does not define.
    BadField {
        /// The field.
        field: &'static str,
        /// Where it starts.
        offset: usize,
    },
    /// Bytes follow the last group.
    TrailingBytes {
        /// How many.
        len: usize,
    },
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { offset } => write!(f, "status record truncated at byte {offset}"),
            Self::BadMagic => write!(f, "status record does not start with RRS1"),
            Self::CountTooLarge { what, count } => {
                write!(
                    f,
                    "status record counts {count} {what}, more than it can hold"
                )
            }
            Self::BadField { field, offset } => {
                write!(f, "status record field {field} at byte {offset} is invalid")
            }
            Self::TrailingBytes { len } => {
                write!(f, "status record has {len} bytes after its last group")
            }
        }
    }
}

impl std::error::Error for StatusError {}

const FLAG_PRIMARY_HERE: u8 = 1;
const FLAG_PARTITION: u8 = 1 << 1;
const FLAG_FENCED: u8 = 1 << 2;
const FLAG_TRANSFER: u8 = 1 << 3;
const FLAGS_KNOWN: u8 = FLAG_PRIMARY_HERE | FLAG_PARTITION | FLAG_FENCED | FLAG_TRANSFER;

impl ReplicaStatus {
    /// The record's bytes (docs/formats.md §17).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.groups.len() * GROUP_ENTRY_LEN);
        out.extend_from_slice(&STATUS_MAGIC);
        out.push(self.replica);
        // The roster has at most 256 entries (u8 ids), so the count fits
        // a u16; addresses are socket-address text, far below 64 bytes.
        let roster = &self.roster[..self.roster.len().min(ROSTER_MAX)];
        out.extend_from_slice(&(roster.len() as u16).to_le_bytes());
        for r in roster {
            let address = r.client_address.as_bytes();
            let address = &address[..address.len().min(ADDRESS_MAX)];
            out.push(r.id);
            out.push(address.len() as u8);
            out.extend_from_slice(address);
        }
        out.extend_from_slice(&self.shards.to_le_bytes());
        out.extend_from_slice(&self.shards_answered.to_le_bytes());
        let count = u32::try_from(self.groups.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_le_bytes());
        for g in self.groups.iter().take(count as usize) {
            encode_group(&mut out, g);
        }
        out
    }

    /// Reads a record, refusing anything that is not exactly one.
    ///
    /// # Errors
    /// [`StatusError`] naming the first field that does not hold.
    pub fn decode(bytes: &[u8]) -> Result<Self, StatusError> {
        let mut r = Reader::new(bytes);
        if r.take(4)? != STATUS_MAGIC {
            return Err(StatusError::BadMagic);
        }
        let replica = r.u8()?;
        let roster_count = usize::from(r.u16()?);
        // Each entry is at least its two fixed bytes.
        if roster_count > ROSTER_MAX || roster_count * 2 > r.left() {
            return Err(StatusError::CountTooLarge {
                what: "roster entries",
                count: roster_count as u64,
            });
        }
        let mut roster = Vec::with_capacity(roster_count);
        for _ in 0..roster_count {
            let id = r.u8()?;
            let len_at = r.at();
            let len = usize::from(r.u8()?);
            if len > ADDRESS_MAX {
                return Err(StatusError::BadField {
                    field: "address length",
                    offset: len_at,
                });
            }
            let text_at = r.at();
            let text = std::str::from_utf8(r.take(len)?).map_err(|_| StatusError::BadField {
                field: "address",
                offset: text_at,
            })?;
            roster.push(RosterAddress {
                id,
                client_address: text.to_owned(),
            });
        }
        let shards = r.u16()?;
        let shards_answered = r.u16()?;
        let count = r.u32()? as usize;
        if count
            .checked_mul(GROUP_ENTRY_LEN)
            .is_none_or(|n| n > r.left())
        {
            return Err(StatusError::CountTooLarge {
                what: "groups",
                count: count as u64,
            });
        }
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            groups.push(decode_group(&mut r)?);
        }
        if r.left() != 0 {
            return Err(StatusError::TrailingBytes { len: r.left() });
        }
        Ok(Self {
            replica,
            roster,
            shards,
            shards_answered,
            groups,
        })
    }
}

fn encode_group(out: &mut Vec<u8>, g: &GroupStatus) {
    let start = out.len();
    let mut flags = 0;
    if g.primary_here {
        flags |= FLAG_PRIMARY_HERE;
    }
    if g.partition.is_some() {
        flags |= FLAG_PARTITION;
    }
    if g.partition.is_some_and(|p| p.fenced) {
        flags |= FLAG_FENCED;
    }
    if g.transfer.is_some() {
        flags |= FLAG_TRANSFER;
    }
    let p = g.partition.unwrap_or(PartitionStatus {
        stream: 0,
        topic: 0,
        partition: 0,
        messages: 0,
        size_bytes: 0,
        next_offset: 0,
        fenced: false,
    });
    let t = g.transfer.unwrap_or(TransferStatus {
        peer: 0,
        received_bytes: 0,
        expected_bytes: 0,
    });
    out.extend_from_slice(&g.group.to_le_bytes());
    out.extend_from_slice(&p.stream.to_le_bytes());
    out.extend_from_slice(&p.topic.to_le_bytes());
    out.extend_from_slice(&p.partition.to_le_bytes());
    out.extend_from_slice(&g.shard.to_le_bytes());
    out.push(g.state.code());
    out.push(flags);
    out.extend_from_slice(&g.view.to_le_bytes());
    out.push(g.primary);
    out.push(t.peer);
    out.extend_from_slice(&[0, 0]);
    for v in [
        g.op,
        g.commit_min,
        g.commit_max,
        p.messages,
        p.size_bytes,
        p.next_offset,
        t.received_bytes,
        t.expected_bytes,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    debug_assert_eq!(out.len() - start, GROUP_ENTRY_LEN);
}

fn decode_group(r: &mut Reader<'_>) -> Result<GroupStatus, StatusError> {
    let group = r.u64()?;
    let stream = r.u32()?;
    let topic = r.u32()?;
    let partition = r.u32()?;
    let shard = r.u16()?;
    let state_at = r.at();
    let state = GroupState::from_code(r.u8()?).ok_or(StatusError::BadField {
        field: "status",
        offset: state_at,
    })?;
    let flags_at = r.at();
    let flags = r.u8()?;
    if flags & !FLAGS_KNOWN != 0 || (flags & FLAG_FENCED != 0 && flags & FLAG_PARTITION == 0) {
        return Err(StatusError::BadField {
            field: "flags",
            offset: flags_at,
        });
    }
    let view = r.u32()?;
    let primary = r.u8()?;
    let peer = r.u8()?;
    r.zeros("reserved", 2)?;
    let op = r.u64()?;
    let commit_min = r.u64()?;
    let commit_max = r.u64()?;
    let messages = r.u64()?;
    let size_bytes = r.u64()?;
    let next_offset = r.u64()?;
    let received_bytes = r.u64()?;
    let expected_bytes = r.u64()?;
    r.zeros("reserved", 8)?;
    let partition = (flags & FLAG_PARTITION != 0).then_some(PartitionStatus {
        stream,
        topic,
        partition,
        messages,
        size_bytes,
        next_offset,
        fenced: flags & FLAG_FENCED != 0,
    });
    let transfer = (flags & FLAG_TRANSFER != 0).then_some(TransferStatus {
        peer,
        received_bytes,
        expected_bytes,
    });
    Ok(GroupStatus {
        group,
        shard,
        state,
        view,
        primary,
        primary_here: flags & FLAG_PRIMARY_HERE != 0,
        op,
        commit_min,
        commit_max,
        partition,
        transfer,
    })
}

/// The record's cursor, which also knows where it is, so that an error can
/// name the byte its field starts at.
struct Reader<'a> {
    len: usize,
    cursor: LeCursor<'a>,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            len: bytes.len(),
            cursor: LeCursor::new(bytes),
        }
    }

    /// Where the next field starts. A failed read consumes nothing, so
    /// after one this is where the missing field starts.
    fn at(&self) -> usize {
        self.len - self.left()
    }

    fn left(&self) -> usize {
        self.cursor.remaining().len()
    }

    fn truncated(&self) -> StatusError {
        StatusError::Truncated { offset: self.at() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StatusError> {
        self.cursor.take(n).map_err(|Truncated| self.truncated())
    }

    fn u8(&mut self) -> Result<u8, StatusError> {
        self.cursor.u8().map_err(|Truncated| self.truncated())
    }

    fn u16(&mut self) -> Result<u16, StatusError> {
        self.cursor.u16().map_err(|Truncated| self.truncated())
    }

    fn u32(&mut self) -> Result<u32, StatusError> {
        self.cursor.u32().map_err(|Truncated| self.truncated())
    }

    fn u64(&mut self) -> Result<u64, StatusError> {
        self.cursor.u64().map_err(|Truncated| self.truncated())
    }

    fn zeros(&mut self, field: &'static str, n: usize) -> Result<(), StatusError> {
        let offset = self.at();
        if self.take(n)?.iter().any(|&b| b != 0) {
            return Err(StatusError::BadField { field, offset });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> ReplicaStatus {
        ReplicaStatus {
            replica: 1,
            roster: vec![
                RosterAddress {
                    id: 0,
                    client_address: "127.0.0.1:8090".into(),
                },
                RosterAddress {
                    id: 1,
                    client_address: "127.0.0.1:8092".into(),
                },
            ],
            shards: 2,
            shards_answered: 2,
            groups: vec![
                GroupStatus {
                    group: 0,
                    shard: 0,
                    state: GroupState::Normal,
                    view: 3,
                    primary: 0,
                    primary_here: false,
                    op: 40,
                    commit_min: 40,
                    commit_max: 40,
                    partition: None,
                    transfer: None,
                },
                GroupStatus {
                    group: 7,
                    shard: 1,
                    state: GroupState::Recovering,
                    view: u32::MAX,
                    primary: 2,
                    primary_here: true,
                    op: u64::MAX,
                    commit_min: 5,
                    commit_max: 9,
                    partition: Some(PartitionStatus {
                        stream: 1,
                        topic: 2,
                        partition: 3,
                        messages: 1000,
                        size_bytes: 65536,
                        next_offset: 1000,
                        fenced: true,
                    }),
                    transfer: Some(TransferStatus {
                        peer: 2,
                        received_bytes: 10,
                        expected_bytes: 20,
                    }),
                },
            ],
        }
    }

    #[test]
    fn given_a_status_when_encoded_should_decode_to_itself() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(
            bytes.len(),
            4 + 1 + 2 + (2 + 14) * 2 + 2 + 2 + 4 + 2 * GROUP_ENTRY_LEN
        );
        assert_eq!(ReplicaStatus::decode(&bytes).unwrap(), s);
        assert_eq!(s.groups[1].lag(), 4);
    }

    #[test]
    fn given_every_prefix_when_decoded_should_refuse_it() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            assert!(
                ReplicaStatus::decode(&bytes[..len]).is_err(),
                "prefix {len}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            ReplicaStatus::decode(&longer),
            Err(StatusError::TrailingBytes { len: 1 })
        );
    }

    #[test]
    fn given_a_huge_group_count_when_decoded_should_refuse_before_allocating() {
        let mut s = sample();
        s.groups.clear();
        let mut bytes = s.encode();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            ReplicaStatus::decode(&bytes),
            Err(StatusError::CountTooLarge {
                what: "groups",
                count: u64::from(u32::MAX)
            })
        );
    }

    #[test]
    fn given_bad_fields_when_decoded_should_name_them() {
        let bytes = sample().encode();
        let groups_at = bytes.len() - 2 * GROUP_ENTRY_LEN;
        let second = groups_at + GROUP_ENTRY_LEN;
        let cases: [(usize, u8, &str); 5] = [
            (second + 22, 3, "status"),
            (second + 23, 0x10, "flags"),
            // Fenced without a partition.
            (groups_at + 23, FLAG_FENCED, "flags"),
            (second + 30, 1, "reserved"),
            (second + GROUP_ENTRY_LEN - 1, 1, "reserved"),
        ];
        for (at, value, field) in cases {
            let mut b = bytes.clone();
            b[at] = value;
            match ReplicaStatus::decode(&b) {
                Err(StatusError::BadField { field: f, .. }) => assert_eq!(f, field, "byte {at}"),
                other => panic!("byte {at}: {other:?}"),
            }
        }
        let mut b = bytes.clone();
        b[0] = b'X';
        assert_eq!(ReplicaStatus::decode(&b), Err(StatusError::BadMagic));
        // An address that is not UTF-8.
        let mut b = bytes;
        b[9] = 0xff;
        assert!(matches!(
            ReplicaStatus::decode(&b),
            Err(StatusError::BadField {
                field: "address",
                ..
            })
        ));
    }

    #[test]
    fn given_an_address_longer_than_its_ceiling_when_decoded_should_refuse_it() {
        let mut b = STATUS_MAGIC.to_vec();
        b.push(0);
        b.extend_from_slice(&1u16.to_le_bytes());
        b.push(0);
        b.push(65);
        b.extend_from_slice(&[b'a'; 65]);
        assert!(matches!(
            ReplicaStatus::decode(&b),
            Err(StatusError::BadField {
                field: "address length",
                ..
            })
        ));
    }
}
