//! The receiving half of partition state transfer (SPEC §7 ST-R1..R4,
//! ST-B2, ST-C for the spill) on the simulated filesystem, driven against
//! the real serving half (`OfferServer`) in-process: full pulls, the
//! streaming memory bound, resume after an interruption, hostile peers,
//! reuse of staged files, backoff, and a crash at every step of a spill.
#![allow(clippy::unwrap_used, missing_docs)]

mod pump;
mod support;

use common::{ConsumerKind, GroupId, Offset, Op, ReplicaId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use consensus::encode_manifest;
use consensus::header::StateTransferTargetHeader;
use consensus::{ArtifactKind, ChunkProgress, ChunkRejection, StateArtifact, artifact_kind};
use futures::executor::block_on;
use journal::{FileSuperblock, MemSuperblock, SuperblockStore};
use partitions::state_transfer::{
    BuildBudget, BuildClock, ChunkAnswer, ChunkRequest, ConsumerOffsetsWire, DescriptorRefusal,
    IgnoreReason, LocalFacts, OfferHeaderRefusal, OfferServer, OfferServerConfig, PendingRearm,
    ReceiveError, ReceiveStep, ReceivedTransfer, ReceiverConfig, SegmentWalkError, SpillConfig,
    SpillError, TransferBackoff, TransferReceiver, TransferRequest, rotate_peer,
    walk_segment_payload,
};
use partitions::{ClientOp, PartitionConfig, PollingStrategy};
use pump::{Ended, Hooks, Serving, complete, failed, pump, serve_chunk};
use storage::BatchBuilder;
use storage::fs::{Fs, SimFs};
use support::{Node, config, dir, fresh_fs, open};

/// The receiver's replica index in every test; the servers are 0 and 1.
const ME: u8 = 2;

struct NoClock;

impl BuildClock for NoClock {
    fn now(&self) -> Duration {
        Duration::ZERO
    }

    fn observe_hashed(&self, _bytes: u64) {}
}

/// A batch of `n` messages of `size` bytes.
fn big_batch(tag: u64, n: u32, size: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(tag);
    for i in 0..n {
        let payload = vec![(tag as u8) ^ (i as u8); size];
        b.push(u128::from(tag) << 32 | u128::from(i), i, &payload, b"");
    }
    b.build()
}

/// The serving peer: a single-replica partition and its offer server.
struct Peer {
    fs: SimFs,
    node: Node<MemSuperblock>,
    server: OfferServer,
}

impl Peer {
    /// `batches` batches of `n × size` bytes in segments of
    /// `segment_bytes`, plus three consumer offsets.
    fn new(seed: u64, segment_bytes: u64, batches: u64, n: u32, size: usize) -> Self {
        let fs = fresh_fs(seed);
        let mut c = config();
        c.log.segment_size_bytes = segment_bytes;
        let mut node = open(&fs, MemSuperblock::new(), c);
        for tag in 0..batches {
            node.request(ClientOp::Append(big_batch(tag + 1, n, size)));
            node.now_us += 1_000;
        }
        node.store(ConsumerKind::Consumer, 1, 5);
        node.store(ConsumerKind::Consumer, 9, 20);
        node.store(ConsumerKind::ConsumerGroup, 4, 7);
        // The offer flushes the committed prefix first; flushing here lets
        // a test read the segments the offer will describe.
        block_on(node.partition.flush_committed_messages()).unwrap();
        Self {
            fs,
            node,
            server: server(),
        }
    }

    fn segment_logs(&self) -> Vec<(u64, Vec<u8>)> {
        self.node
            .partition
            .log()
            .segments()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let path = dir().join(storage::log_file_name(s.start_offset));
                (s.start_offset, self.fs.contents(&path).unwrap())
            })
            .collect()
    }
}

fn server() -> OfferServer {
    OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 256 * 1024,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    })
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

fn receiver_config(chunk: u32, sync_interval_bytes: u64) -> ReceiverConfig {
    ReceiverConfig {
        chunk_len_max_bytes: chunk,
        repair_retry_ticks: 10,
        spill: SpillConfig {
            sync_interval_bytes,
            rehash_slice_bytes: 64 * 1024,
        },
        ..ReceiverConfig::default()
    }
}

/// The receiving replica: its own partition (with data of its own) and
/// its filesystem.
fn receiver_fs(seed: u64) -> (SimFs, Node<MemSuperblock>) {
    let fs = fresh_fs(seed);
    let mut node = open(&fs, MemSuperblock::new(), config());
    for tag in 0..3 {
        node.produce(100 + tag, 4);
    }
    block_on(node.partition.flush_committed_messages()).unwrap();
    (fs, node)
}

/// Every non-staging file of the partition directory with its contents.
fn live_files(fs: &SimFs) -> BTreeMap<String, Vec<u8>> {
    block_on(fs.read_dir(&dir()))
        .unwrap()
        .into_iter()
        .filter_map(|e| e.name_str().map(str::to_owned))
        .filter(|n| !n.ends_with(".staging"))
        .filter(|n| fs.contents(&dir().join(n)).is_ok())
        .map(|n| {
            let bytes = fs.contents(&dir().join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

fn staging_files(fs: &SimFs) -> Vec<String> {
    let mut names: Vec<String> = block_on(fs.read_dir(&dir()))
        .unwrap()
        .into_iter()
        .filter_map(|e| e.name_str().map(str::to_owned))
        .filter(|n| n.ends_with(".staging"))
        .collect();
    names.sort();
    names
}

/// Serves `request` and every request that follows from `peer`.
fn drive(
    rx: &mut TransferReceiver<SimFs>,
    peer: &mut Peer,
    peer_id: u8,
    request: TransferRequest,
    facts: &LocalFacts,
    hooks: &Hooks<'_>,
) -> Ended {
    let serving = Serving {
        id: peer_id,
        partition: &mut peer.node.partition,
        fs: &peer.fs,
        server: &mut peer.server,
    };
    pump(rx, serving, ME, request, facts, hooks)
}

/// Arms `rx` at peer 0 and pulls its whole offer, which must complete.
fn pull_all(rx: &mut TransferReceiver<SimFs>, peer: &mut Peer) -> Box<ReceivedTransfer> {
    let first = rx.arm(ReplicaId(0));
    complete(drive(rx, peer, 0, first, &local(), &Hooks::default()))
}

/// One tick: the request it sends, `None` when it sends nothing.
fn tick(rx: &mut TransferReceiver<SimFs>, facts: &LocalFacts) -> Option<TransferRequest> {
    match block_on(rx.on_tick(facts)) {
        ReceiveStep::Send(request) => Some(request),
        ReceiveStep::Wait => None,
        other => panic!("tick: {other:?}"),
    }
}

/// Checks staged files against the peer's segments: byte-identical logs,
/// indexes as a fresh walk rebuilds them, metadata from the walk.
fn assert_staged_match(fs: &SimFs, done: &ReceivedTransfer, peer: &Peer) {
    let logs = peer.segment_logs();
    assert_eq!(done.staged.len(), logs.len());
    for (meta, (base, bytes)) in done.staged.iter().zip(&logs) {
        assert_eq!(meta.start_offset, Offset(*base));
        assert_eq!(meta.size_bytes, bytes.len() as u64);
        let staged = fs.contents(&meta.log_staging).unwrap();
        assert!(
            staged == *bytes,
            "staged log {base} differs from the peer's"
        );
        let (stats, index) = walk_segment_payload(*base, bytes).unwrap();
        assert_eq!(fs.contents(&meta.index_staging).unwrap(), index);
        assert_eq!(meta.index_size_bytes, index.len() as u64);
        assert_eq!(meta.end_offset, stats.end_offset);
        assert_eq!(meta.max_timestamp, stats.max_timestamp);
        assert_eq!(
            meta.log_staging,
            dir().join(format!("{base:020}.log.staging"))
        );
    }
}

#[test]
fn given_multi_segment_peer_when_pulled_should_stage_byte_identical_logs_and_rebuilt_indexes() {
    let mut peer = Peer::new(1, 64 * 1024, 14, 16, 1024);
    let (fs, node) = receiver_fs(2);
    let before = live_files(&fs);
    let mut rx =
        TransferReceiver::new(fs.clone(), &dir(), receiver_config(16 * 1024, 32 * 1024), 7);
    let done = pull_all(&mut rx, &mut peer);
    assert!(done.staged.len() >= 3, "{} segments", done.staged.len());
    assert_staged_match(&fs, &done, &peer);
    assert_eq!(
        done.offsets.consumers,
        vec![(1, Offset(5)), (9, Offset(20))]
    );
    assert_eq!(done.offsets.groups, vec![(4, Offset(7))]);
    let served = peer
        .server
        .builder()
        .cached()
        .unwrap()
        .offsets_bytes()
        .to_vec();
    assert_eq!(done.offsets_bytes, served);
    assert_eq!(
        done.offsets.next_offset,
        peer.node.partition.offset_frontier()
    );
    assert_eq!(
        done.descriptor.commit_op,
        Op(peer.node.partition.replica().commit_min().0)
    );
    assert!(rx.session().is_none());
    // Nothing but staging files changed on the receiver.
    assert_eq!(live_files(&fs), before);
    drop(node);
    // Everything staged is durable: a crash keeps every staged byte.
    fs.crash();
    assert_staged_match(&fs, &done, &peer);
}

#[test]
fn given_64_mib_segment_when_streamed_should_hold_at_most_four_chunks() {
    // 256 batches of 16 × 16 KiB: one 64 MiB segment (and a small tail).
    let mut peer = Peer::new(3, 80 << 20, 256, 16, 16 * 1024);
    let logs = peer.segment_logs();
    assert!(logs[0].1.len() >= 64 << 20, "{}", logs[0].1.len());
    let (fs, _node) = receiver_fs(4);
    let chunk = 256 * 1024;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(chunk, 8 << 20), 9);
    let done = pull_all(&mut rx, &mut peer);
    assert_staged_match(&fs, &done, &peer);
    let peak = rx.stats().peak_held_bytes;
    eprintln!(
        "peak receiver buffer: {peak} bytes ({:.2} chunks) over {} bytes",
        peak as f64 / f64::from(chunk),
        rx.stats().chunk_bytes
    );
    assert!(peak <= 4 * u64::from(chunk), "peak {peak}");
    assert!(rx.stats().chunk_bytes >= 64 << 20);
}

#[test]
fn given_batches_larger_than_a_chunk_when_streamed_should_hold_a_chunk_and_a_header() {
    // 5 batches of 16 × 98,235 B (1,572,784 B each; the messages are
    // larger than a chunk too) in one segment, pulled in 64 KiB chunks:
    // every batch and every message straddles a chunk boundary, and the
    // sizes are chosen so that three batch headers (80, 160 and 240 bytes
    // before a boundary) and four frame headers are cut by one as well.
    let mut peer = Peer::new(11, 16 << 20, 5, 16, 98_235);
    let logs = peer.segment_logs();
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].1.len(), 5 * 1_572_784);
    let (fs, _node) = receiver_fs(12);
    let chunk: u32 = 64 * 1024;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(chunk, 1 << 20), 13);
    let done = pull_all(&mut rx, &mut peer);
    // Byte-identical log, index as a fresh whole walk rebuilds it.
    assert_staged_match(&fs, &done, &peer);
    let peak = rx.stats().peak_held_bytes;
    eprintln!(
        "peak receiver buffer: {peak} bytes ({:.3} chunks) over {} bytes in batches of {} bytes",
        peak as f64 / f64::from(chunk),
        rx.stats().chunk_bytes,
        logs[0].1.len() / 5
    );
    // ST-B2: at most four chunks. In fact a chunk plus the part of a batch
    // header the walk carries across a boundary (240 bytes here), never a
    // batch (the whole-batch carry peaked at a chunk plus 1.5 MB).
    assert!(peak <= 4 * u64::from(chunk), "peak {peak}");
    assert_eq!(peak, u64::from(chunk) + 240);
}

