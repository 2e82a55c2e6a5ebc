//! A full disk (ENOSPC, EDQUOT) on the simulated filesystem: the partition
//! does not fence. It refuses new writes with a typed error naming its
//! directory, keeps serving what is stored, holds the replies of the
//! batches it could not write, retries on its ticks, and resumes once
//! space is freed, with every acknowledged message in place and in order,
//! across a reboot too.
#![allow(clippy::unwrap_used)]

mod support;

use common::{ConsumerKind, Offset, ReplicaId};

use consensus::vsr::{ReplyStatus, RequestOutcome};
use futures::executor::block_on;
use journal::FileSuperblock;
use partitions::{ClientOp, ClientRequest, PartitionConfig, PartitionError, PollingStrategy};
use storage::fs::{CrashMode, EDQUOT, EIO, ENOSPC, FaultKind, SimFs};
use support::{Node, config, contents, dir, fresh_fs, open};

type FileNode = Node<FileSuperblock<SimFs>>;

fn boot(fs: &SimFs, config: PartitionConfig) -> FileNode {
    open(fs, FileSuperblock::new(fs.clone(), &dir()), config)
}

fn payload(tag: u64, i: u32) -> Vec<u8> {
    format!("m-{tag}-{i}").into_bytes()
}

/// The messages of batches of 4 with these tags, at dense offsets from 0.
fn expected(tags: &[u64]) -> Vec<(u64, Vec<u8>)> {
    tags.iter()
        .enumerate()
        .flat_map(|(k, &tag)| {
            (0..4u32).map(move |i| (k as u64 * 4 + u64::from(i), payload(tag, i)))
        })
        .collect()
}

fn read_all(node: &FileNode) -> Vec<(u64, Vec<u8>)> {
    contents(&node.poll(PollingStrategy::Offset(0), 10_000))
}

/// Submits an append of 4 messages tagged `tag` as client 1 and returns
/// the outcome and whether its Ok reply arrived.
fn submit_append(
    node: &mut FileNode,
    tag: u64,
) -> (Result<RequestOutcome, PartitionError>, u64, bool) {
    let request = node.next_request;
    let out = block_on(node.partition.submit(
        ClientRequest {
            client: 1,
            session: node.session,
            request,
            user_id: 1,
            op: ClientOp::Append(support::batch(tag, 4)),
        },
        node.now_us,
    ));
    if out.is_ok() {
        node.next_request += 1;
    }
    node.now_us += 1_000;
    (out, request, replied(node, request))
}

fn replied(node: &FileNode, request: u64) -> bool {
    node.net
        .take_replies(ReplicaId(0))
        .iter()
        .any(|r| r.request == request && r.status == ReplyStatus::Ok)
}

/// Ticks until the partition is no longer out of space (at most `max`
/// ticks); returns how many it took.
fn tick_until_writable(node: &mut FileNode, max: u32) -> u32 {
    for n in 1..=max {
        node.tick();
        if !node.partition.out_of_space() {
            return n;
        }
    }
    panic!("still out of space after {max} ticks");
}

fn lazy() -> PartitionConfig {
    let mut c = config();
    c.log.segment_size_bytes = 1 << 20;
    c
}

#[test]
fn given_a_full_disk_when_producing_should_refuse_serve_reads_and_resume_once_space_is_freed() {
    for errno in [ENOSPC, EDQUOT] {
        let fs = fresh_fs(0xF011);
        let mut node = boot(&fs, lazy());
        for tag in 0..5 {
            node.produce(tag, 4);
        }
        // Room for a few bytes of the next batch: a short write, then full.
        fs.fill_disk(40, errno);
        let (out, held, acknowledged) = submit_append(&mut node, 50);
        assert!(
            matches!(out, Ok(RequestOutcome::Prepared { .. })),
            "{out:?}"
        );
        assert!(
            !acknowledged,
            "a reply went out for a batch not in the file"
        );
        assert!(node.partition.fenced().is_none(), "a full disk fenced");
        let full = node.partition.space_refusal().unwrap();
        assert!(matches!(&full, PartitionError::NoSpace { dir: d, .. } if *d == dir()));
        let text = full.to_string();
        assert!(
            text.contains(&dir().display().to_string()) && text.contains("full"),
            "{text}"
        );

        // New writes are refused, typed, before they are ordered.
        let (out, _, _) = submit_append(&mut node, 51);
        assert!(
            matches!(out, Err(PartitionError::NoSpace { .. })),
            "{out:?}"
        );
        let store = block_on(node.partition.submit(
            ClientRequest {
                client: 1,
                session: node.session,
                request: node.next_request,
                user_id: 1,
                op: ClientOp::StoreOffset {
                    kind: ConsumerKind::Consumer,
                    id: 1,
                    offset: Offset(3),
                },
            },
            node.now_us,
        ));
        assert!(
            matches!(store, Err(PartitionError::NoSpace { .. })),
            "{store:?}"
        );

        // Reads serve what is stored, not the batch whose reply is held.
        let stored: Vec<u64> = (0..5).collect();
        assert_eq!(read_all(&node), expected(&stored));
        assert_eq!(
            contents(&node.poll(PollingStrategy::Last, 4)),
            expected(&stored)[16..].to_vec()
        );

        // Retries on ticks keep failing while the disk is full.
        for _ in 0..50 {
            node.tick();
        }
        assert!(node.partition.out_of_space());
        assert!(!replied(&node, held));
        assert_eq!(read_all(&node), expected(&stored));

        fs.free_disk();
        // Within the longest backoff (128 ticks) the retry writes it.
        tick_until_writable(&mut node, 130);
        // The held reply went out with the retry that wrote its batch.
        assert!(replied(&node, held), "the held reply never went out");
        node.produce(52, 4);
        let want = expected(&[0, 1, 2, 3, 4, 50, 52]);
        assert_eq!(read_all(&node), want);

        drop(node);
        fs.crash_with(CrashMode::KeepAll);
        let rebooted = boot(&fs, lazy());
        assert_eq!(read_all(&rebooted), want, "errno {errno}");
    }
}

