//! The replica bus: TCP connections between the replicas of a cluster.
//!
//! - **Shard lanes.** For every shard index, one connection per replica
//!   pair, owned on both ends by that index's shard thread, so a frame
//!   never crosses cores on receipt. The lower replica id dials. Frames
//!   are the consensus frames themselves (256-byte header whose `size`
//!   field gives the length); a reader checks the size against the
//!   ceiling before it allocates, and the shard checks everything else
//!   ([`shard::Shard::on_frame`]).
//! - **The forward lane.** One connection from each replica to each other
//!   replica it forwards client requests to ([`crate::node::forward`]).
//!
//! Every connection opens with a [`hello::Hello`]. A hello that passes the
//! accepter's checks is challenged: both sides prove the cluster secret
//! over fresh nonces of both ([`auth`]); only then does the
//! [`hello::Verdict`] accept it. The accepter refuses with a typed reason
//! the dialer logs. A later incarnation (boot) of an authenticated dialer
//! replaces its older connection at once, and an older one is refused. Dialers reconnect
//! with jittered exponential backoff, capped ([`lane::redial`], for both
//! kinds of lane). Every connection has TCP_NODELAY, one reader task (a
//! socket read is never cancelled mid-frame: readers sit in no select)
//! and one writer task ([`lane::write_coalesced`]) draining the bounded
//! per-peer queue of [`super::env::CompioEnv`] (a full queue drops the
//! frame and counts it; VSR retransmits).
//!
//! The accepting side is one OS thread with a blocking listener; it hands
//! each accepted, greeted connection to the shard thread that owns it
//! over a channel. Each handshake runs on a thread of its own, at most
//! [`HANDSHAKES_MAX`] at once (a connection past them is closed
//! unanswered and counted). Dials run their connect and handshake on a
//! blocking helper thread, so a slow peer never stalls a shard.

pub mod auth;
pub mod hello;
pub mod lane;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use common::Prng;
use common::ReplicaId;
use compio::buf::BufResult;
use compio::io::AsyncReadExt;
use consensus::header::HEADER_SIZE;
use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use shard::{Inbox, Input};

use super::env::{CompioEnv, PEER_QUEUE_FRAMES};
use super::metrics::BusMetrics;
use auth::ClusterKey;
use hello::{
    CHALLENGE_SIZE, Challenge, HELLO_SIZE, Hello, Lane, Local, PROOF_MESSAGE_SIZE, Proof, Refusal,
    VERDICT_SIZE, Verdict,
};

/// How long a dial may take to connect, and a handshake to complete.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// The first reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Inbound handshakes run at once, each on its own thread. A roster's
/// dialers need a few (one per peer and lane at a reconnect storm); past
/// the cap a connection is closed unanswered, so connections that never
/// greet cannot grow threads without bound. The dialer of a closed one
/// retries with its backoff.
pub const HANDSHAKES_MAX: usize = 16;
/// The refusal reason counted for a connection closed at the cap.
pub const REFUSED_HANDSHAKES_FULL: &str = "handshakes_full";

/// What the bus of one replica knows.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// The cluster id.
    pub cluster: u128,
    /// This replica.
    pub me: ReplicaId,
    /// Every replica of the roster with its replica-bus address (this
    /// one included).
    pub roster: Vec<(ReplicaId, SocketAddr)>,
    /// Shards per replica.
    pub shard_count: u16,
    /// This boot (larger on every boot of this replica).
    pub incarnation: u64,
    /// Ceiling on a consensus frame, header included.
    pub frame_size_max: u32,
    /// The cluster secret's key: both ends of every connection prove it.
    pub key: ClusterKey,
    /// Where lane events are counted.
    pub metrics: Arc<BusMetrics>,
}

impl BusConfig {
    /// The other replicas.
    pub fn peers(&self) -> impl Iterator<Item = (ReplicaId, SocketAddr)> + '_ {
        self.roster.iter().copied().filter(|(id, _)| *id != self.me)
    }

    fn ids(&self) -> Vec<ReplicaId> {
        self.roster.iter().map(|(id, _)| *id).collect()
    }

    /// The hello this replica sends `to` for `lane`.
    pub fn hello_for(&self, to: ReplicaId, lane: Lane) -> Hello {
        Hello {
            cluster: self.cluster,
            from: self.me,
            to,
            lane,
            shard_count: self.shard_count,
            incarnation: self.incarnation,
            // Each dial draws its own (`dial_blocking`).
            nonce: [0; auth::NONCE_SIZE],
        }
    }
}

