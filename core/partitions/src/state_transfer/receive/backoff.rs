//! After a failed attempt: the consecutive-failure backoff (ST-R4) and
//! which peer to ask next.

use super::{BACKOFF_EXPONENT_MAX, LocalFacts};
use common::ReplicaId;

/// Consecutive-failure backoff (ST-R4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferBackoff {
    /// Charged failures since the last completed install.
    pub failures: u32,
    /// Transient refusals since the last completed install.
    pub refusals: u32,
}

impl TransferBackoff {
    /// The re-arm delay after the current count of failures:
    /// `base × 2^min(failures, 10)`, saturating.
    pub fn delay_ticks(&self, base_ticks: u64) -> u64 {
        base_ticks
            .max(1)
            .saturating_mul(1 << self.failures.min(BACKOFF_EXPONENT_MAX))
    }
}

/// The peer to try after `failed`: the view's primary if it is neither this
/// replica nor the failed peer, otherwise the next replica around the ring
/// past the failed one, skipping this replica.
pub fn rotate_peer(local: &LocalFacts, failed: ReplicaId) -> ReplicaId {
    if local.primary != local.replica && local.primary != failed {
        return local.primary;
    }
    let n = local.replica_count.max(1);
    let mut candidate = failed.0;
    for _ in 0..n {
        // `failed` is a peer id from a session; past the ring (or at
        // u8::MAX, where `+ 1` overflowed) the ring starts over at 0.
        candidate = match candidate.checked_add(1) {
            Some(next) if next < n => next,
            _ => 0,
        };
        if candidate != local.replica.0 {
            return ReplicaId(candidate);
        }
    }
    failed
}

/// The peer to ask after `refuser` refused for now (a transient refusal):
/// the view's primary unless it is this replica or the one that refused,
/// else the next replica around the ring. Going round after the primary's
/// refusal matters when it will not serve for long (it waits for a
/// census): a backup serves its primary, a member of a view change serves
/// anyone, and asking the primary for ever hid them (mixed 22008104, and
/// 23004582 on group 0).
pub fn peer_after_refusal(local: &LocalFacts, refuser: ReplicaId) -> ReplicaId {
    if local.primary != local.replica && local.primary != refuser {
        local.primary
    } else {
        rotate_peer(local, refuser)
    }
}
