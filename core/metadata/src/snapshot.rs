//! The metadata snapshot: the whole [`MetadataState`] at one applied op, in
//! one checksummed artifact (layout in docs/formats.md, "Metadata
//! snapshot").
//!
//! `[magic "RMS1"][version u16 = 1][reserved u16 = 0][applied u64]
//! [applied identity u128][counters][streams…][users…][xxh3-64 trailer]`, little-endian. The
//! decoder fails closed: the trailer is verified over every preceding
//! byte before any field is read, then each count is checked against its
//! ceiling and against the bytes actually present (count × the smallest
//! entry) before anything is allocated, ids must be strictly ascending
//! (one encoding per state, no duplicates), and the decoded state must
//! pass the state's own invariants. Field-level rejections (names,
//! topic settings, hashes) reuse the op codec's and are wrapped in
//! [`SnapshotDecodeError::Field`].

use std::collections::BTreeMap;
use std::fmt;

use common::le_cursor::LeCursor;
use common::{GroupId, Op, PartitionId, StreamId, TopicId};
use consensus::{push_trailer, split_verified_trailer};

use crate::consumer_group::{ConsumerGroup, ConsumerGroupId, Member, MemberId, SessionId};
use crate::op_codec::{OpDecodeError, Reader, Writer};
use crate::state::{
    CONSUMER_GROUPS_PER_TOPIC_MAX, MEMBERS_PER_GROUP_MAX, MetadataState, PARTITIONS_PER_TOPIC_MAX,
    Partition, STREAMS_MAX, Stream, TOPICS_PER_STREAM_MAX, Topic, USERS_MAX,
};
use crate::user::{User, UserId};

/// `"RMS1"` as a little-endian u32.
pub const SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"RMS1");
/// The snapshot layout version.
pub const SNAPSHOT_VERSION: u16 = 1;
/// Header bytes: magic, version, reserved.
const HEADER_LEN: usize = 8;
const TRAILER_LEN: usize = 8;

// The smallest encoding of each entry, for the count-vs-bytes check.
const STREAM_MIN: usize = 4 + 2 + 8 + 4 + 4;
const TOPIC_MIN: usize = 4 + 2 + 8 + 27 + 4 + 4 + 4;
const PARTITION_LEN: usize = 4 + 8 + 8 + 8 + 8;
const GROUP_MIN: usize = 4 + 2 + 8 + 4 + 4;
const MEMBER_MIN: usize = 4 + 8 + 4;
const USER_MIN: usize = 4 + 2 + 3 + 8;

/// Why bytes are not a metadata snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotDecodeError {
    /// Shorter than a header and a trailer.
    TooShort {
        /// Bytes present.
        len: usize,
    },
    /// The trailer does not match the content.
    ChecksumMismatch {
        /// The trailer's value.
        expected: u64,
        /// The content's hash.
        actual: u64,
    },
    /// Not a metadata snapshot.
    BadMagic(u32),
    /// A layout version this build does not know.
    UnknownVersion(u16),
    /// The reserved header field is not zero.
    ReservedNonZero(u16),
    /// The content ends inside `field`.
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// A count above its ceiling.
    CountAboveCeiling {
        /// What is counted.
        what: &'static str,
        /// The count found.
        count: u32,
        /// The ceiling.
        max: u32,
    },
    /// A count whose smallest encoding exceeds the bytes left.
    CountExceedsBytes {
        /// What is counted.
        what: &'static str,
        /// The count found.
        count: u32,
    },
    /// Ids not strictly ascending (a duplicate or a non-canonical order).
    NotAscending {
        /// Which ids.
        what: &'static str,
    },
    /// A field the op codec rejects (name, topic settings, hash).
    Field(OpDecodeError),
    /// Bytes left between the last entry and the trailer.
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// The decoded state breaks an invariant (duplicate name, group id
    /// reused or beyond the counter, an unbalanced assignment…).
    Inconsistent(&'static str),
}

impl fmt::Display for SnapshotDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => write!(f, "metadata snapshot of {len} bytes is too short"),
            Self::ChecksumMismatch { expected, actual } => write!(
                f,
                "metadata snapshot checksum mismatch: trailer {expected:#x}, content {actual:#x}"
            ),
            Self::BadMagic(m) => write!(f, "not a metadata snapshot (magic {m:#x})"),
            Self::UnknownVersion(v) => write!(f, "unknown metadata snapshot version {v}"),
            Self::ReservedNonZero(r) => write!(f, "metadata snapshot reserved field is {r}"),
            Self::Truncated { field } => write!(f, "metadata snapshot truncated in {field}"),
            Self::CountAboveCeiling { what, count, max } => {
                write!(f, "{count} {what} in the snapshot, above the ceiling {max}")
            }
            Self::CountExceedsBytes { what, count } => {
                write!(f, "{count} {what} cannot fit in the bytes left")
            }
            Self::NotAscending { what } => write!(f, "{what} ids are not strictly ascending"),
            Self::Field(e) => write!(f, "metadata snapshot field rejected: {e}"),
            Self::TrailingBytes { len } => write!(f, "{len} bytes follow the last entry"),
            Self::Inconsistent(why) => write!(f, "metadata snapshot is inconsistent: {why}"),
        }
    }
}

