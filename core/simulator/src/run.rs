//! One simulated run: boot, the fault-and-workload phase, healing, the
//! quiet period, and the final convergence and oracle checks.

use std::collections::BTreeMap;
use std::fmt;

use common::{GroupId, METADATA_GROUP, Prng};
use consensus::vsr::Status;
use xxhash_rust::xxh3::Xxh3;

use crate::cluster::{Cluster, ClusterError, Messages, TICK};
use crate::faults::{FaultPlan, FaultStats};
use crate::oracle::{Fate, Oracle, Property, Violation};
use crate::profile::FaultProfile;
use crate::trace::{Event, Trace};
use crate::workload::{
    BATCH_BYTES_MAX, Mix, StepError, TOPIC_SEGMENT_SIZE_BYTES, Workload, WorkloadStats,
};

/// Ticks a run may spend converging after healing before it fails.
const CONVERGE_TICKS_MAX: u64 = 4_000;
/// How often convergence is checked while waiting for it.
const CONVERGE_CHECK_EVERY_TICKS: u64 = 25;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The seed every random choice follows.
    pub seed: u64,
    /// Ticks of faults and workload before healing.
    pub ticks: u64,
    /// Replicas: 1, 3 or 5.
    pub replicas: u8,
    /// Shards per replica: 1 to 8.
    pub shards: u16,
    /// The fault classes injected.
    pub profile: FaultProfile,
    /// Concurrent clients.
    pub clients: u8,
    /// Ticks after healing with requests in flight finishing and nothing
    /// new sent, before convergence is awaited.
    pub quiet_ticks: u64,
    /// Mutation check, never on in CI: a replica whose disk was replaced
    /// boots as a brand-new member instead of rejoining. Some seeds must
    /// then lose acknowledged data or fork (docs/simulator.md).
    pub mutate_wipe_as_new: bool,
    /// Crashes and disk faults may take more than f replicas at once (up
    /// to all of them); wipes and rot stay within f. The workload creates
    /// only `persisted` topics, every safety property is checked, and a
    /// run whose groups do not converge after healing ends `stalled`
    /// instead of failing: liveness is not promised past f.
    pub exceed_f: bool,
    /// Topic purges in the workload (through group 0, as a client's
    /// PurgeTopic): the oracle learns each once it is applied, with the
    /// topic's groups held quiet meanwhile.
    pub purges: bool,
    /// Topic deletes in the workload (through group 0): the topic's
    /// groups are held quiet first, and must be gone from every replica
    /// once converged.
    pub deletes: bool,
    /// Two topics in four expire their messages after 3 s of virtual time,
    /// so retention removes sealed segments while the workload runs; the
    /// final checks allow an expired prefix to be gone.
    pub retention: bool,
    /// Clients create a topic's consumer group, join it, leave it and end
    /// their sessions through group 0; once converged, every session's
    /// membership must be what the committed ops left.
    pub consumer_groups: bool,
    /// Now and then a purge of the whole stream (PURGE_STREAM through
    /// group 0): every live topic's groups are held quiet until each has
    /// applied its new generation, as for a topic purge.
    pub stream_purges: bool,
    /// Now and then a delete of the whole stream (DELETE_STREAM through
    /// group 0): every live topic's groups are held quiet first, every
    /// replica must then drop them, and the workload creates the stream
    /// and new topics again.
    pub stream_deletes: bool,
    /// Two topics in four (of both durabilities) have a size ceiling, so
    /// retention removes sealed segments by size; the final checks allow
    /// any prefix to be gone, and require each replica to keep what the
    /// ceiling leaves (its share, less one segment).
    pub size_retention: bool,
}

impl Options {
    /// Defaults around a seed: 2,000 ticks, 3 replicas, 2 shards, mixed
    /// faults, 3 clients, 200 quiet ticks.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ticks: 2_000,
            replicas: 3,
            shards: 2,
            profile: FaultProfile::Mixed,
            clients: 3,
            quiet_ticks: 200,
            mutate_wipe_as_new: false,
            exceed_f: false,
            purges: false,
            deletes: false,
            retention: false,
            consumer_groups: false,
            stream_purges: false,
            stream_deletes: false,
            size_retention: false,
        }
    }

    /// Checks the options describe a cluster the simulator runs.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if ![1, 3, 5].contains(&self.replicas) {
            return Err(OptionsError::Replicas(self.replicas));
        }
        if !(1..=8).contains(&self.shards) {
            return Err(OptionsError::Shards(self.shards));
        }
        if !(1..=16).contains(&self.clients) {
            return Err(OptionsError::Clients(self.clients));
        }
        Ok(())
    }
}

/// Options the simulator refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// Not 1, 3 or 5 replicas.
    Replicas(u8),
    /// Not 1 to 8 shards.
    Shards(u16),
    /// Not 1 to 16 clients.
    Clients(u8),
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Replicas(n) => write!(f, "{n} replicas: the simulator runs 1, 3 or 5"),
            Self::Shards(n) => write!(f, "{n} shards: the simulator runs 1 to 8 per replica"),
            Self::Clients(n) => write!(f, "{n} clients: the simulator runs 1 to 16"),
        }
    }
}

impl std::error::Error for OptionsError {}