/// A connection that passed its handshake, on its way to its owner.
#[derive(Debug)]
pub struct Greeted {
    /// The dialer's hello.
    pub hello: Hello,
    /// The socket (blocking mode; the owner converts it).
    pub stream: TcpStream,
}

/// Where the accepter sends each lane's connections.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Per shard index.
    pub shards: Vec<mpsc::UnboundedSender<Greeted>>,
    /// The forward lane (served on shard 0's thread).
    pub forward: mpsc::UnboundedSender<Greeted>,
}

/// The accepting side: one thread, stopped by [`Acceptor::stop`].
#[derive(Debug)]
pub struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Acceptor {
    /// Starts accepting on `listener`.
    ///
    /// # Errors
    /// A sentence if the listener cannot be polled or the thread not
    /// started.
    pub fn start(
        listener: TcpListener,
        config: Arc<BusConfig>,
        routes: Routes,
    ) -> Result<Self, String> {
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the replica listener's address: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("polling the replica listener on {addr}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("replica-bus-accept".into())
            .spawn(move || accept_loop(&listener, &config, &routes, &stopping))
            .map_err(|e| format!("starting the replica-bus accept thread: {e}"))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            addr,
        })
    }

    /// The address peers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The highest incarnation accepted per dialer and lane.
type Incarnations = Arc<Mutex<HashMap<(ReplicaId, Lane), u64>>>;

fn accept_loop(
    listener: &TcpListener,
    config: &Arc<BusConfig>,
    routes: &Routes,
    stop: &AtomicBool,
) {
    let seen: Incarnations = Arc::default();
    let in_flight = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let Some(slot) = HandshakeSlot::take(&in_flight) else {
                    config.metrics.connection_refused(REFUSED_HANDSHAKES_FULL);
                    tracing::debug!(%peer, limit = HANDSHAKES_MAX, "replica handshakes full; connection closed");
                    drop(stream);
                    continue;
                };
                let config = Arc::clone(config);
                let routes = routes.clone();
                let seen = Arc::clone(&seen);
                // A handshake may take up to its timeout; it runs beside
                // the accept loop so one slow dialer delays no other. The
                // slot is freed when the thread ends, or at once if it
                // cannot start (the closure is dropped).
                let spawned = std::thread::Builder::new()
                    .name("replica-bus-hello".into())
                    .spawn(move || {
                        greet(stream, peer, &config, &routes, &seen);
                        drop(slot);
                    });
                if let Err(error) = spawned {
                    tracing::warn!(%peer, %error, "no thread for a replica handshake");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => {
                tracing::warn!(%error, "replica-bus accept failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// One of the [`HANDSHAKES_MAX`] handshakes in flight, given back on drop.
struct HandshakeSlot(Arc<AtomicUsize>);

impl HandshakeSlot {
    /// A slot, unless every one is taken.
    fn take(in_flight: &Arc<AtomicUsize>) -> Option<Self> {
        in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < HANDSHAKES_MAX).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(Arc::clone(in_flight)))
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads and checks a hello, challenges it, checks the dialer's proof,
/// answers with a verdict, and routes the connection.
fn greet(
    mut stream: TcpStream,
    peer: SocketAddr,
    config: &BusConfig,
    routes: &Routes,
    seen: &Incarnations,
) {
    let prepared = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)));
    if let Err(error) = prepared {
        tracing::debug!(%peer, %error, "replica connection unusable");
        return;
    }
    let checked = match authenticate(&mut stream, config) {
        Ok(hello) => admit(seen, &hello).map(|()| hello),
        Err(Handshake::Refused(refusal)) => Err(refusal),
        Err(Handshake::Io(error)) => {
            tracing::debug!(%peer, %error, "replica connection closed during its handshake");
            return;
        }
    };
    let verdict = match checked {
        Ok(_) => Verdict::Accepted {
            incarnation: config.incarnation,
        },
        Err(refusal) => Verdict::Refused(refusal),
    };
    if let Err(error) = stream.write_all(&verdict.encode()) {
        tracing::debug!(%peer, %error, "replica handshake answer not written");
        return;
    }
    let hello = match checked {
        Ok(hello) => hello,
        Err(refusal) => {
            config.metrics.connection_refused(refusal.label());
            tracing::warn!(%peer, %refusal, "refused a replica connection");
            return;
        }
    };
    let ready = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .and_then(|()| stream.set_nodelay(true));
    if let Err(error) = ready {
        tracing::debug!(%peer, %error, "replica connection unusable after its handshake");
        return;
    }
    let route = match hello.lane {
        Lane::Shard(index) => routes.shards.get(usize::from(index)),
        Lane::Forward => Some(&routes.forward),
    };
    if let Some(route) = route
        && route.unbounded_send(Greeted { hello, stream }).is_err()
    {
        tracing::debug!(%peer, "the lane's owner stopped; connection dropped");
    }
}

/// Why an accepter's handshake ended before its verdict.
enum Handshake {
    /// Answer with this refusal.
    Refused(Refusal),
    /// The connection failed; nothing to answer.
    Io(std::io::Error),
}

/// The accepter's side up to the verdict: the hello read and checked, the
/// challenge sent, the dialer's proof read and checked. Incarnations are
/// admitted by the caller, only for an authenticated hello.
fn authenticate(stream: &mut TcpStream, config: &BusConfig) -> Result<Hello, Handshake> {
    let mut bytes = [0u8; HELLO_SIZE];
    stream.read_exact(&mut bytes).map_err(Handshake::Io)?;
    let ids = config.ids();
    let local = Local {
        cluster: config.cluster,
        me: config.me,
        roster: &ids,
        shard_count: config.shard_count,
    };
    let hello = Hello::decode(&bytes).map_err(Handshake::Refused)?;
    hello.check(&local).map_err(Handshake::Refused)?;
    let nonce = auth::fresh_nonce().map_err(Handshake::Io)?;
    let challenge = Challenge {
        nonce,
        proof: config.key.accepter_proof(&bytes, &nonce),
    };
    stream
        .write_all(&challenge.encode())
        .map_err(Handshake::Io)?;
    let mut answer = [0u8; PROOF_MESSAGE_SIZE];
    stream.read_exact(&mut answer).map_err(Handshake::Io)?;
    let proof = Proof::decode(&answer).map_err(Handshake::Refused)?;
    if !config
        .key
        .check_dialer(&bytes, &nonce, &challenge.proof, &proof.0)
    {
        return Err(Handshake::Refused(Refusal::Unauthenticated));
    }
    Ok(hello)
}

/// Admits a hello unless a later boot of its dialer holds the lane.
fn admit(seen: &Incarnations, hello: &Hello) -> Result<(), Refusal> {
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let highest = seen.entry((hello.from, hello.lane)).or_insert(0);
    if hello.incarnation < *highest {
        return Err(Refusal::StaleIncarnation);
    }
    *highest = hello.incarnation;
    Ok(())
}

/// Why a dial did not give a connection.
#[derive(Debug)]
pub enum DialError {
    /// Connecting or the handshake's I/O failed.
    Io(std::io::Error),
    /// The peer refused the hello.
    Refused(Refusal),
    /// The peer's answer was not a challenge or a verdict.
    BadVerdict,
    /// The peer's challenge did not prove the cluster secret: it is not a
    /// replica of this cluster, or holds another secret.
    AccepterUnauthenticated,
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Refused(r) => write!(f, "refused: {r}"),
            Self::BadVerdict => {
                f.write_str("the answer to the hello is not a challenge or verdict")
            }
            Self::AccepterUnauthenticated => {
                f.write_str("the peer did not prove the cluster secret (another secret?)")
            }
        }
    }
}

