//! Every metadata operation, accepted and refused: ids, names, Iggy error
//! codes, effects, and "a refusal changes nothing" (checked by `Sm` on
//! every refusal).
#![allow(clippy::unwrap_used)]

mod support;

use common::{GroupId, Op, PartitionId, StreamId, TopicId};
use metadata::{
    ApplyError, Durability, Identifier, MessageExpiry, MetadataOp, MetadataState, Outcome,
    PartitionEffect, ROOT_USER, SessionId, TopicConfig, UserId,
};
use support::*;

fn created_groups(effects: &[PartitionEffect]) -> Vec<(GroupId, u32, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            PartitionEffect::CreatePartitionGroup {
                group,
                partition,
                incarnation,
                ..
            } => Some((*group, partition.0, *incarnation)),
            _ => None,
        })
        .collect()
}

fn deleted_groups(effects: &[PartitionEffect]) -> Vec<GroupId> {
    effects
        .iter()
        .filter_map(|e| match e {
            PartitionEffect::DeletePartitionGroup { group } => Some(*group),
            _ => None,
        })
        .collect()
}

#[test]
fn given_new_streams_when_created_should_number_from_zero_and_keep_the_ops_timestamp() {
    let mut sm = Sm::default();
    assert_eq!(
        sm.ok(create_stream("a")).outcome,
        Outcome::StreamCreated(StreamId(0))
    );
    assert_eq!(
        sm.ok(create_stream("b")).outcome,
        Outcome::StreamCreated(StreamId(1))
    );
    assert_eq!(sm.state.streams()[&StreamId(0)].created_at_us, 1_000);
    assert_eq!(sm.state.streams()[&StreamId(1)].name, "b");
}

#[test]
fn given_duplicate_or_invalid_stream_name_when_created_should_refuse_with_iggy_codes() {
    let mut sm = Sm::default();
    sm.ok(create_stream("a"));
    assert_eq!(sm.code(create_stream("a")), 1012);
    assert_eq!(sm.state.applied(), Op(2));
    // Names past 255 bytes or empty are refused by apply too (ops built
    // in-process; the codec refuses them on the wire).
    let mut st = MetadataState::new();
    let long = "x".repeat(256);
    let err = st
        .apply(
            Op(1),
            &MetadataOp::CreateStream {
                name: long,
                created_at_us: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 1013));
    let err = st
        .apply(
            Op(2),
            &MetadataOp::CreateStream {
                name: String::new(),
                created_at_us: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 1013));
    // A name of exactly 255 bytes is fine.
    assert!(st.apply(Op(3), &create_stream(&"y".repeat(255))).is_ok());
}

#[test]
fn given_deleted_stream_when_another_is_created_should_not_reuse_its_id() {
    let mut sm = Sm::default();
    sm.ok(create_stream("a"));
    sm.ok(MetadataOp::DeleteStream { stream: 0.into() });
    assert_eq!(
        sm.ok(create_stream("a")).outcome,
        Outcome::StreamCreated(StreamId(1))
    );
}

#[test]
fn given_streams_when_updated_should_rename_or_refuse() {
    let mut sm = Sm::default();
    sm.ok(create_stream("a"));
    sm.ok(create_stream("b"));
    sm.ok(MetadataOp::UpdateStream {
        stream: "a".into(),
        name: "c".into(),
    });
    assert_eq!(sm.state.streams()[&StreamId(0)].name, "c");
    // Renaming to its own name is no conflict.
    sm.ok(MetadataOp::UpdateStream {
        stream: 0.into(),
        name: "c".into(),
    });
    let rename = |stream: Identifier, name: &str| MetadataOp::UpdateStream {
        stream,
        name: name.into(),
    };
    assert_eq!(sm.code(rename(0.into(), "b")), 1012);
    assert_eq!(sm.code(rename(9.into(), "z")), 1009);
    assert_eq!(sm.code(rename("nope".into(), "z")), 1010);
}

#[test]
fn given_stream_with_topics_when_deleted_should_delete_every_partition_group() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    let a = created_groups(&sm.ok(create_topic(0, "a", 2)).effects);
    let b = created_groups(&sm.ok(create_topic(0, "b", 3)).effects);
    let deleted = deleted_groups(
        &sm.ok(MetadataOp::DeleteStream { stream: "s".into() })
            .effects,
    );
    let mut all: Vec<GroupId> = a.iter().chain(&b).map(|g| g.0).collect();
    all.sort();
    assert_eq!(deleted, all);
    assert!(sm.state.streams().is_empty());
    assert_eq!(sm.code(MetadataOp::DeleteStream { stream: 0.into() }), 1009);
    assert_eq!(
        sm.code(MetadataOp::DeleteStream { stream: "s".into() }),
        1010
    );
}

