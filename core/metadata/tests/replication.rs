//! The metadata group on three in-process replicas: every operation,
//! accepted and refused, leaves all replicas' applied states equal, with
//! the same effects; a view change in the middle of a create-topic or a
//! purge, with the client retrying at the new primary, takes effect once.
#![allow(clippy::unwrap_used)]

mod support;

use common::ReplicaId;
use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::rc::Rc;

use common::METADATA_GROUP;
use common::Prng;
use consensus::vsr::{Config, Frame, RequestOutcome, Status, TimeoutConfig};
use futures::executor::block_on;
use journal::FileSuperblock;
use metadata::{
    CommittedEffect, MetadataBus, MetadataGroup, MetadataOp, MetadataReply, MetadataState,
    MetadataStore, PartitionEffect, StoreConfig,
};
use storage::fs::{CrashMode, SimFs};
use support::*;

#[derive(Default)]
struct NetState {
    frames: VecDeque<(u8, u8, Frame)>,
    replies: Vec<MetadataReply>,
    down: BTreeSet<u8>,
    /// Frames from this replica are dropped (it still receives).
    mute: BTreeSet<u8>,
    /// Seeded faults: (prng, drop ‰, duplicate ‰, delay-to-next-tick ‰).
    faults: Option<(Prng, u64, u64, u64)>,
    /// Frames delayed to the next tick (reordered behind newer ones).
    later: Vec<(u8, u8, Frame)>,
}

#[derive(Clone, Default)]
struct Net(Rc<RefCell<NetState>>);

struct Bus {
    me: u8,
    net: Net,
}

impl MetadataBus for Bus {
    fn send_to_replica(&self, to: u8, frame: Frame) {
        self.net
            .0
            .borrow_mut()
            .frames
            .push_back((self.me, to, frame));
    }
    fn send_to_client(&self, reply: MetadataReply) {
        self.net.0.borrow_mut().replies.push(reply);
    }
}

type Group = MetadataGroup<SimFs, FileSuperblock<SimFs>, Bus>;

struct Cluster {
    fss: Vec<SimFs>,
    retention_ops: u64,
    groups: Vec<Group>,
    effects: Vec<Vec<CommittedEffect>>,
    net: Net,
    client: u128,
    session: u64,
    request: u64,
}

impl Cluster {
    fn open_replica_retaining(fs: &SimFs, r: u8, net: &Net, retention_ops: u64) -> Group {
        // Snapshots every few ops, so the runs cross snapshot steps too.
        let store_config = StoreConfig {
            snapshot_every_ops: 3,
            ..StoreConfig::default()
        };
        let (store, _) =
            block_on(MetadataStore::open(fs, Path::new("/meta"), store_config)).unwrap();
        let mut config = Config::new(ReplicaId(r), 3, METADATA_GROUP);
        config.timeouts = TimeoutConfig::scaled_down(5);
        config.seed = 7;
        config.retention_ops = retention_ops;
        let bus = Bus {
            me: r,
            net: net.clone(),
        };
        let superblock = FileSuperblock::new(fs.clone(), Path::new("/meta"));
        block_on(Group::open(config, 1, store, superblock, bus)).unwrap()
    }

    fn new() -> Self {
        Self::retaining(1024)
    }

    fn retaining(retention_ops: u64) -> Self {
        let net = Net::default();
        let fss: Vec<SimFs> = (0..3u64).map(|r| SimFs::new(r + 100)).collect();
        let groups = (0..3u8)
            .map(|r| Self::open_replica_retaining(&fss[usize::from(r)], r, &net, retention_ops))
            .collect();
        let mut c = Self {
            fss,
            retention_ops,
            groups,
            effects: vec![Vec::new(); 3],
            net,
            client: 0xC11E,
            session: 0,
            request: 0,
        };
        let p = c.primary();
        block_on(c.groups[p].register(c.client, 0)).unwrap();
        c.settle();
        let reply = c.net.0.borrow_mut().replies.pop().unwrap();
        c.session = reply.reply.session;
        assert_ne!(c.session, 0);
        c
    }

