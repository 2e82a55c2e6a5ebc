//! Property tests of the batch codec over random batch shapes.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use storage::BatchBuilder;
use storage::{BATCH_LENGTH_MAX_DEFAULT, BatchView, Integrity, stamp};

type Message = (u128, u32, Vec<u8>, Vec<u8>);

fn messages() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(
        (
            any::<u128>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(any::<u8>(), 0..40),
        ),
        1..12,
    )
}

fn build(msgs: &[Message], origin: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new(origin);
    for (id, delta, payload, headers) in msgs {
        b.push(*id, *delta, payload, headers);
    }
    b.build()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn given_random_batch_when_stamped_and_decoded_should_round_trip(
        msgs in messages(),
        origin in any::<u64>(),
        partition in any::<u64>(),
        base in 0u64..u64::MAX / 2,
        ts in any::<u64>(),
    ) {
        let mut bytes = build(&msgs, origin);
        stamp(&mut bytes, partition, base, ts, BATCH_LENGTH_MAX_DEFAULT).unwrap();
        let view = BatchView::decode_exact(&bytes, Integrity::Verify, BATCH_LENGTH_MAX_DEFAULT).unwrap();
        prop_assert_eq!(view.header().message_count as usize, msgs.len());
        prop_assert_eq!(view.header().base_offset, base);
        prop_assert_eq!(view.header().partition_id, partition);
        prop_assert_eq!(view.header().base_timestamp, ts);
        prop_assert_eq!(view.header().origin_timestamp, origin);
        for (i, (m, (id, delta, payload, headers))) in view.messages().zip(&msgs).enumerate() {
            prop_assert_eq!(m.offset, base + i as u64);
            prop_assert_eq!(m.id, *id);
            prop_assert_eq!(m.timestamp_delta, *delta);
            prop_assert_eq!(m.payload, payload.as_slice());
            prop_assert_eq!(m.user_headers, headers.as_slice());
        }
    }

    #[test]
    fn given_random_batch_when_one_byte_changes_should_reject(
        msgs in messages(),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let mut bytes = build(&msgs, 7);
        let i = at.index(bytes.len());
        bytes[i] ^= mask;
        prop_assert!(BatchView::decode_exact(&bytes, Integrity::Verify, BATCH_LENGTH_MAX_DEFAULT).is_err());
    }

    #[test]
    fn given_random_batch_when_cut_short_should_reject(msgs in messages(), cut in any::<prop::sample::Index>()) {
        let bytes = build(&msgs, 7);
        let n = cut.index(bytes.len());
        prop_assert!(BatchView::decode_prefix(&bytes[..n], Integrity::Verify, BATCH_LENGTH_MAX_DEFAULT).is_err());
    }
}
