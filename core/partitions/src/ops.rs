//! The partition's replicated operations and their fail-closed codec.
//!
//! A partition group orders four kinds of request besides the VSR
//! `Register`. Each travels as the body of a prepare, tagged by the
//! prepare's `operation` byte; the layouts are in `docs/formats.md`
//! ("Partition operations"):
//!
//! | operation | code | body |
//! |---|---|---|
//! | [`PartitionOp::Append`] | 3 ([`OPERATION_APPEND`]) | one stamped message batch |
//! | [`PartitionOp::StoreOffset`] | 4 | 16 bytes |
//! | [`PartitionOp::DeleteOffset`] | 5 | 8 bytes |
//! | [`PartitionOp::Purge`] | 6 | 8 bytes |
//!
//! Batches reuse `OPERATION_APPEND`: the append is the group's ordinary
//! request. The small bodies are fixed-length with zero reserved bytes, so a
//! decoder can refuse anything else without allocating; no checksum of
//! their own is needed because the prepare's `checksum_body` covers them.

use std::fmt;

use bytes::Bytes;
use common::ConsumerKind;
use common::le_cursor::{LeField, tiles};
use consensus::vsr::{OPERATION_APPEND, OPERATION_REGISTER};
use storage::{BatchError, BatchView, Integrity};

/// `operation` of a consumer-offset store.
pub const OPERATION_STORE_OFFSET: u8 = 4;
/// `operation` of a consumer-offset delete.
pub const OPERATION_DELETE_OFFSET: u8 = 5;
/// `operation` of a purge.
pub const OPERATION_PURGE: u8 = 6;

/// Length of a [`PartitionOp::StoreOffset`] body.
pub const STORE_OFFSET_BODY_LEN: usize = 16;
/// Length of a [`PartitionOp::DeleteOffset`] body.
pub const DELETE_OFFSET_BODY_LEN: usize = 8;
/// Length of a [`PartitionOp::Purge`] body.
pub const PURGE_BODY_LEN: usize = 8;

const KIND_CONSUMER: u8 = 0;
const KIND_GROUP: u8 = 1;

/// The fields of a [`PartitionOp::StoreOffset`] body (docs/formats.md §10),
/// each declared once for the encoder and the decoder.
mod store_offset {
    use std::ops::Range;

    use common::le_cursor::{LeField, tiles};

    pub(super) const KIND: LeField<u8> = LeField::at(0);
    pub(super) const AUTO_COMMIT: LeField<u8> = LeField::at(1);
    pub(super) const RESERVED: Range<usize> = AUTO_COMMIT.end()..ID.start();
    pub(super) const ID: LeField<u32> = LeField::at(4);
    pub(super) const OFFSET: LeField<u64> = LeField::at(8);
    const _: () = assert!(tiles(
        super::STORE_OFFSET_BODY_LEN,
        &[
            KIND.range(),
            AUTO_COMMIT.range(),
            RESERVED,
            ID.range(),
            OFFSET.range()
        ]
    ));
}

/// The fields of a [`PartitionOp::DeleteOffset`] body (docs/formats.md §10).
mod delete_offset {
    use std::ops::Range;

    use common::le_cursor::{LeField, tiles};

    pub(super) const KIND: LeField<u8> = LeField::at(0);
    pub(super) const RESERVED: Range<usize> = KIND.end()..ID.start();
    pub(super) const ID: LeField<u32> = LeField::at(4);
    const _: () = assert!(tiles(
        super::DELETE_OFFSET_BODY_LEN,
        &[KIND.range(), RESERVED, ID.range()]
    ));
}

/// The one field of a [`PartitionOp::Purge`] body.
const PURGE_GENERATION: LeField<u64> = LeField::at(0);
const _: () = assert!(tiles(PURGE_BODY_LEN, &[PURGE_GENERATION.range()]));

