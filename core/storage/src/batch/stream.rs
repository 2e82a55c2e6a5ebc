//! Incremental validation of one batch whose bytes arrive in pieces (a
//! segment artifact pulled chunk by chunk, SPEC §7 ST-B2).
//!
//! [`BatchStream`] runs the checks of [`BatchView::decode_prefix`] in the
//! same order, with the same errors, but holds at most a header's worth of
//! the batch instead of all of it. That is possible because nothing in a
//! batch needs more than a header at once: the batch checksum is a
//! streaming xxh3-64 over the header fields and then each message's stored
//! checksum, and a message checksum is an xxh3-64 of its frame from byte 8,
//! which a streaming state takes piece by piece. Only the 256-byte batch
//! header and then each 48-byte frame header must be whole before their
//! fields can be read, so those are the only bytes carried across pieces.
//!
//! Errors are reported as soon as the bytes seen prove them, in the order
//! the whole-batch decoder checks: a complete batch gets exactly the error
//! (or the header) [`BatchView::decode_prefix`] gives it, however it is
//! split. A batch that never completes may fail earlier than the whole
//! decoder could (which would say `Truncated`), never later.
//!
//! [`BatchView::decode_prefix`]: super::BatchView::decode_prefix

use std::fmt;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::{
    BATCH_HEADER_SIZE, BatchError, BatchHeader, ChecksumFeed, Integrity, MESSAGE_HEADER_SIZE,
    MSG_CHECKSUM, MSG_CHECKSUMMED_FROM, MSG_OFFSET_DELTA, MSG_PAYLOAD_LEN, MSG_RESERVED,
    MSG_USER_HEADERS_LEN,
};

/// Validates one batch fed in pieces; see the module documentation.
pub struct BatchStream {
    integrity: Integrity,
    batch_length_max: u64,
    /// Bytes of the batch taken so far (batch-relative position).
    consumed_bytes: u64,
    /// A header not yet whole: the batch header, then a frame header.
    held: [u8; BATCH_HEADER_SIZE],
    held_len: usize,
    stage: Stage,
}

/// Where a [`BatchStream`] is in its batch.
enum Stage {
    /// Gathering the batch header.
    Header,
    /// Walking the frames (boxed: two hash states, about 2 KiB).
    Frames(Box<Frames>),
    /// Every check passed.
    Complete(BatchHeader),
    /// A check failed; the stream takes nothing more.
    Failed(BatchError),
}

/// The frame walk of a batch whose header passed.
struct Frames {
    header: BatchHeader,
    /// Messages walked so far (the next one's index).
    index: u64,
    at: FrameAt,
    /// The batch checksum's running state (header fields, then the stored
    /// message checksums).
    batch: ChecksumFeed,
    /// The running checksum of the message whose body is arriving.
    message: Xxh3,
}

/// Where the frame walk is.
#[derive(Clone, Copy)]
enum FrameAt {
    /// At the start of a frame (or the end of the batch).
    Start,
    /// Inside a declared message's body, which ends at `frame_end`.
    Body {
        message_index: u32,
        stored: u64,
        frame_end: u64,
    },
    /// Past the declared count with bytes left: walking the further frames
    /// only to name the error, as the whole decoder's `count_remaining`
    /// does. `covered` is where the declared frames ended, `extra` the
    /// whole frames found after them.
    Extra { covered: u64, extra: u64 },
    /// Skipping the body of an extra frame, which ends at `frame_end`.
    ExtraBody {
        covered: u64,
        extra: u64,
        frame_end: u64,
    },
}

/// What a step of the frame walk reached.
enum Walked {
    /// The bytes ran out first.
    NeedMore,
    /// Every frame is walked; the batch checks remain.
    End,
}

impl fmt::Debug for BatchStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match &self.stage {
            Stage::Header => "header",
            Stage::Frames(_) => "frames",
            Stage::Complete(_) => "complete",
            Stage::Failed(_) => "failed",
        };
        f.debug_struct("BatchStream")
            .field("integrity", &self.integrity)
            .field("consumed_bytes", &self.consumed_bytes)
            .field("held_bytes", &self.held_len)
            .field("stage", &stage)
            .field("header", &self.header())
            .finish()
    }
}

