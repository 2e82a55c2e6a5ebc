//! Crash at every durable step of an offset replacement, a purge, a
//! retention pass and a flush, on the simulated filesystem with the file
//! superblock in the partition directory; reboot; check the partition is
//! consistent:
//!
//! - boot succeeds and the segment chain has no hole (recovery refuses one);
//! - polls return every offset from the first to the counter, densely, with
//!   the payloads that were produced at those offsets;
//! - no stored offset is at or above the counter, and no offset file is
//!   obsolete (no replacement sibling, every file decodes and matches the
//!   durable record);
//! - the counter never drops below the synced end except by a purge whose
//!   frontier reset the superblock records;
//! - the partition keeps working (produce and poll once more).
#![allow(clippy::unwrap_used)]

mod support;

use common::{ConsumerKind, Offset, ReplicaId};
use std::path::PathBuf;

use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::{
    ClientOp, ClientRequest, OffsetRecord, PartitionConfig, PollingStrategy, RetentionPolicy,
    offset_replacement_id, read_purge_generation,
};
use storage::fs::{CrashMode, FileKind, Fs, SimFs};
use support::{Node, config, dir, fresh_fs, offsets, open};

type FileNode = Node<FileSuperblock<SimFs>>;

fn cfg() -> PartitionConfig {
    let mut c = config();
    c.log.segment_size_bytes = 1024;
    c.messages_required_to_save = 1;
    c
}

fn boot(fs: &SimFs) -> FileNode {
    boot_with(fs, cfg())
}

fn boot_with(fs: &SimFs, config: PartitionConfig) -> FileNode {
    open(fs, FileSuperblock::new(fs.clone(), &dir()), config)
}

/// The payload every produced message carries, by tag and index.
fn payload(tag: u64, i: u32) -> Vec<u8> {
    format!("m-{tag}-{i}").into_bytes()
}

/// Produces `batches` batches of 4 messages with tags from `first_tag`,
/// returning the expected payload per offset.
fn produce(node: &mut FileNode, first_tag: u64, batches: u64) {
    for tag in first_tag..first_tag + batches {
        node.produce(tag, 4);
    }
}

/// Everything the invariants need from before the crash.
#[derive(Debug, Clone)]
struct Before {
    /// Offset → payload of everything produced and synced before the op.
    synced: Vec<Vec<u8>>,
    /// Payloads of messages produced after the last sync (may be lost).
    unsynced: Vec<Vec<u8>>,
}

