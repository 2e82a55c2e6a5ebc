//! The message batch codec (SPEC §4): the same bytes on the client wire, in
//! replication and on disk, as the `iggy` 0.11.0 client sends them.
//!
//! `[256-byte batch header][message frames back to back]`, each frame
//! `[48-byte frame header][payload][user headers]`, all little-endian. Every
//! message carries an xxh3-64 of its frame bytes `[8..end]`; the batch
//! checksum is one streaming xxh3-64 over the header fields and then each
//! message's stored checksum, so stamping a base offset or timestamp costs
//! 8 bytes of hashing per message and never touches the bodies.
//!
//! Validation fails closed with a typed [`BatchError`]; [`BatchView`]
//! iterates messages in place, without copying. [`BatchStream`] runs the
//! same validation over a batch arriving in pieces, holding at most a
//! header of it. [`BatchBuilder`] encodes batches for tests and tools.

use std::fmt;

use common::le_cursor::{LeField, tiles};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

mod stream;
pub use stream::BatchStream;

/// Size of the batch header.
pub const BATCH_HEADER_SIZE: usize = 256;
/// Size of a message frame header.
pub const MESSAGE_HEADER_SIZE: usize = 48;
/// Default ceiling on a batch's `batch_length`; a longer length read from
/// disk or the wire is corruption, never an allocation.
pub const BATCH_LENGTH_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

// The batch header's fields (docs/formats.md §12), each declared once for
// the encoder, the stamp and the decoder.
const PARTITION_ID: LeField<u64> = LeField::at(0);
const BASE_OFFSET: LeField<u64> = LeField::at(8);
const BASE_TIMESTAMP: LeField<u64> = LeField::at(16);
const ORIGIN_TIMESTAMP: LeField<u64> = LeField::at(24);
const BATCH_LENGTH: LeField<u64> = LeField::at(32);
const BATCH_CHECKSUM: LeField<u64> = LeField::at(40);
const MESSAGE_COUNT: LeField<u32> = LeField::at(48);
/// The rest of the header is reserved (zero).
const RESERVED: usize = MESSAGE_COUNT.end();
const _: () = assert!(tiles(
    BATCH_HEADER_SIZE,
    &[
        PARTITION_ID.range(),
        BASE_OFFSET.range(),
        BASE_TIMESTAMP.range(),
        ORIGIN_TIMESTAMP.range(),
        BATCH_LENGTH.range(),
        BATCH_CHECKSUM.range(),
        MESSAGE_COUNT.range(),
        RESERVED..BATCH_HEADER_SIZE,
    ]
));

// A message frame header's fields.
const MSG_CHECKSUM: LeField<u64> = LeField::at(0);
const MSG_ID: LeField<u128> = LeField::at(8);
const MSG_OFFSET_DELTA: LeField<u32> = LeField::at(24);
const MSG_TIMESTAMP_DELTA: LeField<u32> = LeField::at(28);
const MSG_USER_HEADERS_LEN: LeField<u32> = LeField::at(32);
const MSG_PAYLOAD_LEN: LeField<u32> = LeField::at(36);
/// Reserved (zero): the rest of the frame header, read as one word.
const MSG_RESERVED: LeField<u64> = LeField::at(40);
const _: () = assert!(tiles(
    MESSAGE_HEADER_SIZE,
    &[
        MSG_CHECKSUM.range(),
        MSG_ID.range(),
        MSG_OFFSET_DELTA.range(),
        MSG_TIMESTAMP_DELTA.range(),
        MSG_USER_HEADERS_LEN.range(),
        MSG_PAYLOAD_LEN.range(),
        MSG_RESERVED.range(),
    ]
));
/// A message's checksum covers its frame from the byte after itself.
const MSG_CHECKSUMMED_FROM: usize = MSG_CHECKSUM.end();