/// One decoded partition operation (the body of a committed prepare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionOp {
    /// A stamped message batch (the bytes every replica persists).
    Append(Bytes),
    /// Store a consumer's offset. An explicit store may rewind; an
    /// auto-commit (from a poll) only advances.
    StoreOffset {
        /// Consumer or consumer group.
        kind: ConsumerKind,
        /// The consumer (group) id.
        id: u32,
        /// The last consumed offset.
        offset: u64,
        /// True for a poll's auto-commit.
        auto_commit: bool,
    },
    /// Forget a consumer's offset.
    DeleteOffset {
        /// Consumer or consumer group.
        kind: ConsumerKind,
        /// The consumer (group) id.
        id: u32,
    },
    /// Truncate the partition and restart offsets at 0 under this
    /// generation (applied only when it is above the current one).
    Purge {
        /// The purge generation this purge establishes.
        generation: u64,
    },
    /// A VSR session registration (no partition state changes).
    Register,
}

/// Why a prepare body is not a partition operation; nothing is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpDecodeError {
    /// The operation code is none of the partition's.
    UnknownOperation {
        /// The code found.
        operation: u8,
    },
    /// A fixed-size body of the wrong length.
    BadLength {
        /// The operation code.
        operation: u8,
        /// The length required.
        expected: usize,
        /// The length found.
        actual: usize,
    },
    /// A consumer kind byte that is neither consumer (0) nor group (1).
    UnknownConsumerKind {
        /// The byte found.
        kind: u8,
    },
    /// A flag byte that is neither 0 nor 1.
    BadFlag {
        /// The byte found.
        flag: u8,
    },
    /// A reserved byte that is not zero.
    ReservedNonZero {
        /// Byte index within the body.
        at: usize,
    },
    /// An append body that is not exactly one valid batch.
    InvalidBatch(BatchError),
}

impl fmt::Display for OpDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownOperation { operation } => {
                write!(f, "operation code {operation} is not a partition operation")
            }
            Self::BadLength {
                operation,
                expected,
                actual,
            } => write!(
                f,
                "operation {operation} needs a {expected}-byte body but carries {actual} bytes"
            ),
            Self::UnknownConsumerKind { kind } => {
                write!(f, "consumer kind {kind} is neither consumer nor group")
            }
            Self::BadFlag { flag } => write!(f, "flag byte {flag} is neither 0 nor 1"),
            Self::ReservedNonZero { at } => write!(f, "reserved body byte {at} is not zero"),
            Self::InvalidBatch(e) => write!(f, "append body is not one valid batch: {e}"),
        }
    }
}

impl std::error::Error for OpDecodeError {}

fn kind_byte(kind: ConsumerKind) -> u8 {
    match kind {
        ConsumerKind::Consumer => KIND_CONSUMER,
        ConsumerKind::ConsumerGroup => KIND_GROUP,
    }
}

fn kind_from(byte: u8) -> Result<ConsumerKind, OpDecodeError> {
    match byte {
        KIND_CONSUMER => Ok(ConsumerKind::Consumer),
        KIND_GROUP => Ok(ConsumerKind::ConsumerGroup),
        kind => Err(OpDecodeError::UnknownConsumerKind { kind }),
    }
}

/// The body as exactly `N` bytes, or `BadLength`: the fields are then read
/// at fixed offsets of an array that is known to hold them.
fn fixed_body<const N: usize>(operation: u8, body: &[u8]) -> Result<&[u8; N], OpDecodeError> {
    body.try_into().map_err(|_| OpDecodeError::BadLength {
        operation,
        expected: N,
        actual: body.len(),
    })
}

fn check_zero(body: &[u8], range: std::ops::Range<usize>) -> Result<(), OpDecodeError> {
    match body[range.clone()].iter().position(|&b| b != 0) {
        Some(i) => Err(OpDecodeError::ReservedNonZero {
            at: range.start + i,
        }),
        None => Ok(()),
    }
}

impl PartitionOp {
    /// The prepare `operation` code of this op.
    pub fn operation(&self) -> u8 {
        match self {
            Self::Append(_) => OPERATION_APPEND,
            Self::StoreOffset { .. } => OPERATION_STORE_OFFSET,
            Self::DeleteOffset { .. } => OPERATION_DELETE_OFFSET,
            Self::Purge { .. } => OPERATION_PURGE,
            Self::Register => OPERATION_REGISTER,
        }
    }

