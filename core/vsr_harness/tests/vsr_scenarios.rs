//! Targeted VSR scenarios on the deterministic harness: each sets up one
//! dangerous situation by hand, checks the property it threatens, then
//! heals and requires convergence with every acknowledged request in the
//! committed log exactly once.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use consensus::vsr::{OPERATION_APPEND, OPERATION_REGISTER, Request, RequestOutcome, Status};
use vsr_harness::{SimConfig, Simulation};

fn quiet(seed: u64, n: u8) -> SimConfig {
    let mut c = SimConfig::quiet(seed, n);
    c.clients = 2;
    c.requests_per_client = 30;
    c.delay_ticks_max = 3;
    c
}

fn sim(config: SimConfig) -> Simulation {
    let mut s = Simulation::new(config);
    s.set_random_faults(false);
    s
}

fn converge(s: &mut Simulation) {
    if let Err(f) = s.heal_and_converge(30_000) {
        panic!("{f}");
    }
}

/// A quiet group of `n` for the whole-group restart tests: two clients of
/// 40 requests each, and a crashed replica stays down until restarted.
fn restart_sim(seed: u64, n: u8) -> Simulation {
    let mut config = quiet(seed, n);
    config.requests_per_client = 40;
    config.down_ticks_max = 0;
    sim(config)
}

/// Whether every replica of `0..n` is in the quorum again within 20,000
/// ticks.
fn all_serving(s: &mut Simulation, n: u8) -> bool {
    s.run_until(20_000, |s| {
        (0..n).all(|r| s.replica(r).is_some_and(|x| x.is_quorum_visible()))
    })
    .unwrap()
}

/// The replicas of `0..n` that started a view by census.
fn census_starters(s: &Simulation, n: u8) -> Vec<u8> {
    (0..n)
        .filter(|r| s.replica(*r).is_some_and(|x| x.census_views_started() > 0))
        .collect()
}

#[test]
fn given_primary_crash_mid_pipeline_when_view_changes_should_keep_acknowledged_ops() {
    let mut s = sim(quiet(11, 3));
    let busy = s
        .run_until(5_000, |s| {
            s.acknowledged().len() >= 10 && s.replica(0).unwrap().pipeline_len() >= 2
        })
        .unwrap();
    assert!(busy, "the primary never had two prepares in flight");
    let acked_before = s.acknowledged().len();
    s.crash(0);
    let elected = s
        .run_until(5_000, |s| {
            (1..3).any(|r| s.replica(r).unwrap().is_primary() && s.replica(r).unwrap().view() >= 1)
        })
        .unwrap();
    assert!(elected, "no new primary after the crash");
    converge(&mut s);
    assert!(s.acknowledged().len() >= acked_before);
    assert_eq!(s.acknowledged().len(), 2 * 30);
}