    /// Power loss on replica `r`: everything unsynced is lost, and it
    /// stays down until [`Self::reboot`].
    fn crash(&mut self, r: usize) {
        self.net.0.borrow_mut().down.insert(r as u8);
        self.fss[r].crash_with(CrashMode::DropAll);
    }

    /// Boots replica `r` from its disk and brings it back on the network.
    fn reboot(&mut self, r: usize) {
        self.groups[r] =
            Self::open_replica_retaining(&self.fss[r], r as u8, &self.net, self.retention_ops);
        self.net.0.borrow_mut().down.remove(&(r as u8));
    }

    fn up(&self, r: usize) -> bool {
        !self.net.0.borrow().down.contains(&(r as u8))
    }

    fn primary(&self) -> usize {
        (0..3)
            .find(|&r| {
                self.up(r)
                    && self.groups[r].replica().is_primary()
                    && self.groups[r].replica().status() == Status::Normal
            })
            .expect("a primary")
    }

    fn deliver(&mut self) {
        for _ in 0..100_000 {
            let next = self.net.0.borrow_mut().frames.pop_front();
            let Some((from, to, frame)) = next else {
                return;
            };
            let drop = {
                let mut guard = self.net.0.borrow_mut();
                let n = &mut *guard;
                let mut drop =
                    n.down.contains(&from) || n.down.contains(&to) || n.mute.contains(&from);
                if let Some((prng, drop_pm, dup_pm, delay_pm)) = &mut n.faults {
                    let roll = prng.next_u64() % 1000;
                    if roll < *drop_pm {
                        drop = true;
                    } else if roll < *drop_pm + *dup_pm {
                        n.frames.push_back((from, to, frame.clone()));
                    } else if roll < *drop_pm + *dup_pm + *delay_pm {
                        n.later.push((from, to, frame.clone()));
                        drop = true;
                    }
                }
                drop
            };
            if !drop {
                let _ = block_on(self.groups[usize::from(to)].on_frame(frame));
            }
        }
        panic!("the network never quiesced");
    }

    fn tick(&mut self) {
        {
            let mut n = self.net.0.borrow_mut();
            let later = std::mem::take(&mut n.later);
            n.frames.extend(later);
        }
        for r in 0..3 {
            if self.up(r) {
                let res = block_on(self.groups[r].on_tick());
                // A replica fenced by a failed disk waits for its reboot.
                assert!(res.is_ok() || self.groups[r].is_fenced(), "{res:?}");
            }
        }
        self.deliver();
        for r in 0..3 {
            self.effects[r].extend(self.groups[r].take_effects());
        }
    }

    /// Ticks until every live replica applied the same op and no frame is
    /// pending, then asserts their states are equal.
    fn settle(&mut self) {
        self.deliver();
        for _ in 0..5_000 {
            self.tick();
            let live: Vec<usize> = (0..3).filter(|&r| self.up(r)).collect();
            let ops: BTreeSet<u64> = live
                .iter()
                .map(|&r| self.groups[r].state().applied().0)
                .collect();
            let primary_ok = live.iter().any(|&r| {
                self.groups[r].replica().is_primary()
                    && self.groups[r].replica().status() == Status::Normal
                    && self.groups[r].replica().commit_min().0 == self.groups[r].replica().op().0
            });
            if ops.len() == 1 && primary_ok {
                let first = self.groups[live[0]].state();
                for &r in &live[1..] {
                    assert_eq!(self.groups[r].state(), first, "replica {r} diverged");
                }
                return;
            }
        }
        panic!("the cluster did not settle");
    }

    fn submit(&mut self, op: &MetadataOp) -> RequestOutcome {
        self.request += 1;
        let p = self.primary();
        block_on(self.groups[p].submit(self.client, self.session, self.request, 0, op)).unwrap()
    }

    /// Submits, settles, and returns the reply.
    fn run(&mut self, op: MetadataOp) -> MetadataReply {
        assert!(matches!(self.submit(&op), RequestOutcome::Prepared { .. }));
        self.settle();
        let reply = self.net.0.borrow_mut().replies.pop().unwrap();
        assert_eq!(reply.reply.request, self.request);
        reply
    }
}

