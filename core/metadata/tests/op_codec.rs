//! The metadata op codec: round trip, canonical, every strict prefix
//! refused, trailing bytes refused, each rejection its own variant, and
//! hostile bytes never panic (property tests).
#![allow(clippy::unwrap_used)]

mod support;

use metadata::{
    CompressionAlgorithm, Durability, Identifier, MaxTopicSize, MessageExpiry, MetadataOp,
    OpDecodeError, OpEncodeError, SessionId, TopicConfig, TopicPatch,
};
use proptest::prelude::*;
use support::*;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.-]{1,16}",
        // Multi-byte UTF-8, kept within 255 bytes.
        "[é日本🦀]{1,60}",
        Just("n".repeat(255)),
    ]
}

fn ident() -> impl Strategy<Value = Identifier> {
    prop_oneof![
        any::<u32>().prop_map(Identifier::Numeric),
        name().prop_map(Identifier::Name),
    ]
}

fn config() -> impl Strategy<Value = TopicConfig> {
    (
        any::<u64>(),
        any::<u64>(),
        1u64..,
        any::<bool>(),
        1u8..,
        any::<bool>(),
    )
        .prop_map(|(e, m, seg, gz, rf, persisted)| TopicConfig {
            message_expiry: MessageExpiry::from_wire(e),
            max_topic_size: MaxTopicSize::from_wire(m),
            segment_size_bytes: seg,
            compression: if gz {
                CompressionAlgorithm::Gzip
            } else {
                CompressionAlgorithm::None
            },
            replication_factor: rf,
            durability: if persisted {
                Durability::Persisted
            } else {
                Durability::Replicated
            },
        })
}

fn patch() -> impl Strategy<Value = TopicPatch> {
    (
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(gz, e, m)| TopicPatch {
            compression: gz.map(|gz| {
                if gz {
                    CompressionAlgorithm::Gzip
                } else {
                    CompressionAlgorithm::None
                }
            }),
            message_expiry: e.map(MessageExpiry::from_wire),
            max_topic_size: m.map(MaxTopicSize::from_wire),
        })
}

