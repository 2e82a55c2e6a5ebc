//! Consumer-group assignment over random join / leave / session-end /
//! partition-count sequences: every partition owned by exactly one member,
//! counts within one, and members that stay keep what their quota allows.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use common::{PartitionId, StreamId, TopicId};
use metadata::{ConsumerGroupId, MetadataOp, SessionId};
use proptest::prelude::*;
use support::*;

#[derive(Debug, Clone)]
enum Step {
    Join(u64),
    Leave(u64),
    End(u64),
    AddPartitions(u32),
    RemovePartitions(u32),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..8).prop_map(Step::Join),
        2 => (0u64..8).prop_map(Step::Leave),
        1 => (0u64..8).prop_map(Step::End),
        1 => (1u32..6).prop_map(Step::AddPartitions),
        1 => (1u32..4).prop_map(Step::RemovePartitions),
    ]
}

type Assignment = BTreeMap<SessionId, BTreeSet<PartitionId>>;

fn assignment(sm: &Sm) -> (Assignment, usize, u64) {
    let t = &sm.state.streams()[&StreamId(0)].topics[&TopicId(0)];
    let g = &t.consumer_groups[&ConsumerGroupId(0)];
    let a = g
        .members
        .values()
        .map(|m| (m.session, m.partitions.iter().copied().collect()))
        .collect();
    (a, t.partitions.len(), g.generation)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn given_random_membership_changes_when_rebalanced_should_stay_exact_balanced_and_sticky(
        initial in 0u32..12,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut sm = Sm::default();
        sm.ok(create_stream("s"));
        sm.ok(create_topic(0, "t", initial));
        sm.ok(create_group(0, 0, "g"));
        for s in steps {
            let (before, _, generation_before) = assignment(&sm);
            let op = match s {
                Step::Join(x) => join(0, 0, 0, x),
                Step::Leave(x) => leave(0, 0, 0, x),
                Step::End(x) => MetadataOp::EndSession { session: SessionId(x) },
                Step::AddPartitions(n) => MetadataOp::CreatePartitions {
                    stream: 0.into(), topic: 0.into(), count: n, created_at_us: 0,
                },
                Step::RemovePartitions(n) => MetadataOp::DeletePartitions {
                    stream: 0.into(), topic: 0.into(), count: n,
                },
            };
            let _ = sm.apply(op);
            let (after, partitions, generation) = assignment(&sm);
            // Exactly one owner per partition.
            let mut owned = BTreeSet::new();
            for ps in after.values() {
                for p in ps {
                    prop_assert!(owned.insert(*p), "{p:?} owned twice");
                    prop_assert!((p.0 as usize) < partitions);
                }
            }
            if !after.is_empty() {
                prop_assert_eq!(owned.len(), partitions);
                let lo = after.values().map(BTreeSet::len).min().unwrap();
                let hi = after.values().map(BTreeSet::len).max().unwrap();
                prop_assert!(hi - lo <= 1, "unbalanced: {lo}..{hi}");
            }
            // Sticky: a member that stays keeps min(what it held that still
            // exists, its new count) of its partitions.
            for (session, now) in &after {
                if let Some(was) = before.get(session) {
                    let live: BTreeSet<_> =
                        was.iter().filter(|p| (p.0 as usize) < partitions).collect();
                    let kept = now.iter().filter(|p| live.contains(p)).count();
                    prop_assert_eq!(kept, live.len().min(now.len()));
                }
            }
            if before != after {
                prop_assert!(generation > generation_before);
            }
        }
    }
}
