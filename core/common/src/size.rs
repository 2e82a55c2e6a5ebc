//! Byte-size constants and a human-readable formatter for logs.

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;

/// Formats a byte count with a binary unit, e.g. `1.50 MiB`, for log lines
/// and progress reports. Exact below one KiB.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", GIB), ("MiB", MIB), ("KiB", KIB)];
    for (name, unit) in UNITS {
        if bytes >= unit {
            // Two decimals are plenty for a log line; f64 is exact up to 2^53.
            return format!("{:.2} {name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_sizes_when_formatted_should_pick_largest_unit() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 * MIB), "3.00 MiB");
        assert_eq!(format_bytes(GIB + GIB / 4), "1.25 GiB");
    }
}
