//! The simulated cluster: R replicas, each S real shards over `TestEnv`
//! with one `SimFs` disk, on one virtual clock and one `TestNet`.
//!
//! The driver owns every shard by value. A crashed replica's shards are
//! dropped (their in-flight calls' reply handles with them, so callers see
//! the call cancelled) and its disk crashes; a restart boots fresh shards
//! from that disk, wires their sibling inboxes and reconciles the
//! partition groups with the committed metadata, as the server does.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::simnet::NetworkFaults;
use common::{ConsumerKind, GroupId, METADATA_GROUP, ReplicaId};
use consensus::vsr::TimeoutConfig;
use futures::channel::{mpsc, oneshot};
use metadata::{MetadataOp, Outcome};
use partitions::RETAINED_BYTES_MAX_DEFAULT;
use partitions::state_transfer::INSTALL_FILE_OPS_PER_STEP;
use partitions::{PollRequest, PollingStrategy};
use shard::testing::{TestClock, TestEnv, TestNet};
use shard::{
    Answer, Call, CallError, Envelope, Input, MetaCall, MetaError, Shard, ShardConfig, ShardIndex,
    shard_dir, shard_of,
};
use storage::fs::{CrashMode, FileKind, Fs, SimFs};

use crate::exec::{Executor, Stalled, run_now};
use crate::trace::Trace;

/// The tick period every shard runs with.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// The cluster id every frame carries.
pub(crate) const CLUSTER: u128 = 0x5151_0001;
/// Capacity of each shard's inbox from its siblings.
const INBOX_CAPACITY: usize = 4096;
/// Rounds of sibling-inbox draining per step (an effect can cause more).
const DRAIN_ROUNDS_MAX: usize = 16;

