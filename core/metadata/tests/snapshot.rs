//! The metadata snapshot codec: round trip over random histories, every
//! strict prefix and every bit flip refused, each structural rejection its
//! own error (with a valid trailer, so the parser itself is exercised), and
//! hostile bodies never panic.
#![allow(clippy::unwrap_used)]

mod support;

use consensus::push_trailer;
use metadata::{
    MetadataOp, MetadataState, SNAPSHOT_MAGIC, SessionId, SnapshotDecodeError, decode_snapshot,
    encode_snapshot,
};
use proptest::prelude::*;
use support::*;

fn rich_state() -> MetadataState {
    let mut sm = Sm::default();
    sm.ok(create_user("iggy"));
    sm.ok(create_stream("s"));
    sm.ok(create_stream("gone"));
    sm.ok(create_topic(0, "t", 3));
    sm.ok(create_topic(0, "u", 1));
    sm.ok(create_group(0, 0, "g"));
    sm.ok(join(0, 0, 0, 7));
    sm.ok(join(0, 0, 0, 8));
    sm.ok(MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: 0.into(),
    });
    sm.ok(MetadataOp::DeleteStream {
        stream: "gone".into(),
    });
    let _ = sm.apply(create_stream("s")); // refused, still an applied op
    sm.state
}

/// The content (no trailer) of `state`'s snapshot.
fn content(state: &MetadataState) -> Vec<u8> {
    let mut b = encode_snapshot(state);
    b.truncate(b.len() - 8);
    b
}

fn sealed(mut content: Vec<u8>) -> Vec<u8> {
    push_trailer(&mut content);
    content
}

#[test]
fn given_a_state_when_snapshotted_should_decode_to_the_same_state() {
    let state = rich_state();
    let bytes = encode_snapshot(&state);
    assert_eq!(decode_snapshot(&bytes).unwrap(), state);
    assert_eq!(
        decode_snapshot(&encode_snapshot(&MetadataState::new())).unwrap(),
        MetadataState::new()
    );
}

#[test]
fn given_a_snapshot_when_any_strict_prefix_or_bit_flip_is_decoded_should_refuse() {
    let bytes = encode_snapshot(&rich_state());
    for len in 0..bytes.len() {
        assert!(decode_snapshot(&bytes[..len]).is_err(), "prefix {len}");
    }
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(decode_snapshot(&b).is_err(), "bit {bit}");
    }
}

#[test]
fn given_structurally_bad_content_with_a_valid_trailer_should_refuse_with_each_own_error() {
    let state = rich_state();
    let c = content(&state);
    let patch = |at: usize, with: &[u8]| {
        let mut b = c.clone();
        b[at..at + with.len()].copy_from_slice(with);
        decode_snapshot(&sealed(b))
    };
    assert_eq!(
        patch(0, b"XXXX"),
        Err(SnapshotDecodeError::BadMagic(u32::from_le_bytes(*b"XXXX")))
    );
    assert_eq!(
        patch(4, &2u16.to_le_bytes()),
        Err(SnapshotDecodeError::UnknownVersion(2))
    );
    assert_eq!(
        patch(6, &1u16.to_le_bytes()),
        Err(SnapshotDecodeError::ReservedNonZero(1))
    );
    // Header 8, applied 8, identity 16, next_stream_id 4, next_group 8,
    // next_user_id 4.
    let streams_at = 8 + 8 + 16 + 4 + 8 + 4;
    assert_eq!(
        patch(streams_at, &u32::MAX.to_le_bytes()),
        Err(SnapshotDecodeError::CountAboveCeiling {
            what: "streams",
            count: u32::MAX,
            max: metadata::STREAMS_MAX
        })
    );
    assert_eq!(
        patch(streams_at, &90_000u32.to_le_bytes()),
        Err(SnapshotDecodeError::CountExceedsBytes {
            what: "streams",
            count: 90_000
        })
    );
    // The partition group counter below the groups in use.
    assert_eq!(
        patch(8 + 8 + 16 + 4, &2u64.to_le_bytes()),
        Err(SnapshotDecodeError::Inconsistent(
            "partition group zero, beyond the counter or duplicated"
        ))
    );
    let mut longer = c.clone();
    longer.push(0);
    assert_eq!(
        decode_snapshot(&sealed(longer)),
        Err(SnapshotDecodeError::TrailingBytes { len: 1 })
    );
    assert!(matches!(
        decode_snapshot(&sealed(c[..c.len() - 1].to_vec())),
        Err(SnapshotDecodeError::Truncated { .. })
    ));
    assert_eq!(
        decode_snapshot(&[0u8; 15]),
        Err(SnapshotDecodeError::TooShort { len: 15 })
    );
    let mut bad = encode_snapshot(&state);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        decode_snapshot(&bad),
        Err(SnapshotDecodeError::ChecksumMismatch { .. })
    ));
}

