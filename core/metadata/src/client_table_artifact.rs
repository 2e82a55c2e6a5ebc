//! The client table as a metadata state-transfer artifact (kind
//! `CLIENT_TABLE`), so a replica installed from a snapshot still
//! recognises a request the group already committed instead of executing
//! it a second time (layout in docs/formats.md §13.5).
//!
//! `[magic "RMC1"][count u32][count × 52-byte watermark][xxh3-64 trailer]`:
//! trailer first, then the count against its ceiling and the bytes
//! present, clients strictly ascending and never 0, no trailing bytes.

use common::Op;
use std::fmt;

use common::le_cursor::LeCursor;
use consensus::DedupWatermark;
use consensus::{push_trailer, split_verified_trailer};

/// `"RMC1"` as a little-endian u32.
pub const CLIENT_TABLE_MAGIC: u32 = u32::from_le_bytes(*b"RMC1");
/// The most entries an artifact may hold.
pub const CLIENT_TABLE_ENTRIES_MAX: u32 = 65_536;
const ENTRY_LEN: usize = 16 + 4 + 8 + 8 + 16;

/// Why bytes are not a client-table artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTableDecodeError {
    /// Shorter than the trailer, or cut inside a field.
    Truncated,
    /// The trailer does not match the content.
    ChecksumMismatch,
    /// Not a client-table artifact.
    BadMagic(u32),
    /// More entries than the ceiling.
    TooManyEntries(u32),
    /// Clients not strictly ascending (a duplicate or another order).
    NotAscending,
    /// Client id 0 is reserved.
    ReservedClient,
    /// Bytes after the last entry.
    TrailingBytes(usize),
}

impl fmt::Display for ClientTableDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("client-table artifact truncated"),
            Self::ChecksumMismatch => f.write_str("client-table artifact checksum mismatch"),
            Self::BadMagic(m) => write!(f, "not a client-table artifact (magic {m:#x})"),
            Self::TooManyEntries(n) => write!(
                f,
                "{n} client-table entries, above {CLIENT_TABLE_ENTRIES_MAX}"
            ),
            Self::NotAscending => f.write_str("client-table clients are not strictly ascending"),
            Self::ReservedClient => f.write_str("client-table artifact names client 0"),
            Self::TrailingBytes(n) => write!(f, "{n} bytes follow the client table"),
        }
    }
}

impl std::error::Error for ClientTableDecodeError {}

/// Encodes watermarks (sorted by client, as `ClientTable::export` gives
/// them).
pub fn encode_client_table(entries: &[DedupWatermark]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + entries.len() * ENTRY_LEN + 8);
    out.extend_from_slice(&CLIENT_TABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for w in entries {
        out.extend_from_slice(&w.client.to_le_bytes());
        out.extend_from_slice(&w.user_id.to_le_bytes());
        out.extend_from_slice(&w.watermark.to_le_bytes());
        out.extend_from_slice(&w.latest_commit.0.to_le_bytes());
        out.extend_from_slice(&w.committed_window.to_le_bytes());
    }
    push_trailer(&mut out);
    out
}

/// Decodes a client-table artifact.
pub fn decode_client_table(bytes: &[u8]) -> Result<Vec<DedupWatermark>, ClientTableDecodeError> {
    let content = split_verified_trailer(bytes).map_err(|e| match e {
        None => ClientTableDecodeError::Truncated,
        Some(_) => ClientTableDecodeError::ChecksumMismatch,
    })?;
    let t = |_| ClientTableDecodeError::Truncated;
    let mut c = LeCursor::new(content);
    let magic = c.u32().map_err(t)?;
    if magic != CLIENT_TABLE_MAGIC {
        return Err(ClientTableDecodeError::BadMagic(magic));
    }
    let count = c.u32().map_err(t)?;
    if count > CLIENT_TABLE_ENTRIES_MAX {
        return Err(ClientTableDecodeError::TooManyEntries(count));
    }
    if (count as usize).saturating_mul(ENTRY_LEN) > c.remaining().len() {
        return Err(ClientTableDecodeError::Truncated);
    }
    let mut out: Vec<DedupWatermark> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let w = DedupWatermark {
            client: c.u128().map_err(t)?,
            user_id: c.u32().map_err(t)?,
            watermark: c.u64().map_err(t)?,
            latest_commit: Op(c.u64().map_err(t)?),
            committed_window: c.u128().map_err(t)?,
        };
        if w.client == 0 {
            return Err(ClientTableDecodeError::ReservedClient);
        }
        if out.last().is_some_and(|l| l.client >= w.client) {
            return Err(ClientTableDecodeError::NotAscending);
        }
        out.push(w);
    }
    if !c.remaining().is_empty() {
        return Err(ClientTableDecodeError::TrailingBytes(c.remaining().len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<DedupWatermark> {
        (1..=3u128)
            .map(|c| DedupWatermark {
                client: c,
                user_id: c as u32,
                watermark: 10 * c as u64,
                latest_commit: Op(100 + c as u64),
                committed_window: 0b1011,
            })
            .collect()
    }

    #[test]
    fn given_watermarks_when_encoded_should_round_trip_and_refuse_every_prefix_and_bit_flip() {
        let bytes = encode_client_table(&entries());
        assert_eq!(decode_client_table(&bytes), Ok(entries()));
        for len in 0..bytes.len() {
            assert!(decode_client_table(&bytes[..len]).is_err());
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_client_table(&b).is_err());
        }
    }

    fn sealed(mut content: Vec<u8>) -> Vec<u8> {
        push_trailer(&mut content);
        content
    }

    #[test]
    fn given_structural_damage_with_a_valid_trailer_should_refuse_with_each_own_error() {
        let mut c = encode_client_table(&entries());
        c.truncate(c.len() - 8);
        let patch = |at: usize, with: &[u8]| {
            let mut b = c.clone();
            b[at..at + with.len()].copy_from_slice(with);
            decode_client_table(&sealed(b))
        };
        assert_eq!(
            patch(0, b"XXXX"),
            Err(ClientTableDecodeError::BadMagic(u32::from_le_bytes(
                *b"XXXX"
            )))
        );
        assert_eq!(
            patch(4, &70_000u32.to_le_bytes()),
            Err(ClientTableDecodeError::TooManyEntries(70_000))
        );
        assert_eq!(
            patch(4, &9u32.to_le_bytes()),
            Err(ClientTableDecodeError::Truncated)
        );
        assert_eq!(
            patch(8, &0u128.to_le_bytes()),
            Err(ClientTableDecodeError::ReservedClient)
        );
        assert_eq!(
            patch(8 + ENTRY_LEN, &1u128.to_le_bytes()),
            Err(ClientTableDecodeError::NotAscending)
        );
        assert_eq!(
            patch(4, &2u32.to_le_bytes()),
            Err(ClientTableDecodeError::TrailingBytes(ENTRY_LEN))
        );
        assert_eq!(decode_client_table(&encode_client_table(&[])), Ok(vec![]));
    }
}