/// What a clean run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The options it ran with.
    pub options: Options,
    /// Produces acknowledged (`Answer::Committed`).
    pub produces_acknowledged: u64,
    /// Acknowledged produces whose answer named their base offset (each
    /// checked to be served at exactly those offsets).
    pub produces_confirmed: u64,
    /// Produces whose outcome stayed unknown.
    pub produces_unknown: u64,
    /// Consumer-offset stores acknowledged.
    pub stores_acknowledged: u64,
    /// Consumer-offset deletes acknowledged.
    pub deletes_acknowledged: u64,
    /// Topic purges seen applied, per partition group.
    pub purges: u64,
    /// Topics deleted (by a topic delete or with their stream).
    pub topic_deletes: u32,
    /// Streams deleted.
    pub stream_deletes: u32,
    /// Messages retention had removed from the front of the expiring
    /// topics' logs by the end (on every replica).
    pub expired: u64,
    /// Consumer-group creates, joins, leaves and session ends committed.
    pub membership_ops: u64,
    /// Polls answered.
    pub polls: u64,
    /// Calls and metadata ops sent (retries included).
    pub calls: u64,
    /// Topics created.
    pub topics: u32,
    /// Partition groups at the end.
    pub groups: usize,
    /// Messages in all groups' logs at the end.
    pub messages: u64,
    /// Fault counters.
    pub faults: FaultCounts,
    /// State transfers installed.
    pub transfers: u64,
    /// Group 0 snapshots installed by transfer.
    pub metadata_transfers: u64,
    /// Batches read back from segments to serve a peer's repair.
    pub read_backs: u64,
    /// Whether the disks were slow (every sync suspends once).
    pub slow_disks: bool,
    /// How often the executor switched between a step's shard tasks while
    /// one was suspended (shards interleaving at their syncs).
    pub task_switches: u64,
    /// A run marked to exceed f whose groups did not converge after
    /// healing (only safety was checked to the end).
    pub stalled: bool,
    /// Superblock records the shards' tables wrote, and their batches.
    pub superblock: (u64, u64),
    /// Frames sent and dropped by the network.
    pub frames: (u64, u64),
    /// Ticks run in all (faults, quiet period and convergence).
    pub ticks_run: u64,
    /// xxh3 over every delivered frame, call, answer and fault.
    pub schedule_hash: u64,
    /// xxh3 over every replica's segment files at the end.
    pub state_hash: u64,
}

/// Fault counters of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Replica crashes.
    pub crashes: u64,
    /// Replica restarts.
    pub restarts: u64,
    /// Disk faults armed.
    pub disk_faults: u64,
    /// Isolations, splits and one-way cuts.
    pub partitions: u64,
    /// Links given a harsh fault mix for a while.
    pub degraded_links: u64,
    /// Bits flipped in sealed segments.
    pub rotted_bits: u64,
    /// Disks replaced by empty ones.
    pub wipes: u64,
    /// Crashes of a replica still rejoining after its disk was replaced.
    pub rejoin_crashes: u64,
    /// Later boots (without the rejoin flag) of replicas whose disk was
    /// replaced.
    pub wiped_reboots: u64,
    /// Whole-cluster crashes.
    pub blackouts: u64,
    /// Whole-cluster crashes after which f replicas stayed down until the
    /// heal (`outage`).
    pub outages: u64,
    /// Writes acknowledged while such a minority was down.
    pub outage_acks: u64,
    /// Crashes and disk faults past f (runs marked to exceed f).
    pub beyond_f: u64,
}

impl From<FaultStats> for FaultCounts {
    fn from(s: FaultStats) -> Self {
        Self {
            crashes: s.crashes,
            restarts: s.restarts,
            disk_faults: s.disk_faults,
            partitions: s.partitions,
            degraded_links: s.degraded_links,
            rotted_bits: s.rotted_bits,
            wipes: s.wipes,
            rejoin_crashes: s.rejoin_crashes,
            wiped_reboots: s.wiped_reboots,
            blackouts: s.blackouts,
            outages: s.outages,
            outage_acks: s.outage_acks,
            beyond_f: s.beyond_f,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        write!(
            f,
            "seed={} profile={} replicas={} shards={} ticks={} ok: acked={} (produces={} confirmed={} offsets={} deletes={}) purges={} topic_deletes={} stream_deletes={} expired={} memberships={} unknown={} polls={} messages={} groups={} crashes={} restarts={} disk_faults={} partitions={} degraded_links={} rotted_bits={} wipes={} rejoin_crashes={} wiped_reboots={} blackouts={} outages={} outage_acks={} transfers={} metadata_transfers={} read_backs={} slow_disks={} task_switches={} beyond_f={} stalled={} superblock={}/{}batches frames={}/{}dropped schedule={:016x} state={:016x}",
            o.seed,
            o.profile,
            o.replicas,
            o.shards,
            self.ticks_run,
            self.produces_acknowledged + self.stores_acknowledged + self.deletes_acknowledged,
            self.produces_acknowledged,
            self.produces_confirmed,
            self.stores_acknowledged,
            self.deletes_acknowledged,
            self.purges,
            self.topic_deletes,
            self.stream_deletes,
            self.expired,
            self.membership_ops,
            self.produces_unknown,
            self.polls,
            self.messages,
            self.groups,
            self.faults.crashes,
            self.faults.restarts,
            self.faults.disk_faults,
            self.faults.partitions,
            self.faults.degraded_links,
            self.faults.rotted_bits,
            self.faults.wipes,
            self.faults.rejoin_crashes,
            self.faults.wiped_reboots,
            self.faults.blackouts,
            self.faults.outages,
            self.faults.outage_acks,
            self.transfers,
            self.metadata_transfers,
            self.read_backs,
            u8::from(self.slow_disks),
            self.task_switches,
            self.faults.beyond_f,
            u8::from(self.stalled),
            self.superblock.0,
            self.superblock.1,
            self.frames.0,
            self.frames.1,
            self.schedule_hash,
            self.state_hash,
        )
    }
}

/// A run that found a violated property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The options, to replay.
    pub options: Options,
    /// The tick it was found at.
    pub tick: u64,
    /// What failed.
    pub violation: Violation,
    /// The last events before it, oldest first.
    pub recent: Vec<String>,
    /// The schedule hash up to the failure.
    pub schedule_hash: u64,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "seed={} profile={} replicas={} shards={} FAILED at tick {}: {}",
            o.seed, o.profile, o.replicas, o.shards, self.tick, self.violation
        )?;
        writeln!(
            f,
            "replay: replog-sim --seed {} --ticks {} --replicas {} --shards {} --faults {}{}",
            o.seed,
            o.ticks,
            o.replicas,
            o.shards,
            o.profile,
            [
                (o.mutate_wipe_as_new, " --mutate-wipe-as-new"),
                (o.exceed_f, " --exceed-f"),
                (o.purges, " --purges"),
                (o.deletes, " --deletes"),
                (o.retention, " --retention"),
                (o.consumer_groups, " --consumer-groups"),
                (o.stream_purges, " --stream-purges"),
                (o.stream_deletes, " --stream-deletes"),
                (o.size_retention, " --size-retention"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, flag)| *flag)
            .collect::<String>()
        )?;
        writeln!(f, "last {} events:", self.recent.len())?;
        for e in &self.recent {
            writeln!(f, "  {e}")?;
        }
        write!(f, "schedule={:016x}", self.schedule_hash)
    }
}