#[test]
fn given_every_operation_accepted_and_refused_on_three_replicas_should_keep_states_and_effects_equal()
 {
    let mut c = Cluster::new();
    let ops = vec![
        (create_user("iggy"), None),
        (create_stream("s"), None),
        (create_stream("s"), Some(1012)),
        (
            MetadataOp::UpdateStream {
                stream: 0.into(),
                name: "s2".into(),
            },
            None,
        ),
        (create_topic(0, "t", 3), None),
        (create_topic(0, "t", 1), Some(2013)),
        (create_topic(9, "x", 1), Some(1009)),
        (create_group(0, 0, "g"), None),
        (join(0, 0, 0, 1), None),
        (join(0, 0, 0, 2), None),
        (leave(0, 0, 0, 9), Some(5006)),
        (
            MetadataOp::CreatePartitions {
                stream: 0.into(),
                topic: 0.into(),
                count: 2,
                created_at_us: 1,
            },
            None,
        ),
        (
            MetadataOp::DeletePartitions {
                stream: 0.into(),
                topic: 0.into(),
                count: 1,
            },
            None,
        ),
        (
            MetadataOp::PurgeTopic {
                stream: 0.into(),
                topic: 0.into(),
            },
            None,
        ),
        (
            MetadataOp::EndSession {
                session: metadata::SessionId(1),
            },
            None,
        ),
        (
            MetadataOp::DeleteConsumerGroup {
                stream: 0.into(),
                topic: 0.into(),
                group: "g".into(),
            },
            None,
        ),
        (
            MetadataOp::DeleteTopic {
                stream: 0.into(),
                topic: "t".into(),
            },
            None,
        ),
        (MetadataOp::DeleteUser { user: 0.into() }, Some(48)),
        (create_user("bob"), None),
        (create_user("bob"), Some(46)),
        (
            MetadataOp::ChangePassword {
                user: "bob".into(),
                password_hash: hash("new"),
            },
            None,
        ),
        (
            MetadataOp::ChangePassword {
                user: "nobody".into(),
                password_hash: hash("new"),
            },
            Some(20),
        ),
        (MetadataOp::DeleteUser { user: "bob".into() }, None),
        (
            MetadataOp::UpdateStream {
                stream: 7.into(),
                name: "z".into(),
            },
            Some(1009),
        ),
        (create_topic(0, "v", 1), None),
        (
            MetadataOp::UpdateTopic {
                stream: 0.into(),
                topic: "v".into(),
                name: "v2".into(),
                config: metadata::TopicConfig {
                    durability: metadata::Durability::Persisted,
                    ..metadata::TopicConfig::default()
                },
            },
            None,
        ),
        (
            MetadataOp::UpdateTopic {
                stream: 0.into(),
                topic: "nope".into(),
                name: "x".into(),
                config: metadata::TopicConfig::default(),
            },
            Some(2011),
        ),
        (create_group(0, 1, "h"), None),
        (create_group(0, 1, "h"), Some(5004)),
        (join(0, 1, 9, 1), Some(5000)),
        (
            MetadataOp::DeleteConsumerGroup {
                stream: 0.into(),
                topic: 1.into(),
                group: "zz".into(),
            },
            Some(5003),
        ),
        (
            MetadataOp::CreatePartitions {
                stream: 0.into(),
                topic: 1.into(),
                count: 1000,
                created_at_us: 1,
            },
            Some(2019),
        ),
        (
            MetadataOp::DeletePartitions {
                stream: 0.into(),
                topic: 1.into(),
                count: 5,
            },
            Some(2019),
        ),
        (
            MetadataOp::PurgeTopic {
                stream: 0.into(),
                topic: 8.into(),
            },
            Some(2010),
        ),
        (
            MetadataOp::DeleteTopic {
                stream: 0.into(),
                topic: 8.into(),
            },
            Some(2010),
        ),
        (MetadataOp::PurgeStream { stream: 5.into() }, Some(1009)),
        (MetadataOp::PurgeStream { stream: 0.into() }, None),
        (MetadataOp::DeleteStream { stream: 0.into() }, None),
        (MetadataOp::DeleteStream { stream: 0.into() }, Some(1009)),
    ];
    for (op, refused) in ops {
        let name = op.name();
        let reply = c.run(op);
        match (reply.outcome, refused) {
            (Some(Ok(_)), None) => {}
            (Some(Err(r)), Some(code)) => assert_eq!(r.iggy_code(), code, "{name}"),
            (other, want) => panic!("{name}: got {other:?}, wanted refusal {want:?}"),
        }
        assert_eq!(c.effects[0], c.effects[1], "after {name}");
        assert_eq!(c.effects[1], c.effects[2], "after {name}");
    }
    // Each create and delete of a partition group happened once per
    // replica.
    let creates = c.effects[0]
        .iter()
        .filter(|e| matches!(e.effect, PartitionEffect::CreatePartitionGroup { .. }))
        .count();
    let deletes = c.effects[0]
        .iter()
        .filter(|e| matches!(e.effect, PartitionEffect::DeletePartitionGroup { .. }))
        .count();
    // t: 3 + 2 added, 1 removed (deleted with t), v: 1 (deleted with the
    // stream).
    assert_eq!((creates, deletes), (6, 6));
}

