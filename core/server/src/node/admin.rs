//! `REPLOG_STATUS` (docs/formats.md §17): one replica's answer to "where
//! does every group stand here". Each shard is asked for a snapshot with
//! per-group detail (answered between two of its inputs, as for a metrics
//! scrape) and shard 0 for the partition groups' names; a shard that does
//! not answer within [`STATUS_TIMEOUT`] is left out and counted, so a busy
//! replica still answers.
//!
//! The record says what this replica sees. `replog-cli status` asks every
//! replica of the roster it carries and puts the answers side by side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::GroupId;
use common::admin::{
    GroupState, GroupStatus, PartitionStatus, ReplicaStatus, RosterAddress, TransferStatus,
};
use consensus::vsr::Status;
use futures::channel::oneshot;
use shard::snapshot::GroupSnapshot;
use shard::{Input, ShardSnapshot, SnapshotDetail, SnapshotReply};

use super::handle::ShardHandles;

/// How long a status request waits for the shards, all together.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Who this replica is, for the record's header.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// This replica's id.
    pub replica: u8,
    /// Every replica's client address (one entry for a single replica).
    pub roster: Vec<RosterAddress>,
}

/// A partition group's (stream, topic, partition) ids.
type Names = BTreeMap<GroupId, (u32, u32, u32)>;

/// Gathers the status of every group this replica hosts.
pub async fn replica_status(handles: &ShardHandles, identity: &Identity) -> ReplicaStatus {
    let deadline = Instant::now() + STATUS_TIMEOUT;
    let mut pending = Vec::with_capacity(handles.inboxes().len());
    for inbox in handles.inboxes() {
        let (tx, rx) = oneshot::channel::<ShardSnapshot>();
        let reply = SnapshotReply::new(move |snapshot| {
            let _ = tx.send(snapshot);
        });
        // A fresh clone of a futures sender has a slot of its own, so this
        // fails only when the shard is gone (then `rx` reads as dropped).
        let _ = inbox.clone().try_send(Input::Snapshot {
            detail: SnapshotDetail::Groups,
            reply,
        });
        pending.push(rx);
    }
    let names: Names = within(
        deadline,
        handles.meta_query(|state| {
            state
                .partition_groups()
                .iter()
                .map(|info| {
                    let ids = (info.stream.0, info.topic.0, info.partition.0);
                    (info.group, ids)
                })
                .collect::<Names>()
        }),
    )
    .await
    .and_then(Result::ok)
    .unwrap_or_default();
    let mut snapshots = Vec::with_capacity(pending.len());
    for rx in pending {
        if let Some(Ok(snapshot)) = within(deadline, rx).await {
            snapshots.push(snapshot);
        }
    }
    build(identity, handles.shard_count(), &snapshots, &names)
}

async fn within<F: Future>(deadline: Instant, future: F) -> Option<F::Output> {
    let left = deadline.saturating_duration_since(Instant::now());
    compio::time::timeout(left, future).await.ok()
}

/// The record from the shards' snapshots.
fn build(
    identity: &Identity,
    shards: u16,
    snapshots: &[ShardSnapshot],
    names: &Names,
) -> ReplicaStatus {
    let mut groups: Vec<GroupStatus> = snapshots
        .iter()
        .flat_map(|s| {
            s.groups
                .iter()
                .map(move |g| group_status(s.shard.0, g, names))
        })
        .collect();
    groups.sort_by_key(|g| (!g.is_metadata(), g.group));
    ReplicaStatus {
        replica: identity.replica,
        roster: identity.roster.clone(),
        shards,
        shards_answered: u16::try_from(snapshots.len()).unwrap_or(u16::MAX),
        groups,
    }
}

fn group_status(shard: u16, g: &GroupSnapshot, names: &Names) -> GroupStatus {
    let c = &g.consensus;
    // A partition group the metadata plane does not name (being created
    // or deleted) is listed without its partition record.
    let partition = g.partition.and_then(|p| {
        let &(stream, topic, partition) = names.get(&g.group)?;
        Some(PartitionStatus {
            stream,
            topic,
            partition,
            messages: p.stats.messages_count,
            size_bytes: p.stats.size_bytes,
            next_offset: p.next_offset().0,
            fenced: p.fenced,
        })
    });
    GroupStatus {
        group: g.group.0,
        shard,
        state: match c.status {
            Status::Normal => GroupState::Normal,
            Status::ViewChange => GroupState::ViewChange,
            Status::Recovering => GroupState::Recovering,
        },
        view: c.view,
        primary: c.primary.0,
        primary_here: c.primary_here,
        op: c.op.0,
        commit_min: c.commit_min.0,
        commit_max: c.commit_max.0,
        partition,
        transfer: g.transfer.map(|t| TransferStatus {
            peer: t.peer.0,
            received_bytes: t.received_bytes,
            expected_bytes: t.expected_bytes,
        }),
    }
}