/// Why a run did not end clean.
#[derive(Debug)]
pub enum SimError {
    /// The options are not runnable.
    Options(OptionsError),
    /// A property failed.
    Failed(Box<Failure>),
    /// The cluster could not be driven (a shard did not boot or stalled).
    Cluster(ClusterError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Options(e) => write!(f, "{e}"),
            Self::Failed(failure) => write!(f, "{failure}"),
            Self::Cluster(e) => write!(f, "the cluster could not be driven: {e}"),
        }
    }
}

impl std::error::Error for SimError {}

impl From<ClusterError> for SimError {
    fn from(e: ClusterError) -> Self {
        Self::Cluster(e)
    }
}

/// Per (replica, group) view and commit seen in the current boot, to
/// check neither goes backwards.
#[derive(Default)]
struct Monitor {
    seen: BTreeMap<(u8, GroupId), (u32, u64, u64)>,
    /// Each (replica, group)'s last (view, status), to trace changes.
    roles: BTreeMap<(u8, GroupId), (u32, Status)>,
}

impl Monitor {
    fn check(&mut self, cluster: &Cluster, trace: &mut Trace) -> Result<(), Violation> {
        let tick = cluster.tick();
        for r in 0..cluster.replica_count {
            let boot = cluster.boot_count(r);
            for s in 0..cluster.shard_count {
                let Some(shard) = cluster.shard_at(r, s) else {
                    continue;
                };
                let meta = (s == 0).then_some(METADATA_GROUP);
                for group in meta.into_iter().chain(shard.groups()) {
                    let Some(v) = cluster.replica_of(r, group) else {
                        continue;
                    };
                    let role = (v.view(), v.status());
                    if self.roles.insert((r, group), role) != Some(role) {
                        trace.record(Event::State {
                            tick,
                            what: format!(
                                "replica {r} group {}: view {} {:?} op {} commit {}/{}",
                                group.0,
                                role.0,
                                role.1,
                                v.op().0,
                                v.commit_min().0,
                                v.commit_max().0
                            ),
                        });
                    }
                    // The metadata group's own state checks run inside
                    // its host (and panic); its core and every partition
                    // are checked here.
                    let checked = match shard.partition(group) {
                        Some(p) => p.invariants(),
                        None => v.invariants(),
                    };
                    if let Err(broken) = checked {
                        return Err(Violation::new(
                            Property::Invariant,
                            format!("replica {r} group {}: {broken}", group.0),
                        ));
                    }
                    let now = (v.view(), v.commit_min().0, boot);
                    if let Some(&(view, commit, b)) = self.seen.get(&(r, group))
                        && b == boot
                        && (now.0 < view || now.1 < commit)
                    {
                        return Err(Violation::new(
                            Property::Regressed,
                            format!(
                                "replica {r} group {}: view {view} commit {commit} went to view {} commit {} within one boot",
                                group.0, now.0, now.1
                            ),
                        ));
                    }
                    self.seen.insert((r, group), now);
                }
            }
        }
        Ok(())
    }
}

struct Run {
    options: Options,
    cluster: Cluster,
    trace: Trace,
    faults: FaultPlan,
    workload: Workload,
    oracle: Oracle,
    monitor: Monitor,
    order_prng: Prng,
    ticks_run: u64,
    /// A run past f whose groups did not converge after healing.
    stalled: bool,
    /// Produces acknowledged as of the last step (for `outage_acks`).
    acked_seen: u64,
    /// Messages retention removed everywhere, counted by the final checks.
    expired: u64,
}

enum Stop {
    Violation(Violation),
    Cluster(ClusterError),
}

impl From<Violation> for Stop {
    fn from(v: Violation) -> Self {
        Self::Violation(v)
    }
}

impl From<ClusterError> for Stop {
    fn from(e: ClusterError) -> Self {
        Self::Cluster(e)
    }
}

