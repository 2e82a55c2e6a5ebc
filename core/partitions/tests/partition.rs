//! Functional tests of a single-replica partition over the simulated
//! filesystem: produce, polls by every strategy, flush, rotation, counters,
//! consumer offsets, dedup, purge, retention and boot.
#![allow(clippy::unwrap_used)]

mod support;

use common::{ConsumerKind, Offset, ReplicaId};
use consensus::vsr::RequestOutcome;
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::{
    ClientOp, ClientRequest, PartitionError, PollingStrategy, RetentionPolicy,
    read_purge_generation,
};
use storage::fs::{Fs, SimFs};
use support::{batch, config, contents, dir, fresh_fs, offsets, open};

const CONSUMER: ConsumerKind = ConsumerKind::Consumer;
const GROUP: ConsumerKind = ConsumerKind::ConsumerGroup;

#[test]
fn given_produced_batches_when_polled_by_every_strategy_should_return_committed_messages() {
    let fs = fresh_fs(1);
    let mut node = open(&fs, MemSuperblock::new(), config());
    let mut timestamps = Vec::new();
    for tag in 0..10 {
        timestamps.push(node.now_us);
        node.produce(tag, 10);
    }
    // Offset.
    let p = node.poll(PollingStrategy::Offset(15), 20);
    assert_eq!(offsets(&p), (15..35).collect::<Vec<_>>());
    assert_eq!(contents(&p)[0].1, b"m-1-5");
    // First and Last.
    assert_eq!(
        offsets(&node.poll(PollingStrategy::First, 3)),
        vec![0, 1, 2]
    );
    assert_eq!(
        offsets(&node.poll(PollingStrategy::Last, 5)),
        (95..100).collect::<Vec<_>>()
    );
    // Next without a stored offset starts at the first offset.
    assert_eq!(offsets(&node.poll(PollingStrategy::Next, 2)), vec![0, 1]);
    // Timestamp: the first batch stamped at or after the 4th batch's time.
    let p = node.poll(PollingStrategy::Timestamp(timestamps[4]), 10);
    assert_eq!(offsets(&p), (40..50).collect::<Vec<_>>());
    assert!(
        node.poll(PollingStrategy::Timestamp(node.now_us + 1), 10)
            .is_empty()
    );
    // Never beyond the commit point; count bounds the result.
    assert!(node.poll(PollingStrategy::Offset(100), 10).is_empty());
    assert_eq!(node.poll(PollingStrategy::Offset(98), 10).count, 2);
    assert!(node.poll(PollingStrategy::First, 0).is_empty());
    // Base offsets and timestamps were stamped by the primary.
    let p = node.poll(PollingStrategy::Offset(30), 1);
    let view =
        storage::BatchView::decode_exact(&p.batches[0], storage::Integrity::Verify, u64::MAX)
            .unwrap();
    assert_eq!(view.header().base_offset, 30);
    assert_eq!(view.header().base_timestamp, timestamps[3]);
    assert_eq!(view.header().partition_id, 3);
}

#[test]
fn given_reply_when_sent_should_have_written_its_batch_but_not_synced_it() {
    let fs = fresh_fs(2);
    let mut cfg = config();
    cfg.messages_required_to_save = 25;
    let mut node = open(&fs, MemSuperblock::new(), cfg);
    // Below the threshold, yet each reply waited for its batch's write.
    node.produce(0, 10);
    assert_eq!(node.partition.unflushed_messages(), 0);
    assert_eq!(node.partition.log().next_offset(), 10);
    node.produce(1, 10);
    node.produce(2, 10);
    node.produce(3, 10);
    assert_eq!(node.partition.log().next_offset(), 40);
    // Written, not synced: the durable frontier has not moved.
    assert_eq!(node.partition.durable_offset_frontier().0, 0);
    let p = node.poll(PollingStrategy::Offset(25), 15);
    assert_eq!(offsets(&p), (25..40).collect::<Vec<_>>());
    // On demand: nothing left to write, the sync records the frontier.
    let out = block_on(node.partition.flush_committed_messages()).unwrap();
    assert_eq!((out.batches, out.messages, out.synced), (0, 0, true));
    assert_eq!(node.partition.unflushed_messages(), 0);
    assert_eq!(node.partition.durable_offset_frontier().0, 40);
    assert_eq!(
        offsets(&node.poll(PollingStrategy::Offset(25), 15)),
        (25..40).collect::<Vec<_>>()
    );
}