fn check(fs: &SimFs, before: &Before, purge_generation: Option<u64>) -> FileNode {
    let mut node = boot(fs);
    let p = &node.partition;
    let counter = p.offset_frontier().0;
    let first = p.first_offset();
    let purged = purge_generation.is_some_and(|g| p.purge_generation() >= g);
    let frontier = p.durable_offset_frontier().0;
    if purged {
        assert_eq!(counter, 0, "a recorded purge leaves an empty partition");
        assert_eq!(p.stats().segments_count, 1);
    } else if counter < before.synced.len() as u64 {
        // Only a purge in progress may take the counter below the synced
        // end, and its first step is the recorded frontier reset.
        assert!(
            purge_generation.is_some(),
            "counter {counter} rewound without a purge"
        );
        assert_eq!(
            frontier, 0,
            "counter rewound without a recorded frontier reset"
        );
    }
    assert!(
        frontier <= counter,
        "frontier {frontier} above counter {counter}"
    );
    // Dense, and the bytes at each offset are the ones produced there.
    if counter > first.0 {
        let polled = node.poll(PollingStrategy::First, u32::MAX);
        let got: Vec<(u64, Vec<u8>)> = polled
            .messages()
            .map(|m| (m.offset, m.payload.to_vec()))
            .collect();
        assert_eq!(
            got.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            (first.0..counter).collect::<Vec<_>>(),
            "hole in the polled offsets"
        );
        if !purged {
            let all: Vec<&Vec<u8>> = before.synced.iter().chain(&before.unsynced).collect();
            for (o, payload) in &got {
                assert_eq!(&payload, &all[*o as usize], "wrong bytes at offset {o}");
            }
        }
    }
    // Offsets: none at or past the counter, no obsolete file.
    for kind in [ConsumerKind::Consumer, ConsumerKind::ConsumerGroup] {
        let durable = p
            .consumer_offsets()
            .durable()
            .with_entries(kind, |e| e.clone());
        for (id, d) in &durable {
            assert!(
                d.committed_offset < Offset(counter),
                "{kind:?} {id} at {} >= {counter}",
                d.committed_offset
            );
            assert_eq!(p.stored_offset(kind, *id), Some(d.committed_offset));
        }
        let kind_dir = dir().join("offsets").join(kind.dir_name());
        let entries = block_on(fs.read_dir(&kind_dir)).unwrap_or_default();
        for e in entries.iter().filter(|e| e.kind == FileKind::File) {
            let name = e.name_str().unwrap();
            assert!(
                offset_replacement_id(name).is_none(),
                "sibling {name} survived boot"
            );
            let id: u32 = name.parse().unwrap();
            let bytes = fs.contents(&kind_dir.join(name)).unwrap();
            let record = OffsetRecord::decode(&bytes).unwrap();
            assert_eq!(
                durable.get(&id).map(|d| d.committed_offset),
                record.offset,
                "a tombstone survived boot, or a record disagrees"
            );
        }
        assert_eq!(
            entries.iter().filter(|e| e.kind == FileKind::File).count(),
            durable.len()
        );
    }
    assert!(
        !block_on(fs.exists(&dir().join("purge.gen.replacing"))).unwrap(),
        "purge generation sibling survived boot"
    );
    // Still serviceable.
    node.produce(999, 2);
    let last = node.poll(PollingStrategy::Last, 2);
    assert_eq!(offsets(&last), vec![counter, counter + 1]);
    node
}

/// Runs `op` with the power cut after `n` calls, for every `n` until the op
/// completes, crashing and checking after each. Returns the number of
/// steps exercised.
fn crash_at_every_step(
    seed: u64,
    config: PartitionConfig,
    setup: impl Fn(&mut FileNode) -> Before,
    op: impl Fn(&mut FileNode) -> bool,
    purge_generation: Option<u64>,
    after: impl Fn(&mut FileNode, bool),
) -> u64 {
    let mut steps = 0;
    // Several crash images per step: the worst case first (only synced
    // state survives, so a missing sync cannot hide behind a seed that
    // happened to keep the write), then seeded images, in which unsynced
    // state survives or not as the filesystem's seed decides.
    for variant in 0..CRASH_IMAGES_PER_STEP {
        let mode = if variant == 0 {
            CrashMode::DropAll
        } else {
            CrashMode::Seeded
        };
        steps = crash_at_every_step_once(
            seed.wrapping_add(variant << 32),
            config,
            mode,
            &setup,
            &op,
            purge_generation,
            &after,
        );
    }
    steps
}

const CRASH_IMAGES_PER_STEP: u64 = 8;

fn crash_at_every_step_once(
    seed: u64,
    config: PartitionConfig,
    mode: CrashMode,
    setup: &impl Fn(&mut FileNode) -> Before,
    op: &impl Fn(&mut FileNode) -> bool,
    purge_generation: Option<u64>,
    after: &impl Fn(&mut FileNode, bool),
) -> u64 {
    for n in 0u64.. {
        let fs = fresh_fs(seed ^ n.wrapping_mul(0x9E37_79B9));
        let mut node = boot_with(&fs, config);
        let before = setup(&mut node);
        fs.cut_power_after(n);
        let completed = op(&mut node);
        drop(node);
        fs.crash_with(mode);
        let mut rebooted = check(&fs, &before, purge_generation);
        after(&mut rebooted, completed);
        if completed {
            return n;
        }
        assert!(n < 500, "the operation never completed");
    }
    unreachable!()
}

fn synced_base(node: &mut FileNode, batches: u64) -> Before {
    produce(node, 0, batches);
    block_on(node.partition.flush_committed_messages()).unwrap();
    let synced = (0..batches)
        .flat_map(|t| (0..4).map(move |i| payload(t, i)))
        .collect();
    Before {
        synced,
        unsynced: Vec::new(),
    }
}

