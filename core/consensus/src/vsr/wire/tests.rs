//! The wire codec: every VSR message round-trips, and bytes that are not a
//! frame this replica accepts are refused with their own error.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

const CLUSTER: u128 = 0xC1A5;
const MAX: u32 = 1 << 20;

fn expect(peer: Option<u8>) -> Expect {
    Expect {
        cluster: CLUSTER,
        size_max: MAX,
        peer: peer.map(ReplicaId),
    }
}

fn prepare(op: u64, parent: u128, body: &'static [u8]) -> Prepare {
    let mut header = PrepareHeader {
        checksum: 0,
        checksum_body: body_checksum(body),
        parent,
        client: 77,
        request_checksum: 5,
        view: 3,
        op: Op(op),
        commit: Op(op - 1),
        timestamp: 1_000 + op,
        request: op,
        operation: 3,
        group: GroupId(9),
        user_id: 4,
    };
    header.checksum = header.compute_checksum();
    Prepare {
        header,
        body: Bytes::from_static(body),
    }
}

fn frames() -> Vec<Frame> {
    let p5 = prepare(5, 0xAB, b"batch five");
    let p6 = prepare(6, p5.header.checksum, b"");
    let messages = vec![
        Message::Prepare(p5.clone()),
        Message::Prepare(p6.clone()),
        Message::RepairPrepare(p5.clone()),
        Message::PrepareOk {
            op: Op(5),
            prepare_checksum: p5.header.checksum,
        },
        Message::Commit {
            commit: Op(5),
            commit_checksum: p5.header.checksum,
            timestamp_monotonic: 99,
        },
        Message::StartViewChange,
        Message::DoViewChange(DoViewChange {
            log_view: 2,
            op: Op(6),
            commit: Op(4),
            suffix: vec![
                SuffixSlot::Header(p6.header),
                SuffixSlot::Blank,
                SuffixSlot::Header(prepare(4, 1, b"four").header),
            ],
            nack_bitset: 0b010,
            present_bitset: 0b101,
        }),
        Message::DoViewChange(DoViewChange {
            log_view: 0,
            op: Op(0),
            commit: Op(0),
            suffix: vec![],
            nack_bitset: 0,
            present_bitset: 0,
        }),
        Message::StartView(StartView {
            op: Op(6),
            commit: Op(5),
            suffix: vec![p6.header, p5.header],
            incarnation: 0xFEED,
        }),
        Message::RequestStartView {
            incarnation: 12,
            census: None,
        },
        Message::RequestStartView {
            incarnation: 13,
            census: Some(Census {
                log_view: 2,
                op: Op(40),
                checksum: 0xABC,
            }),
        },
        Message::RequestPrepares {
            nonce: 7,
            from_op: Op(2),
            to_op: Op(9),
        },
        Message::RepairDone {
            nonce: 7,
            op: Op(9),
        },
        Message::RangeEvicted {
            nonce: 7,
            retained_from: Op(3),
        },
        Message::Ping { round: 5 },
        Message::Pong { round: u64::MAX },
    ];
    messages
        .into_iter()
        .map(|message| Frame {
            group: GroupId(9),
            replica: ReplicaId(2),
            view: 3,
            message,
        })
        .collect()
}

#[test]
fn given_every_vsr_message_when_encoded_should_decode_to_the_same_frame() {
    for frame in frames() {
        let bytes = encode(CLUSTER, &frame);
        let back = decode(&bytes, &expect(Some(2))).unwrap();
        assert_eq!(back, frame, "{}", frame.message.name());
        assert_eq!(
            peek_group(&bytes),
            Some(GroupId(9)),
            "{}",
            frame.message.name()
        );
    }
}

#[test]
fn given_prepare_when_decoded_should_keep_the_primary_identity_and_chain() {
    let frame = &frames()[1];
    let Message::Prepare(sent) = &frame.message else {
        unreachable!()
    };
    let back = decode(&encode(CLUSTER, frame), &expect(None)).unwrap();
    let Message::Prepare(got) = back.message else {
        panic!("not a prepare")
    };
    assert!(got.verify());
    assert_eq!(got.header.checksum, sent.header.checksum);
    assert_eq!(got.header.parent, sent.header.parent);
}