#[test]
fn given_interruption_at_90_percent_when_new_session_pulls_should_fetch_only_missing_chunks() {
    // Three segments of about 1 MiB, synced every 128 KiB, 32 KiB chunks.
    let mut peer = Peer::new(5, 1 << 20, 66, 16, 4 * 1024);
    let logs = peer.segment_logs();
    assert!(logs.len() >= 3);
    let (fs, _node) = receiver_fs(6);
    let chunk = 32 * 1024;
    let sync = 128 * 1024;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(chunk, sync), 11);
    let target = 1u32;
    let target_len = logs[1].1.len() as u64;
    let cut_at = target_len * 9 / 10;
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { artifact, offset, .. } if *artifact == target && *offset >= cut_at);
    let first = rx.arm(ReplicaId(0));
    let hooks = Hooks {
        cut: Some(&cut),
        ..Hooks::default()
    };
    let Ended::Cut(TransferRequest::Chunk {
        offset: stopped, ..
    }) = drive(&mut rx, &mut peer, 0, first, &local(), &hooks)
    else {
        panic!("not cut");
    };
    // A new session, new nonce, another peer serving the same state.
    let mut other = Peer {
        fs: peer.fs.clone(),
        node: peer.node,
        server: server(),
    };
    let requests_before = rx.stats().chunk_requests;
    let second = rx.arm(ReplicaId(1));
    let point = rx.resume_point().unwrap();
    assert_eq!(point.entry.kind.wire_frontier(), logs[1].0);
    assert_eq!(point.synced_len_bytes, stopped / sync * sync);
    assert!(point.synced_len_bytes >= target_len * 8 / 10);
    let done = complete(drive(
        &mut rx,
        &mut other,
        1,
        second,
        &local(),
        &Hooks::default(),
    ));
    let requests = rx.stats().chunk_requests - requests_before;
    let missing_target = (target_len - point.synced_len_bytes).div_ceil(u64::from(chunk));
    let later: u64 = logs[2..]
        .iter()
        .map(|(_, b)| (b.len() as u64).div_ceil(u64::from(chunk)))
        .sum::<u64>()
        + done
            .descriptor
            .manifest
            .last()
            .unwrap()
            .len
            .div_ceil(u64::from(chunk));
    eprintln!(
        "re-pull after a cut at {stopped}/{target_len}: {requests} chunk requests ({missing_target} of the cut segment, {later} later)"
    );
    assert_eq!(requests, missing_target + later);
    assert_eq!(rx.stats().resumed_spills, 1);
    assert_eq!(rx.stats().reuse_scans, 1, "the second accept hit the memo");
    assert_staged_match(&fs, &done, &other);
}

#[test]
fn given_staged_files_from_an_earlier_attempt_when_offer_accepted_should_adopt_matches_and_sweep_others()
 {
    let mut peer = Peer::new(7, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(8);
    let cfg = receiver_config(16 * 1024, 32 * 1024);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), cfg, 13);
    let done = pull_all(&mut rx, &mut peer);
    let segments = done.staged.len();
    // A stray, a staged log with one byte changed, an orphan index.
    let stray = dir().join("00000000000000999999.log.staging");
    block_on(write(&fs, &stray, b"stray"));
    let orphan = dir().join("00000000000000888888.index.staging");
    block_on(write(&fs, &orphan, b"orphan"));
    let rotted = &done.staged[1];
    fs.rot_byte(&rotted.log_staging, 100, 0x10).unwrap();

    // A fresh receiver (no memo): adopts all but the rotted one.
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), cfg, 14);
    let again = pull_all(&mut rx, &mut peer);
    assert_eq!(rx.stats().adopted_segments, segments as u64 - 1);
    assert_eq!(rx.stats().reuse_scans, 1);
    let rotted_chunks = rotted.size_bytes.div_ceil(16 * 1024);
    let offsets_chunks = 1;
    assert_eq!(rx.stats().chunk_requests, rotted_chunks + offsets_chunks);
    assert_staged_match(&fs, &again, &peer);
    let mut expected: Vec<String> = again
        .staged
        .iter()
        .flat_map(|m| [&m.index_staging, &m.log_staging])
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    expected.sort();
    assert_eq!(staging_files(&fs), expected, "strays swept");

    // The same segments offered again: the memo answers, no rescan.
    let third = pull_all(&mut rx, &mut peer);
    assert_eq!(rx.stats().reuse_scans, 1);
    assert_eq!(third.staged, again.staged);
}

async fn write(fs: &SimFs, path: &Path, bytes: &[u8]) {
    use storage::fs::{FsFile, OpenOptions};
    let f = fs
        .open(path, OpenOptions::create_read_write().truncate(true))
        .await
        .unwrap();
    f.write_all_at(bytes.to_vec(), 0).await.0.unwrap();
    f.sync_data().await.unwrap();
}

