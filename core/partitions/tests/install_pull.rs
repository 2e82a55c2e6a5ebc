//! A state transfer end to end in-process: the serving half (`OfferServer`)
//! offers, the receiving half (`TransferReceiver`) pulls and stages, and
//! the install turns the received transfer into the live partition, which
//! then serves the peer's messages and offsets and keeps minting.
#![allow(clippy::unwrap_used, missing_docs)]

mod pump;
mod support;

use common::{ConsumerKind, Offset, Op, ReplicaId};
use consensus::vsr::RequestOutcome;
use futures::executor::block_on;
use journal::MemSuperblock;
use partitions::state_transfer::{
    BuildBudget, InstallInput, LocalFacts, OfferServer, OfferServerConfig, ReceivedTransfer,
    ReceiverConfig, TransferReceiver,
};
use partitions::{ClientOp, ClientRequest, PollingStrategy};
use pump::{Hooks, Serving, complete, pump};
use storage::fs::SimFs;
use support::{Node, config, contents, dir, fresh_fs, open};

const ME: u8 = 2;

/// Pulls everything `server` offers for `peer` into `rx`.
fn pull(
    rx: &mut TransferReceiver<SimFs>,
    peer_fs: &SimFs,
    peer: &mut Node<MemSuperblock>,
    server: &mut OfferServer,
) -> Box<ReceivedTransfer> {
    let facts = LocalFacts {
        replica: ReplicaId(ME),
        replica_count: 3,
        view: 0,
        primary: ReplicaId(0),
        commit_max: Op(0),
        purge_generation: 0,
    };
    let request = rx.arm(ReplicaId(0));
    let serving = Serving {
        id: 0,
        partition: &mut peer.partition,
        fs: peer_fs,
        server,
    };
    complete(pump(rx, serving, ME, request, &facts, &Hooks::default()))
}

#[test]
fn given_pulled_transfer_when_installed_should_serve_the_peers_messages_and_offsets() {
    // The peer: 12 batches of 8 in 2 KiB segments, three offsets.
    let peer_fs = fresh_fs(1);
    let mut c = config();
    c.log.segment_size_bytes = 2 * 1024;
    let mut peer = open(&peer_fs, MemSuperblock::new(), c);
    for tag in 0..12 {
        peer.produce(tag + 1, 8);
    }
    peer.store(ConsumerKind::Consumer, 1, 40);
    peer.store(ConsumerKind::Consumer, 6, 90);
    peer.store(ConsumerKind::ConsumerGroup, 3, 17);
    block_on(peer.partition.flush_committed_messages()).unwrap();
    let mut server = OfferServer::new(OfferServerConfig {
        chunk_len_max_bytes: 1024,
        repair_retry_ticks: 10,
        budget: BuildBudget::bytes(u64::MAX),
    });

    // The receiver: data of its own, an offset the transfer supersedes.
    let fs = fresh_fs(2);
    let mut node = open(&fs, MemSuperblock::new(), config());
    for tag in 0..3 {
        node.produce(100 + tag, 4);
    }
    node.store(ConsumerKind::Consumer, 9, 5);
    block_on(node.partition.flush_committed_messages()).unwrap();

    let mut rx = TransferReceiver::new(fs.clone(), &dir(), ReceiverConfig::default(), 7);
    let done = pull(&mut rx, &peer_fs, &mut peer, &mut server);
    assert!(done.staged.len() >= 3, "{} segments", done.staged.len());
    let input = InstallInput::from_received(&done, peer.partition.replica().commit_min_checksum());
    let out = block_on(node.partition.install_partition_state(input)).unwrap();
    server.reset();
    assert_eq!(out.applied_commit_op, done.descriptor.commit_op);

    let want = contents(&peer.poll(PollingStrategy::First, 1000));
    assert_eq!(want.len(), 96);
    assert_eq!(contents(&node.poll(PollingStrategy::First, 1000)), want);
    {
        let p = &node.partition;
        assert_eq!(p.offset_frontier().0, 96);
        assert_eq!(p.stored_offset(ConsumerKind::Consumer, 1), Some(Offset(40)));
        assert_eq!(p.stored_offset(ConsumerKind::Consumer, 6), Some(Offset(90)));
        assert_eq!(
            p.stored_offset(ConsumerKind::ConsumerGroup, 3),
            Some(Offset(17))
        );
        assert_eq!(p.stored_offset(ConsumerKind::Consumer, 9), None);
        assert_eq!(
            p.log().segments().filter(|s| s.size_bytes > 0).count(),
            done.staged.len()
        );
    }
    // Staging names are gone: every staged file was renamed in.
    let names: Vec<String> = block_on(storage::fs::Fs::read_dir(&fs, &dir()))
        .unwrap()
        .into_iter()
        .filter_map(|e| e.name_str().map(str::to_owned))
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".staging")), "{names:?}");
    // The receiver keeps minting after the installed frontier (client 7,
    // whom the installed dedup slice does not name).
    let submit = |node: &mut Node<MemSuperblock>, session, request, op| {
        let out = block_on(node.partition.submit(
            ClientRequest {
                client: 7,
                session,
                request,
                user_id: 1,
                op,
            },
            node.now_us,
        ))
        .unwrap();
        assert!(matches!(out, RequestOutcome::Prepared { .. }), "{out:?}");
        node.net.take_replies(ReplicaId(0)).last().unwrap().session
    };
    let session = submit(&mut node, 0, 0, ClientOp::Register);
    submit(
        &mut node,
        session,
        1,
        ClientOp::Append(support::batch(900, 2)),
    );
    let got = contents(&node.poll(PollingStrategy::Offset(96), 10));
    assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), vec![96, 97]);
}