#[test]
fn given_small_segments_when_produced_should_rotate_and_count() {
    let fs = fresh_fs(3);
    let mut cfg = config();
    cfg.messages_required_to_save = 1;
    cfg.log.segment_size_bytes = 2048;
    let mut node = open(&fs, MemSuperblock::new(), cfg);
    let mut bytes = 0;
    for tag in 0..40 {
        bytes += batch(tag, 5).len() as u64;
        node.produce(tag, 5);
    }
    let stats = node.partition.stats();
    assert_eq!(stats.messages_count, 200);
    assert_eq!(stats.size_bytes, bytes);
    assert_eq!(stats.current_offset, Some(Offset(199)));
    assert!(stats.segments_count > 3, "{stats:?}");
    let segs: Vec<_> = node.partition.log().segments().copied().collect();
    for pair in segs.windows(2) {
        assert_eq!(pair[0].next_offset, pair[1].start_offset);
    }
    // Each seal is a durable point the superblock frontier records.
    assert_eq!(
        node.partition.durable_offset_frontier().0,
        segs.last().unwrap().start_offset
    );
    // A poll across every segment.
    let p = node.poll(PollingStrategy::First, 200);
    assert_eq!(offsets(&p), (0..200).collect::<Vec<_>>());
    let p = node.poll(PollingStrategy::Offset(101), 50);
    assert_eq!(offsets(&p), (101..151).collect::<Vec<_>>());
}

#[test]
fn given_enforce_fsync_when_produced_should_be_durable_before_the_reply() {
    let fs = fresh_fs(4);
    let mut cfg = config();
    cfg.enforce_fsync = true;
    let mut node = open(&fs, MemSuperblock::new(), cfg);
    node.produce(0, 3);
    assert_eq!(node.partition.unflushed_messages(), 0);
    // The frontier is a lower bound: not rewritten per produce.
    assert_eq!(node.partition.durable_offset_frontier().0, 0);
    // A crash right after the reply keeps the batch, even one that keeps
    // nothing unsynced (a seeded crash keeps most unsynced writes, so it
    // rarely shows a missing sync).
    let store = node.partition.superblock().clone();
    drop(node);
    fs.crash_with(storage::fs::CrashMode::DropAll);
    let node = open(&fs, store, config());
    assert_eq!(
        offsets(&node.poll(PollingStrategy::First, 10)),
        vec![0, 1, 2]
    );
}

#[test]
fn given_invalid_client_batch_when_submitted_should_refuse_and_change_nothing() {
    let fs = fresh_fs(5);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 2);
    let mut bad = batch(1, 2);
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let res = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request: 9,
            user_id: 1,
            op: ClientOp::Append(bad),
        },
        node.now_us,
    ));
    assert!(matches!(res, Err(PartitionError::InvalidOp(_))), "{res:?}");
    assert_eq!(node.partition.offset_frontier().0, 2);
    assert!(node.partition.fenced().is_none());
    // Storing beyond the end or purging to an old generation is refused too.
    let res = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request: 9,
            user_id: 1,
            op: ClientOp::StoreOffset {
                kind: CONSUMER,
                id: 1,
                offset: Offset(2),
            },
        },
        node.now_us,
    ));
    assert!(matches!(
        res,
        Err(PartitionError::StoreOffsetBeyondEnd { .. })
    ));
    let res = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request: 9,
            user_id: 1,
            op: ClientOp::Purge { generation: 0 },
        },
        node.now_us,
    ));
    assert!(matches!(res, Err(PartitionError::PurgeGenerationZero)));
}

