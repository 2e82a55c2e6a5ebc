//! The listener's queries over the applied state: stream and topic details
//! with sizes aggregated from a caller's numbers, consumer groups and
//! assignments, routing, purge generations, login.
#![allow(clippy::unwrap_used)]

mod support;

use common::{GroupId, PartitionId, StreamId, TopicId};
use metadata::{
    ConsumerGroupId, Identifier, MetadataOp, PartitionStats, Refusal, SessionId, UserId,
};
use support::*;

/// Partition `g` holds `g * 100` bytes and `g` messages.
fn stats(g: GroupId) -> PartitionStats {
    PartitionStats {
        size_bytes: g.0 * 100,
        messages_count: g.0,
        segments_count: 1,
        current_offset: g.0.saturating_sub(1),
    }
}

fn setup() -> Sm {
    let mut sm = Sm::default();
    sm.ok(create_stream("s"));
    sm.ok(create_topic(0, "t", 2)); // groups 1, 2
    sm.ok(create_topic(0, "u", 1)); // group 3
    sm.ok(create_stream("empty"));
    sm
}

#[test]
fn given_streams_when_listed_and_got_should_aggregate_partition_numbers() {
    let sm = setup();
    let list = sm.state.list_streams(&stats);
    assert_eq!(list.len(), 2);
    assert_eq!(
        (
            list[0].size_bytes,
            list[0].messages_count,
            list[0].topics_count
        ),
        (600, 6, 2)
    );
    assert_eq!((list[1].name.as_str(), list[1].size_bytes), ("empty", 0));
    let d = sm.state.get_stream(&"s".into(), &stats).unwrap();
    assert_eq!(d.stream.id, StreamId(0));
    assert_eq!(
        d.topics
            .iter()
            .map(|t| (t.name.as_str(), t.partitions_count, t.size_bytes))
            .collect::<Vec<_>>(),
        vec![("t", 2, 300), ("u", 1, 300)]
    );
    assert!(sm.state.get_stream(&9.into(), &stats).is_none());
    assert!(sm.state.get_stream(&"x".into(), &stats).is_none());
}

#[test]
fn given_topics_when_got_should_list_partitions_or_answer_none_for_missing_stream_or_topic() {
    let sm = setup();
    let d = sm.state.get_topic(&0.into(), &"t".into(), &stats).unwrap();
    assert_eq!(d.topic.id, TopicId(0));
    assert_eq!(
        d.partitions
            .iter()
            .map(|p| (p.id.0, p.group, p.stats.messages_count))
            .collect::<Vec<_>>(),
        vec![(0, GroupId(1), 1), (1, GroupId(2), 2)]
    );
    assert!(sm.state.get_topic(&9.into(), &0.into(), &stats).is_none());
    assert!(sm.state.get_topic(&0.into(), &9.into(), &stats).is_none());
    let topics = sm.state.list_topics(&"s".into(), &stats).unwrap();
    assert_eq!(topics.len(), 2);
    assert_eq!(
        sm.state
            .list_topics(&"nope".into(), &stats)
            .unwrap_err()
            .iggy_code(),
        1010
    );
}

#[test]
fn given_partitions_when_routed_should_name_their_group_or_refuse_with_iggy_codes() {
    let mut sm = setup();
    let r = sm
        .state
        .route_partition(&"s".into(), &"t".into(), PartitionId(1))
        .unwrap();
    assert_eq!(
        (r.group, r.incarnation, r.purge_generation),
        (GroupId(2), 2, 0)
    );
    assert_eq!(
        sm.state
            .group_id_of(StreamId(0), TopicId(1), PartitionId(0)),
        Some(GroupId(3))
    );
    assert_eq!(
        sm.state
            .group_id_of(StreamId(0), TopicId(1), PartitionId(1)),
        None
    );
    let code = |sm: &Sm, s: Identifier, t: Identifier, p: u32| {
        sm.state
            .route_partition(&s, &t, PartitionId(p))
            .unwrap_err()
            .iggy_code()
    };
    assert_eq!(code(&sm, 0.into(), 0.into(), 2), 3007);
    assert_eq!(code(&sm, 0.into(), 7.into(), 0), 2010);
    assert_eq!(code(&sm, "q".into(), 0.into(), 0), 1010);
    sm.ok(MetadataOp::PurgeTopic {
        stream: 0.into(),
        topic: 0.into(),
    });
    assert_eq!(sm.state.committed_purge_generation(GroupId(2)), Some(1));
    assert_eq!(sm.state.committed_purge_generation(GroupId(3)), Some(0));
    assert_eq!(sm.state.committed_purge_generation(GroupId(99)), None);
}

