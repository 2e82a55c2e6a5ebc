//! The building blocks request and reply payloads share (client_protocol.md
//! §5): names, identifiers, consumers, partitioning, polling strategies,
//! the optional partition, ack levels and options blocks. Each decodes
//! through [`Reader`], which names the field in every error, and fails
//! closed: a value outside its range is an error, never a default.

use super::error::{NameField, PayloadError};
use common::le_cursor::LeCursor;
use common::{ConsumerKind, Offset, PartitionId};

/// The most bytes a name (and a string identifier) may have.
pub const NAME_LEN_MAX: usize = 255;

/// A forward-only reader over a request body that names the field in every
/// error.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    cursor: LeCursor<'a>,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `body`.
    pub const fn new(body: &'a [u8]) -> Self {
        Self {
            cursor: LeCursor::new(body),
        }
    }

    /// The bytes not read yet.
    pub const fn remaining(&self) -> &'a [u8] {
        self.cursor.remaining()
    }

    /// Consumes everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.cursor.remaining();
        self.cursor = LeCursor::new(&[]);
        rest
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), PayloadError> {
        match self.remaining().len() {
            0 => Ok(()),
            len => Err(PayloadError::TrailingBytes { len }),
        }
    }

    /// `n` raw bytes.
    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], PayloadError> {
        self.cursor
            .take(n)
            .map_err(|_| PayloadError::Truncated { field })
    }

    /// One byte.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, PayloadError> {
        self.cursor
            .u8()
            .map_err(|_| PayloadError::Truncated { field })
    }

    /// A little-endian u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, PayloadError> {
        self.cursor
            .u32()
            .map_err(|_| PayloadError::Truncated { field })
    }

    /// A little-endian u64.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, PayloadError> {
        self.cursor
            .u64()
            .map_err(|_| PayloadError::Truncated { field })
    }

    /// A 0/1 flag.
    pub fn flag(&mut self, field: &'static str) -> Result<bool, PayloadError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(PayloadError::InvalidFlag { field, value }),
        }
    }

    /// UTF-8 text of `len` bytes.
    pub fn text(&mut self, len: usize, field: &'static str) -> Result<&'a str, PayloadError> {
        let bytes = self.bytes(len, field)?;
        std::str::from_utf8(bytes).map_err(|_| PayloadError::InvalidUtf8 { field })
    }
}

/// A name: 1..=255 bytes of UTF-8 (stream, topic, group, user names and the
/// login strings). On the wire, a u8 length then the bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(String);

impl Name {
    /// A name, if `text` is 1..=255 bytes long.
    pub fn new(text: impl Into<String>) -> Option<Self> {
        let text = text.into();
        (1..=NAME_LEN_MAX)
            .contains(&text.len())
            .then_some(Self(text))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Decodes a u8-length-prefixed name.
    pub fn decode(
        r: &mut Reader<'_>,
        kind: NameField,
        field: &'static str,
    ) -> Result<Self, PayloadError> {
        let len = usize::from(r.u8(field)?);
        if len == 0 {
            return Err(PayloadError::InvalidName { field: kind, len });
        }
        Ok(Self(r.text(len, field)?.to_owned()))
    }

    /// Appends the u8 length and the bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        // The constructor bounds the length to 255.
        out.push(self.0.len() as u8);
        out.extend_from_slice(self.0.as_bytes());
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const IDENTIFIER_NUMERIC: u8 = 1;
const IDENTIFIER_STRING: u8 = 2;

/// A stream, topic, group or consumer named by number or by name. On the
/// wire: u8 kind (1 numeric, 2 string), u8 length, value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identifier {
    /// A server-assigned numeric id.
    Numeric(u32),
    /// A name.
    Name(Name),
}

impl Identifier {
    /// Decodes an identifier.
    pub fn decode(r: &mut Reader<'_>, field: &'static str) -> Result<Self, PayloadError> {
        let kind = r.u8(field)?;
        let len = r.u8(field)?;
        match kind {
            IDENTIFIER_NUMERIC if len == 4 => Ok(Self::Numeric(r.u32(field)?)),
            IDENTIFIER_STRING if len > 0 => {
                let text = r.text(usize::from(len), field)?;
                Ok(Self::Name(Name(text.to_owned())))
            }
            IDENTIFIER_NUMERIC | IDENTIFIER_STRING => {
                Err(PayloadError::InvalidIdentifier { field, kind, len })
            }
            kind => Err(PayloadError::UnknownKind { field, kind }),
        }
    }