/// Orders `op` on the primary, lets the prepare reach the backups but not
/// their acknowledgements, takes the primary down, lets the others elect a
/// new one, retries the same request there, brings the old primary back,
/// and returns the effects of each replica after the op.
fn view_change_mid(op: MetadataOp) -> (Cluster, Vec<Vec<CommittedEffect>>) {
    let mut c = Cluster::new();
    c.run(create_stream("s"));
    c.run(create_topic(0, "t", 2));
    let marks: Vec<usize> = c.effects.iter().map(Vec::len).collect();
    let old = c.primary();
    let view = c.groups[old].replica().view();
    for r in 0..3 {
        if r != old {
            c.net.0.borrow_mut().mute.insert(r as u8);
        }
    }
    assert!(matches!(c.submit(&op), RequestOutcome::Prepared { .. }));
    c.deliver();
    assert!(
        (0..3).all(|r| c.groups[r].replica().op().0 == c.groups[old].replica().op().0),
        "the prepare reached every backup"
    );
    {
        let mut n = c.net.0.borrow_mut();
        n.mute.clear();
        n.down.insert(old as u8);
    }
    for _ in 0..5_000 {
        c.tick();
        let p = (0..3).find(|&r| {
            r != old
                && c.groups[r].replica().is_primary()
                && c.groups[r].replica().status() == Status::Normal
                && c.groups[r].replica().view() > view
        });
        if p.is_some() {
            break;
        }
    }
    let new = c.primary();
    assert_ne!(new, old);
    // The client retries the same request at the new primary.
    let retried = block_on(c.groups[new].submit(c.client, c.session, c.request, 0, &op)).unwrap();
    assert!(
        matches!(
            retried,
            RequestOutcome::Answered | RequestOutcome::InFlight | RequestOutcome::Prepared { .. }
        ),
        "{retried:?}"
    );
    c.net.0.borrow_mut().down.clear();
    c.settle();
    let after = (0..3).map(|r| c.effects[r][marks[r]..].to_vec()).collect();
    (c, after)
}

#[test]
fn given_a_view_change_in_the_middle_of_create_topic_when_retried_should_create_its_partitions_once()
 {
    let (c, effects) = view_change_mid(create_topic(0, "new", 2));
    for (r, e) in effects.iter().enumerate() {
        let creates: Vec<_> = e
            .iter()
            .filter(|x| matches!(x.effect, PartitionEffect::CreatePartitionGroup { .. }))
            .collect();
        assert_eq!(creates.len(), 2, "replica {r}: {e:?}");
    }
    assert_eq!(effects[0], effects[1]);
    assert_eq!(effects[1], effects[2]);
    let s = &c.groups[0].state().streams()[&common::StreamId(0)];
    assert_eq!(s.topics.len(), 2);
}

