//! Bad peer input is refused with a typed error and changes nothing.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use common::{GroupId, Op, ReplicaId};
use consensus::vsr::{
    AppliedState, Config, DoViewChange, DurableState, Frame, FrameError, Handled, Ignored, Message,
    OP_MAX, Prepare, PrepareHeader, Replica, StartView, SuffixSlot, body_checksum,
};

fn replica() -> Replica {
    Replica::new(Config::new(ReplicaId(1), 3, GroupId(0)))
}

fn frame(message: Message) -> Frame {
    Frame {
        group: GroupId(0),
        replica: ReplicaId(0),
        view: 0,
        message,
    }
}

fn prepare(op: u64) -> Prepare {
    let body = Bytes::from_static(b"body");
    let mut header = PrepareHeader {
        checksum: 0,
        checksum_body: body_checksum(&body),
        parent: 0,
        client: 5,
        request_checksum: 0,
        view: 0,
        op: Op(op),
        commit: Op(0),
        timestamp: 1,
        request: 1,
        operation: 3,
        group: GroupId(0),
        user_id: 1,
    };
    header.checksum = header.compute_checksum();
    Prepare { header, body }
}

fn unchanged(r: &Replica) {
    assert_eq!((r.view(), r.op(), r.commit_max()), (0, Op(0), Op(0)));
}

#[test]
fn given_frame_for_another_group_should_refuse() {
    let mut r = replica();
    let mut f = frame(Message::StartViewChange);
    f.group = GroupId(9);
    assert_eq!(
        r.on_frame(f),
        Err(FrameError::WrongGroup { group: GroupId(9) })
    );
}

#[test]
fn given_frame_from_self_or_unknown_replica_should_refuse() {
    let mut r = replica();
    for sender in [1u8, 3, 200] {
        let mut f = frame(Message::StartViewChange);
        f.replica = ReplicaId(sender);
        assert_eq!(
            r.on_frame(f),
            Err(FrameError::BadSender {
                replica: ReplicaId(sender)
            })
        );
    }
    unchanged(&r);
}

#[test]
fn given_prepare_with_flipped_body_bit_should_refuse_without_journaling() {
    let mut r = replica();
    let mut p = prepare(1);
    p.body = Bytes::from_static(b"bodz");
    assert_eq!(
        r.on_frame(frame(Message::Prepare(p))),
        Err(FrameError::BadChecksum { op: Op(1) })
    );
    assert!(r.journal_entry(Op(1)).is_none());
    let good = prepare(1);
    r.on_frame(frame(Message::Prepare(good))).unwrap();
    assert!(r.journal_entry(Op(1)).is_some());
}

#[test]
fn given_prepare_whose_header_names_another_group_should_refuse_as_wrong_group() {
    let mut r = replica();
    // A well-formed prepare of group 7 inside a frame addressed to group 0.
    let mut p = prepare(1);
    p.header.group = GroupId(7);
    p.header.checksum = p.header.compute_checksum();
    assert_eq!(
        r.on_frame(frame(Message::Prepare(p.clone()))),
        Err(FrameError::WrongGroup { group: GroupId(7) })
    );
    assert_eq!(
        r.on_frame(frame(Message::RepairPrepare(p))),
        Err(FrameError::WrongGroup { group: GroupId(7) })
    );
    assert!(r.journal_entry(Op(1)).is_none());
    unchanged(&r);
}

/// The counts of the reasons a prepare can be ignored for, in order:
/// newer view, stale view, not normal, not from authority, own view,
/// transferring.
fn ignored(r: &Replica) -> Vec<u64> {
    [
        Ignored::NewerView,
        Ignored::StaleView,
        Ignored::NotNormal,
        Ignored::NotFromAuthority,
        Ignored::OwnView,
        Ignored::Transferring,
    ]
    .iter()
    .map(|reason| r.frames_ignored(*reason))
    .collect()
}

fn from(replica: u8, view: u32, message: Message) -> Frame {
    Frame {
        group: GroupId(0),
        replica: ReplicaId(replica),
        view,
        message,
    }
}