/// The next `n` bytes of `rest`, or fewer if it ends first; counted in
/// `consumed`.
fn take<'a>(rest: &mut &'a [u8], n: u64, consumed: &mut u64) -> &'a [u8] {
    let n = usize::try_from(n).unwrap_or(usize::MAX).min(rest.len());
    let (piece, tail) = rest.split_at(n);
    *rest = tail;
    *consumed += n as u64;
    piece
}

impl BatchStream {
    /// A stream for one batch, checking `integrity`, refusing a declared
    /// length above `batch_length_max` before its first body byte.
    pub fn new(integrity: Integrity, batch_length_max: u64) -> Self {
        Self {
            integrity,
            batch_length_max,
            consumed_bytes: 0,
            held: [0; BATCH_HEADER_SIZE],
            held_len: 0,
            stage: Stage::Header,
        }
    }

    /// Takes the batch's next bytes, in order, and returns how many it
    /// consumed: all of `bytes` unless the batch ended inside them (the
    /// rest belongs to whatever follows the batch). See
    /// [`Self::complete`] for whether it ended.
    ///
    /// # Errors
    /// The first [`BatchError`] the bytes so far prove, as
    /// [`super::BatchView::decode_prefix`] would name it on the whole
    /// batch. After an error the stream is spent: every later call returns
    /// the same error.
    pub fn push(&mut self, bytes: &[u8]) -> Result<usize, BatchError> {
        let mut rest = bytes;
        match self.advance(&mut rest) {
            Ok(()) => Ok(bytes.len() - rest.len()),
            Err(error) => {
                self.stage = Stage::Failed(error.clone());
                Err(error)
            }
        }
    }

    /// The batch's header once every byte of it arrived and every check
    /// passed.
    pub fn complete(&self) -> Option<&BatchHeader> {
        match &self.stage {
            Stage::Complete(header) => Some(header),
            _ => None,
        }
    }

    /// The batch header once its 256 bytes arrived and passed (length
    /// within the ceiling, reserved bytes, count, offsets).
    pub fn header(&self) -> Option<&BatchHeader> {
        match &self.stage {
            Stage::Frames(frames) => Some(&frames.header),
            Stage::Complete(header) => Some(header),
            Stage::Header | Stage::Failed(_) => None,
        }
    }

    /// Bytes of the batch consumed so far.
    pub const fn consumed_bytes(&self) -> u64 {
        self.consumed_bytes
    }

    /// Bytes held back because a header is not yet whole: at most
    /// [`BATCH_HEADER_SIZE`] while the batch header arrives, then at most
    /// [`MESSAGE_HEADER_SIZE`]. (The hash states are a fixed ~2 KiB
    /// besides, whatever the batch length.)
    pub const fn held_bytes(&self) -> usize {
        self.held_len
    }

    fn advance(&mut self, rest: &mut &[u8]) -> Result<(), BatchError> {
        loop {
            match &mut self.stage {
                Stage::Complete(_) => return Ok(()),
                Stage::Failed(error) => return Err(error.clone()),
                Stage::Header => {
                    let want = (BATCH_HEADER_SIZE - self.held_len) as u64;
                    let piece = take(rest, want, &mut self.consumed_bytes);
                    self.held[self.held_len..self.held_len + piece.len()].copy_from_slice(piece);
                    self.held_len += piece.len();
                    if self.held_len < BATCH_HEADER_SIZE {
                        return Ok(());
                    }
                    // The ceiling is checked here, before a single body byte
                    // is taken; nothing is sized by the length anyway.
                    let header = BatchHeader::decode(&self.held, self.batch_length_max)?;
                    self.held_len = 0;
                    self.stage = Stage::Frames(Box::new(Frames {
                        header,
                        index: 0,
                        at: FrameAt::Start,
                        batch: ChecksumFeed::new(header.checksum_state()),
                        message: Xxh3::new(),
                    }));
                }
                Stage::Frames(frames) => {
                    let walked = frames.walk(
                        rest,
                        self.integrity,
                        &mut self.held,
                        &mut self.held_len,
                        &mut self.consumed_bytes,
                    )?;
                    match walked {
                        Walked::NeedMore => return Ok(()),
                        Walked::End => {
                            let header = frames.end(self.integrity)?;
                            self.stage = Stage::Complete(header);
                        }
                    }
                }
            }
        }
    }
}

