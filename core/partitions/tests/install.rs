//! State-transfer install (SPEC §7 ST-I1..I5, ST-C, the fence) over the
//! simulated filesystem: check-phase refusals change nothing byte for
//! byte; a power cut after every filesystem call of an install reboots to
//! the old state, the new one, or an empty partition at the offer's
//! frontier, and the install then completes; a fault at every step returns
//! the right error and converges, or fences.
#![allow(clippy::unwrap_used)]

mod support;

use common::{ConsumerKind, GroupId, Offset, Op, ReplicaId};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::simnet::NetworkFaults;
use consensus::vsr::Config;
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::state_transfer::{
    ConsumerOffsetsWire, INSTALL_MARKER_FILE, InstallInput, PartitionInstallError, StagedSegment,
};
use partitions::{InMemoryNetwork, Partition, PartitionConfig, PollRequest, PollingStrategy};
use storage::fs::{EACCES, EIO, ENOSPC, FaultKind, FileKind, Fs, OpenOptions, SimFs};
use support::{Node, dir, fresh_fs};

type P = Partition<partitions::InMemoryBus, FileSuperblock<SimFs>, SimFs>;

const CHECKSUM: u128 = 0xC0FF_EE00_1234;
/// Offsets of the source chain: six batches of five.
const FRONTIER: u64 = 30;

fn src_dir() -> PathBuf {
    PathBuf::from("/data/src")
}

fn config(segment_size: u64) -> PartitionConfig {
    let mut c = PartitionConfig::new(Config::new(ReplicaId(0), 1, GroupId(7)));
    c.partition_id = 3;
    c.created_revision = 11;
    c.messages_required_to_save = 1;
    c.log.segment_size_bytes = segment_size;
    c
}

fn open_at(fs: &SimFs, at: &Path, segment_size: u64) -> P {
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    block_on(Partition::open(
        config(segment_size),
        fs.clone(),
        at,
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(fs.clone(), at),
    ))
    .unwrap()
}

fn node_at(fs: &SimFs, at: &Path, segment_size: u64) -> Node<FileSuperblock<SimFs>> {
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let partition = block_on(Partition::open(
        config(segment_size),
        fs.clone(),
        at,
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(fs.clone(), at),
    ))
    .unwrap();
    let mut node = Node {
        partition,
        net,
        session: 0,
        next_request: 1,
        now_us: 1_000_000,
    };
    node.register();
    node
}

/// Messages of a partition, from its first offset (from the frontier when
/// a converge left history below it missing: polls below it are refused).
fn messages(p: &P) -> Vec<(u64, Vec<u8>)> {
    let strategy = match p.missing_history() {
        Some(missing) => PollingStrategy::Offset(missing.frontier.0),
        None => PollingStrategy::First,
    };
    let polled = block_on(p.poll(&PollRequest {
        consumer: (ConsumerKind::Consumer, 1),
        strategy,
        count: 1000,
        auto_commit: false,
    }))
    .unwrap();
    support::contents(&polled)
}

