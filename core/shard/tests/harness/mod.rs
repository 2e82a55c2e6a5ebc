//! A cluster of replicas, each with several shards, on the in-process
//! environment: a virtual clock, a seeded network keyed by shard index and
//! one `SimFs` per replica. Driven by ticks, never by wall time.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use common::simnet::NetworkFaults;
use common::{GroupId, ReplicaId};
use consensus::vsr::TimeoutConfig;
use futures::channel::oneshot;
use futures::executor::block_on;
use metadata::{MetadataOp, Outcome};
use shard::testing::{TestClock, TestEnv, TestNet};
use shard::{
    Answer, Call, CallError, Envelope, GroupSpec, Input, MetaCall, MetaError, Shard, ShardConfig,
    ShardIndex, shard_dir, shard_of,
};
use storage::BatchBuilder;
use storage::fs::{FileKind, Fs, SimFs};

pub const TICK: Duration = Duration::from_millis(10);
pub const CLUSTER: u128 = 0xC1;

pub fn data_dir() -> PathBuf {
    PathBuf::from("/data")
}

pub fn fresh_fs(seed: u64) -> SimFs {
    let fs = SimFs::new(seed);
    block_on(async {
        fs.create_dir_all(&data_dir()).await.unwrap();
        fs.sync_dir(Path::new("/")).await.unwrap();
    });
    fs
}

pub struct Cluster {
    pub replicas: u8,
    pub shards: u16,
    pub clock: Rc<TestClock>,
    pub net: TestNet,
    pub fss: Vec<SimFs>,
    /// `[replica][shard]`, `None` while the replica is down.
    pub nodes: Vec<Vec<Option<Shard<TestEnv>>>>,
    pub boots: u64,
    pub retention_ops: u64,
    /// Group 0's retention (the VSR default unless a test lowers it).
    pub metadata_retention_ops: u64,
    pub segment_size: u64,
    /// Every shard's `ShardConfig::retained_bytes_max`.
    pub retained_bytes_max: u64,
    /// Every shard's `ShardConfig::read_back_bytes_per_slice`.
    pub read_back_bytes_per_slice: u64,
    /// `[replica][shard]`: each shard's inbox, fed by its siblings.
    pub inboxes: Vec<Vec<futures::channel::mpsc::Receiver<shard::Input>>>,
}

/// A call waiting for its answer.
pub struct Pending {
    pub group: GroupId,
    pub call: Call,
    pub rx: oneshot::Receiver<Result<Answer, CallError>>,
    pub target: ReplicaId,
    pub sent_tick: u64,
}

impl Cluster {
    pub fn new(replicas: u8, shards: u16, seed: u64, faults: NetworkFaults) -> Self {
        Self::with_metadata_retention(replicas, shards, seed, faults, 1024)
    }

    /// A cluster whose group 0 keeps only `metadata_retention_ops` applied
    /// ops for its peers' repair.
    pub fn with_metadata_retention(
        replicas: u8,
        shards: u16,
        seed: u64,
        faults: NetworkFaults,
        metadata_retention_ops: u64,
    ) -> Self {
        Self::build(
            replicas,
            shards,
            seed,
            faults,
            metadata_retention_ops,
            partitions::RETAINED_BYTES_MAX_DEFAULT,
            partitions::READ_BACK_BYTES_PER_SLICE_DEFAULT,
        )
    }

    /// A cluster whose shards keep at most `retained_bytes_max` bytes of
    /// flushed batches in memory for repair, and read back at most
    /// `read_back_bytes_per_slice` of them per answer.
    pub fn with_retained_bytes(
        replicas: u8,
        shards: u16,
        seed: u64,
        faults: NetworkFaults,
        retained_bytes_max: u64,
        read_back_bytes_per_slice: u64,
    ) -> Self {
        Self::build(
            replicas,
            shards,
            seed,
            faults,
            1024,
            retained_bytes_max,
            read_back_bytes_per_slice,
        )
    }

