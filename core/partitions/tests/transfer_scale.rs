//! State transfer at scale (SPEC §7 ST-B1, ST-B2) on the simulated
//! filesystem, the serving half (`OfferServer`) and the receiving half
//! (`TransferReceiver`) driven in-process on one thread:
//!
//! - **ST-B1**: one large segment artifact is hashed by the serve-side
//!   build in time-bounded rounds, pulled chunk by chunk (each chunk walked,
//!   hashed and spilled), cut at seven eighths, and resumed by a new session
//!   whose preparation re-reads (re-walks, re-hashes) the synced prefix in
//!   budgeted ticks; the server loads the deep resume request over
//!   several calls, as the driver configures it. Another group shares the
//!   thread: the thread's time is virtual (1 ns per byte read or hashed by
//!   either side), the group's ticks fall due every 10 ms of it and run
//!   only between two steps of the transfer, as in a shard loop. The test
//!   bounds the longest step (the longest the group cannot tick), how late
//!   a tick runs and how long the group goes without sending, so a step
//!   that does unbounded work shows as starvation.
//!   (It used to tick the group once per step whatever the step did, and
//!   left the server's reads uncounted, so starvation could not show.)
//! - **ST-B2**: a 1 GiB segment pulled with the receiver's peak buffer at
//!   most four chunks (`ReceiverStats::peak_held_bytes`; in fact a chunk
//!   and at most a batch header, also asserted by the ST-B1 runs, whose
//!   1 MiB batches are four chunks long), cut at ~90%, and
//!   completed by a new session that pulls exactly the chunks past the last
//!   synced length plus the offsets artifact.
//!
//! The default run holds the receive-side ST-B1 test at 32 MiB (the
//! existing tests cover the serve side at 64 MiB and ST-B2 at 64 MiB /
//! ~1 MiB, and with 1.5 MB batches in 64 KiB chunks in `tests/receive.rs`).
//! The large sizes (256 MiB ST-B1, 1 GiB ST-B2; a few GiB of RAM,
//! tens of seconds in release) are `#[ignore]`d; run them with
//!
//! ```text
//! cargo test -p partitions --release --test transfer_scale -- --ignored
//! ```
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use common::{ConsumerKind, GroupId, Op, ReplicaId};
use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

use common::simnet::NetworkFaults;
use consensus::header::StateTransferTargetHeader;
use consensus::vsr::{Config as VsrConfig, TimeoutConfig};
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::state_transfer::OFFER_READ_CHUNK_BYTES;
use partitions::state_transfer::{
    BuildBudget, BuildClock, ChunkAnswer, ChunkRequest, DRIVER_LOAD_BLOCKS_PER_CALL, LocalFacts,
    OfferServer, OfferServerConfig, PartitionTransferUnavailable, ReceiveStep, ReceivedTransfer,
    ReceiverConfig, SpillConfig, TransferReceiver, TransferRequest,
};
use partitions::{ClientOp, InMemoryBus, InMemoryNetwork, Partition, PartitionConfig};
use storage::BATCH_HEADER_SIZE;
use storage::BatchBuilder;
use storage::fs::{CountingFs, SimFs};
use support::{Node, config, dir, fresh_fs, open};
use xxhash_rust::xxh3::xxh3_64;

const ME: u8 = 2;
const MIB: u64 = 1 << 20;
/// One chunk request's payload ceiling (both ends).
const CHUNK: u32 = 256 * 1024;
/// Serve-side build round: 10 ms at 1 ns per byte, about 10 MB.
const ROUND_TIME: Duration = Duration::from_millis(10);

/// A build clock that advances 1 ns per hashed byte.
#[derive(Default)]
struct ByteClock {
    now_ns: Cell<u64>,
}

impl BuildClock for ByteClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.get())
    }

    fn observe_hashed(&self, bytes: u64) {
        self.now_ns.set(self.now_ns.get() + bytes);
    }
}

/// The two disks of a transfer, each read through a counter.
struct Disks {
    /// The serving peer's (chunk loads; the build reads through the
    /// peer's partition and is counted by its clock).
    peer: CountingFs<SimFs>,
    /// The receiver's (the resume's re-read of its staged prefix).
    rx: CountingFs<SimFs>,
}

impl Disks {
    fn read_bytes(&self) -> u64 {
        self.peer.counts().read_bytes + self.rx.counts().read_bytes
    }
}