/// Why a batch was refused. Each variant names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than the header or than the declared `batch_length`.
    Truncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes present.
        available: u64,
    },
    /// `batch_length` does not even cover the 256-byte header.
    LengthBelowHeader {
        /// The declared length.
        batch_length: u64,
    },
    /// `batch_length` above the configured ceiling.
    LengthAboveMax {
        /// The declared length.
        batch_length: u64,
        /// The ceiling.
        max: u64,
    },
    /// A nonzero byte in the header's reserved region (no checksum covers
    /// it, so it must be zero).
    HeaderReservedNonZero {
        /// Byte index within the header.
        at: usize,
    },
    /// `message_count` is zero.
    ZeroMessages,
    /// A frame's reserved bytes are not zero.
    FrameReservedNonZero {
        /// Index of the message in the batch.
        message_index: u32,
    },
    /// A frame runs past the declared batch length.
    FrameOverrun {
        /// Index of the message in the batch.
        message_index: u32,
        /// Where the frame would end (batch-relative).
        frame_end: u64,
        /// The declared batch length.
        batch_length: u64,
    },
    /// The frames do not tile the body: their count differs from the header.
    CountMismatch {
        /// `message_count` in the header.
        declared: u32,
        /// Frames actually walked.
        walked: u64,
    },
    /// The declared frames end before `batch_length`, and what follows is
    /// not a whole frame.
    FramesDoNotFillLength {
        /// Bytes covered by the header and the declared frames.
        covered: u64,
        /// The declared length.
        batch_length: u64,
    },
    /// A message's `offset_delta` is not its index in the batch.
    OffsetDeltaMismatch {
        /// Index of the message in the batch.
        message_index: u32,
        /// The stored delta.
        offset_delta: u32,
    },
    /// `base_offset + message_count - 1` overflows u64.
    OffsetOverflow {
        /// The header's base offset.
        base_offset: u64,
        /// The header's message count.
        message_count: u32,
    },
    /// Bytes follow the batch where exactly one batch was expected.
    TrailingBytes {
        /// The declared length.
        batch_length: u64,
        /// The buffer length.
        buffer_len: u64,
    },
    /// A message's stored checksum does not match its bytes.
    MessageChecksum {
        /// The message's absolute offset.
        offset: u64,
        /// Stored value.
        stored: u64,
        /// Computed value.
        computed: u64,
    },
    /// The batch checksum does not match the header and message checksums.
    BatchChecksum {
        /// The header's base offset.
        base_offset: u64,
        /// Stored value.
        stored: u64,
        /// Computed value.
        computed: u64,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { needed, available } => {
                write!(
                    f,
                    "batch truncated: {needed} bytes needed, {available} present"
                )
            }
            Self::LengthBelowHeader { batch_length } => {
                write!(
                    f,
                    "batch_length {batch_length} is below the 256-byte header"
                )
            }
            Self::LengthAboveMax { batch_length, max } => {
                write!(
                    f,
                    "batch_length {batch_length} exceeds the ceiling of {max} bytes"
                )
            }
            Self::HeaderReservedNonZero { at } => {
                write!(f, "batch header reserved byte {at} is not zero")
            }
            Self::ZeroMessages => f.write_str("batch has a message count of zero"),
            Self::FrameReservedNonZero { message_index } => {
                write!(f, "message {message_index} has nonzero reserved bytes")
            }
            Self::FrameOverrun {
                message_index,
                frame_end,
                batch_length,
            } => write!(
                f,
                "message {message_index} ends at byte {frame_end}, past batch_length {batch_length}"
            ),
            Self::CountMismatch { declared, walked } => write!(
                f,
                "header declares {declared} messages but the frames hold {walked}"
            ),
            Self::FramesDoNotFillLength {
                covered,
                batch_length,
            } => write!(
                f,
                "frames cover {covered} bytes but batch_length is {batch_length}"
            ),
            Self::OffsetDeltaMismatch {
                message_index,
                offset_delta,
            } => write!(
                f,
                "message {message_index} has offset_delta {offset_delta}, expected its index"
            ),
            Self::OffsetOverflow {
                base_offset,
                message_count,
            } => write!(
                f,
                "base_offset {base_offset} plus {message_count} messages overflows u64"
            ),
            Self::TrailingBytes {
                batch_length,
                buffer_len,
            } => write!(
                f,
                "{} bytes trail a batch of {batch_length} bytes",
                buffer_len - batch_length
            ),
            Self::MessageChecksum {
                offset,
                stored,
                computed,
            } => write!(
                f,
                "message at offset {offset}: checksum {stored:#018x} stored, {computed:#018x} computed"
            ),
            Self::BatchChecksum {
                base_offset,
                stored,
                computed,
            } => write!(
                f,
                "batch at base offset {base_offset}: checksum {stored:#018x} stored, {computed:#018x} computed"
            ),
        }
    }
}

impl std::error::Error for BatchError {}

