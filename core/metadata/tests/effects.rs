//! Effects against the state: folding every applied op's effects gives
//! exactly the partition groups the state holds (created once, deleted
//! once, purge generations and settings as committed), and
//! `reconcile_effects` between any two states of a history moves the
//! first's partition plane to the second's.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;

use common::GroupId;
use metadata::{
    MetadataOp, MetadataState, PartitionEffect, PartitionGroupConfig, SessionId, reconcile_effects,
};
use proptest::prelude::*;
use support::*;

/// What the partition plane holds: group → (purge generation, settings).
type Plane = BTreeMap<GroupId, (u64, PartitionGroupConfig)>;

fn fold(plane: &mut Plane, effects: &[PartitionEffect]) -> Result<(), String> {
    for e in effects {
        match e {
            PartitionEffect::CreatePartitionGroup { group, config, .. } => {
                if plane.insert(*group, (0, *config)).is_some() {
                    return Err(format!("{group:?} created twice"));
                }
            }
            PartitionEffect::DeletePartitionGroup { group } => {
                if plane.remove(group).is_none() {
                    return Err(format!("{group:?} deleted while absent"));
                }
            }
            PartitionEffect::PurgePartition { group, generation } => {
                let g = plane.get_mut(group).ok_or("purge of an absent group")?;
                if *generation <= g.0 {
                    return Err(format!("{group:?} purge generation went back"));
                }
                g.0 = *generation;
            }
            PartitionEffect::ReconfigurePartitionGroup { group, config } => {
                plane
                    .get_mut(group)
                    .ok_or("reconfigure of an absent group")?
                    .1 = *config;
            }
        }
    }
    Ok(())
}

fn plane_of(state: &MetadataState) -> Plane {
    state
        .partition_groups()
        .into_iter()
        .map(|i| (i.group, (i.purge_generation, i.config)))
        .collect()
}