/// Runs a hostile exchange and checks that it leaves nothing staged and
/// the partition's live files untouched.
fn hostile(seed: u64, facts: LocalFacts, hooks: &Hooks<'_>) -> ReceiveError {
    let mut peer = Peer::new(seed, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(seed + 1);
    let before = live_files(&fs);
    let mut rx = TransferReceiver::new(
        fs.clone(),
        &dir(),
        receiver_config(16 * 1024, 32 * 1024),
        seed,
    );
    let first = rx.arm(ReplicaId(0));
    let error = failed(drive(&mut rx, &mut peer, 0, first, &facts, hooks));
    assert!(
        staging_files(&fs).is_empty(),
        "{error}: {:?}",
        staging_files(&fs)
    );
    assert_eq!(rx.resume_point(), None);
    assert_eq!(live_files(&fs), before, "{error}");
    assert!(rx.session().is_none());
    assert_eq!(rx.backoff().failures, 1, "{error} is charged");
    error
}

#[test]
fn given_wrong_manifest_checksum_when_segment_completes_should_refuse_and_sweep() {
    let tamper = |mut m: Vec<StateArtifact>| {
        m[1].checksum ^= 1;
        m
    };
    let error = hostile(
        20,
        local(),
        &Hooks {
            manifest: Some(&tamper),
            ..Hooks::default()
        },
    );
    assert!(matches!(
        error,
        ReceiveError::Spill(SpillError::ManifestChecksum { .. })
    ));
}

/// A stamped batch of `count` messages at `base`.
fn stamped(base: u64, count: u32, timestamp: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new(timestamp);
    for i in 0..count {
        b.push(u128::from(i) + 1, 0, &[base as u8; 200], b"");
    }
    let mut bytes = b.build();
    storage::stamp(&mut bytes, 3, base, timestamp, u64::MAX).unwrap();
    bytes
}

/// Replaces the first segment artifact's bytes with `forged` (same length,
/// so the cursor accepts it) and the manifest entry with one that matches
/// them, so only the walk can object.
fn forge_first_segment(seed: u64, forged_batches: &[(u64, u32)]) -> ReceiveError {
    let peer = Peer::new(seed, 64 * 1024, 14, 16, 1024);
    let real = peer.segment_logs()[0].1.clone();
    let mut forged = Vec::new();
    for &(base, count) in forged_batches {
        forged.extend(stamped(base, count, 5));
    }
    assert!(forged.len() < real.len());
    forged.resize(real.len(), 0);
    let forged = Bytes::from(forged);
    let entry = StateArtifact::for_bytes(
        ArtifactKind::SegmentLog {
            base_offset: Offset(0),
        },
        &forged,
    );
    let manifest = move |mut m: Vec<StateArtifact>| {
        m[0] = entry;
        m
    };
    let forged_chunk = {
        let forged = forged.clone();
        move |artifact: u32, offset: u64, payload: Bytes| {
            if artifact == 0 {
                let at = usize::try_from(offset).unwrap();
                forged.slice(at..at + payload.len())
            } else {
                payload
            }
        }
    };
    drop(peer);
    hostile(
        seed,
        local(),
        &Hooks {
            manifest: Some(&manifest),
            chunk: Some(&forged_chunk),
            ..Hooks::default()
        },
    )
}

#[test]
fn given_offsets_artifact_not_matching_its_entry_when_completed_should_refuse_and_sweep() {
    let tamper = |mut m: Vec<StateArtifact>| {
        m.last_mut().unwrap().checksum ^= 1;
        m
    };
    let error = hostile(
        22,
        local(),
        &Hooks {
            manifest: Some(&tamper),
            ..Hooks::default()
        },
    );
    assert!(matches!(error, ReceiveError::OffsetsChecksum), "{error}");
}

#[test]
fn given_torn_write_mid_spill_when_next_session_resumes_should_cut_the_unsynced_tail() {
    let mut peer = Peer::new(24, 1 << 20, 20, 16, 4 * 1024);
    let (fs, _node) = receiver_fs(25);
    let chunk = 32 * 1024;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(chunk, 128 * 1024), 29);
    let mut facts = local();
    facts.primary = ReplicaId(1);
    let first = rx.arm(ReplicaId(0));
    // Ten chunks land (synced at 128 KiB and 256 KiB), the eleventh write
    // tears after 1 KiB and fails.
    let torn = |r: &TransferRequest| {
        if matches!(r, TransferRequest::Chunk { artifact: 0, offset, .. } if *offset == 10 * 32 * 1024)
        {
            fs.tear_nth_write(1, 1024);
        }
        false
    };
    let error = failed(drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &facts,
        &Hooks {
            cut: Some(&torn),
            ..Hooks::default()
        },
    ));
    assert!(
        matches!(error, ReceiveError::Spill(SpillError::StagingIo { .. })),
        "{error}"
    );
    assert_eq!(rx.backoff().failures, 1, "a local fault is charged");
    let point = rx.resume_point().unwrap();
    assert_eq!(point.synced_len_bytes, 256 * 1024);
    let rearm = rx.pending_rearm().unwrap();
    assert_eq!(rearm.peer, ReplicaId(1), "rotated to the primary");
    let mut again = None;
    for _ in 0..rearm.after_ticks {
        again = tick(&mut rx, &facts);
    }
    // Peer 1 serves the same state.
    let mut other = Peer {
        fs: peer.fs.clone(),
        node: peer.node,
        server: server(),
    };
    let done = complete(drive(
        &mut rx,
        &mut other,
        1,
        again.unwrap(),
        &facts,
        &Hooks::default(),
    ));
    assert_eq!(rx.stats().resumed_bytes, 256 * 1024);
    assert_staged_match(&fs, &done, &other);
}

#[test]
fn given_hole_duplicate_or_gap_in_a_segment_when_walked_should_refuse_with_the_walk_error() {
    // A hole: 0..3 then 5.
    assert!(matches!(
        forge_first_segment(30, &[(0, 3), (5, 3)]),
        ReceiveError::Spill(SpillError::Walk(SegmentWalkError::NonContiguous {
            expected: 3,
            actual: 5
        }))
    ));
    // A duplicate base offset.
    assert!(matches!(
        forge_first_segment(32, &[(0, 3), (0, 3)]),
        ReceiveError::Spill(SpillError::Walk(SegmentWalkError::NonContiguous {
            expected: 3,
            actual: 0
        }))
    ));
    // The first batch not at the declared base offset.
    assert!(matches!(
        forge_first_segment(34, &[(1, 3)]),
        ReceiveError::Spill(SpillError::Walk(
            SegmentWalkError::BaseOffsetMismatch { .. }
        ))
    ));
    // Valid batches then zero padding: not a batch header.
    assert!(matches!(
        forge_first_segment(36, &[(0, 3), (3, 3)]),
        ReceiveError::Spill(SpillError::Walk(SegmentWalkError::Batch { .. }))
    ));
}

#[test]
fn given_chunk_running_past_its_artifact_when_received_should_be_refused_by_the_cursor() {
    let mut peer = Peer::new(40, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(41);
    let mut rx =
        TransferReceiver::new(fs.clone(), &dir(), receiver_config(16 * 1024, 32 * 1024), 3);
    let first = rx.arm(ReplicaId(0));
    let len0 = peer.segment_logs()[0].1.len() as u64;
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { artifact: 0, offset, len, .. } if *offset + u64::from(*len) == len0);
    let Ended::Cut(TransferRequest::Chunk {
        nonce, offset, len, ..
    }) = drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &Hooks {
            cut: Some(&cut),
            ..Hooks::default()
        },
    )
    else {
        panic!("not cut");
    };
    let received = rx.stats().chunk_bytes;
    let long = Bytes::from(vec![0u8; len as usize + 1]);
    let step = block_on(rx.on_chunk(0, nonce, 0, offset, long, &local()));
    assert!(matches!(
        step,
        ReceiveStep::Ignored(IgnoreReason::Chunk(ChunkRejection::Overrun { .. }))
    ));
    // A duplicate of an earlier chunk and an empty one change nothing either.
    let dup = Bytes::from(vec![0u8; 16]);
    assert!(matches!(
        block_on(rx.on_chunk(0, nonce, 0, 0, dup, &local())),
        ReceiveStep::Ignored(IgnoreReason::Chunk(ChunkRejection::WrongOffset { .. }))
    ));
    assert!(matches!(
        block_on(rx.on_chunk(0, nonce, 0, offset, Bytes::new(), &local())),
        ReceiveStep::Ignored(IgnoreReason::Chunk(ChunkRejection::EmptyPayload))
    ));
    assert_eq!(rx.stats().chunk_bytes, received);
    assert!(rx.session().is_some(), "the session goes on");
}

fn refused_at_accept(seed: u64, facts: LocalFacts, hooks: &Hooks<'_>) -> DescriptorRefusal {
    match hostile(seed, facts, hooks) {
        ReceiveError::Descriptor(refusal) => refusal,
        other => panic!("{other}"),
    }
}

/// A manifest rewrite and what its refusal at accept must be.
type RefusalCase = (
    &'static str,
    fn(Vec<StateArtifact>) -> Vec<StateArtifact>,
    fn(&DescriptorRefusal) -> bool,
);

#[test]
fn given_manifest_past_caps_or_with_unknown_kinds_when_offered_should_refuse_at_accept() {
    let cases: [RefusalCase; 10] = [
        (
            "a segment past the cap",
            |mut m| {
                m[0].len = (1 << 30) + (64 << 20) + 1;
                m
            },
            |r| matches!(r, DescriptorRefusal::SegmentTooLarge { index: 0, .. }),
        ),
        (
            "an offsets artifact past the cap",
            |mut m| {
                m.last_mut().unwrap().len = (32 << 20) + 1;
                m
            },
            |r| matches!(r, DescriptorRefusal::OffsetsTooLarge { .. }),
        ),
        (
            "a total past the cap",
            |m| {
                let last = *m.last().unwrap();
                let mut out: Vec<StateArtifact> = (0..1_100u64)
                    .map(|i| StateArtifact {
                        kind: ArtifactKind::SegmentLog {
                            base_offset: Offset(i * 1_000),
                        },
                        len: 1 << 30,
                        checksum: 0,
                    })
                    .collect();
                out.push(last);
                out
            },
            |r| matches!(r, DescriptorRefusal::TotalTooLarge { .. }),
        ),
        (
            "an unknown kind",
            |mut m| {
                m[1].kind = ArtifactKind::Unknown {
                    code: 7,
                    frontier: m[1].kind.wire_frontier(),
                };
                m
            },
            |r| matches!(r, DescriptorRefusal::UnknownKind { index: 1, kind: 7 }),
        ),
        (
            "a metadata snapshot in a partition's offer",
            |mut m| {
                m[0].kind = ArtifactKind::from_wire(
                    artifact_kind::METADATA_SNAPSHOT,
                    m[0].kind.wire_frontier(),
                );
                m
            },
            |r| matches!(r, DescriptorRefusal::UnknownKind { index: 0, .. }),
        ),
        (
            "no offsets artifact",
            |mut m| {
                m.pop();
                m
            },
            |r| matches!(r, DescriptorRefusal::OffsetsArtifactMisplaced { count: 0 }),
        ),
        (
            "the offsets artifact first",
            |mut m| {
                m.rotate_right(1);
                m
            },
            |r| matches!(r, DescriptorRefusal::OffsetsArtifactMisplaced { count: 1 }),
        ),
        (
            "two offsets artifacts",
            |mut m| {
                let last = *m.last().unwrap();
                m.push(last);
                m
            },
            |r| matches!(r, DescriptorRefusal::OffsetsArtifactMisplaced { count: 2 }),
        ),
        (
            // They would share a staging file.
            "two segments at one base offset",
            |mut m| {
                m[1].kind = m[0].kind;
                m
            },
            |r| matches!(r, DescriptorRefusal::SegmentsNotAscending { index: 1, .. }),
        ),
        (
            "an empty manifest",
            |_| Vec::new(),
            |r| matches!(r, DescriptorRefusal::OffsetsArtifactMisplaced { count: 0 }),
        ),
    ];
    for (name, rewrite, expected) in cases {
        let hooks = Hooks {
            manifest: Some(&rewrite),
            ..Hooks::default()
        };
        let refusal = refused_at_accept(50, local(), &hooks);
        assert!(expected(&refusal), "{name}: {refusal:?}");
    }
}