#[test]
fn given_topic_when_created_should_make_partitions_from_zero_with_fresh_groups_and_the_ops_incarnation()
 {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    let applied = sm.ok(create_topic(0, "t", 3));
    assert_eq!(
        applied.outcome,
        Outcome::TopicCreated(StreamId(0), TopicId(0))
    );
    let groups = created_groups(&applied.effects);
    assert_eq!(
        groups,
        vec![(GroupId(1), 0, 2), (GroupId(2), 1, 2), (GroupId(3), 2, 2)]
    );
    let t = &sm.state.streams()[&StreamId(0)].topics[&TopicId(0)];
    assert_eq!(t.partitions.len(), 3);
    assert_eq!(t.created_at_us, 2_000);
    assert_eq!(
        sm.ok(create_topic("s", "u", 0)).outcome,
        Outcome::TopicCreated(StreamId(0), TopicId(1))
    );
}

#[test]
fn given_bad_topic_requests_when_created_should_refuse_with_iggy_codes() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_stream("s2"));
    sm.ok(create_topic(0, "t", 1));
    assert_eq!(sm.code(create_topic(0, "t", 1)), 2013);
    // The same name in another stream is fine.
    sm.ok(create_topic(1, "t", 1));
    assert_eq!(sm.code(create_topic(7, "t", 1)), 1009);
    assert_eq!(sm.code(create_topic("zz", "t", 1)), 1010);
    let mut st = sm.state.clone();
    let next = Op(st.applied().0 + 1);
    let over = MetadataOp::CreateTopic {
        stream: 0.into(),
        name: "big".into(),
        partitions_count: 1001,
        config: TopicConfig::default(),
        created_at_us: 0,
    };
    let err = st.apply(next, &over).unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 2019));
    let zero_rf = MetadataOp::CreateTopic {
        stream: 0.into(),
        name: "rf".into(),
        partitions_count: 1,
        config: TopicConfig {
            replication_factor: 0,
            ..TopicConfig::default()
        },
        created_at_us: 0,
    };
    let err = st.apply(Op(next.0 + 1), &zero_rf).unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 4042));
    let empty = MetadataOp::CreateTopic {
        stream: 0.into(),
        name: String::new(),
        partitions_count: 1,
        config: TopicConfig::default(),
        created_at_us: 0,
    };
    let err = st.apply(Op(next.0 + 2), &empty).unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 2014));
}

#[test]
fn given_topic_when_updated_should_reconfigure_every_partition_or_refuse() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 2));
    sm.ok(create_topic(0, "u", 1));
    let config = TopicConfig {
        message_expiry: MessageExpiry::After { micros: 60_000_000 },
        durability: Durability::Persisted,
        ..TopicConfig::default()
    };
    let update = |topic: Identifier, name: &str| MetadataOp::UpdateTopic {
        stream: 0.into(),
        topic,
        name: name.into(),
        config,
    };
    let effects = sm.ok(update("t".into(), "t2")).effects;
    assert_eq!(effects.len(), 2);
    assert!(effects.iter().all(|e| matches!(
        e,
        PartitionEffect::ReconfigurePartitionGroup { config: c, .. }
            if c.durability == Durability::Persisted
    )));
    let t = &sm.state.streams()[&StreamId(0)].topics[&TopicId(0)];
    assert_eq!((t.name.as_str(), t.config), ("t2", config));
    assert_eq!(sm.code(update(0.into(), "u")), 2013);
    assert_eq!(sm.code(update(5.into(), "x")), 2010);
    assert_eq!(sm.code(update("t".into(), "x")), 2011);
}

#[test]
fn given_topic_when_deleted_and_recreated_should_never_reuse_a_group_id() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    let first = created_groups(&sm.ok(create_topic(0, "t", 2)).effects);
    let deleted = deleted_groups(
        &sm.ok(MetadataOp::DeleteTopic {
            stream: 0.into(),
            topic: "t".into(),
        })
        .effects,
    );
    assert_eq!(deleted, first.iter().map(|g| g.0).collect::<Vec<_>>());
    let second = created_groups(&sm.ok(create_topic(0, "t", 2)).effects);
    for (g, _, inc) in &second {
        assert!(first.iter().all(|(f, _, finc)| f != g && finc != inc));
    }
    let del = |topic: Identifier| MetadataOp::DeleteTopic {
        stream: 0.into(),
        topic,
    };
    assert_eq!(sm.code(del(0.into())), 2010);
    assert_eq!(sm.code(del("x".into())), 2011);
}