impl std::error::Error for SnapshotDecodeError {}

impl From<OpDecodeError> for SnapshotDecodeError {
    fn from(e: OpDecodeError) -> Self {
        match e {
            OpDecodeError::Truncated { field } => Self::Truncated { field },
            other => Self::Field(other),
        }
    }
}

fn put_name(w: &mut Writer, name: &str) {
    // The state's invariants keep every name 1..=255 bytes.
    assert!(
        !name.is_empty() && name.len() <= 255,
        "state name out of range"
    );
    w.u8(name.len() as u8);
    w.0.extend_from_slice(name.as_bytes());
}

/// Encodes the state (with its applied op).
pub fn encode_snapshot(state: &MetadataState) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4096));
    w.u32(SNAPSHOT_MAGIC);
    w.0.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    w.0.extend_from_slice(&0u16.to_le_bytes());
    w.u64(state.applied.0);
    w.0.extend_from_slice(&state.applied_identity.to_le_bytes());
    w.u32(state.next_stream_id);
    w.u64(state.next_group);
    w.u32(state.next_user_id);
    w.u32(state.streams.len() as u32);
    for s in state.streams.values() {
        w.u32(s.id.0);
        put_name(&mut w, &s.name);
        w.u64(s.created_at_us);
        w.u32(s.next_topic_id);
        w.u32(s.topics.len() as u32);
        for t in s.topics.values() {
            w.u32(t.id.0);
            put_name(&mut w, &t.name);
            w.u64(t.created_at_us);
            // Settings in the state passed apply's checks.
            w.config(&t.config)
                .unwrap_or_else(|e| panic!("state topic settings invalid: {e}"));
            w.u32(t.partitions.len() as u32);
            for p in t.partitions.values() {
                w.u32(p.id.0);
                w.u64(p.group.0);
                w.u64(p.incarnation);
                w.u64(p.created_at_us);
                w.u64(p.purge_generation);
            }
            w.u32(t.next_consumer_group_id);
            w.u32(t.consumer_groups.len() as u32);
            for g in t.consumer_groups.values() {
                w.u32(g.id.0);
                put_name(&mut w, &g.name);
                w.u64(g.generation);
                w.u32(g.next_member_id);
                w.u32(g.members.len() as u32);
                for m in g.members.values() {
                    w.u32(m.id.0);
                    w.u64(m.session.0);
                    w.u32(m.partitions.len() as u32);
                    for p in &m.partitions {
                        w.u32(p.0);
                    }
                }
            }
        }
    }
    w.u32(state.users.len() as u32);
    for u in state.users.values() {
        w.u32(u.id.0);
        put_name(&mut w, &u.username);
        w.hash(&u.password_hash);
        w.u64(u.created_at_us);
    }
    let mut out = w.0;
    push_trailer(&mut out);
    out
}

/// A count, checked against its ceiling and the bytes left.
fn count(
    r: &mut Reader<'_>,
    what: &'static str,
    max: u32,
    entry_min: usize,
) -> Result<u32, SnapshotDecodeError> {
    let n = r.u32(what)?;
    if n > max {
        return Err(SnapshotDecodeError::CountAboveCeiling {
            what,
            count: n,
            max,
        });
    }
    if (n as usize).saturating_mul(entry_min) > r.0.remaining().len() {
        return Err(SnapshotDecodeError::CountExceedsBytes { what, count: n });
    }
    Ok(n)
}

fn ascending<K: Ord + Copy>(
    last: &mut Option<K>,
    k: K,
    what: &'static str,
) -> Result<(), SnapshotDecodeError> {
    if last.is_some_and(|l| l >= k) {
        return Err(SnapshotDecodeError::NotAscending { what });
    }
    *last = Some(k);
    Ok(())
}

