//! What the shard refuses and why: a peer's frame ([`FrameRefusal`]) and
//! a group's create, open or delete ([`GroupError`]).

use common::{GroupId, ReplicaId};
use consensus::vsr::wire::WireError;

use crate::placement::ShardIndex;

/// Why an inbound frame was refused (counted per variant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameRefusal {
    /// The bytes are not a frame this replica accepts.
    Wire(WireError),
    /// A frame for a group that does not live on this shard.
    UnknownGroup {
        /// The group named.
        group: GroupId,
    },
    /// A frame for a group another shard index owns.
    WrongShard {
        /// The group named.
        group: GroupId,
        /// The shard that owns it.
        owner: ShardIndex,
    },
    /// The state-transfer driver refused it.
    Transfer(String),
    /// The partition refused it (a prepare that does not fit its log…).
    Partition(String),
    /// A frame from a replica id outside the cluster.
    UnknownPeer {
        /// The peer.
        peer: ReplicaId,
    },
}

impl FrameRefusal {
    /// The counter a refusal bumps.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Wire(WireError::Header(_)) => "header",
            Self::Wire(WireError::WrongCluster { .. }) => "wrong_cluster",
            Self::Wire(WireError::WrongSender { .. }) => "wrong_sender",
            Self::Wire(WireError::NotVsr { .. }) => "not_vsr",
            Self::Wire(_) => "suffix",
            Self::UnknownGroup { .. } => "unknown_group",
            Self::WrongShard { .. } => "wrong_shard",
            Self::Transfer(_) => "transfer",
            Self::Partition(_) => "partition",
            Self::UnknownPeer { .. } => "unknown_peer",
        }
    }
}

impl std::fmt::Display for FrameRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Wire(e) => write!(f, "{e}"),
            Self::UnknownGroup { group } => write!(f, "no group {} on this shard", group.0),
            Self::WrongShard { group, owner } => {
                write!(f, "group {} belongs to shard {}", group.0, owner.0)
            }
            Self::Transfer(e) => write!(f, "state-transfer frame refused: {e}"),
            Self::Partition(e) => write!(f, "partition refused the frame: {e}"),
            Self::UnknownPeer { peer } => write!(f, "replica {} is not in the cluster", peer.0),
        }
    }
}

impl std::error::Error for FrameRefusal {}

/// Why a group could not be created, opened or deleted.
#[derive(Debug)]
pub enum GroupError {
    /// The group is already on this shard.
    AlreadyExists(GroupId),
    /// The group is not on this shard.
    Unknown(GroupId),
    /// The group belongs to another shard index.
    WrongShard {
        /// The group.
        group: GroupId,
        /// Its owner.
        owner: ShardIndex,
    },
    /// A directory step failed.
    Io {
        /// The group.
        group: GroupId,
        /// What was being done.
        step: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The partition refused to boot.
    Boot {
        /// The group.
        group: GroupId,
        /// The partition's error.
        reason: String,
    },
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyExists(g) => write!(f, "group {} already exists", g.0),
            Self::Unknown(g) => write!(f, "group {} is not on this shard", g.0),
            Self::WrongShard { group, owner } => {
                write!(f, "group {} belongs to shard {}", group.0, owner.0)
            }
            Self::Io {
                group,
                step,
                source,
            } => write!(f, "group {}: {step} failed: {source}", group.0),
            Self::Boot { group, reason } => write!(f, "group {} did not boot: {reason}", group.0),
        }
    }
}

impl std::error::Error for GroupError {}
