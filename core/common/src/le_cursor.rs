//! Little-endian decoding for every replog codec: [`LeCursor`], a
//! forward-only reader for formats laid out field after field,
//! [`u16_at`]…[`u128_at`], readers at fixed offsets of a fixed-size record,
//! and [`LeField`], one field of a fixed-format record declared once for
//! its encoder and its decoder both.
//!
//! The cursor never panics on short input: each read returns [`Truncated`]
//! instead, and [`LeCursor::remaining`] lets a codec insist that nothing is
//! left over. The fixed-offset readers take an array, not a slice, so the
//! length check happens once, where the caller turns its bytes into an
//! array (`first_chunk`, `try_into`); after that only a wrong offset
//! constant can make them panic, never the bytes read.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

/// Fewer bytes remained than a read asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("input ended before the field being read")
    }
}

impl std::error::Error for Truncated {}

/// A forward-only cursor over little-endian encoded bytes.
#[derive(Debug, Clone)]
pub struct LeCursor<'a> {
    bytes: &'a [u8],
}

impl<'a> LeCursor<'a> {
    /// A cursor at the start of `bytes`.
    pub const fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// The bytes not yet consumed.
    pub const fn remaining(&self) -> &'a [u8] {
        self.bytes
    }

    /// Consumes and returns the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if n > self.bytes.len() {
            return Err(Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.array().map(u16::from_le_bytes)
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.array().map(u32::from_le_bytes)
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.array().map(u64::from_le_bytes)
    }

    /// Reads a little-endian `u128`.
    pub fn u128(&mut self) -> Result<u128, Truncated> {
        self.array().map(u128::from_le_bytes)
    }
}

/// The `W` bytes at `at` of `record`.
///
/// # Panics
/// If `at + W` passes the end of the record: a wrong offset constant.
fn bytes_at<const W: usize, const N: usize>(record: &[u8; N], at: usize) -> [u8; W] {
    let mut out = [0u8; W];
    out.copy_from_slice(&record[at..at + W]);
    out
}

/// The little-endian `u16` at byte `at` of a fixed-size record.
///
/// # Panics
/// If the field passes the end of the record (a wrong offset constant).
pub fn u16_at<const N: usize>(record: &[u8; N], at: usize) -> u16 {
    u16::from_le_bytes(bytes_at(record, at))
}

/// The little-endian `u32` at byte `at` of a fixed-size record.
///
/// # Panics
/// If the field passes the end of the record (a wrong offset constant).
pub fn u32_at<const N: usize>(record: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(record, at))
}

/// The little-endian `u64` at byte `at` of a fixed-size record.
///
/// # Panics
/// If the field passes the end of the record (a wrong offset constant).
pub fn u64_at<const N: usize>(record: &[u8; N], at: usize) -> u64 {
    u64::from_le_bytes(bytes_at(record, at))
}

/// The little-endian `u128` at byte `at` of a fixed-size record.
///
/// # Panics
/// If the field passes the end of the record (a wrong offset constant).
pub fn u128_at<const N: usize>(record: &[u8; N], at: usize) -> u128 {
    u128::from_le_bytes(bytes_at(record, at))
}

/// An integer a fixed-format record may hold: `u8`, or a little-endian
/// `u16`…`u128`.
pub trait LeInt: Copy + sealed::Sealed {
    /// Bytes the integer takes.
    const WIDTH: usize;

    /// Reads the integer at byte `at` of a fixed-size record.
    ///
    /// # Panics
    /// If the field passes the end of the record (a wrong offset constant).
    fn read_at<const N: usize>(record: &[u8; N], at: usize) -> Self;

    /// Writes the integer at byte `at` of `record`.
    ///
    /// # Panics
    /// If the field passes the end of `record`.
    fn write_at(self, record: &mut [u8], at: usize);
}

mod sealed {
    /// Keeps [`super::LeInt`] to the integers this module implements it for.
    pub trait Sealed {}
}

impl sealed::Sealed for u8 {}

impl LeInt for u8 {
    const WIDTH: usize = 1;

    fn read_at<const N: usize>(record: &[u8; N], at: usize) -> Self {
        record[at]
    }

    fn write_at(self, record: &mut [u8], at: usize) {
        record[at] = self;
    }
}

macro_rules! le_int {
    ($($ty:ty => $read:ident),+) => {$(
        impl sealed::Sealed for $ty {}

        impl LeInt for $ty {
            const WIDTH: usize = std::mem::size_of::<$ty>();

            fn read_at<const N: usize>(record: &[u8; N], at: usize) -> Self {
                $read(record, at)
            }

            fn write_at(self, record: &mut [u8], at: usize) {
                record[at..at + Self::WIDTH].copy_from_slice(&self.to_le_bytes());
            }
        }
    )+};
}

le_int!(u16 => u16_at, u32 => u32_at, u64 => u64_at, u128 => u128_at);

/// One field of a fixed-format record: a [`LeInt`] at a fixed byte offset.
///
/// A format declares each field once, as a constant, and its encoder and
/// its decoder both go through that constant, so the two cannot disagree on
/// where a field sits or how wide it is. The read takes an array, as
/// [`u64_at`] does, because its bytes may come from a peer or the disk; the
/// write takes a slice, because an encoder writes into a buffer it sized
/// itself.
#[derive(Debug)]
pub struct LeField<T> {
    at: usize,
    ty: PhantomData<fn() -> T>,
}

// By hand: a derive would ask `T: Clone`, which a `PhantomData` never needs.
impl<T> Clone for LeField<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for LeField<T> {}

impl<T: LeInt> LeField<T> {
    /// The field whose first byte is `at`.
    pub const fn at(at: usize) -> Self {
        Self {
            at,
            ty: PhantomData,
        }
    }