/// A batch of 16 messages of `kib / 16` KiB whose payloads name `tag`.
fn batch(tag: u64, kib: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(tag);
    for i in 0..16u32 {
        let payload = vec![(tag as u8) ^ (i as u8); kib / 16 * 1024];
        b.push(u128::from(tag) << 32 | u128::from(i), i, &payload, b"");
    }
    b.build()
}

/// A single-replica partition whose first segment holds `mib` MiB in
/// batches of `batch_kib` KiB (one artifact of about `mib` MiB) plus two
/// consumer offsets.
fn peer(seed: u64, mib: u64, batch_kib: usize) -> (SimFs, Node<MemSuperblock>) {
    let fs = fresh_fs(seed);
    let mut c = config();
    c.log.segment_size_bytes = (mib + 64) * MIB;
    let mut node = open(&fs, MemSuperblock::new(), c);
    for tag in 0..mib * 1024 / batch_kib as u64 {
        node.request(ClientOp::Append(batch(tag + 1, batch_kib)));
        node.now_us += 1_000;
    }
    node.store(ConsumerKind::Consumer, 1, 5);
    node.store(ConsumerKind::ConsumerGroup, 4, 7);
    block_on(node.partition.flush_committed_messages()).unwrap();
    (fs, node)
}

/// A server whose build rounds stop after `time_max` (unbounded with
/// `None`) and whose chunk requests load as the driver's do.
fn server(time_max: Option<Duration>) -> OfferServer {
    OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: CHUNK,
        repair_retry_ticks: 10,
        budget: BuildBudget {
            time_max,
            bytes_max: u64::MAX,
        },
    })
    .with_load_blocks_per_call(DRIVER_LOAD_BLOCKS_PER_CALL)
}

fn local() -> LocalFacts {
    LocalFacts {
        replica: ReplicaId(ME),
        replica_count: 3,
        view: 0,
        primary: ReplicaId(0),
        commit_max: Op(0),
        purge_generation: 0,
    }
}

fn receiver_config(prepare_budget_bytes: u64) -> ReceiverConfig {
    ReceiverConfig {
        chunk_len_max_bytes: CHUNK,
        repair_retry_ticks: 10,
        spill: SpillConfig {
            sync_interval_bytes: 8 * MIB,
            rehash_slice_bytes: 1 << 20,
        },
        prepare_budget_bytes,
        ..ReceiverConfig::default()
    }
}

/// One tick of the other group, in the thread's virtual time.
const TICK_NS: u64 = 10_000_000;

/// Another group on the same thread: replica 0 of three, scaled-down
/// timeouts, so it heartbeats every few ticks when ticked on time. The
/// thread's time is virtual, 1 ns per byte of transfer work; a tick falls
/// due every [`TICK_NS`] of it and runs only between two steps of the
/// transfer, late by however long the step that straddled it took.
struct OtherGroup {
    partition: Partition<InMemoryBus, MemSuperblock, SimFs>,
    net: InMemoryNetwork,
    /// The thread's virtual time.
    now_ns: u64,
    next_tick_ns: u64,
    /// Per tick: how late it ran.
    late_ns: Vec<u64>,
    /// Virtual times of the ticks on which the group sent frames.
    sent_at_ns: Vec<u64>,
    /// Per kind of step, the most work one step did.
    step_max: [u64; 4],
    /// The longest the thread ran without a chance to tick the group: one
    /// step, and its kind.
    busy_max: (u64, Work),
}

impl OtherGroup {
    fn open(fs: &SimFs) -> Self {
        let mut vsr = VsrConfig::new(ReplicaId(0), 3, GroupId(0));
        vsr.timeouts = TimeoutConfig::scaled_down(10);
        let net = InMemoryNetwork::new(2, 3, NetworkFaults::default());
        let partition = block_on(Partition::open(
            PartitionConfig::new(vsr),
            fs.clone(),
            Path::new("/data/other"),
            net.endpoint(ReplicaId(0)),
            MemSuperblock::new(),
        ))
        .unwrap();
        Self {
            partition,
            net,
            now_ns: 0,
            next_tick_ns: TICK_NS,
            late_ns: Vec::new(),
            sent_at_ns: Vec::new(),
            step_max: [0; 4],
            busy_max: (0, Work::Build),
        }
    }

