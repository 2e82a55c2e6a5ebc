//! The shard's side of the metadata plane: group 0's calls and inputs, and
//! the effects it commits carried out on (or routed to) the partition groups.

use std::collections::BTreeMap;

use common::{GroupId, Op};

use super::Shard;
use crate::call::{Call, Envelope};
use crate::catalog::{self, GroupSpec};
use crate::env::Env;
use crate::metadata_host::{MetaCall, MetaError, MetadataHost};
use crate::placement::{ShardIndex, shard_of};
use crate::pump::{Inbox, Input};
use crate::rejoin::{self, Rejoin};

impl<E: Env> Shard<E> {
    /// Wires the inboxes of every shard of this replica (by index), where
    /// the metadata plane's effects for other shards' groups go.
    pub fn set_siblings(&mut self, siblings: Vec<Inbox>) {
        self.siblings = siblings;
    }

    /// Group 0, when this shard hosts it.
    pub fn metadata(&self) -> Option<&MetadataHost<E>> {
        self.metadata.as_ref()
    }

    /// A call to the metadata plane.
    pub async fn on_meta(&mut self, call: MetaCall) {
        let Some(host) = self.metadata.as_mut() else {
            if let MetaCall::Submit { reply, .. } = call {
                let _ = reply.send(Err(MetaError::NotHosted));
            }
            return;
        };
        match call {
            MetaCall::Query(query) => query(host.state()),
            MetaCall::Submit { op, user_id, reply } => {
                host.enqueue(op, user_id, reply);
                self.after_metadata_input().await;
            }
        }
    }

    /// After any input to group 0: submit queued ops once the session is
    /// open, answer committed ones, and carry out committed effects.
    pub(super) async fn after_metadata_input(&mut self) {
        let client = self.client;
        let tick = self.tick;
        for _ in 0..4 {
            let Some(host) = self.metadata.as_mut() else {
                return;
            };
            host.pump(client, tick).await;
            let opened = host.settle(client);
            if host.damage_recovery_caught_up() {
                tracing::info!(
                    applied = host.state().applied().0,
                    "group 0 caught up after its damaged store: reconciling partition groups"
                );
                host.stop_deferring_reconciliation();
                self.reconcile_partitions().await;
                if let Some(host) = self.metadata.as_mut() {
                    host.end_damage_recovery().await;
                }
            }
            self.note_rejoined().await;
            let Some(host) = self.metadata.as_mut() else {
                return;
            };
            let effects = host.group.take_effects();
            for committed in effects {
                self.carry_out_effect(committed.effect).await;
            }
            if !opened {
                break;
            }
        }
    }

    /// While rejoining: once group 0 counts again, records its head as
    /// the last op whose groups the earlier life may have seen.
    async fn note_rejoined(&mut self) {
        let (Some(Rejoin { through_op: None }), Some(host)) = (self.rejoin, self.metadata.as_ref())
        else {
            return;
        };
        if !host.replica().is_quorum_visible() {
            return;
        }
        let marker = Rejoin {
            through_op: Some(host.replica().op()),
        };
        let fs = self.env.fs().clone();
        match rejoin::write(&fs, &self.config.dir, &marker).await {
            Ok(()) => {
                tracing::info!(through_op = ?marker.through_op, "rejoin: group 0 caught up; groups of later ops start as new members");
                self.rejoin = Some(marker);
            }
            // Still unknown: every group created meanwhile rejoins, which
            // is safe; the write is tried again after the next input.
            Err(error) => tracing::warn!(%error, "rejoin marker not updated"),
        }
    }

