//! A running replica: one OS thread per shard, each with its own compio
//! runtime running the shard's pump over [`env::CompioEnv`], and the
//! [`handle::ShardHandles`] through which the client listener reaches
//! them.
//!
//! Start-up is a list of short named steps ([`Node::start`]): check the
//! data directory's identity, bind the client listener, make every shard's
//! inbox, start the shard threads (each opens its groups from disk), wait
//! until every shard reports ready, then let shard 0 reconcile the
//! partition groups with the committed metadata and serve clients, and
//! serve the metrics endpoint when one is configured ([`metrics`]).

pub mod admin;
pub mod backend;
pub mod bus;
pub mod env;
pub mod forward;
pub mod fs;
pub mod handle;
pub mod identity;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod password_pool;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bus::{Acceptor, BusConfig, Greeted, Routes};
use common::ReplicaId;
use forward::Forwarder;
use futures::channel::{mpsc, oneshot};
use metrics::http::{HttpLimits, HttpServer};
use metrics::{ClientMetrics, Metrics, MetricsSetup};
use prometheus_client::metrics::histogram::Histogram;
use shard::{Input, Shard, ShardConfig, ShardIndex, shard_dir};

use crate::session::SessionConfig;
use env::CompioEnv;
use handle::ShardHandles;

/// Inputs a shard's inbox holds before senders wait (or drop frames).
pub const INBOX_CAPACITY: usize = 4096;

/// What a replica runs with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The cluster id (every frame and the data directory carry it).
    pub cluster: u128,
    /// This replica's id.
    pub replica: ReplicaId,
    /// Replicas in the cluster.
    pub replica_count: u8,
    /// Shards (threads) per replica; the same on every replica.
    pub shard_count: u16,
    /// The data directory.
    pub data_dir: PathBuf,
    /// The tick period.
    pub tick: Duration,
    /// Where clients connect (port 0 picks a free one).
    pub client_addr: SocketAddr,
    /// Ceiling on a client request frame.
    pub client_frame_size_max_bytes: u32,
    /// The client listener's limits.
    pub client_limits: crate::session::ClientLimits,
    /// The replica bus, for a cluster of more than one replica.
    pub bus: Option<BusSetup>,
    /// An empty data directory belongs to a replica whose disk was
    /// replaced (`replog --rejoin`): its groups stay out of every quorum
    /// until they caught up (shard::rejoin). Ignored once the directory
    /// holds this replica's identity, and for a single replica.
    pub rejoin: bool,
    /// The metrics endpoint, when one is served.
    pub metrics: Option<MetricsSetup>,
    /// Sealed-segment bytes each shard scrubs per second (0: off).
    pub scrub_bytes_per_sec: u64,
    /// `partitions::PartitionConfig::record_interval_us`, for every group.
    pub record_interval: Duration,
    /// [`shard::ShardConfig::retained_bytes_max`], for every shard.
    pub retained_bytes_per_shard: u64,
    /// Bytes of batches one poll returns at most.
    pub poll_reply_bytes_max: u64,
    /// A primary's heartbeat interval.
    pub heartbeat: Duration,
    /// A backup's wait for its primary before a view change.
    pub primary_timeout: Duration,
}

/// Where a replica's bus listens and where every replica's bus is.
#[derive(Debug, Clone)]
pub struct BusSetup {
    /// This replica's replica-bus listener (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Every replica's replica-bus address, this one included.
    pub roster: Vec<(ReplicaId, SocketAddr)>,
    /// The cluster secret's key (`Config::cluster_key`).
    pub key: bus::auth::ClusterKey,
}

/// A running replica.
#[derive(Debug)]
pub struct Node {
    handles: ShardHandles,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    client_addr: SocketAddr,
    acceptor: Option<Acceptor>,
    metrics: Arc<Metrics>,
    metrics_server: Option<HttpServer>,
}