/// Connects to `addr` and runs the handshake with a fresh nonce, on the
/// calling (blocking) thread; the accepter's incarnation on success.
///
/// # Errors
/// [`DialError`] naming what failed.
pub fn dial_blocking(
    addr: SocketAddr,
    hello: Hello,
    key: &ClusterKey,
) -> Result<(TcpStream, u64), DialError> {
    let mut stream = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT).map_err(DialError::Io)?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(DialError::Io)?;
    let hello = Hello {
        nonce: auth::fresh_nonce().map_err(DialError::Io)?,
        ..hello
    };
    let sent = hello.encode();
    stream.write_all(&sent).map_err(DialError::Io)?;
    let mut bytes = [0u8; CHALLENGE_SIZE];
    stream
        .read_exact(&mut bytes[..VERDICT_SIZE])
        .map_err(DialError::Io)?;
    if !Challenge::starts(&bytes) {
        // A refusal before the proofs (another cluster, a stale boot...).
        return match Verdict::decode(&bytes[..VERDICT_SIZE]) {
            Ok(Verdict::Refused(refusal)) => Err(DialError::Refused(refusal)),
            Ok(Verdict::Accepted { .. }) | Err(()) => Err(DialError::BadVerdict),
        };
    }
    stream
        .read_exact(&mut bytes[VERDICT_SIZE..])
        .map_err(DialError::Io)?;
    let challenge = Challenge::decode(&bytes).map_err(|()| DialError::BadVerdict)?;
    if !key.check_accepter(&sent, &challenge.nonce, &challenge.proof) {
        return Err(DialError::AccepterUnauthenticated);
    }
    let proof = Proof(key.dialer_proof(&sent, &challenge.nonce, &challenge.proof));
    stream.write_all(&proof.encode()).map_err(DialError::Io)?;
    let mut verdict = [0u8; VERDICT_SIZE];
    stream.read_exact(&mut verdict).map_err(DialError::Io)?;
    match Verdict::decode(&verdict).map_err(|()| DialError::BadVerdict)? {
        Verdict::Accepted { incarnation } => {
            stream
                .set_read_timeout(None)
                .and_then(|()| stream.set_write_timeout(None))
                .map_err(DialError::Io)?;
            Ok((stream, incarnation))
        }
        Verdict::Refused(refusal) => Err(DialError::Refused(refusal)),
    }
}