fn step() -> impl Strategy<Value = MetadataOp> {
    prop_oneof![
        (0u8..3).prop_map(|n| create_stream(&format!("s{n}"))),
        (0u32..3, 0u8..3, 0u32..4).prop_map(|(s, n, p)| create_topic(s, &format!("t{n}"), p)),
        (0u32..3, 0u32..3).prop_map(|(s, t)| MetadataOp::PurgeTopic {
            stream: s.into(),
            topic: t.into()
        }),
        (0u32..3).prop_map(|s| MetadataOp::PurgeStream { stream: s.into() }),
        (0u32..3).prop_map(|s| MetadataOp::DeleteStream { stream: s.into() }),
        (0u32..3, 0u32..3).prop_map(|(s, t)| MetadataOp::DeleteTopic {
            stream: s.into(),
            topic: t.into()
        }),
        (0u32..3, 0u32..3, 1u32..3).prop_map(|(s, t, n)| MetadataOp::CreatePartitions {
            stream: s.into(),
            topic: t.into(),
            count: n,
            created_at_us: 1
        }),
        (0u32..3, 0u32..3, 1u32..3).prop_map(|(s, t, n)| MetadataOp::DeletePartitions {
            stream: s.into(),
            topic: t.into(),
            count: n
        }),
        (0u32..3, 0u32..3, 0u8..2).prop_map(|(s, t, n)| MetadataOp::UpdateTopic {
            stream: s.into(),
            topic: t.into(),
            name: format!("t{n}"),
            config: metadata::TopicConfig {
                durability: if n == 0 {
                    metadata::Durability::Replicated
                } else {
                    metadata::Durability::Persisted
                },
                // A size ceiling is shared by the topic's partitions, so
                // adding or deleting partitions reconfigures the others.
                max_topic_size: if n == 0 {
                    metadata::MaxTopicSize::Unlimited
                } else {
                    metadata::MaxTopicSize::Bytes { bytes: 1_000 }
                },
                ..metadata::TopicConfig::default()
            },
        }),
        (0u32..3, 0u32..3, 0u64..3).prop_map(|(s, t, x)| join(s, t, 0, x)),
        (0u64..3).prop_map(|x| MetadataOp::EndSession {
            session: SessionId(x)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn given_random_histories_when_effects_are_folded_should_equal_the_states_partition_groups(
        ops in proptest::collection::vec(step(), 0..50),
        split in any::<prop::sample::Index>(),
    ) {
        let mut sm = Sm::default();
        let mut plane = Plane::new();
        let mut states = vec![sm.state.clone()];
        for op in ops {
            if let Ok(applied) = sm.apply(op) {
                fold(&mut plane, &applied.effects).map_err(TestCaseError::fail)?;
            }
            prop_assert_eq!(&plane, &plane_of(&sm.state));
            states.push(sm.state.clone());
        }
        // From scratch (a shard's boot) and from any earlier state (a
        // transfer install) to the last.
        let last = states.last().unwrap();
        let mut scratch = Plane::new();
        fold(&mut scratch, &reconcile_effects(&MetadataState::new(), last))
            .map_err(TestCaseError::fail)?;
        prop_assert_eq!(&scratch, &plane);
        let from = &states[split.index(states.len())];
        let mut moved = plane_of(from);
        fold(&mut moved, &reconcile_effects(from, last)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&moved, &plane);
    }
}

/// The partitions' shares of a size ceiling, from the effects of `ops`.
fn shares(ops: Vec<MetadataOp>) -> Vec<Vec<(u64, &'static str, u64)>> {
    let mut sm = Sm::default();
    ops.into_iter()
        .map(|op| {
            let applied = sm.apply(op).unwrap();
            applied
                .effects
                .iter()
                .filter_map(|e| match e {
                    PartitionEffect::CreatePartitionGroup { group, config, .. } => {
                        Some((group.0, "create", config.retained_bytes_max))
                    }
                    PartitionEffect::ReconfigurePartitionGroup { group, config } => {
                        Some((group.0, "reconfigure", config.retained_bytes_max))
                    }
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn given_a_topic_size_ceiling_when_partitions_come_and_go_should_reshare_it_among_them() {
    let sized = |bytes| metadata::TopicConfig {
        max_topic_size: metadata::MaxTopicSize::Bytes { bytes },
        ..metadata::TopicConfig::default()
    };
    let update = |config| MetadataOp::UpdateTopic {
        stream: metadata::Identifier::Name("s".into()),
        topic: metadata::Identifier::Name("t".into()),
        name: "t".into(),
        config,
    };
    let effects = shares(vec![
        create_stream("s"),
        MetadataOp::CreateTopic {
            stream: metadata::Identifier::Name("s".into()),
            name: "t".into(),
            partitions_count: 2,
            config: sized(1_000),
            created_at_us: 2_000,
        },
        MetadataOp::CreatePartitions {
            stream: metadata::Identifier::Name("s".into()),
            topic: metadata::Identifier::Name("t".into()),
            count: 2,
            created_at_us: 3_000,
        },
        MetadataOp::DeletePartitions {
            stream: metadata::Identifier::Name("s".into()),
            topic: metadata::Identifier::Name("t".into()),
            count: 3,
        },
        // Nothing a partition runs with changes: no effect.
        update(sized(1_000)),
        update(metadata::TopicConfig::default()),
    ]);
    assert_eq!(effects[1], [(1, "create", 500), (2, "create", 500)]);
    assert_eq!(
        effects[2],
        [
            (1, "reconfigure", 250),
            (2, "reconfigure", 250),
            (3, "create", 250),
            (4, "create", 250),
        ]
    );
    assert_eq!(effects[3], [(1, "reconfigure", 1_000)]);
    assert!(effects[4].is_empty());
    assert_eq!(effects[5], [(1, "reconfigure", 0)]);
}

/// An Iggy 0.11 update names only the settings it changes: the others keep
/// their values (a rename alone changes no setting and reconfigures
/// nothing), and a patch of the size ceiling reshares it.
#[test]
fn given_a_topic_patch_when_applied_should_change_only_the_named_settings() {
    use metadata::{Durability, MaxTopicSize, MessageExpiry, TopicConfig, TopicPatch};
    let created = TopicConfig {
        message_expiry: MessageExpiry::After { micros: 60_000_000 },
        max_topic_size: MaxTopicSize::Bytes { bytes: 1_000 },
        segment_size_bytes: 4_096,
        durability: Durability::Persisted,
        ..TopicConfig::default()
    };
    let s = || metadata::Identifier::Name("s".into());
    let patch = |name: &str, patch| MetadataOp::PatchTopic {
        stream: s(),
        topic: metadata::Identifier::Numeric(0),
        name: name.into(),
        patch,
    };
    let mut sm = Sm::default();
    sm.apply(create_stream("s")).unwrap();
    sm.apply(MetadataOp::CreateTopic {
        stream: s(),
        name: "t".into(),
        partitions_count: 2,
        config: created,
        created_at_us: 2_000,
    })
    .unwrap();
    let config = |sm: &Sm| {
        sm.state
            .partition_groups()
            .first()
            .map(|i| i.config)
            .unwrap()
    };
    let renamed = sm.apply(patch("renamed", TopicPatch::default())).unwrap();
    assert!(renamed.effects.is_empty(), "a rename reconfigures nothing");
    assert_eq!(config(&sm), metadata::PartitionGroupConfig::of(&created, 2));
    let expiry = MessageExpiry::After { micros: 5_000_000 };
    let sized = sm
        .apply(patch(
            "renamed",
            TopicPatch {
                message_expiry: Some(expiry),
                max_topic_size: Some(MaxTopicSize::Bytes { bytes: 4_000 }),
                ..TopicPatch::default()
            },
        ))
        .unwrap();
    assert_eq!(sized.effects.len(), 2, "both partitions reconfigured");
    let now = config(&sm);
    assert_eq!(now.message_expiry, expiry);
    assert_eq!(now.retained_bytes_max, 2_000);
    // What the patch did not name is what the topic was created with.
    assert_eq!(now.segment_size_bytes, 4_096);
    assert_eq!(now.durability, Durability::Persisted);
}