#[test]
fn given_undecodable_manifest_when_offered_should_refuse_at_accept() {
    let (fs, _node) = receiver_fs(55);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), ReceiverConfig::default(), 1);
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
        unreachable!()
    };
    let header = StateTransferTargetHeader {
        nonce,
        commit_op: Op(5),
        group: GroupId(0),
        available: true,
        unavailable_transient: false,
        commit_max: Op(5),
    };
    let step = block_on(rx.on_target(0, 0, &header, b"ISM1 not a manifest", &local()));
    assert!(matches!(
        step,
        ReceiveStep::Failed(ReceiveError::Descriptor(DescriptorRefusal::Manifest(_)))
    ));
    assert!(staging_files(&fs).is_empty());
}

#[test]
fn given_offer_from_a_peer_behind_when_offered_should_refuse_stale() {
    let mut ahead = local();
    ahead.view = 3;
    assert!(matches!(
        refused_at_accept(
            60,
            ahead,
            &Hooks {
                view: 2,
                ..Hooks::default()
            }
        ),
        DescriptorRefusal::Header(OfferHeaderRefusal::ViewBehind {
            offer_view: 2,
            local_view: 3
        })
    ));
    let mut ahead = local();
    ahead.commit_max = Op(1_000);
    assert!(matches!(
        refused_at_accept(60, ahead, &Hooks::default()),
        DescriptorRefusal::Header(OfferHeaderRefusal::CommitMaxBehind {
            local_commit_max: 1_000,
            ..
        })
    ));
    assert!(matches!(
        refused_at_accept(
            60,
            local(),
            &Hooks {
                commit_max_delta: -1,
                ..Hooks::default()
            }
        ),
        DescriptorRefusal::Header(OfferHeaderRefusal::CommitOpPastCommitMax { .. })
    ));
}

#[test]
fn given_offer_built_before_a_purge_applied_here_when_received_should_refuse_and_sweep() {
    let mut purged = local();
    purged.purge_generation = 4;
    let error = hostile(70, purged, &Hooks::default());
    assert!(
        matches!(
            error,
            ReceiveError::OfferBeforePurge {
                offered: 0,
                local: 4
            }
        ),
        "{error}"
    );
}

#[test]
fn given_duplicate_descriptor_or_foreign_frames_when_received_should_ignore_them() {
    let mut peer = Peer::new(80, 64 * 1024, 6, 16, 1024);
    let (fs, _node) = receiver_fs(81);
    let mut rx =
        TransferReceiver::new(fs.clone(), &dir(), receiver_config(16 * 1024, 32 * 1024), 5);
    let first = rx.arm(ReplicaId(0));
    let stop = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { .. });
    let Ended::Cut(TransferRequest::Chunk { nonce, .. }) = drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &Hooks {
            cut: Some(&stop),
            ..Hooks::default()
        },
    ) else {
        panic!()
    };
    let header = StateTransferTargetHeader {
        nonce,
        commit_op: Op(1),
        group: GroupId(0),
        available: true,
        unavailable_transient: false,
        commit_max: Op(1),
    };
    let body = encode_manifest(&[]);
    assert!(matches!(
        block_on(rx.on_target(0, 0, &header, &body, &local())),
        ReceiveStep::Ignored(IgnoreReason::DuplicateDescriptor)
    ));
    let other = StateTransferTargetHeader {
        nonce: nonce ^ 1,
        ..header
    };
    assert!(matches!(
        block_on(rx.on_target(0, 0, &other, &body, &local())),
        ReceiveStep::Ignored(IgnoreReason::NotThisSession)
    ));
    assert!(matches!(
        block_on(rx.on_chunk(1, nonce, 0, 0, Bytes::from_static(b"x"), &local())),
        ReceiveStep::Ignored(IgnoreReason::NotThisSession)
    ));
    assert!(rx.session().unwrap().accepted().is_some());
}

#[test]
fn given_consecutive_failures_when_backing_off_should_double_up_to_1024_times_the_base() {
    let mut b = TransferBackoff::default();
    assert_eq!(b.delay_ticks(100), 100);
    for (failures, factor) in [(1, 2), (2, 4), (5, 32), (10, 1024), (11, 1024), (40, 1024)] {
        b.failures = failures;
        assert_eq!(b.delay_ticks(100), 100 * factor, "{failures}");
    }
    b.failures = u32::MAX;
    assert_eq!(b.delay_ticks(u64::MAX), u64::MAX, "saturates");
    assert_eq!(b.delay_ticks(0), 1024, "a zero base is clamped to one tick");
}

#[test]
fn given_failed_peer_when_rotating_should_prefer_primary_else_walk_the_ring_skipping_self() {
    let facts = |replica, primary, count| LocalFacts {
        replica: ReplicaId(replica),
        replica_count: count,
        primary: ReplicaId(primary),
        ..local()
    };
    // (this replica, the primary, replicas, the peer that failed, the next
    // peer, why)
    for (me, primary, count, failed, next, why) in [
        (2, 0, 3, 1, 0, "the primary"),
        (2, 0, 3, 0, 1, "primary failed: next in ring"),
        (2, 2, 3, 0, 1, "self is primary"),
        (2, 2, 3, 1, 0, "ring wraps, skipping self"),
        (0, 0, 5, 4, 1, "wraps past self at 0"),
        (1, 0, 2, 0, 0, "only one other replica"),
    ] {
        assert_eq!(
            rotate_peer(&facts(me, primary, count), ReplicaId(failed)),
            ReplicaId(next),
            "{why}"
        );
    }
}

fn unavailable(nonce: u128, transient: bool) -> StateTransferTargetHeader {
    StateTransferTargetHeader {
        nonce,
        commit_op: Op(0),
        group: GroupId(0),
        available: false,
        unavailable_transient: transient,
        commit_max: Op(0),
    }
}

#[test]
fn given_refusals_when_received_should_charge_faults_only_and_rearm_after_the_backoff() {
    let (fs, _node) = receiver_fs(90);
    let cfg = receiver_config(16 * 1024, 32 * 1024);
    let mut rx = TransferReceiver::new(fs, &dir(), cfg, 17);
    let mut facts = local();
    facts.primary = ReplicaId(1);
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(1)) else {
        unreachable!()
    };
    // Transient: flat base delay, nothing charged. Refused by the primary,
    // the next attempt goes round to another replica (which may serve
    // while no view forms); refused by that one, back to the primary.
    let mut nonce = nonce;
    for (refuser, next, refusals) in [(1, 0, 1), (0, 1, 2)] {
        let step = block_on(rx.on_target(refuser, 0, &unavailable(nonce, true), &[], &facts));
        assert!(matches!(
            step,
            ReceiveStep::Failed(ReceiveError::PeerUnavailable { transient: true })
        ));
        assert_eq!(rx.backoff().failures, 0);
        assert_eq!(rx.backoff().refusals, refusals);
        assert_eq!(
            rx.pending_rearm(),
            Some(PendingRearm {
                peer: ReplicaId(next),
                after_ticks: 10
            })
        );
        for _ in 0..9 {
            assert_eq!(tick(&mut rx, &facts), None);
        }
        let Some(TransferRequest::Descriptor { peer, nonce: n }) = tick(&mut rx, &facts) else {
            panic!("re-armed on the tenth tick");
        };
        assert_eq!(peer, ReplicaId(next));
        nonce = n;
    }
    // Faults: charged, rotated past the failed primary, doubling.
    let mut expected = 10;
    let mut peer = 1;
    for failures in 1..=12u32 {
        let step = block_on(rx.on_target(peer, 0, &unavailable(nonce, false), &[], &facts));
        assert!(matches!(
            step,
            ReceiveStep::Failed(ReceiveError::PeerUnavailable { transient: false })
        ));
        expected = (expected * 2).min(10 * 1024);
        assert_eq!(rx.backoff().failures, failures);
        let rearm = rx.pending_rearm().unwrap();
        assert_eq!(rearm.after_ticks, expected, "failure {failures}");
        assert_eq!(
            rearm.peer,
            ReplicaId(if peer == 1 { 0 } else { 1 }),
            "rotated"
        );
        let mut armed = None;
        for _ in 0..rearm.after_ticks {
            assert!(armed.is_none());
            armed = tick(&mut rx, &facts);
        }
        let Some(TransferRequest::Descriptor { peer: p, nonce: n }) = armed else {
            panic!("no re-arm")
        };
        assert_ne!(n, nonce, "fresh nonce");
        (peer, nonce) = (p.0, n);
    }
    rx.record_install_completed();
    assert_eq!(rx.backoff(), TransferBackoff::default());
}