    /// Its first byte.
    pub const fn start(self) -> usize {
        self.at
    }

    /// The byte after its last.
    pub const fn end(self) -> usize {
        self.at + T::WIDTH
    }

    /// The bytes it covers.
    pub const fn range(self) -> Range<usize> {
        self.start()..self.end()
    }

    /// Reads the field from a fixed-size record.
    ///
    /// # Panics
    /// If the field passes the end of the record (a wrong offset constant).
    pub fn get<const N: usize>(self, record: &[u8; N]) -> T {
        T::read_at(record, self.at)
    }

    /// Writes `value` into the field of `record`.
    ///
    /// # Panics
    /// If the field passes the end of `record`: a wrong offset constant, or
    /// a buffer the encoder sized too short.
    pub fn put(self, record: &mut [u8], value: T) {
        value.write_at(record, self.at);
    }
}

/// Whether `fields`, in order, cover the bytes `0..len` exactly: the first
/// starts at 0, each starts where the one before it ended, and the last ends
/// at `len`. A fixed format asserts this of its fields and reserved ranges
/// in a constant, so an offset typed wrong (two fields over one byte, or a
/// byte that belongs to nothing) fails the build.
pub const fn tiles(len: usize, fields: &[Range<usize>]) -> bool {
    let mut at = 0;
    let mut i = 0;
    while i < fields.len() {
        if fields[i].start != at || fields[i].end < fields[i].start {
            return false;
        }
        at = fields[i].end;
        i += 1;
    }
    at == len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_le_bytes_when_read_should_decode_each_width() {
        let mut bytes = vec![0xAB];
        bytes.extend_from_slice(&0x1234u16.to_le_bytes());
        bytes.extend_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&(u128::MAX - 7).to_le_bytes());
        bytes.extend_from_slice(b"tail");
        let mut c = LeCursor::new(&bytes);
        assert_eq!(c.u8(), Ok(0xAB));
        assert_eq!(c.u16(), Ok(0x1234));
        assert_eq!(c.u32(), Ok(0xDEAD_BEEF));
        assert_eq!(c.u64(), Ok(u64::MAX));
        assert_eq!(c.u128(), Ok(u128::MAX - 7));
        assert_eq!(c.remaining(), b"tail");
        assert_eq!(c.take(4), Ok(&b"tail"[..]));
        assert_eq!(c.u8(), Err(Truncated));
    }

    #[test]
    fn given_short_input_when_read_should_truncate_without_consuming() {
        let bytes = [1u8, 2, 3];
        let mut c = LeCursor::new(&bytes);
        assert_eq!(c.u32(), Err(Truncated));
        assert_eq!(c.remaining(), &bytes);
        assert_eq!(c.take(4), Err(Truncated));
        assert_eq!(c.take(usize::MAX), Err(Truncated));
    }

    #[test]
    fn given_a_fixed_record_when_read_at_offsets_should_match_the_cursor() {
        let mut record = [0u8; 31];
        record[1..3].copy_from_slice(&0xBEEFu16.to_le_bytes());
        record[3..7].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        record[7..15].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        record[15..31].copy_from_slice(&(u128::MAX / 3).to_le_bytes());
        assert_eq!(u16_at(&record, 1), 0xBEEF);
        assert_eq!(u32_at(&record, 3), 0x0102_0304);
        assert_eq!(u64_at(&record, 7), u64::MAX - 1);
        assert_eq!(u128_at(&record, 15), u128::MAX / 3);
        let mut c = LeCursor::new(&record[1..]);
        assert_eq!(c.u16(), Ok(0xBEEF));
        assert_eq!(c.u32(), Ok(0x0102_0304));
        assert_eq!(c.u64(), Ok(u64::MAX - 1));
        assert_eq!(c.u128(), Ok(u128::MAX / 3));
    }

    #[test]
    #[should_panic]
    fn given_an_offset_past_the_record_when_read_should_panic() {
        let record = [0u8; 8];
        let _ = u64_at(&record, 1);
    }

    #[test]
    fn given_declared_fields_when_written_and_read_should_land_where_declared() {
        const FLAG: LeField<u8> = LeField::at(0);
        const ID: LeField<u32> = LeField::at(4);
        const SUM: LeField<u128> = LeField::at(8);
        assert_eq!((FLAG.range(), ID.range(), SUM.range()), (0..1, 4..8, 8..24));
        let mut record = [0u8; 24];
        FLAG.put(&mut record, 0xA5);
        ID.put(&mut record, 0x0102_0304);
        SUM.put(&mut record, u128::MAX - 1);
        assert_eq!(record[0], 0xA5);
        assert_eq!(record[1..4], [0, 0, 0]);
        assert_eq!(record[4..8], 0x0102_0304u32.to_le_bytes());
        assert_eq!(record[8..24], (u128::MAX - 1).to_le_bytes());
        assert_eq!(FLAG.get(&record), 0xA5);
        assert_eq!(ID.get(&record), 0x0102_0304);
        assert_eq!(SUM.get(&record), u128::MAX - 1);
    }

    #[test]
    #[should_panic]
    fn given_a_buffer_too_short_for_a_field_when_written_should_panic() {
        LeField::<u64>::at(4).put(&mut [0u8; 8], 1);
    }

    #[test]
    fn given_ranges_when_checked_for_tiling_should_refuse_gaps_overlaps_and_short_ends() {
        assert!(tiles(8, &[0..1, 1..4, 4..8]));
        assert!(tiles(0, &[]));
        assert!(!tiles(8, &[0..1, 2..8]), "a gap");
        assert!(!tiles(8, &[0..4, 3..8]), "an overlap");
        assert!(!tiles(8, &[0..4, 4..6]), "short of the end");
        assert!(!tiles(8, &[1..4, 4..8]), "not from 0");
    }
}