impl Frames {
    /// Walks the frames in `rest` as `walk_frames` does on a whole batch,
    /// until the bytes run out or the last frame ends.
    fn walk(
        &mut self,
        rest: &mut &[u8],
        integrity: Integrity,
        held: &mut [u8; BATCH_HEADER_SIZE],
        held_len: &mut usize,
        consumed: &mut u64,
    ) -> Result<Walked, BatchError> {
        let len = self.header.batch_length;
        loop {
            match self.at {
                FrameAt::Start => {
                    // Where this frame starts: part of its header may be
                    // held from an earlier piece.
                    let pos = *consumed - *held_len as u64;
                    if pos >= len {
                        return Ok(Walked::End);
                    }
                    if self.index >= u64::from(self.header.message_count) {
                        self.at = FrameAt::Extra {
                            covered: pos,
                            extra: 0,
                        };
                        continue;
                    }
                    // Lossless: below message_count, a u32.
                    let message_index = u32::try_from(self.index).unwrap_or(u32::MAX);
                    let header_end = pos.saturating_add(MESSAGE_HEADER_SIZE as u64);
                    if header_end > len {
                        return Err(BatchError::FrameOverrun {
                            message_index,
                            frame_end: header_end,
                            batch_length: len,
                        });
                    }
                    // A frame wholly in `rest` is checked in place, hashed
                    // in one call (the common case: frames are small next
                    // to a chunk).
                    let whole = *rest;
                    let Some(fh) = frame_header(rest, held, held_len, consumed) else {
                        return Ok(Walked::NeedMore);
                    };
                    if MSG_RESERVED.get(&fh) != 0 {
                        return Err(BatchError::FrameReservedNonZero { message_index });
                    }
                    let delta = MSG_OFFSET_DELTA.get(&fh);
                    if u64::from(delta) != self.index {
                        return Err(BatchError::OffsetDeltaMismatch {
                            message_index,
                            offset_delta: delta,
                        });
                    }
                    let body = body_len(&fh);
                    let frame_end = header_end + body;
                    if frame_end > len {
                        return Err(BatchError::FrameOverrun {
                            message_index,
                            frame_end,
                            batch_length: len,
                        });
                    }
                    let stored = MSG_CHECKSUM.get(&fh);
                    let frame_len = MESSAGE_HEADER_SIZE as u64 + body;
                    let in_place = whole.len() as u64 >= frame_len
                        && whole.len() - rest.len() == MESSAGE_HEADER_SIZE;
                    if in_place {
                        // Lossless: no longer than `whole`.
                        let frame = &whole[..frame_len as usize];
                        take(rest, body, consumed);
                        if integrity == Integrity::Verify {
                            self.message_checked(
                                message_index,
                                stored,
                                xxh3_64(&frame[MSG_CHECKSUMMED_FROM..]),
                            )?;
                        }
                        self.index += 1;
                        continue;
                    }
                    if integrity == Integrity::Verify {
                        self.message.reset();
                        self.message.update(&fh[MSG_CHECKSUMMED_FROM..]);
                    }
                    self.at = FrameAt::Body {
                        message_index,
                        stored,
                        frame_end,
                    };
                }
                FrameAt::Body {
                    message_index,
                    stored,
                    frame_end,
                } => {
                    let piece = take(rest, frame_end.saturating_sub(*consumed), consumed);
                    if integrity == Integrity::Verify {
                        self.message.update(piece);
                    }
                    if *consumed < frame_end {
                        return Ok(Walked::NeedMore);
                    }
                    if integrity == Integrity::Verify {
                        self.message_checked(message_index, stored, self.message.digest())?;
                    }
                    self.index += 1;
                    self.at = FrameAt::Start;
                }
                FrameAt::Extra { covered, extra } => {
                    let pos = *consumed - *held_len as u64;
                    if pos.saturating_add(MESSAGE_HEADER_SIZE as u64) > len {
                        return Err(self.count_error(covered, extra));
                    }
                    let Some(fh) = frame_header(rest, held, held_len, consumed) else {
                        return Ok(Walked::NeedMore);
                    };
                    let frame_end = pos + MESSAGE_HEADER_SIZE as u64 + body_len(&fh);
                    if frame_end > len {
                        return Err(self.count_error(covered, extra));
                    }
                    self.at = FrameAt::ExtraBody {
                        covered,
                        extra: extra + 1,
                        frame_end,
                    };
                }
                FrameAt::ExtraBody {
                    covered,
                    extra,
                    frame_end,
                } => {
                    take(rest, frame_end.saturating_sub(*consumed), consumed);
                    if *consumed < frame_end {
                        return Ok(Walked::NeedMore);
                    }
                    self.at = FrameAt::Extra { covered, extra };
                }
            }
        }
    }

