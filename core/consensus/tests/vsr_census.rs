//! The census's reports, driven frame by frame on one replica.
#![allow(clippy::unwrap_used)]

use common::Op;
use common::{GroupId, ReplicaId};
use consensus::vsr::{Action, Census, Config, Effect, Frame, Message, Replica, StartView, Status};

fn frame(from: u8, view: u32, message: Message) -> Frame {
    Frame {
        group: GroupId(0),
        replica: ReplicaId(from),
        view,
        message,
    }
}

/// Completes every state write the replica asked for.
fn persist(r: &mut Replica) {
    for action in r.take_actions() {
        if let Action::Effect(Effect::PersistState { view, log_view, .. }) = action {
            r.on_persisted(view, log_view);
        }
    }
}

/// A probe of a replica waiting after a restart in `view`, with its report.
fn report(from: u8, view: u32, incarnation: u128) -> Frame {
    frame(
        from,
        view,
        Message::RequestStartView {
            incarnation,
            census: Some(Census {
                log_view: 0,
                op: Op(0),
                checksum: 0,
            }),
        },
    )
}

/// Ticks until replica `r` is in a view change of a view above `view`.
fn time_out_past(r: &mut Replica, view: u32) {
    for _ in 0..100_000 {
        if r.status() == Status::ViewChange && r.view() > view {
            persist(r);
            return;
        }
        r.on_tick();
        persist(r);
    }
    panic!("replica never timed out past view {view}");
}

/// Replica 2 of three, in a view change, hears replica 0 report while it
/// waits after a restart; then replica 1 starts view 1 and replica 2
/// adopts it — as replica 0 may too, answered by replica 1, without a word
/// to replica 2. When replica 2 later falls into a view change and hears
/// replica 1 report (it restarted), replica 0's old report must not count:
/// replica 0 may have acknowledged ops since, which a census led from the
/// reports would drop (mixed 33006971). With both counted, replica 2 holds
/// a report from every peer and leads a census view at once.
#[test]
fn given_a_report_heard_before_this_replica_joined_a_view_when_a_census_could_start_should_not_count_it()
 {
    let mut r = Replica::new(Config::new(ReplicaId(2), 3, GroupId(0)));
    persist(&mut r);
    r.on_frame(frame(0, 1, Message::StartViewChange)).unwrap();
    persist(&mut r);
    assert_eq!((r.status(), r.view()), (Status::ViewChange, 1));
    r.on_frame(report(0, 1, 0xA0)).unwrap();
    persist(&mut r);
    assert_eq!(r.status(), Status::ViewChange, "one report leads nothing");
    let start_view = StartView {
        op: Op(0),
        commit: Op(0),
        suffix: Vec::new(),
        incarnation: 0,
    };
    r.on_frame(frame(1, 1, Message::StartView(start_view)))
        .unwrap();
    persist(&mut r);
    assert_eq!((r.status(), r.view()), (Status::Normal, 1));
    time_out_past(&mut r, 1);
    let view = r.view();
    r.on_frame(report(1, view, 0xB1)).unwrap();
    persist(&mut r);
    assert_eq!(
        r.census_views_started(),
        0,
        "a census was led from a report older than the view this replica joined"
    );
    assert_eq!(
        r.status(),
        Status::ViewChange,
        "the stale report made it give up its vote"
    );
    // A fresh report from replica 0 completes the census as before.
    r.on_frame(report(0, view, 0xA2)).unwrap();
    persist(&mut r);
    assert!(
        r.census_views_started() == 1 || r.status() == Status::Recovering,
        "with fresh reports from both peers the census goes on (status {:?})",
        r.status()
    );
}

