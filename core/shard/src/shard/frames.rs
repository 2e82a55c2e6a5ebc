//! Frames from peer replicas: checked once at the boundary, then served by
//! a partition, group 0 or a transfer driver; and a driver's output sent on.

use std::collections::BTreeMap;

use bytes::Bytes;
use common::{GroupId, METADATA_GROUP, ReplicaId};
use consensus::vsr::wire::{self, Expect};
use partitions::state_transfer::{DriverOutput, Outgoing, TransferDriver, TransferEvent};

use super::errors::FrameRefusal;
use super::tick::TICK_GROUPS_AT_ONCE;
use super::{EnvClock, Shard};
use crate::call::CallError;
use crate::env::{Env, Sent};
use crate::placement::shard_of;

/// One group on the shard.
/// What [`Shard::triage`] made of a frame.
enum Triage {
    /// A partition group's VSR frame: served beside other groups' frames.
    Partition(GroupId, consensus::vsr::Frame),
    /// Group 0's VSR frame.
    Metadata(consensus::vsr::Frame),
    /// A state-transfer frame, decoded by its driver.
    Transfer,
}

impl<E: Env> Shard<E> {
    /// One frame from replica `from`, as the connection delivered it.
    ///
    /// # Errors
    /// [`FrameRefusal`], counted; nothing changed.
    pub async fn on_frame(&mut self, from: ReplicaId, bytes: Bytes) -> Result<(), FrameRefusal> {
        let mut outcomes = self.on_frames(vec![(from, bytes)]).await;
        outcomes.pop().unwrap_or(Ok(()))
    }

