//! The serving half of partition state transfer (SPEC §7, ST-S1..S5, ST-B1
//! serve side, ST-B3) on the simulated filesystem: offers match the bytes
//! on disk, builds run in bounded rounds whose memos survive, chunks
//! reassemble byte-identical artifacts, and the offer cache behaves per
//! nonce.
#![allow(clippy::unwrap_used, missing_docs)]

mod harness;
mod support;

use common::{ConsumerKind, GroupId, Offset, Op, ReplicaId};
use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use common::simnet::NetworkFaults;
use consensus::decode_manifest;
use consensus::vsr::{Config as VsrConfig, TimeoutConfig};
use consensus::{ArtifactKind, ArtifactProgress, append_chunk, next_pending_chunk};
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::state_transfer::{
    BuildBudget, BuildClock, ChunkAnswer, ChunkRefusal, ChunkRequest, ConsumerOffsetsWire,
    HashRound, OfferBuilder, OfferServer, OfferServerConfig, PartitionOffer,
    PartitionTransferUnavailable as U, Planned, SegmentLoadError,
};
use partitions::{ClientOp, InMemoryNetwork, Partition, PartitionConfig, RetentionPolicy};
use storage::BatchBuilder;
use storage::fs::{EIO, FaultKind, Fs, SimFs};
use support::{Node, config, dir, fresh_fs, open};

const SEGMENT_BYTES: u64 = 64 * 1024;

/// A clock that advances `ns_per_byte` per byte hashed and counts them.
#[derive(Default)]
struct ByteClock {
    now_ns: Cell<u64>,
    ns_per_byte: u64,
    hashed: Cell<u64>,
}

impl ByteClock {
    fn new(ns_per_byte: u64) -> Self {
        Self {
            ns_per_byte,
            ..Self::default()
        }
    }
}

impl BuildClock for ByteClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.get())
    }

    fn observe_hashed(&self, bytes: u64) {
        self.now_ns
            .set(self.now_ns.get() + bytes * self.ns_per_byte);
        self.hashed.set(self.hashed.get() + bytes);
    }
}

fn small_segments() -> PartitionConfig {
    let mut c = config();
    c.log.segment_size_bytes = SEGMENT_BYTES;
    c
}

/// A batch of `n` messages of `size` bytes each.
fn big_batch(tag: u64, n: u32, size: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(tag);
    for i in 0..n {
        let payload = vec![(tag as u8) ^ (i as u8); size];
        b.push(u128::from(tag) << 32 | u128::from(i), i, &payload, b"");
    }
    b.build()
}

/// A single replica holding `batches` batches of about 17 KiB (about four
/// per 64 KiB segment), two consumer offsets and one group offset.
fn populated(seed: u64, batches: u64) -> (SimFs, Node<MemSuperblock>) {
    let fs = fresh_fs(seed);
    let mut node = open(&fs, MemSuperblock::new(), small_segments());
    for tag in 0..batches {
        node.request(ClientOp::Append(big_batch(tag + 1, 16, 1024)));
        node.now_us += 1_000;
    }
    node.store(ConsumerKind::Consumer, 1, 5);
    node.store(ConsumerKind::Consumer, 9, 20);
    node.store(ConsumerKind::ConsumerGroup, 4, 7);
    (fs, node)
}

fn build(
    node: &mut Node<MemSuperblock>,
    builder: &mut OfferBuilder,
) -> Result<Rc<PartitionOffer>, U> {
    block_on(
        node.partition
            .build_state_transfer_offer(builder, &ByteClock::new(1)),
    )
}

fn unlimited() -> OfferBuilder {
    OfferBuilder::new(BuildBudget::bytes(u64::MAX))
}

#[test]
fn given_multi_segment_partition_when_offer_built_should_describe_disk_bytes_and_durable_offsets() {
    let (fs, mut node) = populated(1, 14);
    let offer = build(&mut node, &mut unlimited()).unwrap();
    let p = &node.partition;
    assert_eq!(offer.commit_op(), Op(p.replica().commit_min().0));
    let live: Vec<_> = p
        .log()
        .segments()
        .filter(|s| !s.is_empty())
        .copied()
        .collect();
    assert!(live.len() >= 3, "{} segments", live.len());
    assert_eq!(offer.segments().len(), live.len());
    for (offered, meta) in offer.segments().iter().zip(&live) {
        let on_disk = fs.contents(&offered.path).unwrap();
        let len = usize::try_from(offered.entry.len).unwrap();
        assert_eq!(
            offered.entry.kind,
            ArtifactKind::SegmentLog {
                base_offset: Offset(meta.start_offset)
            }
        );
        assert_eq!(offered.entry.len, meta.size_bytes);
        assert_eq!(on_disk.len(), len, "the offer covers the whole file");
        assert_eq!(
            offered.entry.checksum,
            consensus::state_artifact_checksum(&on_disk[..len])
        );
    }
    let manifest = decode_manifest(offer.encoded_manifest()).unwrap();
    assert_eq!(manifest, offer.manifest());
    let last = manifest.last().unwrap();
    assert_eq!(
        last.kind,
        ArtifactKind::ConsumerOffsets {
            commit_op: offer.commit_op()
        }
    );
    assert!(consensus::verify_state_artifact(
        last,
        offer.offsets_bytes()
    ));
    let wire = ConsumerOffsetsWire::decode(offer.offsets_bytes()).unwrap();
    assert_eq!(wire.next_offset, p.offset_frontier());
    assert_eq!(wire.purge_generation, p.purge_generation());
    assert_eq!(wire.consumers, vec![(1, Offset(5)), (9, Offset(20))]);
    assert_eq!(wire.groups, vec![(4, Offset(7))]);
    assert_eq!(wire.dedup, p.dedup_export());
    assert!(!wire.dedup.is_empty(), "client 1's watermark travels");
}