    /// A step of `work` bytes ran on the thread; then the ticks that fell
    /// due meanwhile run, in order.
    fn after_step(&mut self, kind: Work, work: u64) {
        self.now_ns += work;
        let max = &mut self.step_max[kind as usize];
        *max = (*max).max(work);
        if work > self.busy_max.0 {
            self.busy_max = (work, kind);
        }
        while self.next_tick_ns <= self.now_ns {
            self.late_ns.push(self.now_ns - self.next_tick_ns);
            self.next_tick_ns += TICK_NS;
            let (before, _) = self.net.counts();
            block_on(self.partition.on_tick(1_000_000 + self.now_ns / 1_000)).unwrap();
            self.net.tick();
            if self.net.counts().0 > before {
                self.sent_at_ns.push(self.now_ns);
            }
        }
    }

    /// Since tick `from` (and virtual time `from_ns`): the ticks, the
    /// latest one ran, and the longest the group went without sending.
    fn summary(&self, from: usize, from_ns: u64) -> (usize, u64, u64) {
        let ticks = self.late_ns.len() - from;
        let late_max = self.late_ns[from..].iter().copied().max().unwrap_or(0);
        let mut silent_max = 0;
        let mut last = from_ns;
        for &at in self.sent_at_ns.iter().filter(|&&at| at >= from_ns) {
            silent_max = silent_max.max(at - last);
            last = at;
        }
        silent_max = silent_max.max(self.now_ns - last);
        (ticks, late_max, silent_max)
    }
}

/// What a step between two ticks of the other group did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// A serve-side build round (bytes hashed).
    Build,
    /// A chunk served, walked, hashed and spilled (bytes accepted).
    Chunk,
    /// A preparation tick (staged bytes re-read, re-walked, re-hashed).
    Prepare,
    /// A server call loading toward a request answered `Loading`.
    Load,
}

/// How a pull ended.
enum Ended {
    Complete(Box<ReceivedTransfer>),
    /// Cut before serving this chunk request (at `offset` of `artifact`).
    Cut {
        offset: u64,
    },
}

/// Serves `request` and what follows from it. The descriptor is built in
/// budgeted rounds, a deep chunk request is loaded over several server
/// calls, and a preparation runs on ticks; `between` is called after every
/// step with the bytes of work the step did: bytes hashed by a build
/// round, bytes read from either disk, and the payload a chunk step
/// walked, hashed and spilled.
#[allow(clippy::too_many_arguments)]
fn drive(
    rx: &mut TransferReceiver<CountingFs<SimFs>>,
    disks: &Disks,
    peer: &mut Node<MemSuperblock>,
    server: &mut OfferServer,
    peer_id: u8,
    mut request: TransferRequest,
    cut: &dyn Fn(&TransferRequest) -> bool,
    between: &mut dyn FnMut(Work, u64),
) -> Ended {
    let clock = ByteClock::default();
    loop {
        if cut(&request) {
            let TransferRequest::Chunk { offset, .. } = request else {
                panic!("cut at {request:?}");
            };
            return Ended::Cut { offset };
        }
        let mut step = match request {
            TransferRequest::Descriptor { nonce, .. } => {
                let offer = loop {
                    let hashed_before = clock.now_ns.get();
                    let round = block_on(server.on_request_state_transfer(
                        &mut peer.partition,
                        ReplicaId(ME),
                        nonce,
                        &clock,
                    ));
                    between(Work::Build, clock.now_ns.get() - hashed_before);
                    match round {
                        Ok(offer) => break offer,
                        Err(PartitionTransferUnavailable::OfferBuildInProgress { .. }) => {}
                        Err(other) => panic!("{other}"),
                    }
                };
                let header = StateTransferTargetHeader {
                    nonce,
                    commit_op: offer.commit_op(),
                    group: GroupId(0),
                    available: true,
                    unavailable_transient: false,
                    commit_max: Op(peer.partition.replica().commit_max().0),
                };
                let body = offer.encoded_manifest().to_vec();
                // Taking the offer starts the preparation (a resume
                // re-reads its synced prefix): a step of its own.
                let read_before = disks.read_bytes();
                let step = block_on(rx.on_target(peer_id, 0, &header, &body, &local()));
                between(Work::Prepare, disks.read_bytes() - read_before);
                step
            }
            TransferRequest::Chunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } => {
                let mut read_before = disks.read_bytes();
                let mut answer = block_on(server.on_request_state_chunk(
                    &disks.peer,
                    ChunkRequest {
                        requester: ReplicaId(ME),
                        nonce,
                        artifact,
                        offset,
                        len,
                    },
                ));
                // Too deep to load in one call: later calls (the driver's
                // ticks) load toward it until it is served.
                while matches!(answer, ChunkAnswer::Loading) {
                    between(Work::Load, disks.read_bytes() - read_before);
                    read_before = disks.read_bytes();
                    for (requester, served_nonce, ready) in
                        block_on(server.advance_loads(&disks.peer))
                    {
                        assert_eq!((requester, served_nonce), (ReplicaId(ME), nonce));
                        answer = ready;
                    }
                }
                let ChunkAnswer::Chunk(chunk) = answer else {
                    panic!("peer did not serve: {answer:?}");
                };
                let payload = chunk.payload.len() as u64;
                let step = block_on(rx.on_chunk(
                    peer_id,
                    nonce,
                    chunk.artifact,
                    chunk.offset,
                    chunk.payload,
                    &local(),
                ));
                between(Work::Chunk, disks.read_bytes() - read_before + payload);
                step
            }
        };
        while matches!(step, ReceiveStep::Wait) {
            let read_before = disks.read_bytes();
            step = block_on(rx.on_tick(&local()));
            between(Work::Prepare, disks.read_bytes() - read_before);
        }
        match step {
            ReceiveStep::Send(next) => request = next,
            ReceiveStep::Complete(done) => return Ended::Complete(done),
            other => panic!("transfer did not complete: {other:?}"),
        }
    }
}