    /// Serves frames that arrived together: each partition group's VSR
    /// frames in their order, the groups side by side (up to
    /// `TICK_GROUPS_AT_ONCE` at once); the rest (transfer frames, group 0,
    /// refusals) one at a time first. A failover's view-change frames for
    /// hundreds of groups then persist their views together, which the
    /// superblock table writes in one batch instead of one per group. On
    /// a simulated disk every call completes when made, so this serves
    /// the frames in exactly the order of `on_frame` one by one, bar the
    /// serial ones moving ahead (the network reorders anyway).
    ///
    /// Returns each frame's outcome, in the order given.
    pub async fn on_frames(
        &mut self,
        frames: Vec<(ReplicaId, Bytes)>,
    ) -> Vec<Result<(), FrameRefusal>> {
        let mut outcomes: Vec<Option<Result<(), FrameRefusal>>> = vec![None; frames.len()];
        let peers: Vec<ReplicaId> = frames.iter().map(|(from, _)| *from).collect();
        let mut by_group: BTreeMap<GroupId, Vec<(usize, consensus::vsr::Frame)>> = BTreeMap::new();
        for (i, (from, bytes)) in frames.into_iter().enumerate() {
            outcomes[i] = match self.triage(from, &bytes) {
                Ok(Triage::Partition(group, frame)) => {
                    by_group.entry(group).or_default().push((i, frame));
                    continue;
                }
                Ok(Triage::Metadata(frame)) => Some(self.serve_metadata_frame(frame).await),
                Ok(Triage::Transfer) => Some(self.serve_transfer_frame(from, bytes).await),
                Err(refusal) => Some(Err(refusal)),
            };
        }
        let mut taken = Vec::with_capacity(by_group.len());
        for (id, frames) in by_group {
            if self.visits.touch(&mut self.groups, id).is_none() {
                continue;
            }
            if let Some(g) = self.groups.remove(&id) {
                taken.push((id, g, frames));
            }
        }
        for chunk in taken.chunks_mut(TICK_GROUPS_AT_ONCE) {
            let served = chunk.iter_mut().map(|(id, g, frames)| async move {
                let mut out = Vec::with_capacity(frames.len());
                for (i, frame) in frames.drain(..) {
                    let result = g
                        .partition
                        .on_frame(frame)
                        .await
                        .map_err(|e| FrameRefusal::Partition(e.to_string()));
                    out.push((i, result));
                }
                g.note_view(*id);
                out
            });
            for (i, result) in futures::future::join_all(served)
                .await
                .into_iter()
                .flatten()
            {
                outcomes[i] = Some(result);
            }
        }
        for (id, g, _) in taken {
            self.groups.insert(id, g);
        }
        let outcomes: Vec<Result<(), FrameRefusal>> = outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or(Err(FrameRefusal::Partition(
                    "the group left while the frame waited".to_owned(),
                )))
            })
            .collect();
        for (peer, result) in peers.iter().zip(&outcomes) {
            match result {
                Ok(()) => self.stats.frames_in += 1,
                Err(refusal) => {
                    *self
                        .stats
                        .frames_refused
                        .entry(refusal.reason())
                        .or_default() += 1;
                    tracing::debug!(peer = peer.0, shard = self.config.shard.0, %refusal, "frame refused");
                }
            }
        }
        self.settle().await;
        outcomes
    }

    /// Where a frame goes: checked and decoded once, at the boundary.
    fn triage(&self, from: ReplicaId, bytes: &Bytes) -> Result<Triage, FrameRefusal> {
        if from.0 >= self.config.replica_count || from == self.config.replica {
            return Err(FrameRefusal::UnknownPeer { peer: from });
        }
        if TransferDriver::<E::Fs>::is_transfer_frame(bytes) {
            return Ok(Triage::Transfer);
        }
        let expect = Expect {
            cluster: self.config.cluster,
            size_max: self.config.frame_size_max,
            peer: Some(from),
        };
        let frame = wire::decode(bytes, &expect).map_err(FrameRefusal::Wire)?;
        if frame.group == METADATA_GROUP {
            return Ok(Triage::Metadata(frame));
        }
        self.check_owner(frame.group.0)?;
        let group = frame.group;
        if !self.groups.contains_key(&group) {
            return Err(FrameRefusal::UnknownGroup { group });
        }
        Ok(Triage::Partition(group, frame))
    }

    /// A state-transfer frame (of group 0 or a partition group).
    async fn serve_transfer_frame(
        &mut self,
        from: ReplicaId,
        bytes: Bytes,
    ) -> Result<(), FrameRefusal> {
        let group = wire::peek_group(&bytes).unwrap_or(GroupId(u64::MAX));
        if group == METADATA_GROUP {
            let Some(host) = self.metadata.as_mut() else {
                return Err(FrameRefusal::UnknownGroup { group });
            };
            let out = host
                .transfer
                .on_frame(&mut host.group, from.0, bytes)
                .await
                .map_err(|e| FrameRefusal::Transfer(e.to_string()))?;
            self.send_frames(out);
            // An install queues the effects that bring the partition
            // plane from the old state to the new.
            self.after_metadata_input().await;
            return Ok(());
        }
        self.check_owner(group.0)?;
        let Some(g) = self.visits.touch(&mut self.groups, group) else {
            return Err(FrameRefusal::UnknownGroup { group });
        };
        let clock = EnvClock(&*self.env);
        let out = g
            .driver
            .on_frame(&mut g.partition, &mut self.slots, from.0, bytes, &clock)
            .await
            .map_err(|e| FrameRefusal::Transfer(e.to_string()))?;
        self.carry_out(group, out);
        Ok(())
    }

    /// A VSR frame of group 0, decoded and checked.
    async fn serve_metadata_frame(
        &mut self,
        frame: consensus::vsr::Frame,
    ) -> Result<(), FrameRefusal> {
        let Some(host) = self.metadata.as_mut() else {
            return Err(FrameRefusal::UnknownGroup {
                group: METADATA_GROUP,
            });
        };
        host.group
            .on_frame(frame)
            .await
            .map_err(|e| FrameRefusal::Partition(e.to_string()))?;
        self.after_metadata_input().await;
        Ok(())
    }

    fn check_owner(&self, group: u64) -> Result<(), FrameRefusal> {
        let owner = shard_of(GroupId(group), self.config.shard_count);
        if owner != self.config.shard {
            return Err(FrameRefusal::WrongShard {
                group: GroupId(group),
                owner,
            });
        }
        if !self.groups.contains_key(&GroupId(group)) {
            return Err(FrameRefusal::UnknownGroup {
                group: GroupId(group),
            });
        }
        Ok(())
    }

    /// Hands a driver's frames to the environment, counted.
    pub(super) fn send_frames(&self, frames: Vec<Outgoing>) {
        for outgoing in frames {
            let sent = self
                .env
                .send_to_peer(ReplicaId(outgoing.to), outgoing.frame);
            let mut counts = self.sent.borrow_mut();
            counts.0 += 1;
            if sent == Sent::Dropped {
                counts.1 += 1;
            }
        }
    }

    /// Sends a driver's frames and reports its events.
    pub(super) fn carry_out(&mut self, group: GroupId, out: DriverOutput) {
        self.send_frames(out.send);
        let now = self.env.now();
        for event in out.events {
            let armed_at = self
                .groups
                .get_mut(&group)
                .map(|g| &mut g.transfer_armed_at);
            match (&event, armed_at) {
                (TransferEvent::Armed { .. }, Some(at)) => {
                    at.get_or_insert(now);
                }
                (TransferEvent::Installed(_), Some(at)) => {
                    if let Some(since) = at.take() {
                        self.stats
                            .transfer_durations
                            .observe(now.saturating_sub(since));
                    }
                }
                (TransferEvent::Disarmed | TransferEvent::Fenced { .. }, Some(at)) => *at = None,
                _ => {}
            }
            match event {
                TransferEvent::Installed(outcome) => {
                    self.stats.installs += 1;
                    tracing::info!(group = group.0, ?outcome, "state transfer installed");
                }
                TransferEvent::Fenced { reason, quarantine } => {
                    self.stats.fenced += 1;
                    tracing::error!(group = group.0, reason, ?quarantine, "partition fenced");
                }
                TransferEvent::Armed { peer } => {
                    tracing::info!(group = group.0, peer = peer.0, "state transfer armed");
                }
                TransferEvent::AttemptFailed(error) => {
                    tracing::warn!(group = group.0, %error, "state transfer attempt failed");
                }
                TransferEvent::InstallFailed(error) => {
                    tracing::warn!(group = group.0, %error, "state transfer install failed");
                }
                TransferEvent::Disarmed => {
                    tracing::debug!(group = group.0, "state transfer no longer needed");
                }
                TransferEvent::ServeRefused { requester, reason } => {
                    tracing::debug!(
                        group = group.0,
                        requester = requester.0,
                        ?reason,
                        "offer request refused"
                    );
                }
            }
        }
        if let Some(g) = self.groups.get_mut(&group)
            && let Some(reason) = g.partition.fenced()
            && !g.fenced_reported
        {
            g.fenced_reported = true;
            let reason = reason.to_owned();
            for (_, reply) in g.queued.drain(..) {
                let _ = reply.send(Err(CallError::Fenced {
                    reason: reason.clone(),
                }));
            }
        }
    }
}