fn submit(node: &mut FileNode, op: ClientOp) -> bool {
    let request = node.next_request;
    node.next_request += 1;
    let res = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request,
            user_id: 1,
            op,
        },
        node.now_us,
    ));
    res.is_ok() && node.partition.fenced().is_none()
}

#[test]
fn given_crash_at_every_step_of_an_offset_replacement_when_rebooted_should_hold_old_or_new() {
    let steps = crash_at_every_step(
        0x0FF5E7,
        cfg(),
        |node| {
            let before = synced_base(node, 5);
            node.store(ConsumerKind::Consumer, 1, 5);
            before
        },
        |node| {
            submit(
                node,
                ClientOp::StoreOffset {
                    kind: ConsumerKind::Consumer,
                    id: 1,
                    offset: Offset(12),
                },
            )
        },
        None,
        |node, completed| {
            let v = node.partition.stored_offset(ConsumerKind::Consumer, 1);
            assert!(v == Some(Offset(5)) || v == Some(Offset(12)), "{v:?}");
            if completed {
                assert_eq!(v, Some(Offset(12)));
            }
        },
    );
    assert!(steps >= 4, "only {steps} steps");
    // Deletes too.
    crash_at_every_step(
        0xDE1,
        cfg(),
        |node| {
            let before = synced_base(node, 3);
            node.store(ConsumerKind::ConsumerGroup, 2, 7);
            before
        },
        |node| {
            submit(
                node,
                ClientOp::DeleteOffset {
                    kind: ConsumerKind::ConsumerGroup,
                    id: 2,
                },
            )
        },
        None,
        |node, completed| {
            let v = node.partition.stored_offset(ConsumerKind::ConsumerGroup, 2);
            assert!(v == Some(Offset(7)) || v.is_none());
            if completed {
                assert_eq!(v, None);
            }
        },
    );
}

#[test]
fn given_crash_at_every_step_of_a_purge_when_rebooted_should_be_old_or_purged_and_retryable() {
    let steps = crash_at_every_step(
        0x9A26E,
        cfg(),
        |node| {
            let before = synced_base(node, 12);
            assert!(node.partition.stats().segments_count >= 3);
            node.store(ConsumerKind::Consumer, 1, 30);
            node.store(ConsumerKind::ConsumerGroup, 4, 10);
            before
        },
        |node| submit(node, ClientOp::Purge { generation: 1 }),
        Some(1),
        |node, completed| {
            let fs_gen = node.partition.purge_generation();
            if completed {
                assert_eq!(fs_gen, 1);
            }
            if fs_gen < 1 {
                // The client's retry completes the purge.
                assert!(submit(node, ClientOp::Purge { generation: 1 }));
                assert_eq!(node.partition.purge_generation(), 1);
                assert_eq!(node.partition.offset_frontier().0, 0);
                assert!(node.poll(PollingStrategy::First, 10).is_empty());
                assert_eq!(
                    node.partition.stored_offset(ConsumerKind::Consumer, 1),
                    None
                );
            }
            let dir: PathBuf = dir();
            assert_eq!(
                block_on(read_purge_generation(node.partition.fs(), &dir, 11)).unwrap(),
                1
            );
        },
    );
    assert!(steps >= 8, "only {steps} steps");
}

#[test]
fn given_crash_at_every_step_of_a_retention_pass_when_rebooted_should_keep_a_contiguous_suffix() {
    let steps = crash_at_every_step(
        0x2E7E,
        cfg(),
        |node| synced_base(node, 15),
        |node| {
            let policy = RetentionPolicy {
                max_total_bytes: Some(0),
                respect_group_offsets: false,
                segments_per_pass_max: 100,
                ..RetentionPolicy::default()
            };
            let now = node.now_us;
            block_on(node.partition.retention_pass(now, &policy)).is_ok()
        },
        None,
        |node, completed| {
            if completed {
                // The produce in `check` may have rotated once more.
                assert!(node.partition.stats().segments_count <= 2);
            }
        },
    );
    assert!(steps >= 6, "only {steps} steps");
}

