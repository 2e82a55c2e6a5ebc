//! The bytes of the forward lane: a [`Request`] a replica sends to a
//! group's primary on another replica, and the [`Reply`] it gets back.
//!
//! ```text
//! frame   = len u32 (bytes after this field) | xxh3-64 of body u64 | body
//! body    = id u64 | kind u8 | fields
//! request kinds: 1 partition call (group u64, call), 2 metadata op
//!                (user u32, op: the metadata op codec's bytes)
//! reply kinds:   1 partition answer (result), 2 metadata outcome
//!                (result, the primary's applied metadata op u64)
//! ```
//!
//! Every variable-length field is a u32 length and its bytes; every count
//! is checked against the bytes present before anything is allocated, and
//! a body must be consumed exactly. Decoders fail closed with a
//! [`CodecError`].

use bytes::Bytes;
use common::le_cursor::{LeCursor, Truncated};
use common::{ConsumerKind, GroupId, Offset, Op, PartitionId, StreamId, TopicId};
use metadata::{ConsumerGroupId, MetadataOp, Outcome, UserId};
use partitions::{PartitionStats, PollRequest, Polled, PollingStrategy};
use shard::{Answer, Call, ProducerKey};
use xxhash_rust::xxh3::xxh3_64;

use crate::protocol::{Identifier, Name};
use crate::session::BackendError;

/// Bytes before a frame's body: its length and checksum.
pub const FRAME_PREFIX: usize = 12;

/// A request to the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A call on a partition group.
    Partition {
        /// The group.
        group: GroupId,
        /// The call.
        call: Call,
    },
    /// A metadata op, submitted on behalf of a user.
    Meta {
        /// The user.
        user: u32,
        /// The op.
        op: MetadataOp,
    },
}

/// The primary's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A partition call's outcome.
    Partition(Result<Answer, BackendError>),
    /// A metadata op's outcome, and the primary's applied metadata op
    /// after it (the forwarding replica waits to have applied as much
    /// before it answers, so its client reads its own writes).
    Meta {
        /// The outcome.
        result: Result<Outcome, BackendError>,
        /// The primary's applied op.
        applied: u64,
    },
}

/// Why bytes are not a forward frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// Fewer bytes than a field needs.
    Truncated,
    /// The checksum does not match the body.
    Checksum,
    /// A tag names no variant.
    UnknownTag {
        /// Which field.
        field: &'static str,
        /// The tag.
        tag: u8,
    },
    /// A length is past the ceiling or the bytes present.
    Length {
        /// Which field.
        field: &'static str,
    },
    /// A name is not 1..=255 bytes of UTF-8.
    BadName,
    /// The metadata op does not decode.
    Op(String),
    /// Bytes are left after the body.
    TrailingBytes,
}

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated => f.write_str("the frame ends inside a field"),
            Self::Checksum => f.write_str("the frame's checksum does not match"),
            Self::UnknownTag { field, tag } => write!(f, "tag {tag} of {field} is unknown"),
            Self::Length { field } => write!(f, "the length of {field} is out of bounds"),
            Self::BadName => f.write_str("a name is not 1..=255 bytes of UTF-8"),
            Self::Op(e) => write!(f, "the metadata op does not decode: {e}"),
            Self::TrailingBytes => f.write_str("bytes are left after the body"),
        }
    }
}

impl std::error::Error for CodecError {}

impl From<Truncated> for CodecError {
    fn from(_: Truncated) -> Self {
        Self::Truncated
    }
}

/// A little-endian writer.
#[derive(Debug, Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        // Lengths past u32 cannot be framed; the frame ceiling is far
        // below, and the reader refuses what the writer would cut.
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
    }
    fn text(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

struct In<'a>(LeCursor<'a>);