fn op() -> impl Strategy<Value = MetadataOp> {
    let count = 0u32..=1000;
    prop_oneof![
        (name(), any::<u64>()).prop_map(|(name, created_at_us)| MetadataOp::CreateStream {
            name,
            created_at_us
        }),
        (ident(), name()).prop_map(|(stream, name)| MetadataOp::UpdateStream { stream, name }),
        ident().prop_map(|stream| MetadataOp::DeleteStream { stream }),
        ident().prop_map(|stream| MetadataOp::PurgeStream { stream }),
        (ident(), name(), count.clone(), config(), any::<u64>()).prop_map(
            |(stream, name, partitions_count, config, created_at_us)| MetadataOp::CreateTopic {
                stream,
                name,
                partitions_count,
                config,
                created_at_us
            }
        ),
        (ident(), ident(), name(), config()).prop_map(|(stream, topic, name, config)| {
            MetadataOp::UpdateTopic {
                stream,
                topic,
                name,
                config,
            }
        }),
        (ident(), ident(), name(), patch()).prop_map(|(stream, topic, name, patch)| {
            MetadataOp::PatchTopic {
                stream,
                topic,
                name,
                patch,
            }
        }),
        (ident(), ident()).prop_map(|(stream, topic)| MetadataOp::DeleteTopic { stream, topic }),
        (ident(), ident()).prop_map(|(stream, topic)| MetadataOp::PurgeTopic { stream, topic }),
        (ident(), ident(), count.clone(), any::<u64>()).prop_map(
            |(stream, topic, count, created_at_us)| MetadataOp::CreatePartitions {
                stream,
                topic,
                count,
                created_at_us
            }
        ),
        (ident(), ident(), count).prop_map(|(stream, topic, count)| {
            MetadataOp::DeletePartitions {
                stream,
                topic,
                count,
            }
        }),
        (ident(), ident(), name()).prop_map(|(stream, topic, name)| {
            MetadataOp::CreateConsumerGroup {
                stream,
                topic,
                name,
            }
        }),
        (ident(), ident(), ident()).prop_map(|(stream, topic, group)| {
            MetadataOp::DeleteConsumerGroup {
                stream,
                topic,
                group,
            }
        }),
        (ident(), ident(), ident(), any::<u64>()).prop_map(|(stream, topic, group, s)| {
            MetadataOp::JoinConsumerGroup {
                stream,
                topic,
                group,
                session: SessionId(s),
            }
        }),
        (ident(), ident(), ident(), any::<u64>()).prop_map(|(stream, topic, group, s)| {
            MetadataOp::LeaveConsumerGroup {
                stream,
                topic,
                group,
                session: SessionId(s),
            }
        }),
        any::<u64>().prop_map(|s| MetadataOp::EndSession {
            session: SessionId(s)
        }),
        (name(), any::<u64>()).prop_map(|(username, created_at_us)| MetadataOp::CreateUser {
            username,
            password_hash: secret_hash(),
            created_at_us
        }),
        ident().prop_map(|user| MetadataOp::DeleteUser { user }),
        ident().prop_map(|user| MetadataOp::ChangePassword {
            user,
            password_hash: secret_hash()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn given_any_op_when_encoded_should_decode_to_itself_and_every_strict_prefix_should_fail(
        op in op()
    ) {
        let bytes = op.encode().unwrap();
        prop_assert_eq!(MetadataOp::decode(&bytes).unwrap(), op);
        for len in 0..bytes.len() {
            let err = MetadataOp::decode(&bytes[..len]).unwrap_err();
            prop_assert!(
                matches!(err, OpDecodeError::Truncated { .. }),
                "prefix {len} of {}: {err:?}", bytes.len()
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(
            MetadataOp::decode(&longer),
            Err(OpDecodeError::TrailingBytes { len: 1 })
        );
    }

    #[test]
    fn given_any_op_with_one_bit_flipped_when_decoded_should_refuse_or_be_canonical(
        op in op(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut bytes = op.encode().unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        // The prepare's body checksum guards against corruption; the codec's
        // own duty is no panic and one encoding per op.
        if let Ok(decoded) = MetadataOp::decode(&bytes) {
            prop_assert_eq!(decoded.encode().unwrap(), bytes);
        }
    }

    #[test]
    fn given_hostile_bytes_when_decoded_should_not_panic_and_accepted_ones_should_be_canonical(
        tag in 1u8..=20,
        rest in proptest::collection::vec(any::<u8>(), 0..96),
    ) {
        let mut bytes = vec![1, tag];
        bytes.extend_from_slice(&rest);
        if let Ok(decoded) = MetadataOp::decode(&bytes) {
            prop_assert_eq!(decoded.encode().unwrap(), bytes);
        }
    }
}

fn create_topic_bytes() -> Vec<u8> {
    create_topic(0, "t", 3).encode().unwrap()
}

/// Offset of the config block in `create_topic_bytes()`: version, tag,
/// identifier (1 + 4), name (1 + 1), count (4).
const CONFIG_AT: usize = 2 + 5 + 2 + 4;

#[test]
fn given_each_malformed_field_when_decoded_should_refuse_with_its_own_error() {
    let cases: Vec<(Vec<u8>, OpDecodeError)> = vec![
        (vec![], OpDecodeError::Truncated { field: "version" }),
        (vec![2, 1], OpDecodeError::UnknownVersion(2)),
        (vec![1], OpDecodeError::Truncated { field: "tag" }),
        (vec![1, 0], OpDecodeError::UnknownTag(0)),
        (vec![1, 20], OpDecodeError::UnknownTag(20)),
        // A patch of topic 1 in stream 1, renamed "t", naming a setting
        // no patch has.
        (
            vec![1, 19, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, b't', 0b1000],
            OpDecodeError::UnknownPatchBits(0b1000),
        ),
        (
            vec![1, 19, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, b't', 0b1, 7],
            OpDecodeError::UnknownCompression(7),
        ),
        (
            vec![1, 19, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, b't', 0b10, 1, 2],
            OpDecodeError::Truncated {
                field: "message_expiry",
            },
        ),
        (
            vec![1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            OpDecodeError::EmptyName {
                field: "stream name",
            },
        ),
        (
            vec![1, 1, 2, 0xC3, 0x28, 0, 0, 0, 0, 0, 0, 0, 0],
            OpDecodeError::BadUtf8 {
                field: "stream name",
            },
        ),
        (
            vec![1, 3, 3, 0, 0, 0, 0],
            OpDecodeError::UnknownIdentifierKind(3),
        ),
        (vec![1, 3, 0], OpDecodeError::UnknownIdentifierKind(0)),
    ];
    for (bytes, want) in cases {
        assert_eq!(MetadataOp::decode(&bytes), Err(want), "{bytes:?}");
    }

    let base = create_topic_bytes();
    assert!(MetadataOp::decode(&base).is_ok());
    let patch = |at: usize, with: &[u8]| {
        let mut b = base.clone();
        b[at..at + with.len()].copy_from_slice(with);
        MetadataOp::decode(&b)
    };
    assert_eq!(
        patch(CONFIG_AT - 4, &1001u32.to_le_bytes()),
        Err(OpDecodeError::PartitionCountAboveCeiling { count: 1001 })
    );
    assert_eq!(
        patch(CONFIG_AT + 16, &0u64.to_le_bytes()),
        Err(OpDecodeError::ZeroSegmentSize)
    );
    assert_eq!(
        patch(CONFIG_AT + 24, &[0]),
        Err(OpDecodeError::UnknownCompression(0))
    );
    assert_eq!(
        patch(CONFIG_AT + 24, &[3]),
        Err(OpDecodeError::UnknownCompression(3))
    );
    assert_eq!(
        patch(CONFIG_AT + 25, &[0]),
        Err(OpDecodeError::ZeroReplicationFactor)
    );
    assert_eq!(
        patch(CONFIG_AT + 26, &[0]),
        Err(OpDecodeError::UnknownDurability(0))
    );
    assert_eq!(
        patch(CONFIG_AT + 26, &[9]),
        Err(OpDecodeError::UnknownDurability(9))
    );
}

#[test]
fn given_bad_password_hash_fields_when_decoded_should_refuse_with_their_errors() {
    let user = create_user("u").encode().unwrap();
    // version, tag, name (1 + 1), then the hash length.
    let at = 4;
    let mut zero = user.clone();
    zero[at..at + 2].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(
        MetadataOp::decode(&zero),
        Err(OpDecodeError::HashLengthOutOfRange { len: 0 })
    );
    let mut big = user.clone();
    big[at..at + 2].copy_from_slice(&513u16.to_le_bytes());
    assert_eq!(
        MetadataOp::decode(&big),
        Err(OpDecodeError::HashLengthOutOfRange { len: 513 })
    );
    let mut not_phc = user.clone();
    not_phc[at + 2] = b'x';
    assert_eq!(MetadataOp::decode(&not_phc), Err(OpDecodeError::HashNotPhc));
    let mut not_utf8 = user;
    not_utf8[at + 3] = 0xFF;
    assert_eq!(
        MetadataOp::decode(&not_utf8),
        Err(OpDecodeError::BadUtf8 {
            field: "password_hash"
        })
    );
}

#[test]
fn given_a_huge_declared_hash_length_when_decoded_should_refuse_before_reading() {
    // A length within the ceiling but beyond the bytes present is a
    // truncation, found without allocating.
    let mut b = vec![1, 16, 1, b'u'];
    b.extend_from_slice(&500u16.to_le_bytes());
    b.extend_from_slice(b"$argon2id$");
    assert_eq!(
        MetadataOp::decode(&b),
        Err(OpDecodeError::Truncated {
            field: "password_hash"
        })
    );
}

#[test]
fn given_ops_the_decoder_would_refuse_when_encoded_should_refuse_to_encode() {
    let bad_name = MetadataOp::CreateStream {
        name: String::new(),
        created_at_us: 0,
    };
    assert_eq!(
        bad_name.encode(),
        Err(OpEncodeError::NameLength {
            field: "stream name",
            len: 0
        })
    );
    let long = MetadataOp::DeleteStream {
        stream: Identifier::Name("x".repeat(256)),
    };
    assert_eq!(
        long.encode(),
        Err(OpEncodeError::NameLength {
            field: "stream",
            len: 256
        })
    );
    let over = MetadataOp::DeletePartitions {
        stream: 0.into(),
        topic: 0.into(),
        count: 1001,
    };
    assert_eq!(
        over.encode(),
        Err(OpEncodeError::PartitionCountAboveCeiling { count: 1001 })
    );
    let rf = MetadataOp::UpdateTopic {
        stream: 0.into(),
        topic: 0.into(),
        name: "t".into(),
        config: TopicConfig {
            replication_factor: 0,
            ..TopicConfig::default()
        },
    };
    assert_eq!(rf.encode(), Err(OpEncodeError::ZeroReplicationFactor));
    let seg = MetadataOp::UpdateTopic {
        stream: 0.into(),
        topic: 0.into(),
        name: "t".into(),
        config: TopicConfig {
            segment_size_bytes: 0,
            ..TopicConfig::default()
        },
    };
    assert_eq!(seg.encode(), Err(OpEncodeError::ZeroSegmentSize));
}