#[test]
fn given_retried_request_when_submitted_should_answer_without_appending_twice() {
    let fs = fresh_fs(6);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 4);
    let out = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request: node.next_request - 1,
            user_id: 1,
            op: ClientOp::Append(batch(0, 4)),
        },
        node.now_us,
    ))
    .unwrap();
    assert_eq!(out, RequestOutcome::Answered);
    assert_eq!(node.partition.offset_frontier().0, 4);
}

#[test]
fn given_flushed_partition_when_rebooted_should_recover_counter_and_continue() {
    let fs = fresh_fs(7);
    let mut node = open(&fs, MemSuperblock::new(), config());
    for tag in 0..5 {
        node.produce(tag, 7);
    }
    block_on(node.partition.flush_committed_messages()).unwrap();
    let before = contents(&node.poll(PollingStrategy::First, 100));
    let store = node.partition.superblock().clone();
    let view = node.partition.replica().view();
    drop(node);
    fs.crash();
    let mut node = open(&fs, store, config());
    assert_eq!(node.partition.replica().view(), view);
    assert_eq!(node.partition.offset_frontier().0, 35);
    assert_eq!(node.partition.recovered_durable_offset(), Some(Offset(34)));
    assert_eq!(contents(&node.poll(PollingStrategy::First, 100)), before);
    assert_eq!(node.partition.stats().messages_count, 35);
    node.produce(9, 1);
    assert_eq!(offsets(&node.poll(PollingStrategy::Last, 1)), vec![35]);
}

#[test]
fn given_offsets_when_stored_and_deleted_should_follow_store_rules() {
    let fs = fresh_fs(8);
    let mut node = open(&fs, MemSuperblock::new(), config());
    for tag in 0..5 {
        node.produce(tag, 10);
    }
    node.store(CONSUMER, 1, 20);
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), Some(Offset(20)));
    assert_eq!(
        offsets(&node.poll(PollingStrategy::Next, 3)),
        vec![21, 22, 23]
    );
    // An explicit store may rewind.
    node.store(CONSUMER, 1, 5);
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), Some(Offset(5)));
    // Groups are separate.
    node.store(GROUP, 1, 40);
    assert_eq!(node.partition.stored_offset(GROUP, 1), Some(Offset(40)));
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), Some(Offset(5)));
    // The file is the durable record.
    let bytes = fs.contents(&dir().join("offsets/consumers/1")).unwrap();
    assert_eq!(
        partitions::OffsetRecord::decode(&bytes).unwrap().offset,
        Some(Offset(5))
    );
    // Auto-commit: eager on the live map, replicated on the next tick, and
    // never backwards.
    let p = node.poll_as((CONSUMER, 1), PollingStrategy::Next, 10, true);
    assert_eq!(p.last_offset, Offset(15));
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), Some(Offset(15)));
    assert_eq!(
        node.partition.consumer_offsets().durable().get(CONSUMER, 1),
        Some(Offset(5))
    );
    node.tick();
    node.tick();
    assert_eq!(
        node.partition.consumer_offsets().durable().get(CONSUMER, 1),
        Some(Offset(15))
    );
    node.poll_as((CONSUMER, 1), PollingStrategy::Offset(0), 3, true);
    node.tick();
    node.tick();
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), Some(Offset(15)));
    assert_eq!(
        node.partition.consumer_offsets().durable().get(CONSUMER, 1),
        Some(Offset(15))
    );
    // Delete.
    node.request(ClientOp::DeleteOffset {
        kind: CONSUMER,
        id: 1,
    });
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), None);
    assert!(!block_on(fs.exists(&dir().join("offsets/consumers/1"))).unwrap());
    assert_eq!(offsets(&node.poll(PollingStrategy::Next, 1)), vec![0]);
}