#[test]
fn given_prepares_a_backup_must_not_take_should_count_each_by_its_reason() {
    let mut r = replica();
    let prepare_from =
        |replica: u8, view: u32, p: Prepare| from(replica, view, Message::Prepare(p));
    // From replica 2, which is not view 0's primary.
    assert_eq!(
        r.on_frame(prepare_from(2, 0, prepare(1))),
        Ok(Handled::Ignored(Ignored::NotFromAuthority))
    );
    assert_eq!(ignored(&r), [0, 0, 0, 1, 0, 0]);
    assert!(r.journal_entry(Op(1)).is_none());
    // Of view 1, which this replica has not heard of yet.
    r.on_frame(prepare_from(0, 1, prepare(1))).unwrap();
    assert_eq!(ignored(&r), [1, 0, 0, 1, 0, 0]);
    // In view 1's view change, a prepare of view 1 and one of view 0.
    let mut svc = frame(Message::StartViewChange);
    svc.view = 1;
    assert_eq!(r.on_frame(svc), Ok(Handled::Taken));
    assert_eq!(r.view(), 1);
    r.on_frame(prepare_from(2, 1, prepare(1))).unwrap();
    r.on_frame(prepare_from(0, 0, prepare(1))).unwrap();
    assert_eq!(ignored(&r), [1, 1, 1, 1, 0, 0]);
    assert!(r.journal_entry(Op(1)).is_none());
    // The taken one is counted nowhere.
    let mut taken = Replica::new(Config::new(ReplicaId(1), 3, GroupId(0)));
    assert_eq!(
        taken.on_frame(prepare_from(0, 0, prepare(1))),
        Ok(Handled::Taken)
    );
    assert!(taken.journal_entry(Op(1)).is_some());
    assert!(Ignored::ALL.iter().all(|x| taken.frames_ignored(*x) == 0));
}

#[test]
fn given_frames_a_replica_must_not_act_on_should_name_each_reason() {
    // Replica 1 of 3, a backup in view 0 (replica 0 leads it).
    let mut backup = replica();
    let cases = [
        (
            from(
                2,
                0,
                Message::PrepareOk {
                    op: Op(1),
                    prepare_checksum: 0,
                },
            ),
            Ignored::NotPrimary,
        ),
        (from(0, 0, Message::Pong { round: 1 }), Ignored::NotPrimary),
        (
            from(
                2,
                0,
                Message::Commit {
                    commit: Op(0),
                    commit_checksum: 0,
                    timestamp_monotonic: 1,
                },
            ),
            Ignored::NotFromAuthority,
        ),
        (
            from(2, 0, Message::Ping { round: 1 }),
            Ignored::NotFromAuthority,
        ),
        (
            from(
                2,
                0,
                Message::RepairDone {
                    nonce: 7,
                    op: Op(0),
                },
            ),
            Ignored::NoSuchRepair,
        ),
        (
            from(
                2,
                0,
                Message::RangeEvicted {
                    nonce: 7,
                    retained_from: Op(1),
                },
            ),
            Ignored::NoSuchRepair,
        ),
        (from(2, 0, Message::StartViewChange), Ignored::AlreadyInView),
        (
            from(
                2,
                0,
                Message::RequestStartView {
                    incarnation: 5,
                    census: None,
                },
            ),
            Ignored::NotPrimary,
        ),
        (
            from(0, 0, Message::RepairPrepare(prepare(0))),
            Ignored::AlreadyHeld,
        ),
    ];
    for (frame, reason) in cases {
        let name = frame.message.name();
        let before = backup.frames_ignored(reason);
        assert_eq!(
            backup.on_frame(frame),
            Ok(Handled::Ignored(reason)),
            "{name}"
        );
        assert_eq!(backup.frames_ignored(reason), before + 1, "{name}");
        unchanged(&backup);
    }

    // A restarted replica is quorum-invisible, and a StartView that does
    // not answer its own probe changes nothing.
    let durable = DurableState {
        view: 0,
        log_view: 0,
        commit: Op(0),
    };
    let mut restarted = Replica::restart(
        Config::new(ReplicaId(1), 3, GroupId(0)),
        durable,
        AppliedState::default(),
    );
    assert_eq!(
        restarted.on_frame(from(2, 1, Message::StartViewChange)),
        Ok(Handled::Ignored(Ignored::Invisible))
    );
    let sv = StartView {
        incarnation: 3,
        op: Op(0),
        commit: Op(0),
        suffix: Vec::new(),
    };
    assert_eq!(
        restarted.on_frame(from(0, 0, Message::StartView(sv))),
        Ok(Handled::Ignored(Ignored::NotOurProbe))
    );
    assert_eq!(restarted.frames_ignored(Ignored::Invisible), 1);
    assert_eq!(restarted.frames_ignored(Ignored::NotOurProbe), 1);
}