impl<'a> In<'a> {
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.0.u8()?)
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(self.0.u32()?)
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(self.0.u64()?)
    }
    fn bool(&mut self, field: &'static str) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(CodecError::UnknownTag { field, tag }),
        }
    }
    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], CodecError> {
        let len = self.u32()? as usize;
        if len > self.0.remaining().len() {
            return Err(CodecError::Length { field });
        }
        Ok(self.0.take(len)?)
    }
    fn text(&mut self, field: &'static str) -> Result<String, CodecError> {
        let b = self.bytes(field)?;
        String::from_utf8(b.to_vec()).map_err(|_| CodecError::Length { field })
    }
    fn name(&mut self) -> Result<Name, CodecError> {
        Name::new(self.text("name")?).ok_or(CodecError::BadName)
    }
    fn done(&self) -> Result<(), CodecError> {
        if self.0.remaining().is_empty() {
            Ok(())
        } else {
            Err(CodecError::TrailingBytes)
        }
    }
}

/// Frames a body: length, checksum, body.
fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_PREFIX + body.len());
    let len = u32::try_from(body.len() + 8).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The frame's length field (the bytes after it), from its first four
/// bytes: what a reader checks against its ceiling before buffering.
pub fn frame_len(prefix: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*prefix)
}

/// Checks a frame's checksum and returns its body. `rest` is the frame
/// after its length field.
///
/// # Errors
/// [`CodecError::Truncated`] or [`CodecError::Checksum`].
pub fn verified_body(rest: &[u8]) -> Result<&[u8], CodecError> {
    let (sum, body) = rest.split_at_checked(8).ok_or(CodecError::Truncated)?;
    let sum = u64::from_le_bytes(sum.try_into().map_err(|_| CodecError::Truncated)?);
    if sum != xxh3_64(body) {
        return Err(CodecError::Checksum);
    }
    Ok(body)
}

/// A request's frame.
///
/// # Errors
/// The metadata op codec's refusal (an op too large to encode).
pub fn encode_request(id: u64, request: &Request) -> Result<Vec<u8>, CodecError> {
    let mut o = Out::default();
    o.u64(id);
    match request {
        Request::Partition { group, call } => {
            o.u8(1);
            o.u64(group.0);
            put_call(&mut o, call);
        }
        Request::Meta { user, op } => {
            o.u8(2);
            o.u32(*user);
            let bytes = op.encode().map_err(|e| CodecError::Op(e.to_string()))?;
            o.bytes(&bytes);
        }
    }
    Ok(frame(o.0))
}

/// Decodes a request body (after [`verified_body`]).
///
/// # Errors
/// [`CodecError`] naming the first field that is wrong.
pub fn decode_request(body: &[u8]) -> Result<(u64, Request), CodecError> {
    let mut i = In(LeCursor::new(body));
    let id = i.u64()?;
    let request = match i.u8()? {
        1 => {
            let group = GroupId(i.u64()?);
            let call = get_call(&mut i)?;
            Request::Partition { group, call }
        }
        2 => {
            let user = i.u32()?;
            let op =
                MetadataOp::decode(i.bytes("op")?).map_err(|e| CodecError::Op(e.to_string()))?;
            Request::Meta { user, op }
        }
        tag => {
            return Err(CodecError::UnknownTag {
                field: "request",
                tag,
            });
        }
    };
    i.done()?;
    Ok((id, request))
}

/// A reply's frame.
pub fn encode_reply(id: u64, reply: &Reply) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(id);
    match reply {
        Reply::Partition(result) => {
            o.u8(1);
            match result {
                Ok(answer) => {
                    o.u8(0);
                    put_answer(&mut o, answer);
                }
                Err(e) => {
                    o.u8(1);
                    put_error(&mut o, e);
                }
            }
        }
        Reply::Meta { result, applied } => {
            o.u8(2);
            o.u64(*applied);
            match result {
                Ok(outcome) => {
                    o.u8(0);
                    put_outcome(&mut o, outcome);
                }
                Err(e) => {
                    o.u8(1);
                    put_error(&mut o, e);
                }
            }
        }
    }
    frame(o.0)
}

