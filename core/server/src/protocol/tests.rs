//! Codec tests. The oracle is the SDK's own wire crate,
//! `iggy_binary_protocol` 0.11.0: requests are encoded with its encoders
//! and the SDK's header layout, replies are decoded with its decoders and
//! the SDK's reply-splitting rules (mirrored from `iggy::vsr`, which is
//! crate-private there). Golden bytes from client_protocol.md are checked
//! offset by offset.

#![allow(clippy::unwrap_used)]

use super::records::*;
use super::*;
use crate::status::ErrorCode;
use bytes::{Bytes, BytesMut};
use common::{ConsumerKind, Offset, PartitionId, StreamId, TopicId};
use consensus::header::{HEADER_SIZE, RequestHeader};
use iggy_binary_protocol::consensus::{Command as WireCommand, Operation};
use iggy_binary_protocol::requests::consumer_groups::*;
use iggy_binary_protocol::requests::consumer_offsets::*;
use iggy_binary_protocol::requests::messages::*;
use iggy_binary_protocol::requests::partitions::*;
use iggy_binary_protocol::requests::streams::*;
use iggy_binary_protocol::requests::system::*;
use iggy_binary_protocol::requests::topics::*;
use iggy_binary_protocol::requests::users::*;
use iggy_binary_protocol::{
    AckLevel as WireAck, ClientVersionInfo, IGGY_PROTOCOL_VERSION, WireConsumer, WireDecode,
    WireEncode, WireIdentifier, WireName, WireOptions, WirePartitioning, WirePollingStrategy,
};
use proptest::prelude::*;
use std::num::NonZeroU64;
use storage::BatchBuilder;

const CLIENT: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;
const SESSION: u64 = 42;
const MAX: u32 = consensus::header::FRAME_SIZE_MAX_DEFAULT;

/// A request frame exactly as `iggy::vsr::encode_request_header` builds
/// it (the SDK's function is crate-private, so its rules are restated
/// here against the SDK's own header struct).
pub(crate) fn sdk_frame(code: u32, payload: &[u8], session: u64, request: u64) -> Vec<u8> {
    let operation = match code {
        40 | 45 => Operation::Register,
        39 => Operation::Logout,
        _ => Operation::from_command_code(code).unwrap_or(Operation::NonReplicated),
    };
    let (request, session) = match operation {
        Operation::Register => (0, 0),
        _ => (request, session),
    };
    let request_checksum = if operation.is_partition() || operation == Operation::NonReplicated {
        0
    } else {
        u128::from(xxhash_rust::xxh3::xxh3_64(payload))
    };
    let mut reserved = [0u8; 60];
    if operation == Operation::NonReplicated {
        reserved[..4].copy_from_slice(&code.to_le_bytes());
    }
    let header = iggy_binary_protocol::RequestHeader {
        command: WireCommand::Request,
        operation,
        size: (HEADER_SIZE + payload.len()) as u32,
        client: CLIENT,
        request,
        session,
        request_checksum,
        timestamp: 0,
        reserved,
        ..Default::default()
    };
    let mut out = bytemuck::bytes_of(&header).to_vec();
    out.extend_from_slice(payload);
    out
}

fn read_frame(bytes: &[u8]) -> RequestFrame {
    let mut reader = FrameReader::new(MAX);
    reader.push(bytes);
    let frame = reader.next_frame().unwrap().unwrap();
    assert_eq!(reader.buffered(), 0);
    frame
}

fn decode(code: u32, payload: &[u8]) -> ClientCommand {
    let frame = read_frame(&sdk_frame(code, payload, SESSION, 7));
    assert_eq!(frame.command_code().unwrap().code(), code);
    frame.decode_command().unwrap()
}

fn wname(s: &str) -> WireName {
    WireName::new(s).unwrap()
}
fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}
fn wnum(n: u32) -> WireIdentifier {
    WireIdentifier::numeric(n)
}
fn wstr(s: &str) -> WireIdentifier {
    WireIdentifier::named(s).unwrap()
}
fn named(s: &str) -> Identifier {
    Identifier::Name(name(s))
}
fn topic_ref() -> TopicRef {
    TopicRef {
        stream: Identifier::Numeric(3),
        topic: named("orders"),
    }
}
fn group_ref() -> GroupRef {
    GroupRef {
        topic: topic_ref(),
        group: named("readers"),
    }
}

fn sdk_batch_body(partitioning: &WirePartitioning) -> Vec<u8> {
    let messages = [
        RawMessage {
            id: 11,
            origin_timestamp: 1_000,
            headers: None,
            payload: b"hello",
        },
        RawMessage {
            id: 12,
            origin_timestamp: 1_005,
            headers: None,
            payload: b"world!",
        },
    ];
    let mut buf = BytesMut::new();
    SendMessagesEncoder::encode(&mut buf, &wnum(3), &wstr("orders"), partitioning, &messages)
        .unwrap();
    buf.to_vec()
}