impl Node {
    /// Starts the replica and returns once every shard has booted.
    ///
    /// # Errors
    /// A sentence naming the step that failed (identity, bind, a shard's
    /// boot).
    pub fn start(config: NodeConfig, clients: Option<ClientStarter>) -> Result<Self, String> {
        let identity = identity::of(&config);
        let recorded = identity::check(&config.data_dir, &identity)?;
        let rejoin = rejoin_decision(&config, recorded);
        let metrics = Arc::new(Metrics::new());
        let Bound {
            client: listener,
            client_addr,
            metrics: metrics_listener,
            bus,
        } = Bound::bind(&config, &metrics)?;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..config.shard_count)
            .map(|_| shard::inbox(INBOX_CAPACITY))
            .unzip();
        let (routes, lanes) = lane_routes(bus.as_ref().map(|(c, _)| c), config.shard_count);
        let handles = ShardHandles::new(senders.clone());
        let mut clients = clients.map(|start| ClientSide {
            listener: Some(listener),
            handles: handles.clone(),
            session: Arc::new(session_config(&config, client_addr)),
            metrics: metrics.client().clone(),
            start,
        });
        let (ready_tx, ready_rx) = std_mpsc::channel::<Result<u16, String>>();
        let mut stops = Vec::new();
        let mut threads = Vec::new();
        for ((index, inbox), lanes) in (0u16..).zip(receivers).zip(lanes) {
            let (stop_tx, stop_rx) = oneshot::channel();
            stops.push(stop_tx);
            threads.push(spawn_shard(ShardBoot {
                config: shard_config(&config, ShardIndex(index), rejoin),
                siblings: senders.clone(),
                inbox,
                stop: stop_rx,
                fsync: metrics.fsync_histogram(index),
                ready: ready_tx.clone(),
                clients: if index == 0 { clients.take() } else { None },
                lanes,
                handles: handles.clone(),
            })?);
        }
        drop(ready_tx);
        await_shards_booted(&ready_rx, config.shard_count)?;
        // After the shards booted: a rejoining shard 0 has recorded its
        // marker by now, so a crash before this line finds either an empty
        // directory (and starts again as the operator says) or the marker.
        if !recorded {
            identity::record(&config.data_dir, &identity)?;
        }
        let acceptor = match (bus, routes) {
            (Some((bus_config, listener)), Some(routes)) => {
                Some(Acceptor::start(listener, bus_config, routes)?)
            }
            _ => None,
        };
        let metrics_server = metrics_listener
            .zip(config.metrics.as_ref())
            .map(|(listener, setup)| serve_metrics(listener, setup.detail, &handles, &metrics))
            .transpose()?;
        log_serving(
            &config,
            client_addr,
            acceptor.as_ref(),
            metrics_server.as_ref(),
        );
        Ok(Self {
            handles,
            stops,
            threads,
            client_addr,
            acceptor,
            metrics,
            metrics_server,
        })
    }

    /// Where the metrics endpoint listens, when one is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(HttpServer::addr)
    }

    /// The replica's metrics (served or not).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The address other replicas dial, in a cluster.
    pub fn replica_addr(&self) -> Option<SocketAddr> {
        self.acceptor.as_ref().map(Acceptor::addr)
    }

    /// The address clients connect to.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The shards' handles.
    pub fn handles(&self) -> &ShardHandles {
        &self.handles
    }

    /// Stops every shard (each finishes its input at hand, flushes its
    /// groups and exits) and waits for the threads.
    pub fn stop(self) {
        if let Some(server) = self.metrics_server {
            server.stop();
        }
        if let Some(acceptor) = self.acceptor {
            acceptor.stop();
        }
        for stop in self.stops {
            let _ = stop.send(());
        }
        for thread in self.threads {
            if thread.join().is_err() {
                tracing::error!("a shard thread panicked while stopping");
            }
        }
    }
}

/// How long a listener's address may stay in use before start-up fails.
const BIND_RETRY_FOR: Duration = Duration::from_secs(10);

/// The sockets a replica serves on, all bound before any shard starts, so
/// a taken port fails the start at once; each is served once the shards
/// are up.
struct Bound {
    client: std::net::TcpListener,
    client_addr: SocketAddr,
    metrics: Option<std::net::TcpListener>,
    /// The replica bus, for a cluster of more than one replica.
    bus: Option<(Arc<BusConfig>, std::net::TcpListener)>,
}

impl Bound {
    fn bind(config: &NodeConfig, metrics: &Metrics) -> Result<Self, String> {
        let client = bind_retrying(config.client_addr, "client")?;
        let client_addr = client
            .local_addr()
            .map_err(|e| format!("reading the listener's address: {e}"))?;
        let metrics_listener = match &config.metrics {
            Some(setup) => Some(bind_retrying(setup.listen, "metrics")?),
            None => None,
        };
        let bus = match &config.bus {
            Some(setup) if setup.roster.len() > 1 => Some(open_bus(config, setup, metrics.bus())?),
            _ => None,
        };
        Ok(Self {
            client,
            client_addr,
            metrics: metrics_listener,
            bus,
        })
    }
}