/// Decodes a reply body (after [`verified_body`]).
///
/// # Errors
/// [`CodecError`] naming the first field that is wrong.
pub fn decode_reply(body: &[u8]) -> Result<(u64, Reply), CodecError> {
    let mut i = In(LeCursor::new(body));
    let id = i.u64()?;
    let reply = match i.u8()? {
        1 => Reply::Partition(match i.bool("result")? {
            false => Ok(get_answer(&mut i)?),
            true => Err(get_error(&mut i)?),
        }),
        2 => {
            let applied = i.u64()?;
            let result = match i.bool("result")? {
                false => Ok(get_outcome(&mut i)?),
                true => Err(get_error(&mut i)?),
            };
            Reply::Meta { result, applied }
        }
        tag => {
            return Err(CodecError::UnknownTag {
                field: "reply",
                tag,
            });
        }
    };
    i.done()?;
    Ok((id, reply))
}

fn kind_tag(kind: ConsumerKind) -> u8 {
    match kind {
        ConsumerKind::Consumer => 0,
        ConsumerKind::ConsumerGroup => 1,
    }
}

fn get_kind(i: &mut In<'_>) -> Result<ConsumerKind, CodecError> {
    match i.u8()? {
        0 => Ok(ConsumerKind::Consumer),
        1 => Ok(ConsumerKind::ConsumerGroup),
        tag => Err(CodecError::UnknownTag {
            field: "consumer kind",
            tag,
        }),
    }
}

fn put_call(o: &mut Out, call: &Call) {
    match call {
        Call::Produce { batch, key } => {
            o.u8(1);
            o.u64(key.key as u64);
            o.u64((key.key >> 64) as u64);
            o.u8(u8::from(key.replay));
            o.u64(key.vouched);
            o.bytes(batch);
        }
        Call::Poll(p) => {
            o.u8(2);
            o.u8(kind_tag(p.consumer.0));
            o.u32(p.consumer.1);
            let (tag, value) = match p.strategy {
                PollingStrategy::Offset(v) => (0, v),
                PollingStrategy::Timestamp(v) => (1, v),
                PollingStrategy::First => (2, 0),
                PollingStrategy::Last => (3, 0),
                PollingStrategy::Next => (4, 0),
            };
            o.u8(tag);
            o.u64(value);
            o.u32(p.count);
            o.u8(u8::from(p.auto_commit));
        }
        Call::StoreOffset { kind, id, offset } => {
            o.u8(3);
            o.u8(kind_tag(*kind));
            o.u32(*id);
            o.u64(offset.0);
        }
        Call::GetOffset { kind, id } => {
            o.u8(4);
            o.u8(kind_tag(*kind));
            o.u32(*id);
        }
        Call::DeleteOffset { kind, id } => {
            o.u8(5);
            o.u8(kind_tag(*kind));
            o.u32(*id);
        }
        Call::Purge { generation } => {
            o.u8(6);
            o.u64(*generation);
        }
        Call::Flush => o.u8(7),
        Call::Stats => o.u8(8),
    }
}

fn get_call(i: &mut In<'_>) -> Result<Call, CodecError> {
    Ok(match i.u8()? {
        1 => {
            let low = u128::from(i.u64()?);
            let high = u128::from(i.u64()?);
            let replay = i.bool("replay")?;
            let vouched = i.u64()?;
            Call::Produce {
                key: ProducerKey {
                    key: (high << 64) | low,
                    replay,
                    vouched,
                },
                batch: i.bytes("batch")?.to_vec(),
            }
        }
        2 => {
            let kind = get_kind(i)?;
            let id = i.u32()?;
            let tag = i.u8()?;
            let value = i.u64()?;
            let strategy = match tag {
                0 => PollingStrategy::Offset(value),
                1 => PollingStrategy::Timestamp(value),
                2 => PollingStrategy::First,
                3 => PollingStrategy::Last,
                4 => PollingStrategy::Next,
                tag => {
                    return Err(CodecError::UnknownTag {
                        field: "polling strategy",
                        tag,
                    });
                }
            };
            let count = i.u32()?;
            let auto_commit = i.bool("auto commit")?;
            Call::Poll(PollRequest {
                consumer: (kind, id),
                strategy,
                count,
                auto_commit,
            })
        }
        3 => Call::StoreOffset {
            kind: get_kind(i)?,
            id: i.u32()?,
            offset: Offset(i.u64()?),
        },
        4 => Call::GetOffset {
            kind: get_kind(i)?,
            id: i.u32()?,
        },
        5 => Call::DeleteOffset {
            kind: get_kind(i)?,
            id: i.u32()?,
        },
        6 => Call::Purge {
            generation: i.u64()?,
        },
        7 => Call::Flush,
        8 => Call::Stats,
        tag => return Err(CodecError::UnknownTag { field: "call", tag }),
    })
}