/// How much of a batch to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// Layout and every checksum (bytes from a peer, a client or the disk).
    Verify,
    /// Layout only: header, reserved bytes, frame tiling, counts, deltas.
    LayoutOnly,
}

/// The message frame header at `pos`, if it ends by `end` (and within
/// `bytes`): fields are then read at fixed offsets of an array that holds
/// them.
fn frame_header_at(bytes: &[u8], pos: usize, end: usize) -> Option<&[u8; MESSAGE_HEADER_SIZE]> {
    bytes.get(pos..end)?.first_chunk()
}

/// The decoded fields of a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Partition the batch belongs to (0 as the client sends it).
    pub partition_id: u64,
    /// Offset of the first message.
    pub base_offset: u64,
    /// Broker timestamp (µs), stamped by the primary.
    pub base_timestamp: u64,
    /// The producer's minimum origin timestamp (µs) over the messages.
    pub origin_timestamp: u64,
    /// Whole record length including the header.
    pub batch_length: u64,
    /// The stored batch checksum.
    pub batch_checksum: u64,
    /// Number of messages.
    pub message_count: u32,
}

impl BatchHeader {
    /// Decodes and checks the header alone: at least 256 bytes present,
    /// `256 <= batch_length <= batch_length_max`, reserved bytes zero,
    /// nonzero count, no offset overflow. Does not look at the frames.
    pub fn decode(bytes: &[u8], batch_length_max: u64) -> Result<Self, BatchError> {
        let Some(head) = bytes.first_chunk::<BATCH_HEADER_SIZE>() else {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_SIZE as u64,
                available: bytes.len() as u64,
            });
        };
        let h = Self {
            partition_id: PARTITION_ID.get(head),
            base_offset: BASE_OFFSET.get(head),
            base_timestamp: BASE_TIMESTAMP.get(head),
            origin_timestamp: ORIGIN_TIMESTAMP.get(head),
            batch_length: BATCH_LENGTH.get(head),
            batch_checksum: BATCH_CHECKSUM.get(head),
            message_count: MESSAGE_COUNT.get(head),
        };
        if h.batch_length < BATCH_HEADER_SIZE as u64 {
            return Err(BatchError::LengthBelowHeader {
                batch_length: h.batch_length,
            });
        }
        if h.batch_length > batch_length_max {
            return Err(BatchError::LengthAboveMax {
                batch_length: h.batch_length,
                max: batch_length_max,
            });
        }
        if let Some(i) = head[RESERVED..].iter().position(|&b| b != 0) {
            return Err(BatchError::HeaderReservedNonZero { at: RESERVED + i });
        }
        if h.message_count == 0 {
            return Err(BatchError::ZeroMessages);
        }
        if h.base_offset
            .checked_add(u64::from(h.message_count) - 1)
            .is_none()
        {
            return Err(BatchError::OffsetOverflow {
                base_offset: h.base_offset,
                message_count: h.message_count,
            });
        }
        Ok(h)
    }

    /// Offset of the last message (`base_offset + message_count - 1`; the
    /// decoder has ruled out overflow).
    pub fn last_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count.max(1)) - 1
    }

    /// The offset right after this batch.
    pub fn next_offset(&self) -> u64 {
        self.last_offset() + 1
    }

    /// Streaming hash state seeded with this header's checksummed fields.
    fn checksum_state(&self) -> Xxh3 {
        let mut h = Xxh3::new();
        h.update(&self.partition_id.to_le_bytes());
        h.update(&self.base_offset.to_le_bytes());
        h.update(&self.base_timestamp.to_le_bytes());
        h.update(&self.origin_timestamp.to_le_bytes());
        h.update(&self.batch_length.to_le_bytes());
        h.update(&self.message_count.to_le_bytes());
        h
    }
}

/// Feeds message checksums to the batch checksum's streaming state in
/// blocks of 64 (one `update` call per 512 bytes instead of per 8: the
/// per-call overhead was a measurable share of verifying 1 KiB messages).
struct ChecksumFeed {
    state: Xxh3,
    block: [u8; 512],
    len: usize,
}

impl ChecksumFeed {
    fn new(state: Xxh3) -> Self {
        Self {
            state,
            block: [0; 512],
            len: 0,
        }
    }

    fn push(&mut self, checksum: u64) {
        self.block[self.len..self.len + 8].copy_from_slice(&checksum.to_le_bytes());
        self.len += 8;
        if self.len == self.block.len() {
            self.state.update(&self.block);
            self.len = 0;
        }
    }

