#![allow(clippy::unwrap_used)]

use super::*;
use common::{GroupId, Op};
use proptest::prelude::*;

const MAX: u32 = FRAME_SIZE_MAX_DEFAULT;

fn frame(view: u32, command: CommandHeader) -> FrameHeader {
    FrameHeader {
        checksum: 0,
        checksum_body: 0,
        cluster: 0xC1_u128 << 64 | 7,
        size: 0,
        view,
        replica: ReplicaId(2),
        command,
    }
}

fn prepare_header(op: u64) -> FrameHeader {
    let h = frame(
        3,
        CommandHeader::Prepare(PrepareCommand {
            client: 99,
            parent: 0x1234,
            request_checksum: 5,
            op: Op(op),
            commit: Op(op - 1),
            timestamp: 1_000 + op,
            request: 4,
            operation: 160,
            group: GroupId(42),
            user_id: 1,
        }),
    );
    let mut sealed = h;
    sealed.size = 300;
    sealed.checksum_body = 0xBEEF;
    sealed.checksum = sealed.expected_checksum();
    sealed
}

/// One frame of every command the codec handles, with a body where the
/// command takes one.
fn samples() -> Vec<(FrameHeader, Vec<u8>)> {
    let suffix = encode_prepare_headers(&[prepare_header(9), prepare_header(8)]);
    let manifest = crate::state_manifest::encode_manifest(&[]);
    vec![
        (
            frame(
                0,
                CommandHeader::Request(RequestHeader {
                    client: 77,
                    request_checksum: 0,
                    timestamp: 0,
                    request: 3,
                    operation: 160,
                    session: 11,
                    user_id: 0,
                    legacy_command: 0,
                }),
            ),
            b"send messages".to_vec(),
        ),
        (
            frame(
                0,
                CommandHeader::Reply(ReplyHeader {
                    request_checksum: 1,
                    context: 2,
                    client: 77,
                    op: Op(10),
                    commit: Op(10),
                    timestamp: 123,
                    request: 3,
                    operation: 160,
                    status: 0,
                }),
            ),
            b"ok".to_vec(),
        ),
        (frame(3, prepare_header(9).command), b"batch bytes".to_vec()),
        (
            frame(
                4,
                CommandHeader::RepairPrepare(match prepare_header(9).command {
                    CommandHeader::Prepare(p) => p,
                    _ => unreachable!(),
                }),
            ),
            b"batch bytes".to_vec(),
        ),
        (
            frame(
                3,
                CommandHeader::PrepareOk(PrepareOkHeader {
                    parent: 1,
                    prepare_checksum: 2,
                    op: Op(9),
                    commit: Op(8),
                    timestamp: 5,
                    request: 4,
                    operation: 160,
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                3,
                CommandHeader::Commit(CommitHeader {
                    commit_checksum: 3,
                    timestamp_monotonic: 17,
                    commit: Op(8),
                    checkpoint_op: Op(0),
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::StartViewChange(StartViewChangeHeader { group: GroupId(42) }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::DoViewChange(DoViewChangeHeader {
                    op: Op(9),
                    commit: Op(7),
                    group: GroupId(42),
                    log_view: 3,
                    nack_bitset: 0b01,
                    present_bitset: 0b10,
                }),
            ),
            suffix.clone(),
        ),
        (
            frame(
                4,
                CommandHeader::StartView(StartViewHeader {
                    op: Op(9),
                    commit: Op(7),
                    group: GroupId(42),
                    incarnation: 0xABCD,
                }),
            ),
            suffix.clone(),
        ),
        (
            frame(
                4,
                CommandHeader::RequestStartView(RequestStartViewHeader {
                    group: GroupId(42),
                    incarnation: 5,
                    ..Default::default()
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::RequestPrepares(RequestPreparesHeader {
                    nonce: 6,
                    from_op: Op(3),
                    to_op: Op(130),
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::RepairDone(RepairRangeHeader {
                    nonce: 6,
                    op: Op(130),
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::RangeEvicted(RepairRangeHeader {
                    nonce: 6,
                    op: Op(50),
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::RequestHeaders(RequestHeadersHeader {
                    nonce: 6,
                    from_op: Op(8),
                    to_op: Op(9),
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::Headers(HeadersHeader {
                    nonce: 6,
                    group: GroupId(42),
                }),
            ),
            suffix,
        ),
        (
            frame(
                4,
                CommandHeader::RequestStateTransfer(RequestStateTransferHeader {
                    nonce: 8,
                    group: GroupId(42),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::StateTransferTarget(StateTransferTargetHeader {
                    nonce: 8,
                    commit_op: Op(100),
                    group: GroupId(42),
                    available: true,
                    unavailable_transient: false,
                    commit_max: Op(101),
                }),
            ),
            manifest,
        ),
        (
            frame(
                4,
                CommandHeader::StateTransferTarget(StateTransferTargetHeader {
                    nonce: 8,
                    commit_op: Op(0),
                    group: GroupId(42),
                    available: false,
                    unavailable_transient: true,
                    commit_max: Op(101),
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::RequestStateChunk(RequestStateChunkHeader {
                    nonce: 8,
                    offset: 1 << 20,
                    group: GroupId(42),
                    len: 256 * 1024,
                    artifact: 3,
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::StateChunk(StateChunkHeader {
                    nonce: 8,
                    offset: 1 << 20,
                    group: GroupId(42),
                    artifact: 3,
                }),
            ),
            vec![0x5A; 1000],
        ),
        (
            frame(
                4,
                CommandHeader::RequestStartView(RequestStartViewHeader {
                    group: GroupId(42),
                    incarnation: 7,
                    census: true,
                    census_op: Op(90),
                    census_checksum: 0xC0FFEE,
                    census_log_view: 3,
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::Ping(PingHeader {
                    group: GroupId(42),
                    round: 17,
                }),
            ),
            vec![],
        ),
        (
            frame(
                4,
                CommandHeader::Pong(PingHeader {
                    group: GroupId(42),
                    round: 17,
                }),
            ),
            vec![],
        ),
    ]
}

/// Recomputes the checksum fields of an encoded frame after a test mutated
/// it, so the test reaches the checks that follow the seal.
fn reseal(bytes: &mut [u8]) {
    let command = Command::from_u8(bytes[60]).unwrap();
    let body_sum = body_checksum(&bytes[HEADER_SIZE..]);
    if command.integrity() != Integrity::Unsealed {
        bytes[16..32].copy_from_slice(&body_sum.to_le_bytes());
    }
    let head: [u8; HEADER_SIZE] = bytes[..HEADER_SIZE].try_into().unwrap();
    let checksum = match command.integrity() {
        Integrity::Sealed => frame_seal(&head),
        Integrity::Identity => prepare_identity(&head),
        Integrity::Unsealed => 0,
    };
    bytes[..16].copy_from_slice(&checksum.to_le_bytes());
}

#[test]
fn given_every_command_when_encoded_should_round_trip() {
    for (header, body) in samples() {
        let bytes = encode_frame(&header, &body);
        let decoded = decode_frame(&bytes, MAX).unwrap();
        assert_eq!(decoded.body, &body[..]);
        assert_eq!(decoded.header.command, header.command);
        assert_eq!(decoded.header.cluster, header.cluster);
        assert_eq!(decoded.header.view, header.view);
        assert_eq!(decoded.header.replica, header.replica);
        assert_eq!(decoded.header.size as usize, HEADER_SIZE + body.len());
        // Re-encoding the decoded header gives the same bytes.
        assert_eq!(encode_frame(&decoded.header, decoded.body), bytes);
    }
}

#[test]
fn given_known_prepare_when_encoded_should_match_documented_offsets() {
    let (header, body) = samples().swap_remove(2);
    let bytes = encode_frame(&header, &body);
    assert_eq!(&bytes[48..52], &(256 + body.len() as u32).to_le_bytes());
    assert_eq!(bytes[60], 6);
    assert_eq!(bytes[61], 2);
    assert_eq!(&bytes[128..144], &99u128.to_le_bytes());
    assert_eq!(&bytes[176..184], &9u64.to_le_bytes());
    assert_eq!(&bytes[216..224], &42u64.to_le_bytes());
    assert_eq!(
        &bytes[16..32],
        &u128::from(xxh3_64(&body)).to_le_bytes(),
        "body checksum"
    );
    let head: [u8; 256] = bytes[..256].try_into().unwrap();
    let mut zeroed = head;
    zeroed[..16].fill(0);
    zeroed[52..56].fill(0);
    assert_eq!(&bytes[..16], &u128::from(xxh3_64(&zeroed)).to_le_bytes());
}

#[test]
fn given_control_frame_when_encoded_should_seal_bytes_after_checksum() {
    let (header, body) = samples().swap_remove(5); // Commit
    let bytes = encode_frame(&header, &body);
    assert_eq!(
        &bytes[..16],
        &u128::from(xxh3_64(&bytes[16..256])).to_le_bytes()
    );
}

#[test]
fn given_every_strict_prefix_when_decoded_should_reject() {
    for (header, body) in samples() {
        let bytes = encode_frame(&header, &body);
        for len in 0..bytes.len() {
            assert!(
                decode_frame(&bytes[..len], MAX).is_err(),
                "{:?} prefix {len}",
                header.command.command()
            );
        }
    }
}

#[test]
fn given_any_flipped_bit_when_decoded_should_reject() {
    for (header, body) in samples() {
        let command = header.command.command();
        let bytes = encode_frame(&header, &body);
        for bit in 0..bytes.len() * 8 {
            let byte = bit / 8;
            let covered = match command.integrity() {
                Integrity::Sealed => true,
                // The identity leaves the view out on purpose.
                Integrity::Identity => !(52..56).contains(&byte),
                // Client frames are unsealed; only what the codec checks
                // structurally can be caught (tested separately).
                Integrity::Unsealed => false,
            };
            if !covered {
                continue;
            }
            let mut flipped = bytes.clone();
            flipped[byte] ^= 1 << (bit % 8);
            assert!(
                decode_frame(&flipped, MAX).is_err(),
                "{command:?} bit {bit} accepted"
            );
        }
    }
}

#[test]
fn given_unsealed_client_frame_with_flipped_structural_bit_when_decoded_should_reject() {
    let (header, body) = samples().swap_remove(0);
    let bytes = encode_frame(&header, &body);
    // Checksum fields (a nonzero value is verified), size, release, command,
    // common reserved bytes and the request's own padding and reserved tail.
    let structural = (0..32)
        .chain(48..52)
        .chain(56..61)
        .chain(62..128)
        .chain(177..184)
        .chain(200..256);
    for byte in structural {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[byte] ^= 1 << bit;
            assert!(
                decode_frame(&flipped, MAX).is_err(),
                "byte {byte} bit {bit} accepted"
            );
        }
    }
}

#[test]
fn given_prepare_restamped_to_new_view_when_decoded_should_keep_identity() {
    let (header, body) = samples().swap_remove(2);
    let mut bytes = encode_frame(&header, &body);
    let identity = decode_frame(&bytes, MAX).unwrap().header.checksum;
    restamp_prepare_view(&mut bytes, 77).unwrap();
    let decoded = decode_frame(&bytes, MAX).unwrap();
    assert_eq!(decoded.header.view, 77);
    assert_eq!(decoded.header.checksum, identity);
    let (commit, _) = samples().swap_remove(5);
    let mut commit = encode_frame(&commit, &[]);
    assert!(matches!(
        restamp_prepare_view(&mut commit, 1),
        Err(HeaderError::Invalid { .. })
    ));
}

#[test]
fn given_size_fields_out_of_bounds_when_decoded_should_reject_each_distinctly() {
    let (header, body) = samples().swap_remove(2);
    let bytes = encode_frame(&header, &body);
    assert_eq!(
        decode_frame(&bytes[..100], MAX),
        Err(HeaderError::TooShort { len: 100 })
    );
    let mut small = bytes.clone();
    small[48..52].copy_from_slice(&255u32.to_le_bytes());
    assert_eq!(
        decode_frame(&small, MAX),
        Err(HeaderError::SizeBelowHeader { size: 255 })
    );
    // A size asking for 4 GiB is refused before anything else is read.
    let mut huge = bytes.clone();
    huge[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode_frame(&huge, MAX),
        Err(HeaderError::SizeAboveMax {
            size: u32::MAX,
            max: MAX
        })
    );
    assert_eq!(
        decode_frame(&bytes, 266),
        Err(HeaderError::SizeAboveMax {
            size: bytes.len() as u32,
            max: 266
        })
    );
    assert_eq!(
        decode_frame(&bytes[..bytes.len() - 1], MAX),
        Err(HeaderError::Truncated {
            size: bytes.len() as u32,
            len: bytes.len() - 1
        })
    );
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(
        decode_frame(&longer, MAX),
        Err(HeaderError::TrailingBytes {
            size: bytes.len() as u32,
            len: bytes.len() + 1
        })
    );
}

#[test]
fn given_unknown_or_unsupported_command_when_decoded_should_reject() {
    let (header, body) = samples().swap_remove(5);
    let bytes = encode_frame(&header, &body);
    for byte in [32u8, 99, 255] {
        let mut b = bytes.clone();
        b[60] = byte;
        assert_eq!(
            decode_frame(&b, MAX),
            Err(HeaderError::UnknownCommand { command: byte })
        );
    }
    for command in [Command::Reserved, Command::PingClient, Command::Eviction] {
        let mut b = bytes.clone();
        b[60] = command as u8;
        assert_eq!(
            decode_frame(&b, MAX),
            Err(HeaderError::UnsupportedCommand { command })
        );
    }
}

#[test]
fn given_seal_or_body_checksum_mismatch_when_decoded_should_reject_distinctly() {
    let (header, body) = samples().swap_remove(7); // DoViewChange with a suffix
    let bytes = encode_frame(&header, &body);
    let mut bad_seal = bytes.clone();
    bad_seal[0] ^= 1;
    assert!(matches!(
        decode_frame(&bad_seal, MAX),
        Err(HeaderError::SealMismatch { .. })
    ));
    let mut bad_body = bytes.clone();
    let last = bad_body.len() - 1;
    bad_body[last] ^= 1;
    assert!(matches!(
        decode_frame(&bad_body, MAX),
        Err(HeaderError::BodyChecksumMismatch { .. })
    ));
    // A zero body checksum on a non-empty body is a mismatch, not "unset".
    let mut zero_sum = bytes.clone();
    zero_sum[16..32].fill(0);
    let head: [u8; 256] = zero_sum[..256].try_into().unwrap();
    zero_sum[..16].copy_from_slice(&frame_seal(&head).to_le_bytes());
    assert!(matches!(
        decode_frame(&zero_sum, MAX),
        Err(HeaderError::BodyChecksumMismatch { stored: 0, .. })
    ));
}

#[test]
fn given_nonzero_reserved_byte_when_decoded_should_name_its_offset() {
    for (header, body) in samples() {
        let bytes = encode_frame(&header, &body);
        let reserved: Vec<usize> = (62..128)
            .chain(match header.command {
                CommandHeader::Request(_) => (177..184).chain(200..256).collect::<Vec<_>>(),
                CommandHeader::Reply(_) => (209..216).chain(220..256).collect(),
                CommandHeader::Prepare(_) | CommandHeader::RepairPrepare(_) => {
                    (209..216).chain(228..256).collect()
                }
                CommandHeader::PrepareOk(_) => (193..200).chain(208..256).collect(),
                CommandHeader::Commit(_) => (176..256).collect(),
                CommandHeader::StartViewChange(_) => (136..256).collect(),
                CommandHeader::DoViewChange(_) => (156..224).collect(),
                CommandHeader::StartView(_) => (152..240).collect(),
                CommandHeader::RequestStartView(h) if h.census => (165..240).collect(),
                CommandHeader::RequestStartView(_) => (136..164).chain(165..240).collect(),
                CommandHeader::RequestPrepares(_) | CommandHeader::RequestHeaders(_) => {
                    (168..256).collect()
                }
                CommandHeader::RepairDone(_) | CommandHeader::RangeEvicted(_) => {
                    (160..256).collect()
                }
                CommandHeader::Headers(_) | CommandHeader::RequestStateTransfer(_) => {
                    (152..256).collect()
                }
                CommandHeader::StateTransferTarget(_) => (162..168).chain(176..256).collect(),
                CommandHeader::RequestStateChunk(_) => (168..256).collect(),
                CommandHeader::StateChunk(_) => (164..256).collect(),
                CommandHeader::Ping(_) | CommandHeader::Pong(_) => (144..256).collect(),
            })
            .collect();
        for offset in reserved {
            let mut b = bytes.clone();
            b[offset] = 0x40;
            reseal(&mut b);
            assert_eq!(
                decode_frame(&b, MAX),
                Err(HeaderError::NonzeroReserved { offset }),
                "{:?} offset {offset}",
                header.command.command()
            );
        }
    }
}

#[test]
fn given_census_flag_other_than_0_or_1_when_decoded_should_reject() {
    for flag in [2u8, 0x80, 0xFF] {
        let header = frame(
            4,
            CommandHeader::RequestStartView(RequestStartViewHeader {
                group: GroupId(42),
                incarnation: 7,
                census: true,
                census_op: Op(90),
                census_checksum: 1,
                census_log_view: 3,
            }),
        );
        let mut b = encode_frame(&header, &[]);
        b[164] = flag;
        reseal(&mut b);
        assert!(
            matches!(decode_frame(&b, MAX), Err(HeaderError::Invalid { .. })),
            "flag {flag}"
        );
    }
}

#[test]
fn given_nonzero_release_when_decoded_should_reject() {
    let (header, body) = samples().swap_remove(5);
    let mut b = encode_frame(&header, &body);
    b[56] = 1;
    reseal(&mut b);
    assert_eq!(
        decode_frame(&b, MAX),
        Err(HeaderError::UnsupportedRelease { release: 1 })
    );
}

#[test]
fn given_header_only_command_with_body_when_decoded_should_reject() {
    for (header, body) in samples() {
        if !header.command.header_only() {
            continue;
        }
        assert!(body.is_empty());
        let b = encode_frame(&header, &[1, 2, 3]);
        assert_eq!(
            decode_frame(&b, MAX),
            Err(HeaderError::UnexpectedBody {
                command: header.command.command(),
                len: 3
            })
        );
    }
}

fn invalid_reason(bytes: &[u8]) -> &'static str {
    match decode_frame(bytes, MAX) {
        Err(HeaderError::Invalid { reason, .. }) => reason,
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

#[test]
fn given_field_rule_violations_when_decoded_should_reject() {
    let s = samples();
    let encode = |i: usize, edit: &dyn Fn(&mut CommandHeader), body: &[u8]| {
        let mut h = s[i].0;
        edit(&mut h.command);
        encode_frame(&h, body)
    };
    // Request: client 0, operation 0, a register with a session, a
    // replicated request without one, a legacy code outside operation 2.
    let r = |f: fn(&mut RequestHeader)| {
        move |c: &mut CommandHeader| {
            if let CommandHeader::Request(h) = c {
                f(h)
            }
        }
    };
    for edit in [
        r(|h| h.client = 0),
        r(|h| h.operation = 0),
        r(|h| {
            h.operation = OPERATION_REGISTER;
            h.session = 1
        }),
        r(|h| h.session = 0),
        r(|h| h.request = 0),
    ] {
        invalid_reason(&encode(0, &edit, b"x"));
    }
    let legacy = encode(0, &r(|h| h.legacy_command = 7), b"x");
    assert_eq!(
        decode_frame(&legacy, MAX),
        Err(HeaderError::NonzeroReserved { offset: 196 })
    );
    let non_replicated = encode(
        0,
        &r(|h| {
            h.operation = OPERATION_NON_REPLICATED;
            h.session = 0;
            h.legacy_command = 7
        }),
        b"x",
    );
    assert!(decode_frame(&non_replicated, MAX).is_ok());
    // Ping and Pong: round 0 names no read check.
    for i in s
        .iter()
        .enumerate()
        .filter(|(_, (h, _))| matches!(h.command, CommandHeader::Ping(_) | CommandHeader::Pong(_)))
        .map(|(i, _)| i)
    {
        let zero_round = |c: &mut CommandHeader| {
            if let CommandHeader::Ping(h) | CommandHeader::Pong(h) = c {
                h.round = 0
            }
        };
        invalid_reason(&encode(i, &zero_round, b""));
    }
    // Prepare: op 0, commit not below op.
    let p = |f: fn(&mut PrepareCommand)| {
        move |c: &mut CommandHeader| {
            if let CommandHeader::Prepare(h) = c {
                f(h)
            }
        }
    };
    invalid_reason(&encode(2, &p(|h| h.op = Op(0)), b"x"));
    invalid_reason(&encode(2, &p(|h| h.commit = h.op), b"x"));
    // DoViewChange: log_view ahead of view, commit ahead of op, a bitset bit
    // past the suffix.
    let d = |f: fn(&mut DoViewChangeHeader)| {
        move |c: &mut CommandHeader| {
            if let CommandHeader::DoViewChange(h) = c {
                f(h)
            }
        }
    };
    let suffix = &s[7].1;
    invalid_reason(&encode(7, &d(|h| h.log_view = 5), suffix));
    invalid_reason(&encode(7, &d(|h| h.commit = Op(10)), suffix));
    invalid_reason(&encode(7, &d(|h| h.nack_bitset = 0b100), suffix));
    invalid_reason(&encode(7, &d(|h| h.present_bitset = 1 << 127), suffix));
    // StartView: commit ahead of op.
    invalid_reason(&encode(
        8,
        &|c| {
            if let CommandHeader::StartView(h) = c {
                h.commit = Op(10)
            }
        },
        suffix,
    ));
    // Ranges.
    invalid_reason(&encode(
        10,
        &|c| {
            if let CommandHeader::RequestPrepares(h) = c {
                h.from_op = Op(0)
            }
        },
        &[],
    ));
    invalid_reason(&encode(
        10,
        &|c| {
            if let CommandHeader::RequestPrepares(h) = c {
                h.from_op = h.to_op + 1
            }
        },
        &[],
    ));
    invalid_reason(&encode(
        13,
        &|c| {
            if let CommandHeader::RequestHeaders(h) = c {
                h.to_op = h.from_op + 128
            }
        },
        &[],
    ));
    // Offer: both flags, commit_op ahead of commit_max, flag byte not 0/1,
    // an offer without its manifest.
    invalid_reason(&encode(
        16,
        &|c| {
            if let CommandHeader::StateTransferTarget(h) = c {
                h.unavailable_transient = true
            }
        },
        &s[16].1,
    ));
    invalid_reason(&encode(
        16,
        &|c| {
            if let CommandHeader::StateTransferTarget(h) = c {
                h.commit_op = h.commit_max + 1
            }
        },
        &s[16].1,
    ));
    invalid_reason(&encode(16, &|_| {}, &[]));
    let mut flag = encode_frame(&s[17].0, &[]);
    flag[160] = 2;
    reseal(&mut flag);
    invalid_reason(&flag);
    // Chunk request for zero bytes.
    invalid_reason(&encode(
        18,
        &|c| {
            if let CommandHeader::RequestStateChunk(h) = c {
                h.len = 0
            }
        },
        &[],
    ));
}

#[test]
fn given_suffix_body_of_wrong_shape_when_decoded_should_reject() {
    let (header, _) = samples().swap_remove(8); // StartView
    let b = encode_frame(&header, &[0u8; 300]);
    assert_eq!(
        decode_frame(&b, MAX),
        Err(HeaderError::BodyNotHeaders { len: 300 })
    );
    let many: Vec<FrameHeader> = (1..=129).map(prepare_header).collect();
    let b = encode_frame(&header, &encode_prepare_headers(&many));
    assert_eq!(
        decode_frame(&b, MAX),
        Err(HeaderError::TooManyHeaders { count: 129 })
    );
    // A suffix entry whose identity does not match.
    let mut bad = prepare_header(5);
    bad.checksum ^= 1;
    let b = encode_frame(&header, &encode_prepare_headers(&[bad]));
    assert!(matches!(
        decode_frame(&b, MAX),
        Err(HeaderError::SealMismatch { .. })
    ));
    // A suffix entry that is not a prepare.
    let (commit, _) = samples().swap_remove(5);
    let b = encode_frame(&header, &encode_prepare_headers(&[commit]));
    assert!(matches!(
        decode_frame(&b, MAX),
        Err(HeaderError::Invalid { .. })
    ));
}

#[test]
fn given_blank_slot_in_suffix_when_decoded_should_accept_only_operation_zero() {
    let (header, _) = samples().swap_remove(7);
    let blank = frame(
        0,
        CommandHeader::Prepare(PrepareCommand {
            op: Op(8),
            ..PrepareCommand::default()
        }),
    );
    let body = encode_prepare_headers(&[prepare_header(9), blank]);
    let encoded = encode_frame(&header, &body);
    let decoded = decode_frame(&encoded, MAX).unwrap();
    let entries = decode_prepare_headers(decoded.body).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].checksum, 0);
    let mut unsealed = prepare_header(8);
    unsealed.checksum = 0;
    let body = encode_prepare_headers(&[unsealed]);
    assert!(matches!(
        decode_frame(&encode_frame(&header, &body), MAX),
        Err(HeaderError::Invalid { .. })
    ));
}

fn any_prepare() -> impl Strategy<Value = PrepareCommand> {
    (
        any::<u128>(),
        any::<u128>(),
        any::<u128>(),
        1..u64::MAX,
        any::<u64>(),
        any::<u64>(),
        1..=u8::MAX,
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(
                client,
                parent,
                request_checksum,
                op,
                commit,
                timestamp,
                operation,
                group,
                user_id,
            )| {
                PrepareCommand {
                    client,
                    parent,
                    request_checksum,
                    op: Op(op),
                    commit: Op(commit % op),
                    timestamp,
                    request: commit,
                    operation,
                    group: GroupId(group),
                    user_id,
                }
            },
        )
}

proptest! {
    #[test]
    fn given_random_prepare_when_encoded_should_round_trip(
        p in any_prepare(),
        view in any::<u32>(),
        cluster in any::<u128>(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let h = FrameHeader { cluster, view, ..frame(view, CommandHeader::Prepare(p)) };
        let bytes = encode_frame(&h, &body);
        let decoded = decode_frame(&bytes, MAX).unwrap();
        prop_assert_eq!(decoded.header.command, CommandHeader::Prepare(p));
        prop_assert_eq!(decoded.body, &body[..]);
    }

    #[test]
    fn given_random_chunk_request_when_encoded_should_round_trip(
        nonce in any::<u128>(), offset in any::<u64>(), group in any::<u64>(),
        len in 1..=u32::MAX, artifact in any::<u32>(), view in any::<u32>(),
    ) {
        let c = CommandHeader::RequestStateChunk(RequestStateChunkHeader {
            nonce, offset, group: GroupId(group), len, artifact,
        });
        let bytes = encode_frame(&frame(view, c), &[]);
        prop_assert_eq!(decode_frame(&bytes, MAX).unwrap().header.command, c);
    }

    #[test]
    fn given_random_bytes_when_decoded_should_never_panic(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..600),
        command in 0u8..40,
    ) {
        if bytes.len() >= HEADER_SIZE {
            bytes[60] = command;
            let size = bytes.len() as u32;
            bytes[48..52].copy_from_slice(&size.to_le_bytes());
            let _ = decode_frame(&bytes, MAX);
            if Command::from_u8(command).is_some() {
                reseal(&mut bytes);
            }
        }
        let _ = decode_frame(&bytes, MAX);
    }
}
