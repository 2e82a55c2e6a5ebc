//! The one "arm → descriptor → chunks → land" exchange the state-transfer
//! tests drive: a receiver's requests served in-process by a peer's
//! `OfferServer` over the peer's partition and disk, with hooks that let a
//! test rewrite what the receiver sees or cut the exchange.
#![allow(clippy::unwrap_used, dead_code)]

use common::{GroupId, Op, ReplicaId};
use std::time::Duration;

use bytes::Bytes;
use consensus::header::StateTransferTargetHeader;
use consensus::{StateArtifact, encode_manifest};
use futures::executor::block_on;
use journal::SuperblockStore;
use partitions::state_transfer::{
    BuildClock, ChunkAnswer, ChunkRequest, LocalFacts, OfferServer, ReceiveError, ReceiveStep,
    ReceivedTransfer, ServedChunk, TransferReceiver, TransferRequest,
};
use partitions::{MessageBus, Partition};
use storage::fs::Fs;

/// A build clock that never moves: every offer is built in one round.
pub struct FrozenClock;

impl BuildClock for FrozenClock {
    fn now(&self) -> Duration {
        Duration::ZERO
    }

    fn observe_hashed(&self, _bytes: u64) {}
}

/// The replica serving a transfer: its index, partition, disk and server.
pub struct Serving<'a, B: MessageBus, S: SuperblockStore, F: Fs> {
    pub id: u8,
    pub partition: &'a mut Partition<B, S, F>,
    pub fs: &'a F,
    pub server: &'a mut OfferServer,
}

/// How a test interferes with the exchange.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Rewrites the manifest the receiver sees.
    pub manifest: Option<&'a dyn Fn(Vec<StateArtifact>) -> Vec<StateArtifact>>,
    /// Rewrites a chunk's payload.
    pub chunk: Option<&'a dyn Fn(u32, u64, Bytes) -> Bytes>,
    /// Stops before serving this request (the exchange is cut there).
    pub cut: Option<&'a dyn Fn(&TransferRequest) -> bool>,
    /// The view the offer's frame carries.
    pub view: u32,
    /// Added to the serving replica's `commit_max` in the offer's header.
    pub commit_max_delta: i64,
}

/// How an exchange ended.
pub enum Ended {
    Step(ReceiveStep),
    Cut(TransferRequest),
}

/// Serves `request` and every request that follows from `peer` to the
/// receiver `rx` (replica `requester`), until the receiver completes,
/// fails, or a hook cuts the exchange. A preparation of the accepted
/// offer (re-reading staged files) runs on ticks, one budget each.
pub fn pump<B, S, F, R>(
    rx: &mut TransferReceiver<R>,
    peer: Serving<'_, B, S, F>,
    requester: u8,
    mut request: TransferRequest,
    facts: &LocalFacts,
    hooks: &Hooks<'_>,
) -> Ended
where
    B: MessageBus,
    S: SuperblockStore,
    F: Fs,
    R: Fs,
{
    loop {
        if hooks.cut.is_some_and(|cut| cut(&request)) {
            return Ended::Cut(request);
        }
        let mut step = match request {
            TransferRequest::Descriptor { peer: to, nonce } => {
                assert_eq!(to, ReplicaId(peer.id), "asked the wrong peer");
                let offer = block_on(peer.server.on_request_state_transfer(
                    peer.partition,
                    ReplicaId(requester),
                    nonce,
                    &FrozenClock,
                ))
                .unwrap();
                let commit_max = peer.partition.replica().commit_max().0;
                let header = StateTransferTargetHeader {
                    nonce,
                    commit_op: offer.commit_op(),
                    group: GroupId(0),
                    available: true,
                    unavailable_transient: false,
                    commit_max: Op(commit_max.saturating_add_signed(hooks.commit_max_delta)),
                };
                let body = match hooks.manifest {
                    Some(rewrite) => encode_manifest(&rewrite(offer.manifest())),
                    None => offer.encoded_manifest().to_vec(),
                };
                block_on(rx.on_target(peer.id, hooks.view, &header, &body, facts))
            }
            TransferRequest::Chunk {
                peer: to, nonce, ..
            } => {
                assert_eq!(to, ReplicaId(peer.id), "asked the wrong peer");
                let chunk = serve_chunk(peer.server, peer.fs, requester, &request);
                let payload = match hooks.chunk {
                    Some(rewrite) => rewrite(chunk.artifact, chunk.offset, chunk.payload),
                    None => chunk.payload,
                };
                block_on(rx.on_chunk(peer.id, nonce, chunk.artifact, chunk.offset, payload, facts))
            }
        };
        let mut ticks = 0;
        while matches!(step, ReceiveStep::Wait) {
            ticks += 1;
            assert!(ticks < 100_000, "preparation never finished");
            step = block_on(rx.on_tick(facts));
        }
        match step {
            ReceiveStep::Send(next) => request = next,
            other => return Ended::Step(other),
        }
    }
}

/// The chunk `server` answers a chunk `request` from `requester` with, or
/// a panic naming the request and the answer when it serves none.
pub fn serve_chunk<F: Fs>(
    server: &mut OfferServer,
    fs: &F,
    requester: u8,
    request: &TransferRequest,
) -> ServedChunk {
    let TransferRequest::Chunk {
        nonce,
        artifact,
        offset,
        len,
        ..
    } = *request
    else {
        panic!("not a chunk request: {request:?}");
    };
    let answer = block_on(server.on_request_state_chunk(
        fs,
        ChunkRequest {
            requester: ReplicaId(requester),
            nonce,
            artifact,
            offset,
            len,
        },
    ));
    let ChunkAnswer::Chunk(chunk) = answer else {
        panic!("peer did not serve {request:?}: {answer:?}");
    };
    chunk
}

/// The completed transfer, or a panic naming how it ended instead.
pub fn complete(ended: Ended) -> Box<ReceivedTransfer> {
    match ended {
        Ended::Step(ReceiveStep::Complete(done)) => done,
        Ended::Step(other) => panic!("transfer did not complete: {other:?}"),
        Ended::Cut(request) => panic!("cut at {request:?}"),
    }
}

/// The failure, or a panic naming how it ended instead.
pub fn failed(ended: Ended) -> ReceiveError {
    match ended {
        Ended::Step(ReceiveStep::Failed(error)) => error,
        Ended::Step(other) => panic!("transfer did not fail: {other:?}"),
        Ended::Cut(request) => panic!("cut at {request:?}"),
    }
}