#[test]
fn given_a_consumer_group_when_queried_should_report_members_assignments_and_poll_gates() {
    let mut sm = setup();
    sm.ok(create_group(0, 0, "g"));
    let g = sm
        .state
        .get_consumer_group(&0.into(), &0.into(), &"g".into())
        .unwrap();
    assert_eq!(
        (g.id, g.partitions_count, g.members.len()),
        (ConsumerGroupId(0), 2, 0)
    );
    sm.ok(join(0, 0, 0, 5));
    sm.ok(join(0, 0, 0, 6));
    let g = sm
        .state
        .get_consumer_group(&0.into(), &0.into(), &0.into())
        .unwrap();
    assert_eq!(g.members.len(), 2);
    let a5 = sm
        .state
        .member_assignment(&0.into(), &0.into(), &0.into(), SessionId(5))
        .unwrap();
    let a6 = sm
        .state
        .member_assignment(&0.into(), &0.into(), &0.into(), SessionId(6))
        .unwrap();
    assert_eq!(a5.partitions.len() + a6.partitions.len(), 2);
    assert_eq!(a5.generation, a6.generation);
    assert!(
        sm.state
            .member_assignment(&0.into(), &0.into(), &0.into(), SessionId(7))
            .is_none()
    );
    assert!(
        sm.state
            .get_consumer_group(&0.into(), &0.into(), &"nope".into())
            .is_none()
    );
    let own = a5.partitions[0];
    let other = a6.partitions[0];
    let gate = |s: u64, p: PartitionId| {
        sm.state
            .check_group_poll(&0.into(), &0.into(), &"g".into(), SessionId(s), p)
    };
    assert_eq!(gate(5, own), Ok(ConsumerGroupId(0)));
    assert_eq!(gate(5, other).unwrap_err().iggy_code(), 5009);
    assert_eq!(gate(9, own).unwrap_err().iggy_code(), 5006);
    assert_eq!(
        sm.state
            .consumer_group_id(&"s".into(), &"t".into(), &"g".into()),
        Ok(ConsumerGroupId(0))
    );
    assert_eq!(
        sm.state
            .consumer_group_id(&0.into(), &0.into(), &4.into())
            .unwrap_err()
            .iggy_code(),
        5000
    );
    assert_eq!(
        sm.state
            .list_consumer_groups(&0.into(), &0.into())
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn given_users_when_logging_in_should_verify_the_stored_hash() {
    let mut sm = Sm::default();
    sm.ok(create_user("iggy"));
    assert_eq!(sm.state.verify_login("iggy", "secret"), Ok(UserId(0)));
    assert_eq!(
        sm.state.verify_login("iggy", "wrong"),
        Err(Refusal::InvalidCredentials)
    );
    let err = sm.state.verify_login("nobody", "secret").unwrap_err();
    assert_eq!(err.iggy_code(), 42);
    sm.ok(MetadataOp::ChangePassword {
        user: "iggy".into(),
        password_hash: hash("new"),
    });
    assert!(sm.state.verify_login("iggy", "secret").is_err());
    assert_eq!(sm.state.verify_login("iggy", "new"), Ok(UserId(0)));
}