/// Decodes a snapshot (see the module documentation for what it refuses).
pub fn decode_snapshot(bytes: &[u8]) -> Result<MetadataState, SnapshotDecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(SnapshotDecodeError::TooShort { len: bytes.len() });
    }
    let content = split_verified_trailer(bytes).map_err(|e| match e {
        Some((expected, actual)) => SnapshotDecodeError::ChecksumMismatch { expected, actual },
        None => SnapshotDecodeError::TooShort { len: bytes.len() },
    })?;
    let mut r = Reader(LeCursor::new(content));
    let magic = r.u32("magic")?;
    if magic != SNAPSHOT_MAGIC {
        return Err(SnapshotDecodeError::BadMagic(magic));
    }
    let version = r.u16("version")?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotDecodeError::UnknownVersion(version));
    }
    let reserved = r.u16("reserved")?;
    if reserved != 0 {
        return Err(SnapshotDecodeError::ReservedNonZero(reserved));
    }
    let mut state = MetadataState {
        applied: Op(r.u64("applied")?),
        applied_identity: r.u128("applied identity")?,
        next_stream_id: r.u32("next_stream_id")?,
        next_group: r.u64("next_group")?,
        next_user_id: r.u32("next_user_id")?,
        streams: BTreeMap::new(),
        users: BTreeMap::new(),
    };
    let streams = count(&mut r, "streams", STREAMS_MAX, STREAM_MIN)?;
    let mut last_stream = None;
    for _ in 0..streams {
        let id = StreamId(r.u32("stream id")?);
        ascending(&mut last_stream, id, "stream")?;
        let mut s = Stream {
            id,
            name: r.name("stream name")?,
            created_at_us: r.u64("stream created_at")?,
            next_topic_id: r.u32("next_topic_id")?,
            topics: BTreeMap::new(),
        };
        let topics = count(&mut r, "topics", TOPICS_PER_STREAM_MAX, TOPIC_MIN)?;
        let mut last_topic = None;
        for _ in 0..topics {
            let t = decode_topic(&mut r, &mut last_topic)?;
            s.topics.insert(t.id, t);
        }
        state.streams.insert(id, s);
    }
    let users = count(&mut r, "users", USERS_MAX, USER_MIN)?;
    let mut last_user = None;
    for _ in 0..users {
        let id = UserId(r.u32("user id")?);
        ascending(&mut last_user, id, "user")?;
        let u = User {
            id,
            username: r.name("username")?,
            password_hash: r.hash()?,
            created_at_us: r.u64("user created_at")?,
        };
        state.users.insert(id, u);
    }
    let left = r.0.remaining().len();
    if left != 0 {
        return Err(SnapshotDecodeError::TrailingBytes { len: left });
    }
    state
        .check_invariants()
        .map_err(SnapshotDecodeError::Inconsistent)?;
    Ok(state)
}

fn decode_topic(
    r: &mut Reader<'_>,
    last: &mut Option<TopicId>,
) -> Result<Topic, SnapshotDecodeError> {
    let id = TopicId(r.u32("topic id")?);
    ascending(last, id, "topic")?;
    let name = r.name("topic name")?;
    let created_at_us = r.u64("topic created_at")?;
    let config = r.config()?;
    let mut t = Topic {
        id,
        name,
        created_at_us,
        config,
        partitions: BTreeMap::new(),
        next_consumer_group_id: 0,
        consumer_groups: BTreeMap::new(),
    };
    let partitions = count(r, "partitions", PARTITIONS_PER_TOPIC_MAX, PARTITION_LEN)?;
    let mut last_partition = None;
    for _ in 0..partitions {
        let pid = PartitionId(r.u32("partition id")?);
        ascending(&mut last_partition, pid, "partition")?;
        let p = Partition {
            id: pid,
            group: GroupId(r.u64("partition group")?),
            incarnation: r.u64("partition incarnation")?,
            created_at_us: r.u64("partition created_at")?,
            purge_generation: r.u64("purge generation")?,
        };
        t.partitions.insert(pid, p);
    }
    t.next_consumer_group_id = r.u32("next_consumer_group_id")?;
    let groups = count(
        r,
        "consumer groups",
        CONSUMER_GROUPS_PER_TOPIC_MAX,
        GROUP_MIN,
    )?;
    let mut last_group = None;
    for _ in 0..groups {
        let gid = ConsumerGroupId(r.u32("consumer group id")?);
        ascending(&mut last_group, gid, "consumer group")?;
        let mut g = ConsumerGroup::new(gid, r.name("consumer group name")?);
        g.generation = r.u64("generation")?;
        g.next_member_id = r.u32("next_member_id")?;
        let members = count(r, "members", MEMBERS_PER_GROUP_MAX, MEMBER_MIN)?;
        let mut last_member = None;
        for _ in 0..members {
            let mid = MemberId(r.u32("member id")?);
            ascending(&mut last_member, mid, "member")?;
            let session = SessionId(r.u64("session")?);
            let n = count(r, "member partitions", PARTITIONS_PER_TOPIC_MAX, 4)?;
            let mut partitions = Vec::with_capacity(n as usize);
            for _ in 0..n {
                partitions.push(PartitionId(r.u32("member partition")?));
            }
            g.members.insert(
                mid,
                Member {
                    id: mid,
                    session,
                    partitions,
                },
            );
        }
        t.consumer_groups.insert(gid, g);
    }
    Ok(t)
}