/// The accepter's routes to each shard's replica-bus lanes, and each
/// shard's receiving end (shard 0's also takes the forward lanes); no
/// routes and no lanes without a bus.
fn lane_routes(
    bus_config: Option<&Arc<BusConfig>>,
    shard_count: u16,
) -> (Option<Routes>, Vec<Option<ShardLanes>>) {
    let Some(bus_config) = bus_config else {
        return (None, (0..shard_count).map(|_| None).collect());
    };
    let (shards, receivers): (Vec<_>, Vec<_>) = (0..shard_count)
        .map(|_| mpsc::unbounded::<Greeted>())
        .unzip();
    let (forward, forward_rx) = mpsc::unbounded();
    let mut forward_rx = Some(forward_rx);
    let lanes = receivers
        .into_iter()
        .enumerate()
        .map(|(index, accepted)| {
            Some(ShardLanes {
                config: Arc::clone(bus_config),
                accepted,
                forward: if index == 0 { forward_rx.take() } else { None },
            })
        })
        .collect();
    (Some(Routes { shards, forward }), lanes)
}

/// Starts one shard's thread, which boots the shard and runs its pump.
fn spawn_shard(boot: ShardBoot) -> Result<JoinHandle<()>, String> {
    let index = boot.config.shard.0;
    std::thread::Builder::new()
        .name(format!("shard-{index}"))
        .spawn(move || run_shard(boot))
        .map_err(|e| format!("starting shard thread {index}: {e}"))
}

/// Serves the metrics endpoint on `listener`, each scrape rendered from
/// the shards' answers at that moment.
fn serve_metrics(
    listener: std::net::TcpListener,
    detail: shard::SnapshotDetail,
    handles: &ShardHandles,
    metrics: &Arc<Metrics>,
) -> Result<HttpServer, String> {
    let handles = handles.clone();
    let source = Arc::clone(metrics);
    let render = Arc::new(move || source.render(&handles, detail));
    HttpServer::start(listener, HttpLimits::default(), render)
}

/// The one line an operator looks for once a replica is up.
fn log_serving(
    config: &NodeConfig,
    client_addr: SocketAddr,
    acceptor: Option<&Acceptor>,
    metrics_server: Option<&HttpServer>,
) {
    tracing::info!(
        replica = config.replica.0,
        cluster = format!("{:#x}", config.cluster),
        shards = config.shard_count,
        replicas = config.replica_count,
        %client_addr,
        replica_addr = %acceptor.map_or_else(|| "none".to_owned(), |a| a.addr().to_string()),
        metrics_addr = %metrics_server.map_or_else(|| "none".to_owned(), |m| m.addr().to_string()),
        data_dir = %config.data_dir.display(),
        "replica serving"
    );
}

/// Whether this start rejoins (`--rejoin` on an empty directory of a
/// multi-replica cluster), warning when the flag is ignored or when an
/// empty directory starts a new member.
fn rejoin_decision(config: &NodeConfig, recorded: bool) -> bool {
    let multi = config.bus.as_ref().is_some_and(|b| b.roster.len() > 1);
    let rejoin = config.rejoin && !recorded && multi;
    if config.rejoin && !rejoin {
        tracing::warn!(data_dir = %config.data_dir.display(), "--rejoin ignored: {}", if recorded { "the data directory already holds this replica's state" } else { "a single replica has no peers to catch up from" });
    } else if !recorded && multi {
        tracing::warn!(data_dir = %config.data_dir.display(), "empty data directory: starting as a new member of the cluster; if this replica's disk was replaced, stop it now and start it with --rejoin (docs/operations.md)");
    }
    rejoin
}

/// Waits for every shard thread's boot report; the first failure ends
/// the start.
fn await_shards_booted(
    ready: &std_mpsc::Receiver<Result<u16, String>>,
    shard_count: u16,
) -> Result<(), String> {
    for _ in 0..shard_count {
        match ready.recv() {
            Ok(Ok(_)) => {}
            Ok(Err(reason)) => return Err(reason),
            Err(_) => return Err("a shard thread ended during boot".into()),
        }
    }
    Ok(())
}

