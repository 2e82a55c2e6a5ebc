//! Identifiers. Each is a newtype so that a stream id can never be passed
//! where a partition id is expected, and — most importantly — so that a VSR
//! op number ([`Op`]) can never be used as a message offset ([`Offset`]):
//! the reference recorded real durability bugs from exactly that mix-up.

use std::fmt;

/// A replica's index in the cluster, `0..N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ReplicaId(pub u8);

/// A stream's numeric id (20 bits are used when packed into a [`GroupId`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u32);

/// A topic's numeric id within its stream (12 bits when packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TopicId(pub u32);

/// A partition's numeric id within its topic (20 bits when packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PartitionId(pub u32);

/// A VSR operation number: per group, dense from 1. Never a message offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Op(pub u64);

/// A message offset: per partition, dense from 0. Never an op number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

/// Whether a stored consumer offset belongs to a lone consumer or to a
/// consumer group. The two live in separate maps and directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConsumerKind {
    /// A single consumer (`offsets/consumers/{id}`).
    Consumer,
    /// A consumer group (`offsets/groups/{id}`).
    ConsumerGroup,
}

impl ConsumerKind {
    /// The directory name under `offsets/` that holds this kind's files.
    pub const fn dir_name(self) -> &'static str {
        match self {
            Self::Consumer => "consumers",
            Self::ConsumerGroup => "groups",
        }
    }
}

impl Op {
    /// The op before any: a group that applied nothing has applied op 0.
    pub const ZERO: Self = Self(0);

    /// The op after this one. Callers bound ops far below `u64::MAX`
    /// (`consensus::vsr::OP_MAX`), so this cannot overflow for an op that
    /// passed that check.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// The op before this one, or op 0 for op 0.
    pub const fn saturating_prev(self) -> Self {
        Self(self.0.saturating_sub(1))
    }

    /// The op `n` ops after this one, or `None` past `u64::MAX`.
    pub const fn checked_add(self, n: u64) -> Option<Self> {
        match self.0.checked_add(n) {
            Some(op) => Some(Self(op)),
            None => None,
        }
    }

    /// How many ops lie after `earlier` up to this one (0 when `earlier`
    /// is not below it).
    pub const fn ops_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<u64> for Op {
    type Output = Self;

    /// `n` ops later.
    fn add(self, n: u64) -> Self {
        Self(self.0 + n)
    }
}

impl std::ops::AddAssign<u64> for Op {
    fn add_assign(&mut self, n: u64) {
        self.0 += n;
    }
}

impl std::ops::Sub<u64> for Op {
    type Output = Self;