#[test]
fn given_a_view_change_in_the_middle_of_a_purge_when_retried_should_purge_once() {
    let (c, effects) = view_change_mid(MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: 0.into(),
    });
    for (r, e) in effects.iter().enumerate() {
        let gens: Vec<u64> = e
            .iter()
            .map(|x| match x.effect {
                PartitionEffect::PurgePartition { generation, .. } => generation,
                ref other => panic!("replica {r}: unexpected {other:?}"),
            })
            .collect();
        assert_eq!(gens, vec![1, 1], "replica {r}");
    }
    let infos = c.groups[1].state().partition_groups();
    assert!(infos.iter().all(|i| i.purge_generation == 1));
}

#[test]
fn given_a_view_change_in_the_middle_of_delete_stream_when_retried_should_delete_once() {
    let (_, effects) = view_change_mid(MetadataOp::DeleteStream { stream: 0.into() });
    for e in &effects {
        let deletes = e
            .iter()
            .filter(|x| matches!(x.effect, PartitionEffect::DeletePartitionGroup { .. }))
            .count();
        assert_eq!(deletes, 2);
    }
}

#[test]
fn given_a_request_retried_after_its_reply_when_resubmitted_should_be_answered_without_a_new_op() {
    let mut c = Cluster::new();
    c.run(create_stream("s"));
    c.run(create_topic(0, "t", 1));
    let applied = c.groups[0].state().applied();
    let marks: Vec<usize> = c.effects.iter().map(Vec::len).collect();
    let p = c.primary();
    let op = MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: 0.into(),
    };
    // Request number of the create-topic, retried with another body.
    let again = block_on(c.groups[p].submit(c.client, c.session, c.request, 0, &op)).unwrap();
    assert_eq!(again, RequestOutcome::Answered);
    c.settle();
    assert_eq!(c.groups[0].state().applied(), applied);
    for (effects, mark) in c.effects.iter().zip(&marks) {
        assert_eq!(effects.len(), *mark);
    }
}

fn restart_scenario(victim: impl Fn(&Cluster) -> usize) {
    let mut c = Cluster::new();
    c.run(create_stream("s"));
    c.run(create_topic(0, "t", 2));
    let r = victim(&c);
    c.crash(r);
    // Settle among the two others (a view change if the primary died).
    for _ in 0..2_000 {
        c.tick();
        if (0..3).any(|x| {
            c.up(x)
                && c.groups[x].replica().is_primary()
                && c.groups[x].replica().status() == Status::Normal
        }) {
            break;
        }
    }
    c.run(create_topic(0, "u", 1));
    c.run(MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: "t".into(),
    });
    c.reboot(r);
    c.settle();
    c.run(create_stream("after"));
    for x in 0..3 {
        assert_eq!(c.groups[x].state(), c.groups[0].state(), "replica {x}");
    }
    // Effects before the crash plus those after the reboot are exactly the
    // others' (each committed op's effects once per replica).
    let other = (r + 1) % 3;
    assert_eq!(c.effects[r], c.effects[other], "replica {r}");
    assert_eq!(
        c.groups[r].state().applied(),
        c.groups[other].state().applied()
    );
}

#[test]
fn given_a_backup_losing_power_when_rebooted_should_catch_up_with_equal_state_and_effects_once() {
    restart_scenario(|c| (c.primary() + 1) % 3);
}

#[test]
fn given_the_primary_losing_power_when_rebooted_should_catch_up_with_equal_state_and_effects_once()
{
    restart_scenario(Cluster::primary);
}

/// Cuts the power of a backup after `cut` filesystem calls while ops
/// commit, reboots it from what its disk kept, and checks it converges.
/// Returns whether the cut landed before the run ended.
fn power_cut_run(cut: u64, mode: CrashMode) -> bool {
    let mut c = Cluster::new();
    c.run(create_stream("s"));
    let b = (c.primary() + 1) % 3;
    c.fss[b].cut_power_after(cut);
    let ops = [
        create_topic(0, "t", 2),
        create_group(0, 0, "g"),
        join(0, 0, 0, 1),
        MetadataOp::PurgeTopic {
            stream: 0.into(),
            topic: 0.into(),
        },
        MetadataOp::DeleteTopic {
            stream: 0.into(),
            topic: 0.into(),
        },
    ];
    for op in ops {
        assert!(matches!(c.submit(&op), RequestOutcome::Prepared { .. }));
        // The other two commit without the victim if it stopped.
        for _ in 0..200 {
            c.tick();
        }
    }
    let fenced = c.groups[b].is_fenced();
    c.net.0.borrow_mut().down.insert(b as u8);
    c.fss[b].crash_with(mode);
    c.reboot(b);
    c.settle();
    for x in 0..3 {
        assert_eq!(
            c.groups[x].state(),
            c.groups[0].state(),
            "cut {cut}: replica {x}"
        );
    }
    if mode == CrashMode::DropAll {
        // What was lost is re-applied; what was kept was synced before its
        // effects were handed out: each op's effects once.
        let other = (b + 1) % 3;
        assert_eq!(c.effects[b], c.effects[other], "cut {cut}");
    }
    fenced
}