#[test]
fn given_offset_ahead_of_flushed_data_when_rebooted_should_clamp_it() {
    let fs = fresh_fs(9);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 10);
    block_on(node.partition.flush_committed_messages()).unwrap();
    node.produce(1, 10);
    node.store(CONSUMER, 4, 17);
    let store = node.partition.superblock().clone();
    drop(node);
    // A power loss keeps what was synced: the stored offset (synced when
    // applied), not the second batch (written before its reply, unsynced).
    fs.crash_with(storage::fs::CrashMode::DropAll);
    let node = open(&fs, store, config());
    assert_eq!(node.partition.offset_frontier().0, 10);
    assert_eq!(node.partition.stored_offset(CONSUMER, 4), Some(Offset(9)));
    let bytes = fs.contents(&dir().join("offsets/consumers/4")).unwrap();
    assert_eq!(
        partitions::OffsetRecord::decode(&bytes).unwrap().offset,
        Some(Offset(9))
    );
}

#[test]
fn given_dedup_slice_when_exported_and_installed_should_round_trip() {
    let fs = fresh_fs(10);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 1);
    node.produce(1, 1);
    let slice = node.partition.dedup_export();
    assert_eq!(slice.len(), 1);
    assert_eq!(slice[0].client, 1);
    assert_eq!(slice[0].watermark, 2);
    let fs2 = fresh_fs(11);
    let mut other = open(&fs2, MemSuperblock::new(), config());
    other.partition.dedup_install(&slice).unwrap();
    assert_eq!(other.partition.dedup_export(), slice);
    let mut bad = slice.clone();
    bad.push(slice[0]);
    assert!(other.partition.dedup_install(&bad).is_err());
    assert_eq!(other.partition.dedup_export(), slice);
}

#[test]
fn given_purge_when_applied_should_restart_offsets_and_record_generation() {
    let fs = fresh_fs(12);
    let mut cfg = config();
    cfg.log.segment_size_bytes = 1024;
    cfg.messages_required_to_save = 1;
    let mut node = open(&fs, MemSuperblock::new(), cfg);
    for tag in 0..10 {
        node.produce(tag, 5);
    }
    node.store(GROUP, 2, 30);
    node.request(ClientOp::Purge { generation: 1 });
    assert_eq!(node.partition.purge_generation(), 1);
    assert_eq!(node.partition.offset_frontier().0, 0);
    assert_eq!(node.partition.stats().segments_count, 1);
    assert_eq!(node.partition.stats().messages_count, 0);
    assert!(node.poll(PollingStrategy::First, 10).is_empty());
    assert_eq!(node.partition.stored_offset(GROUP, 2), None);
    assert_eq!(block_on(read_purge_generation(&fs, &dir(), 11)).unwrap(), 1);
    node.produce(20, 2);
    assert_eq!(offsets(&node.poll(PollingStrategy::First, 10)), vec![0, 1]);
    block_on(node.partition.flush_committed_messages()).unwrap();
    let store = node.partition.superblock().clone();
    drop(node);
    fs.crash();
    let node = open(&fs, store, cfg);
    assert_eq!(node.partition.purge_generation(), 1);
    assert_eq!(offsets(&node.poll(PollingStrategy::First, 10)), vec![0, 1]);
}

fn retention_node(fs: &SimFs) -> support::Node<MemSuperblock> {
    let mut cfg = config();
    cfg.log.segment_size_bytes = 1024;
    cfg.messages_required_to_save = 1;
    let mut node = open(fs, MemSuperblock::new(), cfg);
    for tag in 0..30 {
        node.produce(tag, 5);
    }
    node
}

#[test]
fn given_retention_by_size_when_run_should_remove_oldest_sealed_within_budget() {
    let fs = fresh_fs(13);
    let mut node = retention_node(&fs);
    let before = node.partition.stats();
    let segs: Vec<_> = node.partition.log().segments().copied().collect();
    assert!(segs.len() > 5);
    let policy = RetentionPolicy {
        max_total_bytes: Some(0),
        respect_group_offsets: false,
        segments_per_pass_max: 2,
        ..RetentionPolicy::default()
    };
    let out = block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    assert_eq!(out.segments, 2);
    assert!(out.budget_spent);
    assert_eq!(node.partition.first_offset(), Offset(segs[2].start_offset));
    assert_eq!(
        node.partition.stats().messages_count,
        before.messages_count - (segs[2].start_offset - segs[0].start_offset)
    );
    assert!(!block_on(fs.exists(&dir().join(storage::log_file_name(0)))).unwrap());
    // Polls below the first offset start at it.
    let p = node.poll(PollingStrategy::Offset(0), 1);
    assert_eq!(offsets(&p), vec![segs[2].start_offset]);
    // Until only the active segment is left.
    let policy = RetentionPolicy {
        segments_per_pass_max: 100,
        ..policy
    };
    block_on(node.partition.retention_pass(node.now_us, &policy)).unwrap();
    assert_eq!(node.partition.stats().segments_count, 1);
    assert_eq!(
        node.partition.offset_frontier().0,
        before.current_offset.unwrap().0 + 1
    );
}