#[test]
fn given_silent_peer_when_ticked_should_re_request_then_fail_after_the_stall_budget() {
    let mut peer = Peer::new(95, 64 * 1024, 6, 16, 1024);
    let (fs, _node) = receiver_fs(96);
    let cfg = receiver_config(16 * 1024, 16 * 1024);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), cfg, 19);
    let facts = local();
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
        unreachable!()
    };
    // No descriptor yet: the same nonce is asked again every 10 ticks.
    for _ in 0..9 {
        assert_eq!(tick(&mut rx, &facts), None);
    }
    assert_eq!(
        tick(&mut rx, &facts),
        Some(TransferRequest::Descriptor {
            peer: ReplicaId(0),
            nonce
        })
    );
    // Accept, then lose the chunk: the pending chunk is asked again.
    let stop =
        |r: &TransferRequest| matches!(r, TransferRequest::Chunk { offset, .. } if *offset > 0);
    let Ended::Cut(pending) = drive(
        &mut rx,
        &mut peer,
        0,
        TransferRequest::Descriptor {
            peer: ReplicaId(0),
            nonce,
        },
        &facts,
        &Hooks {
            cut: Some(&stop),
            ..Hooks::default()
        },
    ) else {
        panic!()
    };
    assert_eq!(
        rx.session().unwrap().stall_attempts,
        0,
        "progress resets it"
    );
    for round in 1..=5 {
        for _ in 0..9 {
            assert_eq!(tick(&mut rx, &facts), None);
        }
        assert_eq!(tick(&mut rx, &facts), Some(pending), "round {round}");
    }
    for _ in 0..9 {
        assert_eq!(tick(&mut rx, &facts), None);
    }
    assert!(matches!(
        block_on(rx.on_tick(&facts)),
        ReceiveStep::Failed(ReceiveError::Stalled { attempts: 6 })
    ));
    assert!(rx.session().is_none(), "stall budget spent");
    assert_eq!(rx.backoff().failures, 1);
    assert_eq!(
        rx.pending_rearm(),
        Some(PendingRearm {
            peer: ReplicaId(1),
            after_ticks: 20
        })
    );
    // The synced prefix of the interrupted spill is kept for a resume.
    assert!(rx.resume_point().is_some());
    assert!(!staging_files(&fs).is_empty());
}

type FileNode = Node<FileSuperblock<SimFs>>;

fn crash_config() -> PartitionConfig {
    let mut c = config();
    c.messages_required_to_save = 1;
    c
}

fn boot(fs: &SimFs) -> FileNode {
    open(fs, FileSuperblock::new(fs.clone(), &dir()), crash_config())
}

fn poll_all<S: SuperblockStore>(node: &Node<S>) -> Vec<(u64, Vec<u8>)> {
    support::contents(&node.poll(PollingStrategy::Offset(0), 1_000))
}

#[test]
fn given_power_cut_at_every_step_of_a_spill_when_rebooted_should_sweep_staging_and_keep_old_state()
{
    let mut peer = Peer::new(100, 32 * 1024, 8, 16, 1024);
    let mut completed_at = None;
    for n in 0u64.. {
        let fs = fresh_fs(200 + n);
        let mut node = boot(&fs);
        for tag in 0..3 {
            node.produce(500 + tag, 4);
        }
        block_on(node.partition.flush_committed_messages()).unwrap();
        let logs_before: BTreeMap<_, _> = live_files(&fs)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".log") || name.ends_with(".index"))
            .collect();
        let polled_before = poll_all(&node);
        let mut rx =
            TransferReceiver::new(fs.clone(), &dir(), receiver_config(8 * 1024, 16 * 1024), n);
        let first = rx.arm(ReplicaId(0));
        fs.cut_power_after(n);
        let ended = drive(&mut rx, &mut peer, 0, first, &local(), &Hooks::default());
        let done = matches!(ended, Ended::Step(ReceiveStep::Complete(_)));
        if !done {
            assert!(
                matches!(
                    ended,
                    Ended::Step(ReceiveStep::Failed(ReceiveError::Spill(
                        SpillError::StagingIo { .. }
                    )))
                ),
                "step {n}"
            );
        }
        fs.clear_faults();
        drop(rx);
        drop(node);
        fs.crash();
        let rebooted = boot(&fs);
        assert!(
            staging_files(&fs).is_empty(),
            "step {n}: boot sweeps staging"
        );
        let logs_after: BTreeMap<_, _> = live_files(&fs)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".log") || name.ends_with(".index"))
            .collect();
        assert_eq!(logs_after, logs_before, "step {n}");
        assert_eq!(poll_all(&rebooted), polled_before, "step {n}");
        if done {
            completed_at = Some(n);
            break;
        }
        assert!(n < 400, "the pull never completed");
    }
    let steps = completed_at.unwrap();
    eprintln!(
        "a spill of {} segments takes {steps} fs calls",
        peer.segment_logs().len()
    );
    assert!(steps > 10);
}

#[test]
fn given_resume_point_when_staged_prefix_rotted_should_pull_the_segment_whole() {
    let mut peer = Peer::new(110, 1 << 20, 20, 16, 4 * 1024);
    let (fs, _node) = receiver_fs(111);
    let chunk = 32 * 1024;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(chunk, 64 * 1024), 23);
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { artifact: 0, offset, .. } if *offset >= 512 * 1024);
    let first = rx.arm(ReplicaId(0));
    let Ended::Cut(_) = drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &Hooks {
            cut: Some(&cut),
            ..Hooks::default()
        },
    ) else {
        panic!()
    };
    let second = rx.arm(ReplicaId(0));
    let point = rx.resume_point().unwrap();
    assert!(point.synced_len_bytes >= 448 * 1024);
    let staged: PathBuf = dir().join(format!(
        "{:020}.log.staging",
        point.entry.kind.wire_frontier()
    ));
    fs.rot_byte(&staged, 1_000, 0x04).unwrap();
    let done = complete(drive(
        &mut rx,
        &mut peer,
        0,
        second,
        &local(),
        &Hooks::default(),
    ));
    assert_eq!(
        rx.stats().resumed_spills,
        0,
        "the rotted prefix is not built on"
    );
    assert_staged_match(&fs, &done, &peer);
    let _ = ConsumerOffsetsWire::default();
}

#[test]
fn given_staged_files_and_small_prepare_budget_when_offer_accepted_should_reread_them_over_many_ticks()
 {
    let mut peer = Peer::new(120, 256 * 1024, 40, 16, 1024);
    let (fs, _node) = receiver_fs(121);
    let cfg = receiver_config(32 * 1024, 64 * 1024);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), cfg, 31);
    let done = pull_all(&mut rx, &mut peer);
    let staged_bytes: u64 = done.staged.iter().map(|m| m.size_bytes).sum();
    assert!(staged_bytes > 512 * 1024, "{staged_bytes}");

    // A fresh receiver re-reads every staged log, 64 KiB per call.
    let budget = 64 * 1024;
    let mut rx = TransferReceiver::new(
        fs.clone(),
        &dir(),
        ReceiverConfig {
            prepare_budget_bytes: budget,
            ..cfg
        },
        32,
    );
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
        unreachable!()
    };
    let offer = block_on(peer.server.on_request_state_transfer(
        &mut peer.node.partition,
        ReplicaId(ME),
        nonce,
        &NoClock,
    ))
    .unwrap();
    let header = StateTransferTargetHeader {
        nonce,
        commit_op: offer.commit_op(),
        group: GroupId(0),
        available: true,
        unavailable_transient: false,
        commit_max: Op(peer.node.partition.replica().commit_max().0),
    };
    let step = block_on(rx.on_target(0, 0, &header, offer.encoded_manifest(), &local()));
    assert!(matches!(step, ReceiveStep::Wait), "{step:?}");
    assert!(rx.session().unwrap().descriptor_accepted());
    let mut ticks = 1;
    let request = loop {
        if let Some(request) = tick(&mut rx, &local()) {
            break request;
        }
        ticks += 1;
    };
    let stats = rx.stats();
    assert_eq!(stats.rehashed_bytes, staged_bytes);
    assert!(
        stats.rehashed_bytes_max_per_call <= budget,
        "{}",
        stats.rehashed_bytes_max_per_call
    );
    assert!(ticks >= staged_bytes / budget, "{ticks} calls");
    assert_eq!(stats.adopted_segments, done.staged.len() as u64);
    // Only the offsets artifact is left to pull.
    let again = complete(drive(
        &mut rx,
        &mut peer,
        0,
        request,
        &local(),
        &Hooks::default(),
    ));
    assert_eq!(rx.stats().chunk_requests, 1);
    assert_eq!(again.staged, done.staged);
}

#[test]
fn given_partition_when_facts_taken_should_report_its_replica_view_commit_and_purge_generation() {
    let (_fs, node) = receiver_fs(130);
    let facts = LocalFacts::of(&node.partition);
    let replica = node.partition.replica();
    assert_eq!(
        facts,
        LocalFacts {
            replica: ReplicaId(0),
            replica_count: 1,
            view: replica.view(),
            primary: ReplicaId(replica.primary_index(replica.view()).0),
            commit_max: replica.commit_max(),
            purge_generation: node.partition.purge_generation(),
        }
    );
    assert!(facts.commit_max > Op(0));
}

/// A chunk answer on its way to the receiver: `(nonce, artifact, offset,
/// payload)`.
type Answer = (u128, u32, u64, Bytes);

/// Serves `first` (a descriptor request) and then, in rounds, every chunk
/// request out, handing each round's answers to `deliver`, which may
/// reorder, duplicate or drop them. Requests come from every step and from
/// `fill_window` after it; with nothing out, ticks until the stall
/// re-request.
fn drive_window(
    rx: &mut TransferReceiver<SimFs>,
    peer: &mut Peer,
    peer_id: u8,
    first: TransferRequest,
    facts: &LocalFacts,
    deliver: &mut dyn FnMut(Vec<Answer>) -> Vec<Answer>,
) -> Ended {
    let mut out = Vec::new();
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { .. });
    match drive(
        rx,
        peer,
        peer_id,
        first,
        facts,
        &Hooks {
            cut: Some(&cut),
            ..Hooks::default()
        },
    ) {
        Ended::Cut(request) => out.push(request),
        ended @ Ended::Step(_) => return ended,
    }
    out.extend(rx.fill_window());
    let mut ticks = 0;
    loop {
        if out.is_empty() {
            ticks += 1;
            assert!(ticks < 10_000, "no re-request");
            match block_on(rx.on_tick(facts)) {
                ReceiveStep::Send(request) => {
                    out.push(request);
                    out.extend(rx.fill_window());
                }
                ReceiveStep::Wait => {}
                other => return Ended::Step(other),
            }
            continue;
        }
        let mut answers = Vec::new();
        for request in std::mem::take(&mut out) {
            let TransferRequest::Chunk { nonce, .. } = request else {
                panic!("{request:?}");
            };
            let chunk = serve_chunk(&mut peer.server, &peer.fs, ME, &request);
            answers.push((nonce, chunk.artifact, chunk.offset, chunk.payload));
        }
        for (nonce, artifact, offset, payload) in deliver(answers) {
            match block_on(rx.on_chunk(peer_id, nonce, artifact, offset, payload, facts)) {
                ReceiveStep::Send(next) => out.push(next),
                ReceiveStep::Wait | ReceiveStep::Ignored(_) => {}
                other => return Ended::Step(other),
            }
            out.extend(rx.fill_window());
        }
    }
}

