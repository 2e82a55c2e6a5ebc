//! The client table survives a restart: a request retried across a crash
//! is answered from the table with its original outcome, never executed
//! twice (core/partitions/src/client_sessions.rs).
//!
//! A single replica is crashed at every filesystem call around a produce
//! whose reply the client never saw, rebooted, and sent the same request
//! again: the batch is in the log exactly once, and the reply names the
//! offsets it holds — the acknowledged ones when the first reply went out.
//! A three-replica group does the same across a whole-group power loss.
#![allow(clippy::unwrap_used)]

mod support;

use common::ReplicaId;
use common::simnet::NetworkFaults;
use consensus::vsr::{OPERATION_APPEND, Reply, ReplyStatus, RequestOutcome};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::{
    ClientOp, ClientRequest, InMemoryBus, InMemoryNetwork, Partition, PollRequest, PollingStrategy,
};
use storage::fs::{CrashMode, SimFs};
use support::{batch, config, dir, fresh_fs};

type Single = Partition<InMemoryBus, FileSuperblock<SimFs>, SimFs>;

const CLIENT: u128 = 1;
/// The tag of the batch whose reply is lost.
const RETRIED: u64 = 99;

fn boot(fs: &SimFs, enforce_fsync: bool) -> (Single, InMemoryNetwork) {
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let mut c = config();
    c.enforce_fsync = enforce_fsync;
    let p = block_on(Partition::open(
        c,
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(fs.clone(), &dir()),
    ))
    .unwrap();
    (p, net)
}

fn request(session: u64, request: u64, op: ClientOp) -> ClientRequest {
    ClientRequest {
        client: CLIENT,
        session,
        request,
        user_id: 1,
        op,
    }
}

fn reply_to(net: &InMemoryNetwork, request: u64) -> Option<Reply> {
    net.take_replies(ReplicaId(0))
        .into_iter()
        .find(|r| r.client == CLIENT && r.request == request)
}

/// Every message's (offset, payload) in the partition.
fn messages(p: &Single) -> Vec<(u64, String)> {
    let polled = block_on(p.poll(&PollRequest {
        consumer: (common::ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::First,
        count: u32::MAX,
        auto_commit: false,
    }))
    .unwrap();
    polled
        .messages()
        .map(|m| (m.offset, String::from_utf8(m.payload.to_vec()).unwrap()))
        .collect()
}

/// Registers, produces three batches, then sends the retried batch with
/// the power cut after `cut` more filesystem calls. Returns the session and
/// the reply the client would have received, had it not been lost.
fn run_until_cut(fs: &SimFs, enforce_fsync: bool, cut: u64) -> (u64, Option<Reply>) {
    let (mut p, net) = boot(fs, enforce_fsync);
    block_on(p.submit(request(0, 0, ClientOp::Register), 1_000)).unwrap();
    let session = reply_to(&net, 0).unwrap().session;
    for tag in 1..=3 {
        block_on(p.submit(
            request(session, tag, ClientOp::Append(batch(tag, 2))),
            1_000 + tag,
        ))
        .unwrap();
        assert_eq!(reply_to(&net, tag).unwrap().status, ReplyStatus::Ok);
    }
    fs.cut_power_after(cut);
    // Errors are the cut's; a fenced partition answers nothing more.
    let _ = block_on(p.submit(
        request(session, 4, ClientOp::Append(batch(RETRIED, 4))),
        2_000,
    ));
    let lost = reply_to(&net, 4).filter(|r| r.status == ReplyStatus::Ok);
    (session, lost)
}

/// Crashes at every call of the retried produce, reboots, retries; returns
/// how many cuts came before the reply and how many after.
fn crash_at_every_step(seed: u64, enforce_fsync: bool, mode: CrashMode) -> (u32, u32) {
    let (mut before, mut after) = (0, 0);
    for cut in 0..48 {
        let fs = fresh_fs(seed);
        let (session, lost) = run_until_cut(&fs, enforce_fsync, cut);
        fs.crash_with(mode);
        let (mut p, net) = boot(&fs, enforce_fsync);
        let retry = request(session, 4, ClientOp::Append(batch(RETRIED, 4)));
        let outcome = block_on(p.submit(retry, 3_000)).unwrap();
        let reply = reply_to(&net, 4).unwrap_or_else(|| {
            panic!("seed {seed} cut {cut} {mode:?}: no reply to the retry ({outcome:?})")
        });
        assert_eq!(
            reply.status,
            ReplyStatus::Ok,
            "seed {seed} cut {cut} {mode:?}: {reply:?}"
        );
        assert_eq!(reply.operation, OPERATION_APPEND);
        match &lost {
            Some(first) => {
                after += 1;
                assert_eq!(
                    outcome,
                    RequestOutcome::Answered,
                    "seed {seed} cut {cut} {mode:?}: an acknowledged request was executed again"
                );
                assert_eq!(
                    (reply.op, reply.result),
                    (first.op, first.result),
                    "seed {seed} cut {cut} {mode:?}: the retry's reply is not the original's"
                );
            }
            None => before += 1,
        }
        let all = messages(&p);
        let copies: Vec<u64> = all
            .iter()
            .filter(|(_, payload)| payload == &format!("m-{RETRIED}-0"))
            .map(|(offset, _)| *offset)
            .collect();
        assert_eq!(
            copies,
            vec![reply.result],
            "seed {seed} cut {cut} {mode:?}: the retried batch is not in the log once, at the reply's offset"
        );
        for tag in 1..=3 {
            assert_eq!(
                all.iter()
                    .filter(|(_, payload)| payload == &format!("m-{tag}-0"))
                    .count(),
                1,
                "seed {seed} cut {cut} {mode:?}: acknowledged batch {tag} not held once"
            );
        }
    }
    assert!(
        before > 0 && after > 0,
        "the cuts must fall both before and after the reply ({before}, {after})"
    );
    (before, after)
}

#[test]
fn given_a_killed_single_replica_when_a_produce_whose_reply_was_lost_is_retried_should_answer_it_from_the_table()
 {
    crash_at_every_step(1, false, CrashMode::KeepAll);
}

#[test]
fn given_a_persisted_single_replica_losing_power_when_the_produce_is_retried_should_answer_it_from_the_table()
 {
    crash_at_every_step(2, true, CrashMode::DropAll);
    for seed in 3..8 {
        crash_at_every_step(seed, true, CrashMode::Seeded);
    }
}

#[test]
fn given_a_restarted_single_replica_when_the_client_table_slot_is_damaged_should_start_without_the_session()
 {
    let fs = fresh_fs(9);
    let (session, lost) = run_until_cut(&fs, true, 1_000);
    assert!(lost.is_some());
    fs.crash_with(CrashMode::DropAll);
    // Flip a bit in both slots: neither verifies, so nothing is restored
    // and the old session is unknown (never a wrong answer).
    for name in partitions::CLIENT_TABLE_FILES {
        let path = dir().join(name);
        fs.rot_byte(&path, 40, 0x01).unwrap();
    }
    let (mut p, net) = boot(&fs, true);
    let retry = request(session, 4, ClientOp::Append(batch(RETRIED, 4)));
    block_on(p.submit(retry, 3_000)).unwrap();
    assert_eq!(reply_to(&net, 4).unwrap().status, ReplyStatus::NoSession);
}