/// [`dial_blocking`] on a helper thread, awaited.
pub async fn dial(addr: SocketAddr, hello: Hello, key: ClusterKey) -> Result<TcpStream, DialError> {
    match compio::runtime::spawn_blocking(move || dial_blocking(addr, hello, &key)).await {
        Ok(Ok((stream, _))) => Ok(stream),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(DialError::Io(std::io::Error::other(
            "the dial thread panicked",
        ))),
    }
}

/// Jittered exponential backoff, capped, reset after a connection that
/// lived.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    prng: Prng,
}

impl Backoff {
    /// A backoff whose jitter is drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            next: BACKOFF_MIN,
            prng: Prng::new(seed),
        }
    }

    /// The next delay: the current step with ±50% jitter; the step
    /// doubles up to [`BACKOFF_MAX`].
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let half = u64::try_from(step.as_micros() / 2).unwrap_or(u64::MAX);
        let jitter = self.prng.below_inclusive(half.saturating_mul(2));
        Duration::from_micros(half.saturating_add(jitter))
    }

    /// Starts again from [`BACKOFF_MIN`].
    pub fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// A duplicate of a socket kept to shut it down: a shutdown wakes the
/// reader (end of stream) and fails the writer, whoever holds them.
fn closer_of(stream: &TcpStream) -> Option<TcpStream> {
    stream.try_clone().ok()
}

struct Link {
    id: u64,
    closer: Option<TcpStream>,
}

/// One shard's lanes to its peers, on its own thread.
struct Links {
    env: Rc<CompioEnv>,
    inbox: Inbox,
    frame_size_max: u32,
    shard: u16,
    by_peer: RefCell<BTreeMap<u8, Link>>,
    next_id: std::cell::Cell<u64>,
    /// Peers whose lane has been up before (a new one is a reconnect).
    ever_up: RefCell<std::collections::BTreeSet<u8>>,
    metrics: Arc<BusMetrics>,
}

impl Links {
    /// Makes `stream` the lane to `peer`, replacing (and closing) the one
    /// before; returns a signal fired when this connection ends.
    fn install(self: &Rc<Self>, peer: ReplicaId, stream: TcpStream) -> oneshot::Receiver<()> {
        let (ended_tx, ended) = oneshot::channel();
        let closer = closer_of(&stream);
        let stream = match compio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(peer = peer.0, shard = self.shard, %error, "a replica connection could not join the runtime");
                return ended;
            }
        };
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let old = self
            .by_peer
            .borrow_mut()
            .insert(peer.0, Link { id, closer });
        let replaced = old.is_some();
        if let Some(Link {
            closer: Some(old), ..
        }) = old
        {
            let _ = old.shutdown(Shutdown::Both);
        }
        if replaced {
            // The old connection's reader will find itself replaced and
            // count nothing; its lane is down here.
            self.metrics.lane_down(peer.0, LANE_SHARD, "replaced");
        }
        let again = !self.ever_up.borrow_mut().insert(peer.0);
        self.metrics.lane_up(peer.0, LANE_SHARD, again);
        let (queue, frames) = mpsc::channel(PEER_QUEUE_FRAMES);
        self.env.set_peer(peer, Some(queue));
        tracing::info!(peer = peer.0, shard = self.shard, "replica lane up");
        compio::runtime::spawn(lane::write_coalesced(stream.clone(), frames)).detach();
        let links = Rc::clone(self);
        compio::runtime::spawn(async move {
            let end = read_loop(stream, links.inbox.clone(), peer, links.frame_size_max).await;
            links.ended(peer, id, &end);
            let _ = ended_tx.send(());
        })
        .detach();
        ended
    }

    /// A connection's reader ended: if it is still the peer's lane, the
    /// lane is down (sends drop until a new one is installed).
    fn ended(&self, peer: ReplicaId, id: u64, end: &ReadEnd) {
        let mut by_peer = self.by_peer.borrow_mut();
        let current = by_peer.get(&peer.0).is_some_and(|l| l.id == id);
        if current {
            if let Some(Link {
                closer: Some(closer),
                ..
            }) = by_peer.remove(&peer.0)
            {
                let _ = closer.shutdown(Shutdown::Both);
            }
            self.env.set_peer(peer, None);
            self.metrics.lane_down(peer.0, LANE_SHARD, end.label());
            tracing::info!(peer = peer.0, shard = self.shard, reason = %end, "replica lane down");
        }
    }
}

