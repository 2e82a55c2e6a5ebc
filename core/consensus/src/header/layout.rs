//! Header layouts: each header declares its fields and their byte offsets
//! once, with [`header_layout!`], and its read, its write and its reserved
//! bytes all come from that one declaration, so an offset cannot be typed
//! twice and disagree.
//!
//! A layout covers an area: the common prefix (bytes 0..128) or a command's
//! tail (128..256). Every byte of the area that no field covers is reserved
//! and must be zero (docs/formats.md §4.4: "unlisted bytes are reserved").
//! A decode checks the reserved bytes first, lowest offset first, then the
//! flag bytes, and only then reads the fields; the command's own rules run
//! after that.
//!
//! A layout is checked as the compiler evaluates it: a field past its area,
//! or two fields over the same byte, fail the build.

use super::{Command, HEADER_SIZE, HeaderError};
use common::le_cursor::{u16_at, u32_at, u64_at, u128_at};
use std::ops::Range;

/// A whole header's bytes.
pub(super) type Bytes = [u8; HEADER_SIZE];

/// The command-specific area every command's layout covers.
pub(super) const TAIL: Range<usize> = 128..HEADER_SIZE;

/// The reason a flag byte other than 0 or 1 is refused with, unless the
/// header names its own.
const BAD_FLAG: &str = "a flag byte must be 0 or 1";

/// A type a header field may have: a little-endian integer, or a flag
/// stored as one byte that must be 0 or 1.
pub(super) trait Field: Copy {
    /// Bytes the field takes.
    const WIDTH: usize;
    /// Whether the byte is a flag (0 or 1; anything else is refused before
    /// any field is read).
    const FLAG: bool = false;
    /// Reads the field at `at`. A flag reads as `true` for any nonzero
    /// byte: the decode has refused anything but 0 and 1 before.
    fn get(b: &Bytes, at: usize) -> Self;
    /// Writes the field at `at`.
    fn put(self, b: &mut Bytes, at: usize);
}

impl Field for u8 {
    const WIDTH: usize = 1;
    fn get(b: &Bytes, at: usize) -> Self {
        b[at]
    }
    fn put(self, b: &mut Bytes, at: usize) {
        b[at] = self;
    }
}

impl Field for bool {
    const WIDTH: usize = 1;
    const FLAG: bool = true;
    fn get(b: &Bytes, at: usize) -> Self {
        b[at] != 0
    }
    fn put(self, b: &mut Bytes, at: usize) {
        b[at] = u8::from(self);
    }
}

macro_rules! le_field {
    ($($ty:ty => $read:ident),+) => {$(
        impl Field for $ty {
            const WIDTH: usize = std::mem::size_of::<$ty>();
            fn get(b: &Bytes, at: usize) -> Self {
                $read(b, at)
            }
            fn put(self, b: &mut Bytes, at: usize) {
                b[at..at + Self::WIDTH].copy_from_slice(&self.to_le_bytes());
            }
        }
    )+};
}

le_field!(u16 => u16_at, u32 => u32_at, u64 => u64_at, u128 => u128_at);

/// The identifiers the headers carry are their number on the wire.
macro_rules! newtype_field {
    ($($ty:ident($inner:ty)),+) => {$(
        impl Field for common::$ty {
            const WIDTH: usize = <$inner as Field>::WIDTH;
            fn get(b: &Bytes, at: usize) -> Self {
                Self(<$inner as Field>::get(b, at))
            }
            fn put(self, b: &mut Bytes, at: usize) {
                self.0.put(b, at);
            }
        }
    )+};
}

newtype_field!(Op(u64), GroupId(u64), ReplicaId(u8));

/// One declared field: where it sits and what it is.
#[derive(Debug, Clone, Copy)]
pub(super) struct FieldAt {
    /// Its first byte.
    pub(super) at: usize,
    /// Its width in bytes.
    pub(super) width: usize,
    /// Whether it is a flag byte.
    pub(super) flag: bool,
}

/// A header's declared fields over its area.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// The bytes the layout accounts for.
    pub(super) area: Range<usize>,
    /// The fields, in declaration order.
    pub(super) fields: &'static [FieldAt],
}