    fn digest(mut self) -> u64 {
        self.state.update(&self.block[..self.len]);
        self.state.digest()
    }
}

/// One message of a validated batch, borrowed from the batch bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageView<'a> {
    /// The stored message checksum.
    pub checksum: u64,
    /// The message id.
    pub id: u128,
    /// Index of the message within its batch.
    pub offset_delta: u32,
    /// Microseconds after the batch's `origin_timestamp`.
    pub timestamp_delta: u32,
    /// Absolute offset (`base_offset + offset_delta`).
    pub offset: u64,
    /// The payload bytes.
    pub payload: &'a [u8],
    /// The user-header bytes (TLV, opaque here).
    pub user_headers: &'a [u8],
    /// The whole frame, header included.
    pub frame: &'a [u8],
}

/// A batch that passed validation, borrowing its bytes.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    header: BatchHeader,
    bytes: &'a [u8],
}

/// Walks the frames of `body` (the bytes after the header), calling `f` on
/// each frame's header and whole bytes. Checks tiling, reserved bytes and
/// deltas.
fn walk_frames(
    header: &BatchHeader,
    bytes: &[u8],
    mut f: impl FnMut(u32, &[u8; MESSAGE_HEADER_SIZE], &[u8]) -> Result<(), BatchError>,
) -> Result<(), BatchError> {
    let len = usize::try_from(header.batch_length).unwrap_or(usize::MAX);
    let mut pos = BATCH_HEADER_SIZE;
    let mut index: u64 = 0;
    while pos < len {
        let message_index = u32::try_from(index).unwrap_or(u32::MAX);
        if index >= u64::from(header.message_count) {
            // More bytes than the declared frames cover: either further
            // whole frames (a count mismatch) or bytes no frame explains.
            let extra = count_remaining(bytes, pos, len);
            if extra == 0 {
                return Err(BatchError::FramesDoNotFillLength {
                    covered: pos as u64,
                    batch_length: header.batch_length,
                });
            }
            return Err(BatchError::CountMismatch {
                declared: header.message_count,
                walked: index + extra,
            });
        }
        let header_end = pos + MESSAGE_HEADER_SIZE;
        let Some(fh) = frame_header_at(bytes, pos, len) else {
            return Err(BatchError::FrameOverrun {
                message_index,
                frame_end: header_end as u64,
                batch_length: header.batch_length,
            });
        };
        // The 8 reserved bytes as one word: this runs for every message of
        // every batch validated (a byte-wise scan was 4% of produce in the
        // shard's flame graph, docs/benchmarks.md).
        if MSG_RESERVED.get(fh) != 0 {
            return Err(BatchError::FrameReservedNonZero { message_index });
        }
        let delta = MSG_OFFSET_DELTA.get(fh);
        if u64::from(delta) != index {
            return Err(BatchError::OffsetDeltaMismatch {
                message_index,
                offset_delta: delta,
            });
        }
        let body = u64::from(MSG_PAYLOAD_LEN.get(fh)) + u64::from(MSG_USER_HEADERS_LEN.get(fh));
        let frame_end = header_end as u64 + body;
        if frame_end > header.batch_length {
            return Err(BatchError::FrameOverrun {
                message_index,
                frame_end,
                batch_length: header.batch_length,
            });
        }
        let end = pos + MESSAGE_HEADER_SIZE + body as usize;
        f(message_index, fh, &bytes[pos..end])?;
        pos = end;
        index += 1;
    }
    if index != u64::from(header.message_count) {
        return Err(BatchError::CountMismatch {
            declared: header.message_count,
            walked: index,
        });
    }
    Ok(())
}

/// Frames left from `pos` to `len`, for an error message only (stops at the
/// first frame that does not fit).
fn count_remaining(bytes: &[u8], mut pos: usize, len: usize) -> u64 {
    let mut n = 0;
    while let Some(fh) = frame_header_at(bytes, pos, len) {
        let body = MSG_PAYLOAD_LEN.get(fh) as usize + MSG_USER_HEADERS_LEN.get(fh) as usize;
        pos = pos.saturating_add(MESSAGE_HEADER_SIZE + body);
        if pos > len {
            break;
        }
        n += 1;
    }
    n
}

