//! The fault plan: a seeded stream of fault decisions, drawn once per
//! tick, kept inside what the configuration tolerates.
//!
//! Crashes and disk faults take a replica out of the quorum, and so does
//! the time a restarted replica spends catching up (in `replicated` mode
//! it may have forgotten prepares it acknowledged): the plan counts a
//! replica as faulty from the fault until every group on it has applied
//! what the others had committed when it came back, and never lets more
//! than f = (R − 1) / 2 be faulty at once. A single replica (f = 0) is only
//! ever killed as a process (its page cache survives), never power-cut,
//! and never loses its disk. A replaced disk (a wipe) counts like a
//! crash: the replica is faulty from the wipe until every group on it has
//! rejoined (quorum-visible) and applied what the others had committed.
//! Network faults (loss, duplication, delay, partitions) lose no durable
//! state and are not counted.

use common::Prng;
use common::simnet::NetworkFaults;
use common::{GroupId, METADATA_GROUP, ReplicaId};
use consensus::vsr::Status;
use storage::fs::{CrashMode, EIO, ENOSPC, FaultKind};

use crate::cluster::{Cluster, ClusterError};
use crate::profile::{FaultProfile, FaultRates};
use crate::trace::{Event, Trace};

/// Fault counters, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FaultStats {
    pub crashes: u64,
    pub restarts: u64,
    pub disk_faults: u64,
    pub partitions: u64,
    pub degraded_links: u64,
    pub rotted_bits: u64,
    pub wipes: u64,
    /// Crashes of a replica still rejoining after its disk was replaced.
    pub rejoin_crashes: u64,
    /// Boots without the rejoin flag of a replica whose disk was replaced
    /// (they rejoin through the marker, or are ordinary restarts).
    pub wiped_reboots: u64,
    /// Whole-cluster crashes (every replica at once).
    pub blackouts: u64,
    /// Whole-cluster crashes after which f replicas stayed down until the
    /// heal (the `outage` profile).
    pub outages: u64,
    /// Writes acknowledged while such a minority was down: the majority
    /// that came back served by itself.
    pub outage_acks: u64,
    /// Crashes and disk faults that took a replica while f were already
    /// faulty (runs marked to exceed f).
    pub beyond_f: u64,
}