/// A primary writes every batch before its reply, so committed batches
/// wait unwritten only on a backup (below its flush thresholds) — and on
/// the primary such a backup becomes when the old one fails, before its
/// first reply. Its offer must cover them.
#[test]
fn given_unflushed_commits_on_a_new_primary_when_offer_built_should_flush_them_into_the_segments() {
    let mut c = harness::Cluster::new(2, 512);
    let old = c.primary();
    // The primary of the next view.
    let backup = (old + 1) % 3;
    c.replicas[usize::from(backup)]
        .as_mut()
        .unwrap()
        .set_flush_thresholds(u64::MAX, u64::MAX);
    c.replicas[usize::from(backup)]
        .as_mut()
        .unwrap()
        .set_record_interval(0);
    c.produce(6);
    c.converge();
    c.crash(old);
    for _ in 0..20_000 {
        let r = c.replica(backup).replica();
        if r.view() > 0
            && r.primary_index(r.view()).0 == backup
            && r.status() == consensus::vsr::Status::Normal
        {
            break;
        }
        c.step();
    }
    c.converge();
    assert_eq!(c.primary(), backup);
    let node = c.replicas[usize::from(backup)].as_mut().unwrap();
    assert!(node.unflushed_messages() > 0);
    let offer =
        block_on(node.build_state_transfer_offer(&mut unlimited(), &ByteClock::new(1))).unwrap();
    assert_eq!(node.unflushed_messages(), 0);
    let offered_end: u64 = offer.segments().iter().map(|s| s.entry.len).sum();
    let log_bytes: u64 = node.log().segments().map(|s| s.size_bytes).sum();
    assert_eq!(offered_end, log_bytes);
    assert_eq!(node.log().next_offset(), node.offset_frontier().0);
}

#[test]
fn given_nothing_committed_when_offer_asked_should_refuse_as_view_0_phantom() {
    let fs = fresh_fs(3);
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let mut partition = block_on(Partition::open(
        config(),
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(0)),
        MemSuperblock::new(),
    ))
    .unwrap();
    assert!(partition.replica().is_caught_up_primary());
    let refusal =
        block_on(partition.build_state_transfer_offer(&mut unlimited(), &ByteClock::new(1)))
            .unwrap_err();
    assert!(matches!(refusal, U::NothingCommitted), "{refusal}");
    assert!(refusal.transient());
}

#[test]
fn given_backup_replica_when_offer_asked_should_refuse_not_caught_up_primary() {
    let fs = fresh_fs(4);
    let net = InMemoryNetwork::new(1, 3, NetworkFaults::default());
    let mut partition = block_on(Partition::open(
        PartitionConfig::new(VsrConfig::new(ReplicaId(1), 3, GroupId(0))),
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(1)),
        MemSuperblock::new(),
    ))
    .unwrap();
    let refusal =
        block_on(partition.build_state_transfer_offer(&mut unlimited(), &ByteClock::new(1)))
            .unwrap_err();
    assert!(matches!(refusal, U::NotCaughtUpPrimary), "{refusal}");
}

#[test]
fn given_flush_failure_when_offer_asked_should_refuse_flush_failed() {
    let (fs, mut node) = populated(5, 2);
    node.request(ClientOp::Append(big_batch(50, 4, 100)));
    fs.fail_nth(FaultKind::Write, 1, EIO);
    let refusal = build(&mut node, &mut unlimited()).unwrap_err();
    assert!(matches!(refusal, U::FlushFailed(_)), "{refusal}");
    assert!(!refusal.transient());
}

/// Builds round by round until the offer is complete; returns it and the
/// `hashed` figure of every refused round.
fn build_in_rounds(
    node: &mut Node<MemSuperblock>,
    builder: &mut OfferBuilder,
    clock: &ByteClock,
) -> (Rc<PartitionOffer>, Vec<(u64, u64)>) {
    let mut progress = Vec::new();
    for _ in 0..10_000 {
        match block_on(node.partition.build_state_transfer_offer(builder, clock)) {
            Ok(offer) => return (offer, progress),
            Err(U::OfferBuildInProgress { hashed, remaining }) => {
                progress.push((hashed, remaining))
            }
            Err(other) => panic!("unexpected refusal: {other}"),
        }
    }
    panic!("the build never completed");
}

#[test]
fn given_byte_budget_below_chain_when_built_should_progress_in_rounds_and_keep_memos() {
    let (_fs, mut node) = populated(6, 14);
    let budget_bytes = 20 * 1024;
    let mut builder = OfferBuilder::new(BuildBudget::bytes(budget_bytes));
    let clock = ByteClock::new(1);
    let (offer, progress) = build_in_rounds(&mut node, &mut builder, &clock);
    let total: u64 = offer.segments().iter().map(|s| s.entry.len).sum();
    assert!(
        progress.len() as u64 >= total / budget_bytes - 1,
        "{progress:?}"
    );
    let mut last = 0;
    for &(hashed, remaining) in &progress {
        assert_eq!(hashed + remaining, total, "cumulative over the chain");
        assert!(hashed > last, "every round advances: {progress:?}");
        assert!(hashed - last <= budget_bytes, "a round stays in its budget");
        last = hashed;
    }
    // Every byte was read exactly once across the rounds: memos carried it.
    assert_eq!(clock.hashed.get(), total);
    let reference = build(&mut node, &mut unlimited()).unwrap();
    assert_eq!(offer.manifest(), reference.manifest());
}

#[test]
fn given_time_bound_when_built_should_stop_each_round_at_the_clock() {
    let (_fs, mut node) = populated(7, 14);
    let mut builder = OfferBuilder::new(BuildBudget {
        time_max: Some(Duration::from_micros(10)),
        bytes_max: u64::MAX,
    });
    // 1 ns per byte: 10 µs is 10,000 bytes, less than one segment.
    let clock = ByteClock::new(1);
    let (offer, progress) = build_in_rounds(&mut node, &mut builder, &clock);
    let total: u64 = offer.segments().iter().map(|s| s.entry.len).sum();
    let longest = offer.segments().iter().map(|s| s.entry.len).max().unwrap();
    // Every segment is one read here, so each round is exactly one read:
    // the bound stops a round at the first read that crosses it.
    assert_eq!(progress.len() + 1, offer.segments().len(), "{progress:?}");
    let mut last = 0;
    for &(hashed, _) in &progress {
        assert!(hashed - last <= longest, "{progress:?}");
        last = hashed;
    }
    assert_eq!(clock.hashed.get(), total);
}