    /// `n` ops earlier.
    fn sub(self, n: u64) -> Self {
        Self(self.0 - n)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Offset {
    /// The first offset of a partition.
    pub const ZERO: Self = Self(0);

    /// The offset after this one.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }

    /// The offset before this one, or `None` at offset 0.
    pub const fn checked_prev(self) -> Option<Self> {
        match self.0.checked_sub(1) {
            Some(o) => Some(Self(o)),
            None => None,
        }
    }

    /// The offset `n` messages after this one, or `None` past `u64::MAX`.
    pub const fn checked_add(self, n: u64) -> Option<Self> {
        match self.0.checked_add(n) {
            Some(o) => Some(Self(o)),
            None => None,
        }
    }

    /// How many messages lie from `earlier` up to (not including) this
    /// offset (0 when `earlier` is not below it).
    pub const fn messages_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<u64> for Offset {
    type Output = Self;

    /// `n` messages later.
    fn add(self, n: u64) -> Self {
        Self(self.0 + n)
    }
}

impl std::ops::AddAssign<u64> for Offset {
    fn add_assign(&mut self, n: u64) {
        self.0 += n;
    }
}

impl std::ops::Sub<u64> for Offset {
    type Output = Self;

    /// `n` messages earlier.
    fn sub(self, n: u64) -> Self {
        Self(self.0 - n)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ReplicaId {
    /// The index as a `usize`, for tables indexed by replica.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The replica's bit in a `u32` set of replicas (at most 32 replicas).
    pub const fn bit(self) -> u32 {
        1 << self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A consensus group id. Group 0 is reserved for nothing in particular;
/// the metadata plane is [`METADATA_GROUP`] (top bit set) and every partition
/// group packs its stream, topic and partition ids:
///
/// | bits | field |
/// |---|---|
/// | 0..20 | partition id |
/// | 20..32 | topic id |
/// | 32..52 | stream id |
/// | 52..63 | zero |
/// | 63 | metadata flag |
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GroupId(pub u64);

/// The metadata plane's group id.
pub const METADATA_GROUP: GroupId = GroupId(1 << 63);

const PARTITION_BITS: u32 = 20;
const TOPIC_BITS: u32 = 12;
const STREAM_BITS: u32 = 20;

/// A packed id that does not fit its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceError {
    /// The stream id needs more than 20 bits.
    StreamIdTooLarge(u32),
    /// The topic id needs more than 12 bits.
    TopicIdTooLarge(u32),
    /// The partition id needs more than 20 bits.
    PartitionIdTooLarge(u32),
}

impl fmt::Display for NamespaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamIdTooLarge(id) => write!(f, "stream id {id} does not fit in 20 bits"),
            Self::TopicIdTooLarge(id) => write!(f, "topic id {id} does not fit in 12 bits"),
            Self::PartitionIdTooLarge(id) => {
                write!(f, "partition id {id} does not fit in 20 bits")
            }
        }
    }
}

impl std::error::Error for NamespaceError {}

impl GroupId {
    /// Packs a partition's coordinates into its group id.
    pub fn partition(
        stream: StreamId,
        topic: TopicId,
        partition: PartitionId,
    ) -> Result<Self, NamespaceError> {
        if stream.0 >> STREAM_BITS != 0 {
            return Err(NamespaceError::StreamIdTooLarge(stream.0));
        }
        if topic.0 >> TOPIC_BITS != 0 {
            return Err(NamespaceError::TopicIdTooLarge(topic.0));
        }
        if partition.0 >> PARTITION_BITS != 0 {
            return Err(NamespaceError::PartitionIdTooLarge(partition.0));
        }
        Ok(Self(
            u64::from(partition.0)
                | u64::from(topic.0) << PARTITION_BITS
                | u64::from(stream.0) << (PARTITION_BITS + TOPIC_BITS),
        ))
    }

    /// True for the metadata plane's group.
    pub const fn is_metadata(self) -> bool {
        self.0 == METADATA_GROUP.0
    }

    /// The stream, topic and partition ids of a partition group, or `None`
    /// for the metadata group or an id with bits set outside the packed
    /// fields.
    pub const fn unpack(self) -> Option<(StreamId, TopicId, PartitionId)> {
        let used = PARTITION_BITS + TOPIC_BITS + STREAM_BITS;
        if self.0 >> used != 0 {
            return None;
        }
        let partition = (self.0 & ((1 << PARTITION_BITS) - 1)) as u32;
        let topic = ((self.0 >> PARTITION_BITS) & ((1 << TOPIC_BITS) - 1)) as u32;
        let stream = (self.0 >> (PARTITION_BITS + TOPIC_BITS)) as u32;
        Some((StreamId(stream), TopicId(topic), PartitionId(partition)))
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unpack() {
            _ if self.is_metadata() => f.write_str("metadata"),
            Some((s, t, p)) => write!(f, "{}/{}/{}", s.0, t.0, p.0),
            None => write!(f, "group {:#x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_partition_coordinates_when_packed_should_unpack_to_same() {
        let g =
            GroupId::partition(StreamId(0xF_FFFF), TopicId(0xFFF), PartitionId(7)).expect("fits");
        assert_eq!(
            g.unpack(),
            Some((StreamId(0xF_FFFF), TopicId(0xFFF), PartitionId(7)))
        );
        assert_eq!(g.to_string(), "1048575/4095/7");
    }

    #[test]
    fn given_oversized_ids_when_packed_should_reject() {
        assert_eq!(
            GroupId::partition(StreamId(1 << 20), TopicId(0), PartitionId(0)),
            Err(NamespaceError::StreamIdTooLarge(1 << 20))
        );
        assert_eq!(
            GroupId::partition(StreamId(0), TopicId(1 << 12), PartitionId(0)),
            Err(NamespaceError::TopicIdTooLarge(1 << 12))
        );
        assert_eq!(
            GroupId::partition(StreamId(0), TopicId(0), PartitionId(1 << 20)),
            Err(NamespaceError::PartitionIdTooLarge(1 << 20))
        );
    }

    #[test]
    fn given_ops_and_offsets_when_stepped_should_count_in_their_own_unit() {
        assert_eq!(Op(7).next(), Op(8));
        assert_eq!(Op(7) + 3, Op(10));
        assert_eq!(Op(7) - 3, Op(4));
        assert_eq!(Op::ZERO.saturating_prev(), Op::ZERO);
        assert_eq!(Op(u64::MAX).checked_add(1), None);
        assert_eq!(Op(10).ops_since(Op(4)), 6);
        assert_eq!(Op(4).ops_since(Op(10)), 0);
        let mut op = Op(1);
        op += 2;
        assert_eq!(op.to_string(), "3");
        assert_eq!(Offset(9).next(), Offset(10));
        assert_eq!(Offset::ZERO.checked_prev(), None);
        assert_eq!(Offset(10).checked_prev(), Some(Offset(9)));
        assert_eq!(Offset(10).messages_since(Offset(4)), 6);
        assert_eq!(Offset(1) + 4, Offset(5));
        assert_eq!(ReplicaId(3).index(), 3);
        assert_eq!(ReplicaId(3).bit(), 0b1000);
    }

    #[test]
    fn given_metadata_group_when_unpacked_should_be_none() {
        assert!(METADATA_GROUP.is_metadata());
        assert_eq!(METADATA_GROUP.unpack(), None);
        assert_eq!(METADATA_GROUP.to_string(), "metadata");
    }
}