#[test]
fn given_partitioned_backup_when_view_changes_should_catch_up_after_heal() {
    let mut s = sim(quiet(12, 5));
    s.partition(1 << 4);
    assert!(
        s.run_until(5_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    s.crash(0);
    let elected = s
        .run_until(5_000, |s| {
            (1..4).any(|r| s.replica(r).unwrap().is_primary() && s.replica(r).unwrap().view() >= 1)
        })
        .unwrap();
    assert!(
        elected,
        "the three connected replicas should elect a primary"
    );
    let r4 = s.replica(4).unwrap();
    assert!(
        r4.status() != Status::Normal && r4.commit_min().0 == 0,
        "the partitioned backup can neither join nor start a view alone"
    );
    assert!(
        s.run_until(5_000, |s| s.acknowledged().len() >= 30)
            .unwrap()
    );
    converge(&mut s);
    assert!(s.replica(4).unwrap().view() >= 1);
}

/// The (0, 0) hazard: a backup that acknowledged committed ops restarts
/// with its superblock at view 0 / log_view 0 and an empty journal, next to
/// a replica that never saw those ops. If it voted, the two would form a
/// view whose log lacks ops the primary already committed and applied.
#[test]
fn given_restarted_replica_with_lost_journal_when_asked_to_vote_should_not_lose_committed_ops() {
    let mut config = quiet(13, 3);
    config.requests_per_client = 60;
    let mut s = sim(config);
    s.partition(1 << 2); // replica 2 sees nothing: it stays at op 0.
    // Wait for a moment where replica 1 has acknowledged ops the primary
    // committed but replica 1 has not yet applied: exactly what a vote
    // from its empty journal would forget.
    let exposed = s
        .run_until(10_000, |s| {
            let p = s.replica(0).unwrap();
            let b = s.replica(1).unwrap();
            s.acknowledged().len() >= 5
                && b.commit_min() < p.commit_max()
                && b.op() > b.commit_min()
        })
        .unwrap();
    assert!(exposed);
    let committed = s.replica(0).unwrap().commit_max().0;
    s.crash(1);
    assert_eq!(
        (s.nodes[1].superblock.view, s.nodes[1].superblock.log_view),
        (0, 0)
    );
    // Replica 0 vanishes behind a partition; 1 and 2 can talk.
    s.partition(1 << 0);
    s.restart(1).unwrap();
    for _ in 0..3_000 {
        s.step().unwrap();
        let r1 = s.replica(1).unwrap();
        let r2 = s.replica(2).unwrap();
        assert!(
            !(r2.status() == Status::Normal && r2.view() > 0),
            "replica 2 started view {} without a quorum that knows op {committed}",
            r2.view()
        );
        assert!(
            !(r1.status() == Status::Normal && r1.view() > 0),
            "replica 1 joined view {} from an empty journal",
            r1.view()
        );
    }
    assert!(
        !s.replica(1).unwrap().is_quorum_visible(),
        "no primary answered 1's probe"
    );
    assert!(
        s.replica(2).unwrap().view() > 0,
        "replica 2 did try to elect"
    );
    converge(&mut s);
    assert!(s.committed().len() as u64 >= committed);
}

#[test]
fn given_backup_behind_repair_floor_when_healed_should_conclude_floor_refused_and_transfer() {
    let mut config = quiet(14, 3);
    config.retention_ops = 8;
    config.requests_per_client = 40;
    let mut s = sim(config);
    s.partition(1 << 2);
    assert!(
        s.run_until(10_000, |s| s.acknowledged().len() >= 40)
            .unwrap()
    );
    assert_eq!(s.replica(2).unwrap().commit_min().0, 0);
    s.heal_partition();
    let concluded = s
        .run_until(5_000, |s| s.transfers_started().iter().any(|t| t.0 == 2))
        .unwrap();
    assert!(concluded, "replica 2 should conclude FloorRefused");
    let (_, peer, floor, to_op) = *s.transfers_started().iter().find(|t| t.0 == 2).unwrap();
    assert_eq!(peer, 0, "the transfer names the caught-up primary");
    assert!(floor >= 1 && to_op > floor, "floor {floor} to_op {to_op}");
    converge(&mut s);
}

/// The reference's offer frame names the transferred op but not its
/// identity: installed with an unknown identity, the replica learns it from
/// the log or the primary's heartbeat, and the chain it then applies on
/// joins the primary's exactly (the commit walk asserts the join).
#[test]
fn given_transfer_without_op_identity_when_installed_should_learn_it_and_converge() {
    for seed in [14, 140, 1400] {
        let mut config = quiet(seed, 3);
        config.retention_ops = 8;
        config.requests_per_client = 40;
        config.transfer_without_checksum = true;
        let mut s = sim(config);
        s.partition(1 << 2);
        assert!(
            s.run_until(10_000, |s| s.acknowledged().len() >= 40)
                .unwrap()
        );
        s.heal_partition();
        let transferred = s
            .run_until(5_000, |s| s.transfers_started().iter().any(|t| t.0 == 2))
            .unwrap();
        assert!(transferred, "seed {seed}: replica 2 should transfer");
        converge(&mut s);
        let (lagger, primary) = (s.replica(2).unwrap(), s.replica(0).unwrap());
        assert!(lagger.commit_min_checksum_known());
        assert_eq!(lagger.commit_min().0, primary.commit_min().0, "seed {seed}");
        assert_eq!(
            lagger.commit_min_checksum(),
            primary.commit_min_checksum(),
            "seed {seed}"
        );
    }
}

#[test]
fn given_single_replica_when_restarted_should_resume_without_peers() {
    let mut s = sim(quiet(15, 1));
    assert!(
        s.run_until(5_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    s.crash(0);
    s.restart(0).unwrap();
    assert!(s.replica(0).unwrap().is_primary());
    converge(&mut s);
}

fn request(client: u128, session: u64, number: u64, operation: u8) -> Request {
    Request {
        client,
        session,
        request: number,
        operation,
        user_id: 1,
        request_checksum: 0,
        body: Bytes::from_static(b"x"),
    }
}

#[test]
fn given_reserved_client_id_when_requested_should_refuse() {
    let mut s = sim(quiet(16, 3));
    let outcome = s.submit(0, request(0, 0, 0, OPERATION_REGISTER)).unwrap();
    assert_eq!(outcome, RequestOutcome::ReservedClient);
}

#[test]
fn given_committed_request_when_retried_should_answer_from_table_not_execute() {
    let mut config = quiet(17, 3);
    config.clients = 0;
    let mut s = sim(config);
    let client = 99;
    assert!(matches!(
        s.submit(0, request(client, 0, 0, OPERATION_REGISTER))
            .unwrap(),
        RequestOutcome::Prepared { .. }
    ));
    assert!(s.run_until(500, |s| s.committed().len() == 1).unwrap());
    let session = s
        .replica(0)
        .unwrap()
        .client_table()
        .session(client)
        .unwrap();
    let r = request(client, session, 1, OPERATION_APPEND);
    assert!(matches!(
        s.submit(0, r.clone()).unwrap(),
        RequestOutcome::Prepared { .. }
    ));
    assert_eq!(s.submit(0, r.clone()).unwrap(), RequestOutcome::InFlight);
    assert!(s.run_until(500, |s| s.committed().len() == 2).unwrap());
    assert_eq!(s.submit(0, r).unwrap(), RequestOutcome::Answered);
    s.run_for(200).unwrap();
    assert_eq!(s.committed().len(), 2, "the retry was not ordered again");
}

/// A whole-group restart: every replica crashes at once, with different
/// applied states (a lagging backup, a primary that applied more). Under
/// the restart rule alone nobody answers a probe and the group waits for
/// ever; the census lets the replica with the longest applied state start
/// a view from it, and every acknowledged request survives (in the
/// harness a replica's applied state is durable as it applies, and the
/// primary replies only after applying).
#[test]
fn given_every_replica_restarted_at_once_when_all_report_should_serve_again_without_losing_acknowledged()
 {
    for n in [3u8, 5] {
        let mut config = quiet(21 + u64::from(n), n);
        config.requests_per_client = 40;
        let mut s = sim(config);
        // The last backup sees nothing for a while: it lags behind.
        s.partition(1 << (n - 1));
        assert!(
            s.run_until(10_000, |s| s.acknowledged().len() >= 10)
                .unwrap(),
            "n={n}: no progress before the crash"
        );
        let acked = s.acknowledged().len();
        let applied: Vec<u64> = (0..n)
            .map(|r| s.replica(r).unwrap().commit_min().0)
            .collect();
        assert!(
            applied.iter().min() < applied.iter().max(),
            "n={n}: the applied states should differ: {applied:?}"
        );
        for r in 0..n {
            s.crash(r);
        }
        s.heal_partition();
        for r in 0..n {
            s.restart(r).unwrap();
        }
        let serving = s
            .run_until(20_000, |s| {
                (0..n).all(|r| s.replica(r).is_some_and(|x| x.is_quorum_visible()))
            })
            .unwrap();
        assert!(serving, "n={n}: the group did not come back by itself");
        let starters: Vec<u8> = (0..n)
            .filter(|r| s.replica(*r).unwrap().census_views_started() > 0)
            .collect();
        assert_eq!(starters.len(), 1, "n={n}: one census view, by one replica");
        let best = applied.iter().copied().max().unwrap();
        assert_eq!(
            applied[usize::from(starters[0])],
            best,
            "n={n}: the view starts from the longest applied state"
        );
        converge(&mut s);
        assert!(s.acknowledged().len() >= acked);
        assert_eq!(s.acknowledged().len(), 2 * 40, "n={n}");
    }
}

/// A whole-group restart with members that never restarted because they
/// hold nothing: cut off from the start, they stayed pristine (as a
/// replica that created the group late does) while the others committed.
/// The others crash and restart together and wait for a report from every
/// member; each pristine member, once it has heard from so many that the
/// rest cannot form a view, restarts in place and reports (op 0), and the
/// census starts from the longest applied state. Without that the group
/// waits for ever (blackout seed 11000822 of the cluster simulator).
#[test]
fn given_pristine_members_when_the_others_restart_at_once_should_report_and_let_the_census_start() {
    for (n, pristine) in [(3u8, 0b100u32), (5, 0b11000)] {
        let mut s = restart_sim(41 + u64::from(n), n);
        s.partition(pristine);
        assert!(
            s.run_until(10_000, |s| s.acknowledged().len() >= 10)
                .unwrap(),
            "n={n}: no progress before the crash"
        );
        let acked = s.acknowledged().len();
        let members: Vec<u8> = (0..n).filter(|r| pristine & (1 << r) == 0).collect();
        for r in 0..n {
            if pristine & (1 << r) != 0 {
                let x = s.replica(r).unwrap();
                assert_eq!(
                    (x.op().0, x.commit_min().0),
                    (0, 0),
                    "n={n}: r{r} not pristine"
                );
            }
        }
        for &r in &members {
            s.crash(r);
        }
        s.heal_partition();
        for &r in &members {
            s.restart(r).unwrap();
        }
        assert!(
            all_serving(&mut s, n),
            "n={n}: the group waited on its pristine members"
        );
        let starters = census_starters(&s, n);
        assert_eq!(starters.len(), 1, "n={n}: one census view, by one replica");
        assert!(
            members.contains(&starters[0]),
            "n={n}: a pristine member started the census view"
        );
        converge(&mut s);
        assert!(s.acknowledged().len() >= acked);
        assert_eq!(s.acknowledged().len(), 2 * 40, "n={n}");
    }
}

/// The survivor of a double crash: two of three replicas restart at once
/// while the third, a backup that applied everything it acknowledged,
/// never crashed. It runs view changes alone (the restarted ones are out
/// of every quorum) and sends no report, so without the rule above the
/// census would wait for it for ever; with it, it starts waiting in place
/// and reports its applied state, and the census keeps every
/// acknowledged request.
#[test]
fn given_a_lone_survivor_in_a_view_change_when_the_others_restarted_should_report_and_let_the_census_start()
 {
    let mut s = restart_sim(47, 3);
    assert!(
        s.run_until(10_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    // Let everything prepared commit and apply everywhere first.
    let settled = s
        .run_until(10_000, |s| {
            (0..3).all(|r| {
                s.replica(r)
                    .is_some_and(|x| x.op() == x.commit_min() && x.commit_min().0 > 0)
            })
        })
        .unwrap();
    assert!(settled, "the replicas never settled");
    let primary = (0..3u8)
        .find(|&r| s.replica(r).is_some_and(|x| x.is_primary()))
        .expect("a primary");
    let survivor = (0..3u8).find(|&r| r != primary).unwrap();
    let acked = s.acknowledged().len();
    for r in (0..3u8).filter(|&r| r != survivor) {
        s.crash(r);
    }
    for r in (0..3u8).filter(|&r| r != survivor) {
        s.restart(r).unwrap();
    }
    assert!(all_serving(&mut s, 3), "the group waited on its survivor");
    assert_eq!(census_starters(&s, 3).len(), 1, "one census view");
    converge(&mut s);
    assert!(s.acknowledged().len() >= acked);
    assert_eq!(s.acknowledged().len(), 2 * 40);
}

/// The other side of the rule above: a pristine member that hears a
/// report from one restarted replica while another member never
/// restarted keeps its vote, which that member needs to form a view (the
/// restarted one is out of every quorum). Restarting in place there would
/// leave the group waiting for a census the live member never joins.
#[test]
fn given_a_pristine_member_and_one_restarted_replica_when_a_view_must_form_should_keep_its_vote() {
    let mut s = restart_sim(45, 3);
    s.partition(0b100);
    assert!(
        s.run_until(10_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    let primary = (0..2u8)
        .find(|&r| s.replica(r).is_some_and(|x| x.is_primary()))
        .expect("a primary among the connected two");
    s.crash(primary);
    s.heal_partition();
    s.restart(primary).unwrap();
    assert!(
        all_serving(&mut s, 3),
        "the group did not form a view with its pristine member"
    );
    assert!(
        census_starters(&s, 3).is_empty(),
        "a view change, not a census, should have answered"
    );
    converge(&mut s);
    assert_eq!(s.acknowledged().len(), 2 * 40);
}

/// "Last replica standing": with one replica of three down for good, the
/// two that restarted must wait (the missing one may hold a longer applied
/// state, and a view without it could reuse its op numbers); when it
/// returns the census completes.
#[test]
fn given_whole_group_restart_with_one_replica_missing_when_waiting_should_not_start_a_view() {
    let mut config = quiet(31, 3);
    config.requests_per_client = 40;
    config.down_ticks_max = 0;
    let mut s = sim(config);
    assert!(
        s.run_until(10_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    for r in 0..3 {
        s.crash(r);
    }
    s.restart(0).unwrap();
    s.restart(1).unwrap();
    for _ in 0..20_000 {
        s.step().unwrap();
        for r in 0..2 {
            let x = s.replica(r).unwrap();
            assert_eq!(
                x.status(),
                Status::Recovering,
                "replica {r} left recovery with a replica missing"
            );
            assert_eq!(x.census_views_started(), 0);
        }
    }
    s.restart(2).unwrap();
    let serving = s
        .run_until(20_000, |s| {
            (0..3).all(|r| s.replica(r).is_some_and(|x| x.is_quorum_visible()))
        })
        .unwrap();
    assert!(serving, "the census did not complete once all were back");
    converge(&mut s);
    assert_eq!(s.acknowledged().len(), 2 * 40);
}

/// A quiet group of `n` whose replicas keep their journals in durable
/// logs (`Replica::resume_with_log` at boot), crashed replicas staying
/// down until restarted.
fn durable_sim(seed: u64, n: u8) -> Simulation {
    let mut config = quiet(seed, n);
    config.requests_per_client = 40;
    config.down_ticks_max = 0;
    config.durable_journal = true;
    sim(config)
}

/// Power loss with replicas missing, durable journals: every replica
/// crashes at once mid-run, and `f` of them stay down. The `f + 1` that
/// come back resume from their logs and vote at once, so they form a view
/// without the census (which needs every replica) and serve again; the
/// missing ones then catch up, and nothing acknowledged is lost.
#[test]
fn given_durable_journals_when_power_is_lost_and_f_replicas_stay_down_should_serve_with_the_rest() {
    for n in [3u8, 5] {
        let f = (n - 1) / 2;
        let mut s = durable_sim(40 + u64::from(n), n);
        assert!(
            s.run_until(10_000, |s| s.acknowledged().len() >= 10)
                .unwrap(),
            "n={n}: no progress before the power loss"
        );
        let acked = s.acknowledged().len();
        for r in 0..n {
            s.crash(r);
        }
        for r in f..n {
            s.restart(r).unwrap();
        }
        let serving = s
            .run_until(20_000, |s| {
                serving_primary(s, n).is_some() && s.acknowledged().len() >= acked + 10
            })
            .unwrap();
        assert!(
            serving,
            "n={n}: {} replicas back did not serve again",
            n - f
        );
        for r in f..n {
            assert_eq!(
                s.replica(r).unwrap().census_views_started(),
                0,
                "n={n}: replica {r} needed the census"
            );
        }
        converge(&mut s);
        assert_eq!(s.acknowledged().len(), 2 * 40, "n={n}");
    }
}

/// The last replica standing, durable journals: two of three crash for
/// good and the third restarts uncleanly. Alone it cannot form a view and
/// must not lead one; once a second replica returns, the two serve
/// again without losing anything acknowledged.
#[test]
fn given_durable_journals_when_one_replica_of_three_is_left_should_wait_until_a_second_returns() {
    let mut s = durable_sim(47, 3);
    assert!(
        s.run_until(10_000, |s| s.acknowledged().len() >= 10)
            .unwrap()
    );
    let acked = s.acknowledged().len();
    let committed = s.committed().len();
    for r in 0..3 {
        s.crash(r);
    }
    s.restart(2).unwrap();
    for _ in 0..5_000 {
        s.step().unwrap();
        assert!(
            !s.replica(2).unwrap().is_primary(),
            "a lone replica leads a view"
        );
    }
    assert_eq!(
        s.acknowledged().len(),
        acked,
        "acknowledged with one replica"
    );
    assert_eq!(s.committed().len(), committed, "committed with one replica");
    s.restart(0).unwrap();
    let serving = s
        .run_until(20_000, |s| {
            serving_primary(s, 3).is_some() && s.acknowledged().len() >= acked + 10
        })
        .unwrap();
    assert!(serving, "two replicas back did not serve again");
    converge(&mut s);
    assert_eq!(s.acknowledged().len(), 2 * 40);
}

/// What `Replica::resume_with_log` makes of a log, by the log's state: a
/// backup of a view whose log it installed resumes `Normal` with its
/// journal, a primary starts a view change past its view, one caught in a
/// view change votes again in it, a log newer than the superblock raises
/// the view and persists it before any send, and a log written while
/// invisible (or by a single replica) gives an ordinary restart.
#[test]
fn given_a_logged_journal_when_resumed_should_take_the_state_its_log_allows() {
    use common::{GroupId, Op, ReplicaId};
    use consensus::vsr::{
        Action, AppliedState, Config, DurableState, Effect, LoggedJournal, Replica,
    };
    let mut s = durable_sim(48, 3);
    assert!(
        s.run_until(10_000, |s| s
            .replica(1)
            .is_some_and(|x| x.op() > x.commit_min()))
            .unwrap(),
        "backup 1 never held an op above its applied point"
    );
    let x = s.replica(1).unwrap();
    let logged = x.logged_journal();
    assert!(logged.visible && !logged.ops.is_empty());
    let applied = AppliedState {
        commit_min: x.commit_min(),
        checksum: x.commit_min_checksum(),
    };
    let head = x.op();
    let config = |r: u8, n: u8| Config::new(ReplicaId(r), n, GroupId(0));
    let superblock = DurableState {
        view: logged.view,
        log_view: logged.log_view,
        commit: Op(0),
    };
    let backup = Replica::resume_with_log(config(1, 3), superblock, applied, &logged);
    assert_eq!(
        (backup.status(), backup.view(), backup.op()),
        (Status::Normal, logged.view, head)
    );
    assert!(backup.is_quorum_visible());
    assert!(backup.commit_max() >= logged.commit);

    let empty = |view: u32, log_view: u32| LoggedJournal {
        view,
        log_view,
        visible: true,
        ..LoggedJournal::default()
    };
    let zero = DurableState::default();
    let none = AppliedState::default();
    let primary = Replica::resume_with_log(config(0, 3), zero, none, &empty(0, 0));
    assert_eq!((primary.status(), primary.view()), (Status::ViewChange, 1));
    let voter = Replica::resume_with_log(config(1, 3), zero, none, &empty(2, 1));
    assert_eq!((voter.status(), voter.view()), (Status::ViewChange, 2));

    let mut raised = Replica::resume_with_log(config(1, 3), zero, none, &empty(5, 5));
    assert_eq!((raised.status(), raised.view()), (Status::Normal, 5));
    let persisted = raised.take_actions().into_iter().any(|a| {
        matches!(
            a,
            Action::Effect(Effect::PersistState {
                view: 5,
                log_view: 5,
                ..
            })
        )
    });
    assert!(
        persisted,
        "the raised view must be persisted before any send"
    );

    let mut invisible = empty(0, 0);
    invisible.visible = false;
    let amnesiac = Replica::resume_with_log(config(1, 3), zero, none, &invisible);
    assert!(!amnesiac.is_quorum_visible());
    let single = Replica::resume_with_log(config(0, 1), zero, none, &logged);
    assert_eq!(
        single.op(),
        Op(0),
        "a single replica keeps nothing unapplied"
    );
}

/// The primary of the sim's current view among `0..n`, if one is serving.
fn serving_primary(s: &Simulation, n: u8) -> Option<u8> {
    (0..n).find(|&r| s.replica(r).is_some_and(|x| x.is_caught_up_primary()))
}

/// Whether replica `r` is up and the `Normal` primary of a view at least
/// `view`.
fn leads(s: &Simulation, r: u8, view: u32) -> bool {
    s.replica(r)
        .is_some_and(|v| v.is_primary() && v.status() == Status::Normal && v.view() >= view)
}

#[test]
fn given_a_read_on_a_healthy_primary_when_a_backup_echoes_should_be_confirmed_within_a_round_trip()
{
    let mut s = sim(quiet(31, 3));
    assert!(s.run_until(5_000, |s| s.acknowledged().len() >= 5).unwrap());
    let p = serving_primary(&s, 3).expect("a serving primary");
    let round = s.replica_mut(p).unwrap().read_fence();
    assert!(round >= 1, "a group of three needs a backup's echo");
    assert!(
        !s.replica(p).unwrap().read_confirmed(round),
        "a read is never confirmed before any backup answered"
    );
    // The delay is at most 3 ticks each way.
    let confirmed = s
        .run_until(20, |s| s.replica(p).unwrap().read_confirmed(round))
        .unwrap();
    assert!(confirmed, "a healthy primary's read check did not complete");
    // A later read needs a later round: the echo above may predate it.
    let next = s.replica_mut(p).unwrap().read_fence();
    assert!(next > round);
    assert!(!s.replica(p).unwrap().read_confirmed(next));
    converge(&mut s);
}

#[test]
fn given_groups_of_one_or_two_when_a_read_is_fenced_should_need_no_round() {
    for n in [1u8, 2] {
        let mut s = sim(quiet(32, n));
        assert!(s.run_until(5_000, |s| s.acknowledged().len() >= 3).unwrap());
        let p = serving_primary(&s, n).expect("a serving primary");
        let round = s.replica_mut(p).unwrap().read_fence();
        assert_eq!(round, 0, "n = {n}: no view can start without this primary");
        assert!(s.replica(p).unwrap().read_confirmed(round));
    }
}

#[test]
fn given_a_primary_cut_off_while_others_move_on_when_it_is_read_from_should_never_confirm() {
    for n in [3u8, 5] {
        let mut s = sim(quiet(33, n));
        assert!(s.run_until(5_000, |s| s.acknowledged().len() >= 5).unwrap());
        let p = serving_primary(&s, n).expect("a serving primary");
        let old_view = s.replica(p).unwrap().view();
        s.partition(1 << p);
        let round = s.replica_mut(p).unwrap().read_fence();
        let mut confirmed_ever = false;
        let moved_on = s
            .run_until(20_000, |s| {
                confirmed_ever |= s.replica(p).unwrap().read_confirmed(round);
                (0..n).any(|r| {
                    r != p
                        && s.replica(r)
                            .is_some_and(|x| x.is_caught_up_primary() && x.view() > old_view)
                })
            })
            .unwrap();
        assert!(moved_on, "n = {n}: the others elected no new primary");
        assert!(
            s.replica(p).unwrap().is_primary(),
            "n = {n}: the cut-off primary still believes it leads"
        );
        assert!(
            !confirmed_ever,
            "n = {n}: a deposed primary confirmed a read"
        );
        // Still cut off for a while longer: the read never confirms.
        for _ in 0..500 {
            s.step().unwrap();
            assert!(!s.replica(p).unwrap().read_confirmed(round), "n = {n}");
        }
        // Healed: until a frame of the newer view reaches it, it still
        // believes it leads, and its Pings now reach backups of that view.
        s.heal_partition();
        for _ in 0..200 {
            s.step().unwrap();
            let old = s.replica(p).unwrap();
            assert!(
                !old.read_confirmed(round) || old.view() > old_view,
                "n = {n}: confirmed in the view it was deposed from"
            );
        }
        converge(&mut s);
    }
}

/// A replica's clock counts its ticks since it booted, so a restarted one
/// trails its peers'. When it becomes primary it must still order new ops
/// after the ones it learned by the view change or its rejoin (the commit
/// point's header included, which its journal does not keep): a
/// DoViewChange holding an op timestamped before its parent is refused by
/// every peer, and while that op is uncommitted no view can complete
/// (replog-sim mixed seed 12100326, group 0, an idle metadata group:
/// views 3 to 45 and none started).
#[test]
fn given_a_restarted_replica_elected_primary_when_it_orders_ops_should_timestamp_them_after_the_views_log()
 {
    let mut config = quiet(17, 3);
    config.clients = 0;
    let mut s = sim(config);
    let client = 99;
    let committed = |s: &mut Simulation, r: u8, req: Request| {
        let want = s.committed().len() + 1;
        assert!(matches!(
            s.submit(r, req).unwrap(),
            RequestOutcome::Prepared { .. }
        ));
        assert!(s.run_until(2_000, |s| s.committed().len() == want).unwrap());
    };
    // Replica 0's clock runs far ahead before it orders anything.
    s.run_for(3_000).unwrap();
    committed(&mut s, 0, request(client, 0, 0, OPERATION_REGISTER));
    let session = s
        .replica(0)
        .unwrap()
        .client_table()
        .session(client)
        .unwrap();
    committed(&mut s, 0, request(client, session, 1, OPERATION_APPEND));
    // Replica 1 applied both, then restarts into an idle group: no
    // prepare or repair tells it the time.
    let applied = s
        .run_until(2_000, |s| s.replica(1).unwrap().commit_min().0 == 2)
        .unwrap();
    assert!(applied);
    s.crash(1);
    s.restart(1).unwrap();
    let rejoined = s
        .run_until(5_000, |s| s.replica(1).unwrap().is_quorum_visible())
        .unwrap();
    assert!(rejoined, "replica 1 never rejoined");
    // The old primary goes; view 1's primary is the restarted replica.
    s.crash(0);
    let elected = s.run_until(5_000, |s| leads(s, 1, 1)).unwrap();
    assert!(elected, "replica 1 did not become primary");
    let before = s.replica(1).unwrap().op();
    committed(&mut s, 1, request(client, session, 2, OPERATION_APPEND));
    let r2 = s.replica(2).unwrap();
    let (Some(parent), Some(op)) = (r2.journal_entry(before), r2.journal_entry(before + 1)) else {
        panic!("replica 2 does not hold ops {before} and {}", before + 1);
    };
    assert!(
        op.header.timestamp > parent.header.timestamp,
        "op {} timestamped {} after op {before}'s {}",
        before + 1,
        op.header.timestamp,
        parent.header.timestamp
    );
    // The next view change carries both in its votes: replica 0 rejoins,
    // then the new primary goes too.
    s.restart(0).unwrap();
    let back = s
        .run_until(5_000, |s| s.replica(0).unwrap().is_quorum_visible())
        .unwrap();
    assert!(back, "replica 0 never rejoined");
    s.crash(1);
    let next = s
        .run_until(5_000, |s| (0..3).any(|r| leads(s, r, 2)))
        .unwrap();
    assert!(next, "no view after the restarted primary's");
    converge(&mut s);
}
