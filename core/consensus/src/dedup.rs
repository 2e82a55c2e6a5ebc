//! The dedup watermark: one client's entry of a group's client table, in
//! the form state transfer carries it.
//!
//! A rejoining replica installs the slice of watermarks with the rest of the
//! partition's state, so a client retrying a request that the group already
//! committed gets the cached outcome instead of a second execution.

use common::Op;

/// One client's deduplication state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupWatermark {
    /// The client id; 0 is reserved and never appears in a table.
    pub client: u128,
    /// The user the client's session belongs to.
    pub user_id: u32,
    /// The highest request number committed for this client.
    pub watermark: u64,
    /// The op of the client's newest committed reply (eviction order).
    pub latest_commit: Op,
    /// Bit `i` is set iff request `watermark - i` committed (bit 0 is the
    /// watermark itself), so retries of recent requests are recognised even
    /// when requests commit out of order.
    pub committed_window: u128,
}

impl DedupWatermark {
    /// Whether `request` is known to have committed: inside the window with
    /// its bit set, or at or below the window's low edge (everything that
    /// old is treated as applied).
    pub const fn covers(&self, request: u64) -> bool {
        if request > self.watermark {
            return false;
        }
        let distance = self.watermark - request;
        if distance >= u128::BITS as u64 {
            return true;
        }
        self.committed_window & (1u128 << distance) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_window_when_queried_should_report_committed_requests() {
        let w = DedupWatermark {
            client: 9,
            user_id: 1,
            watermark: 200,
            latest_commit: Op(77),
            committed_window: 0b101,
        };
        assert!(w.covers(200));
        assert!(!w.covers(199));
        assert!(w.covers(198));
        assert!(!w.covers(201));
        assert!(w.covers(200 - 128));
        assert!(w.covers(0));
    }
}