/// The tags of the 4-message batches a log holds, in order, checking
/// that every batch sits at dense offsets and is whole.
fn tags_in(messages: &[(u64, Vec<u8>)]) -> Vec<u64> {
    assert_eq!(messages.len() % 4, 0, "a torn batch: {messages:?}");
    messages
        .chunks(4)
        .enumerate()
        .map(|(k, batch)| {
            let text = String::from_utf8(batch[0].1.clone()).unwrap();
            let tag: u64 = text.split('-').nth(1).unwrap().parse().unwrap();
            for (i, (offset, payload_got)) in batch.iter().enumerate() {
                assert_eq!(*offset, k as u64 * 4 + i as u64);
                assert_eq!(*payload_got, payload(tag, i as u32));
            }
            tag
        })
        .collect()
}

#[test]
fn given_a_crash_while_out_of_space_when_rebooted_should_keep_every_acknowledged_message() {
    let (mut held_at_crash, mut refused) = (0, 0);
    for seed in 0..24u64 {
        // A killed process keeps the page cache; a power loss keeps what
        // was synced, which `enforce_fsync` makes of every reply.
        for (mode, fsync) in [(CrashMode::KeepAll, false), (CrashMode::Seeded, true)] {
            let mut c = config();
            c.enforce_fsync = fsync;
            // Small segments: the disk also fills at index writes and seals.
            c.log.segment_size_bytes = 512;
            let fs = fresh_fs(seed);
            let mut node = boot(&fs, c);
            let mut prepared = Vec::new();
            let mut acked = Vec::new();
            for tag in 0..5 {
                node.produce(tag, 4);
                prepared.push(tag);
                acked.push(tag);
            }
            fs.fill_disk(seed * 29 % 700, if seed % 2 == 0 { ENOSPC } else { EDQUOT });
            let mut requests = Vec::new();
            for tag in 50..56 {
                let (out, request, acknowledged) = submit_append(&mut node, tag);
                match out {
                    Ok(_) => {
                        prepared.push(tag);
                        requests.push((request, tag));
                        if acknowledged {
                            acked.push(tag);
                        }
                    }
                    Err(e) => {
                        assert!(
                            matches!(e, PartitionError::NoSpace { .. }),
                            "seed {seed}: {e}"
                        );
                        refused += 1;
                    }
                }
                for _ in 0..(seed % 4) {
                    node.tick();
                    for r in node.net.take_replies(ReplicaId(0)) {
                        if let Some(&(_, tag)) = requests.iter().find(|(q, _)| *q == r.request) {
                            acked.push(tag);
                        }
                    }
                }
            }
            assert!(node.partition.fenced().is_none(), "seed {seed}");
            if acked.len() < prepared.len() {
                held_at_crash += 1;
            }
            drop(node);
            fs.crash_with(mode);
            fs.free_disk();

            let mut rebooted = boot(&fs, c);
            let tags = tags_in(&read_all(&rebooted));
            assert!(
                prepared.starts_with(&tags),
                "seed {seed} {mode:?}: {tags:?} is not a prefix of {prepared:?}"
            );
            for tag in &acked {
                assert!(
                    tags.contains(tag),
                    "seed {seed} {mode:?}: acknowledged batch {tag} lost: {tags:?}"
                );
            }
            rebooted.produce(99, 4);
            let mut after = tags.clone();
            after.push(99);
            assert_eq!(tags_in(&read_all(&rebooted)), after, "seed {seed}");
        }
    }
    // The runs did crash with replies held and did refuse writes.
    assert!(
        held_at_crash >= 20 && refused >= 100,
        "{held_at_crash} {refused}"
    );
}

#[test]
fn given_a_write_failing_with_another_error_when_flushing_should_still_fence() {
    let fs = fresh_fs(0xE10);
    let mut node = boot(&fs, lazy());
    node.produce(0, 4);
    fs.fail_nth(FaultKind::Write, 1, EIO);
    let (out, _, acknowledged) = submit_append(&mut node, 1);
    assert!(out.is_err(), "{out:?}");
    assert!(!acknowledged);
    assert!(node.partition.fenced().is_some());
    assert!(!node.partition.out_of_space());
}