impl Layout {
    /// Which bytes are reserved: those of the area no field covers.
    ///
    /// # Panics
    /// At compile time, when the layout is evaluated: if a field leaves the
    /// area or two fields overlap.
    pub(super) const fn reserved(&self) -> [bool; HEADER_SIZE] {
        assert!(self.area.start <= self.area.end && self.area.end <= HEADER_SIZE);
        let mut map = [false; HEADER_SIZE];
        let mut at = self.area.start;
        while at < self.area.end {
            map[at] = true;
            at += 1;
        }
        let mut i = 0;
        while i < self.fields.len() {
            let field = self.fields[i];
            assert!(field.width > 0, "a field has no bytes");
            assert!(
                self.area.start <= field.at && field.at + field.width <= self.area.end,
                "a field leaves its header's area"
            );
            let mut at = field.at;
            while at < field.at + field.width {
                assert!(map[at], "two fields overlap");
                map[at] = false;
                at += 1;
            }
            i += 1;
        }
        map
    }

    /// Fails on the first nonzero reserved byte, lowest offset first.
    pub(super) fn check_reserved(
        &self,
        b: &Bytes,
        reserved: &[bool; HEADER_SIZE],
    ) -> Result<(), HeaderError> {
        let area = self.area.clone();
        match b[area.clone()]
            .iter()
            .zip(&reserved[area.clone()])
            .position(|(&byte, &reserved)| reserved && byte != 0)
        {
            None => Ok(()),
            Some(i) => Err(HeaderError::NonzeroReserved {
                offset: area.start + i,
            }),
        }
    }

    /// Whether some flag byte is neither 0 nor 1.
    pub(super) fn has_bad_flag(&self, b: &Bytes) -> bool {
        self.fields.iter().any(|f| f.flag && b[f.at] > 1)
    }
}

/// A header struct with a declared layout ([`header_layout!`] implements
/// it): its read, its write and its reserved bytes, from one declaration.
pub(super) trait HasLayout: Sized {
    /// The declaration.
    const LAYOUT: Layout;
    /// The reserved bytes the declaration leaves. Evaluating this checks
    /// the layout, so a header whose decode uses it cannot build with a
    /// field outside its area or two fields over one byte.
    const RESERVED: [bool; HEADER_SIZE] = Self::LAYOUT.reserved();

    /// The fields as stored, unchecked.
    fn read_fields(b: &Bytes) -> Self;

    /// Writes every field; reserved bytes are left as they are (zero, in a
    /// fresh header).
    fn write_fields(&self, b: &mut Bytes);

    /// Fails on the first nonzero reserved byte, lowest offset first.
    fn check_reserved(b: &Bytes) -> Result<(), HeaderError> {
        Self::LAYOUT.check_reserved(b, &Self::RESERVED)
    }

    /// Every header's decode before its own rules: reserved bytes, flag
    /// bytes, then the fields.
    fn decode_fields(b: &Bytes, command: Command) -> Result<Self, HeaderError> {
        Self::check_reserved(b)?;
        if Self::LAYOUT.has_bad_flag(b) {
            return Err(HeaderError::Invalid {
                command,
                reason: BAD_FLAG,
            });
        }
        Ok(Self::read_fields(b))
    }
}

/// Declares a header struct's layout, `Name over area => { field: type @
/// offset, … }`, and implements [`HasLayout`] from it. The field types are
/// written out so the declaration reads as the table it is; a type that
/// differs from the struct's does not compile.
macro_rules! header_layout {
    ($name:ident over $area:expr => { $($field:ident: $ty:ident @ $at:expr),+ $(,)? }) => {
        impl $crate::header::layout::HasLayout for $name {
            const LAYOUT: $crate::header::layout::Layout = $crate::header::layout::Layout {
                area: $area,
                fields: &[$($crate::header::layout::FieldAt {
                    at: $at,
                    width: <$ty as $crate::header::layout::Field>::WIDTH,
                    flag: <$ty as $crate::header::layout::Field>::FLAG,
                }),+],
            };

            fn read_fields(b: &$crate::header::layout::Bytes) -> Self {
                Self {
                    $($field: <$ty as $crate::header::layout::Field>::get(b, $at)),+
                }
            }

            fn write_fields(&self, b: &mut $crate::header::layout::Bytes) {
                $(<$ty as $crate::header::layout::Field>::put(self.$field, b, $at);)+
            }
        }
    };
}