    /// The prepare body of this op.
    pub fn encode_body(&self) -> Bytes {
        match self {
            Self::Append(batch) => batch.clone(),
            Self::StoreOffset {
                kind,
                id,
                offset,
                auto_commit,
            } => {
                let mut b = [0u8; STORE_OFFSET_BODY_LEN];
                store_offset::KIND.put(&mut b, kind_byte(*kind));
                store_offset::AUTO_COMMIT.put(&mut b, u8::from(*auto_commit));
                store_offset::ID.put(&mut b, *id);
                store_offset::OFFSET.put(&mut b, *offset);
                Bytes::copy_from_slice(&b)
            }
            Self::DeleteOffset { kind, id } => {
                let mut b = [0u8; DELETE_OFFSET_BODY_LEN];
                delete_offset::KIND.put(&mut b, kind_byte(*kind));
                delete_offset::ID.put(&mut b, *id);
                Bytes::copy_from_slice(&b)
            }
            Self::Purge { generation } => {
                let mut b = [0u8; PURGE_BODY_LEN];
                PURGE_GENERATION.put(&mut b, *generation);
                Bytes::copy_from_slice(&b)
            }
            Self::Register => Bytes::new(),
        }
    }

    /// Decodes a prepare body. An append is checked as exactly one batch
    /// at `integrity` (everything, for bytes from a peer or a client) and
    /// against `batch_length_max`.
    pub fn decode(
        operation: u8,
        body: &Bytes,
        integrity: Integrity,
        batch_length_max: u64,
    ) -> Result<Self, OpDecodeError> {
        match operation {
            OPERATION_APPEND => {
                BatchView::decode_exact(body, integrity, batch_length_max)
                    .map_err(OpDecodeError::InvalidBatch)?;
                Ok(Self::Append(body.clone()))
            }
            OPERATION_STORE_OFFSET => {
                let b = fixed_body::<STORE_OFFSET_BODY_LEN>(operation, body)?;
                let kind = kind_from(store_offset::KIND.get(b))?;
                let auto_commit = match store_offset::AUTO_COMMIT.get(b) {
                    0 => false,
                    1 => true,
                    flag => return Err(OpDecodeError::BadFlag { flag }),
                };
                check_zero(b, store_offset::RESERVED)?;
                Ok(Self::StoreOffset {
                    kind,
                    id: store_offset::ID.get(b),
                    offset: store_offset::OFFSET.get(b),
                    auto_commit,
                })
            }
            OPERATION_DELETE_OFFSET => {
                let b = fixed_body::<DELETE_OFFSET_BODY_LEN>(operation, body)?;
                let kind = kind_from(delete_offset::KIND.get(b))?;
                check_zero(b, delete_offset::RESERVED)?;
                Ok(Self::DeleteOffset {
                    kind,
                    id: delete_offset::ID.get(b),
                })
            }
            OPERATION_PURGE => {
                let b = fixed_body::<PURGE_BODY_LEN>(operation, body)?;
                Ok(Self::Purge {
                    generation: PURGE_GENERATION.get(b),
                })
            }
            OPERATION_REGISTER => {
                fixed_body::<0>(operation, body)?;
                Ok(Self::Register)
            }
            operation => Err(OpDecodeError::UnknownOperation { operation }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use storage::{BATCH_LENGTH_MAX_DEFAULT, BatchBuilder};

    fn small_ops() -> Vec<PartitionOp> {
        vec![
            PartitionOp::StoreOffset {
                kind: ConsumerKind::ConsumerGroup,
                id: 7,
                offset: 1 << 40,
                auto_commit: true,
            },
            PartitionOp::StoreOffset {
                kind: ConsumerKind::Consumer,
                id: u32::MAX,
                offset: 0,
                auto_commit: false,
            },
            PartitionOp::DeleteOffset {
                kind: ConsumerKind::Consumer,
                id: 3,
            },
            PartitionOp::Purge { generation: 9 },
        ]
    }

    #[test]
    fn given_ops_when_encoded_should_round_trip() {
        let mut b = BatchBuilder::new(1);
        b.push(1, 0, b"x", b"");
        let batch = Bytes::from(b.build_stamped(0, 5, 6).unwrap());
        let mut ops = small_ops();
        ops.push(PartitionOp::Append(batch));
        ops.push(PartitionOp::Register);
        for op in ops {
            let body = op.encode_body();
            let back = PartitionOp::decode(
                op.operation(),
                &body,
                Integrity::Verify,
                BATCH_LENGTH_MAX_DEFAULT,
            )
            .unwrap();
            assert_eq!(back, op);
        }
    }

    #[test]
    fn given_truncated_or_extended_body_when_decoded_should_reject() {
        for op in small_ops() {
            let body = op.encode_body();
            for len in 0..body.len() {
                let cut = body.slice(..len);
                assert!(
                    PartitionOp::decode(op.operation(), &cut, Integrity::Verify, u64::MAX).is_err()
                );
            }
            let mut longer = body.to_vec();
            longer.push(0);
            let longer = Bytes::from(longer);
            assert!(
                PartitionOp::decode(op.operation(), &longer, Integrity::Verify, u64::MAX).is_err()
            );
        }
    }

    #[test]
    fn given_nonzero_reserved_or_bad_kind_when_decoded_should_reject() {
        let store = small_ops()[0].encode_body().to_vec();
        for (at, value) in [(0usize, 2u8), (1, 2), (2, 1), (3, 1)] {
            let mut b = store.clone();
            b[at] = value;
            let r = PartitionOp::decode(
                OPERATION_STORE_OFFSET,
                &Bytes::from(b),
                Integrity::Verify,
                u64::MAX,
            );
            assert!(r.is_err(), "byte {at} = {value} accepted");
        }
        let delete = small_ops()[2].encode_body().to_vec();
        for at in 0..4 {
            let mut b = delete.clone();
            b[at] = 9;
            let r = PartitionOp::decode(
                OPERATION_DELETE_OFFSET,
                &Bytes::from(b),
                Integrity::Verify,
                u64::MAX,
            );
            assert!(r.is_err(), "byte {at} accepted");
        }
    }

    proptest::proptest! {
        #[test]
        fn given_random_store_when_encoded_should_round_trip(
            group in proptest::bool::ANY,
            id in proptest::num::u32::ANY,
            offset in proptest::num::u64::ANY,
            auto_commit in proptest::bool::ANY,
        ) {
            let kind = if group { ConsumerKind::ConsumerGroup } else { ConsumerKind::Consumer };
            let op = PartitionOp::StoreOffset { kind, id, offset, auto_commit };
            let back = PartitionOp::decode(op.operation(), &op.encode_body(), Integrity::Verify, u64::MAX);
            proptest::prop_assert_eq!(back, Ok(op));
        }

        #[test]
        fn given_random_bytes_when_decoded_should_never_panic_and_reencode_exactly(
            operation in 0u8..8,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let body = Bytes::from(body);
            if let Ok(op) = PartitionOp::decode(operation, &body, Integrity::Verify, u64::MAX) {
                // Whatever decodes is canonical: no two encodings of an op.
                proptest::prop_assert_eq!(op.encode_body(), body);
                proptest::prop_assert_eq!(op.operation(), operation);
            }
        }
    }

    #[test]
    fn given_unknown_operation_or_bad_batch_when_decoded_should_reject() {
        let body = Bytes::from_static(&[0u8; 8]);
        assert_eq!(
            PartitionOp::decode(2, &body, Integrity::Verify, u64::MAX),
            Err(OpDecodeError::UnknownOperation { operation: 2 })
        );
        assert!(matches!(
            PartitionOp::decode(OPERATION_APPEND, &body, Integrity::Verify, u64::MAX),
            Err(OpDecodeError::InvalidBatch(_))
        ));
        let mut b = BatchBuilder::new(1);
        b.push(1, 0, b"payload", b"");
        let mut bytes = b.build_stamped(0, 0, 1).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(matches!(
            PartitionOp::decode(
                OPERATION_APPEND,
                &Bytes::from(bytes),
                Integrity::Verify,
                u64::MAX
            ),
            Err(OpDecodeError::InvalidBatch(_))
        ));
    }
}