    fn build(
        replicas: u8,
        shards: u16,
        seed: u64,
        faults: NetworkFaults,
        metadata_retention_ops: u64,
        retained_bytes_max: u64,
        read_back_bytes_per_slice: u64,
    ) -> Self {
        let mut c = Self {
            replicas,
            shards,
            clock: TestClock::new(),
            net: TestNet::new(seed, faults),
            fss: (0..replicas)
                .map(|r| fresh_fs(seed ^ u64::from(r) << 8))
                .collect(),
            nodes: Vec::new(),
            boots: 0,
            retention_ops: 64,
            metadata_retention_ops,
            segment_size: 16 * 1024,
            retained_bytes_max,
            read_back_bytes_per_slice,
            inboxes: Vec::new(),
        };
        for r in 0..replicas {
            let row = (0..shards).map(|s| Some(c.boot(r, s))).collect();
            c.nodes.push(row);
            c.inboxes.push(Vec::new());
            c.wire_siblings(r);
        }
        c
    }

    pub fn config(&self, r: u8, s: u16) -> ShardConfig {
        let mut config = ShardConfig::new(
            CLUSTER,
            ReplicaId(r),
            self.replicas,
            ShardIndex(s),
            self.shards,
            shard_dir(&data_dir(), ShardIndex(s)),
        );
        config.timeouts = TimeoutConfig::scaled_down(5);
        config.retention_ops = self.retention_ops;
        config.metadata_retention_ops = self.metadata_retention_ops;
        config.seed = 1000 + self.boots * 31 + u64::from(r) * 7 + u64::from(s);
        config.tick = TICK;
        config.retained_bytes_max = self.retained_bytes_max;
        config.read_back_bytes_per_slice = self.read_back_bytes_per_slice;
        config
    }

    pub fn boot(&mut self, r: u8, s: u16) -> Shard<TestEnv> {
        self.try_boot(r, s).unwrap()
    }

    /// Boots shard `s` of replica `r`, or says why it could not.
    pub fn try_boot(&mut self, r: u8, s: u16) -> std::io::Result<Shard<TestEnv>> {
        self.boots += 1;
        let env = TestEnv::new(
            ReplicaId(r),
            ShardIndex(s),
            Rc::clone(&self.clock),
            self.net.clone(),
            self.fss[usize::from(r)].clone(),
        );
        block_on(Shard::open(self.config(r, s), env))
    }