#[test]
fn given_active_segment_growth_when_rebuilt_should_hash_only_the_growth() {
    let (_fs, mut node) = populated(8, 9);
    let mut builder = unlimited();
    let clock = ByteClock::new(1);
    let first = block_on(
        node.partition
            .build_state_transfer_offer(&mut builder, &clock),
    )
    .unwrap();
    let active_before = first.segments().last().unwrap().clone();
    let hashed_before = clock.hashed.get();
    node.request(ClientOp::Append(big_batch(77, 2, 64)));
    let second = block_on(
        node.partition
            .build_state_transfer_offer(&mut builder, &clock),
    )
    .unwrap();
    assert!(second.commit_op() > first.commit_op());
    let active_after = second.segments().last().unwrap();
    assert_eq!(
        active_after.identity, active_before.identity,
        "same active segment"
    );
    let growth = active_after.entry.len - active_before.entry.len;
    assert!(growth > 0);
    assert_eq!(
        clock.hashed.get() - hashed_before,
        growth,
        "only the delta is read"
    );
    assert_eq!(
        builder.memo_hashed_len(&active_after.identity),
        Some(active_after.entry.len)
    );
    let reference = build(&mut node, &mut unlimited()).unwrap();
    assert_eq!(second.manifest(), reference.manifest());
}

#[test]
fn given_retention_between_rounds_when_built_should_prune_memos_to_live_chain() {
    let (_fs, mut node) = populated(9, 14);
    let mut builder = OfferBuilder::new(BuildBudget::bytes(80 * 1024));
    let clock = ByteClock::new(1);
    let first_round = block_on(
        node.partition
            .build_state_transfer_offer(&mut builder, &clock),
    );
    assert!(matches!(first_round, Err(U::OfferBuildInProgress { .. })));
    let oldest = *builder.memoized().next().unwrap();
    let policy = RetentionPolicy {
        max_total_bytes: Some(1),
        segments_per_pass_max: 1,
        respect_group_offsets: false,
        ..RetentionPolicy::default()
    };
    let removed = block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    assert_eq!(removed.segments, 1);
    let (offer, _) = build_in_rounds(&mut node, &mut builder, &clock);
    assert!(
        builder.memo_hashed_len(&oldest).is_none(),
        "memo of a removed segment pruned"
    );
    assert!(offer.segments().iter().all(|s| s.identity != oldest));
    let live: Vec<_> = builder.memoized().copied().collect();
    let offered: Vec<_> = offer.segments().iter().map(|s| s.identity).collect();
    assert_eq!(live, offered);
}

#[test]
fn given_chain_changed_after_planning_when_hashed_or_finished_should_refuse_segment_set_changed() {
    let policy = RetentionPolicy {
        max_total_bytes: Some(1),
        segments_per_pass_max: 1,
        respect_group_offsets: false,
        ..RetentionPolicy::default()
    };
    // Removed before its bytes were read: the hash round finds it gone.
    let (fs, mut node) = populated(10, 14);
    let mut builder = unlimited();
    let Planned::Plan(plan) = block_on(node.partition.plan_state_transfer_offer(&builder)).unwrap()
    else {
        panic!("nothing cached yet");
    };
    block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    let refusal = block_on(builder.hash_round(&fs, plan, &ByteClock::new(1))).unwrap_err();
    assert!(matches!(refusal, U::SegmentSetChanged), "{refusal}");
    assert!(refusal.transient());

    // Removed after hashing: the re-validation catches it.
    let (fs, mut node) = populated(11, 14);
    let mut builder = unlimited();
    let Planned::Plan(plan) = block_on(node.partition.plan_state_transfer_offer(&builder)).unwrap()
    else {
        panic!("nothing cached yet");
    };
    let HashRound::Complete(hashed) =
        block_on(builder.hash_round(&fs, plan, &ByteClock::new(1))).unwrap()
    else {
        panic!("an unlimited round completes");
    };
    block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    let refusal = node
        .partition
        .finish_state_transfer_offer(&mut builder, hashed)
        .unwrap_err();
    assert!(matches!(refusal, U::SegmentSetChanged), "{refusal}");
}

#[test]
fn given_purge_between_rounds_when_built_should_drop_old_memos_and_offer_the_purged_state() {
    let (_fs, mut node) = populated(12, 10);
    let mut builder = OfferBuilder::new(BuildBudget::bytes(50 * 1024));
    let clock = ByteClock::new(1);
    assert!(
        block_on(
            node.partition
                .build_state_transfer_offer(&mut builder, &clock)
        )
        .is_err()
    );
    assert!(builder.memoized().count() > 0);
    node.request(ClientOp::Purge { generation: 1 });
    let (offer, _) = build_in_rounds(&mut node, &mut builder, &clock);
    assert_eq!(builder.memoized().count(), 0);
    assert!(offer.segments().is_empty());
    assert_eq!(offer.purge_generation(), 1);
    let wire = ConsumerOffsetsWire::decode(offer.offsets_bytes()).unwrap();
    assert_eq!((wire.purge_generation, wire.next_offset), (1, Offset(0)));
}