impl<'a> BatchView<'a> {
    /// Validates the batch at the start of `bytes`, which may continue with
    /// further batches (segment walks step by `batch_length`). Returns the
    /// view of exactly this batch.
    pub fn decode_prefix(
        bytes: &'a [u8],
        integrity: Integrity,
        batch_length_max: u64,
    ) -> Result<Self, BatchError> {
        let header = BatchHeader::decode(bytes, batch_length_max)?;
        if (bytes.len() as u64) < header.batch_length {
            return Err(BatchError::Truncated {
                needed: header.batch_length,
                available: bytes.len() as u64,
            });
        }
        let len = header.batch_length as usize;
        let bytes = &bytes[..len];
        match integrity {
            Integrity::LayoutOnly => walk_frames(&header, bytes, |_, _, _| Ok(()))?,
            Integrity::Verify => {
                let mut state = ChecksumFeed::new(header.checksum_state());
                walk_frames(&header, bytes, |i, fh, frame| {
                    let stored = MSG_CHECKSUM.get(fh);
                    let computed = xxh3_64(&frame[MSG_CHECKSUMMED_FROM..]);
                    if stored != computed {
                        return Err(BatchError::MessageChecksum {
                            offset: header.base_offset + u64::from(i),
                            stored,
                            computed,
                        });
                    }
                    state.push(stored);
                    Ok(())
                })?;
                let computed = state.digest();
                if computed != header.batch_checksum {
                    return Err(BatchError::BatchChecksum {
                        base_offset: header.base_offset,
                        stored: header.batch_checksum,
                        computed,
                    });
                }
            }
        }
        Ok(Self { header, bytes })
    }

    /// Validates a buffer that must hold exactly one batch (a client's
    /// request body, a prepare): trailing bytes are refused.
    pub fn decode_exact(
        bytes: &'a [u8],
        integrity: Integrity,
        batch_length_max: u64,
    ) -> Result<Self, BatchError> {
        let view = Self::decode_prefix(bytes, integrity, batch_length_max)?;
        if view.bytes.len() != bytes.len() {
            return Err(BatchError::TrailingBytes {
                batch_length: view.header.batch_length,
                buffer_len: bytes.len() as u64,
            });
        }
        Ok(view)
    }

    /// The header fields.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Exactly this batch's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The messages, in order, borrowed from the batch bytes.
    pub fn messages(&self) -> Messages<'a> {
        Messages {
            bytes: self.bytes,
            pos: BATCH_HEADER_SIZE,
            base_offset: self.header.base_offset,
        }
    }
}

/// Iterator over a validated batch's messages (see [`BatchView::messages`]).
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    bytes: &'a [u8],
    pos: usize,
    base_offset: u64,
}

impl<'a> Iterator for Messages<'a> {
    type Item = MessageView<'a>;

    fn next(&mut self) -> Option<MessageView<'a>> {
        // The batch was validated, so every frame fits; `get` keeps this
        // panic-free even so.
        let fh = frame_header_at(self.bytes, self.pos, self.bytes.len())?;
        let payload_len = MSG_PAYLOAD_LEN.get(fh) as usize;
        let headers_len = MSG_USER_HEADERS_LEN.get(fh) as usize;
        let body = self.pos + MESSAGE_HEADER_SIZE;
        let end = body + payload_len + headers_len;
        let frame = self.bytes.get(self.pos..end)?;
        let offset_delta = MSG_OFFSET_DELTA.get(fh);
        self.pos = end;
        Some(MessageView {
            checksum: MSG_CHECKSUM.get(fh),
            id: MSG_ID.get(fh),
            offset_delta,
            timestamp_delta: MSG_TIMESTAMP_DELTA.get(fh),
            offset: self.base_offset + u64::from(offset_delta),
            payload: &frame[MESSAGE_HEADER_SIZE..MESSAGE_HEADER_SIZE + payload_len],
            user_headers: &frame[MESSAGE_HEADER_SIZE + payload_len..],
            frame,
        })
    }
}