#[test]
fn given_crash_at_every_step_of_a_flush_when_rebooted_should_keep_a_prefix() {
    let steps = crash_at_every_step(
        0xF105,
        cfg(),
        |node| {
            let mut before = synced_base(node, 4);
            // Committed, unflushed: the flush under test writes these.
            node.partition.set_flush_thresholds(u64::MAX, u64::MAX);
            produce(node, 4, 6);
            before.unsynced = (4..10)
                .flat_map(|t| (0..4).map(move |i| payload(t, i)))
                .collect();
            before
        },
        |node| block_on(node.partition.flush_committed_messages()).is_ok(),
        None,
        |node, completed| {
            if completed {
                assert_eq!(node.partition.recovered_durable_offset(), Some(Offset(39)));
            }
        },
    );
    assert!(steps >= 3, "only {steps} steps");
}

#[test]
fn given_crash_at_every_step_of_an_fsync_produce_when_acknowledged_should_survive() {
    let mut fsync = cfg();
    fsync.enforce_fsync = true;
    // No segment seals during the produce: a seal syncs the log by itself
    // and would hide a missing enforce_fsync sync. Nor does a threshold
    // flush.
    fsync.log.segment_size_bytes = 1 << 20;
    fsync.messages_required_to_save = u64::MAX;
    let steps = crash_at_every_step(
        0xACC,
        fsync,
        |node| {
            let mut before = synced_base(node, 5);
            before.unsynced = (0..4).map(|i| payload(50, i)).collect();
            before
        },
        |node| {
            // Acknowledged means a reply reached the client, whatever the
            // partition reported afterwards.
            let request = node.next_request;
            submit(node, ClientOp::Append(support::batch(50, 4)));
            node.net
                .take_replies(ReplicaId(0))
                .iter()
                .any(|r| r.request == request && r.status == consensus::vsr::ReplyStatus::Ok)
        },
        None,
        |node, acknowledged| {
            if acknowledged {
                let p = node.poll(PollingStrategy::Offset(20), 4);
                let got: Vec<Vec<u8>> = p.messages().map(|m| m.payload.to_vec()).collect();
                assert_eq!(got, (0..4).map(|i| payload(50, i)).collect::<Vec<_>>());
            }
        },
    );
    assert!(steps >= 2, "only {steps} steps");
}

/// Without `enforce_fsync` and with thresholds that never flush, a killed
/// process (the page cache survives: `CrashMode::KeepAll`) still boots with
/// every acknowledged batch at the offset it was given, and the next
/// produce continues after them: the reply waited for the write.
#[test]
fn given_killed_process_without_fsync_when_rebooted_should_keep_every_acknowledged_batch() {
    let mut lazy = cfg();
    lazy.enforce_fsync = false;
    lazy.log.segment_size_bytes = 1 << 20;
    lazy.messages_required_to_save = u64::MAX;
    lazy.size_required_to_save_bytes = u64::MAX;
    let fs = fresh_fs(0xD1E);
    let mut node = boot_with(&fs, lazy);
    let acknowledged = 12u64;
    for tag in 0..acknowledged {
        node.produce(tag, 4);
    }
    drop(node);
    fs.crash_with(CrashMode::KeepAll);

    let mut rebooted = boot_with(&fs, lazy);
    let polled = rebooted.poll(PollingStrategy::Offset(0), 1_000);
    let got = support::contents(&polled);
    let want: Vec<(u64, Vec<u8>)> = (0..acknowledged)
        .flat_map(|tag| (0..4u32).map(move |i| (tag * 4 + u64::from(i), payload(tag, i))))
        .collect();
    assert_eq!(got, want, "acknowledged batches lost or moved by the kill");
    rebooted.produce(99, 2);
    let next = rebooted.poll(PollingStrategy::Offset(acknowledged * 4), 10);
    assert_eq!(
        support::contents(&next),
        vec![(48, payload(99, 0)), (49, payload(99, 1))]
    );
}
