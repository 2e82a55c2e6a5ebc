//! Fault profiles: which fault classes a run injects and how often.
//!
//! A profile is a name on the command line and a table of per-tick
//! chances here; the fault plan ([`crate::faults`]) draws from them with
//! its own seeded stream. docs/simulator.md describes each profile.

use std::fmt;
use std::str::FromStr;

use common::simnet::NetworkFaults;

/// The fault classes a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultProfile {
    /// No faults: the baseline every other profile must match.
    None,
    /// Frames dropped, duplicated and delayed everywhere, and single links
    /// degraded (heavy loss, duplication or delay) for a while.
    Network,
    /// Long random delays on every link, so frames arrive far out of
    /// order, with some duplication.
    Reorder,
    /// One replica isolated, the cluster split in two, or one direction of
    /// a link cut (asymmetric), then healed.
    Partition,
    /// Replicas crashed and restarted; their disks keep only synced data
    /// (power loss), at most f replicas down or catching up at once.
    Crash,
    /// A minority replica's disk fails a write or sync with EIO; the
    /// replica is restarted later (its process died with the fault).
    Disk,
    /// Every class above at lower rates.
    Mixed,
    /// Replaced disks: a replica's process dies and its disk is swapped
    /// for an empty one; it boots rejoining (`ShardConfig::rejoin`). With
    /// crashes, partitions and mild network faults, within the budget.
    Wipe,
    /// Latent corruption: a bit flipped in a sealed segment of one
    /// partition on a minority replica (the medium changed under the
    /// data). Not in `mixed`: see docs/simulator.md, Known failures.
    Rot,
    /// Whole-cluster crashes: every replica loses power (or is killed) at
    /// once and boots again; the groups must come back by themselves (the
    /// census). Topics are all `persisted`, whose promise covers it.
    Blackout,
    /// Whole-cluster crashes after which a minority (f replicas) stays
    /// down until the run heals: the majority that comes back must serve
    /// by itself (each replica resumes from its replica log). Topics are
    /// all `persisted`, the only mode whose groups keep that log.
    Outage,
    /// A rolling restart, as an operator (or the real-process nemesis)
    /// does it: one replica's process is killed at a time (its page cache
    /// survives: no power loss) and started again a little later, and it
    /// counts as healthy as soon as its process is up, so the next kill
    /// may land while it is still catching up. Both durabilities; a
    /// restarted replica must not forget what it acknowledged.
    Rolling,
}

impl FaultProfile {
    /// Every profile, in the order CI sweeps them.
    pub const ALL: [Self; 12] = [
        Self::None,
        Self::Network,
        Self::Reorder,
        Self::Partition,
        Self::Crash,
        Self::Disk,
        Self::Mixed,
        Self::Wipe,
        Self::Rot,
        Self::Blackout,
        Self::Outage,
        Self::Rolling,
    ];