#[test]
fn given_purges_when_applied_should_advance_each_partitions_committed_generation() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 2));
    sm.ok(create_topic(0, "u", 1));
    let purge_t = MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: "t".into(),
    };
    let gens = |effects: &[PartitionEffect]| -> Vec<(u64, u64)> {
        effects
            .iter()
            .map(|e| match e {
                PartitionEffect::PurgePartition { group, generation } => (group.0, *generation),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    };
    assert_eq!(gens(&sm.ok(purge_t.clone()).effects), vec![(1, 1), (2, 1)]);
    assert_eq!(gens(&sm.ok(purge_t).effects), vec![(1, 2), (2, 2)]);
    assert_eq!(
        gens(&sm.ok(MetadataOp::PurgeStream { stream: 0.into() }).effects),
        vec![(1, 3), (2, 3), (3, 1)]
    );
    let infos = sm.state.partition_groups();
    assert_eq!(
        infos.iter().map(|i| i.purge_generation).collect::<Vec<_>>(),
        vec![3, 3, 1]
    );
    assert_eq!(sm.code(MetadataOp::PurgeStream { stream: 3.into() }), 1009);
    assert_eq!(
        sm.code(MetadataOp::PurgeTopic {
            stream: 0.into(),
            topic: 9.into()
        }),
        2010
    );
}

#[test]
fn given_partitions_when_added_and_removed_should_keep_ids_dense_and_groups_fresh() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 2));
    let add = |count: u32| MetadataOp::CreatePartitions {
        stream: 0.into(),
        topic: 0.into(),
        count,
        created_at_us: 5,
    };
    let del = |count: u32| MetadataOp::DeletePartitions {
        stream: 0.into(),
        topic: 0.into(),
        count,
    };
    let added = created_groups(&sm.ok(add(2)).effects);
    assert_eq!(added.iter().map(|g| g.1).collect::<Vec<_>>(), vec![2, 3]);
    let removed = deleted_groups(&sm.ok(del(3)).effects);
    assert_eq!(removed, vec![GroupId(4), GroupId(3), GroupId(2)]);
    let again = created_groups(&sm.ok(add(1)).effects);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, 1);
    assert_eq!(again[0].0, GroupId(5), "a deleted group id is never reused");
    assert_eq!(sm.code(add(0)), 2019);
    assert_eq!(sm.code(add(999)), 2019);
    sm.ok(add(998));
    assert_eq!(sm.code(add(1)), 2019);
    assert_eq!(sm.code(del(0)), 2019);
    sm.ok(del(999));
    assert_eq!(sm.code(del(2)), 2019);
    let t = &sm.state.streams()[&StreamId(0)].topics[&TopicId(0)];
    assert_eq!(t.partitions.len(), 1);
}

#[test]
fn given_consumer_groups_when_created_and_deleted_should_number_and_refuse_like_iggy() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 3));
    assert_eq!(
        sm.ok(create_group(0, 0, "g")).outcome,
        Outcome::ConsumerGroupCreated(StreamId(0), TopicId(0), metadata::ConsumerGroupId(0))
    );
    assert_eq!(sm.code(create_group(0, 0, "g")), 5004);
    assert_eq!(sm.code(create_group(0, 4, "g")), 2010);
    let del = |group: Identifier| MetadataOp::DeleteConsumerGroup {
        stream: 0.into(),
        topic: 0.into(),
        group,
    };
    assert_eq!(sm.code(del(3.into())), 5000);
    assert_eq!(sm.code(del("h".into())), 5003);
    sm.ok(del("g".into()));
    assert_eq!(
        sm.ok(create_group(0, 0, "g")).outcome,
        Outcome::ConsumerGroupCreated(StreamId(0), TopicId(0), metadata::ConsumerGroupId(1))
    );
    let mut st = sm.state.clone();
    let err = st
        .apply(
            Op(st.applied().0 + 1),
            &MetadataOp::CreateConsumerGroup {
                stream: 0.into(),
                topic: 0.into(),
                name: String::new(),
            },
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::Refused(r) if r.iggy_code() == 5005));
}