    async fn carry_out_effect(&mut self, effect: metadata::PartitionEffect) {
        use metadata::PartitionEffect;
        match effect {
            PartitionEffect::CreatePartitionGroup {
                group,
                partition,
                incarnation,
                config,
                ..
            } => {
                let mut spec = spec_of(group, partition.0, incarnation, &config);
                spec.rejoin = self.rejoin.is_some_and(|r| r.covers(Op(incarnation)));
                let (done, _) = futures::channel::oneshot::channel();
                self.route(group, Input::CreateGroup { spec, done }).await;
            }
            PartitionEffect::DeletePartitionGroup { group } => {
                let (done, _) = futures::channel::oneshot::channel();
                self.route(group, Input::DeleteGroup { group, done }).await;
            }
            PartitionEffect::ReconfigurePartitionGroup { group, config } => {
                // What an existing partition can take on: its retention.
                // Segment size and durability are not in an Iggy update
                // and stay what the group was created with.
                let (message_expiry_us, retained_bytes_max) = retention_of(&config);
                self.route(
                    group,
                    Input::Reconfigure {
                        group,
                        message_expiry_us,
                        retained_bytes_max,
                    },
                )
                .await;
            }
            PartitionEffect::PurgePartition { group, generation } => {
                // Every replica's copy of the group learns the committed
                // generation (its transfer install refuses older offers).
                self.route(group, Input::PurgeCommitted { group, generation })
                    .await;
                // Every replica sees the effect; the partition's primary
                // proposes the purge, the others' calls answer NotPrimary.
                let (reply, _) = futures::channel::oneshot::channel();
                let call = Input::Call(Envelope {
                    group,
                    call: Call::Purge { generation },
                    reply,
                });
                self.route(group, call).await;
            }
        }
    }

    /// Serves `input` here when this shard owns `group`, else hands it to
    /// the owning shard's inbox (waiting for room: an effect is never
    /// dropped).
    async fn route(&mut self, group: GroupId, input: Input) {
        let owner = shard_of(group, self.config.shard_count);
        if owner == self.config.shard {
            // Served as the owner's pump serves it (which logs a failed
            // create or delete: nobody waits on a routed one's answer).
            match input {
                Input::CreateGroup { .. }
                | Input::DeleteGroup { .. }
                | Input::Call(_)
                | Input::PurgeCommitted { .. }
                | Input::Reconfigure { .. } => Box::pin(self.on_input(input)).await,
                other => tracing::error!(?other, "not routable"),
            }
            return;
        }
        let Some(inbox) = self.siblings.get_mut(usize::from(owner.0)) else {
            tracing::error!(
                group = group.0,
                shard = owner.0,
                "no inbox for the owning shard"
            );
            return;
        };
        use futures::SinkExt;
        if inbox.send(input).await.is_err() {
            tracing::error!(group = group.0, shard = owner.0, "owning shard stopped");
        }
    }

    /// Boot reconciliation: asks every shard of this replica to hold
    /// exactly the partition groups the committed metadata names.
    pub async fn reconcile_partitions(&mut self) {
        let Some(host) = self.metadata.as_ref() else {
            return;
        };
        if host.recovering_from_damage() {
            // Done when group 0 has caught up (after_metadata_input).
            tracing::warn!(
                "partition groups not reconciled until group 0 has repaired its damaged store from the peers"
            );
            return;
        }
        let live: Vec<GroupSpec> = host
            .state()
            .partition_groups()
            .iter()
            .map(|i| spec_of(i.group, i.partition.0, i.incarnation, &i.config))
            .collect();
        let purges: Vec<(GroupId, u64)> = host
            .state()
            .partition_groups()
            .iter()
            .filter(|i| i.purge_generation > 0)
            .map(|i| (i.group, i.purge_generation))
            .collect();
        let count = self.config.shard_count;
        for index in 0..count {
            if ShardIndex(index) == self.config.shard {
                self.reconcile(&live).await;
            } else if let Some(inbox) = self.siblings.get_mut(usize::from(index)) {
                use futures::SinkExt;
                let _ = inbox.send(Input::Reconcile { live: live.clone() }).await;
            }
        }
        for (group, generation) in purges {
            self.route(group, Input::PurgeCommitted { group, generation })
                .await;
        }
    }

    /// Hands a committed purge generation to the group's transfer driver.
    pub fn learn_purge_generation(&mut self, group: GroupId, generation: u64) {
        if let Some(g) = self.visits.touch(&mut self.groups, group) {
            g.driver.learn_committed_purge_generation(generation);
        }
        self.reschedule_touched();
    }