#[test]
fn given_a_power_cut_at_every_call_of_a_backups_commits_when_rebooted_should_converge_with_effects_once()
 {
    let mut cut = 0;
    while power_cut_run(cut, CrashMode::DropAll) {
        cut += 1;
        assert!(cut < 1_000, "the backup never finished its commits");
    }
    assert!(cut >= 10, "only {cut} calls were cut");
}

#[test]
fn given_seeded_power_cuts_of_a_backup_when_rebooted_should_converge_to_equal_states() {
    let mut cut = 0;
    while power_cut_run(cut, CrashMode::Seeded) {
        cut += 1;
        assert!(cut < 1_000);
    }
}

#[test]
fn given_a_replica_down_past_the_peers_retention_when_rebooted_should_catch_up_by_snapshot_transfer()
 {
    let mut c = Cluster::retaining(4);
    c.run(create_stream("s"));
    c.run(create_topic(0, "t", 2));
    let b = (c.primary() + 1) % 3;
    c.crash(b);
    for i in 0..10 {
        c.run(create_topic(0, &format!("t{i}"), 1));
    }
    c.run(MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: "t".into(),
    });
    c.run(MetadataOp::DeleteTopic {
        stream: 0.into(),
        topic: "t0".into(),
    });
    c.reboot(b);
    let mut needed = None;
    for _ in 0..2_000 {
        c.tick();
        needed = c.groups[b].state_transfer_needed();
        if needed.is_some() {
            break;
        }
    }
    let needed = needed.expect("repair concluded that a transfer is needed");
    let p = c.primary();
    assert_eq!(needed.peer.index(), p);
    let offer = c.groups[p].transfer_offer().unwrap();
    // Refusals first: a damaged artifact, a reordered manifest, a backup's
    // offer; none changes anything.
    let before = c.groups[b].state().clone();
    let mut damaged = offer.artifacts.clone();
    damaged[0][20] ^= 1;
    assert!(matches!(
        block_on(c.groups[b].install_transfer(&offer.manifest, &damaged)),
        Err(metadata::GroupError::Transfer(
            metadata::TransferError::ArtifactMismatch
        ))
    ));
    let reversed: Vec<_> = offer.manifest.iter().rev().copied().collect();
    assert!(matches!(
        block_on(c.groups[b].install_transfer(&reversed, &offer.artifacts)),
        Err(metadata::GroupError::Transfer(
            metadata::TransferError::UnexpectedManifest
        ))
    ));
    let other_backup = 3 - p - b;
    assert_eq!(
        c.groups[other_backup].transfer_offer().err(),
        Some(metadata::TransferError::NotCaughtUpPrimary)
    );
    assert_eq!(*c.groups[b].state(), before);
    assert!(c.groups[b].replica().client_table().export().is_empty());
    let effects =
        block_on(c.groups[b].install_transfer(&offer.manifest, &offer.artifacts)).unwrap();
    assert!(!effects.is_empty());
    // The client table came with the snapshot: retries stay deduplicated.
    assert_eq!(
        c.groups[b].replica().client_table().export(),
        c.groups[p].replica().client_table().export()
    );
    c.settle();
    c.run(create_stream("after"));
    let bytes: Vec<Vec<u8>> = (0..3)
        .map(|r| metadata::encode_snapshot(c.groups[r].state()))
        .collect();
    assert_eq!(bytes[0], bytes[1]);
    assert_eq!(bytes[1], bytes[2]);
    // The victim's effects (before the crash, the install's reconciliation,
    // after) leave exactly the live partition groups.
    let mut live = BTreeSet::new();
    for e in &c.effects[b] {
        match e.effect {
            PartitionEffect::CreatePartitionGroup { group, .. } => assert!(live.insert(group)),
            PartitionEffect::DeletePartitionGroup { group } => assert!(live.remove(&group)),
            _ => {}
        }
    }
    let want: BTreeSet<_> = c.groups[b]
        .state()
        .partition_groups()
        .iter()
        .map(|i| i.group)
        .collect();
    assert_eq!(live, want);
    // A second install of the same offer is stale.
    assert!(matches!(
        block_on(c.groups[b].install_transfer(&offer.manifest, &offer.artifacts)),
        Err(metadata::GroupError::Transfer(
            metadata::TransferError::StaleTransfer { .. }
        ))
    ));
}