#[test]
fn given_duplicate_or_unordered_ids_when_decoded_should_refuse_as_not_ascending() {
    // Two streams whose ids are swapped into descending order.
    let mut sm = Sm::default();
    sm.ok(create_stream("a"));
    sm.ok(create_stream("b"));
    let c = content(&sm.state);
    let streams_at = 8 + 8 + 16 + 4 + 8 + 4;
    let first = streams_at + 4;
    // stream record: id 4, name 1 + 1, created_at 8, next_topic_id 4,
    // topic count 4 = 22 bytes.
    let second = first + 22;
    let mut b = c.clone();
    b[first..first + 4].copy_from_slice(&1u32.to_le_bytes());
    b[second..second + 4].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(
        decode_snapshot(&sealed(b)),
        Err(SnapshotDecodeError::NotAscending { what: "stream" })
    );
    // Same name twice: structurally fine, refused by the invariants.
    let mut b = c;
    b[second + 5] = b'a';
    assert_eq!(
        decode_snapshot(&sealed(b)),
        Err(SnapshotDecodeError::Inconsistent(
            "stream name invalid or duplicated"
        ))
    );
}

fn step() -> impl Strategy<Value = MetadataOp> {
    prop_oneof![
        (0u8..4).prop_map(|n| create_stream(&format!("s{n}"))),
        (0u32..3, 0u8..3, 0u32..4).prop_map(|(s, n, p)| create_topic(s, &format!("t{n}"), p)),
        (0u32..3, 0u32..3, 0u8..2).prop_map(|(s, t, n)| create_group(s, t, &format!("g{n}"))),
        (0u32..3, 0u32..3, 0u64..4).prop_map(|(s, t, x)| join(s, t, 0, x)),
        (0u32..3, 0u32..3, 0u64..4).prop_map(|(s, t, x)| leave(s, t, 0, x)),
        (0u64..4).prop_map(|x| MetadataOp::EndSession {
            session: SessionId(x)
        }),
        (0u32..3, 0u32..3).prop_map(|(s, t)| MetadataOp::PurgeTopic {
            stream: s.into(),
            topic: t.into()
        }),
        (0u32..3).prop_map(|s| MetadataOp::DeleteStream { stream: s.into() }),
        (0u32..3, 0u32..3, 1u32..3).prop_map(|(s, t, n)| MetadataOp::CreatePartitions {
            stream: s.into(),
            topic: t.into(),
            count: n,
            created_at_us: 9
        }),
        (0u32..3, 0u32..3, 1u32..3).prop_map(|(s, t, n)| MetadataOp::DeletePartitions {
            stream: s.into(),
            topic: t.into(),
            count: n
        }),
        (0u8..3).prop_map(|n| create_user(&format!("u{n}"))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn given_random_histories_when_snapshotted_should_round_trip(
        ops in proptest::collection::vec(step(), 0..40)
    ) {
        let mut sm = Sm::default();
        for op in ops {
            let _ = sm.apply(op);
        }
        let bytes = encode_snapshot(&sm.state);
        prop_assert_eq!(decode_snapshot(&bytes).unwrap(), sm.state);
    }

    #[test]
    fn given_hostile_bodies_with_valid_trailers_should_not_panic_and_be_canonical(
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut c = SNAPSHOT_MAGIC.to_le_bytes().to_vec();
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&0u16.to_le_bytes());
        c.extend_from_slice(&body);
        let bytes = sealed(c);
        if let Ok(state) = decode_snapshot(&bytes) {
            prop_assert_eq!(encode_snapshot(&state), bytes);
        }
    }

    #[test]
    fn given_a_valid_snapshot_with_random_bytes_overwritten_and_resealed_should_not_panic(
        at in any::<prop::sample::Index>(),
        with in proptest::collection::vec(any::<u8>(), 1..8),
    ) {
        let mut c = content(&rich_state());
        let i = at.index(c.len());
        for (k, b) in with.iter().enumerate() {
            if let Some(x) = c.get_mut(i + k) {
                *x = *b;
            }
        }
        let bytes = sealed(c);
        if let Ok(state) = decode_snapshot(&bytes) {
            state.invariants();
            prop_assert_eq!(encode_snapshot(&state), bytes);
        }
    }
}
