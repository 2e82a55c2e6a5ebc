//! A forward-only little-endian reader over a byte slice, and the xxh3-64
//! trailer check that the manifest and the transfer artifacts end with.
//!
//! Every wire and disk decoder in replog reads through [`LeCursor`]: it
//! never panics on short input (each read returns [`Truncated`] instead),
//! and [`LeCursor::remaining`] lets a codec insist that nothing is left over.

use crate::hashing::state_artifact_checksum;
use std::fmt;

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

/// Length of the xxh3-64 trailer that closes a checksummed encoding.
pub const TRAILER_LEN: usize = 8;

/// Splits the trailing little-endian xxh3-64 off `bytes`, checks it against
/// every byte before it, and returns that content.
///
/// The two failures are distinct: `Err(None)` means the input is shorter
/// than the trailer itself (codecs report it as truncated), and
/// `Err(Some((expected, actual)))` means the stored trailer `expected`
/// differs from the checksum `actual` of the content.
pub fn split_verified_trailer(bytes: &[u8]) -> Result<&[u8], Option<(u64, u64)>> {
    let Some(content_len) = bytes.len().checked_sub(TRAILER_LEN) else {
        return Err(None);
    };
    let (content, trailer) = bytes.split_at(content_len);
    let mut stored = [0u8; TRAILER_LEN];
    stored.copy_from_slice(trailer);
    let expected = u64::from_le_bytes(stored);
    let actual = state_artifact_checksum(content);
    if expected != actual {
        return Err(Some((expected, actual)));
    }
    Ok(content)
}

/// Appends the xxh3-64 trailer over everything already in `out`.
pub fn push_trailer(out: &mut Vec<u8>) {
    let checksum = state_artifact_checksum(out);
    out.extend_from_slice(&checksum.to_le_bytes());
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
    fn given_valid_trailer_when_split_should_return_content() {
        let mut bytes = b"manifest body".to_vec();
        push_trailer(&mut bytes);
        assert_eq!(split_verified_trailer(&bytes), Ok(&b"manifest body"[..]));
    }

    #[test]
    fn given_empty_content_with_trailer_when_split_should_return_empty() {
        let mut bytes = Vec::new();
        push_trailer(&mut bytes);
        assert_eq!(split_verified_trailer(&bytes), Ok(&[][..]));
    }

    #[test]
    fn given_fewer_than_eight_bytes_when_split_should_report_too_short() {
        for len in 0..TRAILER_LEN {
            let bytes = vec![0u8; len];
            assert_eq!(split_verified_trailer(&bytes), Err(None));
        }
    }

    #[test]
    fn given_any_flipped_bit_when_split_should_report_mismatch() {
        let mut bytes = b"abc".to_vec();
        push_trailer(&mut bytes);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let stored = u64::from_le_bytes(flipped[3..].try_into().expect("8 bytes"));
            let actual = state_artifact_checksum(&flipped[..3]);
            assert_eq!(
                split_verified_trailer(&flipped),
                Err(Some((stored, actual)))
            );
        }
    }
}