/// Seed 1007353 (five replicas): replica 0, in a view change, heard
/// replica 3 report while it waited after a restart; replica 3 then
/// adopted a view, asked replica 0 for the ops below its barrier, and
/// voted in the next view changes, whose frames to replica 0 were lost.
/// When replicas 1 and 4 reported (they restarted), replica 0 counted
/// three waiting peers, found its vote useless, started waiting in place
/// and left two voters of five: no view change, no `Normal` primary to
/// answer the waiting ones, and no census (the two voters never report).
/// A repair request is sent only by a replica that is not waiting, so it
/// voids the report, and replica 0 keeps its vote.
#[test]
fn given_a_reporter_that_then_asks_for_repair_when_counting_waiting_peers_should_not_count_it() {
    let mut r = Replica::new(Config::new(ReplicaId(0), 5, GroupId(0)));
    persist(&mut r);
    r.on_frame(frame(1, 1, Message::StartViewChange)).unwrap();
    persist(&mut r);
    assert_eq!((r.status(), r.view()), (Status::ViewChange, 1));
    r.on_frame(report(3, 1, 0xA3)).unwrap();
    persist(&mut r);
    r.on_frame(frame(
        3,
        1,
        Message::RequestPrepares {
            nonce: 7,
            from_op: Op(1),
            to_op: Op(1),
        },
    ))
    .unwrap();
    persist(&mut r);
    r.on_frame(report(1, 1, 0xA1)).unwrap();
    r.on_frame(report(4, 1, 0xA4)).unwrap();
    persist(&mut r);
    assert_eq!(
        r.status(),
        Status::ViewChange,
        "a report its sender stopped waiting after made this replica give up its vote"
    );
    // A fresh report from replica 3 (it restarted again) makes three
    // waiting peers: the vote is useless now, and the rule goes on.
    r.on_frame(report(3, 1, 0xB3)).unwrap();
    persist(&mut r);
    assert_eq!(
        r.status(),
        Status::Recovering,
        "three waiting peers of four"
    );
}

/// Seed 2016646 (five replicas): replica 0 reported to replica 4 while it
/// waited after a restart in view 0, then adopted view 0 from that view's
/// primary (still `Normal` there) and from then on talked to it alone.
/// Replica 4, in a view change of view 4, later heard replicas 2 and 3
/// report and counted replica 0 as waiting too: three waiting peers of
/// four, so it gave up its vote and started waiting in place — but the
/// primary of view 0 ignores a probe of view 4, and the group was left
/// with three waiting replicas and two voters for good. A report of a view
/// older than the member's does not count: its sender may adopt a view
/// whose primary will not answer the member. Once replica 0 reports in
/// view 4 (it raised its view to replica 4's StartViewChange, see below),
/// it can adopt no view older than 4, and the rule goes on.
#[test]
fn given_a_report_of_an_older_view_when_counting_waiting_peers_should_not_count_it() {
    let mut r = Replica::new(Config::new(ReplicaId(4), 5, GroupId(0)));
    persist(&mut r);
    r.on_frame(frame(3, 4, Message::StartViewChange)).unwrap();
    persist(&mut r);
    assert_eq!((r.status(), r.view()), (Status::ViewChange, 4));
    r.on_frame(report(0, 0, 0xA0)).unwrap();
    r.on_frame(report(2, 4, 0xA2)).unwrap();
    r.on_frame(report(3, 4, 0xA3)).unwrap();
    persist(&mut r);
    assert_eq!(
        r.status(),
        Status::ViewChange,
        "a report from an older view made this replica give up its vote"
    );
    r.on_frame(report(0, 4, 0xB0)).unwrap();
    persist(&mut r);
    assert_eq!(
        r.status(),
        Status::Recovering,
        "three waiting peers of four, each in this view"
    );
}

/// The other half: a replica waiting after a restart that hears a
/// member's StartViewChange raises its own view to it, persisted before
/// anything leaves, and answers the member with its report in that view;
/// from then on it refuses a StartView of an older view.
#[test]
fn given_a_waiting_replica_when_a_member_starts_a_view_change_should_raise_its_view_and_report() {
    let config = Config::new(ReplicaId(0), 5, GroupId(0));
    let durable = consensus::vsr::DurableState {
        view: 0,
        log_view: 0,
        commit: Op(0),
    };
    let mut r = Replica::restart(config, durable, consensus::vsr::AppliedState::default());
    persist(&mut r);
    assert_eq!(r.status(), Status::Recovering);
    r.on_frame(frame(4, 4, Message::StartViewChange)).unwrap();
    let actions = r.take_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Effect(Effect::PersistState { view: 4, .. }))),
        "the raised view is persisted"
    );
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Send { .. })),
        "nothing leaves before the raised view is durable"
    );
    r.on_persisted(4, 0);
    let answered = r.take_actions().into_iter().any(|a| match a {
        Action::Send { to, frame } => {
            to == ReplicaId(4)
                && frame.view == 4
                && matches!(
                    frame.message,
                    Message::RequestStartView {
                        census: Some(_),
                        ..
                    }
                )
        }
        _ => false,
    });
    assert!(answered, "the member hears the report in its view");
    assert_eq!((r.status(), r.view()), (Status::Recovering, 4));
}