/// Binds a listener, retrying while its address is in use: after a
/// `kill -9`, the kernel releases the dead process's sockets only once
/// its io_uring instance is torn down, which it does asynchronously, so a
/// prompt restart can find its own port still taken for a moment.
fn bind_retrying(addr: SocketAddr, what: &str) -> Result<std::net::TcpListener, String> {
    let deadline = std::time::Instant::now() + BIND_RETRY_FOR;
    let mut logged = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                if !logged {
                    tracing::warn!(%addr, listener = what, "address in use; retrying for up to 10 s");
                    logged = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("binding the {what} listener on {addr}: {e}")),
        }
    }
}

/// Binds the replica listener and describes the bus.
fn open_bus(
    config: &NodeConfig,
    setup: &BusSetup,
    metrics: Arc<metrics::BusMetrics>,
) -> Result<(Arc<BusConfig>, std::net::TcpListener), String> {
    if setup.roster.len() != usize::from(config.replica_count)
        || !setup.roster.iter().any(|(id, _)| *id == config.replica)
    {
        return Err(format!(
            "the roster names {} replicas without replica {}, or not {} of them",
            setup.roster.len(),
            config.replica.0,
            config.replica_count
        ));
    }
    let listener = bind_retrying(setup.listen, "replica")?;
    let bus = BusConfig {
        cluster: config.cluster,
        me: config.replica,
        roster: setup.roster.clone(),
        shard_count: config.shard_count,
        incarnation: incarnation(),
        frame_size_max: consensus::header::FRAME_SIZE_MAX_DEFAULT,
        key: setup.key.clone(),
        metrics,
    };
    Ok((Arc::new(bus), listener))
}

/// This boot's incarnation: the wall clock in nanoseconds, larger on
/// every later boot of the replica (as long as the clock moves forward).
fn incarnation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn shard_config(config: &NodeConfig, index: ShardIndex, rejoin: bool) -> ShardConfig {
    let mut c = ShardConfig::new(
        config.cluster,
        config.replica,
        config.replica_count,
        index,
        config.shard_count,
        shard_dir(&config.data_dir, index),
    );
    c.tick = config.tick;
    c.rejoin = rejoin;
    let tick_us = u64::try_from(config.tick.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    c.scrub_bytes_per_tick = config.scrub_bytes_per_sec.saturating_mul(tick_us) / 1_000_000;
    c.record_interval_us = u64::try_from(config.record_interval.as_micros()).unwrap_or(u64::MAX);
    c.retained_bytes_max = config.retained_bytes_per_shard;
    c.poll_reply_bytes_max = config.poll_reply_bytes_max;
    let ticks = |d: Duration| (u64::try_from(d.as_micros()).unwrap_or(u64::MAX) / tick_us).max(1);
    c.timeouts.commit_message_ticks = ticks(config.heartbeat);
    c.timeouts.normal_heartbeat_ticks = ticks(config.primary_timeout);
    c.timeouts.view_change_status_ticks = ticks(config.primary_timeout);
    // Per boot: a restarted shard's VSR client id must differ from the
    // last boot's (request numbers start again at 1).
    c.seed = boot_seed() ^ u64::from(index.0);
    c.boot_tag = machine_boot_tag();
    c
}

/// The tag of this machine boot, from the kernel's boot id: a
/// `replicated` group's replica log is kept unsynced and trusted only by
/// the boot that wrote it (docs/consensus.md §4, "Kept replica logs").
/// 0 (unknown, no such log) where the file cannot be read.
fn machine_boot_tag() -> u32 {
    static TAG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| match std::fs::read_to_string(BOOT_ID_FILE) {
        Ok(text) => journal::boot_tag_of(&text),
        Err(error) => {
            tracing::warn!(file = BOOT_ID_FILE, %error, "no machine boot id: replicated groups keep no replica log, and a killed replica restarts without its journal");
            0
        }
    })
}

/// Where Linux names the current boot.
const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

fn boot_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // The low 64 bits of the boot time, mixed with the process id.
    (nanos as u64) ^ (u64::from(std::process::id()) << 32)
}

