//! A running replica: one OS thread per shard, each with its own compio
//! runtime running the shard's pump over [`env::CompioEnv`], and the
//! [`handle::ShardHandles`] through which the client listener reaches
//! them.
//!
//! Start-up is a list of short named steps ([`Node::start`]): check the
//! data directory's identity, bind the client listener, make every shard's
//! inbox, start the shard threads (each opens its groups from disk), wait
//! until every shard reports ready, then let shard 0 reconcile the
//! partition groups with the committed metadata and serve clients.

pub mod backend;
pub mod env;
pub mod handle;
pub mod identity;
pub mod listener;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::ReplicaId;
use futures::channel::{mpsc, oneshot};
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
}

/// A running replica.
#[derive(Debug)]
pub struct Node {
    handles: ShardHandles,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    client_addr: SocketAddr,
}

impl Node {
    /// Starts the replica and returns once every shard has booted.
    ///
    /// # Errors
    /// A sentence naming the step that failed (identity, bind, a shard's
    /// boot).
    pub fn start(config: NodeConfig, clients: Option<ClientStarter>) -> Result<Self, String> {
        identity::check_or_record(&config.data_dir, &identity::of(&config))?;
        let listener = std::net::TcpListener::bind(config.client_addr)
            .map_err(|e| format!("binding the client listener on {}: {e}", config.client_addr))?;
        let client_addr = listener
            .local_addr()
            .map_err(|e| format!("reading the listener's address: {e}"))?;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..config.shard_count)
            .map(|_| shard::inbox(INBOX_CAPACITY))
            .unzip();
        let handles = ShardHandles::new(senders.clone());
        let (ready_tx, ready_rx) = std_mpsc::channel::<Result<u16, String>>();
        let mut stops = Vec::new();
        let mut threads = Vec::new();
        let mut listener = Some(listener);
        let mut clients = clients;
        for (index, inbox) in receivers.into_iter().enumerate() {
            let index = index as u16;
            let (stop_tx, stop_rx) = oneshot::channel();
            stops.push(stop_tx);
            let boot = ShardBoot {
                config: shard_config(&config, ShardIndex(index)),
                siblings: senders.clone(),
                inbox,
                stop: stop_rx,
                ready: ready_tx.clone(),
                clients: if index == 0 {
                    clients.take().map(|start| ClientSide {
                        listener: listener.take(),
                        handles: handles.clone(),
                        session: Arc::new(session_config(&config, client_addr)),
                        start,
                    })
                } else {
                    None
                },
            };
            let thread = std::thread::Builder::new()
                .name(format!("shard-{index}"))
                .spawn(move || run_shard(boot))
                .map_err(|e| format!("starting shard thread {index}: {e}"))?;
            threads.push(thread);
        }
        drop(ready_tx);
        for _ in 0..config.shard_count {
            match ready_rx.recv() {
                Ok(Ok(_)) => {}
                Ok(Err(reason)) => return Err(reason),
                Err(_) => return Err("a shard thread ended during boot".into()),
            }
        }
        tracing::info!(
            replica = config.replica.0,
            cluster = format!("{:#x}", config.cluster),
            shards = config.shard_count,
            %client_addr,
            data_dir = %config.data_dir.display(),
            "replica serving"
        );
        Ok(Self {
            handles,
            stops,
            threads,
            client_addr,
        })
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

fn shard_config(config: &NodeConfig, index: ShardIndex) -> ShardConfig {
    let mut c = ShardConfig::new(
        config.cluster,
        config.replica,
        config.replica_count,
        index,
        config.shard_count,
        shard_dir(&config.data_dir, index),
    );
    c.tick = config.tick;
    // Per boot: a restarted shard's VSR client id must differ from the
    // last boot's (request numbers start again at 1).
    c.seed = boot_seed() ^ u64::from(index.0);
    c
}

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
}

/// Starts the client side (the listener and its backend) on shard 0's
/// runtime; the binary wires the real backend, tests their own.
pub type ClientStarter = Box<dyn FnOnce(ClientContext) + Send>;

struct ClientSide {
    listener: Option<std::net::TcpListener>,
    handles: ShardHandles,
    session: Arc<SessionConfig>,
    start: ClientStarter,
}

struct ShardBoot {
    config: ShardConfig,
    siblings: Vec<shard::Inbox>,
    inbox: mpsc::Receiver<Input>,
    stop: oneshot::Receiver<()>,
    ready: std_mpsc::Sender<Result<u16, String>>,
    clients: Option<ClientSide>,
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
        let env = Rc::new(CompioEnv::new());
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
        shard.set_siblings(boot.siblings);
        let _ = boot.ready.send(Ok(index));
        if let Some(clients) = boot.clients {
            start_clients(clients);
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
fn start_clients(clients: ClientSide) {
    let ClientSide {
        listener,
        handles,
        session,
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
        }),
        Err(error) => tracing::error!(%error, "the client listener could not join the runtime"),
    }
}