impl From<StepError> for Stop {
    fn from(e: StepError) -> Self {
        match e {
            StepError::Violation(v) => Self::Violation(v),
            StepError::Cluster(c) => Self::Cluster(c),
        }
    }
}

impl Run {
    /// One tick: faults, frames, shard ticks, clients, checks, time.
    fn step(&mut self, inject: bool, issue_new: bool) -> Result<(), Stop> {
        if inject {
            self.faults.step(&mut self.cluster, &mut self.trace)?;
        }
        self.cluster.deliver(&mut self.trace)?;
        // Replicas run concurrently in a real cluster: tick them in a
        // seeded order so no replica is always first.
        let mut order: Vec<(u8, u16)> = (0..self.cluster.replica_count)
            .flat_map(|r| (0..self.cluster.shard_count).map(move |s| (r, s)))
            .collect();
        for i in (1..order.len()).rev() {
            let j = self.order_prng.below_inclusive(i as u64) as usize;
            order.swap(i, j);
        }
        self.cluster.tick_shards(&order)?;
        self.workload.step(
            &mut self.cluster,
            &mut self.oracle,
            &mut self.trace,
            issue_new,
        )?;
        let acked = self.oracle.count(Fate::Acknowledged);
        if self.faults.outage_active() {
            self.faults.stats.outage_acks += acked.saturating_sub(self.acked_seen);
        }
        self.acked_seen = acked;
        self.monitor.check(&self.cluster, &mut self.trace)?;
        self.cluster.clock.advance(TICK);
        self.ticks_run += 1;
        Ok(())
    }

    fn phases(&mut self) -> Result<(), Stop> {
        for _ in 0..self.options.ticks {
            self.step(true, true)?;
        }
        self.faults.heal_all(&mut self.cluster, &mut self.trace)?;
        for _ in 0..self.options.quiet_ticks {
            self.step(false, false)?;
        }
        let mut waited = 0;
        loop {
            match self.converged() {
                Ok(()) if self.workload.idle() => break,
                Ok(()) => {}
                // Past f only safety is promised: what was checked as the
                // run went stands, the final comparison needs convergence.
                Err(v) if waited >= CONVERGE_TICKS_MAX && self.options.exceed_f => {
                    tracing::warn!(seed = self.options.seed, violation = %v, "past f: stalled after healing; only safety was checked");
                    self.stalled = true;
                    return Ok(());
                }
                Err(v) if waited >= CONVERGE_TICKS_MAX => return Err(Stop::Violation(v)),
                Err(_) => {}
            }
            if waited >= CONVERGE_TICKS_MAX && self.options.exceed_f {
                self.stalled = true;
                return Ok(());
            }
            if waited >= CONVERGE_TICKS_MAX {
                return Err(Stop::Violation(Violation::new(
                    Property::NotConverged,
                    "client requests still unanswered after healing",
                )));
            }
            for _ in 0..CONVERGE_CHECK_EVERY_TICKS {
                self.step(false, false)?;
            }
            waited += CONVERGE_CHECK_EVERY_TICKS;
        }
        self.final_checks()?;
        Ok(())
    }