    /// A whole message's checksum against its stored one; fed to the batch
    /// checksum when they match.
    fn message_checked(
        &mut self,
        message_index: u32,
        stored: u64,
        computed: u64,
    ) -> Result<(), BatchError> {
        if stored != computed {
            return Err(BatchError::MessageChecksum {
                offset: self.header.base_offset + u64::from(message_index),
                stored,
                computed,
            });
        }
        self.batch.push(stored);
        Ok(())
    }

    /// The error for bytes past the declared frames: further whole frames
    /// are a count mismatch, anything else bytes no frame explains.
    fn count_error(&self, covered: u64, extra: u64) -> BatchError {
        if extra == 0 {
            BatchError::FramesDoNotFillLength {
                covered,
                batch_length: self.header.batch_length,
            }
        } else {
            BatchError::CountMismatch {
                declared: self.header.message_count,
                walked: self.index + extra,
            }
        }
    }

    /// The checks after the last frame: the count, then the batch checksum.
    fn end(&mut self, integrity: Integrity) -> Result<BatchHeader, BatchError> {
        let header = self.header;
        if self.index != u64::from(header.message_count) {
            return Err(BatchError::CountMismatch {
                declared: header.message_count,
                walked: self.index,
            });
        }
        if integrity == Integrity::Verify {
            let batch = std::mem::replace(&mut self.batch, ChecksumFeed::new(Xxh3::new()));
            let computed = batch.digest();
            if computed != header.batch_checksum {
                return Err(BatchError::BatchChecksum {
                    base_offset: header.base_offset,
                    stored: header.batch_checksum,
                    computed,
                });
            }
        }
        Ok(header)
    }
}

/// A frame's body length (payload plus user headers), at most 2 × u32::MAX.
fn body_len(fh: &[u8; MESSAGE_HEADER_SIZE]) -> u64 {
    u64::from(MSG_PAYLOAD_LEN.get(fh)) + u64::from(MSG_USER_HEADERS_LEN.get(fh))
}