/// Why a lane's reader stopped.
#[derive(Debug)]
pub enum ReadEnd {
    /// The socket failed or closed.
    Io(std::io::Error),
    /// A frame's size is below the header or above the ceiling: the
    /// stream can no longer be trusted to be aligned on frames.
    BadSize {
        /// The size field.
        size: u32,
    },
    /// The shard stopped.
    ShardStopped,
}

impl ReadEnd {
    /// The reason as a metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::BadSize { .. } => "bad_size",
            Self::ShardStopped => "shard_stopped",
        }
    }
}

/// The metric label of the consensus lanes.
pub const LANE_SHARD: &str = "shard";
/// The metric label of the forward lanes this replica dialled (its
/// requests to a peer's primaries).
pub const LANE_FORWARD: &str = "forward";
/// The metric label of the forward lanes a peer dialled to this replica
/// (the peer's requests, served here).
pub const LANE_FORWARD_IN: &str = "forward_in";

impl std::fmt::Display for ReadEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::BadSize { size } => write!(f, "a frame of {size} bytes is outside the bounds"),
            Self::ShardStopped => f.write_str("the shard stopped"),
        }
    }
}

/// Reads whole consensus frames into the shard's inbox until the
/// connection ends.
async fn read_loop(
    mut stream: compio::net::TcpStream,
    mut inbox: Inbox,
    from: ReplicaId,
    size_max: u32,
) -> ReadEnd {
    loop {
        let BufResult(read, header) = stream.read_exact(Vec::with_capacity(HEADER_SIZE)).await;
        if let Err(e) = read {
            return ReadEnd::Io(e);
        }
        let size = consensus::header::peek_size(&header).unwrap_or(0);
        if (size as usize) < HEADER_SIZE || size > size_max {
            return ReadEnd::BadSize { size };
        }
        let body_len = size as usize - HEADER_SIZE;
        let mut frame = header;
        if body_len > 0 {
            let BufResult(read, body) = stream.read_exact(Vec::with_capacity(body_len)).await;
            if let Err(e) = read {
                return ReadEnd::Io(e);
            }
            frame.extend_from_slice(&body);
        }
        let input = Input::Frame {
            from,
            bytes: Bytes::from(frame),
        };
        if inbox.send(input).await.is_err() {
            return ReadEnd::ShardStopped;
        }
    }
}