/// The peer's first segment: its base offset and the xxh3 of its bytes.
fn first_segment(fs: &SimFs, node: &Node<MemSuperblock>) -> (u64, u64, u64) {
    let s = node.partition.log().segments().next().unwrap();
    let path = dir().join(storage::log_file_name(s.start_offset));
    let bytes = fs.contents(&path).unwrap();
    (s.start_offset, bytes.len() as u64, xxh3_64(&bytes))
}

/// The receiving replica's filesystem, holding its own (empty) partition.
fn receiver_fs(seed: u64) -> (SimFs, Node<MemSuperblock>) {
    let fs = fresh_fs(seed);
    let node = open(&fs, MemSuperblock::new(), config());
    (fs, node)
}

/// Checks the staged first segment is byte-identical to the peer's.
fn assert_staged(rx_fs: &SimFs, done: &ReceivedTransfer, want: (u64, u64, u64)) {
    let meta = &done.staged[0];
    assert_eq!((meta.start_offset.0, meta.size_bytes), (want.0, want.1));
    let staged = rx_fs.contents(&meta.log_staging).unwrap();
    assert_eq!(xxh3_64(&staged), want.2, "staged log differs");
}

/// ST-B1 over one artifact of `mib` MiB: build rounds, a pull cut at
/// seven eighths, a resume whose preparation re-reads the synced prefix on
/// ticks and whose server loads the deep first request over several calls,
/// with another group on the thread ticked on its virtual time (see
/// [`OtherGroup`]). Cutting late makes the synced prefix (at least 24 MiB
/// of 32) larger than any bounded step, so re-reading or loading it in one
/// step makes a tick late by more than the bound.
fn ticks_flow_while_transferring(mib: u64) {
    let started = Instant::now();
    let (peer_fs, mut peer_node) = peer(31, mib, 1024);
    let want = first_segment(&peer_fs, &peer_node);
    assert!(want.1 >= mib * MIB, "{} bytes", want.1);
    let (rx_fs, _rx_node) = receiver_fs(32);
    let disks = Disks {
        peer: CountingFs::new(peer_fs.clone()),
        rx: CountingFs::new(rx_fs.clone()),
    };
    let mut other = OtherGroup::open(&rx_fs);
    let prepare_budget = 8 * MIB;
    let mut rx =
        TransferReceiver::new(disks.rx.clone(), &dir(), receiver_config(prepare_budget), 5);
    let mut srv = server(Some(ROUND_TIME));
    // The most work one step may do, per kind: a build round stops at the
    // first read past its time; a server call loads at most the driver's
    // blocks (then serves a chunk the receiver walks and spills); a
    // preparation tick re-reads at most its budget.
    let round_bound = u64::try_from(ROUND_TIME.as_nanos()).unwrap() + OFFER_READ_CHUNK_BYTES as u64;
    let load_bound = (DRIVER_LOAD_BLOCKS_PER_CALL * OFFER_READ_CHUNK_BYTES) as u64;
    let step_bound = round_bound
        .max(load_bound + u64::from(CHUNK))
        .max(prepare_budget);
    // Ticked on time, the group sends at least every commit-message
    // timeout; a tick may run up to one step late.
    let heartbeat_ns = TimeoutConfig::scaled_down(10).commit_message_ticks * TICK_NS;
    let silent_bound = heartbeat_ns + step_bound;

    // Session 1: build in rounds, pull to seven eighths.
    let cut_at = want.1 / 8 * 7;
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { artifact: 0, offset, .. } if *offset >= cut_at);
    let first = rx.arm(ReplicaId(0));
    let mut serve_rounds = 0u64;
    let Ended::Cut { offset } = drive(
        &mut rx,
        &disks,
        &mut peer_node,
        &mut srv,
        0,
        first,
        &cut,
        &mut |kind, work| {
            serve_rounds += u64::from(kind == Work::Build);
            other.after_step(kind, work);
        },
    ) else {
        panic!("not cut");
    };
    let (ticks, late_max, silent_max) = other.summary(0, 0);
    eprintln!(
        "{mib} MiB: {serve_rounds} build rounds, {ticks} ticks to the cut at {offset} \
         ({} ns of work), ticks ≤ {late_max} ns late, ≤ {silent_max} ns silent; \
         step max per kind {:?}",
        other.now_ns, other.step_max
    );
    assert_ticks_flowed(
        other.busy_max,
        late_max,
        silent_max,
        step_bound,
        silent_bound,
    );
    assert!(
        serve_rounds >= want.1 / round_bound,
        "{serve_rounds} rounds"
    );
    assert!(
        other.step_max[Work::Build as usize] <= round_bound,
        "{:?}",
        other.step_max
    );

    // Session 2 (a new nonce, another server): the preparation re-walks
    // the synced prefix in budgeted ticks, the server loads up to the
    // first request over several calls, then the rest is pulled.
    let from = other.late_ns.len();
    let from_ns = other.now_ns;
    let mut srv2 = server(Some(ROUND_TIME));
    let second = rx.arm(ReplicaId(1));
    let point = rx.resume_point().unwrap();
    assert!(point.synced_len_bytes >= cut_at - 8 * MIB, "{point:?}");
    assert!(point.synced_len_bytes > step_bound, "{point:?}");
    let Ended::Complete(done) = drive(
        &mut rx,
        &disks,
        &mut peer_node,
        &mut srv2,
        1,
        second,
        &|_| false,
        &mut |kind, work| other.after_step(kind, work),
    ) else {
        panic!("cut");
    };
    let stats = rx.stats();
    let (ticks, late_max, silent_max) = other.summary(from, from_ns);
    eprintln!(
        "{mib} MiB resume: {} bytes re-read (≤ {} per call), {ticks} ticks \
         ({} ns of work), ticks ≤ {late_max} ns late, ≤ {silent_max} ns silent; \
         step max per kind {:?}; {:?} in all",
        stats.rehashed_bytes,
        stats.rehashed_bytes_max_per_call,
        other.now_ns - from_ns,
        other.step_max,
        started.elapsed()
    );
    assert_ticks_flowed(
        other.busy_max,
        late_max,
        silent_max,
        step_bound,
        silent_bound,
    );
    assert_eq!(stats.resumed_spills, 1);
    assert_eq!(stats.rehashed_bytes, point.synced_len_bytes);
    assert!(stats.rehashed_bytes_max_per_call <= prepare_budget);
    let [build, chunk, prepare, load] = other.step_max;
    assert!(build <= round_bound, "build round of {build} bytes");
    assert!(
        chunk <= load_bound + u64::from(CHUNK),
        "chunk step of {chunk} bytes"
    );
    assert!(load <= load_bound, "load call of {load} bytes");
    assert!(
        prepare <= prepare_budget,
        "preparation tick of {prepare} bytes"
    );
    assert!(load > 0, "the deep resume request was served in one call");
    // ST-B2 with batches (1 MiB) larger than a chunk (256 KiB): the walk
    // checks a straddling batch piece by piece and carries at most a batch
    // header across a chunk boundary, so the peak is a chunk plus at most
    // 256 bytes (it was a chunk plus a batch, 1.31 MB, before).
    eprintln!(
        "{mib} MiB: peak receiver buffer {} bytes",
        stats.peak_held_bytes
    );
    assert!(stats.peak_held_bytes <= 4 * u64::from(CHUNK));
    assert!(stats.peak_held_bytes <= u64::from(CHUNK) + BATCH_HEADER_SIZE as u64);
    assert_staged(&rx_fs, &done, want);
}