#[test]
fn given_group_barrier_when_retention_runs_should_keep_unconsumed_segments() {
    let fs = fresh_fs(14);
    let mut node = retention_node(&fs);
    let segs: Vec<_> = node.partition.log().segments().copied().collect();
    let barrier = segs[1].next_offset - 1;
    node.store(GROUP, 9, barrier);
    let policy = RetentionPolicy {
        max_age_us: Some(1),
        ..RetentionPolicy::default()
    };
    let out = block_on(node.partition.retention_pass(u64::MAX / 2, &policy)).unwrap();
    assert_eq!(out.segments, 2);
    assert!(out.held_by_group);
    assert_eq!(node.partition.first_offset(), Offset(segs[2].start_offset));
}

#[test]
fn given_retention_by_age_when_run_should_remove_only_expired() {
    let fs = fresh_fs(15);
    let mut node = retention_node(&fs);
    let segs: Vec<_> = node.partition.log().segments().copied().collect();
    // Expire exactly the first two sealed segments.
    let max_age = 10;
    let now = segs[1].end_timestamp + max_age;
    let policy = RetentionPolicy {
        max_age_us: Some(max_age),
        ..RetentionPolicy::default()
    };
    let out = block_on(node.partition.retention_pass(now, &policy)).unwrap();
    assert_eq!(out.segments, 2);
    assert!(!out.budget_spent);
    assert_eq!(node.partition.first_offset(), Offset(segs[2].start_offset));
}

#[test]
fn given_no_segments_and_a_durable_frontier_when_booted_should_resume_minting_at_the_frontier() {
    let fs = fresh_fs(16);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 40);
    block_on(node.partition.flush_committed_messages()).unwrap();
    let store = node.partition.superblock().clone();
    drop(node);
    // Every segment gone, the frontier kept: the shape an install of a
    // fully retained-away log leaves. Minting resumes at the frontier.
    for name in block_on(fs.read_dir(&dir())).unwrap() {
        let name = name.name_str().unwrap().to_owned();
        if name.ends_with(".log") || name.ends_with(".index") {
            block_on(fs.remove_file(&dir().join(name))).unwrap();
        }
    }
    block_on(fs.sync_dir(&dir())).unwrap();
    let mut node = open(&fs, store, config());
    assert_eq!(node.partition.offset_frontier().0, 40);
    assert_eq!(node.partition.first_offset(), Offset(40));
    node.produce(1, 2);
    assert_eq!(
        offsets(&node.poll(PollingStrategy::First, 10)),
        vec![40, 41]
    );
}

#[test]
fn given_frontier_above_surviving_segments_when_booted_should_refuse() {
    let fs = fresh_fs(17);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 10);
    block_on(node.partition.flush_committed_messages()).unwrap();
    let store = node.partition.superblock().clone();
    drop(node);
    // Synced data vanished under a frontier that recorded it: cut the log.
    let log = dir().join(storage::log_file_name(0));
    let f = block_on(fs.open(&log, storage::OpenOptions::read_write())).unwrap();
    block_on(storage::FsFile::set_len(&f, 0)).unwrap();
    block_on(storage::FsFile::sync_all(&f)).unwrap();
    let net = partitions::InMemoryNetwork::new(1, 1, common::simnet::NetworkFaults::default());
    let res = block_on(partitions::Partition::open(
        config(),
        fs.clone(),
        &dir(),
        net.endpoint(ReplicaId(0)),
        store,
    ));
    assert!(
        matches!(
            res,
            Err(partitions::BootError::FrontierAheadOfLog {
                frontier: Offset(10),
                log_next_offset: Offset(0)
            })
        ),
        "{res:?}"
    );
}