    /// Whether the workload creates only `persisted` topics: a whole-
    /// cluster crash may lose acknowledged writes of `replicated` ones.
    pub fn persisted_only(self) -> bool {
        matches!(self, Self::Blackout | Self::Outage)
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Network => "network",
            Self::Reorder => "reorder",
            Self::Partition => "partition",
            Self::Crash => "crash",
            Self::Disk => "disk",
            Self::Mixed => "mixed",
            Self::Wipe => "wipe",
            Self::Rot => "rot",
            Self::Blackout => "blackout",
            Self::Outage => "outage",
            Self::Rolling => "rolling",
        }
    }

    /// Whether the profile injects crashes, disk faults, partitions or
    /// degraded links (every profile but `none` and `reorder`).
    pub fn injects_replica_or_link_faults(self) -> bool {
        let r = self.rates();
        r.link_degrade_per_mille
            + r.partition_per_mille
            + r.crash_per_mille
            + r.disk_per_mille
            + r.rot_per_mille
            + r.wipe_per_mille
            + r.blackout_per_mille
            > 0
    }

    /// The chances this profile runs with.
    pub(crate) fn rates(self) -> FaultRates {
        let quiet = FaultRates::default();
        match self {
            Self::None => quiet,
            Self::Network => FaultRates {
                base: NetworkFaults {
                    drop_per_mille: 50,
                    duplicate_per_mille: 30,
                    delay_ticks_max: 4,
                },
                link_degrade_per_mille: 20,
                ..quiet
            },
            Self::Reorder => FaultRates {
                base: NetworkFaults {
                    drop_per_mille: 0,
                    duplicate_per_mille: 20,
                    delay_ticks_max: 25,
                },
                ..quiet
            },
            Self::Partition => FaultRates {
                partition_per_mille: 8,
                ..quiet
            },
            Self::Crash => FaultRates {
                crash_per_mille: 8,
                ..quiet
            },
            Self::Disk => FaultRates {
                disk_per_mille: 8,
                ..quiet
            },
            Self::Mixed => FaultRates {
                base: NetworkFaults {
                    drop_per_mille: 20,
                    duplicate_per_mille: 10,
                    delay_ticks_max: 6,
                },
                link_degrade_per_mille: 5,
                partition_per_mille: 3,
                crash_per_mille: 3,
                disk_per_mille: 2,
                ..quiet
            },
            Self::Wipe => FaultRates {
                base: LIGHT_LOSS,
                partition_per_mille: 3,
                crash_per_mille: 2,
                wipe_per_mille: 4,
                ..quiet
            },
            Self::Rot => FaultRates {
                rot_per_mille: 5,
                ..quiet
            },
            Self::Blackout => FaultRates {
                base: LIGHT_LOSS,
                crash_per_mille: 1,
                blackout_per_mille: 3,
                ..quiet
            },
            Self::Outage => FaultRates {
                base: LIGHT_LOSS,
                crash_per_mille: 1,
                blackout_per_mille: 3,
                blackout_keeps_minority_down: true,
                ..quiet
            },
            Self::Rolling => FaultRates {
                base: LIGHT_LOSS,
                crash_per_mille: 8,
                rolling_kills: true,
                ..quiet
            },
        }
    }
}

impl fmt::Display for FaultProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A profile name that is not one of [`FaultProfile::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = FaultProfile::ALL.iter().map(|p| p.name()).collect();
        write!(
            f,
            "unknown fault profile {:?} (expected one of {})",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownProfile {}

impl FromStr for FaultProfile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}

/// The light network-wide loss the wipe and blackout profiles both run
/// with, beside their disk and whole-cluster faults.
const LIGHT_LOSS: NetworkFaults = NetworkFaults {
    drop_per_mille: 10,
    duplicate_per_mille: 5,
    delay_ticks_max: 4,
};

/// Per-tick chances (per mille) of each fault class, and the network-wide
/// fault mix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FaultRates {
    /// The mix every link starts with.
    pub base: NetworkFaults,
    /// Chance a random link gets a harsh mix for a while.
    pub link_degrade_per_mille: u64,
    /// Chance an isolation, split or one-way cut starts (one at a time).
    pub partition_per_mille: u64,
    /// Chance a replica crashes (within the fault budget).
    pub crash_per_mille: u64,
    /// Chance a replica's disk is armed to fail (within the budget).
    pub disk_per_mille: u64,
    /// Chance a bit of a sealed segment on a replica flips (within the
    /// budget; the replica stays faulty for the rest of the run).
    pub rot_per_mille: u64,
    /// Chance a replica's disk is replaced by an empty one (within the
    /// budget; never on a single replica).
    pub wipe_per_mille: u64,
    /// Chance every replica crashes at once (only when all are healthy;
    /// never on a single replica, whose crash is `crash_per_mille`'s).
    pub blackout_per_mille: u64,
    /// After a whole-cluster crash, f replicas stay down until the heal.
    pub blackout_keeps_minority_down: bool,
    /// Crashes are process kills (the page cache survives), at most one
    /// process is down at a time, and a restarted replica counts as
    /// healthy once its process is up (`rolling`).
    pub rolling_kills: bool,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_every_profile_name_when_parsed_should_round_trip() {
        for p in FaultProfile::ALL {
            assert_eq!(p.name().parse::<FaultProfile>(), Ok(p));
        }
    }

    #[test]
    fn given_unknown_name_when_parsed_should_refuse_it_naming_the_choices() {
        let err = "chaos".parse::<FaultProfile>().unwrap_err();
        assert_eq!(err, UnknownProfile("chaos".into()));
        assert!(err.to_string().contains("mixed"), "{err}");
    }

    #[test]
    fn given_none_profile_when_rated_should_inject_nothing() {
        assert_eq!(FaultProfile::None.rates(), FaultRates::default());
        for p in FaultProfile::ALL.into_iter().skip(1) {
            assert_ne!(p.rates(), FaultRates::default(), "{p}");
        }
    }
}