/// Every command replog implements, as the SDK encodes it, with the value
/// the decoder must produce.
fn samples() -> Vec<(u32, Vec<u8>, ClientCommand)> {
    use ClientCommand as C;
    let login = LoginRegisterRequest {
        version_info: ClientVersionInfo {
            protocol_version: IGGY_PROTOCOL_VERSION,
            sdk_name: wname("rust-sdk"),
            sdk_version: wname("0.11.0"),
        },
        username: wname("iggy"),
        password: secrecy::SecretString::from("secret".to_owned()),
        client_context: None,
    };
    let poll = PollMessagesRequest {
        consumer: WireConsumer::consumer_group(wstr("readers")),
        stream_id: wnum(3),
        topic_id: wstr("orders"),
        partition_id: Some(1),
        strategy: WirePollingStrategy::next(),
        count: 100,
        auto_commit: true,
    };
    let key = ConsumerOffsetKey {
        consumer: Consumer {
            kind: ConsumerKind::Consumer,
            id: Identifier::Numeric(9),
        },
        topic: topic_ref(),
        partition: Some(PartitionId(1)),
    };
    let batch_body = sdk_batch_body(&WirePartitioning::PartitionId(1));
    let batch_start = batch_body.len() - (256 + 2 * 48 + 11);
    vec![
        (1, PingRequest.to_bytes().to_vec(), C::Ping),
        (
            12,
            GetClusterMetadataRequest.to_bytes().to_vec(),
            C::GetClusterMetadata,
        ),
        (20, GetMeRequest.to_bytes().to_vec(), C::GetMe),
        (39, LogoutUserRequest.to_bytes().to_vec(), C::Logout),
        (
            40,
            login.to_bytes().to_vec(),
            C::LoginRegister(LoginRegister {
                protocol_version: PROTOCOL_VERSION,
                sdk_name: name("rust-sdk"),
                sdk_version: name("0.11.0"),
                username: name("iggy"),
                password: "secret".to_owned(),
                client_context: Vec::new(),
            }),
        ),
        (
            100,
            poll.to_bytes().to_vec(),
            C::PollMessages(PollMessages {
                consumer: Consumer {
                    kind: ConsumerKind::ConsumerGroup,
                    id: named("readers"),
                },
                topic: topic_ref(),
                partition: Some(PartitionId(1)),
                strategy: PollingStrategy::Next,
                count: 100,
                auto_commit: true,
            }),
        ),
        (
            101,
            batch_body.clone(),
            C::SendMessages(SendMessages {
                topic: topic_ref(),
                partitioning: Partitioning::PartitionId(PartitionId(1)),
                messages_count: 2,
                batch: Bytes::copy_from_slice(&batch_body[batch_start..]),
                producer_key: 0,
                replay: false,
                replay_age_ms: 0,
            }),
        ),
        (
            102,
            FlushUnsavedBufferRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partition_id: 2,
                fsync: true,
            }
            .to_bytes()
            .to_vec(),
            C::FlushUnsavedBuffer(FlushUnsavedBuffer {
                topic: topic_ref(),
                partition: PartitionId(2),
                fsync: true,
            }),
        ),
        (
            120,
            GetConsumerOffsetRequest {
                consumer: WireConsumer::consumer(wnum(9)),
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partition_id: Some(1),
            }
            .to_bytes()
            .to_vec(),
            C::GetConsumerOffset(key.clone()),
        ),
        (
            121,
            StoreConsumerOffsetRequest {
                consumer: WireConsumer::consumer(wnum(9)),
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partition_id: Some(1),
                offset: 77,
                ack: WireAck::Quorum,
            }
            .to_bytes()
            .to_vec(),
            C::StoreConsumerOffset(StoreConsumerOffset {
                key: key.clone(),
                offset: Offset(77),
                ack: AckLevel::Quorum,
            }),
        ),
        (
            122,
            DeleteConsumerOffsetRequest {
                consumer: WireConsumer::consumer(wnum(9)),
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partition_id: Some(1),
                ack: WireAck::NoAck,
            }
            .to_bytes()
            .to_vec(),
            C::DeleteConsumerOffset(DeleteConsumerOffset {
                key,
                ack: AckLevel::NoAck,
            }),
        ),
        (
            200,
            GetStreamRequest {
                stream_id: wstr("s"),
            }
            .to_bytes()
            .to_vec(),
            C::GetStream(named("s")),
        ),
        (201, GetStreamsRequest.to_bytes().to_vec(), C::GetStreams),
        (
            202,
            CreateStreamRequest {
                name: wname("s"),
                options: WireOptions::empty(),
            }
            .to_bytes()
            .to_vec(),
            C::CreateStream(CreateStream {
                name: name("s"),
                options: Options::default(),
            }),
        ),
        (
            203,
            DeleteStreamRequest { stream_id: wnum(3) }
                .to_bytes()
                .to_vec(),
            C::DeleteStream(Identifier::Numeric(3)),
        ),
        (
            204,
            UpdateStreamRequest {
                stream_id: wnum(3),
                name: wname("renamed"),
                options: WireOptions::empty(),
            }
            .to_bytes()
            .to_vec(),
            C::UpdateStream(UpdateStream {
                stream: Identifier::Numeric(3),
                name: name("renamed"),
                options: Options::default(),
            }),
        ),
        (
            205,
            PurgeStreamRequest { stream_id: wnum(3) }
                .to_bytes()
                .to_vec(),
            C::PurgeStream(Identifier::Numeric(3)),
        ),
        (
            300,
            GetTopicRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
            }
            .to_bytes()
            .to_vec(),
            C::GetTopic(topic_ref()),
        ),
        (
            301,
            GetTopicsRequest { stream_id: wnum(3) }.to_bytes().to_vec(),
            C::GetTopics(Identifier::Numeric(3)),
        ),
        (
            302,
            CreateTopicRequest {
                stream_id: wnum(3),
                partitions_count: 2,
                name: wname("orders"),
                options: WireOptions::empty(),
            }
            .to_bytes()
            .to_vec(),
            C::CreateTopic(CreateTopic {
                stream: Identifier::Numeric(3),
                partitions_count: 2,
                name: name("orders"),
                options: Options::default(),
            }),
        ),
        (
            303,
            DeleteTopicRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
            }
            .to_bytes()
            .to_vec(),
            C::DeleteTopic(topic_ref()),
        ),
        (
            304,
            UpdateTopicRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                name: wname("orders2"),
                options: WireOptions::empty(),
            }
            .to_bytes()
            .to_vec(),
            C::UpdateTopic(UpdateTopic {
                topic: topic_ref(),
                name: name("orders2"),
                options: Options::default(),
            }),
        ),
        (
            305,
            PurgeTopicRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
            }
            .to_bytes()
            .to_vec(),
            C::PurgeTopic(topic_ref()),
        ),
        (
            402,
            CreatePartitionsRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partitions_count: 4,
            }
            .to_bytes()
            .to_vec(),
            C::CreatePartitions(PartitionsChange {
                topic: topic_ref(),
                count: 4,
            }),
        ),
        (
            403,
            DeletePartitionsRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                partitions_count: 1,
            }
            .to_bytes()
            .to_vec(),
            C::DeletePartitions(PartitionsChange {
                topic: topic_ref(),
                count: 1,
            }),
        ),
        (
            600,
            GetConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                group_id: wstr("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::GetConsumerGroup(group_ref()),
        ),
        (
            601,
            GetConsumerGroupsRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
            }
            .to_bytes()
            .to_vec(),
            C::GetConsumerGroups(topic_ref()),
        ),
        (
            602,
            CreateConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                name: wname("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::CreateConsumerGroup(CreateConsumerGroup {
                topic: topic_ref(),
                name: name("readers"),
            }),
        ),
        (
            603,
            DeleteConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                group_id: wstr("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::DeleteConsumerGroup(group_ref()),
        ),
        (
            604,
            JoinConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                group_id: wstr("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::JoinConsumerGroup(group_ref()),
        ),
        (
            605,
            LeaveConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                group_id: wstr("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::LeaveConsumerGroup(group_ref()),
        ),
        (
            606,
            SyncConsumerGroupRequest {
                stream_id: wnum(3),
                topic_id: wstr("orders"),
                group_id: wstr("readers"),
            }
            .to_bytes()
            .to_vec(),
            C::SyncConsumerGroup(group_ref()),
        ),
        // replog's admin command has no SDK request type: its body is empty.
        (
            common::admin::REPLOG_STATUS_CODE,
            Vec::new(),
            C::ReplogStatus,
        ),
    ]
}

#[test]
fn given_a_status_request_with_a_body_when_decoded_should_refuse_it() {
    let body = bytes::Bytes::from_static(b"x");
    assert!(decode_body(CommandCode::ReplogStatus, &body).is_err());
}

#[test]
fn given_every_sdk_request_when_decoded_should_yield_the_values_it_encoded() {
    let samples = samples();
    let implemented: Vec<_> = CommandCode::ALL
        .iter()
        .filter(|c| c.implemented())
        .collect();
    assert_eq!(
        samples.len(),
        implemented.len(),
        "one sample per implemented command"
    );
    for (code, payload, expected) in samples {
        assert_eq!(decode(code, &payload), expected, "code {code}");
    }
}

#[test]
fn given_an_sdk_header_when_read_should_carry_its_fields() {
    let frame = read_frame(&sdk_frame(202, b"\x01s", SESSION, 7));
    let h = frame.header;
    assert_eq!(h.client, CLIENT);
    assert_eq!(h.session, SESSION);
    assert_eq!(h.request, 7);
    assert_eq!(h.operation, 128);
    assert_eq!(h.legacy_command, 0);
    assert_eq!(
        h.request_checksum,
        u128::from(xxhash_rust::xxh3::xxh3_64(b"\x01s"))
    );
    let ping = read_frame(&sdk_frame(1, &[], 0, 0));
    assert_eq!((ping.header.operation, ping.header.legacy_command), (2, 1));
    let login = read_frame(&sdk_frame(40, b"x", 9, 9));
    assert_eq!((login.header.session, login.header.request), (0, 0));
}

#[test]
fn given_a_body_that_does_not_match_its_request_checksum_when_decoded_should_refuse_it() {
    let mut bytes = sdk_frame(202, b"\x01s", SESSION, 7);
    let last = bytes.len() - 1;
    bytes[last] = b't';
    let err = read_frame(&bytes).decode_command().unwrap_err();
    assert!(
        matches!(err, PayloadError::RequestChecksumMismatch { .. }),
        "{err}"
    );
    assert_eq!(ErrorCode::from(&err), ErrorCode::InvalidFormat);
    // Unstamped requests (partition and non-replicated ops) are not checked.
    let mut send = sdk_frame(
        101,
        &sdk_batch_body(&WirePartitioning::PartitionId(0)),
        SESSION,
        7,
    );
    assert_eq!(&send[144..160], &[0; 16]);
    send[HEADER_SIZE + 6] ^= 1; // a byte of the stream id: a different value
    assert!(read_frame(&send).decode_command().is_ok());
}

#[test]
fn given_unimplemented_and_unknown_codes_when_decoded_should_be_told_apart() {
    let stats = read_frame(&sdk_frame(10, &[], SESSION, 1));
    assert_eq!(
        stats.decode_command().unwrap(),
        ClientCommand::Unimplemented(CommandCode::GetStats)
    );
    let unknown = read_frame(&sdk_frame(9999, &[], SESSION, 1));
    let err = unknown.decode_command().unwrap_err();
    assert_eq!(ErrorCode::from(&err), ErrorCode::InvalidCommand);
    let user = read_frame(&sdk_frame(33, b"anything", SESSION, 1));
    assert_eq!(
        user.decode_command().unwrap(),
        ClientCommand::Unimplemented(CommandCode::CreateUser)
    );
}

#[test]
fn given_every_strict_prefix_of_a_body_when_decoded_should_refuse_it() {
    for (code, payload, _) in samples() {
        let code = CommandCode::from_code(code).unwrap();
        for cut in 0..payload.len() {
            let body = Bytes::copy_from_slice(&payload[..cut]);
            assert!(
                decode_body(code, &body).is_err(),
                "{code} accepted a {cut}-byte prefix of {} bytes",
                payload.len()
            );
        }
    }
}

#[test]
fn given_every_strict_prefix_of_a_frame_when_the_stream_ends_should_report_a_cut_frame() {
    for (code, payload, _) in samples() {
        let frame = sdk_frame(code, &payload, SESSION, 1);
        for cut in 1..frame.len() {
            let mut reader = FrameReader::new(MAX);
            reader.push(&frame[..cut]);
            assert_eq!(reader.next_frame().unwrap(), None, "code {code} cut {cut}");
            let err = reader.finish().unwrap_err();
            assert!(matches!(err, FrameError::Truncated { received, .. } if received == cut));
        }
    }
}

#[test]
fn given_frames_fed_byte_by_byte_when_read_should_come_out_whole_and_in_order() {
    let a = sdk_frame(1, &[], 0, 0);
    let b = sdk_frame(202, b"\x01s", SESSION, 2);
    let mut reader = FrameReader::new(MAX);
    let mut got = Vec::new();
    for byte in a.iter().chain(b.iter()) {
        assert!(reader.wanted() >= 1);
        reader.push(std::slice::from_ref(byte));
        while let Some(f) = reader.next_frame().unwrap() {
            got.push(f.bytes.to_vec());
        }
    }
    assert_eq!(got, vec![a, b]);
    reader.finish().unwrap();
}

#[test]
fn given_a_size_past_the_ceiling_when_its_four_bytes_arrive_should_refuse_before_buffering() {
    let mut frame = sdk_frame(1, &[], 0, 0);
    frame[48..52].copy_from_slice(&(MAX + 1).to_le_bytes());
    let mut reader = FrameReader::new(MAX);
    reader.push(&frame[..52]);
    assert_eq!(
        reader.next_frame().unwrap_err(),
        FrameError::SizeAboveMax {
            size: MAX + 1,
            max: MAX
        }
    );
    let mut small = sdk_frame(1, &[], 0, 0);
    small[48..52].copy_from_slice(&100u32.to_le_bytes());
    let mut reader = FrameReader::new(MAX);
    reader.push(&small[..52]);
    assert_eq!(
        reader.next_frame().unwrap_err(),
        FrameError::SizeBelowHeader { size: 100 }
    );
}

#[test]
fn given_garbage_when_read_should_refuse_it_as_not_a_request() {
    // A plausible size but a reply's command byte, then pure text.
    let mut reply_like = sdk_frame(1, &[], 0, 0);
    reply_like[60] = 8;
    let mut reader = FrameReader::new(MAX);
    reader.push(&reply_like);
    assert_eq!(
        reader.next_frame().unwrap_err(),
        FrameError::NotARequest { command: 8 }
    );
    let mut reader = FrameReader::new(MAX);
    reader.push(&[b'G'; 300]);
    assert!(reader.next_frame().is_err());
    // A request header with a nonzero reserved byte.
    let mut reserved = sdk_frame(1, &[], 0, 0);
    reserved[100] = 1;
    let mut reader = FrameReader::new(MAX);
    reader.push(&reserved);
    assert!(matches!(reader.next_frame(), Err(FrameError::Header(_))));
}

#[test]
fn given_every_single_bit_flip_of_a_send_batch_when_decoded_should_refuse_it() {
    // Every byte of the batch is covered by the batch checksum (header
    // fields, frame checksums), a frame checksum (frame bytes) or a
    // must-be-zero rule (reserved bytes), so no flip inside it may pass.
    // Flips in the metadata before it change a value or break the layout.
    let payload = sdk_batch_body(&WirePartitioning::PartitionId(1));
    let batch_start = payload.len() - (256 + 2 * 48 + 11);
    let original = decode_body(CommandCode::SendMessages, &Bytes::from(payload.clone())).unwrap();
    for i in 0..payload.len() {
        for bit in 0..8 {
            let mut flipped = payload.clone();
            flipped[i] ^= 1 << bit;
            let got = decode_body(CommandCode::SendMessages, &Bytes::from(flipped));
            if i >= batch_start {
                assert!(
                    got.is_err(),
                    "batch byte {} bit {bit} passed",
                    i - batch_start
                );
            } else if let Ok(c) = got {
                assert_ne!(c, original, "metadata byte {i} bit {bit}");
            }
        }
    }
}

#[test]
fn given_bad_primitives_when_decoded_should_refuse_each_with_its_own_error() {
    let body = |b: &[u8]| Bytes::copy_from_slice(b);
    // Numeric identifier of 3 bytes, string identifier of 0, unknown kind.
    for (bytes, want) in [
        (&b"\x01\x03abc"[..], ErrorCode::InvalidIdentifier),
        (&b"\x02\x00"[..], ErrorCode::InvalidIdentifier),
        (&b"\x07\x04abcd"[..], ErrorCode::InvalidFormat),
        (&b"\x02\x02\xff\xfe"[..], ErrorCode::InvalidFormat),
    ] {
        let err = decode_body(CommandCode::GetStream, &body(bytes)).unwrap_err();
        assert_eq!(ErrorCode::from(&err), want, "{err}");
    }
    // A zero-length stream name, a zero-length topic name.
    let err = decode_body(CommandCode::CreateStream, &body(b"\x00")).unwrap_err();
    assert_eq!(ErrorCode::from(&err), ErrorCode::InvalidStreamName);
    let err = decode_body(
        CommandCode::CreateTopic,
        &body(b"\x01\x04\x00\x00\x00\x00\x01\x00\x00\x00\x00"),
    )
    .unwrap_err();
    assert_eq!(ErrorCode::from(&err), ErrorCode::InvalidTopicName);
    // Trailing bytes after a fixed-shape body.
    let err = decode_body(
        CommandCode::DeleteStream,
        &body(b"\x01\x04\x00\x00\x00\x00!"),
    )
    .unwrap_err();
    assert_eq!(err, PayloadError::TrailingBytes { len: 1 });
    // A partition flag of 2.
    let mut poll = PollMessagesRequest {
        consumer: WireConsumer::consumer(wnum(1)),
        stream_id: wnum(1),
        topic_id: wnum(1),
        partition_id: Some(0),
        strategy: WirePollingStrategy::first(),
        count: 1,
        auto_commit: false,
    }
    .to_bytes()
    .to_vec();
    poll[7 + 6 + 6] = 2;
    let err = decode_body(CommandCode::PollMessages, &body(&poll)).unwrap_err();
    assert!(matches!(err, PayloadError::InvalidFlag { .. }), "{err}");
}

#[test]
fn given_options_when_decoded_should_keep_pairs_and_refuse_bad_blocks() {
    let mut block = Vec::new();
    for (k, v) in [("durability", "quorum"), ("compression_algorithm", "none")] {
        block.push(2);
        block.extend_from_slice(&(k.len() as u32).to_le_bytes());
        block.extend_from_slice(k.as_bytes());
        block.push(2);
        block.extend_from_slice(&(v.len() as u32).to_le_bytes());
        block.extend_from_slice(v.as_bytes());
    }
    // The SDK's own validator agrees the block is good.
    assert_eq!(iggy_binary_protocol::validate_options(&block).unwrap(), 2);
    let options = Options::decode(&block).unwrap();
    assert_eq!(options.entries.len(), 2);
    assert_eq!(options.entries[0].key, "durability");
    assert_eq!(options.entries[0].value, b"quorum");
    let mut twice = block.clone();
    twice.extend_from_slice(&block[..block.len() / 2 + 7]);
    assert!(Options::decode(&twice).is_err());
    let mut dup = block.clone();
    dup.extend_from_slice(&block);
    assert!(Options::decode(&dup).is_err());
    let mut int_key = block.clone();
    int_key[0] = 9;
    assert!(Options::decode(&int_key).is_err());
}

#[test]
fn given_a_send_whose_counts_disagree_when_decoded_should_refuse_it() {
    let mut payload = sdk_batch_body(&WirePartitioning::PartitionId(0));
    // metadata_length (u32 at 0) = 6 + 8 + 6 + 4; messages_count follows it.
    let count_at = 4 + 6 + 8 + 6;
    payload[count_at..count_at + 4].copy_from_slice(&3u32.to_le_bytes());
    let err = decode_body(CommandCode::SendMessages, &Bytes::from(payload.clone())).unwrap_err();
    assert_eq!(
        err,
        PayloadError::MessagesCountMismatch {
            declared: 3,
            batch: 2
        }
    );
    payload[0..4].copy_from_slice(&99u32.to_le_bytes());
    let err = decode_body(CommandCode::SendMessages, &Bytes::from(payload)).unwrap_err();
    assert!(matches!(
        err,
        PayloadError::MetadataLengthMismatch { declared: 99, .. }
    ));
}

#[test]
fn given_a_send_with_a_bad_checksum_when_decoded_should_name_the_checksum_code() {
    let mut payload = sdk_batch_body(&WirePartitioning::PartitionId(0));
    let last = payload.len() - 1;
    payload[last] ^= 0xff; // the last payload byte: its message checksum breaks
    let err = decode_body(CommandCode::SendMessages, &Bytes::from(payload)).unwrap_err();
    assert_eq!(ErrorCode::from(&err), ErrorCode::InvalidMessageChecksum);
}

#[test]
fn given_other_sdk_partitionings_when_decoded_should_accept_balanced_and_key() {
    let balanced = sdk_batch_body(&WirePartitioning::Balanced);
    let ClientCommand::SendMessages(s) =
        decode_body(CommandCode::SendMessages, &Bytes::from(balanced)).unwrap()
    else {
        panic!("not a send")
    };
    assert_eq!(s.partitioning, Partitioning::Balanced);
    let keyed = sdk_batch_body(&WirePartitioning::messages_key(b"k1".to_vec()).unwrap());
    let ClientCommand::SendMessages(s) =
        decode_body(CommandCode::SendMessages, &Bytes::from(keyed)).unwrap()
    else {
        panic!("not a send")
    };
    assert_eq!(s.partitioning, Partitioning::MessagesKey(b"k1".to_vec()));
}

// ---------------------------------------------------------------- replies

/// The body the SDK hands to its decoders, or the error code it raises:
/// `iggy::vsr::decode_response_split` and `split_metadata_result`, restated.
pub(crate) fn sdk_reply(frame: &[u8]) -> Result<Vec<u8>, u32> {
    use iggy_binary_protocol::ReplyHeader as R;
    let header: &[u8; HEADER_SIZE] = frame[..HEADER_SIZE].try_into().unwrap();
    assert_eq!(header[60], WireCommand::Reply as u8, "not a reply");
    let size = iggy_binary_protocol::read_size_field(header).unwrap() as usize;
    assert_eq!(size, frame.len(), "size covers exactly the frame");
    let at = std::mem::offset_of!(R, status);
    let status = u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    if status != 0 {
        assert_eq!(
            size, HEADER_SIZE,
            "an error status comes with an empty body"
        );
        return Err(status);
    }
    let at = std::mem::offset_of!(R, operation);
    let operation: Operation = *bytemuck::checked::try_from_bytes(&header[at..=at])
        .expect("the SDK accepts the operation byte");
    let body = &frame[HEADER_SIZE..];
    let framed =
        operation.is_result_framed() || (operation == Operation::Register && !body.is_empty());
    if !framed {
        return Ok(body.to_vec());
    }
    match iggy_binary_protocol::result_code(body) {
        Some(0) => Ok(body[iggy_binary_protocol::result_section_len(body).unwrap()..].to_vec()),
        Some(code) => Err(code),
        None => panic!("malformed result section"),
    }
}

fn request(code: u32) -> RequestHeader {
    read_frame(&sdk_frame(code, &[], SESSION, 5)).header
}

fn stream_info() -> StreamInfo {
    StreamInfo {
        id: StreamId(4),
        created_at_micros: 99,
        topics_count: 1,
        size_bytes: 10,
        messages_count: 2,
        name: name("s"),
    }
}

fn topic_info() -> TopicInfo {
    TopicInfo {
        id: TopicId(2),
        created_at_micros: 5,
        partitions_count: 2,
        message_expiry_micros: u64::MAX,
        compression: Compression::Gzip,
        max_topic_size_bytes: 0,
        size_bytes: 1,
        messages_count: 3,
        name: name("t"),
    }
}

fn partition(i: u32) -> PartitionInfo {
    PartitionInfo {
        id: PartitionId(i),
        created_at_micros: 7,
        segments_count: 1,
        current_offset: Offset(9),
        size_bytes: 100,
        messages_count: 10,
    }
}

#[test]
fn given_stream_and_topic_records_when_the_sdk_decodes_them_should_read_our_values() {
    use iggy_binary_protocol::responses::streams::get_stream::GetStreamResponse;
    use iggy_binary_protocol::responses::streams::get_streams::GetStreamsResponse;
    use iggy_binary_protocol::responses::topics::get_topic::GetTopicResponse;
    use iggy_binary_protocol::responses::topics::get_topics::GetTopicsResponse;
    let details = StreamDetails {
        stream: stream_info(),
        topics: vec![topic_info()],
    };
    let (got, used) = GetStreamResponse::decode(&details.to_bytes()).unwrap();
    assert_eq!(used, details.to_bytes().len());
    assert_eq!((got.stream.id, got.stream.name.as_str()), (4, "s"));
    assert_eq!(got.topics.len(), 1);
    assert_eq!(got.topics[0].compression_algorithm, 2);
    // The SDK's own conversion (compression range, etc.) accepts it.
    let sdk = iggy::prelude::StreamDetails::try_from(got).unwrap();
    assert_eq!(sdk.topics_count, 1);

    let list = StreamList(vec![stream_info(), stream_info()]);
    let got = GetStreamsResponse::decode(&list.to_bytes()).unwrap().0;
    assert_eq!(got.streams.len(), 2);

    let topic = TopicDetails {
        topic: topic_info(),
        partitions: vec![partition(0), partition(1)],
    };
    let bytes = topic.to_bytes();
    let (got, used) = GetTopicResponse::decode(&bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(got.partitions.len(), 2);
    assert_eq!(got.partitions[1].id, 1);
    assert_eq!(got.partitions[1].current_offset, 9);
    let sdk = iggy::prelude::TopicDetails::try_from(got).unwrap();
    assert_eq!(sdk.partitions_count, 2);

    let topics = TopicList(vec![topic_info()]);
    let got = GetTopicsResponse::decode(&topics.to_bytes()).unwrap().0;
    assert_eq!(got.topics[0].name.as_str(), "t");
}

#[test]
fn given_group_offset_and_assignment_records_when_the_sdk_decodes_them_should_read_our_values() {
    use iggy_binary_protocol::responses::consumer_groups::get_consumer_group::ConsumerGroupDetailsResponse;
    use iggy_binary_protocol::responses::consumer_groups::get_consumer_groups::GetConsumerGroupsResponse;
    use iggy_binary_protocol::responses::consumer_groups::sync_consumer_group::SyncConsumerGroupResponse;
    use iggy_binary_protocol::responses::consumer_offsets::get_consumer_offset::ConsumerOffsetResponse;
    let info = ConsumerGroupInfo {
        id: ConsumerGroupId(1),
        partitions_count: 3,
        members_count: 0,
        name: name("g"),
    };
    let details = ConsumerGroupDetails {
        group: info.clone(),
        members: vec![
            ConsumerGroupMember {
                id: MemberId(5),
                partitions: vec![PartitionId(0), PartitionId(2)],
            },
            ConsumerGroupMember {
                id: MemberId(6),
                partitions: vec![PartitionId(1)],
            },
        ],
    };
    let got = ConsumerGroupDetailsResponse::decode(&details.to_bytes())
        .unwrap()
        .0;
    assert_eq!(got.group.members_count, 2);
    assert_eq!(got.members[0].partitions, vec![0, 2]);
    let got =
        GetConsumerGroupsResponse::decode(&ConsumerGroupList(vec![info.clone(), info]).to_bytes())
            .unwrap()
            .0;
    assert_eq!(got.groups.len(), 2);
    let offset = ConsumerOffsetInfo {
        partition_id: PartitionId(1),
        current_offset: Offset(10),
        stored_offset: Offset(4),
    };
    let got = ConsumerOffsetResponse::decode(&offset.to_bytes())
        .unwrap()
        .0;
    assert_eq!(
        (got.partition_id, got.current_offset, got.stored_offset),
        (1, 10, 4)
    );
    let assignment = GroupAssignment {
        generation: 3,
        partitions: vec![],
    };
    let bytes = assignment.to_bytes();
    assert_eq!(
        bytes.len(),
        12,
        "a member with no partitions still gets a record"
    );
    let got = SyncConsumerGroupResponse::decode(&bytes).unwrap().0;
    assert_eq!((got.generation, got.partitions.len()), (3, 0));
}

#[test]
fn given_send_poll_login_metadata_and_me_records_when_the_sdk_decodes_them_should_read_our_values()
{
    use iggy_binary_protocol::responses::clients::get_client::ClientDetailsResponse;
    use iggy_binary_protocol::responses::messages::poll_messages::PollMessagesResponse;
    use iggy_binary_protocol::responses::messages::send_messages::SendMessagesResponse;
    use iggy_binary_protocol::responses::system::get_cluster_metadata::ClusterMetadataResponse;
    use iggy_binary_protocol::responses::users::login_register::LoginRegisterResponse;
    let confirmation = SendConfirmation {
        stream_id: StreamId(1),
        topic_id: TopicId(2),
        partition_id: PartitionId(3),
        base_offset: Offset(40),
    };
    let got = SendMessagesResponse::decode(&confirmation.to_bytes())
        .unwrap()
        .0;
    assert_eq!(got.confirmations.len(), 1);
    assert_eq!(got.confirmations[0].base_offset, 40);

    let mut b = BatchBuilder::new(1_000);
    b.push(1, 0, b"a", b"").push(2, 3, b"bb", b"");
    let batch = Bytes::from(b.build_stamped(3, 40, 5_000).unwrap());
    let polled = PolledMessages::new(PartitionId(3), Offset(41), vec![batch]).unwrap();
    let bytes = polled.to_bytes();
    let got = PollMessagesResponse::decode(&bytes).unwrap();
    assert_eq!(got.header.messages_count, 2);
    assert_eq!(got.header.partition_id, 3);
    let messages: Vec<_> = got.messages.map(Result::unwrap).collect();
    assert_eq!(messages.len(), 2);
    assert_eq!((messages[1].offset, messages[1].payload), (41, &b"bb"[..]));
    assert_eq!(messages[1].timestamp, 5_000);
    assert_eq!(messages[1].origin_timestamp, 1_003);

    let login = LoginResult {
        user_id: UserId(0),
        session: NonZeroU64::new(9).unwrap(),
        server_protocol_version: PROTOCOL_VERSION,
        server_version: name("replog 0.1.0"),
    };
    let got = LoginRegisterResponse::decode(&login.to_bytes()).unwrap().0;
    assert_eq!(
        (got.session, got.server_version.as_str()),
        (9, "replog 0.1.0")
    );

    let meta = ClusterMetadata {
        name: String::new(),
        node: ClusterNode {
            name: "r0".to_owned(),
            ip: "127.0.0.1".to_owned(),
            tcp_port: 8090,
            quic_port: 0,
            http_port: 0,
            websocket_port: 0,
            role: NodeRole::Leader,
            status: NodeStatus::Healthy,
        },
    };
    let got = ClusterMetadataResponse::decode(&meta.to_bytes()).unwrap().0;
    assert_eq!(got.nodes.len(), 1);
    assert_eq!(
        (
            got.nodes[0].tcp_port,
            got.nodes[0].role,
            got.nodes[0].status
        ),
        (8090, 0, 0)
    );
    let sdk = iggy::prelude::ClusterMetadata::try_from(got).unwrap();
    assert_eq!(sdk.nodes.len(), 1);

    let me = ClientDetails {
        client_id: 7,
        user_id: Some(UserId(0)),
        address: "127.0.0.1:5555".to_owned(),
        consumer_groups: vec![JoinedGroup {
            stream: StreamId(1),
            topic: TopicId(2),
            group: ConsumerGroupId(3),
        }],
    };
    let got = ClientDetailsResponse::decode(&me.to_bytes()).unwrap().0;
    assert_eq!(got.client.client_id, 7);
    assert_eq!(got.client.transport, 1);
    assert_eq!(got.consumer_groups[0].group_id, 3);
}

#[test]
fn given_each_outcome_when_framed_should_be_split_by_the_sdk_as_intended() {
    // Result-framed (create stream, 128): payload after `u32 0`.
    let payload = StreamDetails {
        stream: stream_info(),
        topics: vec![],
    }
    .to_bytes();
    let frame = encode_reply(&request(202), Outcome::Ok(&payload));
    assert_eq!(&frame[HEADER_SIZE..HEADER_SIZE + 4], &[0, 0, 0, 0]);
    assert_eq!(sdk_reply(&frame).unwrap(), payload);
    // Result-framed rejection: count 1, index 0, code; status 0.
    let frame = encode_reply(
        &request(202),
        Outcome::Rejected(ErrorCode::StreamNameAlreadyExists),
    );
    assert_eq!(frame.len(), HEADER_SIZE + 12);
    assert_eq!(sdk_reply(&frame), Err(1012));
    // Not result-framed (get stream, 2): the payload bare; a rejection in status.
    let frame = encode_reply(&request(200), Outcome::Ok(&payload));
    assert_eq!(sdk_reply(&frame).unwrap(), payload);
    let frame = encode_reply(
        &request(200),
        Outcome::Rejected(ErrorCode::StreamIdNotFound),
    );
    assert_eq!(sdk_reply(&frame), Err(1009));
    // "Not found" is an empty body with status 0.
    let frame = encode_reply(&request(200), Outcome::Ok(&[]));
    assert_eq!(sdk_reply(&frame).unwrap(), Vec::<u8>::new());
    // A denial is always a status with an empty body, even when result-framed.
    let frame = encode_reply(&request(121), Outcome::Denied(ErrorCode::Unauthenticated));
    assert_eq!(frame.len(), HEADER_SIZE);
    assert_eq!(sdk_reply(&frame), Err(40));
    // Store consumer offset (161) succeeds with just the prefix.
    let frame = encode_reply(&request(121), Outcome::Ok(&[]));
    assert_eq!(&frame[HEADER_SIZE..], &[0, 0, 0, 0]);
    // Send (160) and logout (3) are bare.
    let frame = encode_reply(&request(101), Outcome::Ok(&[1, 2]));
    assert_eq!(&frame[HEADER_SIZE..], &[1, 2]);
    let frame = encode_reply(&request(39), Outcome::Ok(&[]));
    assert_eq!(frame.len(), HEADER_SIZE);
    // A login is result-framed because its body is not empty.
    let frame = encode_reply(&request(40), Outcome::Ok(&[5; 20]));
    assert_eq!(&frame[HEADER_SIZE..HEADER_SIZE + 4], &[0, 0, 0, 0]);
    assert_eq!(sdk_reply(&frame).unwrap(), vec![5; 20]);
}

#[test]
fn given_a_reply_when_encoded_should_match_the_sdk_header_struct_byte_for_byte() {
    let req = read_frame(&sdk_frame(202, b"\x01s", SESSION, 5)).header;
    let frame = encode_reply(&req, Outcome::Denied(ErrorCode::FeatureUnavailable));
    let expected = iggy_binary_protocol::ReplyHeader {
        size: HEADER_SIZE as u32,
        command: WireCommand::Reply,
        request_checksum: req.request_checksum,
        client: CLIENT,
        request: 5,
        operation: Operation::CreateStream,
        status: 5,
        ..Default::default()
    };
    assert_eq!(frame, bytemuck::bytes_of(&expected));
}

#[test]
fn given_an_eviction_when_encoded_should_match_the_sdk_header_struct_byte_for_byte() {
    use iggy_binary_protocol::{EvictionHeader, EvictionReason as W};
    let got = encode_eviction(CLIENT, EvictionReason::InvalidCredentials, VERSION_WINDOW);
    let want = EvictionHeader::new(0, 0, 0, CLIENT, W::InvalidCredentials);
    assert_eq!(&got[..], bytemuck::bytes_of(&want));
    let got = encode_eviction(CLIENT, EvictionReason::IncompatibleProtocol, VERSION_WINDOW);
    let want = EvictionHeader::incompatible_protocol(
        0,
        0,
        0,
        CLIENT,
        iggy_binary_protocol::IGGY_PROTOCOL_VERSION,
        iggy_binary_protocol::IGGY_PROTOCOL_VERSION_MIN,
    );
    assert_eq!(&got[..], bytemuck::bytes_of(&want));
}

// ------------------------------------------------ golden bytes from the doc

#[test]
fn given_the_documented_offsets_when_a_ping_is_written_by_hand_should_decode() {
    // client_protocol.md §2.1–2.2: size at 48, command 5 at 60, client at
    // 128, operation at 176, legacy code at 196; everything else zero.
    let mut frame = [0u8; HEADER_SIZE];
    frame[48..52].copy_from_slice(&256u32.to_le_bytes());
    frame[60] = 5;
    frame[128..144].copy_from_slice(&1u128.to_le_bytes());
    frame[176] = 2;
    frame[196..200].copy_from_slice(&1u32.to_le_bytes());
    let f = read_frame(&frame);
    assert_eq!(f.decode_command().unwrap(), ClientCommand::Ping);
    assert_eq!(f.header.session, 0);
}

#[test]
fn given_the_documented_reply_offsets_when_a_reply_is_encoded_should_put_fields_there() {
    // §2.3: size at 48, command 8 at 60, operation at 208, status at 216.
    let frame = encode_reply(&request(200), Outcome::Denied(ErrorCode::Unauthenticated));
    assert_eq!(&frame[48..52], &256u32.to_le_bytes());
    assert_eq!(frame[60], 8);
    assert_eq!(frame[208], 2);
    assert_eq!(&frame[216..220], &40u32.to_le_bytes());
    assert_eq!(&frame[160..176], &CLIENT.to_le_bytes(), "client echoed");
    // §2.4: eviction reason at 255, command 13, size 256.
    let ev = encode_eviction(CLIENT, EvictionReason::MalformedLogin, VERSION_WINDOW);
    assert_eq!((ev[60], ev[255]), (13, 15));
    assert_eq!(&ev[48..52], &256u32.to_le_bytes());
}

#[test]
fn given_the_documented_version_packing_should_match_0_11_0() {
    // §4: "0.11.0 packs to 0x2C00" = 11264.
    assert_eq!(PROTOCOL_VERSION, 0x2C00);
    assert_eq!(PROTOCOL_VERSION, 11264);
    assert_eq!(
        PROTOCOL_VERSION,
        iggy_binary_protocol::IGGY_PROTOCOL_VERSION
    );
    assert!(protocol_compatible(pack_version(0, 11, 0)));
    assert!(protocol_compatible(pack_version(0, 11, 7)));
    assert!(!protocol_compatible(pack_version(0, 10, 9)));
    assert!(!protocol_compatible(pack_version(0, 12, 0)));
    for v in [0, 11263, 11264, 11265, 12287, 12288, u32::MAX] {
        assert_eq!(
            protocol_compatible(v),
            iggy_binary_protocol::is_protocol_compatible(v),
            "{v}"
        );
    }
}

#[test]
fn given_the_documented_login_body_when_written_by_hand_should_decode() {
    // §6: u32 version, sdk name, sdk version, username, u8-len password,
    // u32 context length.
    let mut body = 11264u32.to_le_bytes().to_vec();
    for s in ["rust-sdk", "0.11.0", "iggy"] {
        body.push(s.len() as u8);
        body.extend_from_slice(s.as_bytes());
    }
    body.push(4);
    body.extend_from_slice(b"iggy");
    body.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(
        decode(40, &body),
        samples()[4].2.clone().with_password("iggy")
    );
}

impl ClientCommand {
    fn with_password(self, password: &str) -> Self {
        match self {
            ClientCommand::LoginRegister(mut l) => {
                l.password = password.to_owned();
                l.username = name("iggy");
                ClientCommand::LoginRegister(l)
            }
            other => other,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn given_random_bytes_when_read_as_frames_should_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let mut reader = FrameReader::new(4096);
        reader.push(&bytes);
        loop {
            match reader.next_frame() {
                Ok(Some(frame)) => { let _ = frame.decode_command(); }
                Ok(None) => { let _ = reader.finish(); break; }
                Err(_) => break,
            }
        }
    }

    #[test]
    fn given_a_valid_header_and_a_random_body_when_decoded_should_return_a_typed_result(
        index in 0usize..54,
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let code = CommandCode::ALL[index % CommandCode::ALL.len()];
        let frame = read_frame(&sdk_frame(code.code(), &body, SESSION, 1));
        let _ = frame.decode_command();
    }

    #[test]
    fn given_a_random_mutation_of_an_sdk_frame_when_decoded_should_never_panic(
        sample in 0usize..33,
        at in any::<proptest::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let all = samples();
        let (code, payload, _) = &all[sample % all.len()];
        let mut frame = sdk_frame(*code, payload, SESSION, 1);
        let i = at.index(frame.len());
        frame[i] = byte;
        let mut reader = FrameReader::new(MAX);
        reader.push(&frame);
        if let Ok(Some(f)) = reader.next_frame() {
            let _ = f.decode_command();
        }
    }
}