    /// Gives the shards of replica `r` fresh inboxes of each other.
    pub fn wire_siblings(&mut self, r: u8) {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..self.shards).map(|_| shard::inbox(1024)).unzip();
        for node in self.nodes[usize::from(r)].iter_mut().flatten() {
            node.set_siblings(senders.clone());
        }
        self.inboxes[usize::from(r)] = receivers;
    }

    /// Serves what shards handed each other.
    pub fn drain_inboxes(&mut self) {
        for r in 0..usize::from(self.replicas) {
            for s in 0..usize::from(self.shards) {
                while let Ok(input) = self.inboxes[r][s].try_recv() {
                    if let Some(node) = self.nodes[r][s].as_mut() {
                        block_on(node.on_input(input));
                    }
                }
            }
        }
    }

    pub fn shard_of(&self, group: GroupId) -> u16 {
        shard_of(group, self.shards).0
    }

    pub fn node(&mut self, r: u8, group: GroupId) -> &mut Shard<TestEnv> {
        let s = self.shard_of(group);
        self.nodes[usize::from(r)][usize::from(s)]
            .as_mut()
            .expect("replica is up")
    }

    pub fn spec(&self, group: GroupId) -> GroupSpec {
        let mut spec = GroupSpec::new(group, (group.0 & 0xFFFFF) as u32);
        spec.segment_size_bytes = self.segment_size;
        spec.messages_required_to_save = 20;
        spec
    }

    pub fn create_everywhere(&mut self, group: GroupId) {
        let spec = self.spec(group);
        for r in 0..self.replicas {
            if self.nodes[usize::from(r)][usize::from(self.shard_of(group))].is_some() {
                block_on(self.node(r, group).create_group(spec)).unwrap();
            }
        }
    }

    /// One tick of the whole cluster: deliver due frames, tick every shard,
    /// advance the clock.
    pub fn step(&mut self) {
        // A shard's frames of a step are served together, as its pump
        // serves the frames waiting in its inbox.
        let mut by_shard = std::collections::BTreeMap::<(u8, u16), Vec<_>>::new();
        for p in self.net.deliver() {
            by_shard
                .entry((p.to.0, p.shard.0))
                .or_default()
                .push((p.from, p.bytes));
        }
        for ((to, s), frames) in by_shard {
            if let Some(node) = self.nodes[usize::from(to)][usize::from(s)].as_mut() {
                let _ = block_on(node.on_frames(frames));
            }
        }
        for row in &mut self.nodes {
            for node in row.iter_mut().flatten() {
                block_on(node.on_tick());
            }
        }
        self.drain_inboxes();
        self.clock.advance(TICK);
    }

    pub fn ticks(&self) -> u64 {
        (self.clock.now().as_millis() / TICK.as_millis()) as u64
    }

    pub fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.step();
        }
    }

    pub fn send(&mut self, target: ReplicaId, group: GroupId, call: Call) -> Pending {
        let (tx, rx) = oneshot::channel();
        let envelope = Envelope {
            group,
            call: call.clone(),
            reply: tx,
        };
        let sent_tick = self.ticks();
        let s = usize::from(self.shard_of(group));
        match self.nodes[usize::from(target.0)][s].as_mut() {
            Some(node) => block_on(node.on_call(envelope)),
            None => drop(envelope),
        }
        Pending {
            group,
            call,
            rx,
            target,
            sent_tick,
        }
    }

    /// Submits a metadata op to group 0 and drives the cluster until it is
    /// answered: starts at replica 0, follows `NotPrimary` to the primary
    /// it names, skips a replica that is down and, when the answer is
    /// `Unavailable` or does not come within 300 steps, runs 20 ticks and
    /// asks again.
    ///
    /// # Panics
    /// When no answer comes in 50 attempts.
    pub fn submit_metadata(&mut self, op: MetadataOp) -> Result<Outcome, MetaError> {
        let mut target = ReplicaId(0);
        for _ in 0..50 {
            let (tx, mut rx) = oneshot::channel();
            let Some(node) = self.nodes[usize::from(target.0)][0].as_mut() else {
                target = ReplicaId((target.0 + 1) % self.replicas);
                continue;
            };
            block_on(node.on_input(Input::Meta(MetaCall::Submit {
                op: op.clone(),
                user_id: 0,
                reply: tx,
            })));
            let mut answer = None;
            for _ in 0..300 {
                if let Ok(Some(a)) = rx.try_recv() {
                    answer = Some(a);
                    break;
                }
                self.step();
            }
            match answer {
                Some(Err(MetaError::NotPrimary { primary, .. })) => target = primary,
                Some(Err(MetaError::Unavailable { .. })) | None => self.run(20),
                Some(other) => return other,
            }
        }
        panic!("metadata op never answered");
    }

    /// The replica that believes it is the group's primary, if any is up.
    pub fn primary(&self, group: GroupId) -> Option<ReplicaId> {
        let s = usize::from(self.shard_of(group));
        (0..self.replicas).find_map(|r| {
            let node = self.nodes[usize::from(r)][s].as_ref()?;
            let p = node.partition(group)?;
            (p.replica().is_caught_up_primary()).then_some(ReplicaId(r))
        })
    }

    /// Sends `call` until it is answered Ok, following NotPrimary and
    /// retrying transient errors; at most `ticks_max` ticks.
    pub fn call_until_done(
        &mut self,
        group: GroupId,
        call: Call,
        ticks_max: u64,
    ) -> Result<Answer, CallError> {
        let mut target = ReplicaId(0);
        let deadline = self.ticks() + ticks_max;
        let mut last = CallError::Overloaded;
        while self.ticks() < deadline {
            let mut pending = self.send(target, group, call.clone());
            let wait_until = self.ticks() + 200;
            let result = loop {
                match pending.rx.try_recv() {
                    Ok(Some(result)) => break Some(result),
                    Ok(None) => {}
                    Err(_) => break None,
                }
                if self.ticks() >= wait_until {
                    break None;
                }
                self.step();
            };
            match result {
                Some(Ok(answer)) => return Ok(answer),
                Some(Err(CallError::NotPrimary { primary, .. })) => {
                    target = primary;
                    last = CallError::Overloaded;
                    self.step();
                }
                Some(Err(e)) if e.transient() || matches!(e, CallError::Indeterminate { .. }) => {
                    last = e;
                    target = ReplicaId((target.0 + 1) % self.replicas);
                    self.run(5);
                }
                Some(Err(e)) => return Err(e),
                None => {
                    target = ReplicaId((target.0 + 1) % self.replicas);
                    self.step();
                }
            }
            let _ = &pending.call;
        }
        Err(last)
    }

    /// Every file of a group's directory on replica `r` with its bytes
    /// (segment logs and indexes only).
    pub fn segment_files(&self, r: u8, group: GroupId) -> Vec<(String, Vec<u8>)> {
        let fs = &self.fss[usize::from(r)];
        let dir = shard::group_dir(
            &shard_dir(&data_dir(), ShardIndex(self.shard_of(group))),
            group,
        );
        let mut out = Vec::new();
        for entry in block_on(fs.read_dir(&dir)).unwrap() {
            let name = entry.name_str().unwrap().to_owned();
            if entry.kind == FileKind::File && (name.ends_with(".log") || name.ends_with(".index"))
            {
                out.push((name.clone(), fs.contents(&dir.join(&name)).unwrap()));
            }
        }
        out.sort();
        out
    }

    /// The spec `group.meta` of `group` holds on replica `r`'s disk.
    pub fn spec_on_disk(&self, r: u8, group: GroupId) -> Option<GroupSpec> {
        let dir = shard::group_dir(
            &shard_dir(&data_dir(), ShardIndex(self.shard_of(group))),
            group,
        );
        block_on(shard::read_spec(&self.fss[usize::from(r)], &dir)).unwrap()
    }

    pub fn flush_all(&mut self) {
        for row in &mut self.nodes {
            for node in row.iter_mut().flatten() {
                block_on(node.flush_all());
            }
        }
    }

    pub fn crash(&mut self, r: u8, mode: storage::fs::CrashMode) {
        for s in 0..usize::from(self.shards) {
            self.nodes[usize::from(r)][s] = None;
        }
        self.fss[usize::from(r)].crash_with(mode);
    }

    pub fn restart(&mut self, r: u8) {
        for s in 0..self.shards {
            let node = self.boot(r, s);
            self.nodes[usize::from(r)][usize::from(s)] = Some(node);
        }
        self.wire_siblings(r);
    }

    /// Restarts replica `r` and reconciles its partition groups with its
    /// committed metadata, as the server does at boot (groups made by hand
    /// in a test, not by the metadata plane, would be deleted).
    pub fn restart_reconciled(&mut self, r: u8) {
        self.restart(r);
        if let Some(node) = self.nodes[usize::from(r)][0].as_mut() {
            block_on(node.reconcile_partitions());
        }
        self.drain_inboxes();
    }
}

/// A batch of `messages` messages whose payloads name `tag`.
pub fn batch(tag: u64, messages: u32) -> Vec<u8> {
    let mut b = BatchBuilder::new(tag);
    for i in 0..messages {
        let payload = format!("t{tag}-m{i}");
        b.push(
            (u128::from(tag) << 32) | (u128::from(i) + 1),
            i,
            payload.as_bytes(),
            b"",
        );
    }
    b.build()
}