/// The next frame header: straight from `rest` when nothing is held and it
/// is there whole, else gathered in `held` (`None` until whole). Consumed
/// either way.
fn frame_header(
    rest: &mut &[u8],
    held: &mut [u8; BATCH_HEADER_SIZE],
    held_len: &mut usize,
    consumed: &mut u64,
) -> Option<[u8; MESSAGE_HEADER_SIZE]> {
    let want = (MESSAGE_HEADER_SIZE - *held_len) as u64;
    let piece = take(rest, want, consumed);
    held[*held_len..*held_len + piece.len()].copy_from_slice(piece);
    *held_len += piece.len();
    if *held_len < MESSAGE_HEADER_SIZE {
        return None;
    }
    *held_len = 0;
    let mut fh = [0u8; MESSAGE_HEADER_SIZE];
    fh.copy_from_slice(&held[..MESSAGE_HEADER_SIZE]);
    Some(fh)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::super::{
        BATCH_CHECKSUM, BATCH_LENGTH, BATCH_LENGTH_MAX_DEFAULT, BatchBuilder, BatchView,
        MESSAGE_COUNT, stamp,
    };
    use super::*;

    const MAX: u64 = BATCH_LENGTH_MAX_DEFAULT;

    /// Messages of the given payload sizes (every third with user headers),
    /// stamped at offset 40.
    fn batch_of(sizes: &[usize]) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        for (i, &size) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
            let headers: &[u8] = if i % 3 == 2 { b"\x01\x02\x03" } else { b"" };
            b.push(i as u128 + 1, i as u32, &payload, headers);
        }
        let mut bytes = b.build();
        stamp(&mut bytes, 7, 40, 555, MAX).unwrap();
        bytes
    }

    fn sample() -> Vec<u8> {
        batch_of(&[5, 0, 300, 47, 48, 49, 1, 700])
    }

    /// The stream's verdict on `bytes` fed in pieces ending at `cuts`
    /// (then the rest), in the whole decoder's terms: a batch that never
    /// completes is `Truncated`.
    fn streamed(
        bytes: &[u8],
        cuts: impl IntoIterator<Item = usize>,
        integrity: Integrity,
    ) -> Result<BatchHeader, BatchError> {
        let mut s = BatchStream::new(integrity, MAX);
        let mut at = 0;
        for end in cuts.into_iter().chain([bytes.len()]) {
            let end = end.clamp(at, bytes.len());
            let offered = end - at;
            let taken = s.push(&bytes[at..end])?;
            assert!(s.held_bytes() <= BATCH_HEADER_SIZE);
            if s.header().is_some() {
                assert!(s.held_bytes() < MESSAGE_HEADER_SIZE);
            }
            at += taken;
            if let Some(h) = s.complete() {
                assert_eq!(s.consumed_bytes(), h.batch_length);
                assert_eq!(at as u64, h.batch_length);
                assert_eq!(s.held_bytes(), 0);
                return Ok(*h);
            }
            assert_eq!(taken, offered, "an incomplete stream takes every byte");
        }
        Err(match s.header() {
            Some(h) => BatchError::Truncated {
                needed: h.batch_length,
                available: bytes.len() as u64,
            },
            None => BatchError::Truncated {
                needed: BATCH_HEADER_SIZE as u64,
                available: bytes.len() as u64,
            },
        })
    }

    fn whole(bytes: &[u8], integrity: Integrity) -> Result<BatchHeader, BatchError> {
        BatchView::decode_prefix(bytes, integrity, MAX).map(|v| *v.header())
    }

    /// Asserts the stream agrees with the whole decoder on `bytes` cut at
    /// `cuts`. Where the declared length runs past the bytes (the whole
    /// decoder says `Truncated`), the stream may already have failed, and
    /// then with the error the whole decoder gives once the batch is
    /// complete (checked with zero padding up to the declared length).
    fn assert_agrees(bytes: &[u8], cuts: &[usize], integrity: Integrity) {
        let want = whole(bytes, integrity);
        let got = streamed(bytes, cuts.iter().copied(), integrity);
        let Err(BatchError::Truncated { needed, .. }) = want else {
            assert_eq!(got, want, "cuts {cuts:?} {integrity:?}");
            return;
        };
        if got == want {
            return;
        }
        assert!(got.is_err(), "cuts {cuts:?} {integrity:?}: {got:?}");
        if needed <= bytes.len() as u64 + 65_536 {
            let mut padded = bytes.to_vec();
            padded.resize(needed as usize, 0);
            let want = whole(&padded, integrity);
            assert_eq!(got, want, "cuts {cuts:?} {integrity:?} (padded)");
            assert_eq!(
                streamed(&padded, cuts.iter().copied(), integrity),
                want,
                "cuts {cuts:?} {integrity:?} (padded)"
            );
        }
    }

    #[test]
    fn given_batch_split_at_every_byte_when_streamed_should_match_whole_decode() {
        let bytes = sample();
        let want = whole(&bytes, Integrity::Verify).unwrap();
        for cut in 0..=bytes.len() {
            assert_eq!(
                streamed(&bytes, [cut], Integrity::Verify),
                Ok(want),
                "cut {cut}"
            );
        }
        // Two cuts at every pair of positions in and around the header and
        // the first frames.
        for a in 0..400 {
            for b in (a..420).step_by(7) {
                assert_eq!(streamed(&bytes, [a, b], Integrity::Verify), Ok(want));
            }
        }
        // One byte at a time.
        assert_eq!(
            streamed(&bytes, 1..bytes.len(), Integrity::Verify),
            Ok(want)
        );
    }

    #[test]
    fn given_every_strict_prefix_when_streamed_should_not_complete() {
        let bytes = sample();
        for n in 0..bytes.len() {
            assert!(
                matches!(
                    streamed(&bytes[..n], [n / 2], Integrity::Verify),
                    Err(BatchError::Truncated { .. })
                ),
                "prefix {n}"
            );
        }
    }

    #[test]
    fn given_every_single_bit_flip_when_streamed_in_pieces_should_fail_as_whole() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                for integrity in [Integrity::Verify, Integrity::LayoutOnly] {
                    let want = whole(&b, integrity);
                    if integrity == Integrity::Verify {
                        assert!(want.is_err(), "flip {i}.{bit}");
                    }
                    for cuts in [vec![], vec![i], vec![i + 1], vec![100, 260, 300, 333]] {
                        assert_agrees(&b, &cuts, integrity);
                    }
                }
            }
        }
    }

    #[test]
    fn given_forged_layouts_when_streamed_should_name_the_same_error() {
        let base = sample();
        let mut cases = Vec::new();
        // Declared counts below and above the frames.
        for count in [1u32, 7, 9, 200] {
            let mut b = base.clone();
            MESSAGE_COUNT.put(&mut b, count);
            cases.push(b);
        }
        // A declared length a byte past the frames, and a byte short.
        let mut b = base.clone();
        b.push(0);
        let len = b.len() as u64;
        BATCH_LENGTH.put(&mut b, len);
        cases.push(b);
        let mut b = base.clone();
        b.pop();
        let len = b.len() as u64;
        BATCH_LENGTH.put(&mut b, len);
        cases.push(b);
        // Length at the header alone.
        let mut b = base[..BATCH_HEADER_SIZE].to_vec();
        BATCH_LENGTH.put(&mut b, BATCH_HEADER_SIZE as u64);
        cases.push(b);
        // A checksum field off by one.
        let mut b = base.clone();
        b[BATCH_CHECKSUM.start()] ^= 1;
        cases.push(b);
        for (n, bytes) in cases.iter().enumerate() {
            for integrity in [Integrity::Verify, Integrity::LayoutOnly] {
                let want = whole(bytes, integrity);
                // (Layout-only decoding ignores the checksum field.)
                assert!(
                    want.is_err() || integrity == Integrity::LayoutOnly,
                    "case {n}"
                );
                for cut in 0..=bytes.len() {
                    assert_agrees(bytes, &[cut], integrity);
                }
            }
        }
    }

    #[test]
    fn given_length_above_ceiling_when_streamed_should_refuse_at_the_header() {
        let mut bytes = sample();
        BATCH_LENGTH.put(&mut bytes, MAX + 1);
        let mut s = BatchStream::new(Integrity::Verify, MAX);
        assert_eq!(s.push(&bytes[..200]), Ok(200));
        assert_eq!(s.held_bytes(), 200);
        let refused = Err(BatchError::LengthAboveMax {
            batch_length: MAX + 1,
            max: MAX,
        });
        assert_eq!(s.push(&bytes[200..]), refused);
        // Not one body byte was taken, and the stream stays spent.
        assert_eq!(s.consumed_bytes(), BATCH_HEADER_SIZE as u64);
        assert_eq!(s.push(&bytes[..1]), refused);
        assert!(s.complete().is_none());
    }

    #[test]
    fn given_bytes_past_the_batch_when_streamed_should_take_only_the_batch() {
        let bytes = sample();
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        let mut s = BatchStream::new(Integrity::Verify, MAX);
        assert_eq!(s.push(&two[..100]), Ok(100));
        assert_eq!(s.push(&two[100..]), Ok(bytes.len() - 100));
        assert!(s.complete().is_some());
        // A complete stream takes nothing more.
        assert_eq!(s.push(&two[bytes.len()..]), Ok(0));
    }

    fn batch_strategy() -> impl Strategy<Value = Vec<usize>> {
        proptest::collection::vec(prop_oneof![0usize..4, 40usize..60, 200usize..2_000], 1..12)
    }

    proptest! {
        #[test]
        fn given_random_batch_and_splits_when_streamed_should_match_whole_decode(
            sizes in batch_strategy(),
            cuts in proptest::collection::vec(0usize..20_000, 0..30),
            flip in proptest::option::of((0usize..20_000, 0u8..8)),
        ) {
            let mut bytes = batch_of(&sizes);
            if let Some((at, bit)) = flip {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            for integrity in [Integrity::Verify, Integrity::LayoutOnly] {
                assert_agrees(&bytes, &cuts, integrity);
            }
        }
    }
}