/// Every file under `root`, with its content, sorted.
fn snapshot(fs: &SimFs, root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = block_on(fs.read_dir(&d)) else {
            continue;
        };
        for e in entries {
            let path = d.join(&e.name);
            if e.kind == FileKind::Dir {
                stack.push(path);
            } else {
                out.push((path.clone(), fs.contents(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Offset files on disk: (kind dir, id, content).
fn offset_files(fs: &SimFs) -> Vec<(String, String)> {
    snapshot(fs, &dir().join("offsets"))
        .into_iter()
        .map(|(p, _)| {
            let kind = p
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (kind, p.file_name().unwrap().to_string_lossy().into_owned())
        })
        .collect()
}

struct Fixture {
    fs: SimFs,
    old: P,
    /// The old partition's network (its replies land there).
    old_net: InMemoryNetwork,
    /// The old partition's messages and stored offsets.
    old_messages: Vec<(u64, Vec<u8>)>,
    /// The source chain's messages.
    new_messages: Vec<(u64, Vec<u8>)>,
    staged: Vec<StagedSegment>,
    commit_op: u64,
}

const OLD_OFFSETS: [(ConsumerKind, u32, u64); 3] = [
    (ConsumerKind::Consumer, 1, 7),
    (ConsumerKind::Consumer, 9, 3),
    (ConsumerKind::ConsumerGroup, 2, 10),
];

fn artifact(next_offset: u64, purge_generation: u64) -> Vec<u8> {
    ConsumerOffsetsWire {
        purge_generation,
        next_offset: Offset(next_offset),
        consumers: vec![(1, Offset(20)), (4, Offset(99))],
        groups: vec![(2, Offset(25))],
        dedup: vec![],
    }
    .encode()
}

/// The offsets the artifact installs (consumer 4 clamped to the end).
fn new_offsets(p: &P) -> bool {
    use ConsumerKind::{Consumer, ConsumerGroup};
    p.stored_offset(Consumer, 1) == Some(Offset(20))
        && p.stored_offset(Consumer, 4) == Some(Offset(FRONTIER - 1))
        && p.stored_offset(Consumer, 9).is_none()
        && p.stored_offset(ConsumerGroup, 2) == Some(Offset(25))
}

fn old_offsets(p: &P) -> bool {
    OLD_OFFSETS
        .iter()
        .all(|&(k, id, v)| p.stored_offset(k, id) == Some(Offset(v)))
        && p.stored_offset(ConsumerKind::Consumer, 4).is_none()
}

/// Copies the source's non-empty segments into the partition directory as
/// staged pairs (written, synced, directory synced), as the receive side
/// leaves them.
fn stage(fs: &SimFs, source: &[(u64, u64, u64, u64, u64)]) -> Vec<StagedSegment> {
    let mut out = Vec::new();
    block_on(async {
        for &(start, next, size, ts0, ts1) in source {
            let s = StagedSegment {
                start_offset: Offset(start),
                end_offset: Offset(next - 1),
                size_bytes: size,
                start_timestamp: ts0,
                end_timestamp: ts1,
                max_timestamp: ts1,
            };
            let (log, index) = s.staging_paths(&dir());
            for (from, to) in [
                (src_dir().join(format!("{start:020}.log")), log),
                (src_dir().join(format!("{start:020}.index")), index),
            ] {
                let bytes = fs.contents(&from).unwrap();
                let f = fs
                    .open(&to, OpenOptions::create_read_write().truncate(true))
                    .await
                    .unwrap();
                storage::fs::FsFile::write_all_at(&f, bytes, 0)
                    .await
                    .0
                    .unwrap();
                storage::fs::FsFile::sync_all(&f).await.unwrap();
            }
            out.push(s);
        }
        fs.sync_dir(&dir()).await.unwrap();
    });
    out
}

type SourceSegments = Vec<(u64, u64, u64, u64, u64)>;

/// The non-empty segments of `p` as [`stage`] takes them.
fn source_segments(p: &P) -> SourceSegments {
    p.log()
        .segments()
        .filter(|s| s.size_bytes > 0)
        .map(|s| {
            (
                s.start_offset,
                s.next_offset,
                s.size_bytes,
                s.start_timestamp,
                s.end_timestamp,
            )
        })
        .collect()
}

fn fixture(seed: u64) -> (Fixture, SourceSegments) {
    let fs = fresh_fs(seed);
    // The source: every batch seals its own segment.
    let mut src = node_at(&fs, &src_dir(), 1);
    for tag in 0..6 {
        src.produce(500 + tag, 5);
    }
    block_on(src.partition.flush_committed_messages()).unwrap();
    let source = source_segments(&src.partition);
    assert_eq!(source.len(), 6);
    let new_messages = messages(&src.partition);
    assert_eq!(new_messages.len() as u64, FRONTIER);
    drop(src);
    // The old partition: 15 messages in one segment, three offsets.
    let mut old = node_at(&fs, &dir(), 1 << 20);
    for tag in 0..3 {
        old.produce(100 + tag, 5);
    }
    for (k, id, v) in OLD_OFFSETS {
        old.store(k, id, v);
    }
    block_on(old.partition.flush_committed_messages()).unwrap();
    let staged = stage(&fs, &source);
    let old_messages = messages(&old.partition);
    assert_eq!(old_messages.len(), 15);
    let commit_op = old.partition.replica().commit_max().0;
    (
        Fixture {
            fs,
            old: old.partition,
            old_net: old.net,
            old_messages,
            new_messages,
            staged,
            commit_op,
        },
        source,
    )
}

fn input(f: &Fixture) -> InstallInput {
    InstallInput {
        commit_op: Op(f.commit_op),
        commit_checksum: CHECKSUM,
        staged: f.staged.clone(),
        offsets_artifact: artifact(FRONTIER, 0),
    }
}

fn assert_fully_installed(p: &P, f: &Fixture) {
    assert_eq!(messages(p), f.new_messages);
    assert!(new_offsets(p));
    assert_eq!(p.offset_frontier().0, FRONTIER);
    assert_eq!(p.log().next_offset(), FRONTIER);
    assert_eq!(
        p.log().segments().filter(|s| s.size_bytes > 0).count(),
        6,
        "the installed chain"
    );
    let mut files = offset_files(&f.fs);
    files.sort();
    assert_eq!(
        files,
        vec![
            ("consumers".to_owned(), "1".to_owned()),
            ("consumers".to_owned(), "4".to_owned()),
            ("groups".to_owned(), "2".to_owned()),
        ]
    );
}

fn assert_converged(p: &P, fs: &SimFs) {
    assert!(messages(p).is_empty(), "converged partition holds nothing");
    assert_eq!(p.offset_frontier().0, FRONTIER);
    assert_eq!(p.log().next_offset(), FRONTIER);
    assert_eq!(p.log().segments().count(), 1);
    assert!(
        offset_files(fs).is_empty(),
        "no offset file survives a converge"
    );
    assert_eq!(p.durable_offset_frontier().0, FRONTIER);
}

#[test]
fn given_staged_chain_when_installed_should_serve_new_chain_offsets_and_frontier() {
    let (mut f, _) = fixture(1);
    let out = block_on(f.old.install_partition_state(input(&f))).unwrap();
    assert_eq!(out.applied_commit_op, Op(f.commit_op));
    assert_fully_installed(&f.old, &f);
    assert_eq!(f.old.replica().commit_min().0, f.commit_op);
    assert_eq!(f.old.replica().commit_min_checksum(), CHECKSUM);
    assert_eq!(f.old.installed_frontier(), Some(Offset(FRONTIER)));
    assert!(!block_on(f.fs.exists(&dir().join(INSTALL_MARKER_FILE))).unwrap());
    // Durable: a crash that keeps only synced state boots the same.
    drop(f.old);
    f.fs.crash_with(storage::fs::CrashMode::DropAll);
    let p = open_at(&f.fs, &dir(), 1 << 20);
    assert_eq!(messages(&p), f.new_messages);
    assert!(new_offsets(&p));
    assert_eq!(p.offset_frontier().0, FRONTIER);
}

/// ST-C: a power cut after every filesystem call of the install.
#[test]
fn given_power_cut_after_every_install_call_when_rebooted_should_be_old_new_or_empty_at_frontier() {
    let mut seen = [0u32; 3];
    let mut completed = false;
    for n in 1..400 {
        let (mut f, source) = fixture(100 + n);
        f.fs.cut_power_after(n);
        let result = block_on(f.old.install_partition_state(input(&f)));
        drop(f.old);
        f.fs.crash();
        let mut p = open_at(&f.fs, &dir(), 1 << 20);
        assert!(
            !block_on(f.fs.exists(&dir().join(INSTALL_MARKER_FILE))).unwrap(),
            "boot resolves the marker"
        );
        let got = messages(&p);
        assert!(
            p.offset_frontier().0 >= 15,
            "cut {n}: frontier rewound to {}",
            p.offset_frontier().0
        );
        if got == f.old_messages {
            assert!(old_offsets(&p), "cut {n}: old chain with other offsets");
            assert_eq!(p.offset_frontier().0, 15);
            seen[0] += 1;
        } else if got == f.new_messages {
            assert!(new_offsets(&p), "cut {n}: new chain with other offsets");
            seen[1] += 1;
        } else {
            assert!(
                got.is_empty(),
                "cut {n}: neither old, new nor empty: {got:?}"
            );
            assert_eq!(p.offset_frontier().0, FRONTIER, "cut {n}");
            assert_eq!(p.log().next_offset(), FRONTIER, "cut {n}");
            assert!(offset_files(&f.fs).is_empty(), "cut {n}: offsets survive");
            seen[2] += 1;
        }
        // The install runs again to completion after the reboot.
        let staged = stage(&f.fs, &source);
        let f2 = Fixture {
            staged,
            ..Fixture {
                fs: f.fs.clone(),
                old: open_at(&f.fs, &src_dir(), 1),
                old_net: InMemoryNetwork::new(1, 1, NetworkFaults::default()),
                old_messages: f.old_messages.clone(),
                new_messages: f.new_messages.clone(),
                staged: vec![],
                commit_op: f.commit_op,
            }
        };
        block_on(p.install_partition_state(input(&f2))).unwrap();
        assert_fully_installed(&p, &f2);
        // Past its last call (the marker's removal, whose failure the
        // install only logs) the install and the reboot agree.
        if result.is_ok() && got == f.new_messages {
            completed = true;
            break;
        }
    }
    assert!(completed, "the install never completed");
    assert!(
        seen.iter().all(|&c| c > 0),
        "every outcome reached: old/new/empty = {seen:?}"
    );
}

fn assert_unchanged_by(f: &mut Fixture, mutate: impl FnOnce(&mut InstallInput), expect: &str) {
    let before = snapshot(&f.fs, Path::new("/data"));
    let commit = (
        f.old.replica().commit_min().0,
        f.old.replica().commit_max().0,
        f.old.offset_frontier().0,
        f.old.durable_offset_frontier().0,
    );
    let mut i = input(f);
    mutate(&mut i);
    let err = block_on(f.old.install_partition_state(i)).unwrap_err();
    assert!(format!("{err:?}").starts_with(expect), "{err:?}");
    assert_eq!(snapshot(&f.fs, Path::new("/data")), before, "{expect}");
    assert_eq!(
        commit,
        (
            f.old.replica().commit_min().0,
            f.old.replica().commit_max().0,
            f.old.offset_frontier().0,
            f.old.durable_offset_frontier().0,
        )
    );
    assert_eq!(messages(&f.old), f.old_messages);
    assert!(old_offsets(&f.old));
}

#[test]
fn given_check_phase_refusal_when_installing_should_change_nothing_byte_for_byte() {
    let (mut f, _) = fixture(2);
    let op = f.commit_op;
    assert_unchanged_by(&mut f, |i| i.commit_op = Op(op - 1), "StaleTransfer");
    assert_unchanged_by(
        &mut f,
        |i| i.offsets_artifact = artifact(10, 0),
        "OfferRewindsDurableData",
    );
    assert_unchanged_by(
        &mut f,
        |i| {
            let last = i.offsets_artifact.len() - 1;
            i.offsets_artifact[last] ^= 0x40;
        },
        "Offsets",
    );
    assert_unchanged_by(
        &mut f,
        |i| i.staged.push(i.staged[2].clone()),
        "DuplicateSegment",
    );
    assert_unchanged_by(
        &mut f,
        |i| {
            i.staged.remove(3);
        },
        "SegmentSetHole",
    );
    assert_unchanged_by(
        &mut f,
        |i| i.offsets_artifact = artifact(FRONTIER + 5, 0),
        "SegmentSetHole",
    );
    // A staged file that is not there.
    block_on(f.fs.remove_file(&f.staged[5].staging_paths(&dir()).1)).unwrap();
    assert_unchanged_by(&mut f, |_| {}, "SwapIo");
}

#[test]
fn given_empty_offer_when_installed_should_plant_a_frontier_segment_that_boots_as_the_frontier() {
    let (mut f, _) = fixture(3);
    let i = InstallInput {
        staged: vec![],
        offsets_artifact: ConsumerOffsetsWire {
            purge_generation: 0,
            next_offset: Offset(40),
            consumers: vec![(1, Offset(12))],
            groups: vec![],
            dedup: vec![],
        }
        .encode(),
        ..input(&f)
    };
    block_on(f.old.install_partition_state(i)).unwrap();
    assert!(messages(&f.old).is_empty());
    assert_eq!(f.old.log().next_offset(), 40);
    assert_eq!(
        f.old.stored_offset(ConsumerKind::Consumer, 1),
        Some(Offset(12))
    );
    drop(f.old);
    f.fs.crash_with(storage::fs::CrashMode::DropAll);
    // Storage recovery alone reads the empty segment as the frontier.
    let report = block_on(storage::recover_partition(
        &f.fs,
        &dir(),
        storage::LogConfig::default().recovery(),
    ))
    .unwrap();
    assert_eq!(report.next_offset(), Some(40));
    let p = open_at(&f.fs, &dir(), 1 << 20);
    assert_eq!(p.offset_frontier().0, 40);
    assert_eq!(p.stored_offset(ConsumerKind::Consumer, 1), Some(Offset(12)));
}

/// An offer built after a purge this replica missed: only the first
/// staged segment, [0, 4], its frontier 5 below the local 15, under purge
/// generation 1. The other staged files are removed.
fn offer_past_a_purge(f: &Fixture) -> InstallInput {
    for s in &f.staged[1..] {
        let (log, index) = s.staging_paths(&dir());
        block_on(f.fs.remove_file(&log)).unwrap();
        block_on(f.fs.remove_file(&index)).unwrap();
    }
    InstallInput {
        staged: vec![f.staged[0].clone()],
        offsets_artifact: ConsumerOffsetsWire {
            purge_generation: 1,
            next_offset: Offset(5),
            consumers: vec![],
            groups: vec![],
            dedup: vec![],
        }
        .encode(),
        ..input(f)
    }
}

#[test]
fn given_offer_after_a_missed_purge_when_installed_should_reset_the_frontier_and_record_the_generation()
 {
    let (mut f, source) = fixture(4);
    let i = offer_past_a_purge(&f);
    block_on(f.old.install_partition_state(i.clone())).unwrap();
    assert_eq!(f.old.purge_generation(), 1);
    assert_eq!(f.old.offset_frontier().0, 5);
    assert_eq!(messages(&f.old), f.new_messages[..5].to_vec());
    drop(f.old);
    f.fs.crash_with(storage::fs::CrashMode::DropAll);
    let mut p = open_at(&f.fs, &dir(), 1 << 20);
    assert_eq!(p.purge_generation(), 1);
    assert_eq!(p.offset_frontier().0, 5);
    // The same offer again no longer advances a purge, and an older one is
    // refused.
    let _ = stage(&f.fs, &source[..1]);
    let stale = InstallInput {
        offsets_artifact: artifact(FRONTIER, 0),
        ..i
    };
    let err = block_on(p.install_partition_state(stale)).unwrap_err();
    assert!(matches!(
        err,
        PartitionInstallError::PurgeGenerationBehind { .. }
    ));
}

/// A `purge.gen` that cannot be written fails the install, which converges
/// and pulls again: an installed purged state never stands under the old
/// generation. (Mixed seed 20000993 went on with the old generation on
/// disk; the replica booted behind the generation group 0 committed, and
/// only a later purge would have recorded it.)
#[test]
fn given_purge_generation_unwritable_when_installing_past_a_purge_should_converge_then_record_it_on_retry()
 {
    let mut refused = 0;
    for nth in 1..=12 {
        let (mut f, source) = fixture(40 + nth);
        let i = offer_past_a_purge(&f);
        // Every attempt at one rename fails, so the retries cannot absorb
        // it; which rename it hits moves with `nth`.
        for k in 0..3 {
            f.fs.fail_nth(FaultKind::Rename, nth + k, EIO);
        }
        let result = block_on(f.old.install_partition_state(i.clone()));
        f.fs.clear_faults();
        if let Err(err) = result {
            if matches!(err, PartitionInstallError::PurgeGenerationNotDurable { .. }) {
                refused += 1;
                assert_eq!(f.old.purge_generation(), 0, "rename #{nth}");
                assert!(messages(&f.old).is_empty(), "rename #{nth}: not converged");
                assert!(
                    block_on(f.fs.exists(&dir().join(INSTALL_MARKER_FILE))).unwrap()
                        || f.old.offset_frontier().0 == 5,
                    "rename #{nth}: converged to the offer's frontier"
                );
            }
            let again = InstallInput {
                staged: stage(&f.fs, &source[..1]),
                ..i
            };
            block_on(f.old.install_partition_state(again))
                .unwrap_or_else(|e| panic!("rename #{nth}: retry failed: {e:?}"));
        }
        assert_eq!(f.old.purge_generation(), 1, "rename #{nth}");
        drop(f.old);
        f.fs.crash_with(storage::fs::CrashMode::DropAll);
        let p = open_at(&f.fs, &dir(), 1 << 20);
        assert_eq!(p.purge_generation(), 1, "rename #{nth}: generation durable");
        assert_eq!(p.offset_frontier().0, 5, "rename #{nth}");
        assert_eq!(messages(&p), f.new_messages[..5].to_vec(), "rename #{nth}");
    }
    assert!(refused > 0, "no rename fault reached purge.gen");
}

/// Errors allowed when `kind` fails at some call of the install, and
/// whether the partition must then be old (refused) or converged.
fn classify(err: &PartitionInstallError) -> &'static str {
    match err {
        PartitionInstallError::OffsetPersistence { .. }
        | PartitionInstallError::FrontierNotDurable { .. }
        | PartitionInstallError::SwapIo { .. }
        | PartitionInstallError::SegmentOpen { .. } => "ok",
        other => panic!("unexpected install error {other:?}"),
    }
}

/// Fault at every call of each kind, with each errno: the right variant,
/// and the partition is either unchanged (refused before the frontier),
/// converged to empty at the frontier (serving an empty range and
/// accepting the install again), or fully installed.
#[test]
fn given_fault_at_every_step_when_installing_should_refuse_or_converge() {
    let kinds = [
        FaultKind::Open,
        FaultKind::Write,
        FaultKind::Sync,
        FaultKind::Rename,
        FaultKind::Remove,
        FaultKind::ReadDir,
    ];
    let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
    let cases = kinds
        .into_iter()
        .flat_map(|kind| [EIO, ENOSPC, EACCES].map(|errno| (kind, errno)));
    // Every nth call of each kind up to SCAN (a fault the retry absorbs
    // still completes the install, so the scan cannot stop at the first
    // success); the last failing call must lie well inside the scan.
    const SCAN: u64 = 60;
    for (k, (kind, errno)) in cases.enumerate() {
        let mut last_failing = 0;
        for nth in 1..=SCAN {
            let (mut f, source) = fixture(1000 + k as u64 * 100 + nth);
            f.fs.fail_nth(kind, nth, errno);
            let result = block_on(f.old.install_partition_state(input(&f)));
            f.fs.clear_faults();
            match result {
                Ok(_) => {
                    assert_fully_installed(&f.old, &f);
                }
                Err(PartitionInstallError::ConvergeFailed { .. }) => {
                    // A converge can only fail on a second fault; with one
                    // fault armed it never does.
                    panic!("{kind:?} #{nth}: converge failed on a single fault");
                }
                Err(err) => {
                    classify(&err);
                    last_failing = nth;
                    // Writes happen only in the staged siblings (retried, so
                    // one fault never surfaces), the marker and the
                    // superblock; renames are the marker's (first), the
                    // swap's and the offset siblings'.
                    match kind {
                        FaultKind::Write => assert!(
                            matches!(err, PartitionInstallError::FrontierNotDurable { .. }),
                            "{kind:?} #{nth}: {err:?}"
                        ),
                        FaultKind::Rename if nth == 1 => assert!(
                            matches!(err, PartitionInstallError::FrontierNotDurable { .. }),
                            "{kind:?} #{nth}: {err:?}"
                        ),
                        FaultKind::Rename => assert!(
                            matches!(
                                err,
                                PartitionInstallError::SwapIo { .. }
                                    | PartitionInstallError::OffsetPersistence { .. }
                            ),
                            "{kind:?} #{nth}: {err:?}"
                        ),
                        _ => {}
                    }
                    let name = format!("{err:?}");
                    let name = name.split([' ', '{', '(']).next().unwrap().to_owned();
                    *outcomes.entry(name.clone()).or_default() += 1;
                    assert!(f.old.fenced().is_none());
                    if messages(&f.old) == f.old_messages {
                        assert!(
                            matches!(
                                err,
                                PartitionInstallError::OffsetPersistence { .. }
                                    | PartitionInstallError::FrontierNotDurable { .. }
                                    | PartitionInstallError::SwapIo { .. }
                            ),
                            "{kind:?} #{nth}: {err:?}"
                        );
                        assert!(old_offsets(&f.old));
                        assert_eq!(f.old.offset_frontier().0, 15);
                    } else {
                        assert_converged(&f.old, &f.fs);
                        assert!(!block_on(f.fs.exists(&dir().join(INSTALL_MARKER_FILE))).unwrap());
                    }
                    // Either way the partition takes the install again.
                    let staged = stage(&f.fs, &source);
                    let again = InstallInput {
                        staged,
                        ..input(&f)
                    };
                    block_on(f.old.install_partition_state(again))
                        .unwrap_or_else(|e| panic!("{kind:?} #{nth}: retry failed: {e:?}"));
                    assert_fully_installed(&f.old, &f);
                }
            }
        }
        assert!(
            last_failing + 15 < SCAN,
            "{kind:?}: a fault at call {last_failing} still failed; widen the scan"
        );
    }
    eprintln!("fault outcomes: {outcomes:?}");
    for expected in [
        "FrontierNotDurable",
        "OffsetPersistence",
        "SwapIo",
        "SegmentOpen",
    ] {
        assert!(
            outcomes.contains_key(expected),
            "no fault produced {expected}: {outcomes:?}"
        );
    }
}

#[test]
fn given_converged_partition_when_producing_should_mint_from_the_frontier() {
    let (mut f, _) = fixture(5);
    // A staged log rename fails after the indexes are in: converge.
    f.fs.fail_nth(FaultKind::Rename, 7, EIO);
    let err = block_on(f.old.install_partition_state(input(&f))).unwrap_err();
    f.fs.clear_faults();
    assert!(
        matches!(err, PartitionInstallError::SwapIo { .. }),
        "{err:?}"
    );
    assert_converged(&f.old, &f.fs);
    // History below the frontier is missing, durably: a poll there is
    // "not available", not "empty".
    assert!(
        block_on(
            f.fs.exists(
                &f.old
                    .dir()
                    .join(partitions::state_transfer::TRANSFER_NEEDED_FILE)
            )
        )
        .unwrap()
    );
    let polled = block_on(f.old.poll(&PollRequest {
        consumer: (ConsumerKind::Consumer, 1),
        strategy: PollingStrategy::Offset(0),
        count: 10,
        auto_commit: false,
    }));
    assert!(
        matches!(polled, Err(partitions::PollError::HistoryMissing { frontier }) if frontier == Offset(FRONTIER)),
        "{polled:?}"
    );
    // Appends continue at the frontier.
    let mut node = Node {
        partition: f.old,
        net: f.old_net,
        session: 0,
        next_request: 1,
        now_us: 3_000_000,
    };
    node.register();
    node.produce(900, 3);
    let got = messages(&node.partition);
    assert_eq!(
        got.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![FRONTIER, FRONTIER + 1, FRONTIER + 2]
    );
}

#[test]
fn given_converge_failure_when_installing_should_fence_and_quarantine_segment_files() {
    let (mut f, _) = fixture(6);
    // A staged index rename fails, then the converge's directory listing.
    // (Rename #1 is the install marker's.)
    f.fs.fail_nth(FaultKind::Rename, 2, EIO);
    f.fs.fail_nth(FaultKind::ReadDir, 2, EIO);
    let err = block_on(f.old.install_partition_state(input(&f))).unwrap_err();
    let PartitionInstallError::ConvergeFailed { frontier, .. } = err else {
        panic!("{err:?}");
    };
    assert_eq!(frontier, Offset(FRONTIER));
    f.fs.clear_faults();
    assert!(f.old.fenced().is_some());
    assert!(matches!(
        block_on(f.old.on_tick(5_000_000)),
        Err(partitions::PartitionError::Fenced { .. })
    ));
    let err = block_on(f.old.install_partition_state(input(&f))).unwrap_err();
    assert!(
        matches!(err, PartitionInstallError::Fenced { .. }),
        "{err:?}"
    );
    let superblock_before: Vec<_> = snapshot(&f.fs, &dir())
        .into_iter()
        .filter(|(p, _)| p.to_string_lossy().contains("superblock"))
        .collect();
    assert!(!superblock_before.is_empty());
    let target = block_on(f.old.fence_segment_files("converge failed")).unwrap();
    assert_eq!(target, PathBuf::from("/data/p0.fenced.0"));
    let left: Vec<_> = snapshot(&f.fs, &dir())
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            let s = p.to_string_lossy();
            s.ends_with(".log") || s.ends_with(".index") || s.ends_with(".staging")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let moved = snapshot(&f.fs, &target);
    assert!(!moved.is_empty());
    let superblock_after: Vec<_> = snapshot(&f.fs, &dir())
        .into_iter()
        .filter(|(p, _)| p.to_string_lossy().contains("superblock"))
        .collect();
    assert_eq!(superblock_before, superblock_after);
    // Durable: the move survives a crash that drops everything unsynced.
    drop(f.old);
    f.fs.crash_with(storage::fs::CrashMode::DropAll);
    assert_eq!(snapshot(&f.fs, &target).len(), moved.len());
    // A second fence takes the next free name; the reboot converges at
    // the recorded frontier.
    assert_eq!(
        block_on(partitions::state_transfer::fence_partition(&f.fs, &dir())).unwrap(),
        PathBuf::from("/data/p0.fenced.1")
    );
    let p = open_at(&f.fs, &dir(), 1 << 20);
    assert_eq!(p.offset_frontier().0, FRONTIER);
    assert!(messages(&p).is_empty());
}

/// Staging a sibling is retried with a doubling backoff: two faults are
/// absorbed (after 10 + 20 ms of the simulator's clock), a third refuses
/// with `OffsetPersistence` and nothing changed byte for byte.
#[test]
fn given_offset_sibling_write_faults_when_staging_should_retry_twice_then_refuse_unchanged() {
    let (mut f, _) = fixture(7);
    let t0 = f.fs.now();
    f.fs.fail_nth(FaultKind::Write, 1, EIO);
    f.fs.fail_nth(FaultKind::Write, 2, ENOSPC);
    block_on(f.old.install_partition_state(input(&f))).unwrap();
    assert!(
        f.fs.now() - t0 >= Duration::from_millis(30),
        "{:?}",
        f.fs.now() - t0
    );
    assert_fully_installed(&f.old, &f);

    let (mut f, _) = fixture(8);
    let before = snapshot(&f.fs, Path::new("/data"));
    for nth in 1..=3 {
        f.fs.fail_nth(FaultKind::Write, nth, EACCES);
    }
    let err = block_on(f.old.install_partition_state(input(&f))).unwrap_err();
    f.fs.clear_faults();
    assert!(
        matches!(err, PartitionInstallError::OffsetPersistence { .. }),
        "{err:?}"
    );
    assert_eq!(snapshot(&f.fs, Path::new("/data")), before);
    assert_eq!(messages(&f.old), f.old_messages);
    assert!(old_offsets(&f.old));
}

/// Reboots `f`'s directory after a crash in `mode`, then stages the
/// source again and installs it: the transfer that follows the reboot.
/// Returns whether the boot found the partition converged (empty at the
/// frontier, lagging) rather than on its old state.
fn reboot_then_install_again(
    f: Fixture,
    source: &SourceSegments,
    mode: storage::fs::CrashMode,
    what: &str,
) -> bool {
    let Fixture {
        fs,
        old,
        old_messages,
        new_messages,
        commit_op,
        ..
    } = f;
    drop(old);
    fs.crash_with(mode);
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let p = block_on(Partition::open(
        config(1 << 20),
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(0)),
        FileSuperblock::new(fs.clone(), &dir()),
    ))
    .unwrap_or_else(|e| panic!("{what}: boot refused: {e:?}"));
    let got = messages(&p);
    let converged = got.is_empty();
    if converged {
        assert_eq!(p.offset_frontier().0, FRONTIER, "{what}");
        assert!(
            p.missing_history().is_some(),
            "{what}: converged without the record"
        );
    } else {
        assert_eq!(got, old_messages, "{what}");
        assert_eq!(p.offset_frontier().0, 15, "{what}");
    }
    let staged = stage(&fs, source);
    let mut again = Fixture {
        fs,
        old: p,
        old_net: net,
        old_messages,
        new_messages,
        staged,
        commit_op,
    };
    block_on(again.old.install_partition_state(input(&again)))
        .unwrap_or_else(|e| panic!("{what}: install after boot: {e:?}"));
    assert_fully_installed(&again.old, &again);
    converged
}

/// Issue 15 item 1: the frontier record is a two-copy superblock write (A
/// written and synced, then B). A fault on B's write or sync, or a power
/// cut right after A, leaves A holding the new frontier. Every such case
/// must reboot (converged from the marker, or the old state when A never
/// landed) and take the next transfer; removing the marker on the failed
/// record made the reboot refuse the partition (`FrontierAheadOfLog`).
#[test]
fn given_torn_superblock_pair_when_recording_install_frontier_should_boot_and_install_again() {
    let mut converged_boots = 0;
    let mut cases = 0;
    // Writes: three offset siblings, the marker's sibling, copy A, copy B;
    // syncs interleave with them. Scanning past them covers both copies.
    let scan = [(FaultKind::Write, 1..=8u64), (FaultKind::Sync, 1..=16u64)];
    for (kind, range) in scan {
        for nth in range {
            for mode in [
                storage::fs::CrashMode::DropAll,
                storage::fs::CrashMode::KeepAll,
            ] {
                let (mut f, source) = fixture(5_000 + nth);
                f.fs.fail_nth(kind, nth, EIO);
                let result = block_on(f.old.install_partition_state(input(&f)));
                f.fs.clear_faults();
                if !matches!(
                    result,
                    Err(PartitionInstallError::FrontierNotDurable { .. })
                ) {
                    continue;
                }
                cases += 1;
                let what = format!("{kind:?} #{nth} {mode:?}");
                converged_boots += u32::from(reboot_then_install_again(f, &source, mode, &what));
            }
        }
    }
    assert!(
        cases >= 4,
        "the scan reached the frontier record {cases} times"
    );
    assert!(
        converged_boots > 0,
        "no fault left copy A holding the new frontier"
    );
    // Power cuts after every call up to and through the frontier record.
    for n in 1..40 {
        let (mut f, source) = fixture(6_000 + n);
        f.fs.cut_power_after(n);
        let result = block_on(f.old.install_partition_state(input(&f)));
        reboot_then_install_again(
            f,
            &source,
            storage::fs::CrashMode::DropAll,
            &format!("cut {n}"),
        );
        if result.is_ok() {
            break;
        }
    }
}

/// Issue 15 item 3: an offer at an op no real log reaches (`u64::MAX`, or
/// just past `OP_MAX`) is a typed refusal that changes nothing; the
/// install computed `commit_op + 1` (overflow in debug, a wrap to a
/// journal floor of 0 in release).
#[test]
fn given_offer_at_u64_max_op_when_installing_should_refuse_out_of_range_unchanged() {
    let (mut f, _) = fixture(12);
    assert_unchanged_by(&mut f, |i| i.commit_op = Op(u64::MAX), "OpOutOfRange");
    assert_unchanged_by(
        &mut f,
        |i| i.commit_op = Op(consensus::vsr::OP_MAX + 1),
        "OpOutOfRange",
    );
}

/// Issue 15 item 3: a superblock naming an op past `OP_MAX` (its commit
/// bound or applied point) refuses the boot with a typed error instead of
/// overflowing in the core's `commit_min + 1`.
#[test]
fn given_superblock_op_at_u64_max_when_booting_should_refuse_out_of_range() {
    use journal::{MemSuperblock, SuperblockStore, VsrState};
    for (commit_max, checkpoint_op) in [(u64::MAX, 0), (u64::MAX, u64::MAX), (0, u64::MAX)] {
        let fs = fresh_fs(13);
        let mut store = MemSuperblock::new();
        let c = config(1 << 20);
        block_on(store.write(&VsrState {
            cluster: c.cluster,
            replica_id: ReplicaId(0),
            replica_count: 1,
            view: 0,
            log_view: 0,
            commit_max: Op(commit_max),
            checkpoint_op: Op(checkpoint_op),
            checkpoint_checksum: 0,
            offset_frontier: Offset(0),
        }))
        .unwrap();
        let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
        let booted = block_on(Partition::open(
            c,
            fs.clone(),
            &dir(),
            net.endpoint(ReplicaId(0)),
            store,
        ));
        assert!(
            matches!(
                booted,
                Err(partitions::BootError::SuperblockOpOutOfRange {
                    op: Op(u64::MAX),
                    ..
                })
            ),
            "{commit_max}/{checkpoint_op}: {:?}",
            booted.map(|_| ())
        );
    }
}

/// Issue 15 item 7: the install's offset sweep and the converge delete only
/// files this code owns (numeric ids and their `.replacing` siblings);
/// foreign names (which boot ignores too) stay. Both swept them.
#[test]
fn given_foreign_files_in_offset_dirs_when_installing_or_converging_should_leave_them() {
    let foreign = [
        dir().join("offsets").join("consumers").join("README"),
        dir().join("offsets").join("groups").join("7.bak"),
    ];
    let plant = |fs: &SimFs| {
        block_on(async {
            for path in &foreign {
                let f = fs
                    .open(path, OpenOptions::create_read_write())
                    .await
                    .unwrap();
                storage::fs::FsFile::write_all_at(&f, b"operator note".to_vec(), 0)
                    .await
                    .0
                    .unwrap();
                storage::fs::FsFile::sync_all(&f).await.unwrap();
            }
        });
    };
    // A completed install: strays with numeric names go, foreign ones stay.
    let (mut f, _) = fixture(14);
    plant(&f.fs);
    block_on(f.old.install_partition_state(input(&f))).unwrap();
    assert!(new_offsets(&f.old));
    assert!(
        f.old.stored_offset(ConsumerKind::Consumer, 9).is_none(),
        "a numeric stray is still swept"
    );
    for path in &foreign {
        assert_eq!(
            f.fs.contents(path).unwrap(),
            b"operator note",
            "{}",
            path.display()
        );
    }
    // A converge (a staged log rename fails after the indexes are in).
    let (mut f, _) = fixture(15);
    plant(&f.fs);
    f.fs.fail_nth(FaultKind::Rename, 7, EIO);
    let err = block_on(f.old.install_partition_state(input(&f))).unwrap_err();
    f.fs.clear_faults();
    assert!(
        matches!(err, PartitionInstallError::SwapIo { .. }),
        "{err:?}"
    );
    for path in &foreign {
        assert_eq!(
            f.fs.contents(path).unwrap(),
            b"operator note",
            "{}",
            path.display()
        );
    }
    assert!(f.old.stored_offset(ConsumerKind::Consumer, 1).is_none());
}

/// Issue 15 item 13: a partition directory whose existence cannot be
/// checked (here ENOTDIR: a file sits where a parent directory should be;
/// on a sick disk EIO) refuses the boot with that error, checked as such.
/// `exists(..).unwrap_or(false)` read it as "does not exist" and went on
/// to create the directory over it.
#[test]
fn given_partition_dir_that_cannot_be_checked_when_booting_should_report_the_error() {
    let fs = fresh_fs(16);
    let blocker = PathBuf::from("/data/blocker");
    block_on(async {
        let f = fs
            .open(&blocker, OpenOptions::create_read_write())
            .await
            .unwrap();
        storage::fs::FsFile::sync_all(&f).await.unwrap();
    });
    let at = blocker.join("p0");
    let net = InMemoryNetwork::new(1, 1, NetworkFaults::default());
    let booted = block_on(Partition::open(
        config(1 << 20),
        fs.clone(),
        &at,
        net.endpoint(ReplicaId(0)),
        journal::MemSuperblock::new(),
    ));
    match booted {
        Err(partitions::BootError::Recovery(storage::RecoveryError::Io { op, source, .. })) => {
            assert_eq!(op, "exists", "the check's own error, not a later create's");
            assert_ne!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A source chain of `segments` one-batch segments staged into the
/// partition directory over an old partition of 5 messages; returns the
/// old partition, the install input and the source's messages.
fn long_chain(seed: u64, segments: u64) -> (SimFs, P, InstallInput, Vec<(u64, Vec<u8>)>) {
    let fs = fresh_fs(seed);
    let mut src = node_at(&fs, &src_dir(), 1);
    for tag in 0..segments {
        src.produce(500 + tag, 2);
    }
    block_on(src.partition.flush_committed_messages()).unwrap();
    let source = source_segments(&src.partition);
    assert_eq!(source.len() as u64, segments);
    let new_messages = messages(&src.partition);
    drop(src);
    let mut old = node_at(&fs, &dir(), 1 << 20);
    old.produce(100, 5);
    block_on(old.partition.flush_committed_messages()).unwrap();
    let staged = stage(&fs, &source);
    let commit_op = old.partition.replica().commit_max().0;
    let input = InstallInput {
        commit_op: Op(commit_op),
        commit_checksum: CHECKSUM,
        staged,
        offsets_artifact: artifact(2 * segments, 0),
    };
    (fs, old.partition, input, new_messages)
}

/// Issue 15 item 9: an install of a long chain is carried out in bounded
/// steps (the transfer driver runs one per tick, so the shard's other
/// groups keep theirs), refuses every input between them, and ends in the
/// same state as one uninterrupted call.
#[test]
fn given_a_long_staged_chain_when_installed_in_steps_should_bound_each_step_and_refuse_input_between()
 {
    use std::task::Poll;
    const BUDGET: usize = 16;
    let mut steps_by_length = Vec::new();
    for segments in [60, 120] {
        let (fs, mut p, input, new_messages) = long_chain(7, segments);
        let op_before = p.replica().op().0;
        let calls = fs.total_calls();
        block_on(p.begin_install(input)).unwrap();
        let begin_calls = fs.total_calls() - calls;
        assert!(p.installing());
        let mut step_calls = Vec::new();
        let outcome = loop {
            let before = fs.total_calls();
            let progress = block_on(p.advance_install(BUDGET));
            step_calls.push(fs.total_calls() - before);
            match progress {
                Poll::Ready(result) => break result.unwrap(),
                Poll::Pending => {}
            }
            // Between steps: no input is taken, and ticks change nothing.
            assert!(p.installing());
            let refused = block_on(p.read_fence()).unwrap_err();
            assert!(
                matches!(
                    refused,
                    partitions::PartitionError::InstallInProgress { .. }
                ),
                "{refused:?}"
            );
            let submitted = block_on(p.submit(
                partitions::ClientRequest {
                    client: 1,
                    session: 1,
                    request: 99,
                    user_id: 1,
                    op: partitions::ClientOp::Register,
                },
                2_000_000,
            ));
            assert!(matches!(
                submitted,
                Err(partitions::PartitionError::InstallInProgress { .. })
            ));
            let flushed = block_on(p.flush_committed_messages());
            assert!(flushed.is_err());
            let before_tick = fs.total_calls();
            block_on(p.on_tick(2_000_000)).unwrap();
            assert_eq!(fs.total_calls(), before_tick, "a tick touched the disk");
            assert_eq!(p.replica().op().0, op_before);
            assert_eq!(block_on(p.scrub_step(1 << 20)), 0);
        };
        assert!(!p.installing());
        assert_eq!(outcome.applied_commit_op, Op(p.replica().commit_min().0));
        assert_eq!(messages(&p), new_messages);
        assert_eq!(p.log().next_offset(), 2 * segments);
        // The start reads the directory once, whatever the chain's length.
        assert!(begin_calls < 40, "begin took {begin_calls} calls");
        // Each step makes about its budget of filesystem calls, whatever
        // the chain's length: a segment's recovery counts its 7 calls, and
        // a step may finish the one it started.
        let most = step_calls.iter().copied().max().unwrap();
        assert!(
            most <= (BUDGET as u64) + 8,
            "a step of {segments} segments took {most} calls: {step_calls:?}"
        );
        steps_by_length.push(step_calls.len());
        drop(p);
        fs.crash_with(storage::fs::CrashMode::DropAll);
        let p = open_at(&fs, &dir(), 1 << 20);
        assert_eq!(messages(&p), new_messages, "the install is durable");
    }
    // Twice the chain, about twice the steps: the work is spread, not
    // done in one call.
    // Renames at BUDGET per step, recoveries at three per step.
    assert!(
        steps_by_length[0] >= 2 * 60 / BUDGET + 60 / 3,
        "{steps_by_length:?}"
    );
    assert!(
        steps_by_length[1] >= 2 * steps_by_length[0] - 2,
        "{steps_by_length:?}"
    );
}

/// A power cut between any two steps of a long install reboots to an
/// empty partition at the offer's frontier (the marker), never to a mix of
/// the two chains; a new install then completes.
#[test]
fn given_a_long_install_cut_between_steps_when_rebooted_should_converge_to_the_frontier() {
    use std::task::Poll;
    const SEGMENTS: u64 = 40;
    const BUDGET: usize = 8;
    let mut cuts = 0;
    for cut_after_steps in (0..40).step_by(3) {
        let (fs, mut p, input, new_messages) = long_chain(20 + cut_after_steps, SEGMENTS);
        let retry = input.clone();
        block_on(p.begin_install(input)).unwrap();
        let mut ended = false;
        for _ in 0..cut_after_steps {
            if let Poll::Ready(result) = block_on(p.advance_install(BUDGET)) {
                result.unwrap();
                ended = true;
                break;
            }
        }
        drop(p);
        fs.crash_with(storage::fs::CrashMode::DropAll);
        let mut p = open_at(&fs, &dir(), 1 << 20);
        if ended {
            assert_eq!(messages(&p), new_messages);
            break;
        }
        cuts += 1;
        assert!(
            messages(&p).is_empty(),
            "cut after {cut_after_steps} steps: a partial chain was served"
        );
        assert_eq!(p.offset_frontier().0, 2 * SEGMENTS);
        assert_eq!(p.log().next_offset(), 2 * SEGMENTS);
        assert!(p.missing_history().is_some(), "it knows it lags");
        // The staged files are gone with the converge: stage them again.
        let source: Vec<(u64, u64, u64, u64, u64)> = (0..SEGMENTS)
            .map(|i| {
                let s = &retry.staged[i as usize];
                (
                    s.start_offset.0,
                    s.end_offset.0 + 1,
                    s.size_bytes,
                    s.start_timestamp,
                    s.end_timestamp,
                )
            })
            .collect();
        let staged = stage(&fs, &source);
        block_on(p.install_partition_state(InstallInput { staged, ..retry })).unwrap();
        assert_eq!(messages(&p), new_messages, "cut after {cut_after_steps}");
    }
    assert!(cuts >= 5, "only {cuts} cuts fell inside the install");
}