fn put_answer(o: &mut Out, answer: &Answer) {
    match answer {
        Answer::Committed { op, base_offset } => {
            o.u8(1);
            o.u64(op.0);
            match base_offset {
                Some(v) => {
                    o.u8(1);
                    o.u64(v.0);
                }
                None => o.u8(0),
            }
        }
        Answer::Polled(p) => {
            o.u8(2);
            o.u64(p.first_offset.0);
            o.u64(p.last_offset.0);
            o.u64(p.count);
            o.u32(u32::try_from(p.batches.len()).unwrap_or(u32::MAX));
            for b in &p.batches {
                o.bytes(b);
            }
        }
        Answer::Offset(offset) => {
            o.u8(3);
            match offset {
                Some(v) => {
                    o.u8(1);
                    o.u64(v.0);
                }
                None => o.u8(0),
            }
        }
        Answer::Done => o.u8(4),
        Answer::Stats(s) => {
            o.u8(5);
            o.u64(s.messages_count);
            o.u64(s.size_bytes);
            o.u64(s.segments_count);
            match s.current_offset {
                Some(v) => {
                    o.u8(1);
                    o.u64(v.0);
                }
                None => o.u8(0),
            }
        }
    }
}

fn get_option_u64(i: &mut In<'_>, field: &'static str) -> Result<Option<u64>, CodecError> {
    Ok(match i.bool(field)? {
        true => Some(i.u64()?),
        false => None,
    })
}

fn get_answer(i: &mut In<'_>) -> Result<Answer, CodecError> {
    Ok(match i.u8()? {
        1 => Answer::Committed {
            op: Op(i.u64()?),
            base_offset: get_option_u64(i, "base offset")?.map(Offset),
        },
        2 => {
            let first_offset = i.u64()?;
            let last_offset = i.u64()?;
            let count = i.u64()?;
            let batches = i.u32()? as usize;
            // Each batch takes at least its 4-byte length.
            if batches > i.0.remaining().len() / 4 {
                return Err(CodecError::Length { field: "batches" });
            }
            let mut list = Vec::with_capacity(batches);
            for _ in 0..batches {
                list.push(Bytes::copy_from_slice(i.bytes("batch")?));
            }
            Answer::Polled(Polled {
                batches: list,
                first_offset: Offset(first_offset),
                last_offset: Offset(last_offset),
                count,
            })
        }
        3 => Answer::Offset(get_option_u64(i, "offset")?.map(Offset)),
        4 => Answer::Done,
        5 => Answer::Stats(PartitionStats {
            messages_count: i.u64()?,
            size_bytes: i.u64()?,
            segments_count: i.u64()?,
            current_offset: get_option_u64(i, "current offset")?.map(Offset),
        }),
        tag => {
            return Err(CodecError::UnknownTag {
                field: "answer",
                tag,
            });
        }
    })
}

fn put_outcome(o: &mut Out, outcome: &Outcome) {
    match outcome {
        Outcome::StreamCreated(s) => {
            o.u8(1);
            o.u32(s.0);
        }
        Outcome::TopicCreated(s, t) => {
            o.u8(2);
            o.u32(s.0);
            o.u32(t.0);
        }
        Outcome::ConsumerGroupCreated(s, t, g) => {
            o.u8(3);
            o.u32(s.0);
            o.u32(t.0);
            o.u32(g.0);
        }
        Outcome::UserCreated(u) => {
            o.u8(4);
            o.u32(u.0);
        }
        Outcome::Done => o.u8(5),
    }
}

