//! Forwarding client requests to the replica that is a group's primary.
//!
//! A client may connect to any replica, but only a group's primary runs
//! its calls. When a shard here answers `NotPrimary { primary }`, the
//! backend sends the call over the forward lane of the replica bus
//! ([`Forwarder::request`]) and relays the answer. The primary runs it
//! on its own shards, exactly as for a local client ([`serve`]), and never
//! forwards again: if it is no longer primary the client gets the
//! transient status and its SDK retries.
//!
//! Both ends run on shard 0's thread (where the client listener lives).
//! Each peer has one lane, kept up by a dialer with backoff; requests on
//! it are pipelined and matched to replies by id. A request gets an
//! answer, a lost connection, or a timeout — never silence.

pub mod codec;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::Shutdown;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use common::{GroupId, ReplicaId};
use compio::buf::BufResult;
use compio::io::AsyncReadExt;
use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};

use super::bus::hello::Lane;
use super::bus::lane::{redial, write_coalesced};
use super::bus::{BusConfig, Greeted, LANE_FORWARD, LANE_FORWARD_IN};
use super::handle::ShardHandles;
use super::metrics::BusMetrics;
use codec::{CodecError, Reply, Request};

/// How long a forwarded request may wait for its answer.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests queued per lane before new ones are refused.
const LANE_QUEUE_FRAMES: usize = 1024;
/// Ceiling on a forward frame (a poll's answer may be larger than the
/// client's request ceiling).
pub const FORWARD_FRAME_MAX: u32 = 256 * 1024 * 1024;

/// Why a forwarded request has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// No lane to that replica is up: nothing was sent.
    NotConnected,
    /// The lane broke after the request was sent: it may have run.
    Lost,
    /// No answer within [`FORWARD_TIMEOUT`]: it may have run.
    Timeout,
    /// The request could not be encoded.
    Codec(CodecError),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotConnected => f.write_str("no forward lane to the primary is up"),
            Self::Lost => f.write_str("the forward lane broke before the answer"),
            Self::Timeout => f.write_str("the primary did not answer in time"),
            Self::Codec(e) => write!(f, "the request cannot be forwarded: {e}"),
        }
    }
}

#[derive(Debug, Default)]
struct LaneState {
    queue: RefCell<Option<mpsc::Sender<Vec<u8>>>>,
    pending: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: Cell<u64>,
}

/// The requesting side: one lane per peer.
#[derive(Debug)]
pub struct Forwarder {
    me: ReplicaId,
    lanes: BTreeMap<u8, Rc<LaneState>>,
    /// The last primary learnt per group, so a call goes straight there.
    hints: RefCell<HashMap<GroupId, ReplicaId>>,
}

impl Forwarder {
    /// Starts a lane dialer per peer on the current (shard 0) runtime.
    pub fn start(config: &Arc<BusConfig>) -> Rc<Self> {
        let mut lanes = BTreeMap::new();
        for (peer, addr) in config.peers() {
            let lane = Rc::new(LaneState::default());
            lanes.insert(peer.0, Rc::clone(&lane));
            let hello = config.hello_for(peer, Lane::Forward);
            let key = config.key.clone();
            let seed = config.incarnation ^ 0xF0F0 ^ (u64::from(peer.0) << 40);
            let metrics = Arc::clone(&config.metrics);
            compio::runtime::spawn(async move {
                let mut ever_up = false;
                redial(addr, hello, &key, seed, &metrics, async |stream| {
                    tracing::info!(peer = peer.0, "forward lane up");
                    metrics.lane_up(peer.0, LANE_FORWARD, ever_up);
                    ever_up = true;
                    run_lane(&lane, stream).await;
                    metrics.lane_down(peer.0, LANE_FORWARD, "closed");
                    tracing::info!(peer = peer.0, "forward lane down");
                })
                .await;
            })
            .detach();
        }
        Rc::new(Self {
            me: config.me,
            lanes,
            hints: RefCell::new(HashMap::new()),
        })
    }

    /// This replica.
    pub fn me(&self) -> ReplicaId {
        self.me
    }

    /// The primary last learnt for `group`, if another replica.
    pub fn hint(&self, group: GroupId) -> Option<ReplicaId> {
        self.hints.borrow().get(&group).copied()
    }

    /// Learns (`Some`) or forgets (`None`) where `group`'s primary is.
    pub fn set_hint(&self, group: GroupId, primary: Option<ReplicaId>) {
        let mut hints = self.hints.borrow_mut();
        match primary {
            Some(p) if p != self.me => {
                hints.insert(group, p);
            }
            _ => {
                hints.remove(&group);
            }
        }
    }

    /// Sends `request` to replica `to` and waits for its answer.
    ///
    /// # Errors
    /// [`ForwardError`]: not sent, or sent and unanswered.
    pub async fn request(&self, to: ReplicaId, request: &Request) -> Result<Reply, ForwardError> {
        let lane = self.lanes.get(&to.0).ok_or(ForwardError::NotConnected)?;
        let id = lane.next_id.get();
        lane.next_id.set(id.wrapping_add(1));
        let frame = codec::encode_request(id, request).map_err(ForwardError::Codec)?;
        let (tx, rx) = oneshot::channel();
        let sent = match lane.queue.borrow_mut().as_mut() {
            Some(queue) => queue.try_send(frame).is_ok(),
            None => false,
        };
        if !sent {
            return Err(ForwardError::NotConnected);
        }
        lane.pending.borrow_mut().insert(id, tx);
        match compio::time::timeout(FORWARD_TIMEOUT, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(ForwardError::Lost),
            Err(_) => {
                lane.pending.borrow_mut().remove(&id);
                Err(ForwardError::Timeout)
            }
        }
    }
}