/// A topic as a client sees it: name, consumer groups, purge generations.
type TopicView = (String, usize, Vec<u64>);

/// A lockstep client over a seeded faulty network (drops, duplicates,
/// reordering, one replica isolated now and then): each request is retried
/// with the same number until answered. After healing, all replicas hold
/// equal states and effects, and the state is what the answered requests
/// applied once each, in order.
fn faulty_run(seed: u64) {
    let mut c = Cluster::new();
    let mut prng = Prng::new(seed);
    c.net.0.borrow_mut().faults = Some((Prng::new(seed ^ 0xFA17), 50, 30, 60));
    let mut model = Sm::default();
    // Replay the setup the cluster did (nothing but a Register).
    let pick = |prng: &mut Prng, n: u64| prng.next_u64() % n;
    for step in 0..25u64 {
        // By name, so deletes and re-creates keep hitting live objects.
        let sname = |prng: &mut Prng| -> metadata::Identifier {
            metadata::Identifier::Name(format!("s{}", pick(prng, 2)))
        };
        let tname = |prng: &mut Prng| -> metadata::Identifier {
            metadata::Identifier::Name(format!("t{}", pick(prng, 2)))
        };
        let op = match pick(&mut prng, 7) {
            0 | 1 => create_stream(&format!("s{}", pick(&mut prng, 2))),
            2 => MetadataOp::CreateTopic {
                stream: sname(&mut prng),
                name: format!("t{}", pick(&mut prng, 2)),
                partitions_count: 1 + pick(&mut prng, 2) as u32,
                config: metadata::TopicConfig::default(),
                created_at_us: 3,
            },
            3 => MetadataOp::PurgeTopic {
                stream: sname(&mut prng),
                topic: tname(&mut prng),
            },
            4 => MetadataOp::DeleteStream {
                stream: sname(&mut prng),
            },
            5 => MetadataOp::CreatePartitions {
                stream: sname(&mut prng),
                topic: tname(&mut prng),
                count: 1,
                created_at_us: 5,
            },
            _ => MetadataOp::CreateConsumerGroup {
                stream: sname(&mut prng),
                topic: tname(&mut prng),
                name: "g".into(),
            },
        };
        if step % 8 == 3 {
            let r = pick(&mut prng, 3) as u8;
            c.net.0.borrow_mut().down.insert(r);
        }
        if step % 8 == 6 {
            c.net.0.borrow_mut().down.clear();
        }
        c.request += 1;
        let mut answered = false;
        'attempts: for _ in 0..60 {
            let primary = (0..3).find(|&r| {
                c.up(r)
                    && c.groups[r].replica().is_primary()
                    && c.groups[r].replica().status() == Status::Normal
            });
            if let Some(p) = primary {
                let _ = block_on(c.groups[p].submit(c.client, c.session, c.request, 0, &op));
            }
            for _ in 0..40 {
                c.tick();
                let got = c
                    .net
                    .0
                    .borrow()
                    .replies
                    .iter()
                    .any(|r| r.reply.request == c.request);
                if got {
                    answered = true;
                    break 'attempts;
                }
            }
        }
        assert!(
            answered,
            "seed {seed}: request {} never answered",
            c.request
        );
        let _ = model.apply(op);
    }
    // Every answered request took exactly one op (plus the Register).
    let effects_expected = model.state.partition_groups().len();
    {
        let mut n = c.net.0.borrow_mut();
        n.faults = None;
        n.down.clear();
    }
    c.settle();
    assert_eq!(c.effects[0], c.effects[1], "seed {seed}");
    assert_eq!(c.effects[1], c.effects[2], "seed {seed}");
    // The model applied each answered request once, in order; the cluster
    // also applied the client's Register, so op numbers (and with them
    // incarnations) differ: compare what a client sees.
    let view = |st: &MetadataState| -> Vec<(String, Vec<TopicView>)> {
        st.streams()
            .values()
            .map(|s| {
                (
                    s.name.clone(),
                    s.topics
                        .values()
                        .map(|t| {
                            (
                                t.name.clone(),
                                t.consumer_groups.len(),
                                t.partitions.values().map(|p| p.purge_generation).collect(),
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(view(c.groups[0].state()), view(&model.state), "seed {seed}");
    // A request ordered twice across a view change would occupy a second
    // op as a skipped duplicate; the client-visible state above proves it
    // took effect once either way.
    assert!(c.groups[0].state().applied().0 >= 26, "seed {seed}");
    assert_eq!(
        c.groups[0].state().partition_groups().len(),
        effects_expected,
        "seed {seed}"
    );
}

#[test]
fn given_seeded_network_faults_and_retries_when_healed_should_agree_and_apply_each_request_once() {
    for seed in 1..=12 {
        faulty_run(seed);
    }
}

#[test]
fn given_the_primary_cannot_make_an_op_durable_when_it_commits_should_not_answer_the_client() {
    let mut c = Cluster::new();
    c.run(create_stream("s"));
    let p = c.primary();
    c.net.0.borrow_mut().replies.clear();
    // Its replica log takes the prepare (a write and a sync) before the
    // prepare leaves; the power goes right after, so the op commits at
    // the quorum while the primary's own WAL append fails.
    c.fss[p].cut_power_after(2);
    assert!(matches!(
        c.submit(&create_topic(0, "t", 1)),
        RequestOutcome::Prepared { .. }
    ));
    for _ in 0..50 {
        c.tick();
    }
    assert!(c.groups[p].is_fenced(), "the primary's WAL append failed");
    assert!(
        c.net.0.borrow().replies.is_empty(),
        "a reply went out for an op its primary could not make durable"
    );
    // Its power comes back (a reboot): the op committed at the quorum is
    // applied everywhere exactly once.
    c.crash(p);
    c.reboot(p);
    c.settle();
    for r in 0..3 {
        let s = &c.groups[r].state().streams()[&common::StreamId(0)];
        assert_eq!(s.topics.len(), 1, "replica {r}");
    }
    assert_eq!(c.effects[0], c.effects[1]);
    assert_eq!(c.effects[1], c.effects[2]);
}

/// Found by the cluster simulator (replog-sim seed 359, mixed profile):
/// the primary prepared an op in view 0, lost power before anything was
/// committed, and came back with a superblock of view 0 and nothing
/// applied — which `open` took for a brand-new group. Restarted as new it
/// led view 0 again from an empty log and prepared other contents under
/// the op number its backups held (a fork; a backup's commit walk caught
/// it). A group whose superblock record exists restarts, quorum-invisible.
#[test]
fn given_group_that_booted_once_when_reopened_with_nothing_committed_should_restart_not_start_new()
{
    let net = Net::default();
    let fs = SimFs::new(359);
    let first = Cluster::open_replica_retaining(&fs, 0, &net, 1024);
    assert_eq!(first.replica().status(), Status::Normal, "a new group");
    // It may act in view 0 from here on (prepare, acknowledge); then the
    // power goes, keeping only what was synced.
    drop(first);
    fs.crash_with(CrashMode::DropAll);
    let again = Cluster::open_replica_retaining(&fs, 0, &net, 1024);
    assert_eq!(
        again.replica().status(),
        Status::Recovering,
        "reopened as a new group at view {} op {}",
        again.replica().view(),
        again.replica().op().0
    );
}