    /// Appends the identifier.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Numeric(id) => {
                out.extend_from_slice(&[IDENTIFIER_NUMERIC, 4]);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Self::Name(name) => {
                out.push(IDENTIFIER_STRING);
                name.encode(out);
            }
        }
    }
}

impl std::fmt::Display for Identifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Numeric(id) => write!(f, "#{id}"),
            Self::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// Who reads: a lone consumer or a consumer group. On the wire: u8 kind
/// (1 consumer, 2 group), then an identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Consumer {
    /// Lone consumer or group.
    pub kind: ConsumerKind,
    /// Its id.
    pub id: Identifier,
}

impl Consumer {
    /// Decodes a consumer.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        let field = "consumer";
        let kind = match r.u8(field)? {
            1 => ConsumerKind::Consumer,
            2 => ConsumerKind::ConsumerGroup,
            kind => return Err(PayloadError::UnknownKind { field, kind }),
        };
        Ok(Self {
            kind,
            id: Identifier::decode(r, field)?,
        })
    }
}

/// Where a send goes. The 0.11 Rust SDK always sends [`Self::PartitionId`]
/// (it resolves the others itself); other SDKs may send any of the three.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Partitioning {
    /// The server picks (round robin).
    Balanced,
    /// This partition.
    PartitionId(PartitionId),
    /// The partition the key hashes to.
    MessagesKey(Vec<u8>),
}

impl Partitioning {
    /// Decodes u8 kind, u8 length, value.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        let field = "partitioning";
        let kind = r.u8(field)?;
        let len = r.u8(field)?;
        match (kind, len) {
            (1, 0) => Ok(Self::Balanced),
            (2, 4) => Ok(Self::PartitionId(PartitionId(r.u32(field)?))),
            (3, 1..) => Ok(Self::MessagesKey(
                r.bytes(usize::from(len), field)?.to_vec(),
            )),
            (1..=3, len) => Err(PayloadError::InvalidIdentifier { field, kind, len }),
            (kind, _) => Err(PayloadError::UnknownKind { field, kind }),
        }
    }
}

/// Where a poll starts (u8 kind, u64 value; 9 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PollingStrategy {
    /// At this offset.
    Offset(Offset),
    /// At the first message whose timestamp is at or after this (µs).
    Timestamp(u64),
    /// At the earliest retained offset.
    First,
    /// The last `count` messages.
    Last,
    /// After the consumer's stored offset (or at the first).
    Next,
}

impl PollingStrategy {
    /// Decodes a strategy. The value of first/last/next is ignored (the SDK
    /// sends 0).
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        let field = "polling strategy";
        let kind = r.u8(field)?;
        let value = r.u64(field)?;
        Ok(match kind {
            1 => Self::Offset(Offset(value)),
            2 => Self::Timestamp(value),
            3 => Self::First,
            4 => Self::Last,
            5 => Self::Next,
            kind => return Err(PayloadError::UnknownKind { field, kind }),
        })
    }
}

/// Decodes the optional partition: a u8 presence flag and a u32 that is
/// always present (0 when the flag is 0).
pub fn decode_optional_partition(r: &mut Reader<'_>) -> Result<Option<PartitionId>, PayloadError> {
    let present = r.flag("partition flag")?;
    let id = r.u32("partition id")?;
    Ok(present.then_some(PartitionId(id)))
}