#[derive(Debug, Clone)]
enum Health {
    Up,
    /// Down until `restart_tick`.
    Crashed {
        restart_tick: u64,
    },
    /// Its process died and its disk was replaced by an empty one (or it
    /// crashed again while rejoining since); it boots at `restart_tick`,
    /// with the rejoin flag after the replacement, without it after a
    /// crash (its marker says it rejoins).
    Wiped {
        restart_tick: u64,
    },
    /// Its disk is armed to fail; the process is restarted at
    /// `restart_tick` (it died with the fault, or would have).
    DiskFaulted {
        restart_tick: u64,
    },
    /// Back up, catching up to `targets` (group, commit). `rejoining`:
    /// since a disk replacement, so it may crash again before it caught
    /// up (it is already the faulty one) and must keep rejoining through
    /// its marker on a boot without the flag.
    Recovering {
        targets: Vec<(GroupId, u64)>,
        rejoining: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Degraded {
    from: u8,
    to: u8,
    until_tick: u64,
}

/// The plan.
pub(crate) struct FaultPlan {
    prng: Prng,
    rates: FaultRates,
    health: Vec<Health>,
    /// Replicas whose disk took a flipped bit: faulty for the rest of the
    /// run (the damage is latent until something reads it).
    rotten: Vec<bool>,
    /// Group directories (by replica) where a superblock copy was flipped:
    /// the other copy is never flipped too (two damaged copies are a lost
    /// replica, not a latent fault the group repairs).
    superblock_rotted: std::collections::BTreeSet<(u8, GroupId)>,
    /// The tick the current partition heals at.
    partition_until: Option<u64>,
    degraded: Vec<Degraded>,
    f: usize,
    /// How many replicas crashes and disk faults may leave faulty at
    /// once: f, or every replica in a run marked to exceed f.
    crash_budget: usize,
    replica_count: u8,
    /// The mutation check: a replaced disk boots as a new member.
    wipe_as_new: bool,
    pub(crate) stats: FaultStats,
}

impl FaultPlan {
    pub(crate) fn new(
        seed: u64,
        profile: FaultProfile,
        replica_count: u8,
        wipe_as_new: bool,
        exceed_f: bool,
    ) -> Self {
        let f = usize::from(replica_count.saturating_sub(1) / 2);
        Self {
            prng: Prng::new(seed ^ 0xFA17_0001),
            rates: profile.rates(),
            health: vec![Health::Up; usize::from(replica_count)],
            rotten: vec![false; usize::from(replica_count)],
            superblock_rotted: std::collections::BTreeSet::new(),
            partition_until: None,
            degraded: Vec::new(),
            f,
            crash_budget: if exceed_f {
                usize::from(replica_count)
            } else {
                f
            },
            replica_count,
            wipe_as_new,
            stats: FaultStats::default(),
        }
    }

    /// The network-wide mix the run starts with.
    pub(crate) fn base_faults(&self) -> NetworkFaults {
        self.rates.base
    }

    fn faulty(&self) -> usize {
        self.health
            .iter()
            .zip(&self.rotten)
            .filter(|(h, rotten)| !matches!(h, Health::Up) || **rotten)
            .count()
    }

    /// Counts a fault on `r` that takes the faulty replicas past f.
    fn note_beyond_f(&mut self, r: u8) {
        let already =
            matches!(self.health[usize::from(r)], Health::Up) && !self.rotten[usize::from(r)];
        if self.replica_count > 1 && already && self.faulty() >= self.f {
            self.stats.beyond_f += 1;
        }
    }

    fn roll(&mut self, per_mille: u64) -> bool {
        per_mille > 0 && self.prng.chance(per_mille, 1000)
    }

    fn pick(&mut self, n: u64) -> u64 {
        self.prng.below_inclusive(n.saturating_sub(1))
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.prng.below_inclusive(high - low)
    }

    /// One tick of the plan: restarts and heals that are due, recoveries
    /// that finished, and new faults as the rates and budget allow.
    pub(crate) fn step(
        &mut self,
        cluster: &mut Cluster,
        trace: &mut Trace,
    ) -> Result<(), ClusterError> {
        let tick = cluster.tick();
        self.restarts_due(tick, cluster, trace)?;
        self.recoveries(cluster);
        if self.partition_until.is_some_and(|t| t <= tick) {
            self.heal_partition(cluster, trace, tick);
        }
        let due: Vec<Degraded> = self
            .degraded
            .iter()
            .filter(|d| d.until_tick <= tick)
            .copied()
            .collect();
        self.degraded.retain(|d| d.until_tick > tick);
        for d in due {
            cluster
                .net
                .set_link_faults(ReplicaId(d.from), ReplicaId(d.to), None);
        }
        if self.replica_count > 1 && self.roll(self.rates.link_degrade_per_mille) {
            self.degrade_link(cluster, trace, tick);
        }
        if self.replica_count > 1
            && self.partition_until.is_none()
            && self.roll(self.rates.partition_per_mille)
        {
            self.partition(cluster, trace, tick);
        }
        if self.roll(self.rates.crash_per_mille) {
            self.crash(cluster, trace, tick);
        }
        if self.roll(self.rates.disk_per_mille) {
            self.disk_fault(cluster, trace, tick);
        }
        if self.roll(self.rates.rot_per_mille) {
            self.rot(cluster, trace, tick);
        }
        if self.replica_count > 1 && self.roll(self.rates.wipe_per_mille) {
            self.wipe(cluster, trace, tick)?;
        }
        if self.replica_count > 1 && self.roll(self.rates.blackout_per_mille) {
            self.blackout(cluster, trace, tick);
        }
        Ok(())
    }

    /// Every replica crashes at once, when all are healthy: a power loss
    /// of the whole cluster (each disk keeps a seeded part of its unsynced
    /// writes) or a kill of every process (page caches survive). Each
    /// boots 20–300 ticks later; nobody is left to answer their probes, so
    /// the groups come back only through the census.
    fn blackout(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        if self.faulty() > 0 || (0..self.replica_count).any(|r| !cluster.is_up(r)) {
            return;
        }
        let mode = if self.prng.chance(1, 2) {
            CrashMode::Seeded
        } else {
            CrashMode::KeepAll
        };
        // The `outage` profile: f replicas, drawn, stay down until the heal.
        let mut stay_down = Vec::new();
        if self.rates.blackout_keeps_minority_down {
            let mut all: Vec<u8> = (0..self.replica_count).collect();
            for _ in 0..self.f {
                let i = self.prng.below_inclusive(all.len() as u64 - 1) as usize;
                stay_down.push(all.swap_remove(i));
            }
            self.stats.outages += 1;
        }
        let mut downs = Vec::new();
        for r in 0..self.replica_count {
            let down_ticks = self.between(20, 300);
            cluster.crash(r, mode);
            self.stats.crashes += 1;
            let restart_tick = if stay_down.contains(&r) {
                u64::MAX
            } else {
                tick + down_ticks
            };
            self.health[usize::from(r)] = Health::Crashed { restart_tick };
            downs.push(down_ticks);
        }
        self.stats.blackouts += 1;
        trace.record(Event::Fault {
            tick,
            what: format!(
                "blackout: every replica crashed ({mode:?}), down for {downs:?} ticks, {stay_down:?} until the heal"
            ),
        });
    }

    /// Whether replicas of an outage are still down (until the heal).
    pub(crate) fn outage_active(&self) -> bool {
        self.health.iter().any(|h| {
            matches!(
                h,
                Health::Crashed {
                    restart_tick: u64::MAX
                }
            )
        })
    }

    /// A replica that may take a fault now, if the budget allows one:
    /// f faulty at once, or (`may_exceed`: a crash or a disk fault in a run
    /// marked to exceed f) every replica.
    fn victim(&mut self, cluster: &Cluster, may_exceed: bool) -> Option<u8> {
        let budget = if may_exceed {
            self.crash_budget
        } else {
            self.f
        };
        let budget_left = if self.replica_count == 1 {
            self.faulty() == 0
        } else {
            self.faulty() < budget
        };
        if !budget_left {
            return None;
        }
        let up: Vec<u8> = (0..self.replica_count)
            .filter(|r| matches!(self.health[usize::from(*r)], Health::Up) && cluster.is_up(*r))
            .collect();
        if up.is_empty() {
            return None;
        }
        let i = self.pick(up.len() as u64) as usize;
        Some(up[i])
    }

    fn crash(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        // Half the crashes, when a replica is rejoining after a disk
        // replacement, hit that replica again: it is faulty already, so the
        // budget is unchanged, and its next boot has no rejoin flag.
        let rejoining: Vec<u8> = (0..self.replica_count)
            .filter(|r| {
                matches!(
                    self.health[usize::from(*r)],
                    Health::Recovering {
                        rejoining: true,
                        ..
                    }
                ) && cluster.is_up(*r)
            })
            .collect();
        let again = (!rejoining.is_empty() && self.prng.chance(1, 2))
            .then(|| rejoining[self.pick(rejoining.len() as u64) as usize]);
        let Some(r) = again.or_else(|| self.victim(cluster, true)) else {
            return;
        };
        self.note_beyond_f(r);
        // A single replica is killed, not power-cut: f = 0 tolerates no
        // lost disk state (SPEC §6.1).
        let mode = if self.replica_count == 1 || self.rates.rolling_kills {
            CrashMode::KeepAll
        } else {
            CrashMode::Seeded
        };
        let down_ticks = self.between(20, 300);
        cluster.crash(r, mode);
        self.stats.crashes += 1;
        self.health[usize::from(r)] = if again.is_some() {
            self.stats.rejoin_crashes += 1;
            Health::Wiped {
                restart_tick: tick + down_ticks,
            }
        } else {
            Health::Crashed {
                restart_tick: tick + down_ticks,
            }
        };
        trace.record(Event::Fault {
            tick,
            what: format!(
                "crash replica {r} ({mode:?}) for {down_ticks} ticks{}",
                if again.is_some() {
                    ", while it rejoins"
                } else {
                    ""
                }
            ),
        });
    }

    /// Replaces a replica's disk with an empty one (its process dies with
    /// the old disk); it boots `ShardConfig::rejoin` 20–300 ticks later.
    fn wipe(
        &mut self,
        cluster: &mut Cluster,
        trace: &mut Trace,
        tick: u64,
    ) -> Result<(), ClusterError> {
        let Some(r) = self.victim(cluster, false) else {
            return Ok(());
        };
        let down_ticks = self.between(20, 300);
        cluster.wipe(r, self.wipe_as_new)?;
        self.stats.wipes += 1;
        self.health[usize::from(r)] = Health::Wiped {
            restart_tick: tick + down_ticks,
        };
        trace.record(Event::Fault {
            tick,
            what: format!(
                "replica {r}: disk replaced by an empty one; boots {} in {down_ticks} ticks",
                if self.wipe_as_new {
                    "as a new member (mutation)"
                } else {
                    "rejoining"
                }
            ),
        });
        Ok(())
    }

    /// Arms one disk fault on a replica within the budget: one of its next
    /// 40 writes fails with EIO or ENOSPC or lands torn (a prefix written,
    /// then EIO), or one of its next 40 syncs fails, or one of its next 40
    /// reads returns short. The replica is restarted 50–300 ticks later
    /// (its process died with the fault, or would have). The variant is
    /// derived from the draws the plan always made (kind, call number), so
    /// a seed's fault schedule is the one it had with EIO alone.
    fn disk_fault(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        let Some(r) = self.victim(cluster, true) else {
            return;
        };
        self.note_beyond_f(r);
        let write = self.prng.chance(1, 2);
        let nth = self.between(1, 40);
        let restart_in = self.between(50, 300);
        let fs = cluster.fs(r);
        let what = match (write, nth % 4) {
            (true, 0) => {
                fs.fail_nth(FaultKind::Write, nth, ENOSPC);
                "Write call {nth} from now fails with ENOSPC"
            }
            (true, 1) => {
                // A sector-ish prefix lands, the rest does not.
                fs.tear_nth_write(nth, usize::try_from(nth * 97).unwrap_or(0));
                "Write call {nth} from now lands torn"
            }
            (true, _) => {
                fs.fail_nth(FaultKind::Write, nth, EIO);
                "Write call {nth} from now fails with EIO"
            }
            (false, 0) => {
                fs.short_nth_read(nth, usize::try_from(nth * 13).unwrap_or(1));
                "Read call {nth} from now returns short"
            }
            (false, _) => {
                fs.fail_nth(FaultKind::Sync, nth, EIO);
                "Sync call {nth} from now fails with EIO"
            }
        };
        self.stats.disk_faults += 1;
        self.health[usize::from(r)] = Health::DiskFaulted {
            restart_tick: tick + restart_in,
        };
        trace.record(Event::Fault {
            tick,
            what: format!(
                "replica {r}: {}; restart in {restart_in} ticks",
                what.replace("{nth}", &nth.to_string())
            ),
        });
    }

    /// Flips one bit of a replica's committed data within the budget: in
    /// a sealed segment (one draw in six), the active segment, a
    /// consumer-offset record, a small record of the group (its slot in
    /// one copy of the shard's superblock table, at most one copy per
    /// group; a client-table slot), a sealed
    /// segment's index (which the scrub checks against its log and
    /// rewrites), or group 0's WAL or snapshot (a sealed segment when the
    /// replica has neither yet; boot sets a damaged store aside and
    /// repairs it from the peers). Half the time the replica is down when it happens
    /// (killed first, restarted 20–300 ticks later), so its boot meets the
    /// damage; otherwise a read, the scrub or a later boot does.
    fn rot(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        if self.replica_count == 1 {
            // f = 0: a single replica has no peer to repair from.
            return;
        }
        let Some(r) = self.victim(cluster, false) else {
            return;
        };
        let mut places = RotPlaces::default();
        for s in 0..cluster.shard_count {
            let Some(shard) = cluster.shard_at(r, s) else {
                continue;
            };
            for group in shard.groups() {
                self.group_rot_places(cluster, r, group, &mut places);
            }
        }
        let kind = self.pick(6);
        let metadata = if kind == 5 {
            metadata_rot_places(cluster, r)
        } else {
            Vec::new()
        };
        let candidates = match kind {
            0 if !places.active.is_empty() => &places.active,
            1 if !places.records.is_empty() => &places.records,
            2 if !places.small.is_empty() => &places.small,
            3 if !places.indexes.is_empty() => &places.indexes,
            5 if !metadata.is_empty() => &metadata,
            _ => &places.sealed,
        };
        if candidates.is_empty() {
            return;
        }
        let place = candidates[self.pick(candidates.len() as u64) as usize].clone();
        self.flip_bit(cluster, trace, tick, r, place);
    }

    /// Adds every place of `group` on replica `r` that rot may strike to
    /// `places`, by kind.
    fn group_rot_places(&self, cluster: &Cluster, r: u8, group: GroupId, places: &mut RotPlaces) {
        let dir = cluster.group_dir(group);
        let files = cluster.segment_files(r, group);
        let logs: Vec<(String, usize)> = files
            .iter()
            .filter(|(n, b)| n.ends_with(".log") && !b.is_empty())
            .map(|(n, b)| (n.clone(), b.len()))
            .collect();
        // A sealed segment's index: every non-empty one but the
        // active segment's, which is rewritten as it grows.
        let active_index = logs
            .last()
            .map(|(n, _)| n.replace(".log", ".index"))
            .unwrap_or_default();
        for (name, bytes) in &files {
            if name.ends_with(".index") && !bytes.is_empty() && *name != active_index {
                places.indexes.push((group, dir.join(name), 0, bytes.len()));
            }
        }
        // Every segment but the last is sealed.
        for (i, (name, len)) in logs.iter().enumerate() {
            let place = (group, dir.join(name), 0, *len);
            if i + 1 < logs.len() {
                places.sealed.push(place);
            } else {
                places.active.push(place);
            }
        }
        for (path, len) in cluster.offset_records(r, group) {
            places.records.push((group, path, 0, len));
        }
        for name in &partitions::CLIENT_TABLE_FILES {
            let path = dir.join(name);
            let len = cluster.fs(r).contents(&path).map_or(0, |b| b.len());
            if len > 0 {
                places.small.push((group, path, 0, len));
            }
        }
        // The group's slot in either copy of its shard's superblock
        // table, at most one copy per group and replica.
        if !self.superblock_rotted.contains(&(r, group))
            && let Some(shard_dir) = dir.parent()
        {
            for name in journal::TABLE_NAMES {
                let path = shard_dir.join(name);
                let bytes = cluster.fs(r).contents(&path).unwrap_or_default();
                let slot = journal::TABLE_SLOT_LEN;
                for (i, record) in bytes.chunks_exact(slot).enumerate() {
                    if record[8..16] == group.0.to_le_bytes() {
                        places.small.push((group, path.clone(), i * slot, slot));
                    }
                }
            }
        }
    }

    /// Flips a random bit of `place` on replica `r`, half the time with
    /// the replica crashed first (and restarted 20–300 ticks later).
    fn flip_bit(
        &mut self,
        cluster: &mut Cluster,
        trace: &mut Trace,
        tick: u64,
        r: u8,
        place: RotPlace,
    ) {
        let (group, path, start, len) = place;
        let pos = start as u64 + self.pick(len as u64);
        let mask = 1u8 << self.pick(8);
        let down = self.prng.chance(1, 2).then(|| self.between(20, 300));
        if let Some(down_ticks) = down {
            cluster.crash(r, CrashMode::KeepAll);
            self.stats.crashes += 1;
            self.health[usize::from(r)] = Health::Crashed {
                restart_tick: tick + down_ticks,
            };
        }
        if cluster.fs(r).rot_byte(&path, pos, mask).is_err() {
            return;
        }
        self.stats.rotted_bits += 1;
        self.rotten[usize::from(r)] = true;
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| journal::TABLE_NAMES.contains(&n))
        {
            self.superblock_rotted.insert((r, group));
        }
        trace.record(Event::Fault {
            tick,
            what: format!(
                "replica {r}: bit {mask:#04x} of byte {pos} of group {} {} flipped{}",
                group.0,
                path.display(),
                match down {
                    Some(t) => format!(" while it is down for {t} ticks"),
                    None => String::new(),
                }
            ),
        });
    }

    fn degrade_link(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        let n = u64::from(self.replica_count);
        let from = self.pick(n) as u8;
        let to = ((u64::from(from) + 1 + self.pick(n - 1)) % n) as u8;
        let faults = NetworkFaults {
            drop_per_mille: self.prng.below_inclusive(600),
            duplicate_per_mille: self.prng.below_inclusive(200),
            delay_ticks_max: self.prng.below_inclusive(15),
        };
        let until_tick = tick + self.between(20, 200);
        cluster
            .net
            .set_link_faults(ReplicaId(from), ReplicaId(to), Some(faults));
        self.degraded.push(Degraded {
            from,
            to,
            until_tick,
        });
        self.stats.degraded_links += 1;
        trace.record(Event::Fault {
            tick,
            what: format!("link {from}->{to} degraded to {faults:?} until t{until_tick}"),
        });
    }

    fn partition(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        let n = u64::from(self.replica_count);
        let until = tick + self.between(50, 400);
        let what = match self.prng.below_inclusive(2) {
            0 => {
                let r = self.pick(n) as u8;
                cluster.net.set_isolated(ReplicaId(r), true);
                format!("isolate replica {r}")
            }
            1 => {
                // A random minority on one side, the rest on the other.
                let mut order: Vec<u8> = (0..self.replica_count).collect();
                for i in (1..order.len()).rev() {
                    let j = self.prng.below_inclusive(i as u64) as usize;
                    order.swap(i, j);
                }
                let k = 1 + self.pick(n / 2) as usize;
                let (a, b) = order.split_at(k);
                for &x in a {
                    for &y in b {
                        cluster.net.set_link_cut(ReplicaId(x), ReplicaId(y), true);
                        cluster.net.set_link_cut(ReplicaId(y), ReplicaId(x), true);
                    }
                }
                format!("split {a:?} | {b:?}")
            }
            _ => {
                // Asymmetric: one replica hears everyone and reaches no
                // one, or the other way round.
                let r = self.pick(n) as u8;
                let outbound = self.prng.chance(1, 2);
                for other in (0..self.replica_count).filter(|o| *o != r) {
                    if outbound {
                        cluster
                            .net
                            .set_link_cut(ReplicaId(r), ReplicaId(other), true);
                    } else {
                        cluster
                            .net
                            .set_link_cut(ReplicaId(other), ReplicaId(r), true);
                    }
                }
                format!(
                    "replica {r} {}",
                    if outbound {
                        "cannot send"
                    } else {
                        "cannot hear"
                    }
                )
            }
        };
        self.partition_until = Some(until);
        self.stats.partitions += 1;
        trace.record(Event::Fault {
            tick,
            what: format!("{what} until t{until}"),
        });
    }

    fn heal_partition(&mut self, cluster: &mut Cluster, trace: &mut Trace, tick: u64) {
        self.partition_until = None;
        for r in 0..self.replica_count {
            cluster.net.set_isolated(ReplicaId(r), false);
            for o in 0..self.replica_count {
                cluster.net.set_link_cut(ReplicaId(r), ReplicaId(o), false);
            }
        }
        trace.record(Event::Fault {
            tick,
            what: "partition healed".into(),
        });
    }

    fn restarts_due(
        &mut self,
        tick: u64,
        cluster: &mut Cluster,
        trace: &mut Trace,
    ) -> Result<(), ClusterError> {
        for r in 0..self.replica_count {
            let due = match self.health[usize::from(r)] {
                Health::Crashed { restart_tick } | Health::Wiped { restart_tick } => {
                    (restart_tick <= tick).then_some(false)
                }
                Health::DiskFaulted { restart_tick } => (restart_tick <= tick).then_some(true),
                Health::Up | Health::Recovering { .. } => None,
            };
            if let Some(disk) = due {
                self.restart(r, disk, cluster, trace, tick)?;
            }
        }
        Ok(())
    }

    fn restart(
        &mut self,
        r: u8,
        after_disk_fault: bool,
        cluster: &mut Cluster,
        trace: &mut Trace,
        tick: u64,
    ) -> Result<(), ClusterError> {
        if after_disk_fault {
            // The process died with its disk's fault; the page cache
            // survives a process death.
            cluster.crash(r, CrashMode::KeepAll);
        }
        let targets = catch_up_targets(cluster, r);
        let rejoining = matches!(self.health[usize::from(r)], Health::Wiped { .. });
        let mut what = format!("restart replica {r}");
        if cluster.rebooting_replaced_disk(r) {
            self.stats.wiped_reboots += 1;
            what = format!("{what} (a replaced disk; {})", cluster.rejoin_marker(r));
        }
        cluster.boot(r)?;
        self.stats.restarts += 1;
        self.health[usize::from(r)] = if self.rates.rolling_kills && !rejoining {
            // A rolling restart moves on once the process is up.
            Health::Up
        } else {
            Health::Recovering { targets, rejoining }
        };
        trace.record(Event::Fault { tick, what });
        Ok(())
    }

    fn recoveries(&mut self, cluster: &Cluster) {
        for r in 0..self.replica_count {
            let Health::Recovering { targets, .. } = &self.health[usize::from(r)] else {
                continue;
            };
            // Caught up: every group it hosts (group 0 included) was told
            // the current view and reached the head its primary reported
            // (a restarted replica is quorum-invisible until then), and
            // applied what the others had committed when it came back.
            let visible =
                |v: &consensus::vsr::Replica| v.status() == Status::Normal && v.is_quorum_visible();
            let caught_up = targets.iter().all(|(group, commit)| {
                cluster
                    .replica_of(r, *group)
                    .is_some_and(|v| visible(v) && v.commit_min().0 >= *commit)
            }) && hosted_groups(cluster, r)
                .iter()
                .all(|g| cluster.replica_of(r, *g).is_some_and(visible));
            if caught_up {
                self.health[usize::from(r)] = Health::Up;
            }
        }
    }

    /// Ends every fault: the network heals, downed and disk-faulted
    /// replicas restart, armed disk faults are cleared.
    pub(crate) fn heal_all(
        &mut self,
        cluster: &mut Cluster,
        trace: &mut Trace,
    ) -> Result<(), ClusterError> {
        let tick = cluster.tick();
        cluster.net.heal(NetworkFaults::default());
        self.partition_until = None;
        self.degraded.clear();
        for r in 0..self.replica_count {
            cluster.fs(r).clear_faults();
            match self.health[usize::from(r)] {
                Health::Crashed { .. } | Health::Wiped { .. } => {
                    self.restart(r, false, cluster, trace, tick)?;
                }
                Health::DiskFaulted { .. } => self.restart(r, true, cluster, trace, tick)?,
                Health::Up | Health::Recovering { .. } => {}
            }
        }
        trace.record(Event::Fault {
            tick,
            what: "healed everything".into(),
        });
        Ok(())
    }
}

/// A place rot may strike: `(group, path, start, length)`.
type RotPlace = (GroupId, std::path::PathBuf, usize, usize);

/// The places of one replica rot may strike, by kind.
#[derive(Default)]
struct RotPlaces {
    /// Sealed segments' logs.
    sealed: Vec<RotPlace>,
    /// Active segments' logs.
    active: Vec<RotPlace>,
    /// Consumer-offset records.
    records: Vec<RotPlace>,
    /// Client-table files and superblock-table slots.
    small: Vec<RotPlace>,
    /// Sealed segments' indexes.
    indexes: Vec<RotPlace>,
}

/// Group 0's WAL (its first half, so the damage is mostly interior: a
/// later entry still verifies) or its snapshot, on replica `r`.
fn metadata_rot_places(cluster: &Cluster, r: u8) -> Vec<RotPlace> {
    let mut metadata = Vec::new();
    let dir = cluster.metadata_dir();
    for (name, half) in [(metadata::WAL_FILE, true), (metadata::SNAPSHOT_FILE, false)] {
        let path = dir.join(name);
        let len = cluster.fs(r).contents(&path).map_or(0, |b| b.len());
        let len = if half { len / 2 } else { len };
        if len > 0 {
            metadata.push((common::METADATA_GROUP, path, 0, len));
        }
    }
    metadata
}

/// Every group replica `r` hosts now, group 0 first.
fn hosted_groups(cluster: &Cluster, r: u8) -> Vec<GroupId> {
    let mut out = Vec::new();
    for s in 0..cluster.shard_count {
        if let Some(shard) = cluster.shard_at(r, s) {
            if shard.metadata().is_some() {
                out.push(METADATA_GROUP);
            }
            out.extend(shard.groups());
        }
    }
    out
}

/// What replica `r` must reach before it counts as healthy again: per
/// group, the highest commit any other live replica knows.
fn catch_up_targets(cluster: &Cluster, r: u8) -> Vec<(GroupId, u64)> {
    let mut targets: std::collections::BTreeMap<GroupId, u64> = std::collections::BTreeMap::new();
    for other in (0..cluster.replica_count).filter(|o| *o != r) {
        for s in 0..cluster.shard_count {
            let Some(shard) = cluster.shard_at(other, s) else {
                continue;
            };
            let groups = shard
                .groups()
                .chain(shard.metadata().map(|_| METADATA_GROUP));
            for group in groups.collect::<Vec<_>>() {
                if let Some(v) = cluster.replica_of(other, group) {
                    let e = targets.entry(group).or_default();
                    *e = (*e).max(v.commit_max().0);
                }
            }
        }
    }
    targets.into_iter().collect()
}