    /// Creates the named groups this shard owns and lacks, deletes the
    /// ones it holds that are not named.
    pub async fn reconcile(&mut self, live: &[GroupSpec]) {
        let mine: BTreeMap<GroupId, GroupSpec> = live
            .iter()
            .filter(|s| shard_of(s.group, self.config.shard_count) == self.config.shard)
            .map(|s| (s.group, *s))
            .collect();
        let held: Vec<GroupId> = self.groups.keys().copied().collect();
        for group in held {
            if !mine.contains_key(&group) {
                tracing::info!(
                    group = group.0,
                    "deleting a group the metadata no longer names"
                );
                if let Err(error) = self.delete_group(group).await {
                    tracing::error!(group = group.0, %error, "reconcile delete failed");
                }
            }
        }
        for (group, spec) in mine {
            if !self.groups.contains_key(&group) {
                if let Err(error) = self.create_group(spec).await {
                    tracing::error!(group = group.0, %error, "reconcile create failed");
                }
            } else {
                // A topic update this replica applied (or learned by a
                // snapshot transfer) but whose effect did not reach the
                // spec before a crash.
                self.reconfigure_group(group, spec.message_expiry_us, spec.retained_bytes_max)
                    .await;
            }
        }
    }

    /// Gives a held group its topic's current retention settings and
    /// records them in its spec. A failed rewrite is logged and the
    /// settings still apply in memory: boot's reconciliation gives them
    /// again from the committed metadata.
    pub async fn reconfigure_group(
        &mut self,
        group: GroupId,
        message_expiry_us: u64,
        retained_bytes_max: u64,
    ) {
        let fs = self.env.fs().clone();
        let root = self.config.dir.clone();
        let Some(g) = self.visits.touch(&mut self.groups, group) else {
            return;
        };
        if g.spec.message_expiry_us == message_expiry_us
            && g.spec.retained_bytes_max == retained_bytes_max
        {
            return;
        }
        let spec = GroupSpec {
            message_expiry_us,
            retained_bytes_max,
            ..g.spec
        };
        g.spec = spec;
        match catalog::rewrite_spec(&fs, &root, &spec).await {
            Ok(()) => tracing::info!(
                group = group.0,
                message_expiry_us,
                retained_bytes_max,
                "partition group retention reconfigured"
            ),
            Err(error) => tracing::warn!(
                group = group.0,
                %error,
                "retention reconfigured in memory; the spec rewrite failed (boot reconciliation applies it again)"
            ),
        }
        self.reschedule_touched();
    }
}

/// The spec of a partition group the metadata plane names.
pub fn spec_of(
    group: GroupId,
    partition_id: u32,
    incarnation: u64,
    config: &metadata::PartitionGroupConfig,
) -> GroupSpec {
    let mut spec = GroupSpec::new(group, partition_id);
    spec.incarnation = incarnation;
    // Every committed batch is written to its segment before its reply
    // goes out (SPEC §6.1: a killed process never loses an acknowledged
    // write); whether it is also synced is the durability mode's call.
    spec.messages_required_to_save = 1;
    if config.segment_size_bytes > 0 {
        spec.segment_size_bytes = config.segment_size_bytes;
    }
    spec.enforce_fsync = config.durability == metadata::Durability::Persisted;
    (spec.message_expiry_us, spec.retained_bytes_max) = retention_of(config);
    spec
}

/// The retention settings of a group with `config`: the message expiry
/// (µs, 0 = never) and the sealed segments' size ceiling (0 = none).
fn retention_of(config: &metadata::PartitionGroupConfig) -> (u64, u64) {
    let expiry = match config.message_expiry {
        metadata::MessageExpiry::After { micros } => micros,
        metadata::MessageExpiry::ServerDefault | metadata::MessageExpiry::Never => 0,
    };
    (expiry, config.retained_bytes_max)
}