/// Stamps `partition_id`, `base_offset` and `base_timestamp` into a batch in
/// place and recomputes the batch checksum over the stored message
/// checksums (never re-encoding or re-hashing the messages). The layout is
/// validated first; message checksums are not re-verified here.
pub fn stamp(
    bytes: &mut [u8],
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
    batch_length_max: u64,
) -> Result<BatchHeader, BatchError> {
    let view = BatchView::decode_exact(bytes, Integrity::LayoutOnly, batch_length_max)?;
    let mut header = *view.header();
    if base_offset
        .checked_add(u64::from(header.message_count) - 1)
        .is_none()
    {
        return Err(BatchError::OffsetOverflow {
            base_offset,
            message_count: header.message_count,
        });
    }
    header.partition_id = partition_id;
    header.base_offset = base_offset;
    header.base_timestamp = base_timestamp;
    let mut state = header.checksum_state();
    for m in view.messages() {
        state.update(&m.checksum.to_le_bytes());
    }
    header.batch_checksum = state.digest();
    PARTITION_ID.put(bytes, partition_id);
    BASE_OFFSET.put(bytes, base_offset);
    BASE_TIMESTAMP.put(bytes, base_timestamp);
    BATCH_CHECKSUM.put(bytes, header.batch_checksum);
    Ok(header)
}

/// Encodes batches the way the `iggy` 0.11.0 client does (partition id,
/// base offset and base timestamp zero, checksums computed), for tests and
/// tools. Use [`stamp`] afterwards to place it in a partition.
#[derive(Debug, Clone, Default)]
pub struct BatchBuilder {
    origin_timestamp: u64,
    frames: Vec<u8>,
    count: u32,
}

impl BatchBuilder {
    /// A batch whose messages' origin timestamps are measured from
    /// `origin_timestamp` (µs).
    pub fn new(origin_timestamp: u64) -> Self {
        Self {
            origin_timestamp,
            ..Self::default()
        }
    }

    /// Appends a message; its `offset_delta` is its index.
    pub fn push(
        &mut self,
        id: u128,
        timestamp_delta: u32,
        payload: &[u8],
        user_headers: &[u8],
    ) -> &mut Self {
        let start = self.frames.len();
        self.frames.resize(start + MESSAGE_HEADER_SIZE, 0);
        let fh = &mut self.frames[start..];
        MSG_ID.put(fh, id);
        MSG_OFFSET_DELTA.put(fh, self.count);
        MSG_TIMESTAMP_DELTA.put(fh, timestamp_delta);
        MSG_USER_HEADERS_LEN.put(fh, user_headers.len() as u32);
        MSG_PAYLOAD_LEN.put(fh, payload.len() as u32);
        self.frames.extend_from_slice(payload);
        self.frames.extend_from_slice(user_headers);
        let checksum = xxh3_64(&self.frames[start + MSG_CHECKSUMMED_FROM..]);
        MSG_CHECKSUM.put(&mut self.frames[start..], checksum);
        self.count += 1;
        self
    }

    /// Number of messages pushed.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// True when no message was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded batch, as a client would send it.
    pub fn build(&self) -> Vec<u8> {
        let batch_length = (BATCH_HEADER_SIZE + self.frames.len()) as u64;
        let header = BatchHeader {
            partition_id: 0,
            base_offset: 0,
            base_timestamp: 0,
            origin_timestamp: self.origin_timestamp,
            batch_length,
            batch_checksum: 0,
            message_count: self.count,
        };
        let mut state = header.checksum_state();
        let mut pos = 0;
        // Every pushed frame is whole, so this walks them all.
        while let Some(fh) = frame_header_at(&self.frames, pos, self.frames.len()) {
            state.update(&fh[MSG_CHECKSUM.range()]);
            let body = MSG_PAYLOAD_LEN.get(fh) as usize + MSG_USER_HEADERS_LEN.get(fh) as usize;
            pos += MESSAGE_HEADER_SIZE + body;
        }
        let mut out = Vec::with_capacity(batch_length as usize);
        out.resize(BATCH_HEADER_SIZE, 0);
        ORIGIN_TIMESTAMP.put(&mut out, self.origin_timestamp);
        BATCH_LENGTH.put(&mut out, batch_length);
        BATCH_CHECKSUM.put(&mut out, state.digest());
        MESSAGE_COUNT.put(&mut out, self.count);
        out.extend_from_slice(&self.frames);
        out
    }

    /// The encoded batch, stamped for a partition at `base_offset`.
    pub fn build_stamped(
        &self,
        partition_id: u64,
        base_offset: u64,
        base_timestamp: u64,
    ) -> Result<Vec<u8>, BatchError> {
        let mut out = self.build();
        stamp(
            &mut out,
            partition_id,
            base_offset,
            base_timestamp,
            u64::MAX,
        )?;
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MAX: u64 = BATCH_LENGTH_MAX_DEFAULT;

    fn sample() -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        b.push(1, 0, b"hello", b"");
        b.push(2, 5, b"world!", b"\x01\x02");
        b.push(3, 9, b"", b"");
        b.build()
    }