/// Why the cluster could not do what the driver asked.
#[derive(Debug)]
pub enum ClusterError {
    /// A shard did not open from its disk.
    Boot {
        /// The replica.
        replica: u8,
        /// The shard index.
        shard: u16,
        /// The shard's error.
        source: std::io::Error,
    },
    /// A shard's future did not complete.
    Stalled(Stalled),
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Boot {
                replica,
                shard,
                source,
            } => write!(f, "replica {replica} shard {shard} did not open: {source}"),
            Self::Stalled(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for ClusterError {}

impl From<Stalled> for ClusterError {
    fn from(s: Stalled) -> Self {
        Self::Stalled(s)
    }
}

/// One replica: its disk and, while it is up, its shards.
struct Node {
    fs: SimFs,
    /// Its disk was replaced since the last boot: the next boot passes
    /// `ShardConfig::rejoin` (only that one; later boots find the marker).
    rejoin_next_boot: bool,
    /// Not booted since its disk was replaced.
    fresh_disk: bool,
    /// Times its disk was replaced.
    wipes: u64,
    /// Boots so far (a new boot resets the per-boot checks).
    boots: u64,
    /// Machine boots so far: a crash that loses unsynced writes (a power
    /// loss) restarts the machine, a process kill does not. Its shards'
    /// `boot_tag` derives from it, so a `replicated` group's replica log,
    /// kept unsynced, is trusted only by the machine boot that wrote it.
    machine_boots: u32,
    shards: Option<Vec<Shard<TestEnv>>>,
    inboxes: Vec<mpsc::Receiver<Input>>,
}

/// One shard's part of a step, run side by side with the others'.
type StepTask<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Every live shard as `(replica, shard index, shard)`, in that order.
fn live_shards(nodes: &mut [Node]) -> impl Iterator<Item = (u8, u16, &mut Shard<TestEnv>)> {
    nodes.iter_mut().enumerate().flat_map(|(r, node)| {
        node.shards
            .iter_mut()
            .flatten()
            .enumerate()
            .map(move |(s, shard)| (r as u8, s as u16, shard))
    })
}

/// A replica's message log, for the convergence checks.
pub(crate) type Messages = Vec<(u64, Vec<u8>)>;

/// The whole cluster.
pub(crate) struct Cluster {
    pub(crate) replica_count: u8,
    pub(crate) shard_count: u16,
    pub(crate) clock: Rc<TestClock>,
    pub(crate) net: TestNet,
    nodes: Vec<Node>,
    /// Runs each step's shard tasks side by side, choosing by the seed.
    executor: Executor,
    seed: u64,
    boots: u64,
    /// Transfers installed by shards that have since crashed.
    installs_retired: u64,
    /// Group 0 snapshots installed by shards that have since crashed.
    metadata_installs_retired: u64,
    /// Batches read back for repair by shards that have since crashed.
    read_backs_retired: u64,
    /// Superblock records and batches written by shards that have since
    /// crashed.
    superblock_retired: (u64, u64),
}

/// The replicas' data directory on their disks.
fn data_dir() -> PathBuf {
    PathBuf::from("/data")
}

fn read_backs(shard: &Shard<TestEnv>) -> u64 {
    shard
        .snapshot(shard::SnapshotDetail::Totals)
        .totals
        .read_back_bodies
}

fn metadata_installs(shard: &Shard<TestEnv>) -> u64 {
    shard
        .metadata()
        .map_or(0, |m| m.transfer().stats().installs)
}

fn superblock_writes(shards: &[Shard<TestEnv>]) -> (u64, u64) {
    shards.iter().fold((0, 0), |(records, batches), s| {
        let t = s.stats().superblock;
        (records + t.slot_writes, batches + t.batches)
    })
}

/// Half the runs have slow disks ([`Cluster::slow_disks`]): the top bit
/// of the seed, scrambled, so consecutive seeds mix both and the choice is
/// independent of the others made from the seed's low bits.
fn slow_disks(run_seed: u64) -> bool {
    run_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1
}

/// A new disk for replica `r`, holding only the (empty) data directory;
/// slow (every sync and yield suspends once) when `slow`.
fn empty_disk(seed: u64, r: u8, slow: bool) -> Result<SimFs, ClusterError> {
    let fs = SimFs::new(seed);
    fs.set_slow_syncs(slow);
    fs.set_yielding(slow);
    let make = async {
        fs.create_dir_all(&data_dir()).await?;
        fs.sync_dir(Path::new("/")).await
    };
    run_now("creating the data directory", make)?.map_err(|source| ClusterError::Boot {
        replica: r,
        shard: 0,
        source,
    })?;
    Ok(fs)
}

impl Cluster {
    /// Boots a fresh cluster.
    pub(crate) fn new(
        seed: u64,
        replica_count: u8,
        shard_count: u16,
        faults: NetworkFaults,
    ) -> Result<Self, ClusterError> {
        let mut nodes = Vec::new();
        for r in 0..replica_count {
            let fs = empty_disk(
                seed ^ (u64::from(r) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                r,
                slow_disks(seed),
            )?;
            nodes.push(Node {
                fs,
                rejoin_next_boot: false,
                fresh_disk: false,
                wipes: 0,
                boots: 0,
                machine_boots: 0,
                shards: None,
                inboxes: Vec::new(),
            });
        }
        let mut cluster = Self {
            replica_count,
            shard_count,
            clock: TestClock::new(),
            net: TestNet::new(seed ^ 0x0E7_0E7, faults),
            nodes,
            executor: Executor::new(seed ^ 0xE8EC_0000_0000_0001),
            seed,
            boots: 0,
            installs_retired: 0,
            metadata_installs_retired: 0,
            read_backs_retired: 0,
            superblock_retired: (0, 0),
        };
        for r in 0..replica_count {
            cluster.boot(r)?;
        }
        Ok(cluster)
    }

    /// The tick number of the clock.
    pub(crate) fn tick(&self) -> u64 {
        u64::try_from(self.clock.now().as_millis() / TICK.as_millis()).unwrap_or(u64::MAX)
    }

    fn config(&self, r: u8, s: u16) -> ShardConfig {
        let mut config = ShardConfig::new(
            CLUSTER,
            ReplicaId(r),
            self.replica_count,
            ShardIndex(s),
            self.shard_count,
            shard_dir(&data_dir(), ShardIndex(s)),
        );
        config.timeouts = TimeoutConfig::scaled_down(5);
        config.retention_ops = 64;
        // Unique per boot: the shard's VSR client id derives from it, and a
        // restarted shard must not reuse its last boot's request numbers.
        config.seed = self
            .seed
            .wrapping_mul(0x2545_F491_4F6C_DD1D)
            .wrapping_add(self.boots * 1_000 + u64::from(r) * 37 + u64::from(s));
        config.tick = TICK;
        config.rejoin = self.nodes[usize::from(r)].rejoin_next_boot;
        config.boot_tag = machine_boot_tag(self.seed, r, self.nodes[usize::from(r)].machine_boots);
        // Installs of a few segments would end in one call at the default
        // budget; most runs make them span ticks, with frames and client
        // calls arriving between the steps.
        config.install_file_ops_per_step =
            [1, 2, 5, INSTALL_FILE_OPS_PER_STEP][(self.seed % 4) as usize];
        // Three runs in four keep so few flushed batches in memory that a
        // peer's repair is served mostly from segments (read back, and
        // checked against the op's header, across crashes and rot).
        config.retained_bytes_max =
            [0, 4 * 1024, 64 * 1024, RETAINED_BYTES_MAX_DEFAULT][((self.seed / 4) % 4) as usize];
        // And half of the runs read back at most 1 KiB per answer (a few
        // batches), so a repair takes many requests, the highest ops first.
        if (self.seed / 16) % 2 == 1 {
            config.read_back_bytes_per_slice = 1024;
        }
        config
    }

    /// Boots every shard of replica `r` from its disk and reconciles its
    /// partition groups with its committed metadata.
    pub(crate) fn boot(&mut self, r: u8) -> Result<(), ClusterError> {
        self.boots += 1;
        let mut shards = Vec::new();
        for s in 0..self.shard_count {
            let env = TestEnv::new(
                ReplicaId(r),
                ShardIndex(s),
                Rc::clone(&self.clock),
                self.net.clone(),
                self.nodes[usize::from(r)].fs.clone(),
            );
            let shard = run_now("opening a shard", Shard::open(self.config(r, s), env))?.map_err(
                |source| ClusterError::Boot {
                    replica: r,
                    shard: s,
                    source,
                },
            )?;
            shards.push(shard);
        }
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..self.shard_count)
            .map(|_| shard::inbox(INBOX_CAPACITY))
            .unzip();
        for shard in &mut shards {
            shard.set_siblings(senders.clone());
        }
        let node = &mut self.nodes[usize::from(r)];
        node.inboxes = receivers;
        node.boots += 1;
        node.rejoin_next_boot = false;
        node.fresh_disk = false;
        if let Some(first) = shards.first_mut() {
            run_now("reconciling partition groups", first.reconcile_partitions())?;
        }
        node.shards = Some(shards);
        self.drain_inboxes()?;
        Ok(())
    }

    /// Crashes replica `r`: its shards stop, its disk keeps what `mode`
    /// says, and armed disk faults are cleared (the next boot's disk works).
    pub(crate) fn crash(&mut self, r: u8, mode: CrashMode) {
        let node = &mut self.nodes[usize::from(r)];
        if let Some(shards) = node.shards.take() {
            self.installs_retired += shards.iter().map(|s| s.stats().installs).sum::<u64>();
            self.metadata_installs_retired += shards.iter().map(metadata_installs).sum::<u64>();
            self.read_backs_retired += shards.iter().map(read_backs).sum::<u64>();
            let (records, batches) = superblock_writes(&shards);
            self.superblock_retired.0 += records;
            self.superblock_retired.1 += batches;
        }
        node.inboxes.clear();
        node.fs.clear_faults();
        node.fs.crash_with(mode);
        if mode != CrashMode::KeepAll {
            node.machine_boots += 1;
        }
    }

    /// Replica `r`'s process dies and its disk is replaced by an empty
    /// one (a lost disk). Its next boot rejoins (`ShardConfig::rejoin`),
    /// unless `as_new` — the mutation check: a replaced disk that starts
    /// as a brand-new member, which may vote away what it acknowledged.
    pub(crate) fn wipe(&mut self, r: u8, as_new: bool) -> Result<(), ClusterError> {
        self.crash(r, CrashMode::KeepAll);
        let node = &self.nodes[usize::from(r)];
        let seed = self.seed
            ^ (u64::from(r) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (node.wipes + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let fs = empty_disk(seed, r, slow_disks(self.seed))?;
        let node = &mut self.nodes[usize::from(r)];
        node.fs = fs;
        node.wipes += 1;
        node.rejoin_next_boot = !as_new;
        node.fresh_disk = true;
        Ok(())
    }

    /// The rejoin marker on replica `r`'s disk, as a phrase for the trace.
    pub(crate) fn rejoin_marker(&self, r: u8) -> String {
        let fs = &self.nodes[usize::from(r)].fs;
        let dir = shard_dir(&data_dir(), ShardIndex(0));
        match run_now("reading the rejoin marker", shard::rejoin::read(fs, &dir)) {
            Ok(Ok(Some(marker))) => format!("rejoin marker through op {:?}", marker.through_op),
            Ok(Ok(None)) => "no rejoin marker".into(),
            Ok(Err(e)) => format!("rejoin marker unreadable: {e}"),
            Err(stalled) => format!("rejoin marker read stalled: {stalled}"),
        }
    }

    /// Whether replica `r`'s disk was replaced and it booted from it
    /// since (its next boot is a reboot of a replaced disk).
    pub(crate) fn rebooting_replaced_disk(&self, r: u8) -> bool {
        let node = &self.nodes[usize::from(r)];
        node.wipes > 0 && !node.fresh_disk
    }

    /// How many times replica `r` booted.
    pub(crate) fn boot_count(&self, r: u8) -> u64 {
        self.nodes[usize::from(r)].boots
    }

    /// Whether replica `r` is up.
    pub(crate) fn is_up(&self, r: u8) -> bool {
        self.nodes[usize::from(r)].shards.is_some()
    }

    /// Replica `r`'s disk.
    pub(crate) fn fs(&self, r: u8) -> &SimFs {
        &self.nodes[usize::from(r)].fs
    }

    /// The shard of replica `r` that owns `group`, if the replica is up.
    pub(crate) fn shard(&self, r: u8, group: GroupId) -> Option<&Shard<TestEnv>> {
        let s = shard_of(group, self.shard_count).0;
        self.nodes[usize::from(r)]
            .shards
            .as_ref()
            .and_then(|shards| shards.get(usize::from(s)))
    }

    /// The VSR replica of `group` (group 0 included) on replica `r`.
    pub(crate) fn replica_of(&self, r: u8, group: GroupId) -> Option<&consensus::vsr::Replica> {
        if group == METADATA_GROUP {
            return self
                .shard_at(r, 0)?
                .metadata()
                .map(shard::MetadataHost::replica);
        }
        self.shard(r, group)?
            .partition(group)
            .map(partitions::Partition::replica)
    }

    /// Shard `s` of replica `r`, if the replica is up.
    pub(crate) fn shard_at(&self, r: u8, s: u16) -> Option<&Shard<TestEnv>> {
        self.nodes[usize::from(r)]
            .shards
            .as_ref()
            .and_then(|shards| shards.get(usize::from(s)))
    }

    fn shard_mut(&mut self, r: u8, s: u16) -> Option<&mut Shard<TestEnv>> {
        self.nodes[usize::from(r)]
            .shards
            .as_mut()
            .and_then(|shards| shards.get_mut(usize::from(s)))
    }

    /// Transfers installed over the run, crashed shards included.
    pub(crate) fn installs(&self) -> u64 {
        let live: u64 = self
            .nodes
            .iter()
            .filter_map(|n| n.shards.as_ref())
            .flatten()
            .map(|s| s.stats().installs)
            .sum();
        live + self.installs_retired
    }

    /// Batches read back from segments to serve a peer's repair over the
    /// run, crashed shards included (deleted groups' counts are not).
    pub(crate) fn read_backs(&self) -> u64 {
        let live: u64 = self
            .nodes
            .iter()
            .filter_map(|n| n.shards.as_ref())
            .flatten()
            .map(read_backs)
            .sum();
        live + self.read_backs_retired
    }

    /// Superblock records the shards' tables wrote over the run, and in how
    /// many batches, crashed shards included.
    pub(crate) fn superblock_writes(&self) -> (u64, u64) {
        let (mut records, mut batches) = self.superblock_retired;
        for shards in self.nodes.iter().filter_map(|n| n.shards.as_ref()) {
            let (r, b) = superblock_writes(shards);
            records += r;
            batches += b;
        }
        (records, batches)
    }

    /// Whether this run's disks are slow: every sync suspends, so the
    /// groups a shard runs side by side interleave around their syncs and
    /// the superblock table's batches carry several records.
    /// How often a step's shard tasks interleaved at a suspension.
    pub(crate) fn task_switches(&self) -> u64 {
        self.executor.switches()
    }

    pub(crate) fn slow_disks(&self) -> bool {
        slow_disks(self.seed)
    }

    /// Group 0 snapshots installed by transfer over the run, crashed
    /// shards included.
    pub(crate) fn metadata_installs(&self) -> u64 {
        let live: u64 = self
            .nodes
            .iter()
            .filter_map(|n| n.shards.as_ref())
            .flatten()
            .map(metadata_installs)
            .sum();
        live + self.metadata_installs_retired
    }

    /// Delivers the frames due this tick to live shards, recording each.
    pub(crate) fn deliver(&mut self, trace: &mut Trace) -> Result<(), ClusterError> {
        let tick = self.tick();
        // A shard's frames of this tick are served together, as the pump
        // serves the frames waiting in its inbox (`Shard::on_frames`).
        let mut by_shard: BTreeMap<(u8, u16), Vec<(ReplicaId, Bytes)>> = BTreeMap::new();
        for packet in self.net.deliver() {
            let (from, to, s) = (packet.from, packet.to, packet.shard.0);
            if self.shard_mut(to.0, s).is_none() {
                continue;
            }
            trace.deliver(tick, from.0, to.0, s, &packet.bytes);
            by_shard
                .entry((to.0, s))
                .or_default()
                .push((from, packet.bytes));
        }
        let mut tasks: Vec<StepTask<'_>> = Vec::with_capacity(by_shard.len());
        for (r, s, shard) in live_shards(&mut self.nodes) {
            if let Some(frames) = by_shard.remove(&(r, s)) {
                // A refusal is counted by the shard and changes nothing.
                tasks.push(Box::pin(async move {
                    let _ = shard.on_frames(frames).await;
                }));
            }
        }
        self.executor.run_side_by_side("frames", tasks)?;
        self.drain_inboxes()
    }

    /// Ticks every live shard side by side, `order` (pairs of replica and
    /// shard) giving the tasks' places.
    pub(crate) fn tick_shards(&mut self, order: &[(u8, u16)]) -> Result<(), ClusterError> {
        let mut live: BTreeMap<(u8, u16), &mut Shard<TestEnv>> = live_shards(&mut self.nodes)
            .map(|(r, s, shard)| ((r, s), shard))
            .collect();
        let mut tasks: Vec<StepTask<'_>> = Vec::with_capacity(order.len());
        for key in order {
            if let Some(shard) = live.remove(key) {
                tasks.push(Box::pin(shard.on_tick()));
            }
        }
        self.executor.run_side_by_side("a tick", tasks)?;
        self.drain_inboxes()
    }

    /// Serves what shards handed their siblings, every shard's inbox side
    /// by side, until nothing is left.
    pub(crate) fn drain_inboxes(&mut self) -> Result<(), ClusterError> {
        for _ in 0..DRAIN_ROUNDS_MAX {
            let mut tasks: Vec<Pin<Box<dyn Future<Output = bool> + '_>>> = Vec::new();
            for node in &mut self.nodes {
                let Some(shards) = node.shards.as_mut() else {
                    continue;
                };
                for (shard, inbox) in shards.iter_mut().zip(node.inboxes.iter_mut()) {
                    tasks.push(Box::pin(async move {
                        let mut served = false;
                        while let Ok(input) = inbox.try_recv() {
                            served = true;
                            shard.on_input(input).await;
                        }
                        served
                    }));
                }
            }
            let served = self.executor.run_side_by_side("a sibling input", tasks)?;
            if !served.contains(&true) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Sends a client call to replica `r`'s owning shard; `None` when the
    /// replica is down (the connection is refused: nothing was sent).
    pub(crate) fn call(
        &mut self,
        r: u8,
        group: GroupId,
        call: Call,
    ) -> Result<Option<oneshot::Receiver<Result<Answer, CallError>>>, ClusterError> {
        let s = shard_of(group, self.shard_count).0;
        let Some(shard) = self.shard_mut(r, s) else {
            return Ok(None);
        };
        let (reply, rx) = oneshot::channel();
        run_now(
            "a client call",
            shard.on_call(Envelope { group, call, reply }),
        )?;
        self.drain_inboxes()?;
        Ok(Some(rx))
    }

    /// Submits a metadata op to replica `r`'s shard 0.
    pub(crate) fn meta(
        &mut self,
        r: u8,
        op: MetadataOp,
    ) -> Result<Option<oneshot::Receiver<Result<Outcome, MetaError>>>, ClusterError> {
        let Some(shard) = self.shard_mut(r, 0) else {
            return Ok(None);
        };
        let (reply, rx) = oneshot::channel();
        let input = Input::Meta(MetaCall::Submit {
            op,
            user_id: 0,
            reply,
        });
        run_now("a metadata op", shard.on_input(input))?;
        self.drain_inboxes()?;
        Ok(Some(rx))
    }

    /// The partition groups replica `r`'s applied metadata names.
    pub(crate) fn metadata_groups(&self, r: u8) -> Option<Vec<GroupId>> {
        let shard0 = self.nodes[usize::from(r)].shards.as_ref()?.first()?;
        let host = shard0.metadata()?;
        Some(
            host.state()
                .partition_groups()
                .iter()
                .map(|i| i.group)
                .collect(),
        )
    }

    /// What replica `r`'s metadata says of `group` (`None` while `r` is
    /// down or names no such group).
    fn metadata_group_info(&self, r: u8, group: GroupId) -> Option<metadata::PartitionGroupInfo> {
        let shard0 = self.nodes[usize::from(r)].shards.as_ref()?.first()?;
        let host = shard0.metadata()?;
        host.state()
            .partition_groups()
            .into_iter()
            .find(|i| i.group == group)
    }

    /// The share of its topic's size ceiling replica `r`'s metadata gives
    /// `group` (`Some(0)`: no ceiling).
    pub(crate) fn metadata_retained_bytes_max(&self, r: u8, group: GroupId) -> Option<u64> {
        self.metadata_group_info(r, group)
            .map(|i| i.config.retained_bytes_max)
    }

    /// The purge generation replica `r`'s group 0 committed for `group`.
    pub(crate) fn metadata_purge_generation(&self, r: u8, group: GroupId) -> Option<u64> {
        self.metadata_group_info(r, group)
            .map(|i| i.purge_generation)
    }

    /// Replica `r`'s metadata state (`None` while it is down).
    /// The partition groups of topic `topic` in stream `stream` as replica
    /// `r`'s metadata names them (`None` while `r` is down or has not
    /// applied the topic's create).
    pub(crate) fn metadata_topic_groups(
        &self,
        r: u8,
        stream: &str,
        topic: &str,
    ) -> Option<Vec<GroupId>> {
        let shard0 = self.nodes[usize::from(r)].shards.as_ref()?.first()?;
        let state = shard0.metadata()?.state();
        let (s, t) = state
            .resolve_topic(
                &metadata::Identifier::Name(stream.into()),
                &metadata::Identifier::Name(topic.into()),
            )
            .ok()?;
        Some(
            state
                .partition_groups()
                .iter()
                .filter(|i| i.stream == s && i.topic == t)
                .map(|i| i.group)
                .collect(),
        )
    }

    pub(crate) fn metadata_state(&self, r: u8) -> Option<metadata::MetadataState> {
        let shard0 = self.nodes[usize::from(r)].shards.as_ref()?.first()?;
        Some(shard0.metadata()?.state().clone())
    }

    /// The message expiry (µs) of `group`'s topic in replica `r`'s
    /// metadata: `Some(0)` when its messages never expire.
    pub(crate) fn metadata_message_expiry_us(&self, r: u8, group: GroupId) -> Option<u64> {
        self.metadata_group_info(r, group)
            .map(|i| match i.config.message_expiry {
                metadata::MessageExpiry::After { micros } => micros,
                metadata::MessageExpiry::ServerDefault | metadata::MessageExpiry::Never => 0,
            })
    }

    /// Flushes every live group's committed messages to its segments.
    pub(crate) fn flush_all(&mut self) -> Result<(), ClusterError> {
        for node in &mut self.nodes {
            for shard in node.shards.iter_mut().flatten() {
                run_now("a flush", shard.flush_all())?;
            }
        }
        Ok(())
    }

    /// Every committed message of `group` on replica `r`, read through the
    /// partition's poll path: `(offset, payload)` in order. `Err` carries
    /// the poll error as a sentence.
    pub(crate) fn read_all(&self, r: u8, group: GroupId) -> Result<Option<Messages>, String> {
        let Some(shard) = self.shard(r, group) else {
            return Ok(None);
        };
        let Some(partition) = shard.partition(group) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let mut next = 0u64;
        loop {
            let request = PollRequest {
                consumer: (ConsumerKind::Consumer, u32::MAX),
                strategy: PollingStrategy::Offset(next),
                count: 10_000,
                auto_commit: false,
            };
            let polled = run_now("an inspection poll", partition.poll(&request))
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("poll at {next}: {e}"))?;
            if polled.is_empty() {
                return Ok(Some(out));
            }
            for m in polled.messages() {
                out.push((m.offset, m.payload.to_vec()));
            }
            let Some(&(last, _)) = out.last() else {
                return Ok(Some(out));
            };
            if last < next {
                return Err(format!("poll at {next} went backwards to {last}"));
            }
            next = last + 1;
        }
    }

    /// The directory of `group` on every replica's disk.
    /// Group 0's directory (its store and superblock) on every replica.
    pub(crate) fn metadata_dir(&self) -> PathBuf {
        shard_dir(&data_dir(), ShardIndex(0)).join(shard::METADATA_DIR)
    }

    pub(crate) fn group_dir(&self, group: GroupId) -> PathBuf {
        shard::group_dir(
            &shard_dir(&data_dir(), shard_of(group, self.shard_count)),
            group,
        )
    }

    /// The consumer-offset records of `group` on replica `r`, with their
    /// lengths.
    pub(crate) fn offset_records(&self, r: u8, group: GroupId) -> Vec<(PathBuf, usize)> {
        let fs = &self.nodes[usize::from(r)].fs;
        let root = self.group_dir(group).join("offsets");
        let mut out = Vec::new();
        for kind in ["consumers", "groups"] {
            let dir = root.join(kind);
            let Ok(Ok(entries)) = run_now("listing an offsets directory", fs.read_dir(&dir)) else {
                continue;
            };
            for entry in entries {
                let Some(name) = entry.name_str() else {
                    continue;
                };
                if entry.kind == FileKind::File && name.parse::<u32>().is_ok() {
                    let len = fs.contents(&dir.join(name)).map_or(0, |b| b.len());
                    if len > 0 {
                        out.push((dir.join(name), len));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// The segment files (`.log` and `.index`) of `group` on replica `r`,
    /// by name, with their bytes.
    pub(crate) fn segment_files(&self, r: u8, group: GroupId) -> Vec<(String, Vec<u8>)> {
        let fs = &self.nodes[usize::from(r)].fs;
        let dir = shard::group_dir(
            &shard_dir(&data_dir(), shard_of(group, self.shard_count)),
            group,
        );
        let Ok(Ok(entries)) = run_now("listing a group directory", fs.read_dir(&dir)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries {
            let Some(name) = entry.name_str() else {
                continue;
            };
            // The replica log is the replica's own journal, not data.
            let segment = name.ends_with(".log") || name.ends_with(".index");
            if entry.kind == FileKind::File && segment && name != journal::REPLICA_LOG_FILE {
                let bytes = fs.contents(&dir.join(name)).unwrap_or_default();
                out.push((name.to_owned(), bytes));
            }
        }
        out.sort();
        out
    }
}

/// The boot tag of replica `r`'s machine in its `machine_boot`-th boot:
/// distinct per run, replica and machine boot, never 0.
fn machine_boot_tag(seed: u64, r: u8, machine_boot: u32) -> u32 {
    let mixed = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(r) << 40)
        .wrapping_add(u64::from(machine_boot));
    journal::boot_tag_of(&format!("{mixed:016x}"))
}