#[test]
fn given_numbers_beyond_any_log_should_refuse_before_acting() {
    let mut r = replica();
    let huge = Message::Commit {
        commit: Op(OP_MAX + 1),
        commit_checksum: 0,
        timestamp_monotonic: 1,
    };
    assert!(matches!(
        r.on_frame(frame(huge)),
        Err(FrameError::OutOfRange { .. })
    ));
    let mut f = frame(Message::StartViewChange);
    f.view = u32::MAX;
    assert!(matches!(r.on_frame(f), Err(FrameError::OutOfRange { .. })));
    unchanged(&r);
}

#[test]
fn given_malformed_view_change_messages_should_refuse() {
    let mut r = replica();
    let p = prepare(1);
    let bad_dvcs = [
        DoViewChange {
            log_view: 5, // ahead of the frame's view
            op: Op(1),
            commit: Op(0),
            suffix: vec![SuffixSlot::Header(p.header)],
            nack_bitset: 0,
            present_bitset: 1,
        },
        DoViewChange {
            log_view: 0,
            op: Op(2), // slot 0 must be op 2
            commit: Op(0),
            suffix: vec![SuffixSlot::Header(p.header)],
            nack_bitset: 0,
            present_bitset: 1,
        },
        DoViewChange {
            log_view: 0,
            op: Op(1),
            commit: Op(0),
            suffix: vec![SuffixSlot::Header(p.header)],
            nack_bitset: 0,
            present_bitset: 0b10, // beyond the suffix
        },
        DoViewChange {
            log_view: 0,
            op: Op(1),
            commit: Op(2), // ahead of op
            suffix: vec![],
            nack_bitset: 0,
            present_bitset: 0,
        },
    ];
    for dvc in bad_dvcs {
        let mut f = frame(Message::DoViewChange(dvc));
        f.view = 1;
        assert!(matches!(
            r.on_frame(f),
            Err(FrameError::MalformedViewMessage { .. })
        ));
    }
    let mut tampered = p.header;
    tampered.timestamp += 1; // identity no longer matches
    let sv = StartView {
        op: Op(1),
        commit: Op(0),
        suffix: vec![tampered],
        incarnation: 0,
    };
    let mut f = frame(Message::StartView(sv));
    f.view = 3;
    assert!(matches!(
        r.on_frame(f),
        Err(FrameError::MalformedViewMessage { .. })
    ));
    unchanged(&r);
}

#[test]
fn given_empty_repair_range_should_refuse() {
    let mut r = replica();
    let m = Message::RequestPrepares {
        nonce: 1,
        from_op: Op(5),
        to_op: Op(4),
    };
    assert_eq!(
        r.on_frame(frame(m)),
        Err(FrameError::BadRange {
            from_op: Op(5),
            to_op: Op(4)
        })
    );
}

#[test]
fn given_new_view_when_not_yet_persisted_should_withhold_every_send() {
    use consensus::vsr::{Action, Effect};
    // Replica 2 is a backup in view 1 (whose primary is replica 1), so its
    // DoViewChange leaves as a frame.
    let mut r = Replica::new(Config::new(ReplicaId(2), 3, GroupId(0)));
    let mut f = frame(Message::StartViewChange);
    f.view = 1;
    r.on_frame(f).unwrap();
    let actions = r.take_actions();
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Effect(Effect::PersistState {
            view: 1,
            log_view: 0,
            ..
        })
    )));
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Send { .. })),
        "no vote may leave before view 1 is durable"
    );
    // A stale acknowledgement (an older pair) releases nothing.
    r.on_persisted(0, 0);
    assert!(r.take_actions().is_empty());
    r.on_persisted(1, 0);
    let released = r.take_actions();
    let sends: Vec<&Message> = released
        .iter()
        .filter_map(|a| match a {
            Action::Send { frame, .. } if frame.view == 1 => Some(&frame.message),
            _ => None,
        })
        .collect();
    assert!(sends.iter().any(|m| matches!(m, Message::StartViewChange)));
    assert!(sends.iter().any(|m| matches!(m, Message::DoViewChange(_))));
}