/// The other group's ticks kept flowing: no step longer than
/// `step_bound` ns of work, no tick later than that, and no silence longer
/// than `silent_bound`.
fn assert_ticks_flowed(
    (busy, kind): (u64, Work),
    late_max: u64,
    silent_max: u64,
    step_bound: u64,
    silent_bound: u64,
) {
    assert!(
        busy <= step_bound,
        "the thread ran {busy} ns (a {kind:?} step) without a chance to tick the other group (bound {step_bound})"
    );
    assert!(
        late_max <= step_bound,
        "a tick of the other group ran {late_max} ns late (bound {step_bound})"
    );
    assert!(
        silent_max <= silent_bound,
        "the other group sent nothing for {silent_max} ns (bound {silent_bound})"
    );
}

#[test]
fn given_32_mib_artifact_when_served_and_received_should_keep_another_groups_ticks_flowing() {
    ticks_flow_while_transferring(32);
}

#[test]
#[ignore = "256 MiB: about 1.5 GB of RAM, 3 s in release; run with --release --ignored"]
fn given_256_mib_artifact_when_served_and_received_should_keep_another_groups_ticks_flowing() {
    ticks_flow_while_transferring(256);
}

/// ST-B2 at 1 GiB of 256 KiB batches (each a little longer than a chunk):
/// the peak buffer stays within four chunks (a chunk and at most a batch
/// header), and a cut at ~90% costs exactly the chunks past the last
/// synced length.
#[test]
#[ignore = "1 GiB: about 7 GB of RAM, 20 s in release; run with --release --ignored"]
fn given_1_gib_segment_when_streamed_and_cut_at_90_percent_should_hold_four_chunks_and_re_pull_only_the_rest()
 {
    let started = Instant::now();
    let (peer_fs, mut peer_node) = peer(41, 1024, 256);
    let want = first_segment(&peer_fs, &peer_node);
    assert!(want.1 >= 1 << 30, "{} bytes", want.1);
    let (rx_fs, _rx_node) = receiver_fs(42);
    let disks = Disks {
        peer: CountingFs::new(peer_fs.clone()),
        rx: CountingFs::new(rx_fs.clone()),
    };
    let mut rx = TransferReceiver::new(disks.rx.clone(), &dir(), receiver_config(64 * MIB), 6);
    let mut srv = server(None);
    let cut_at = want.1 * 9 / 10;
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { artifact: 0, offset, .. } if *offset >= cut_at);
    let first = rx.arm(ReplicaId(0));
    let Ended::Cut { offset: stopped } = drive(
        &mut rx,
        &disks,
        &mut peer_node,
        &mut srv,
        0,
        first,
        &cut,
        &mut |_, _| {},
    ) else {
        panic!("not cut");
    };
    drop(srv);
    let requests_before = rx.stats().chunk_requests;
    let mut srv2 = server(None);
    let second = rx.arm(ReplicaId(1));
    let point = rx.resume_point().unwrap();
    let sync = receiver_config(0).spill.sync_interval_bytes;
    assert_eq!(point.synced_len_bytes, stopped / sync * sync);
    let Ended::Complete(done) = drive(
        &mut rx,
        &disks,
        &mut peer_node,
        &mut srv2,
        1,
        second,
        &|_| false,
        &mut |_, _| {},
    ) else {
        panic!("cut");
    };
    let stats = rx.stats();
    let requests = stats.chunk_requests - requests_before;
    let chunk = u64::from(CHUNK);
    let missing = (want.1 - point.synced_len_bytes).div_ceil(chunk);
    let offsets = done.descriptor.manifest.last().unwrap().len.div_ceil(chunk);
    let peak = stats.peak_held_bytes;
    eprintln!(
        "1 GiB ({} bytes): peak receiver buffer {peak} bytes ({:.2} chunks); cut at {stopped}, \
         resumed from {}, re-pulled {requests} chunks ({missing} of the segment, {offsets} offsets); \
         {:?} in all",
        want.1,
        peak as f64 / chunk as f64,
        point.synced_len_bytes,
        started.elapsed()
    );
    assert!(peak <= 4 * chunk, "peak {peak}");
    assert!(peak <= chunk + BATCH_HEADER_SIZE as u64, "peak {peak}");
    assert_eq!(requests, missing + offsets);
    assert_eq!(stats.resumed_spills, 1);
    assert_eq!(stats.resumed_bytes, point.synced_len_bytes);
    assert!(stats.chunk_bytes >= 1 << 30);
    assert_staged(&rx_fs, &done, want);
}
