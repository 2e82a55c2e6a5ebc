//! What applying a metadata op asks of the partition plane.
//!
//! Effects are a pure function of the state before the op and the op, and
//! they are returned only by the call that applies a committed op for the
//! first time (`MetadataState::apply` refuses an op at or below the one
//! already applied), so each committed op yields its effects exactly once
//! per replica. A shard that crashes after applying but before acting
//! reconciles at boot from [`crate::MetadataState::partition_groups`],
//! which lists every group that should exist with its incarnation and
//! committed purge generation.

use std::collections::BTreeMap;

use common::{GroupId, PartitionId, StreamId, TopicId};

use crate::state::{MetadataState, PartitionGroupInfo};
use crate::topic_config::{Durability, MaxTopicSize, MessageExpiry, TopicConfig};

/// The settings a partition group needs from its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartitionGroupConfig {
    /// Retention by age.
    pub message_expiry: MessageExpiry,
    /// Retention by size (the topic's ceiling).
    pub max_topic_size: MaxTopicSize,
    /// Segment rotation size.
    pub segment_size_bytes: u64,
    /// When a replica acknowledges.
    pub durability: Durability,
    /// This partition's share of the topic's size ceiling: the ceiling
    /// divided by the topic's partition count, rounded up (0: no
    /// ceiling). Retention keeps the partition's sealed segments within
    /// it, so the topic stays within its ceiling plus one active segment
    /// per partition.
    pub retained_bytes_max: u64,
}

impl PartitionGroupConfig {
    /// The settings of each partition of a topic with `config` and
    /// `partitions` partitions.
    pub fn of(config: &TopicConfig, partitions: usize) -> Self {
        let retained_bytes_max = match config.max_topic_size {
            MaxTopicSize::Bytes { bytes } => {
                bytes.div_ceil(u64::try_from(partitions.max(1)).unwrap_or(u64::MAX))
            }
            MaxTopicSize::ServerDefault | MaxTopicSize::Unlimited => 0,
        };
        Self {
            message_expiry: config.message_expiry,
            max_topic_size: config.max_topic_size,
            segment_size_bytes: config.segment_size_bytes,
            durability: config.durability,
            retained_bytes_max,
        }
    }
}

/// One action for the partition plane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PartitionEffect {
    /// Create the partition group (directory, superblock, replica).
    CreatePartitionGroup {
        /// The new group (never used before).
        group: GroupId,
        /// Its stream.
        stream: StreamId,
        /// Its topic.
        topic: TopicId,
        /// Its partition id in the topic.
        partition: PartitionId,
        /// The op that created it; a directory of another incarnation at
        /// the same coordinates is a dead partition's.
        incarnation: u64,
        /// Its settings.
        config: PartitionGroupConfig,
    },
    /// Remove the partition group and its data durably.
    DeletePartitionGroup {
        /// The group.
        group: GroupId,
    },
    /// Truncate the partition under its new committed purge generation.
    PurgePartition {
        /// The group.
        group: GroupId,
        /// The committed purge generation (the purge-advance rule of a
        /// state-transfer install compares against it).
        generation: u64,
    },
    /// The topic's settings changed.
    ReconfigurePartitionGroup {
        /// The group.
        group: GroupId,
        /// The new settings.
        config: PartitionGroupConfig,
    },
}

/// The effects that take the partition plane from `old`'s partition groups
/// to `new`'s: deletes of groups gone, creates (then a purge, if the new
/// group was already purged) of groups that appeared, purges and
/// reconfigurations of groups that changed. Used where ops were not
/// applied one by one — a state-transfer install — and at boot
/// (`reconcile_effects(&MetadataState::new(), &state)` lists everything to
/// create). Group ids are never reused, so identity by `GroupId` is exact.
pub fn reconcile_effects(old: &MetadataState, new: &MetadataState) -> Vec<PartitionEffect> {
    let before: BTreeMap<GroupId, PartitionGroupInfo> = old
        .partition_groups()
        .into_iter()
        .map(|i| (i.group, i))
        .collect();
    let after: BTreeMap<GroupId, PartitionGroupInfo> = new
        .partition_groups()
        .into_iter()
        .map(|i| (i.group, i))
        .collect();
    let mut out = Vec::new();
    for group in before.keys().filter(|g| !after.contains_key(g)) {
        out.push(PartitionEffect::DeletePartitionGroup { group: *group });
    }
    for (group, info) in &after {
        match before.get(group) {
            None => {
                out.push(PartitionEffect::CreatePartitionGroup {
                    group: *group,
                    stream: info.stream,
                    topic: info.topic,
                    partition: info.partition,
                    incarnation: info.incarnation,
                    config: info.config,
                });
                if info.purge_generation > 0 {
                    out.push(PartitionEffect::PurgePartition {
                        group: *group,
                        generation: info.purge_generation,
                    });
                }
            }
            Some(was) => {
                if was.config != info.config {
                    out.push(PartitionEffect::ReconfigurePartitionGroup {
                        group: *group,
                        config: info.config,
                    });
                }
                if info.purge_generation > was.purge_generation {
                    out.push(PartitionEffect::PurgePartition {
                        group: *group,
                        generation: info.purge_generation,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_size_ceiling_when_split_over_partitions_should_round_each_share_up() {
        let config = TopicConfig {
            max_topic_size: MaxTopicSize::Bytes { bytes: 1_001 },
            ..TopicConfig::default()
        };
        assert_eq!(
            PartitionGroupConfig::of(&config, 1).retained_bytes_max,
            1_001
        );
        assert_eq!(PartitionGroupConfig::of(&config, 2).retained_bytes_max, 501);
        // A topic with no partitions yet still gets the whole ceiling.
        assert_eq!(
            PartitionGroupConfig::of(&config, 0).retained_bytes_max,
            1_001
        );
        for none in [MaxTopicSize::ServerDefault, MaxTopicSize::Unlimited] {
            let config = TopicConfig {
                max_topic_size: none,
                ..TopicConfig::default()
            };
            assert_eq!(PartitionGroupConfig::of(&config, 3).retained_bytes_max, 0);
        }
    }
}