fn window_config(window: u32) -> ReceiverConfig {
    ReceiverConfig {
        chunks_in_flight: window,
        ..receiver_config(16 * 1024, 32 * 1024)
    }
}

/// Bytes of every artifact the peer offers.
fn offered_bytes(peer: &Peer) -> u64 {
    peer.server
        .builder()
        .cached()
        .unwrap()
        .manifest()
        .iter()
        .map(|e| e.len)
        .sum()
}

#[test]
fn given_window_of_8_when_each_round_of_answers_arrives_reversed_should_hold_early_chunks_and_stage_identical_logs()
 {
    // Segments of ~4 chunks: every window spans artifact boundaries.
    let mut peer = Peer::new(1, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(2);
    let window = 8;
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), window_config(window), 7);
    let first = rx.arm(ReplicaId(0));
    let mut rounds = 0;
    let mut widest = 0;
    let done = complete(drive_window(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &mut |mut answers| {
            rounds += 1;
            widest = widest.max(answers.len());
            answers.reverse();
            answers
        },
    ));
    assert_staged_match(&fs, &done, &peer);
    assert_eq!(
        done.offsets.consumers,
        vec![(1, Offset(5)), (9, Offset(20))]
    );
    let stats = rx.stats();
    // Every byte pulled once, each chunk asked for once: nothing reordered
    // was dropped and re-requested.
    let total = offered_bytes(&peer);
    assert_eq!(stats.chunk_bytes, total);
    let chunks: u64 = peer
        .server
        .builder()
        .cached()
        .unwrap()
        .manifest()
        .iter()
        .map(|e| e.len.div_ceil(16 * 1024))
        .sum();
    assert_eq!(stats.chunk_requests, chunks);
    assert!(widest >= window as usize, "widest round {widest}");
    assert!(
        rounds < chunks as usize,
        "{rounds} rounds for {chunks} chunks"
    );
    // Held chunks are bounded by the window.
    assert!(
        stats.peak_held_bytes <= u64::from(window) * 16 * 1024 + 20 * 1024,
        "peak {}",
        stats.peak_held_bytes
    );
}

#[test]
fn given_window_when_every_answer_arrives_twice_should_land_each_byte_once() {
    let mut peer = Peer::new(1, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(2);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), window_config(4), 7);
    let first = rx.arm(ReplicaId(0));
    let done = complete(drive_window(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &mut |answers| {
            let mut twice = answers.clone();
            // A late copy of each round after it, one interleaved.
            twice.extend(answers.into_iter().rev());
            twice
        },
    ));
    assert_staged_match(&fs, &done, &peer);
    assert_eq!(rx.stats().chunk_bytes, offered_bytes(&peer));
}

#[test]
fn given_window_when_an_answer_is_lost_should_re_request_from_the_cursor_and_complete() {
    let mut peer = Peer::new(1, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(2);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), window_config(6), 7);
    let first = rx.arm(ReplicaId(0));
    let mut lost = Vec::new();
    let done = complete(drive_window(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &mut |answers| {
            // The first answer for artifact 1 at 16 KiB is lost, and so is
            // the first one at the start of artifact 2 (the window's
            // cursor and a chunk ahead of it).
            answers
                .into_iter()
                .filter(|&(_, artifact, offset, _)| {
                    let drop = (artifact, offset) == (1, 16 * 1024) || (artifact, offset) == (2, 0);
                    if drop && !lost.contains(&(artifact, offset)) {
                        lost.push((artifact, offset));
                        return false;
                    }
                    true
                })
                .collect()
        },
    ));
    assert_eq!(lost, vec![(1, 16 * 1024), (2, 0)]);
    assert_staged_match(&fs, &done, &peer);
    assert_eq!(rx.stats().chunk_bytes, offered_bytes(&peer));
}

#[test]
fn given_window_when_chunk_arrives_unrequested_or_past_the_hold_bound_should_ignore_it() {
    let mut peer = Peer::new(1, 64 * 1024, 14, 16, 1024);
    let (fs, _node) = receiver_fs(2);
    let facts = local();
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), window_config(3), 7);
    let first = rx.arm(ReplicaId(0));
    let cut = |r: &TransferRequest| matches!(r, TransferRequest::Chunk { .. });
    let Ended::Cut(TransferRequest::Chunk { nonce, .. }) = drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &facts,
        &Hooks {
            cut: Some(&cut),
            ..Hooks::default()
        },
    ) else {
        panic!("no chunk request");
    };
    // Three requests out: (0, 0), (0, 16 KiB), (0, 32 KiB).
    let more = rx.fill_window();
    assert_eq!(more.len(), 2, "{more:?}");
    assert!(rx.fill_window().is_empty());
    let serve = |peer: &mut Peer, offset: u64| {
        let ChunkAnswer::Chunk(chunk) = block_on(peer.server.on_request_state_chunk(
            &peer.fs,
            ChunkRequest {
                requester: ReplicaId(ME),
                nonce,
                artifact: 0,
                offset,
                len: 16 * 1024,
            },
        )) else {
            panic!("not served");
        };
        chunk.payload
    };
    let kib16 = 16 * 1024;
    // Past the frontier: never requested, ignored.
    let unrequested = serve(&mut peer, 3 * kib16);
    assert!(matches!(
        block_on(rx.on_chunk(0, nonce, 0, 3 * kib16, unrequested, &facts)),
        ReceiveStep::Ignored(IgnoreReason::Chunk(ChunkRejection::WrongOffset { .. }))
    ));
    // Ahead of the cursor within the window: held (and its slot reused).
    let ahead = serve(&mut peer, 2 * kib16);
    let step = block_on(rx.on_chunk(0, nonce, 0, 2 * kib16, ahead.clone(), &facts));
    assert!(matches!(step, ReceiveStep::Send(_)), "{step:?}");
    // The same chunk again: not held twice.
    assert!(matches!(
        block_on(rx.on_chunk(0, nonce, 0, 2 * kib16, ahead, &facts)),
        ReceiveStep::Ignored(_)
    ));
    // The cursor's chunk lands; the held one waits for the bytes before it.
    let at_cursor = serve(&mut peer, 0);
    let step = block_on(rx.on_chunk(0, nonce, 0, 0, at_cursor, &facts));
    assert!(matches!(step, ReceiveStep::Send(_)), "{step:?}");
    let received = |rx: &TransferReceiver<SimFs>| {
        rx.session()
            .and_then(|s| s.accepted())
            .map(|a| a.artifacts[0].received_len())
            .unwrap()
    };
    assert_eq!(rx.stats().chunk_bytes, kib16);
    assert_eq!(received(&rx), kib16);
    // The missing one lands, and the held one right after it.
    let missing = serve(&mut peer, kib16);
    let step = block_on(rx.on_chunk(0, nonce, 0, kib16, missing, &facts));
    assert!(matches!(step, ReceiveStep::Send(_)), "{step:?}");
    assert_eq!(rx.stats().chunk_bytes, 3 * kib16);
    assert_eq!(received(&rx), 3 * kib16);
}

#[test]
fn given_window_when_cut_at_90_percent_and_stalled_should_resume_from_the_last_sync() {
    // Three segments of about 1 MiB, synced every 128 KiB, 32 KiB chunks,
    // eight requests in flight.
    let mut peer = Peer::new(5, 1 << 20, 66, 16, 4 * 1024);
    let logs = peer.segment_logs();
    let (fs, _node) = receiver_fs(6);
    let sync = 128 * 1024;
    let config = ReceiverConfig {
        chunks_in_flight: 8,
        ..receiver_config(32 * 1024, sync)
    };
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), config, 11);
    let target_len = logs[1].1.len() as u64;
    let cut_at = target_len * 9 / 10;
    let mut cut = false;
    let first = rx.arm(ReplicaId(0));
    // From the first answer at 90% of artifact 1 on, nothing arrives.
    let error = failed(drive_window(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &mut |answers| {
            answers
                .into_iter()
                .filter(|&(_, artifact, offset, _)| {
                    cut |= artifact == 1 && offset >= cut_at || artifact > 1;
                    !cut
                })
                .collect()
        },
    ));
    assert!(matches!(error, ReceiveError::Stalled { .. }), "{error:?}");
    let point = rx.resume_point().unwrap();
    assert_eq!(point.entry.kind.wire_frontier(), logs[1].0);
    assert_eq!(point.synced_len_bytes % sync, 0);
    assert!(point.synced_len_bytes >= target_len * 8 / 10, "{point:?}");
    let mut other = Peer {
        fs: peer.fs.clone(),
        node: peer.node,
        server: server(),
    };
    let bytes_before = rx.stats().chunk_bytes;
    let second = rx.arm(ReplicaId(1));
    let done = complete(drive_window(
        &mut rx,
        &mut other,
        1,
        second,
        &local(),
        &mut |answers| answers,
    ));
    assert_staged_match(&fs, &done, &other);
    assert_eq!(rx.stats().resumed_spills, 1);
    assert_eq!(rx.stats().resumed_bytes, point.synced_len_bytes);
    // Exactly what the sync had not covered, and the later artifacts.
    let later: u64 = logs[2..].iter().map(|(_, b)| b.len() as u64).sum::<u64>()
        + done.descriptor.manifest.last().unwrap().len;
    assert_eq!(
        rx.stats().chunk_bytes - bytes_before,
        target_len - point.synced_len_bytes + later
    );
}