fn session_config(config: &NodeConfig, client_addr: SocketAddr) -> SessionConfig {
    use crate::protocol::records::{ClusterMetadata, ClusterNode, NodeRole, NodeStatus};
    SessionConfig {
        frame_size_max_bytes: config.client_frame_size_max_bytes,
        limits: config.client_limits,
        cluster: ClusterMetadata {
            name: "replog".into(),
            node: ClusterNode {
                name: format!("replica-{}", config.replica.0),
                ip: client_addr.ip().to_string(),
                tcp_port: client_addr.port(),
                quic_port: 0,
                http_port: 0,
                websocket_port: 0,
                role: NodeRole::Leader,
                status: NodeStatus::Healthy,
            },
        },
        server_version: crate::protocol::Name::new(concat!("replog ", env!("CARGO_PKG_VERSION")))
            .expect("the version text is a valid name"),
    }
}

/// What the client side gets on shard 0's runtime once the shards are up.
pub struct ClientContext {
    /// The bound client listener.
    pub listener: compio::net::TcpListener,
    /// The shards.
    pub handles: ShardHandles,
    /// What every session shares.
    pub session: Arc<SessionConfig>,
    /// Forwards calls to other replicas' primaries (a cluster only).
    pub forwarder: Option<Rc<Forwarder>>,
    /// The client instruments (connections, request latency).
    pub metrics: ClientMetrics,
}

/// Starts the client side (the listener and its backend) on shard 0's
/// runtime; the binary wires the real backend, tests their own.
pub type ClientStarter = Box<dyn FnOnce(ClientContext) + Send>;

struct ClientSide {
    listener: Option<std::net::TcpListener>,
    handles: ShardHandles,
    session: Arc<SessionConfig>,
    metrics: ClientMetrics,
    start: ClientStarter,
}

struct ShardBoot {
    config: ShardConfig,
    siblings: Vec<shard::Inbox>,
    inbox: mpsc::Receiver<Input>,
    stop: oneshot::Receiver<()>,
    fsync: Histogram,
    ready: std_mpsc::Sender<Result<u16, String>>,
    clients: Option<ClientSide>,
    lanes: Option<ShardLanes>,
    handles: ShardHandles,
}

/// A shard's part of the replica bus.
struct ShardLanes {
    config: Arc<BusConfig>,
    accepted: mpsc::UnboundedReceiver<Greeted>,
    /// Shard 0 also serves the forward lanes.
    forward: Option<mpsc::UnboundedReceiver<Greeted>>,
}

fn run_shard(boot: ShardBoot) {
    let index = boot.config.shard.0;
    let runtime = match compio::runtime::RuntimeBuilder::new().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = boot
                .ready
                .send(Err(format!("shard {index}: starting its runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let env = Rc::new(CompioEnv::with_fsync(boot.fsync));
        let dir = boot.config.dir.clone();
        let mut shard = match Shard::open(boot.config, env).await {
            Ok(shard) => shard,
            Err(e) => {
                let _ = boot.ready.send(Err(format!(
                    "shard {index}: opening {}: {e}",
                    dir.display()
                )));
                return;
            }
        };
        let own_inbox = boot.siblings.get(usize::from(index)).cloned();
        shard.set_siblings(boot.siblings);
        let mut forwarder = None;
        if let (Some(lanes), Some(own_inbox)) = (boot.lanes, own_inbox) {
            let ShardLanes {
                config,
                accepted,
                forward,
            } = lanes;
            bus::start_shard_lanes(shard.env(), own_inbox, index, Arc::clone(&config), accepted);
            if let Some(forward) = forward {
                forward::serve(boot.handles.clone(), forward, Arc::clone(&config.metrics));
                forwarder = Some(Forwarder::start(&config));
            }
        }
        let _ = boot.ready.send(Ok(index));
        if let Some(clients) = boot.clients {
            start_clients(clients, forwarder);
            shard.reconcile_partitions().await;
        }
        let shard = shard::pump::run(shard, boot.inbox, boot.stop).await;
        tracing::info!(
            shard = index,
            groups = shard.groups().count(),
            "shard stopped"
        );
    });
}

/// On shard 0's runtime: hands the listener to the client starter.
fn start_clients(clients: ClientSide, forwarder: Option<Rc<Forwarder>>) {
    let ClientSide {
        listener,
        handles,
        session,
        metrics,
        start,
    } = clients;
    let Some(listener) = listener else {
        return;
    };
    match compio::net::TcpListener::from_std(listener) {
        Ok(listener) => start(ClientContext {
            listener,
            handles,
            session,
            forwarder,
            metrics,
        }),
        Err(error) => tracing::error!(%error, "the client listener could not join the runtime"),
    }
}