#[test]
fn given_other_cluster_when_decoded_should_refuse() {
    let bytes = encode(CLUSTER + 1, &frames()[0]);
    assert!(matches!(
        decode(&bytes, &expect(None)),
        Err(WireError::WrongCluster { .. })
    ));
}

#[test]
fn given_sender_other_than_connection_peer_when_decoded_should_refuse() {
    let bytes = encode(CLUSTER, &frames()[3]);
    assert_eq!(
        decode(&bytes, &expect(Some(1))),
        Err(WireError::WrongSender {
            claimed: ReplicaId(2),
            peer: ReplicaId(1)
        })
    );
}

#[test]
fn given_size_past_ceiling_when_decoded_should_refuse_before_the_body() {
    let bytes = encode(CLUSTER, &frames()[0]);
    let tight = Expect {
        size_max: 260,
        ..expect(None)
    };
    assert!(matches!(
        decode(&bytes, &tight),
        Err(WireError::Header(HeaderError::SizeAboveMax { .. }))
    ));
}

#[test]
fn given_every_strict_prefix_or_flipped_bit_when_decoded_should_refuse() {
    for frame in frames() {
        let bytes = encode(CLUSTER, &frame).to_vec();
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], &expect(None)).is_err());
        }
        for byte in 0..bytes.len() {
            // The view of a prepare is the one field no checksum covers,
            // on purpose (a retransmission restamps it).
            let prepare = matches!(
                frame.message,
                Message::Prepare(_) | Message::RepairPrepare(_)
            );
            if prepare && (52..56).contains(&byte) {
                continue;
            }
            let mut flipped = bytes.clone();
            flipped[byte] ^= 0x10;
            assert!(
                decode(&flipped, &expect(None)).is_err(),
                "{} byte {byte}",
                frame.message.name()
            );
        }
    }
}

#[test]
fn given_suffix_entry_of_another_group_when_decoded_should_refuse() {
    let mut stranger = prepare(6, 1, b"x");
    stranger.header.group = GroupId(10);
    stranger.header.checksum = stranger.header.compute_checksum();
    let frame = Frame {
        group: GroupId(9),
        replica: ReplicaId(2),
        view: 3,
        message: Message::StartView(StartView {
            op: Op(6),
            commit: Op(5),
            suffix: vec![stranger.header],
            incarnation: 1,
        }),
    };
    assert_eq!(
        decode(&encode(CLUSTER, &frame), &expect(None)),
        Err(WireError::SuffixGroupMismatch {
            group: GroupId(9),
            entry: GroupId(10)
        })
    );
}

#[test]
fn given_suffix_entry_out_of_position_when_decoded_should_refuse() {
    let frame = Frame {
        group: GroupId(9),
        replica: ReplicaId(2),
        view: 3,
        message: Message::StartView(StartView {
            op: Op(7),
            commit: Op(5),
            suffix: vec![prepare(6, 1, b"x").header],
            incarnation: 1,
        }),
    };
    assert_eq!(
        decode(&encode(CLUSTER, &frame), &expect(None)),
        Err(WireError::SuffixOpMismatch {
            expected: Op(7),
            found: Op(6)
        })
    );
}

#[test]
fn given_state_transfer_or_client_command_when_decoded_should_say_not_vsr() {
    let header = FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster: CLUSTER,
        size: 0,
        view: 0,
        replica: ReplicaId(1),
        command: CommandHeader::RequestStateTransfer(header::RequestStateTransferHeader {
            nonce: 1,
            group: GroupId(9),
        }),
    };
    let bytes = header::encode_frame(&header, &[]);
    assert_eq!(peek_group(&bytes), Some(GroupId(9)));
    assert_eq!(
        decode(&bytes, &expect(None)),
        Err(WireError::NotVsr {
            command: Command::RequestStateTransfer
        })
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn given_random_bytes_when_decoded_should_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..1200),
    ) {
        let _ = decode(&bytes, &expect(None));
        let _ = peek_group(&bytes);
    }

    #[test]
    fn given_frame_with_random_corruption_when_decoded_should_never_panic(
        which in 0usize..13,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let frames = frames();
        let mut bytes = encode(CLUSTER, &frames[which % frames.len()]).to_vec();
        let len = bytes.len();
        for (at, value) in edits {
            bytes[at % len] = value;
        }
        let _ = decode(&bytes, &expect(None));
    }
}