// ----- peer-controlled values at their extremes ---------

fn nonce_of(request: &TransferRequest) -> u128 {
    match request {
        TransferRequest::Descriptor { nonce, .. } | TransferRequest::Chunk { nonce, .. } => *nonce,
    }
}

/// An offer whose `commit_max` (and op) is `u64::MAX` is refused as out of
/// range before anything is created: the install would compute the op
/// after it.
#[test]
fn given_offer_at_u64_max_op_when_accepting_descriptor_should_refuse_out_of_range() {
    let (fs, _node) = receiver_fs(90);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(4096, 4096), 3);
    let mut nonce = nonce_of(&rx.arm(ReplicaId(0)));
    let offsets = ConsumerOffsetsWire {
        purge_generation: 0,
        next_offset: Offset(0),
        consumers: vec![],
        groups: vec![],
        dedup: vec![],
    }
    .encode();
    let body = encode_manifest(&[StateArtifact::for_bytes(
        ArtifactKind::ConsumerOffsets {
            commit_op: Op(u64::MAX),
        },
        &offsets,
    )]);
    for (commit_op, commit_max) in [(u64::MAX, u64::MAX), (0, u64::MAX), (1 << 63, 1 << 63)] {
        let header = StateTransferTargetHeader {
            nonce,
            commit_op: Op(commit_op),
            group: GroupId(0),
            available: true,
            unavailable_transient: false,
            commit_max: Op(commit_max),
        };
        let step = block_on(rx.on_target(0, u32::MAX, &header, &body, &local()));
        assert!(
            matches!(
                step,
                ReceiveStep::Failed(ReceiveError::Descriptor(DescriptorRefusal::Header(
                    OfferHeaderRefusal::OpOutOfRange { .. }
                )))
            ),
            "{commit_op}/{commit_max}: {step:?}"
        );
        assert!(staging_files(&fs).is_empty());
        // The refusal ends the session; a new one asks again.
        nonce = nonce_of(&rx.arm(ReplicaId(0)));
    }
}

/// Chunk frames and chunk requests with every field at its extreme change
/// nothing and panic nowhere: offset `u64::MAX`, artifact `u32::MAX`,
/// length `u32::MAX`, payloads that would run past the end.
#[test]
fn given_chunk_fields_at_their_extremes_when_received_or_requested_should_be_ignored() {
    let mut peer = Peer::new(91, 64 * 1024, 4, 8, 512);
    let (fs, _node) = receiver_fs(92);
    let mut rx = TransferReceiver::new(fs.clone(), &dir(), receiver_config(4096, 4096), 5);
    let first = rx.arm(ReplicaId(0));
    let nonce = nonce_of(&first);
    // Accept the descriptor (stop at the first chunk request).
    let ended = drive(
        &mut rx,
        &mut peer,
        0,
        first,
        &local(),
        &Hooks {
            cut: Some(&|r| matches!(r, TransferRequest::Chunk { .. })),
            ..Hooks::default()
        },
    );
    assert!(matches!(ended, Ended::Cut(_)));
    for (artifact, offset) in [
        (u32::MAX, 0),
        (0, u64::MAX),
        (0, u64::MAX - 1),
        (u32::MAX, u64::MAX),
        (1, u64::MAX - 3),
    ] {
        let step = block_on(rx.on_chunk(
            0,
            nonce,
            artifact,
            offset,
            Bytes::from(vec![7u8; 16]),
            &local(),
        ));
        assert!(
            matches!(step, ReceiveStep::Ignored(_)),
            "{artifact}/{offset}: {step:?}"
        );
    }
    for (artifact, offset, len) in [
        (u32::MAX, 0, 1),
        (0, u64::MAX, u32::MAX),
        (0, 0, u32::MAX),
        (0, u64::MAX - 1, u32::MAX),
        (u32::MAX, u64::MAX, u32::MAX),
    ] {
        let answer = block_on(peer.server.on_request_state_chunk(
            &peer.fs,
            ChunkRequest {
                requester: ReplicaId(ME),
                nonce,
                artifact,
                offset,
                len,
            },
        ));
        match answer {
            ChunkAnswer::Ignore => {}
            ChunkAnswer::Chunk(chunk) => assert!(chunk.payload.len() <= 256 * 1024),
            other => panic!("{artifact}/{offset}/{len}: {other:?}"),
        }
    }
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    fn extreme_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1u64),
            Just(u64::MAX),
            Just(u64::MAX - 1),
            Just(1u64 << 62),
            Just((1u64 << 62) + 1),
            0u64..4096,
            any::<u64>(),
        ]
    }

    fn artifact() -> impl Strategy<Value = StateArtifact> {
        (
            prop_oneof![
                Just(artifact_kind::SEGMENT_LOG),
                Just(artifact_kind::CONSUMER_OFFSETS),
                any::<u8>()
            ],
            extreme_u64(),
            extreme_u64(),
            any::<u64>(),
        )
            .prop_map(|(code, frontier, len, checksum)| StateArtifact {
                kind: ArtifactKind::from_wire(code, frontier),
                len,
                checksum,
            })
    }

    #[derive(Debug, Clone)]
    enum Frame {
        Target {
            commit_op: u64,
            commit_max: u64,
            view: u32,
            body: Option<Vec<u8>>,
            manifest: Vec<StateArtifact>,
            available: bool,
        },
        Chunk {
            artifact: u32,
            offset: u64,
            payload: Vec<u8>,
        },
        Request {
            artifact: u32,
            offset: u64,
            len: u32,
        },
        Tick,
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                extreme_u64(),
                extreme_u64(),
                prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
                proptest::collection::vec(artifact(), 0..6),
                any::<bool>(),
            )
                .prop_map(
                    |(commit_op, commit_max, view, body, manifest, available)| {
                        Frame::Target {
                            commit_op,
                            commit_max,
                            view,
                            body,
                            manifest,
                            available,
                        }
                    }
                ),
            (
                prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), any::<u32>()],
                extreme_u64(),
                proptest::collection::vec(any::<u8>(), 0..300),
            )
                .prop_map(|(artifact, offset, payload)| Frame::Chunk {
                    artifact,
                    offset,
                    payload,
                }),
            (
                prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), any::<u32>()],
                extreme_u64(),
                prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), any::<u32>()],
            )
                .prop_map(|(artifact, offset, len)| Frame::Request {
                    artifact,
                    offset,
                    len,
                }),
            Just(Frame::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Random descriptors, manifests (encoded, or raw bytes), chunk
        /// frames and chunk requests, at and around every extreme, fed to
        /// a receiver with a live session and to a server with a live
        /// offer: nothing panics (debug build: no overflow either).
        #[test]
        fn given_random_hostile_frames_when_fed_to_receiver_and_server_should_never_panic(
            frames in proptest::collection::vec(frame(), 1..24),
        ) {
            let mut peer = Peer::new(93, 64 * 1024, 6, 4, 256);
            let (fs, _node) = receiver_fs(94);
            let mut rx = TransferReceiver::new(fs, &dir(), receiver_config(4096, 4096), 9);
            let mut nonce = nonce_of(&rx.arm(ReplicaId(0)));
            // A live offer session on the server for the same nonce.
            block_on(peer.server.on_request_state_transfer(
                &mut peer.node.partition,
                ReplicaId(ME),
                nonce,
                &NoClock,
            ))
            .unwrap();
            for frame in frames {
                let step = match frame {
                    Frame::Target { commit_op, commit_max, view, body, manifest, available } => {
                        let header = StateTransferTargetHeader {
                            nonce,
                            commit_op: Op(commit_op),
                            group: GroupId(0),
                            available,
                            unavailable_transient: !available,
                            commit_max: Op(commit_max),
                        };
                        let body = body.unwrap_or_else(|| encode_manifest(&manifest));
                        Some(block_on(rx.on_target(0, view, &header, &body, &local())))
                    }
                    Frame::Chunk { artifact, offset, payload } => Some(block_on(rx.on_chunk(
                        0,
                        nonce,
                        artifact,
                        offset,
                        Bytes::from(payload),
                        &local(),
                    ))),
                    Frame::Request { artifact, offset, len } => {
                        let answer = block_on(peer.server.on_request_state_chunk(
                            &peer.fs,
                            ChunkRequest { requester: ReplicaId(ME), nonce, artifact, offset, len },
                        ));
                        if let ChunkAnswer::Chunk(chunk) = answer {
                            prop_assert!(chunk.payload.len() <= 256 * 1024);
                        }
                        None
                    }
                    Frame::Tick => Some(block_on(rx.on_tick(&local()))),
                };
                // A failed session re-arms; keep feeding the new one.
                if let Some(ReceiveStep::Failed(_)) = step {
                    nonce = nonce_of(&rx.arm(ReplicaId(0)));
                }
            }
        }
    }
}