#[test]
fn given_corrupt_offset_file_and_stale_sibling_when_booted_should_remove_both() {
    let fs = fresh_fs(18);
    let mut node = open(&fs, MemSuperblock::new(), config());
    node.produce(0, 10);
    block_on(node.partition.flush_committed_messages()).unwrap();
    node.store(CONSUMER, 1, 3);
    node.store(CONSUMER, 2, 4);
    let store = node.partition.superblock().clone();
    drop(node);
    let consumers = dir().join("offsets/consumers");
    fs.rot_byte(&consumers.join("1"), 2, 0x10).unwrap();
    block_on(async {
        let f = fs
            .open(
                &consumers.join("2.replacing"),
                storage::OpenOptions::create_read_write(),
            )
            .await
            .unwrap();
        let storage::fs::BufResult(r, _) = storage::FsFile::write_all_at(
            &f,
            partitions::OffsetRecord::settled(Offset(9))
                .encode()
                .to_vec(),
            0,
        )
        .await;
        r.unwrap();
        storage::FsFile::sync_all(&f).await.unwrap();
        fs.sync_dir(&consumers).await.unwrap();
    });
    let node = open(&fs, store, config());
    assert_eq!(node.partition.stored_offset(CONSUMER, 1), None);
    assert_eq!(node.partition.stored_offset(CONSUMER, 2), Some(Offset(4)));
    assert!(!block_on(fs.exists(&consumers.join("1"))).unwrap());
    assert!(!block_on(fs.exists(&consumers.join("2.replacing"))).unwrap());
}

/// A poll of `u32::MAX` messages returns whole batches up to the byte
/// budget (the first always), from the segments and from the journal, and
/// the next poll continues where it stopped until everything was read.
#[test]
fn given_a_byte_budget_when_polled_for_every_message_should_return_a_bounded_reply_and_continue() {
    let fs = fresh_fs(7);
    let mut cfg = config();
    cfg.messages_required_to_save = 100; // the last batches stay in the journal
    let batch_bytes = {
        let mut probe = open(&fresh_fs(8), MemSuperblock::new(), config());
        probe.produce(0, 10);
        probe.poll(PollingStrategy::First, 10).batches[0].len() as u64
    };
    cfg.poll_reply_bytes_max = batch_bytes * 3 + batch_bytes / 2;
    let mut node = open(&fs, MemSuperblock::new(), cfg);
    for tag in 0..20 {
        node.produce(tag, 10);
    }
    let mut next = 0;
    let mut polls = 0;
    let mut read = Vec::new();
    while next < 200 {
        let p = node.poll(PollingStrategy::Offset(next), u32::MAX);
        let bytes: u64 = p.batches.iter().map(|b| b.len() as u64).sum();
        assert!(bytes <= cfg.poll_reply_bytes_max, "{bytes} bytes");
        assert!(
            (2..=3).contains(&p.batches.len()),
            "whole batches within the budget: {}",
            p.batches.len()
        );
        assert_eq!(p.first_offset.0, next);
        read.extend(offsets(&p));
        next = p.last_offset.0 + 1;
        polls += 1;
        assert!(polls <= 10, "a poll makes progress");
    }
    assert_eq!(
        read,
        (0..200).collect::<Vec<_>>(),
        "every message once, in order"
    );
    assert!(polls >= 7, "{polls} polls: the budget cut them");
    // A budget smaller than one batch still returns that batch.
    let mut tiny = config();
    tiny.poll_reply_bytes_max = 1;
    let mut node = open(&fresh_fs(9), MemSuperblock::new(), tiny);
    node.produce(0, 10);
    node.produce(1, 10);
    assert_eq!(
        offsets(&node.poll(PollingStrategy::First, u32::MAX)),
        (0..10).collect::<Vec<_>>()
    );
}