/// Runs one shard's lanes on its thread: installs the connections the
/// accepter routes here, and keeps a dialer per peer with a higher id.
/// Returns at once; the tasks live on the shard's runtime.
pub fn start_shard_lanes(
    env: Rc<CompioEnv>,
    inbox: Inbox,
    shard: u16,
    config: Arc<BusConfig>,
    mut accepted: mpsc::UnboundedReceiver<Greeted>,
) {
    let links = Rc::new(Links {
        env,
        inbox,
        frame_size_max: config.frame_size_max,
        shard,
        by_peer: RefCell::new(BTreeMap::new()),
        next_id: std::cell::Cell::new(1),
        ever_up: RefCell::new(std::collections::BTreeSet::new()),
        metrics: Arc::clone(&config.metrics),
    });
    let accepting = Rc::clone(&links);
    compio::runtime::spawn(async move {
        while let Some(Greeted { hello, stream }) = accepted.next().await {
            drop(accepting.install(hello.from, stream));
        }
    })
    .detach();
    for (peer, addr) in config.peers() {
        if peer.0 <= config.me.0 {
            continue;
        }
        let links = Rc::clone(&links);
        let hello = config.hello_for(peer, Lane::Shard(shard));
        let key = config.key.clone();
        let seed = config.incarnation ^ (u64::from(peer.0) << 48) ^ u64::from(shard);
        compio::runtime::spawn(async move {
            lane::redial(addr, hello, &key, seed, &links.metrics, async |stream| {
                let _ = links.install(peer, stream).await;
            })
            .await;
        })
        .detach();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::node::metrics::ReasonLabel;

    #[test]
    fn given_failures_when_backing_off_should_grow_to_the_cap_with_jitter() {
        let mut b = Backoff::new(7);
        let mut last_step = Duration::ZERO;
        for i in 0..20 {
            let d = b.next_delay();
            let step = (BACKOFF_MIN * 2u32.pow(i.min(10))).min(BACKOFF_MAX);
            assert!(
                d >= step / 2 && d <= step + step / 2,
                "{i}: {d:?} for step {step:?}"
            );
            last_step = step;
        }
        assert_eq!(last_step, BACKOFF_MAX);
        b.reset();
        assert!(b.next_delay() <= BACKOFF_MIN + BACKOFF_MIN / 2);
    }

    #[test]
    fn given_a_later_boot_when_admitted_should_refuse_the_earlier() {
        let seen: Incarnations = Arc::default();
        let hello = |incarnation| Hello {
            cluster: 1,
            from: ReplicaId(0),
            to: ReplicaId(1),
            lane: Lane::Shard(0),
            shard_count: 1,
            incarnation,
            nonce: [0; auth::NONCE_SIZE],
        };
        assert_eq!(admit(&seen, &hello(5)), Ok(()));
        assert_eq!(admit(&seen, &hello(5)), Ok(()), "a reconnect of one boot");
        assert_eq!(admit(&seen, &hello(9)), Ok(()));
        assert_eq!(admit(&seen, &hello(5)), Err(Refusal::StaleIncarnation));
        let other_lane = Hello {
            lane: Lane::Forward,
            ..hello(1)
        };
        assert_eq!(admit(&seen, &other_lane), Ok(()));
    }

    fn config(me: u8, addrs: &[SocketAddr], shard_count: u16) -> BusConfig {
        BusConfig {
            cluster: 42,
            me: ReplicaId(me),
            roster: addrs
                .iter()
                .enumerate()
                .map(|(i, a)| (ReplicaId(i as u8), *a))
                .collect(),
            shard_count,
            incarnation: 1000 + u64::from(me),
            frame_size_max: 1 << 20,
            key: ClusterKey::from_secret(SECRET).unwrap(),
            metrics: Arc::default(),
        }
    }

    const SECRET: &[u8] = b"a test cluster's secret, 32 bytes or more";

    /// A hello as routed, its nonce (drawn by the dial) aside.
    fn routed(greeted: &Greeted) -> Hello {
        Hello {
            nonce: [0; auth::NONCE_SIZE],
            ..greeted.hello
        }
    }

    /// Threads of this process named as the accepter names its handshake
    /// threads (the kernel keeps 15 bytes of a name).
    fn handshake_threads() -> usize {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .map_while(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|name| name.trim_end() == "replica-bus-hel")
            })
            .count()
    }

    #[test]
    fn given_many_idle_connections_when_accepted_should_cap_the_handshake_threads_and_still_admit_a_peer_after()
     {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let roster = [SocketAddr::from(([127, 0, 0, 1], 1)), addr];
        let accepter = Arc::new(config(1, &roster, 1));
        let metrics = Arc::clone(&accepter.metrics);
        let (shard0, mut shard0_rx) = mpsc::unbounded();
        let (forward, _forward_rx) = mpsc::unbounded();
        let acceptor = Acceptor::start(
            listener,
            accepter,
            Routes {
                shards: vec![shard0],
                forward,
            },
        )
        .unwrap();
        // Connections that never greet: each would hold a thread for the
        // handshake timeout.
        let idle_count = HANDSHAKES_MAX * 4;
        let idle: Vec<TcpStream> = (0..idle_count)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let full = || {
            metrics
                .refused
                .get_or_create(&ReasonLabel {
                    reason: REFUSED_HANDSHAKES_FULL,
                })
                .get()
        };
        let expected = u64::try_from(idle_count - HANDSHAKES_MAX).unwrap();
        let deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
        while full() < expected {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {expected} excess connections closed",
                full()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Every connection is accepted; only the cap's worth greet. Other
        // tests of this binary may run a handshake or two meanwhile.
        let threads = handshake_threads();
        assert!(
            threads <= HANDSHAKES_MAX + 4,
            "{threads} handshake threads for {idle_count} idle connections"
        );
        assert_eq!(full(), expected, "no more than the excess refused");
        // The idle ones leave; a real peer is admitted (it retries while
        // the threads notice, as its dialer would with its backoff).
        drop(idle);
        let hello = config(0, &roster, 1).hello_for(ReplicaId(1), Lane::Shard(0));
        let deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
        loop {
            match dial_blocking(addr, hello, &ClusterKey::from_secret(SECRET).unwrap()) {
                Ok(_) => break,
                Err(error) => assert!(
                    std::time::Instant::now() < deadline,
                    "the peer was not admitted: {error}"
                ),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let greeted = futures::executor::block_on(shard0_rx.next()).unwrap();
        assert_eq!(routed(&greeted), hello);
        acceptor.stop();
    }

    #[test]
    fn given_a_real_listener_when_dialed_should_route_good_hellos_and_refuse_bad_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let roster = [SocketAddr::from(([127, 0, 0, 1], 1)), addr];
        let accepter = Arc::new(config(1, &roster, 2));
        let (shard0, mut shard0_rx) = mpsc::unbounded();
        let (shard1, _shard1_rx) = mpsc::unbounded();
        let (forward, mut forward_rx) = mpsc::unbounded();
        let acceptor = Acceptor::start(
            listener,
            accepter,
            Routes {
                shards: vec![shard0, shard1],
                forward,
            },
        )
        .unwrap();
        let dialer = config(0, &roster, 2);
        let key = &dialer.key;
        let good = dialer.hello_for(ReplicaId(1), Lane::Shard(0));
        let (_stream, incarnation) = dial_blocking(addr, good, key).unwrap();
        assert_eq!(incarnation, 1001);
        let greeted = futures::executor::block_on(shard0_rx.next()).unwrap();
        assert_eq!(routed(&greeted), good);
        let fwd = dialer.hello_for(ReplicaId(1), Lane::Forward);
        dial_blocking(addr, fwd, key).unwrap();
        assert_eq!(
            routed(&futures::executor::block_on(forward_rx.next()).unwrap()),
            fwd
        );
        let refusals = [
            (Hello { cluster: 9, ..good }, Refusal::WrongCluster),
            (
                Hello {
                    shard_count: 4,
                    ..good
                },
                Refusal::ShardCountMismatch,
            ),
            (
                Hello {
                    from: ReplicaId(5),
                    ..good
                },
                Refusal::UnknownReplica,
            ),
            (
                Hello {
                    incarnation: 1,
                    ..good
                },
                Refusal::StaleIncarnation,
            ),
        ];
        for (hello, refusal) in refusals {
            match dial_blocking(addr, hello, key) {
                Err(DialError::Refused(r)) => assert_eq!(r, refusal),
                other => panic!("{hello:?}: {other:?}"),
            }
        }
        // Garbage instead of a hello: refused as malformed, and the
        // accepter goes on serving.
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&[0xEE; HELLO_SIZE]).unwrap();
        let mut answer = [0u8; VERDICT_SIZE];
        raw.read_exact(&mut answer).unwrap();
        assert_eq!(
            Verdict::decode(&answer),
            Ok(Verdict::Refused(Refusal::Malformed))
        );
        let again = dialer.hello_for(ReplicaId(1), Lane::Shard(1));
        dial_blocking(addr, again, key).unwrap();
        acceptor.stop();
    }

    /// What an impostor's raw handshake got: the accepter's challenge (if
    /// any) and its verdict.
    fn impostor_handshake(
        addr: SocketAddr,
        hello: &[u8; HELLO_SIZE],
        answer: impl FnOnce(&Challenge) -> [u8; PROOF_MESSAGE_SIZE],
    ) -> (Challenge, Verdict) {
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).unwrap();
        raw.write_all(hello).unwrap();
        let mut bytes = [0u8; CHALLENGE_SIZE];
        raw.read_exact(&mut bytes).unwrap();
        let challenge = Challenge::decode(&bytes).unwrap();
        raw.write_all(&answer(&challenge)).unwrap();
        let mut verdict = [0u8; VERDICT_SIZE];
        raw.read_exact(&mut verdict).unwrap();
        (challenge, Verdict::decode(&verdict).unwrap())
    }

    /// An impostor with the right cluster id and roster but no secret, one
    /// with another secret, and one replaying a recorded handshake are
    /// each refused as unauthenticated on both lane kinds; nothing reaches
    /// a lane's owner, and the real peer's later boot is still admitted
    /// (an impostor's incarnation pins nothing).
    #[test]
    fn given_impostors_when_they_dial_either_lane_should_refuse_them_and_route_nothing() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let roster = [SocketAddr::from(([127, 0, 0, 1], 1)), addr];
        let accepter = Arc::new(config(1, &roster, 1));
        let metrics = Arc::clone(&accepter.metrics);
        let (shard0, mut shard0_rx) = mpsc::unbounded();
        let (forward, mut forward_rx) = mpsc::unbounded();
        let acceptor = Acceptor::start(
            listener,
            accepter,
            Routes {
                shards: vec![shard0],
                forward,
            },
        )
        .unwrap();
        let real = config(0, &roster, 1);
        let wrong = ClusterKey::from_secret(b"not this cluster's secret at all, 32+").unwrap();
        for lane in [Lane::Shard(0), Lane::Forward] {
            let hello = Hello {
                incarnation: u64::MAX,
                nonce: [9; auth::NONCE_SIZE],
                ..real.hello_for(ReplicaId(1), lane)
            };
            let bytes = hello.encode();
            // No secret: any proof will do as a guess.
            let (_, verdict) = impostor_handshake(addr, &bytes, |_| Proof([0; 32]).encode());
            assert_eq!(
                verdict,
                Verdict::Refused(Refusal::Unauthenticated),
                "{lane:?}"
            );
            // Another secret: a well-formed proof under the wrong key; the
            // accepter's proof does not verify under it either.
            let (challenge, verdict) = impostor_handshake(addr, &bytes, |c| {
                assert!(!wrong.check_accepter(&bytes, &c.nonce, &c.proof));
                Proof(wrong.dialer_proof(&bytes, &c.nonce, &c.proof)).encode()
            });
            assert_ne!(challenge.nonce, [0; auth::NONCE_SIZE]);
            assert_eq!(
                verdict,
                Verdict::Refused(Refusal::Unauthenticated),
                "{lane:?}"
            );
            // A recorded handshake: the real key's proof for an earlier
            // challenge, replayed against a fresh one.
            let mut recorded = None;
            let (first, verdict) = impostor_handshake(addr, &bytes, |c| {
                let proof = Proof(real.key.dialer_proof(&bytes, &c.nonce, &c.proof)).encode();
                recorded = Some(proof);
                proof
            });
            assert_eq!(
                verdict,
                Verdict::Accepted { incarnation: 1001 },
                "the recording"
            );
            let recorded = recorded.unwrap();
            let (second, verdict) = impostor_handshake(addr, &bytes, |_| recorded);
            assert_ne!(first.nonce, second.nonce, "every challenge is fresh");
            assert_eq!(
                verdict,
                Verdict::Refused(Refusal::Unauthenticated),
                "{lane:?}"
            );
        }
        // Only the two recordings (made with the real key) were routed.
        let routed_shard = futures::executor::block_on(shard0_rx.next()).unwrap();
        assert_eq!(routed_shard.hello.incarnation, u64::MAX);
        let routed_forward = futures::executor::block_on(forward_rx.next()).unwrap();
        assert_eq!(routed_forward.hello.lane, Lane::Forward);
        assert!(
            shard0_rx.try_recv().is_err(),
            "nothing else on the shard lane"
        );
        assert!(
            forward_rx.try_recv().is_err(),
            "nothing else on the forward lane"
        );
        // Counted once the verdict is written: wait for the last one.
        let unauthenticated = || {
            metrics
                .refused
                .get_or_create(&ReasonLabel {
                    reason: Refusal::Unauthenticated.label(),
                })
                .get()
        };
        let deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
        while unauthenticated() < 6 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(unauthenticated(), 6);
        acceptor.stop();
    }

    /// A refused impostor's incarnation does not count: the real peer
    /// dials with its own boot and is admitted.
    #[test]
    fn given_an_impostor_with_the_highest_incarnation_when_refused_should_not_pin_the_lane() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let roster = [SocketAddr::from(([127, 0, 0, 1], 1)), addr];
        let (shard0, mut shard0_rx) = mpsc::unbounded();
        let (forward, _forward_rx) = mpsc::unbounded();
        let acceptor = Acceptor::start(
            listener,
            Arc::new(config(1, &roster, 1)),
            Routes {
                shards: vec![shard0],
                forward,
            },
        )
        .unwrap();
        let real = config(0, &roster, 1);
        let pinned = Hello {
            incarnation: u64::MAX,
            ..real.hello_for(ReplicaId(1), Lane::Shard(0))
        };
        let wrong = ClusterKey::from_secret(b"not this cluster's secret at all, 32+").unwrap();
        assert!(matches!(
            dial_blocking(addr, pinned, &wrong),
            Err(DialError::AccepterUnauthenticated)
        ));
        let bytes = Hello {
            nonce: [1; 16],
            ..pinned
        }
        .encode();
        let (_, verdict) = impostor_handshake(addr, &bytes, |c| {
            Proof(wrong.dialer_proof(&bytes, &c.nonce, &c.proof)).encode()
        });
        assert_eq!(verdict, Verdict::Refused(Refusal::Unauthenticated));
        let hello = real.hello_for(ReplicaId(1), Lane::Shard(0));
        dial_blocking(addr, hello, &real.key).unwrap();
        let greeted = futures::executor::block_on(shard0_rx.next()).unwrap();
        assert_eq!(routed(&greeted), hello);
        acceptor.stop();
    }
}
