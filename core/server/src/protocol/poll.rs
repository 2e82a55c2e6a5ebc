//! Cutting a stored batch down to the messages a poll asked for.
//!
//! A poll answers with whole batch records (client_protocol.md §9). When
//! a poll starts inside a batch or asks for fewer messages than it holds,
//! the batch is re-encoded with just the selected messages: base offset =
//! the first selected offset, each message's `offset_delta` its new index,
//! and every checksum recomputed, so the cut batch passes the same codec
//! as a stored one (the SDK reads offsets as `base_offset + offset_delta`
//! and does not check checksums; a cut batch that kept the old deltas would
//! fail replog's own batch codec instead).

use bytes::Bytes;
use common::Offset;
use storage::{BATCH_LENGTH_MAX_DEFAULT, BatchBuilder, BatchError, BatchView, Integrity};

/// The messages of `batch` at offsets `from..from + max`, as a batch of
/// their own; the batch itself (not copied) when it is all selected; `None`
/// when none is.
pub fn select_messages(batch: &Bytes, from: Offset, max: u32) -> Result<Option<Bytes>, BatchError> {
    let view = BatchView::decode_exact(batch, Integrity::LayoutOnly, BATCH_LENGTH_MAX_DEFAULT)?;
    let h = *view.header();
    let first = from.0.max(h.base_offset);
    if max == 0 || first > h.last_offset() {
        return Ok(None);
    }
    let end = h.next_offset().min(first.saturating_add(u64::from(max)));
    if first == h.base_offset && end == h.next_offset() {
        return Ok(Some(batch.clone()));
    }
    let mut cut = BatchBuilder::new(h.origin_timestamp);
    for m in view.messages().filter(|m| (first..end).contains(&m.offset)) {
        cut.push(m.id, m.timestamp_delta, m.payload, m.user_headers);
    }
    let bytes = cut.build_stamped(h.partition_id, first, h.base_timestamp)?;
    Ok(Some(Bytes::from(bytes)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stored(base: u64, n: u32) -> Bytes {
        let mut b = BatchBuilder::new(1_000);
        for i in 0..n {
            b.push(u128::from(i) + 1, i, format!("m{i}").as_bytes(), b"");
        }
        Bytes::from(b.build_stamped(3, base, 5_000).unwrap())
    }

    #[test]
    fn given_a_whole_batch_selected_when_cut_should_return_it_unchanged() {
        let b = stored(10, 4);
        assert_eq!(
            select_messages(&b, Offset(0), 100).unwrap(),
            Some(b.clone())
        );
        assert_eq!(select_messages(&b, Offset(10), 4).unwrap(), Some(b));
    }

    #[test]
    fn given_a_middle_range_when_cut_should_rebase_and_verify() {
        let b = stored(10, 5);
        let cut = select_messages(&b, Offset(11), 2).unwrap().unwrap();
        let view = BatchView::decode_exact(&cut, Integrity::Verify, u64::MAX).unwrap();
        assert_eq!(view.header().base_offset, 11);
        assert_eq!(view.header().base_timestamp, 5_000);
        assert_eq!(view.header().partition_id, 3);
        let got: Vec<_> = view
            .messages()
            .map(|m| (m.offset, m.payload.to_vec()))
            .collect();
        assert_eq!(got, vec![(11, b"m1".to_vec()), (12, b"m2".to_vec())]);
    }

    #[test]
    fn given_a_start_past_the_batch_when_cut_should_select_nothing() {
        let b = stored(10, 2);
        assert_eq!(select_messages(&b, Offset(12), 10).unwrap(), None);
        assert_eq!(select_messages(&b, Offset(10), 0).unwrap(), None);
    }
}