pub(super) use header_layout;

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    /// Every declared layout, by name.
    fn layouts() -> Vec<(&'static str, Layout)> {
        macro_rules! all {
            ($($name:ident),+ $(,)?) => {
                vec![$((stringify!($name), <$name as HasLayout>::LAYOUT)),+]
            };
        }
        all![
            Prefix,
            RequestHeader,
            ReplyHeader,
            PrepareCommand,
            PrepareOkHeader,
            CommitHeader,
            StartViewChangeHeader,
            DoViewChangeHeader,
            StartViewHeader,
            RequestStartViewHeader,
            RequestPreparesHeader,
            RepairRangeHeader,
            PingHeader,
            RequestHeadersHeader,
            HeadersHeader,
            RequestStateTransferHeader,
            StateTransferTargetHeader,
            RequestStateChunkHeader,
            StateChunkHeader,
        ]
    }

    /// The reserved bytes of `layout` as `(start, end)` runs, lowest first.
    fn reserved_runs(layout: &Layout) -> Vec<(usize, usize)> {
        let reserved = layout.reserved();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for at in (0..HEADER_SIZE).filter(|&at| reserved[at]) {
            match runs.last_mut() {
                Some((_, end)) if *end == at => *end = at + 1,
                _ => runs.push((at, at + 1)),
            }
        }
        runs
    }

    #[test]
    fn given_every_layout_when_checked_should_keep_fields_in_its_area_without_overlap() {
        for (name, layout) in layouts() {
            let expected_area = if name == "Prefix" { 0..128 } else { TAIL };
            assert_eq!(layout.area, expected_area, "{name}");
            let mut owner = [None; HEADER_SIZE];
            for (i, f) in layout.fields.iter().enumerate() {
                assert!(f.width > 0, "{name}: field {i} has no bytes");
                assert!(
                    layout.area.start <= f.at && f.at + f.width <= layout.area.end,
                    "{name}: field {i} ({}..{}) leaves {:?}",
                    f.at,
                    f.at + f.width,
                    layout.area
                );
                for (at, slot) in owner.iter_mut().enumerate().skip(f.at).take(f.width) {
                    assert_eq!(*slot, None, "{name}: fields overlap at byte {at}");
                    *slot = Some(i);
                }
            }
        }
    }

    #[test]
    fn given_every_layout_when_its_reserved_bytes_are_derived_should_match_the_documented_ranges() {
        // docs/formats.md §4.1 and §4.4, where "pad" and "reserved" are
        // both bytes that must be zero.
        let documented: [(&str, &[(usize, usize)]); 19] = [
            ("Prefix", &[(62, 128)]),
            ("RequestHeader", &[(177, 184), (200, 256)]),
            ("ReplyHeader", &[(209, 216), (220, 256)]),
            ("PrepareCommand", &[(209, 216), (228, 256)]),
            ("PrepareOkHeader", &[(193, 200), (208, 256)]),
            ("CommitHeader", &[(176, 256)]),
            ("StartViewChangeHeader", &[(136, 256)]),
            ("DoViewChangeHeader", &[(156, 224)]),
            ("StartViewHeader", &[(152, 240)]),
            ("RequestStartViewHeader", &[(165, 240)]),
            ("RequestPreparesHeader", &[(168, 256)]),
            ("RepairRangeHeader", &[(160, 256)]),
            ("PingHeader", &[(144, 256)]),
            ("RequestHeadersHeader", &[(168, 256)]),
            ("HeadersHeader", &[(152, 256)]),
            ("RequestStateTransferHeader", &[(152, 256)]),
            ("StateTransferTargetHeader", &[(162, 168), (176, 256)]),
            ("RequestStateChunkHeader", &[(168, 256)]),
            ("StateChunkHeader", &[(164, 256)]),
        ];
        let layouts = layouts();
        assert_eq!(layouts.len(), documented.len());
        for ((name, layout), (doc_name, runs)) in layouts.iter().zip(documented) {
            assert_eq!(*name, doc_name);
            assert_eq!(reserved_runs(layout), runs, "{name}");
        }
    }

    #[test]
    fn given_a_nonzero_byte_in_each_reserved_range_when_checked_should_name_the_lowest() {
        for (name, layout) in layouts() {
            let reserved = layout.reserved();
            for (start, end) in reserved_runs(&layout) {
                let mut b = [0u8; HEADER_SIZE];
                b[end - 1] = 0x80;
                b[start] = 1;
                assert_eq!(
                    layout.check_reserved(&b, &reserved),
                    Err(HeaderError::NonzeroReserved { offset: start }),
                    "{name}"
                );
            }
            // Field bytes are not reserved.
            let mut b = [0u8; HEADER_SIZE];
            for f in layout.fields {
                b[f.at..f.at + f.width].fill(0xFF);
            }
            assert_eq!(layout.check_reserved(&b, &reserved), Ok(()), "{name}");
        }
    }
}