/// How durable an offset write must be before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckLevel {
    /// Acknowledge at once.
    NoAck,
    /// Acknowledge once a quorum has it (what the SDK always sends).
    Quorum,
}

impl AckLevel {
    /// Decodes the ack byte.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, PayloadError> {
        let field = "ack level";
        match r.u8(field)? {
            0 => Ok(Self::NoAck),
            1 => Ok(Self::Quorum),
            kind => Err(PayloadError::UnknownKind { field, kind }),
        }
    }
}

/// The most key-value pairs an options block may hold.
pub const OPTIONS_MAX: usize = 1024;
/// The most bytes an options block may take.
pub const OPTIONS_BYTES_MAX: usize = 100_000;
const OPTION_FIELD_LEN_MAX: u32 = 255;
const OPTION_KIND_STRING: u8 = 2;

/// One option: a string key and a typed value (the user-header kinds,
/// 1..=15; the bytes are kept as sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionEntry {
    /// The key.
    pub key: String,
    /// The value's kind byte.
    pub value_kind: u8,
    /// The value's bytes.
    pub value: Vec<u8>,
}

/// An options block (create/update stream and topic). Requests carry it to
/// the end of the body; replies prefix it with a u32 byte length.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// The pairs, in wire order; keys are unique.
    pub entries: Vec<OptionEntry>,
}

impl Options {
    /// Decodes a request's options block: all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, PayloadError> {
        if bytes.len() > OPTIONS_BYTES_MAX {
            return Err(PayloadError::InvalidOptions {
                reason: "more than 100000 bytes",
            });
        }
        let mut r = Reader::new(bytes);
        let mut entries: Vec<OptionEntry> = Vec::new();
        while !r.remaining().is_empty() {
            if entries.len() == OPTIONS_MAX {
                return Err(PayloadError::InvalidOptions {
                    reason: "more than 1024 pairs",
                });
            }
            let (key_kind, key) = option_field(&mut r)?;
            if r.remaining().is_empty() {
                return Err(PayloadError::InvalidOptions {
                    reason: "a key without a value",
                });
            }
            let (value_kind, value) = option_field(&mut r)?;
            if key_kind != OPTION_KIND_STRING {
                return Err(PayloadError::InvalidOptions {
                    reason: "a key is not a string",
                });
            }
            let key = std::str::from_utf8(key).map_err(|_| PayloadError::InvalidUtf8 {
                field: "option key",
            })?;
            if entries.iter().any(|e| e.key == key) {
                return Err(PayloadError::InvalidOptions {
                    reason: "a key appears twice",
                });
            }
            entries.push(OptionEntry {
                key: key.to_owned(),
                value_kind,
                value: value.to_vec(),
            });
        }
        Ok(Self { entries })
    }

    /// Appends the block as a reply carries it: u32 byte length, then the
    /// pairs (an empty block is just `u32 0`, client_protocol.md §12.3 #4).
    pub fn encode_prefixed(&self, out: &mut Vec<u8>) {
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        for e in &self.entries {
            out.push(OPTION_KIND_STRING);
            out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
            out.extend_from_slice(e.key.as_bytes());
            out.push(e.value_kind);
            out.extend_from_slice(&(e.value.len() as u32).to_le_bytes());
            out.extend_from_slice(&e.value);
        }
        let len = (out.len() - len_at - 4) as u32;
        out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

fn option_field<'a>(r: &mut Reader<'a>) -> Result<(u8, &'a [u8]), PayloadError> {
    let field = "option";
    let kind = r.u8(field)?;
    if !(1..=15).contains(&kind) {
        return Err(PayloadError::UnknownKind { field, kind });
    }
    let len = r.u32(field)?;
    if len == 0 || len > OPTION_FIELD_LEN_MAX {
        return Err(PayloadError::InvalidOptions {
            reason: "a field is not 1..=255 bytes",
        });
    }
    Ok((kind, r.bytes(len as usize, field)?))
}