fn get_outcome(i: &mut In<'_>) -> Result<Outcome, CodecError> {
    Ok(match i.u8()? {
        1 => Outcome::StreamCreated(StreamId(i.u32()?)),
        2 => Outcome::TopicCreated(StreamId(i.u32()?), TopicId(i.u32()?)),
        3 => Outcome::ConsumerGroupCreated(
            StreamId(i.u32()?),
            TopicId(i.u32()?),
            ConsumerGroupId(i.u32()?),
        ),
        4 => Outcome::UserCreated(UserId(i.u32()?)),
        5 => Outcome::Done,
        tag => {
            return Err(CodecError::UnknownTag {
                field: "outcome",
                tag,
            });
        }
    })
}

fn put_identifier(o: &mut Out, id: &Identifier) {
    match id {
        Identifier::Numeric(n) => {
            o.u8(0);
            o.u32(*n);
        }
        Identifier::Name(name) => {
            o.u8(1);
            o.text(name.as_str());
        }
    }
}

fn get_identifier(i: &mut In<'_>) -> Result<Identifier, CodecError> {
    match i.u8()? {
        0 => Ok(Identifier::Numeric(i.u32()?)),
        1 => Ok(Identifier::Name(i.name()?)),
        tag => Err(CodecError::UnknownTag {
            field: "identifier",
            tag,
        }),
    }
}

fn put_error(o: &mut Out, e: &BackendError) {
    use BackendError as B;
    match e {
        B::InvalidCredentials => o.u8(1),
        B::Unauthorized => o.u8(2),
        B::StreamNotFound(id) => {
            o.u8(3);
            put_identifier(o, id);
        }
        B::TopicNotFound(id) => {
            o.u8(4);
            put_identifier(o, id);
        }
        B::ConsumerGroupNotFound(id) => {
            o.u8(5);
            put_identifier(o, id);
        }
        B::PartitionNotFound(p) => {
            o.u8(6);
            o.u32(p.0);
        }
        B::NoPartitions => o.u8(7),
        B::StreamNameAlreadyExists(n) => {
            o.u8(8);
            o.text(n.as_str());
        }
        B::TopicNameAlreadyExists(n) => {
            o.u8(9);
            o.text(n.as_str());
        }
        B::ConsumerGroupNameAlreadyExists(n) => {
            o.u8(10);
            o.text(n.as_str());
        }
        B::InvalidPartitionsCount(n) => {
            o.u8(11);
            o.u32(*n);
        }
        B::InvalidMessagesCount(n) => {
            o.u8(12);
            o.u32(*n);
        }
        B::NotGroupMember => o.u8(13),
        B::PartitionNotOwned(p) => {
            o.u8(14);
            o.u32(p.0);
        }
        B::InvalidOption(s) => {
            o.u8(15);
            o.text(s);
        }
        B::NotCommitted => o.u8(16),
        B::NoPrimary => o.u8(17),
        B::Unsupported => o.u8(18),
        B::LocalFault(s) => {
            o.u8(19);
            o.text(s);
        }
        B::UnsupportedOptionKey(s) => {
            o.u8(20);
            o.text(s);
        }
        B::AlreadyApplied => o.u8(21),
        B::Busy => o.u8(23),
        B::NotReady => o.u8(25),
        B::NoSpace(s) => {
            o.u8(24);
            o.text(s);
        }
        B::ReplayUnplaced { since } => {
            o.u8(22);
            let (boot, held_us) = since.unwrap_or((0, 0));
            o.u8(u8::from(since.is_some()));
            o.u64(boot);
            o.u64(held_us);
        }
    }
}