/// Runs one connected lane until it breaks: a writer task for the
/// requests, replies read here and matched to their callers.
async fn run_lane(lane: &Rc<LaneState>, stream: std::net::TcpStream) {
    let closer = stream.try_clone().ok();
    let stream = match compio::net::TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(%error, "a forward lane could not join the runtime");
            return;
        }
    };
    let (queue, frames) = mpsc::channel(LANE_QUEUE_FRAMES);
    *lane.queue.borrow_mut() = Some(queue);
    compio::runtime::spawn(write_coalesced(stream.clone(), frames)).detach();
    let mut reader = stream;
    loop {
        let body = match read_frame(&mut reader).await {
            Ok(body) => body,
            Err(error) => {
                tracing::debug!(%error, "forward lane read ended");
                break;
            }
        };
        match codec::decode_reply(&body) {
            Ok((id, reply)) => {
                if let Some(tx) = lane.pending.borrow_mut().remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "a forwarded reply does not decode; closing the lane");
                break;
            }
        }
    }
    // Dropping the queue ends the writer; dropping the pending senders
    // answers every caller still waiting with `Lost`.
    *lane.queue.borrow_mut() = None;
    lane.pending.borrow_mut().clear();
    if let Some(closer) = closer {
        let _ = closer.shutdown(Shutdown::Both);
    }
}

/// Why a forward frame could not be read.
#[derive(Debug)]
enum FrameEnd {
    Io(std::io::Error),
    Size(u32),
    Codec(CodecError),
}

impl std::fmt::Display for FrameEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Size(n) => write!(f, "a frame of {n} bytes is outside the bounds"),
            Self::Codec(e) => write!(f, "{e}"),
        }
    }
}

/// Reads one frame and returns its verified body.
async fn read_frame(stream: &mut compio::net::TcpStream) -> Result<Vec<u8>, FrameEnd> {
    let BufResult(read, prefix) = stream.read_exact(Vec::with_capacity(4)).await;
    read.map_err(FrameEnd::Io)?;
    let prefix: [u8; 4] = prefix
        .as_slice()
        .try_into()
        .map_err(|_| FrameEnd::Size(0))?;
    let len = codec::frame_len(&prefix);
    // The checksum, an id and a kind at the least.
    if !(8 + 9..=FORWARD_FRAME_MAX).contains(&len) {
        return Err(FrameEnd::Size(len));
    }
    let BufResult(read, rest) = stream.read_exact(Vec::with_capacity(len as usize)).await;
    read.map_err(FrameEnd::Io)?;
    let body = codec::verified_body(&rest).map_err(FrameEnd::Codec)?;
    Ok(body.to_vec())
}

/// The serving side: runs forwarded requests from the accepted lanes on
/// this replica's shards. Call on shard 0's runtime. Each accepted lane is
/// counted under the `forward_in` lane label (the dialling side counts its
/// own under `forward`).
pub fn serve(
    handles: ShardHandles,
    mut accepted: mpsc::UnboundedReceiver<Greeted>,
    metrics: Arc<BusMetrics>,
) {
    compio::runtime::spawn(async move {
        let mut served_before = std::collections::BTreeSet::new();
        while let Some(greeted) = accepted.next().await {
            let peer = greeted.hello.from;
            let again = !served_before.insert(peer.0);
            let handles = handles.clone();
            let metrics = Arc::clone(&metrics);
            compio::runtime::spawn(async move {
                metrics.lane_up(peer.0, LANE_FORWARD_IN, again);
                serve_lane(handles, greeted).await;
                metrics.lane_down(peer.0, LANE_FORWARD_IN, "closed");
            })
            .detach();
        }
    })
    .detach();
}

async fn serve_lane(handles: ShardHandles, greeted: Greeted) {
    let peer = greeted.hello.from;
    let closer = greeted.stream.try_clone().ok();
    let mut stream = match compio::net::TcpStream::from_std(greeted.stream) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(peer = peer.0, %error, "a forward lane could not join the runtime");
            return;
        }
    };
    let (answers, frames) = mpsc::channel(LANE_QUEUE_FRAMES);
    compio::runtime::spawn(write_coalesced(stream.clone(), frames)).detach();
    tracing::debug!(peer = peer.0, "serving a forward lane");
    loop {
        let body = match read_frame(&mut stream).await {
            Ok(body) => body,
            Err(error) => {
                tracing::debug!(peer = peer.0, %error, "forward lane closed");
                break;
            }
        };
        let (id, request) = match codec::decode_request(&body) {
            Ok(decoded) => decoded,
            Err(error) => {
                tracing::warn!(peer = peer.0, %error, "a forwarded request does not decode; closing the lane");
                break;
            }
        };
        let handles = handles.clone();
        let mut answers = answers.clone();
        compio::runtime::spawn(async move {
            let reply = execute(&handles, request).await;
            let _ = answers.send(codec::encode_reply(id, &reply)).await;
        })
        .detach();
    }
    if let Some(closer) = closer {
        let _ = closer.shutdown(Shutdown::Both);
    }
}

/// Runs a forwarded request here, without forwarding again.
async fn execute(handles: &ShardHandles, request: Request) -> Reply {
    match request {
        Request::Partition { group, call } => Reply::Partition(
            handles
                .call(group, call)
                .await
                .map_err(super::backend::call_failed),
        ),
        Request::Meta { user, op } => {
            let result = handles
                .meta_submit(op, user)
                .await
                .map_err(super::backend::meta_failed);
            let applied = handles.meta_query(|s| s.applied().0).await.unwrap_or(0);
            Reply::Meta { result, applied }
        }
    }
}