    #[test]
    fn given_built_batch_when_decoded_should_round_trip_fields_and_messages() {
        let bytes = sample();
        let view = BatchView::decode_exact(&bytes, Integrity::Verify, MAX).unwrap();
        let h = view.header();
        assert_eq!(h.message_count, 3);
        assert_eq!(h.origin_timestamp, 1_000);
        assert_eq!(h.batch_length, bytes.len() as u64);
        let msgs: Vec<_> = view.messages().collect();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[1].payload, b"world!");
        assert_eq!(msgs[1].user_headers, b"\x01\x02");
        assert_eq!(msgs[1].id, 2);
        assert_eq!(msgs[1].timestamp_delta, 5);
        assert_eq!(msgs[2].offset, 2);
    }

    #[test]
    fn given_stamped_batch_when_decoded_should_verify_with_new_offsets() {
        let mut bytes = sample();
        let h = stamp(&mut bytes, 7, 100, 555, MAX).unwrap();
        assert_eq!(h.last_offset(), 102);
        let view = BatchView::decode_exact(&bytes, Integrity::Verify, MAX).unwrap();
        assert_eq!(view.header().base_offset, 100);
        assert_eq!(view.header().partition_id, 7);
        assert_eq!(view.header().base_timestamp, 555);
        assert_eq!(
            view.messages().map(|m| m.offset).collect::<Vec<_>>(),
            vec![100, 101, 102]
        );
    }

    #[test]
    fn given_every_strict_prefix_when_decoded_should_reject() {
        let bytes = sample();
        for n in 0..bytes.len() {
            assert!(
                BatchView::decode_exact(&bytes[..n], Integrity::Verify, MAX).is_err(),
                "prefix {n}"
            );
        }
    }

    #[test]
    fn given_every_single_bit_flip_when_decoded_should_reject() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                let r = BatchView::decode_exact(&b, Integrity::Verify, MAX);
                // Flipping bits of the stamped-by-server fields changes the
                // batch checksum input, so even those are caught.
                assert!(r.is_err(), "flip byte {i} bit {bit} accepted");
            }
        }
    }

    #[test]
    fn given_trailing_bytes_when_decoded_exact_should_reject_but_prefix_accepts() {
        let mut bytes = sample();
        bytes.push(0);
        assert!(matches!(
            BatchView::decode_exact(&bytes, Integrity::Verify, MAX),
            Err(BatchError::TrailingBytes { .. })
        ));
        assert!(BatchView::decode_prefix(&bytes, Integrity::Verify, MAX).is_ok());
    }

    #[test]
    fn given_length_below_header_when_decoded_should_reject() {
        let mut bytes = sample();
        BATCH_LENGTH.put(&mut bytes, 255);
        assert_eq!(
            BatchHeader::decode(&bytes, MAX),
            Err(BatchError::LengthBelowHeader { batch_length: 255 })
        );
    }

    #[test]
    fn given_length_above_ceiling_when_decoded_should_reject_before_reading_body() {
        let mut bytes = sample();
        BATCH_LENGTH.put(&mut bytes, u64::MAX);
        assert!(matches!(
            BatchView::decode_prefix(&bytes, Integrity::Verify, MAX),
            Err(BatchError::LengthAboveMax { .. })
        ));
    }

    #[test]
    fn given_nonzero_reserved_when_decoded_should_reject() {
        let mut bytes = sample();
        bytes[200] = 1;
        assert_eq!(
            BatchHeader::decode(&bytes, MAX),
            Err(BatchError::HeaderReservedNonZero { at: 200 })
        );
        // Every one of the frame's 8 reserved bytes, and the top bit.
        for (at, value) in (0..8).map(|i| (i, 1)).chain([(7, 0x80)]) {
            let mut bytes = sample();
            bytes[BATCH_HEADER_SIZE + MSG_RESERVED.start() + at] = value;
            assert_eq!(
                BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX).unwrap_err(),
                BatchError::FrameReservedNonZero { message_index: 0 },
                "reserved byte {at}"
            );
        }
    }

    #[test]
    fn given_zero_count_when_decoded_should_reject() {
        let mut bytes = sample();
        MESSAGE_COUNT.put(&mut bytes, 0);
        assert_eq!(
            BatchHeader::decode(&bytes, MAX),
            Err(BatchError::ZeroMessages)
        );
    }

    #[test]
    fn given_count_mismatch_when_decoded_should_reject() {
        for declared in [2u32, 4] {
            let mut bytes = sample();
            MESSAGE_COUNT.put(&mut bytes, declared);
            assert_eq!(
                BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX).unwrap_err(),
                BatchError::CountMismatch {
                    declared,
                    walked: 3
                }
            );
        }
    }

    #[test]
    fn given_frames_not_filling_length_when_decoded_should_reject() {
        // Declared length one byte longer than the frames: the last "frame"
        // cannot fit its header.
        let mut bytes = sample();
        let len = bytes.len() as u64 + 1;
        bytes.push(0);
        BATCH_LENGTH.put(&mut bytes, len);
        assert_eq!(
            BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX).unwrap_err(),
            BatchError::FramesDoNotFillLength {
                covered: len - 1,
                batch_length: len
            }
        );
        // A length one byte short of the frames: the last frame overruns.
        let mut bytes = sample();
        let len = bytes.len() as u64 - 1;
        bytes.pop();
        BATCH_LENGTH.put(&mut bytes, len);
        assert!(matches!(
            BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX),
            Err(BatchError::FrameOverrun {
                message_index: 2,
                ..
            })
        ));
    }

    #[test]
    fn given_offset_overflow_when_decoded_or_stamped_should_reject() {
        let mut bytes = sample();
        assert!(matches!(
            stamp(&mut bytes, 0, u64::MAX - 1, 0, MAX),
            Err(BatchError::OffsetOverflow { .. })
        ));
        BASE_OFFSET.put(&mut bytes, u64::MAX);
        assert!(matches!(
            BatchHeader::decode(&bytes, MAX),
            Err(BatchError::OffsetOverflow { .. })
        ));
        // The last representable placement is fine.
        let mut bytes = sample();
        assert!(stamp(&mut bytes, 0, u64::MAX - 2, 0, MAX).is_ok());
    }

    #[test]
    fn given_corrupt_payload_when_verified_should_name_message_offset() {
        let mut bytes = sample();
        stamp(&mut bytes, 0, 40, 0, MAX).unwrap();
        let at = bytes.len() - 1 - 48; // inside message 1's body region
        bytes[at] ^= 0x10;
        match BatchView::decode_exact(&bytes, Integrity::Verify, MAX) {
            Err(BatchError::MessageChecksum { offset, .. }) => assert!((40..43).contains(&offset)),
            other => panic!("unexpected {other:?}"),
        }
        // Layout-only decoding does not hash, so it accepts the same bytes.
        assert!(BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX).is_ok());
    }

    #[test]
    fn given_wrong_offset_delta_when_decoded_should_reject() {
        let mut bytes = sample();
        MSG_OFFSET_DELTA.put(&mut bytes[BATCH_HEADER_SIZE..], 9);
        assert_eq!(
            BatchView::decode_exact(&bytes, Integrity::LayoutOnly, MAX).unwrap_err(),
            BatchError::OffsetDeltaMismatch {
                message_index: 0,
                offset_delta: 9
            }
        );
    }

    #[test]
    fn given_known_client_bytes_when_checksummed_should_match_streaming_rule() {
        // Recompute the batch checksum by the documented rule, from scratch,
        // to pin the feed order (header fields, then message checksums).
        let bytes = sample();
        let view = BatchView::decode_exact(&bytes, Integrity::Verify, MAX).unwrap();
        let mut feed = Vec::new();
        for at in [
            PARTITION_ID,
            BASE_OFFSET,
            BASE_TIMESTAMP,
            ORIGIN_TIMESTAMP,
            BATCH_LENGTH,
        ] {
            feed.extend_from_slice(&bytes[at.range()]);
        }
        feed.extend_from_slice(&bytes[MESSAGE_COUNT.range()]);
        for m in view.messages() {
            feed.extend_from_slice(&m.checksum.to_le_bytes());
            assert_eq!(m.checksum, xxh3_64(&m.frame[8..]));
        }
        assert_eq!(xxh3_64(&feed), view.header().batch_checksum);
    }
}