    /// Every replica is up, names the same groups, and holds each group
    /// at one commit with nothing pending.
    fn converged(&self) -> Result<(), Violation> {
        let reference = self.metadata_groups_agree()?;
        self.metadata_group_settled()?;
        self.no_unnamed_groups(&reference)?;
        for &group in &reference {
            let mut state = None;
            for r in 0..self.cluster.replica_count {
                let here = self.group_settled_on(r, group)?;
                match state {
                    None => state = Some(here),
                    Some(s) if s != here => {
                        return Err(not_converged(format!(
                            "group {}: replica {r} at (commit, frontier) {here:?}, another at {s:?}; {}",
                            group.0,
                            self.describe_group(group)
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// The groups replica 0's metadata names, once every replica is up
    /// and names the same ones, at least as many as the clients created.
    fn metadata_groups_agree(&self) -> Result<Vec<GroupId>, Violation> {
        let c = &self.cluster;
        let reference = c
            .metadata_groups(0)
            .ok_or_else(|| not_converged("replica 0 is down".into()))?;
        if reference.len() < self.workload.groups().len() {
            return Err(not_converged(format!(
                "replica 0 names {} groups, clients created {}",
                reference.len(),
                self.workload.groups().len()
            )));
        }
        for r in 0..c.replica_count {
            let groups = c
                .metadata_groups(r)
                .ok_or_else(|| not_converged(format!("replica {r} is down")))?;
            if groups != reference {
                return Err(not_converged(format!(
                    "replica {r}'s metadata names {} groups, replica 0's {}",
                    groups.len(),
                    reference.len()
                )));
            }
        }
        Ok(reference)
    }

    /// Group 0 is normal on every replica, applied all it committed and
    /// prepared nothing past it, at the same commit everywhere.
    fn metadata_group_settled(&self) -> Result<(), Violation> {
        let c = &self.cluster;
        let mut meta = None;
        for r in 0..c.replica_count {
            let v = c
                .replica_of(r, METADATA_GROUP)
                .ok_or_else(|| not_converged(format!("replica {r} hosts no group 0")))?;
            let here = (v.status(), v.commit_min().0, v.commit_max().0);
            if here.0 != Status::Normal
                || here.1 != here.2
                || v.op().0 != here.1
                || meta.is_some_and(|m| m != here)
            {
                return Err(not_converged(format!(
                    "group 0 on replica {r}: {:?} view {} applied {} of {} (another replica: {meta:?})",
                    here.0,
                    v.view(),
                    here.1,
                    here.2
                )));
            }
            meta = Some(here);
        }
        Ok(())
    }

    /// No replica holds a group the metadata no longer names (a delete
    /// carried out everywhere, never undone by a restart).
    fn no_unnamed_groups(&self, reference: &[GroupId]) -> Result<(), Violation> {
        let c = &self.cluster;
        for r in 0..c.replica_count {
            for s in 0..c.shard_count {
                if let Some(extra) = c
                    .shard_at(r, s)
                    .and_then(|shard| shard.groups().find(|g| !reference.contains(g)))
                {
                    return Err(not_converged(format!(
                        "replica {r} shard {s} holds group {}, which the metadata does not name",
                        extra.0
                    )));
                }
            }
        }
        Ok(())
    }

    /// `group` on replica `r` is unfenced, serving, has applied all it
    /// committed with nothing prepared past it, and has applied every
    /// purge group 0 committed: its (commit, frontier) then, for the
    /// replicas to agree on.
    fn group_settled_on(&self, r: u8, group: GroupId) -> Result<(u64, u64), Violation> {
        let c = &self.cluster;
        let p = c
            .shard(r, group)
            .and_then(|s| s.partition(group))
            .ok_or_else(|| not_converged(format!("group {} missing on replica {r}", group.0)))?;
        if let Some(reason) = p.fenced() {
            return Err(not_converged(format!(
                "group {} fenced on replica {r}: {reason}",
                group.0
            )));
        }
        let v = p.replica();
        // Serving again: an idle group stuck waiting (a census that
        // cannot complete) holds nothing anywhere and would
        // otherwise pass every check below.
        if v.status() != Status::Normal || !v.is_quorum_visible() {
            return Err(not_converged(format!(
                "group {} on replica {r}: {:?}{}; {}",
                group.0,
                v.status(),
                if v.is_quorum_visible() {
                    ""
                } else {
                    ", out of every quorum"
                },
                self.describe_group(group)
            )));
        }
        // Nothing prepared past the commit either: a primary that
        // installed a transfer re-proposes its view's uncommitted
        // ops, and the checks below would otherwise run before an
        // acknowledged one is committed again (mixed 23004981).
        if v.commit_min() != v.commit_max()
            || v.op() != v.commit_min()
            || p.state_transfer_needed().is_some()
        {
            return Err(not_converged(format!(
                "group {} on replica {r}: applied {} of {} committed{}; {}",
                group.0,
                v.commit_min().0,
                v.commit_max().0,
                if p.state_transfer_needed().is_some() {
                    ", transfer needed"
                } else {
                    ""
                },
                self.describe_group(group)
            )));
        }
        // Every purge group 0 committed is applied, on every replica.
        let committed = c.metadata_purge_generation(r, group).unwrap_or(0);
        if p.purge_generation() < committed {
            return Err(not_converged(format!(
                "group {} on replica {r}: purge generation {} applied, {committed} committed by group 0; {}",
                group.0,
                p.purge_generation(),
                self.describe_group(group)
            )));
        }
        Ok((v.commit_min().0, p.offset_frontier().0))
    }

    /// Each replica's view of `group`, for a failure report.
    fn describe_group(&self, group: GroupId) -> String {
        (0..self.cluster.replica_count)
            .map(|r| {
                match self
                    .cluster
                    .shard(r, group)
                    .and_then(|s| s.partition(group))
                {
                    Some(p) => {
                        let v = p.replica();
                        format!(
                            "replica {r}: view {} status {:?}{} op {} commit {}/{} frontier {}{}{}",
                            v.view(),
                            v.status(),
                            if v.is_quorum_visible() {
                                ""
                            } else {
                                " (out of quorum)"
                            },
                            v.op().0,
                            v.commit_min().0,
                            v.commit_max().0,
                            p.offset_frontier().0,
                            if p.state_transfer_needed().is_some() {
                                " transfer-needed"
                            } else {
                                ""
                            },
                            if p.missing_history().is_some() {
                                " missing-history"
                            } else {
                                ""
                            },
                        )
                    }
                    None => format!("replica {r}: absent"),
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The oracle over every converged log, and byte equality of every
    /// replica's messages, segment files and consumer offsets.
    fn final_checks(&mut self) -> Result<(), Stop> {
        self.cluster.flush_all()?;
        let groups = self.cluster.metadata_groups(0).unwrap_or_default();
        self.metadata_states_agree()?;
        let now_us = u64::try_from(self.cluster.clock.now().as_micros()).unwrap_or(u64::MAX);
        let tick_us = u64::try_from(TICK.as_micros()).unwrap_or(1).max(1);
        for &group in &groups {
            let (expired_before, share) = self.retention_of(group, now_us, tick_us);
            let held = self.final_logs(group, expired_before, share)?;
            let from_offset = if expired_before.is_some() {
                common_start(&held)
            } else {
                0
            };
            self.expired += held.iter().map(|(_, _, start)| *start).min().unwrap_or(0);
            logs_agree(group, held, from_offset)?;
            self.consumer_offsets_agree(group)?;
            self.durable_offsets_agree(group)?;
        }
        Ok(())
    }

    /// Group 0 applied the same op everywhere (convergence): the whole
    /// metadata state must be equal too, however each replica got there
    /// (its own log, a snapshot transfer, a reboot from a snapshot), and
    /// its memberships those the committed ops left.
    fn metadata_states_agree(&self) -> Result<(), Violation> {
        let reference = self.cluster.metadata_state(0);
        if let Some(state) = &reference {
            self.workload.check_membership(state)?;
        }
        for r in 1..self.cluster.replica_count {
            let here = self.cluster.metadata_state(r);
            if here != reference {
                return Err(diverged(format!(
                    "metadata state of replica {r} differs from replica 0's: {}",
                    describe_state_difference(reference.as_ref(), here.as_ref())
                )));
            }
        }
        Ok(())
    }

    /// How far retention may have cut `group`'s log on each replica: the
    /// tick before which expiry may have removed messages (`Some(u64::MAX)`
    /// under a size ceiling, where any prefix may be gone), and the size
    /// share (0 without a ceiling).
    fn retention_of(&self, group: GroupId, now_us: u64, tick_us: u64) -> (Option<u64>, u64) {
        // A topic that expires messages: each replica's retention runs
        // on its own ticks, so each may have removed a different
        // prefix; they must agree from the latest start on.
        let expired_before = self
            .cluster
            .metadata_message_expiry_us(0, group)
            .filter(|&expiry| expiry > 0)
            // Retention removes a segment once its newest stamp plus
            // the expiry is at most the time, and a batch is stamped
            // no earlier than the tick it was sent.
            .map(|expiry| now_us.saturating_sub(expiry) / tick_us + 1);
        // A topic with a size ceiling: any prefix may be gone, by
        // each replica's own passes.
        let share = self
            .cluster
            .metadata_retained_bytes_max(0, group)
            .unwrap_or(0);
        let expired_before = if share > 0 {
            Some(u64::MAX)
        } else {
            expired_before
        };
        (expired_before, share)
    }

    /// Each replica's messages of `group` (which the oracle checks), its
    /// committed segment files (within the size share, if any) and where
    /// its log starts.
    fn final_logs(
        &mut self,
        group: GroupId,
        expired_before: Option<u64>,
        share: u64,
    ) -> Result<Vec<(Messages, SegmentFiles, u64)>, Violation> {
        let mut held = Vec::new();
        for r in 0..self.cluster.replica_count {
            let messages = self
                .cluster
                .read_all(r, group)
                .map_err(|e| diverged(format!("group {} on replica {r} unreadable: {e}", group.0)))?
                .unwrap_or_default();
            self.oracle.final_log(group, &messages, expired_before)?;
            let files = committed_files(self.cluster.segment_files(r, group))
                .map_err(|e| diverged(format!("group {} on replica {r}: {e}", group.0)))?;
            if share > 0 {
                kept_within_share(group, r, &files, share)?;
            }
            // Where this replica's log starts: its first message, or
            // when retention removed every sealed segment and the
            // active one is empty, the log's end.
            let start = match messages.first() {
                Some((offset, _)) => *offset,
                None => self
                    .cluster
                    .shard(r, group)
                    .and_then(|s| s.partition(group))
                    .map_or(0, |p| p.log().next_offset()),
            };
            held.push((messages, files, start));
        }
        Ok(held)
    }

    /// Every replica stores the same offset for each consumer of `group`
    /// the oracle knows, one the oracle allows.
    fn consumer_offsets_agree(&mut self, group: GroupId) -> Result<(), Violation> {
        for consumer in self.oracle.consumers(group) {
            let mut first: Option<Option<u64>> = None;
            for r in 0..self.cluster.replica_count {
                let got = self
                    .cluster
                    .shard(r, group)
                    .and_then(|s| s.partition(group))
                    .and_then(|p| p.stored_offset(consumer.kind, consumer.id));
                self.oracle.offset_read(group, consumer, got.map(|v| v.0))?;
                match first {
                    None => first = Some(got.map(|v| v.0)),
                    Some(f) if f != got.map(|v| v.0) => {
                        return Err(diverged(format!(
                            "group {} {consumer}: replica {r} stores {got:?}, replica 0 {f:?}",
                            group.0
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Every replica commits the same consumer offsets of `group`: every
    /// committed record, not only those a client wrote, so a record nobody
    /// asked for (a store applied by an op the group lost) diverges here.
    fn durable_offsets_agree(&self, group: GroupId) -> Result<(), Violation> {
        let mut first = None;
        for r in 0..self.cluster.replica_count {
            let held = self
                .cluster
                .shard(r, group)
                .and_then(|s| s.partition(group))
                .map(|p| p.durable_offsets().clone());
            match &first {
                None => first = Some(held),
                Some(f) if *f != held => {
                    return Err(diverged(format!(
                        "group {}: replica {r} commits consumer offsets {held:?}, replica 0 {f:?}",
                        group.0
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn state_hash(&self) -> (u64, u64) {
        let mut h = Xxh3::new();
        let mut messages = 0;
        let groups = self.cluster.metadata_groups(0).unwrap_or_default();
        for r in 0..self.cluster.replica_count {
            for &group in &groups {
                h.update(&group.0.to_le_bytes());
                for (name, bytes) in self.cluster.segment_files(r, group) {
                    h.update(name.as_bytes());
                    h.update(&(bytes.len() as u64).to_le_bytes());
                    h.update(&bytes);
                }
                if r == 0 {
                    messages += self
                        .cluster
                        .shard(0, group)
                        .and_then(|s| s.partition(group))
                        .map_or(0, |p| p.offset_frontier().0);
                }
            }
        }
        (h.digest(), messages)
    }
}

/// A replica's segment files of one group: `(name, bytes)`.
type SegmentFiles = Vec<(String, Vec<u8>)>;

/// A convergence check that failed, with what it found.
fn not_converged(detail: String) -> Violation {
    Violation::new(Property::NotConverged, detail)
}

/// A comparison of replicas that found them different.
fn diverged(detail: String) -> Violation {
    Violation::new(Property::ReplicasDiverge, detail)
}

/// Every replica holds the same messages and segment files of `group`
/// from `from_offset` on.
fn logs_agree(
    group: GroupId,
    held: Vec<(Messages, SegmentFiles, u64)>,
    from_offset: u64,
) -> Result<(), Violation> {
    let mut reference: Option<Vec<(u64, Vec<u8>)>> = None;
    let mut files_reference: Option<Vec<(String, Vec<u8>)>> = None;
    for (r, (mut messages, mut files, _)) in held.into_iter().enumerate() {
        messages.retain(|(offset, _)| *offset >= from_offset);
        files.retain(|(name, _)| file_base(name).is_some_and(|b| b >= from_offset));
        match &reference {
            None => reference = Some(messages),
            Some(m) if *m != messages => {
                return Err(diverged(format!(
                    "group {}: replica {r} holds {} messages from offset {from_offset}, replica 0 {}",
                    group.0,
                    messages.len(),
                    m.len()
                )));
            }
            Some(_) => {}
        }
        match &files_reference {
            None => files_reference = Some(files),
            Some(f) if *f != files => {
                let names = |v: &[(String, Vec<u8>)]| {
                    v.iter()
                        .map(|(n, b)| format!("{n}:{}", b.len()))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                return Err(diverged(format!(
                    "group {}: segment files differ: replica {r} [{}] vs replica 0 [{}]",
                    group.0,
                    names(&files),
                    names(f)
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The first field in which two metadata states differ, for a report.
fn describe_state_difference(
    a: Option<&metadata::MetadataState>,
    b: Option<&metadata::MetadataState>,
) -> String {
    let (a, b) = (format!("{a:?}"), format!("{b:?}"));
    let at = a
        .bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let from = at.saturating_sub(120);
    let window = |s: &str| {
        s.get(from..(at + 120).min(s.len()))
            .unwrap_or("")
            .to_owned()
    };
    format!("replica 0 …{}… vs …{}…", window(&a), window(&b))
}

/// Retention by size removes the oldest sealed segments only while the
/// sealed ones exceed the group's share, so once it removed any, what it
/// kept sealed plus the last one it removed (at most a segment and a
/// batch) exceeds the share. Segments only grow after that (a boot may
/// drop an empty active segment and write to the last sealed one again),
/// so every log byte held counts: anything less removed too much.
fn kept_within_share(
    group: GroupId,
    r: u8,
    files: &[(String, Vec<u8>)],
    share: u64,
) -> Result<(), Violation> {
    let logs: Vec<(u64, u64)> = files
        .iter()
        .filter(|(name, _)| name.ends_with(".log"))
        .filter_map(|(name, bytes)| Some((file_base(name)?, bytes.len() as u64)))
        .collect();
    let Some(&(start, _)) = logs.first() else {
        return Ok(());
    };
    let held: u64 = logs.iter().map(|(_, len)| len).sum();
    let removed_any = start > 0;
    if removed_any && held + TOPIC_SEGMENT_SIZE_BYTES + BATCH_BYTES_MAX <= share {
        return Err(Violation::new(
            Property::RemovedBeforeExpiry,
            format!(
                "group {}: replica {r} holds {held} log bytes from offset {start}, far below its share of {share}: retention by size removed more than it had to",
                group.0
            ),
        ));
    }
    Ok(())
}

/// Where replicas whose retention removed different prefixes must agree
/// from: the latest start among them. Retention removes whole segments and
/// every replica cuts segments at the same offsets, so that start is a
/// segment base on every replica: messages and segment files compare from
/// it.
fn common_start(held: &[(Messages, SegmentFiles, u64)]) -> u64 {
    held.iter().map(|(_, _, start)| *start).max().unwrap_or(0)
}

/// The base offset a segment file is named by (`{base:020}.log`).
fn file_base(name: &str) -> Option<u64> {
    name.split_once('.')?.0.parse().ok()
}

/// The segment files that hold committed bytes. A replica may have opened
/// the next (empty) active segment at the frontier while another opens it
/// with the next append — a state-transfer install plants it at once, a
/// running partition rotates lazily — so an empty trailing pair holds
/// nothing to compare; an empty file anywhere else is a hole.
fn committed_files(mut files: Vec<(String, Vec<u8>)>) -> Result<Vec<(String, Vec<u8>)>, String> {
    let last_stem = files
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(".log"))
        .max()
        .map(str::to_owned);
    let mut bad = None;
    files.retain(|(name, bytes)| {
        if !bytes.is_empty() {
            return true;
        }
        let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
        if last_stem.as_deref() != Some(stem) {
            bad = Some(name.clone());
        }
        false
    });
    match bad {
        Some(name) => Err(format!("{name} is empty and not the last segment")),
        None => Ok(files),
    }
}

/// Runs the simulation `options` describe.
///
/// # Errors
/// [`SimError::Failed`] with the violated property, the seed and the last
/// events; [`SimError::Options`] or [`SimError::Cluster`] when the run
/// could not be carried out at all.
pub fn run(options: &Options) -> Result<Summary, SimError> {
    options.validate().map_err(SimError::Options)?;
    let seed = options.seed;
    let mut run = Run::new(options)?;
    tracing::info!(seed, profile = %options.profile, replicas = options.replicas, shards = options.shards, ticks = options.ticks, "simulation starts");
    match run.phases_catching_panics() {
        Ok(()) => {}
        Err(Stop::Cluster(e)) => return Err(SimError::Cluster(e)),
        Err(Stop::Violation(violation)) => {
            return Err(SimError::Failed(Box::new(run.failure(violation))));
        }
    }
    let summary = run.summary();
    tracing::info!(seed, events = run.trace.events(), "simulation clean");
    Ok(summary)
}

impl Run {
    /// A run at tick 0: the cluster, the fault plan, the workload and the
    /// checks `options` ask for, each seeded from the run's seed.
    fn new(options: &Options) -> Result<Self, SimError> {
        let seed = options.seed;
        let faults = FaultPlan::new(
            seed,
            options.profile,
            options.replicas,
            options.mutate_wipe_as_new,
            options.exceed_f,
        );
        let cluster = Cluster::new(seed, options.replicas, options.shards, faults.base_faults())?;
        Ok(Self {
            options: options.clone(),
            cluster,
            trace: Trace::new(seed),
            faults,
            workload: Workload::new(
                seed,
                options.clients,
                options.replicas,
                options.profile.persisted_only() || options.exceed_f,
                Mix {
                    purges: options.purges,
                    deletes: options.deletes,
                    retention: options.retention,
                    consumer_groups: options.consumer_groups,
                    stream_purges: options.stream_purges,
                    stream_deletes: options.stream_deletes,
                    size_retention: options.size_retention,
                },
            ),
            oracle: Oracle::default(),
            monitor: Monitor::default(),
            order_prng: Prng::new(seed ^ 0x0DE7_0003),
            ticks_run: 0,
            stalled: false,
            acked_seen: 0,
            expired: 0,
        })
    }

    /// The run's phases, with a panic turned into a violation.
    ///
    /// A panic in shard, partition or consensus code (an assertion on its
    /// own invariants) is a finding like any other: report it with the
    /// seed and the trace instead of losing them. The run is abandoned, so
    /// whatever the panic left half-done is never touched again.
    fn phases_catching_panics(&mut self) -> Result<(), Stop> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.phases())).unwrap_or_else(
            |payload| {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                Err(Stop::Violation(Violation::new(Property::Panicked, message)))
            },
        )
    }

    /// The failure report of a run that broke `violation`, which the trace
    /// records as its last event.
    fn failure(&mut self, violation: Violation) -> Failure {
        let seed = self.options.seed;
        let tick = self.cluster.tick();
        self.trace.record(Event::Fault {
            tick,
            what: format!("violation: {violation}"),
        });
        tracing::error!(seed, %violation, tick, "simulation failed");
        Failure {
            options: self.options.clone(),
            tick,
            violation,
            recent: self.trace.recent(),
            schedule_hash: self.trace.hash(),
        }
    }

    /// The summary of a clean run: its counters and the hashes of its
    /// schedule and final state.
    fn summary(&self) -> Summary {
        let (state_hash, messages) = self.state_hash();
        let stats: WorkloadStats = self.workload.stats;
        Summary {
            options: self.options.clone(),
            produces_acknowledged: self.oracle.count(Fate::Acknowledged),
            produces_confirmed: self.oracle.confirmed(),
            produces_unknown: self.oracle.count(Fate::Unknown),
            stores_acknowledged: stats.stores_acknowledged,
            deletes_acknowledged: stats.deletes_acknowledged,
            purges: stats.purges,
            topic_deletes: stats.topic_deletes,
            stream_deletes: stats.stream_deletes,
            polls: stats.polls,
            calls: stats.calls,
            topics: stats.topics,
            groups: self.cluster.metadata_groups(0).map_or(0, |g| g.len()),
            messages,
            faults: self.faults.stats.into(),
            transfers: self.cluster.installs(),
            metadata_transfers: self.cluster.metadata_installs(),
            read_backs: self.cluster.read_backs(),
            slow_disks: self.cluster.slow_disks(),
            task_switches: self.cluster.task_switches(),
            stalled: self.stalled,
            expired: self.expired,
            membership_ops: stats.membership_ops,
            superblock: self.cluster.superblock_writes(),
            frames: self.cluster.net.counts(),
            ticks_run: self.ticks_run,
            schedule_hash: self.trace.hash(),
            state_hash,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(name: &str, len: usize) -> (String, Vec<u8>) {
        (name.to_owned(), vec![7; len])
    }

    #[test]
    fn given_empty_trailing_segment_when_compared_should_leave_it_out() {
        let files = vec![
            file("00000000000000000000.index", 24),
            file("00000000000000000000.log", 100),
            file("00000000000000000009.index", 0),
            file("00000000000000000009.log", 0),
        ];
        let kept = committed_files(files).unwrap();
        assert_eq!(kept.len(), 2);
        assert!(
            kept.iter()
                .all(|(n, _)| n.starts_with("00000000000000000000"))
        );
    }

    #[test]
    fn given_empty_segment_before_the_last_when_compared_should_refuse() {
        let files = vec![
            file("00000000000000000000.index", 0),
            file("00000000000000000000.log", 0),
            file("00000000000000000009.index", 24),
            file("00000000000000000009.log", 100),
        ];
        let err = committed_files(files).unwrap_err();
        assert!(err.contains("00000000000000000000"), "{err}");
    }
}