fn get_error(i: &mut In<'_>) -> Result<BackendError, CodecError> {
    use BackendError as B;
    Ok(match i.u8()? {
        1 => B::InvalidCredentials,
        2 => B::Unauthorized,
        3 => B::StreamNotFound(get_identifier(i)?),
        4 => B::TopicNotFound(get_identifier(i)?),
        5 => B::ConsumerGroupNotFound(get_identifier(i)?),
        6 => B::PartitionNotFound(PartitionId(i.u32()?)),
        7 => B::NoPartitions,
        8 => B::StreamNameAlreadyExists(i.name()?),
        9 => B::TopicNameAlreadyExists(i.name()?),
        10 => B::ConsumerGroupNameAlreadyExists(i.name()?),
        11 => B::InvalidPartitionsCount(i.u32()?),
        12 => B::InvalidMessagesCount(i.u32()?),
        13 => B::NotGroupMember,
        14 => B::PartitionNotOwned(PartitionId(i.u32()?)),
        15 => B::InvalidOption(i.text("option")?),
        16 => B::NotCommitted,
        17 => B::NoPrimary,
        18 => B::Unsupported,
        19 => B::LocalFault(i.text("fault")?),
        20 => B::UnsupportedOptionKey(i.text("option key")?),
        21 => B::AlreadyApplied,
        23 => B::Busy,
        25 => B::NotReady,
        24 => B::NoSpace(i.text("no space")?),
        22 => {
            let known = i.bool("replay since")?;
            let boot = i.u64()?;
            let held_us = i.u64()?;
            B::ReplayUnplaced {
                since: known.then_some((boot, held_us)),
            }
        }
        tag => {
            return Err(CodecError::UnknownTag {
                field: "error",
                tag,
            });
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(frame: &[u8]) -> &[u8] {
        let len = frame_len(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        verified_body(&frame[4..]).unwrap()
    }

    fn requests() -> Vec<Request> {
        let kinds = [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup];
        let mut calls = vec![
            Call::Produce {
                batch: vec![1, 2, 3, 4],
                key: ProducerKey {
                    key: u128::MAX - 7,
                    replay: true,
                    vouched: 1_234,
                },
            },
            Call::produce(vec![]),
            Call::Purge { generation: 9 },
            Call::Flush,
            Call::Stats,
        ];
        for kind in kinds {
            for strategy in [
                PollingStrategy::Offset(5),
                PollingStrategy::Timestamp(u64::MAX),
                PollingStrategy::First,
                PollingStrategy::Last,
                PollingStrategy::Next,
            ] {
                calls.push(Call::Poll(PollRequest {
                    consumer: (kind, 7),
                    strategy,
                    count: 10,
                    auto_commit: true,
                }));
            }
            calls.push(Call::StoreOffset {
                kind,
                id: 3,
                offset: Offset(44),
            });
            calls.push(Call::GetOffset { kind, id: 3 });
            calls.push(Call::DeleteOffset { kind, id: 3 });
        }
        let mut out: Vec<Request> = calls
            .into_iter()
            .map(|call| Request::Partition {
                group: GroupId(12),
                call,
            })
            .collect();
        out.push(Request::Meta {
            user: 0,
            op: MetadataOp::DeleteStream {
                stream: metadata::Identifier::Numeric(3),
            },
        });
        out
    }

    fn replies() -> Vec<Reply> {
        use BackendError as B;
        let name = || Name::new("n").unwrap();
        let errors = vec![
            B::InvalidCredentials,
            B::Unauthorized,
            B::StreamNotFound(Identifier::Numeric(1)),
            B::TopicNotFound(Identifier::Name(name())),
            B::ConsumerGroupNotFound(Identifier::Numeric(2)),
            B::PartitionNotFound(PartitionId(3)),
            B::NoPartitions,
            B::StreamNameAlreadyExists(name()),
            B::TopicNameAlreadyExists(name()),
            B::ConsumerGroupNameAlreadyExists(name()),
            B::InvalidPartitionsCount(4),
            B::InvalidMessagesCount(0),
            B::NotGroupMember,
            B::PartitionNotOwned(PartitionId(1)),
            B::InvalidOption("x".into()),
            B::NotCommitted,
            B::NoPrimary,
            B::Unsupported,
            B::LocalFault("disk".into()),
            B::UnsupportedOptionKey("segment_size".into()),
            B::AlreadyApplied,
            B::ReplayUnplaced { since: None },
            B::ReplayUnplaced {
                since: Some((7, 1_000)),
            },
            B::Busy,
            B::NoSpace("g-3: disk full".into()),
            B::NotReady,
        ];
        let answers = vec![
            Answer::Committed {
                op: Op(8),
                base_offset: None,
            },
            Answer::Committed {
                op: Op(9),
                base_offset: Some(Offset(77)),
            },
            Answer::Polled(Polled {
                batches: vec![Bytes::from_static(b"abc"), Bytes::new()],
                first_offset: Offset(1),
                last_offset: Offset(2),
                count: 2,
            }),
            Answer::Offset(None),
            Answer::Offset(Some(Offset(3))),
            Answer::Done,
            Answer::Stats(PartitionStats {
                messages_count: 1,
                size_bytes: 2,
                segments_count: 3,
                current_offset: Some(Offset(4)),
            }),
        ];
        let outcomes = [
            Outcome::StreamCreated(StreamId(1)),
            Outcome::TopicCreated(StreamId(1), TopicId(2)),
            Outcome::ConsumerGroupCreated(StreamId(1), TopicId(2), ConsumerGroupId(3)),
            Outcome::UserCreated(UserId(4)),
            Outcome::Done,
        ];
        let mut out: Vec<Reply> = errors
            .iter()
            .cloned()
            .map(|e| Reply::Partition(Err(e)))
            .collect();
        out.extend(answers.into_iter().map(|a| Reply::Partition(Ok(a))));
        out.extend(outcomes.into_iter().map(|o| Reply::Meta {
            result: Ok(o),
            applied: 5,
        }));
        out.extend(errors.into_iter().map(|e| Reply::Meta {
            result: Err(e),
            applied: 6,
        }));
        out
    }

    #[test]
    fn given_every_request_and_reply_when_encoded_should_decode_to_itself() {
        for (n, r) in requests().into_iter().enumerate() {
            let frame = encode_request(n as u64, &r).unwrap();
            assert_eq!(decode_request(body(&frame)), Ok((n as u64, r)));
        }
        for (n, r) in replies().into_iter().enumerate() {
            let frame = encode_reply(n as u64, &r);
            assert_eq!(decode_reply(body(&frame)), Ok((n as u64, r)));
        }
    }

    #[test]
    fn given_any_strict_prefix_or_flipped_bit_when_decoded_should_fail_closed() {
        for r in requests() {
            let frame = encode_request(1, &r).unwrap();
            let b = body(&frame);
            for cut in 0..b.len() {
                assert!(decode_request(&b[..cut]).is_err(), "{r:?} cut at {cut}");
            }
            let mut longer = b.to_vec();
            longer.push(0);
            assert_eq!(decode_request(&longer), Err(CodecError::TrailingBytes));
            for at in 4..frame.len() {
                let mut bad = frame.clone();
                bad[at] ^= 0x10;
                assert!(verified_body(&bad[4..]).is_err(), "{r:?} bit at {at}");
            }
        }
        for r in replies() {
            let frame = encode_reply(1, &r);
            let b = body(&frame);
            for cut in 0..b.len() {
                assert!(decode_reply(&b[..cut]).is_err(), "{r:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn given_a_batch_count_past_the_bytes_when_decoded_should_refuse_before_allocating() {
        let mut o = Out::default();
        o.u64(1);
        o.u8(1);
        o.u8(0);
        o.u8(2);
        o.u64(0);
        o.u64(0);
        o.u64(0);
        o.u32(u32::MAX);
        assert_eq!(
            decode_reply(&o.0),
            Err(CodecError::Length { field: "batches" })
        );
    }

    proptest! {
        #[test]
        fn given_random_bodies_when_decoded_should_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_request(&bytes);
            let _ = decode_reply(&bytes);
            let _ = verified_body(&bytes);
        }
    }
}