#[test]
fn given_cached_offer_when_retention_removed_a_segment_should_rebuild_not_serve_stale() {
    let (_fs, mut node) = populated(13, 14);
    let mut builder = unlimited();
    let first = build(&mut node, &mut builder).unwrap();
    let again = build(&mut node, &mut builder).unwrap();
    assert!(Rc::ptr_eq(&first, &again), "cached per commit_op");
    let policy = RetentionPolicy {
        max_total_bytes: Some(1),
        segments_per_pass_max: 1,
        respect_group_offsets: false,
        ..RetentionPolicy::default()
    };
    block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    let rebuilt = build(&mut node, &mut builder).unwrap();
    assert_eq!(rebuilt.commit_op(), first.commit_op());
    assert_eq!(rebuilt.segments().len() + 1, first.segments().len());
}

fn server(chunk_len_max_bytes: u32, repair_retry_ticks: u64) -> OfferServer {
    OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes,
        repair_retry_ticks,
        budget: BuildBudget::bytes(u64::MAX),
    })
}

fn offer_for(
    server: &mut OfferServer,
    node: &mut Node<MemSuperblock>,
    requester: u8,
    nonce: u128,
) -> Rc<PartitionOffer> {
    block_on(server.on_request_state_transfer(
        &mut node.partition,
        ReplicaId(requester),
        nonce,
        &ByteClock::new(1),
    ))
    .unwrap()
}

fn chunk(
    server: &mut OfferServer,
    fs: &SimFs,
    nonce: u128,
    artifact: u32,
    offset: u64,
    len: u32,
) -> ChunkAnswer {
    block_on(server.on_request_state_chunk(
        fs,
        ChunkRequest {
            requester: ReplicaId(2),
            nonce,
            artifact,
            offset,
            len,
        },
    ))
}

/// Pulls every artifact through the receiver's cursor.
fn pull_all(
    server: &mut OfferServer,
    fs: &SimFs,
    nonce: u128,
    offer: &PartitionOffer,
) -> Vec<ArtifactProgress> {
    let mut artifacts: Vec<ArtifactProgress> = offer
        .manifest()
        .into_iter()
        .map(ArtifactProgress::new)
        .collect();
    while let Some(next) = next_pending_chunk(&artifacts, 7_000) {
        let ChunkAnswer::Chunk(served) =
            chunk(server, fs, nonce, next.artifact, next.offset, next.len)
        else {
            panic!("no chunk for {next:?}");
        };
        assert!(
            served.payload.len() <= server.config().chunk_len_max_bytes as usize,
            "clamped to the server's chunk ceiling"
        );
        append_chunk(
            &mut artifacts,
            served.artifact,
            served.offset,
            &served.payload,
        )
        .unwrap();
    }
    artifacts
}

#[test]
fn given_offer_when_every_chunk_served_should_reassemble_byte_identical_artifacts() {
    let (fs, mut node) = populated(14, 14);
    let mut server = server(5_000, 10);
    let offer = offer_for(&mut server, &mut node, 2, 42);
    // The active segment grows after the build: the artifact stays the prefix.
    node.request(ClientOp::Append(big_batch(88, 2, 64)));
    block_on(node.partition.flush_committed_messages()).unwrap();
    let artifacts = pull_all(&mut server, &fs, 42, &offer);
    for (i, got) in artifacts.iter().enumerate() {
        assert!(
            consensus::verify_state_artifact(&got.entry, &got.buf),
            "artifact {i}"
        );
        match offer.segments().get(i) {
            Some(segment) => {
                let disk = fs.contents(&segment.path).unwrap();
                assert_eq!(got.buf, disk[..got.buf.len()]);
            }
            None => assert_eq!(got.buf, offer.offsets_bytes().to_vec()),
        }
    }
}