#[test]
fn given_members_when_joining_leaving_and_ending_sessions_should_rebalance_and_advance_generation()
{
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 4));
    sm.ok(create_topic(0, "u", 2));
    sm.ok(create_group(0, 0, "g"));
    sm.ok(create_group(0, 1, "h"));
    let group = |sm: &Sm, t: u32| {
        sm.state.streams()[&StreamId(0)].topics[&TopicId(t)].consumer_groups
            [&metadata::ConsumerGroupId(0)]
            .clone()
    };
    sm.ok(join(0, 0, 0, 10));
    assert_eq!(
        group(&sm, 0)
            .member_of(SessionId(10))
            .unwrap()
            .partitions
            .len(),
        4
    );
    let g0 = group(&sm, 0).generation;
    sm.ok(join(0, 0, 0, 11));
    let g = group(&sm, 0);
    assert!(g.generation > g0);
    assert_eq!(g.member_of(SessionId(10)).unwrap().partitions.len(), 2);
    assert_eq!(g.member_of(SessionId(11)).unwrap().partitions.len(), 2);
    // Joining twice is idempotent.
    sm.ok(join(0, 0, 0, 11));
    assert_eq!(group(&sm, 0).members.len(), 2);
    sm.ok(join(0, 1, 0, 11));
    assert_eq!(sm.code(leave(0, 0, 0, 99)), 5006);
    assert_eq!(sm.code(join(0, 0, 5, 1)), 5000);
    // The session ends: it leaves both groups, the rest is rebalanced.
    sm.ok(MetadataOp::EndSession {
        session: SessionId(11),
    });
    let g = group(&sm, 0);
    assert_eq!(g.members.len(), 1);
    assert_eq!(
        g.member_of(SessionId(10)).unwrap().partitions,
        (0..4).map(PartitionId).collect::<Vec<_>>()
    );
    assert!(group(&sm, 1).members.is_empty());
    sm.ok(leave(0, 0, 0, 10));
    assert!(group(&sm, 0).members.is_empty());
}

#[test]
fn given_partitions_added_to_a_topic_with_members_when_applied_should_assign_them() {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 1));
    sm.ok(create_group(0, 0, "g"));
    sm.ok(join(0, 0, 0, 1));
    sm.ok(join(0, 0, 0, 2));
    sm.ok(MetadataOp::CreatePartitions {
        stream: 0.into(),
        topic: 0.into(),
        count: 3,
        created_at_us: 0,
    });
    let g = &sm.state.streams()[&StreamId(0)].topics[&TopicId(0)].consumer_groups
        [&metadata::ConsumerGroupId(0)];
    let counts: Vec<usize> = g.members.values().map(|m| m.partitions.len()).collect();
    assert_eq!(counts, vec![2, 2]);
}

#[test]
fn given_users_when_created_deleted_and_changed_should_follow_iggy_rules() {
    let mut sm = Sm::default();
    assert_eq!(
        sm.ok(create_user("iggy")).outcome,
        Outcome::UserCreated(ROOT_USER)
    );
    assert_eq!(
        sm.ok(create_user("bob")).outcome,
        Outcome::UserCreated(UserId(1))
    );
    assert_eq!(sm.code(create_user("bob")), 46);
    assert_eq!(sm.code(MetadataOp::DeleteUser { user: 0.into() }), 48);
    assert_eq!(
        sm.code(MetadataOp::DeleteUser {
            user: "carol".into()
        }),
        20
    );
    let new_hash = hash("other");
    sm.ok(MetadataOp::ChangePassword {
        user: "bob".into(),
        password_hash: new_hash.clone(),
    });
    assert_eq!(sm.state.users()[&UserId(1)].password_hash, new_hash);
    sm.ok(MetadataOp::DeleteUser { user: "bob".into() });
    assert_eq!(
        sm.code(MetadataOp::ChangePassword {
            user: 1.into(),
            password_hash: new_hash
        }),
        20
    );
}

#[test]
fn given_an_op_applied_twice_or_out_of_order_when_applied_should_refuse_and_change_nothing() {
    let mut st = MetadataState::new();
    let a = st.apply(Op(1), &create_stream("a")).unwrap();
    let before = st.clone();
    assert_eq!(
        st.apply(Op(1), &create_stream("b")),
        Err(ApplyError::AlreadyApplied {
            op: Op(1),
            applied: Op(1)
        })
    );
    assert_eq!(
        st.apply(Op(3), &create_stream("b")),
        Err(ApplyError::Gap {
            op: Op(3),
            expected: Op(2)
        })
    );
    assert_eq!(st, before);
    assert_eq!(a.outcome, Outcome::StreamCreated(StreamId(0)));
}

#[test]
fn given_the_same_ops_when_applied_on_two_states_should_yield_equal_states_and_effects() {
    let ops = vec![
        create_stream("s"),
        create_topic(0, "t", 5),
        create_group(0, 0, "g"),
        join(0, 0, 0, 1),
        join(0, 0, 0, 2),
        create_stream("s"),
        MetadataOp::PurgeTopic {
            stream: 0.into(),
            topic: 0.into(),
        },
        leave(0, 0, 0, 1),
        MetadataOp::DeleteStream { stream: 0.into() },
    ];
    let mut a = Sm::default();
    let mut b = Sm::default();
    for op in ops {
        assert_eq!(a.apply(op.clone()), b.apply(op));
        assert_eq!(a.state, b.state);
    }
}