/// Issue 15 item 5: a primary whose own segment file is missing, or cut
/// shorter than its log records, refuses as a local fault (not transient),
/// so the receiver charges the failure, backs off and rotates to the next
/// peer, which serves the transfer. It was refused as transient
/// (`SegmentSetChanged`), so the receiver re-asked the same primary at the
/// flat interval forever.
#[test]
fn given_primary_missing_its_own_segment_when_pulled_should_refuse_as_fault_and_second_peer_serves()
{
    for truncate in [false, true] {
        let mut broken = Peer::new(95, 64 * 1024, 10, 16, 1024);
        let mut healthy = Peer::new(95, 64 * 1024, 10, 16, 1024);
        let (base, bytes) = broken.segment_logs()[1].clone();
        let path = dir().join(storage::log_file_name(base));
        if truncate {
            let f = block_on(
                broken
                    .fs
                    .open(&path, storage::fs::OpenOptions::read_write()),
            )
            .unwrap();
            block_on(storage::fs::FsFile::set_len(&f, bytes.len() as u64 / 2)).unwrap();
        } else {
            block_on(broken.fs.remove_file(&path)).unwrap();
        }
        let (fs, _node) = receiver_fs(96);
        let mut rx = TransferReceiver::new(
            fs.clone(),
            &dir(),
            receiver_config(16 * 1024, 32 * 1024),
            11,
        );
        let facts = local();
        let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
            unreachable!()
        };
        let refused = block_on(broken.server.on_request_state_transfer(
            &mut broken.node.partition,
            ReplicaId(ME),
            nonce,
            &NoClock,
        ))
        .unwrap_err();
        assert!(
            matches!(
                refused,
                partitions::state_transfer::PartitionTransferUnavailable::SegmentMissing { start_offset, .. }
                    if start_offset == Offset(base)
            ),
            "truncate {truncate}: {refused:?}"
        );
        assert!(
            !refused.transient(),
            "a lost file does not heal by asking again"
        );
        let step =
            block_on(rx.on_target(0, 0, &unavailable(nonce, refused.transient()), &[], &facts));
        assert!(matches!(
            step,
            ReceiveStep::Failed(ReceiveError::PeerUnavailable { transient: false })
        ));
        assert_eq!(rx.backoff().failures, 1, "the fault is charged");
        let rearm = rx.pending_rearm().unwrap();
        assert_eq!(
            rearm.peer,
            ReplicaId(1),
            "rotates away from the faulty primary"
        );
        assert!(rearm.after_ticks > 10, "backs off: {rearm:?}");
        let mut request = None;
        for _ in 0..=rearm.after_ticks {
            if let Some(r) = tick(&mut rx, &facts) {
                request = Some(r);
                break;
            }
        }
        let request = request.expect("never re-armed");
        let done = complete(drive(
            &mut rx,
            &mut healthy,
            1,
            request,
            &facts,
            &Hooks::default(),
        ));
        assert_staged_match(&fs, &done, &healthy);
    }
}

/// Issue 15 item 13: peer ids at the top of `u8` rotate without the
/// `candidate + 1` overflow (a debug panic; a wrap in release).
#[test]
fn given_peer_id_at_u8_max_when_rotating_should_wrap_without_overflow() {
    let facts = |replica, primary, count| LocalFacts {
        replica: ReplicaId(replica),
        replica_count: count,
        primary: ReplicaId(primary),
        ..local()
    };
    // The primary is self, so the ring decides.
    assert_eq!(
        rotate_peer(&facts(2, 2, 3), ReplicaId(u8::MAX)),
        ReplicaId(0)
    );
    assert_eq!(
        rotate_peer(&facts(0, 0, 3), ReplicaId(u8::MAX)),
        ReplicaId(1),
        "skips self"
    );
    assert_eq!(
        rotate_peer(&facts(254, 254, 255), ReplicaId(253)),
        ReplicaId(0),
        "past the last id"
    );
    assert_eq!(
        rotate_peer(&facts(0, 0, u8::MAX), ReplicaId(u8::MAX - 1)),
        ReplicaId(1)
    );
    assert_eq!(
        rotate_peer(&facts(1, 1, u8::MAX), ReplicaId(u8::MAX)),
        ReplicaId(0)
    );
}

/// Issue 15 item 13: an offsets artifact from a newer encoder (a version
/// this build does not speak) fails the attempt once, charged, and keeps
/// the staged segments, which matched their manifest checksums: the next
/// attempt adopts them and pulls only the offsets artifact. It was treated
/// as hostile and swept every staged segment on every attempt.
#[test]
fn given_offsets_artifact_from_newer_encoder_when_pulled_should_charge_once_and_keep_staged_segments()
 {
    let mut peer = Peer::new(97, 64 * 1024, 10, 16, 1024);
    let (fs, _node) = receiver_fs(98);
    let mut rx = TransferReceiver::new(
        fs.clone(),
        &dir(),
        receiver_config(16 * 1024, 32 * 1024),
        13,
    );
    let facts = local();
    let newer = |bytes: &[u8]| {
        let mut b = bytes.to_vec();
        // Version byte after the four-byte magic; this build speaks 2.
        b[4] = 3;
        let content = b.len() - 8;
        let trailer = consensus::state_artifact_checksum(&b[..content]);
        b[content..].copy_from_slice(&trailer.to_le_bytes());
        b
    };
    // Describe the substituted artifact honestly: fetch the offer's
    // offsets bytes first, so the manifest entry matches what the chunk
    // hook sends (a newer peer's own, consistent offer).
    let TransferRequest::Descriptor { nonce, .. } = rx.arm(ReplicaId(0)) else {
        unreachable!()
    };
    let offer = block_on(peer.server.on_request_state_transfer(
        &mut peer.node.partition,
        ReplicaId(ME),
        nonce,
        &NoClock,
    ))
    .unwrap();
    let last = offer.manifest().len() - 1;
    let offsets_len = offer.manifest()[last].len;
    let answer = block_on(peer.server.on_request_state_chunk(
        &peer.fs,
        ChunkRequest {
            requester: ReplicaId(ME),
            nonce,
            artifact: u32::try_from(last).unwrap(),
            offset: 0,
            len: u32::try_from(offsets_len).unwrap(),
        },
    ));
    let ChunkAnswer::Chunk(real) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(real.payload.len() as u64, offsets_len);
    let substituted = newer(&real.payload);
    let entry = StateArtifact::for_bytes(offer.manifest()[last].kind, &substituted);
    let manifest_hook = move |mut m: Vec<StateArtifact>| {
        let i = m.len() - 1;
        m[i] = entry;
        m
    };
    let sub = substituted.clone();
    let chunk_hook = move |artifact: u32, offset: u64, payload: Bytes| {
        if artifact as usize == last {
            let start = usize::try_from(offset).unwrap();
            Bytes::from(sub[start..start + payload.len()].to_vec())
        } else {
            payload
        }
    };
    let err = failed(drive(
        &mut rx,
        &mut peer,
        0,
        TransferRequest::Descriptor {
            peer: ReplicaId(0),
            nonce,
        },
        &facts,
        &Hooks {
            manifest: Some(&manifest_hook),
            chunk: Some(&chunk_hook),
            ..Hooks::default()
        },
    ));
    assert!(
        matches!(
            err,
            ReceiveError::Offsets(
                partitions::state_transfer::ConsumerOffsetsWireError::UnsupportedVersion { .. }
            )
        ),
        "{err:?}"
    );
    assert!(!err.hostile(), "a newer encoder is not a lying peer");
    assert_eq!(rx.backoff().failures, 1, "charged once");
    let staged = staging_files(&fs);
    assert!(!staged.is_empty(), "the verified segments were swept");
    // The next attempt (an honest offer of the same segments) adopts them
    // and asks only for the offsets artifact.
    let rearm = rx.pending_rearm().unwrap();
    let mut request = None;
    for _ in 0..=rearm.after_ticks {
        if let Some(r) = tick(&mut rx, &facts) {
            request = Some(r);
            break;
        }
    }
    let request = request.unwrap();
    let TransferRequest::Descriptor { peer: to, .. } = request else {
        panic!("{request:?}");
    };
    // Rotated past the failed primary; this peer serves the same chain.
    let before = rx.stats();
    let done = complete(drive(
        &mut rx,
        &mut peer,
        to.0,
        request,
        &facts,
        &Hooks::default(),
    ));
    assert_staged_match(&fs, &done, &peer);
    let after = rx.stats();

    assert_eq!(
        after.chunk_requests - before.chunk_requests,
        1,
        "only the offsets artifact"
    );
}

/// Issue 15 item 4: the staging sweep over a maximal manifest (65,536
/// entries, a log and an index staged for each) keeps exactly the set it
/// is given. The keep list is a `HashSet` (the signature takes one) and
/// adopted slots a map by index: both were lists searched once per file
/// or entry, quadratic in a manifest a peer controls. Time-independent:
/// the bound is the type; this checks the set's semantics at full size.
#[test]
fn given_maximal_manifest_of_staged_files_when_swept_should_keep_exactly_the_keep_set() {
    use std::collections::HashSet;
    let fs = fresh_fs(99);
    block_on(fs.create_dir_all(&dir())).unwrap();
    let entries = consensus::STATE_MANIFEST_ENTRIES_MAX as u64;
    let mut keep = HashSet::new();
    block_on(async {
        for base in 0..entries {
            for name in [
                format!("{base:020}.log.staging"),
                format!("{base:020}.index.staging"),
            ] {
                let path = dir().join(name);
                fs.open(&path, storage::fs::OpenOptions::create_read_write())
                    .await
                    .unwrap();
                if base % 2 == 0 {
                    keep.insert(path);
                }
            }
        }
    });
    let swept = block_on(partitions::state_transfer::sweep_staging_except(
        &fs,
        &dir(),
        &keep,
    ));
    assert_eq!(swept as u64, entries, "every file not kept went");
    let left: HashSet<PathBuf> = staging_files(&fs)
        .into_iter()
        .map(|n| dir().join(n))
        .collect();
    assert_eq!(left, keep);
}