#[test]
fn given_out_of_range_requests_when_served_should_not_answer() {
    let (fs, mut node) = populated(15, 6);
    let mut server = server(5_000, 10);
    let offer = offer_for(&mut server, &mut node, 2, 7);
    let count = u32::try_from(offer.artifact_count()).unwrap();
    let first_len = offer.manifest()[0].len;
    let offsets_len = offer.manifest().last().unwrap().len;
    assert!(matches!(
        chunk(&mut server, &fs, 7, count, 0, 100),
        ChunkAnswer::Ignore
    ));
    assert!(matches!(
        chunk(&mut server, &fs, 7, u32::MAX, 0, 100),
        ChunkAnswer::Ignore
    ));
    assert!(matches!(
        chunk(&mut server, &fs, 7, 0, first_len, 100),
        ChunkAnswer::Ignore
    ));
    assert!(matches!(
        chunk(&mut server, &fs, 7, count - 1, offsets_len, 1),
        ChunkAnswer::Ignore
    ));
    assert!(matches!(
        chunk(&mut server, &fs, 7, 0, 0, 0),
        ChunkAnswer::Ignore
    ));
    // The tail of an artifact is served short, never past its end.
    let ChunkAnswer::Chunk(tail) = chunk(&mut server, &fs, 7, 0, first_len - 10, 100) else {
        panic!("tail not served");
    };
    assert_eq!(tail.payload.len(), 10);
    match chunk(&mut server, &fs, 8, 0, 0, 100) {
        ChunkAnswer::Refuse(refusal @ ChunkRefusal::UnknownSession) => assert!(refusal.transient()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn given_eio_on_served_segment_when_loaded_should_refuse_as_local_fault() {
    let (fs, mut node) = populated(16, 6);
    let mut server = server(5_000, 10);
    offer_for(&mut server, &mut node, 2, 5);
    fs.fail_nth(FaultKind::Read, 1, EIO);
    match chunk(&mut server, &fs, 5, 0, 0, 100) {
        ChunkAnswer::Refuse(
            refusal @ ChunkRefusal::SegmentLoad {
                error: SegmentLoadError::LocalFault(_),
                ..
            },
        ) => assert!(!refusal.transient(), "a dying disk is not transient"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.session_count(), 0, "the session is dropped");
}

#[test]
fn given_missing_segment_file_when_served_should_refuse_as_stale() {
    let (fs, mut node) = populated(17, 10);
    let mut server = server(5_000, 10);
    let offer = offer_for(&mut server, &mut node, 2, 5);
    let first = &offer.segments()[0];
    block_on(fs.remove_file(&first.path)).unwrap();
    match chunk(&mut server, &fs, 5, 0, 0, 100) {
        ChunkAnswer::Refuse(
            refusal @ ChunkRefusal::SegmentLoad {
                error: SegmentLoadError::Stale(_),
                ..
            },
        ) => assert!(refusal.transient()),
        other => panic!("{other:?}"),
    }
    assert!(server.builder().memo_hashed_len(&first.identity).is_none());
    assert!(
        server.builder().cached().is_none(),
        "the stale offer is not reused"
    );
}

#[test]
fn given_rotted_segment_when_served_should_refuse_checksum_mismatch() {
    let (fs, mut node) = populated(18, 6);
    let mut server = server(5_000, 10);
    let offer = offer_for(&mut server, &mut node, 2, 5);
    fs.rot_byte(&offer.segments()[0].path, 300, 0x10).unwrap();
    match chunk(&mut server, &fs, 5, 0, 0, 100) {
        ChunkAnswer::Refuse(ChunkRefusal::SegmentLoad {
            error: SegmentLoadError::ChecksumMismatch,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn given_same_nonce_when_asked_again_should_get_the_same_offer_never_a_rebuilt_one() {
    let (_fs, mut node) = populated(19, 6);
    let mut server = server(5_000, 10);
    let first = offer_for(&mut server, &mut node, 2, 100);
    node.request(ClientOp::Append(big_batch(66, 2, 64)));
    let retried = offer_for(&mut server, &mut node, 2, 100);
    assert!(Rc::ptr_eq(&first, &retried));
    let other_requester = offer_for(&mut server, &mut node, 1, 100);
    assert!(other_requester.commit_op() > first.commit_op());
    let fresh = offer_for(&mut server, &mut node, 2, 101);
    assert!(fresh.commit_op() > first.commit_op());
    assert!(
        server.session_offer(ReplicaId(2), 100).is_none(),
        "a new nonce replaces the old session"
    );
    assert_eq!(server.session_count(), 2);
}

#[test]
fn given_idle_offer_when_ticked_should_expire_sooner_once_fully_served() {
    let (fs, mut node) = populated(20, 3);
    let retry = 4;
    let mut server = server(1 << 20, retry);
    offer_for(&mut server, &mut node, 2, 1);
    for _ in 0..retry * 10 - 1 {
        server.on_tick();
    }
    assert!(server.session_offer(ReplicaId(2), 1).is_some());
    // A served chunk resets the idle count.
    assert!(matches!(
        chunk(&mut server, &fs, 1, 0, 0, 10),
        ChunkAnswer::Chunk(_)
    ));
    for _ in 0..retry * 10 - 1 {
        server.on_tick();
    }
    assert!(server.session_offer(ReplicaId(2), 1).is_some());
    server.on_tick();
    assert!(
        server.session_offer(ReplicaId(2), 1).is_none(),
        "expired after 10 retries idle"
    );
    assert!(server.builder().cached().is_none());

    let offer = offer_for(&mut server, &mut node, 2, 2);
    pull_all(&mut server, &fs, 2, &offer);
    for _ in 0..retry * 3 - 1 {
        server.on_tick();
    }
    assert!(server.session_offer(ReplicaId(2), 2).is_some());
    server.on_tick();
    assert!(
        server.session_offer(ReplicaId(2), 2).is_none(),
        "fully served: 3 retries of grace"
    );
}

/// ST-B1 (serve side): a 64 MiB offer is built in time-bounded rounds, and
/// another group on the same thread keeps ticking — and heartbeating — in
/// between. The thread is modelled on the build clock's virtual time (1 ns
/// per byte hashed): the other group is ticked once per 10 ms of it, and
/// only between build calls, as a shard loop would. A round that ran long
/// leaves the other group waiting that long for its tick, which the test
/// measures (it used to tick the other group five times per gap whatever
/// the round took, so starvation could not show).
#[test]
fn given_large_offer_built_in_rounds_when_driven_with_another_group_should_keep_its_ticks_flowing()
{
    let fs = fresh_fs(21);
    let mut c = config();
    c.log.segment_size_bytes = 16 * 1024 * 1024;
    let mut big = open(&fs, MemSuperblock::new(), c);
    for tag in 0..64 {
        big.request(ClientOp::Append(big_batch(tag + 1, 16, 64 * 1024)));
    }
    let mut vsr = VsrConfig::new(ReplicaId(0), 3, GroupId(0));
    vsr.timeouts = TimeoutConfig::scaled_down(10);
    let other_net = InMemoryNetwork::new(2, 3, NetworkFaults::default());
    let mut other = block_on(Partition::open(
        PartitionConfig::new(vsr),
        fs.clone(),
        Path::new("/data/other"),
        other_net.endpoint(ReplicaId(0)),
        MemSuperblock::new(),
    ))
    .unwrap();

    // 1 ns per byte and 10 ms per round: a round stops at the first 4 MiB
    // read that takes it past 10,000,000 bytes.
    let time_max = Duration::from_millis(10);
    let mut builder = OfferBuilder::new(BuildBudget {
        time_max: Some(time_max),
        bytes_max: u64::MAX,
    });
    let clock = ByteClock::new(1);
    let tick_ns = 10_000_000u64;
    let mut now_us = 1_000_000;
    let mut progress = Vec::new();
    let mut frames_per_gap = Vec::new();
    // Virtual time of the other group's last tick, and the longest it
    // waited for the next one.
    let mut ticked_at_ns = 0u64;
    let mut wait_max_ns = 0u64;
    let mut ticks = 0u64;
    let offer = loop {
        let round = block_on(
            big.partition
                .build_state_transfer_offer(&mut builder, &clock),
        );
        let now_ns = clock.now_ns.get();
        wait_max_ns = wait_max_ns.max(now_ns - ticked_at_ns);
        match round {
            Ok(offer) => break offer,
            Err(U::OfferBuildInProgress { hashed, .. }) => progress.push(hashed),
            Err(other) => panic!("{other}"),
        }
        // The ticks that fell due while the round ran, late by however
        // long it took; at least one per gap between calls.
        let (sent_before, _) = other_net.counts();
        let due = ((now_ns - ticked_at_ns) / tick_ns).max(1);
        for _ in 0..due {
            now_us += 10_000;
            block_on(other.on_tick(now_us)).unwrap();
            other_net.tick();
            ticks += 1;
        }
        ticked_at_ns = now_ns;
        frames_per_gap.push(other_net.counts().0 - sent_before);
    };
    // A round may overrun its 10 ms by one 4 MiB read; the other group
    // then waits at most that long for a tick.
    assert!(
        wait_max_ns <= tick_ns + (4 << 20),
        "the other group waited {wait_max_ns} ns for a tick (a tick is {tick_ns} ns)"
    );
    assert!(ticks >= 5, "{ticks} ticks of the other group");
    let total: u64 = offer.segments().iter().map(|s| s.entry.len).sum();
    assert!(total >= 64 << 20, "{total}");
    assert!(
        progress.len() >= 5,
        "a 64 MiB build took {} rounds",
        progress.len() + 1
    );
    let bound = u64::try_from(time_max.as_nanos()).unwrap();
    let mut last = 0;
    for &hashed in &progress {
        let round = hashed - last;
        assert!(
            (bound..bound + (4 << 20)).contains(&round),
            "round of {round} bytes: {progress:?}"
        );
        last = hashed;
    }
    // Ticked on time, it heartbeats at its own rate (every few ticks).
    assert!(
        frames_per_gap.iter().sum::<u64>() > 0,
        "the other group never heartbeat: {frames_per_gap:?}"
    );
    assert_eq!(clock.hashed.get(), total, "no byte hashed twice");
}

#[test]
fn given_each_gate_fact_when_checked_should_refuse_in_the_seed_order() {
    use partitions::state_transfer::{ServeGateFacts, check_serve_gate};
    let open = ServeGateFacts {
        caught_up_primary: true,
        backup_serving_its_primary: false,
        view_change_member_serving: false,
        dir_present: true,
        repairing: false,
        commit_max: Op(3),
        installed_frontier: None,
    };
    assert!(check_serve_gate(open).is_ok());
    let refuse = |facts| check_serve_gate(facts).unwrap_err();
    assert!(matches!(
        refuse(ServeGateFacts {
            caught_up_primary: false,
            dir_present: false,
            repairing: true,
            commit_max: Op(0),
            ..open
        }),
        U::NotCaughtUpPrimary
    ));
    assert!(matches!(
        refuse(ServeGateFacts {
            dir_present: false,
            repairing: true,
            commit_max: Op(0),
            ..open
        }),
        U::NoPartitionDir
    ));
    assert!(matches!(
        refuse(ServeGateFacts {
            repairing: true,
            commit_max: Op(0),
            ..open
        }),
        U::RepairInProgress
    ));
    assert!(matches!(
        refuse(ServeGateFacts {
            commit_max: Op(0),
            ..open
        }),
        U::NothingCommitted
    ));
    // A caught-up backup serves its view's primary (nobody else can), and
    // the other checks still apply to it.
    assert!(
        check_serve_gate(ServeGateFacts {
            caught_up_primary: false,
            backup_serving_its_primary: true,
            ..open
        })
        .is_ok()
    );
    assert!(matches!(
        refuse(ServeGateFacts {
            caught_up_primary: false,
            backup_serving_its_primary: true,
            repairing: true,
            ..open
        }),
        U::RepairInProgress
    ));
    // So does a caught-up member of a view change (no primary exists).
    assert!(
        check_serve_gate(ServeGateFacts {
            caught_up_primary: false,
            view_change_member_serving: true,
            ..open
        })
        .is_ok()
    );
    // An installed frontier makes an empty commit history legitimate.
    assert!(
        check_serve_gate(ServeGateFacts {
            commit_max: Op(0),
            installed_frontier: Some(Offset(40)),
            ..open
        })
        .is_ok()
    );
}

#[test]
fn given_offset_tables_past_ceiling_or_without_live_entry_when_snapshotted_should_refuse() {
    use partitions::state_transfer::snapshot_offset_tables;
    let (_fs, node) = populated(22, 2);
    let durable = node.partition.consumer_offsets().durable();
    let [consumers, groups] = snapshot_offset_tables(durable, |_, _| true, 2).unwrap();
    assert_eq!(
        (consumers, groups),
        (vec![(1, Offset(5)), (9, Offset(20))], vec![(4, Offset(7))])
    );
    match snapshot_offset_tables(durable, |_, _| true, 1).unwrap_err() {
        U::ConsumerOffsetsTooLarge { kind, count, max } => {
            assert_eq!((kind, count, max), (ConsumerKind::Consumer, 2, 1));
        }
        other => panic!("{other}"),
    }
    let missing = snapshot_offset_tables(
        durable,
        |kind, id| !(kind == ConsumerKind::ConsumerGroup && id == 4),
        2,
    )
    .unwrap_err();
    assert!(
        matches!(
            missing,
            U::ConsumerOffsetStateInconsistent {
                kind: ConsumerKind::ConsumerGroup,
                consumer_id: 4
            }
        ),
        "{missing}"
    );
    assert!(!missing.transient());
}

#[test]
fn given_eager_auto_commit_when_offer_built_should_ship_only_the_durable_offset() {
    use partitions::PollingStrategy;
    let (_fs, mut node) = populated(23, 2);
    // Advances consumer 1's live offset at once; the replicated store that
    // would make it durable is not committed yet.
    node.poll_as((ConsumerKind::Consumer, 1), PollingStrategy::Next, 10, true);
    assert!(node.partition.stored_offset(ConsumerKind::Consumer, 1) > Some(Offset(5)));
    let offer = build(&mut node, &mut unlimited()).unwrap();
    let wire = ConsumerOffsetsWire::decode(offer.offsets_bytes()).unwrap();
    assert!(
        wire.consumers.contains(&(1, Offset(5))),
        "{:?}",
        wire.consumers
    );
}

#[test]
fn given_eio_while_hashing_when_built_should_refuse_unreadable_and_resume_from_the_memo() {
    let (fs, mut node) = populated(24, 14);
    let mut builder = OfferBuilder::new(BuildBudget::bytes(100 * 1024));
    let clock = ByteClock::new(1);
    let first = block_on(
        node.partition
            .build_state_transfer_offer(&mut builder, &clock),
    );
    let Err(U::OfferBuildInProgress { hashed, .. }) = first else {
        panic!("{first:?}");
    };
    fs.fail_nth(FaultKind::Read, 1, EIO);
    let refusal = block_on(
        node.partition
            .build_state_transfer_offer(&mut builder, &clock),
    )
    .unwrap_err();
    assert!(
        matches!(refusal, U::SegmentUnreadable { .. }) && !refusal.transient(),
        "{refusal}"
    );
    let read_before_error = clock.hashed.get();
    assert_eq!(read_before_error, hashed, "the failed read fed nothing");
    let (offer, _) = build_in_rounds(&mut node, &mut builder, &clock);
    let total: u64 = offer.segments().iter().map(|s| s.entry.len).sum();
    assert_eq!(clock.hashed.get(), total, "resumed where the memo stood");
    let reference = build(&mut node, &mut unlimited()).unwrap();
    assert_eq!(offer.manifest(), reference.manifest());
}

#[test]
fn given_appends_between_plan_and_finish_when_built_should_offer_the_planned_prefix() {
    let (fs, mut node) = populated(25, 9);
    let mut builder = unlimited();
    let Planned::Plan(plan) = block_on(node.partition.plan_state_transfer_offer(&builder)).unwrap()
    else {
        panic!("nothing cached yet");
    };
    let planned_active = plan.segments().last().unwrap().clone();
    // The partition goes on committing while the plan is hashed.
    node.request(ClientOp::Append(big_batch(70, 2, 64)));
    block_on(node.partition.flush_committed_messages()).unwrap();
    let HashRound::Complete(hashed) =
        block_on(builder.hash_round(&fs, plan, &ByteClock::new(1))).unwrap()
    else {
        panic!("an unlimited round completes");
    };
    let offer = node
        .partition
        .finish_state_transfer_offer(&mut builder, hashed)
        .unwrap();
    assert!(offer.commit_op() < Op(node.partition.replica().commit_min().0));
    let active = offer.segments().last().unwrap();
    assert_eq!(active.entry.len, planned_active.len_bytes);
    let disk = fs.contents(&active.path).unwrap();
    assert!(
        disk.len() as u64 > active.entry.len,
        "the file grew past the offer"
    );
    assert_eq!(
        active.entry.checksum,
        consensus::state_artifact_checksum(&disk[..planned_active.len_bytes as usize])
    );
}

/// A 12 MiB segment, served: each chunk request reads at most one 4 MiB
/// read further, and bit rot past the first read is refused before the
/// artifact's last byte goes out.
#[test]
fn given_large_segment_when_served_should_load_it_a_read_at_a_time_and_verify_before_its_end() {
    let fs = fresh_fs(26);
    let mut c = config();
    c.log.segment_size_bytes = 12 * 1024 * 1024;
    let mut node = open(&fs, MemSuperblock::new(), c);
    for tag in 0..13 {
        node.request(ClientOp::Append(big_batch(tag + 1, 16, 64 * 1024)));
    }
    let mut server = server(256 * 1024, 10);
    let offer = offer_for(&mut server, &mut node, 2, 3);
    let first = offer.segments()[0].clone();
    assert!(first.entry.len > 12 << 20, "{}", first.entry.len);
    let read = 4 << 20;
    assert!(matches!(
        chunk(&mut server, &fs, 3, 0, 0, 256 * 1024),
        ChunkAnswer::Chunk(_)
    ));
    assert_eq!(server.loaded_artifact(ReplicaId(2), 3), Some((0, read)));
    // Rot a byte the next read will cover; chunks of the loaded prefix are
    // still served from memory.
    fs.rot_byte(&first.path, (read + 10) as u64, 0x01).unwrap();
    assert!(matches!(
        chunk(&mut server, &fs, 3, 0, 1 << 20, 256 * 1024),
        ChunkAnswer::Chunk(_)
    ));
    assert_eq!(server.loaded_artifact(ReplicaId(2), 3), Some((0, read)));
    let ChunkAnswer::Chunk(next) = chunk(&mut server, &fs, 3, 0, read as u64, 256 * 1024) else {
        panic!("the chunk past the first read is served");
    };
    assert_eq!(next.payload.len(), 256 * 1024);
    assert_eq!(server.loaded_artifact(ReplicaId(2), 3), Some((0, 2 * read)));
    // The request for the last chunk completes the load and the check.
    let last_offset = first.entry.len - 100;
    match chunk(&mut server, &fs, 3, 0, last_offset, 256 * 1024) {
        ChunkAnswer::Refuse(ChunkRefusal::SegmentLoad {
            error: SegmentLoadError::ChecksumMismatch,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(server.session_count(), 0);
}

/// A chain longer than the manifest can name (65,536 entries: one per
/// segment plus the offsets artifact) is refused before the manifest
/// encoder, which asserts its ceiling, ever sees it; one segment fewer
/// builds.
#[test]
fn given_chain_longer_than_a_manifest_when_offer_asked_should_refuse_manifest_too_large() {
    use consensus::STATE_MANIFEST_ENTRIES_MAX;
    let fs = fresh_fs(77);
    let mut c = config();
    // Every batch seals its segment.
    c.log.segment_size_bytes = 1;
    c.messages_required_to_save = 1;
    let mut node = open(&fs, MemSuperblock::new(), c);
    let fits = STATE_MANIFEST_ENTRIES_MAX - 1;
    for tag in 0..fits as u64 {
        node.produce(tag + 1, 1);
    }
    block_on(node.partition.flush_committed_messages()).unwrap();
    let segments = node
        .partition
        .log()
        .segments()
        .filter(|s| !s.is_empty())
        .count();
    assert_eq!(segments, fits);
    let offer = build(&mut node, &mut unlimited()).unwrap();
    assert_eq!(offer.artifact_count(), STATE_MANIFEST_ENTRIES_MAX);
    node.produce(u64::MAX, 1);
    block_on(node.partition.flush_committed_messages()).unwrap();
    let err = build(&mut node, &mut unlimited()).unwrap_err();
    assert!(
        matches!(
            err,
            U::ManifestTooLarge { entries, max }
                if entries == STATE_MANIFEST_ENTRIES_MAX + 1 && max == STATE_MANIFEST_ENTRIES_MAX
        ),
        "{err:?}"
    );
    assert!(!err.transient());
}

/// Chunks are served from the loaded 4 MiB blocks: a chunk inside one is a
/// slice of it, one straddling two is copied from both, and both are the
/// file's bytes.
#[test]
fn given_chunks_inside_and_across_read_blocks_when_served_should_be_the_files_bytes() {
    let fs = fresh_fs(27);
    let mut c = config();
    c.log.segment_size_bytes = 12 * 1024 * 1024;
    let mut node = open(&fs, MemSuperblock::new(), c);
    for tag in 0..13 {
        node.request(ClientOp::Append(big_batch(tag + 1, 16, 64 * 1024)));
    }
    let mut server = server(1024 * 1024, 10);
    let offer = offer_for(&mut server, &mut node, 2, 3);
    let first = offer.segments()[0].clone();
    let disk = fs.contents(&first.path).unwrap();
    let read: u64 = 4 << 20;
    let straddling = read - 300 * 1024;
    for (offset, len) in [
        (0, 1024 * 1024),
        (straddling, 1024 * 1024),
        (2 * read - 1, 2),
        (read + 17, 4096),
        (first.entry.len - 100, 1024 * 1024),
    ] {
        let ChunkAnswer::Chunk(served) = chunk(&mut server, &fs, 3, 0, offset, len) else {
            panic!("chunk at {offset} not served");
        };
        let end = (offset + u64::from(len)).min(first.entry.len) as usize;
        assert_eq!(served.payload.len(), end - offset as usize);
        assert!(
            served.payload[..] == disk[offset as usize..end],
            "chunk at {offset} differs from the file"
        );
    }
    let (index, loaded) = server.loaded_artifact(ReplicaId(2), 3).unwrap();
    assert_eq!((index, loaded as u64), (0, first.entry.len));
}

/// ST-B1 on the serve side: with loading bounded to one 4 MiB read per
/// call, a request deep into an artifact (a receiver resuming mid-artifact
/// in a new session) is answered `Loading`, and each `advance_loads` call
/// reads at most one block more until the chunk is served, byte for byte;
/// requests kept behind it are answered in order, and nothing else is
/// answered early.
#[test]
fn given_bounded_loading_when_a_request_lies_deep_in_the_artifact_should_serve_it_over_later_calls()
{
    let fs = fresh_fs(28);
    let mut c = config();
    c.log.segment_size_bytes = 16 * 1024 * 1024;
    let mut node = open(&fs, MemSuperblock::new(), c);
    for tag in 0..17 {
        node.request(ClientOp::Append(big_batch(tag + 1, 16, 64 * 1024)));
    }
    let mut server = server(256 * 1024, 10).with_load_blocks_per_call(1);
    let offer = offer_for(&mut server, &mut node, 2, 3);
    let first = offer.segments()[0].clone();
    let disk = fs.contents(&first.path).unwrap();
    let block: u64 = 4 << 20;
    assert!(
        first.entry.len > 3 * block + 256 * 1024,
        "{}",
        first.entry.len
    );
    let deep = 2 * block + 1000;
    assert!(matches!(
        chunk(&mut server, &fs, 3, 0, deep, 256 * 1024),
        ChunkAnswer::Loading
    ));
    // A second request behind it, a block further in: each call may load
    // for one of them only.
    let deeper = 3 * block + 1000;
    assert!(matches!(
        chunk(&mut server, &fs, 3, 0, deeper, 256 * 1024),
        ChunkAnswer::Loading
    ));
    let mut loaded_before = server.loaded_artifact(ReplicaId(2), 3).unwrap().1 as u64;
    assert!(loaded_before <= 2 * block, "{loaded_before}");
    let mut served = Vec::new();
    for _ in 0..10 {
        for (requester, nonce, answer) in block_on(server.advance_loads(&fs)) {
            assert_eq!((requester, nonce), (ReplicaId(2), 3));
            let ChunkAnswer::Chunk(c) = answer else {
                panic!("{answer:?}");
            };
            served.push(c);
        }
        let loaded = server.loaded_artifact(ReplicaId(2), 3).unwrap().1 as u64;
        assert!(loaded - loaded_before <= block, "read more than a block");
        loaded_before = loaded;
        if served.len() == 2 {
            break;
        }
    }
    assert_eq!(
        served.iter().map(|c| c.offset).collect::<Vec<_>>(),
        vec![deep, deeper]
    );
    for c in &served {
        let at = c.offset as usize;
        assert!(c.payload[..] == disk[at..at + c.payload.len()]);
    }
    // Nothing is left pending.
    assert!(block_on(server.advance_loads(&fs)).is_empty());
    // Unbounded (the default), the same request is served at once.
    let mut unbounded = self::server(256 * 1024, 10);
    offer_for(&mut unbounded, &mut node, 2, 4);
    assert!(matches!(
        chunk(&mut unbounded, &fs, 4, 0, deep, 256 * 1024),
        ChunkAnswer::Chunk(_)
    ));
}
