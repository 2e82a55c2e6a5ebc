//! The `replog` binary.
//!
//! - `replog` runs one replica: the shards on their threads, the client
//!   listener (Iggy 0.11.0 TCP, 127.0.0.1:8090 by default), the root user
//!   (`iggy`/`iggy` unless configured) created on a new cluster, until
//!   SIGINT or SIGTERM, then a clean stop (every shard flushes).
//! - `replog config` prints the effective configuration (defaults,
//!   `--config FILE`, `REPLOG_ROOT_PASSWORD`, flags).
//!
//! - `replog --config FILE` with a roster runs one replica of a cluster;
//!   the replica bus connects it to the others.
//! - `replog dev --replicas 3` runs a local cluster of three replicas on
//!   loopback as child processes (see [`dev`]).

mod dev;

use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

use clap::Parser;
use common::ReplicaId;
use common::admin::RosterAddress;
use server::config::{CLUSTER_SECRET_ENV, Cli, Command, Config};
use server::node::admin::Identity;
use server::node::backend::{NodeBackend, RootPassword, apply_root_password, ensure_root_user};
use server::node::bus::auth::ClusterKey;
use server::node::metrics::MetricsSetup;
use server::node::password_pool::PasswordPool;
use server::node::tls::{ClientCertificates, ClientTls};
use server::node::{BusSetup, ClientStarter, Node, NodeConfig, listener};
use server::session::ErrorClass;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = match Config::effective(&cli.overrides, cores) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("replog: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::Config) => {
            print!("{}", config.to_toml_redacted());
            ExitCode::SUCCESS
        }
        Some(Command::Dev(dev)) => dev::run(&config, &dev),
        Some(Command::Secret) => match server::node::bus::auth::fresh_secret() {
            Ok(secret) => {
                println!("{secret}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("replog secret: reading /dev/urandom: {e}");
                ExitCode::from(1)
            }
        },
        None => serve(config, cli.exit_with_stdin, cli.rejoin),
    }
}

/// Descriptors kept for sockets, the metadata plane and the runtime when
/// the log says how many partition groups in use at once the open-file
/// limit leaves room for (idle ones hold none).
const DESCRIPTORS_RESERVED: u64 = 512;

/// Raises the soft open-file limit to the hard one and says so.
fn report_open_file_limit() {
    use server::node::limits::{DESCRIPTORS_PER_GROUP, raise_open_file_limit};
    match raise_open_file_limit() {
        Ok(limit) => {
            let room = limit.groups_room(DESCRIPTORS_RESERVED);
            if limit.before == limit.now {
                tracing::info!(
                    limit = ?limit.now,
                    partitions_room = ?room,
                    per_partition = DESCRIPTORS_PER_GROUP,
                    "open-file limit (already at its hard limit)"
                );
            } else {
                tracing::info!(
                    from = ?limit.before,
                    to = ?limit.now,
                    partitions_room = ?room,
                    per_partition = DESCRIPTORS_PER_GROUP,
                    "raised the open-file limit to its hard limit"
                );
            }
        }
        Err(error) => tracing::warn!(
            %error,
            "could not raise the open-file limit; each partition in use holds up to {DESCRIPTORS_PER_GROUP} descriptors"
        ),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Logs go to stderr; stdout carries only the serving line.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

fn serve(config: Config, exit_with_stdin: bool, rejoin: bool) -> ExitCode {
    init_logging();
    let env_secret = std::env::var(CLUSTER_SECRET_ENV).ok();
    let key = match config.cluster_key(env_secret.as_deref()) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("replog: {e}");
            return ExitCode::from(2);
        }
    };
    let tls = match ClientTls::load(&config.client.tls) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("replog: client TLS: {e}");
            return ExitCode::from(2);
        }
    };
    report_client_transport(&config, tls.as_ref());
    report_open_file_limit();
    if config.root.password == server::config::RootUser::default().password
        && !config.client.listen.ip().is_loopback()
    {
        tracing::warn!(
            listen = %config.client.listen,
            "the root user's password is the default one on a listener other than loopback: set root.password or REPLOG_ROOT_PASSWORD"
        );
    }
    let node_config = node_config(&config, rejoin, key);
    let starter = client_starter(&config, tls.clone());
    let node = match Node::start(node_config, Some(starter)) {
        Ok(node) => node,
        Err(reason) => {
            eprintln!("replog: {reason}");
            return ExitCode::from(1);
        }
    };
    // The serving line, which tools and tests wait for, goes out once
    // every listener is up and the stop signals are caught: a SIGTERM
    // right after it must stop the replica cleanly, not kill it.
    wait_for_stop_signal(exit_with_stdin, || {
        print_serving(&node, &config, tls.is_some());
    });
    tracing::info!("stopping: finishing in-flight inputs and flushing");
    node.stop();
    ExitCode::SUCCESS
}

/// The node's configuration from the file's and the flags'.
fn node_config(config: &Config, rejoin: bool, key: Option<ClusterKey>) -> NodeConfig {
    let roster = config.roster();
    let replica_count = u8::try_from(roster.len()).unwrap_or(u8::MAX);
    // `cluster_key` refused a roster without a secret.
    let bus = key.filter(|_| roster.len() > 1).map(|key| BusSetup {
        listen: config.replica.listen,
        roster: roster
            .iter()
            .map(|r| (ReplicaId(r.id), r.replica_address))
            .collect(),
        key,
    });
    NodeConfig {
        cluster: u128::from(config.cluster_id),
        replica: ReplicaId(config.replica_id),
        replica_count,
        shard_count: config.shards.max(1),
        data_dir: config.data_dir.clone(),
        tick: Duration::from_millis(config.tick_ms.max(1)),
        client_addr: config.client.listen,
        client_frame_size_max_bytes: config.client.frame_size_max_bytes,
        client_limits: config.client.limits(),
        bus,
        rejoin,
        scrub_bytes_per_sec: config.storage.scrub_bytes_per_sec,
        record_interval: Duration::from_millis(config.storage.record_interval_ms),
        retained_bytes_per_shard: config.storage.retained_bytes_per_shard,
        poll_reply_bytes_max: config.client.poll_reply_bytes_max,
        heartbeat: Duration::from_millis(config.consensus.heartbeat_ms),
        primary_timeout: Duration::from_millis(config.consensus.primary_timeout_ms),
        metrics: config.metrics.listen.map(|listen| MetricsSetup {
            listen,
            detail: if config.metrics.partition_series {
                shard::SnapshotDetail::Groups
            } else {
                shard::SnapshotDetail::Totals
            },
        }),
    }
}

/// Says how clients connect: over TLS (and whether a client certificate
/// is required), or in clear, with a warning when the listener is not on
/// loopback (the login carries the password).
fn report_client_transport(config: &Config, tls: Option<&ClientTls>) {
    let listen = config.client.listen;
    match tls {
        Some(tls) => tracing::info!(
            %listen,
            cert_file = %config.client.tls.cert_file.as_deref().map_or_else(String::new, |p| p.display().to_string()),
            client_certificates = match tls.client_certificates() {
                ClientCertificates::Required => "required",
                ClientCertificates::NotAsked => "not asked",
            },
            "client listener speaks TLS"
        ),
        None if !listen.ip().is_loopback() => tracing::warn!(
            %listen,
            "client TLS is off and the client listener is not on loopback: passwords cross the network in clear (set client.tls, docs/operations.md#security)"
        ),
        None => {}
    }
}

/// What shard 0 runs once the node is up: the root user's creation and
/// the Iggy client listener (over TLS with `tls`).
fn client_starter(config: &Config, tls: Option<ClientTls>) -> ClientStarter {
    let topic_defaults = metadata::TopicConfig {
        segment_size_bytes: config.storage.segment_size_bytes,
        durability: if config.storage.fsync {
            metadata::Durability::Persisted
        } else {
            metadata::Durability::Replicated
        },
        ..metadata::TopicConfig::default()
    };
    let username = config.root.username.clone();
    let password = config.root.password.clone();
    let data_dir = config.data_dir.clone();
    let tag = boot_tag(config.replica_id);
    let identity = std::sync::Arc::new(Identity {
        replica: config.replica_id,
        roster: config
            .roster()
            .iter()
            .map(|r| RosterAddress {
                id: r.id,
                client_address: r.client_address.to_string(),
            })
            .collect(),
    });
    // Argon2 off the shard threads; without the pool (it failed to
    // start, which the log says) logins are checked in place.
    let passwords = match PasswordPool::start() {
        Ok(pool) => Some(pool),
        Err(error) => {
            tracing::error!(%error, "no password-check threads; logins are checked on shard 0");
            None
        }
    };
    Box::new(move |ctx| {
        let handles = ctx.handles.clone();
        compio::runtime::spawn(async move {
            create_root_user(&handles, &username, &password, &data_dir).await;
        })
        .detach();
        let handles = ctx.handles.clone();
        let forwarder = ctx.forwarder.clone();
        let metrics = ctx.metrics.clone();
        let make = Rc::new(move || {
            let backend = NodeBackend::new(handles.clone(), tag)
                .with_identity(identity.clone())
                .with_forwarder(forwarder.clone())
                .with_topic_defaults(topic_defaults);
            match &passwords {
                Some(pool) => backend.with_password_pool(pool.clone()),
                None => backend,
            }
        });
        compio::runtime::spawn(listener::serve(
            ctx.listener,
            ctx.session,
            make,
            Some(metrics),
            tls,
        ))
        .detach();
    })
}

/// The serving lines, which tools and tests wait for.
fn print_serving(node: &Node, config: &Config, tls: bool) {
    // "serving Iggy clients" is what tools wait for; the address stays the
    // first word that parses as one.
    let clients = if tls {
        "Iggy clients over TLS"
    } else {
        "Iggy clients"
    };
    // Before the serving line, which tools and tests wait for: once it is
    // out, every listener is up.
    if let Some(metrics_addr) = node.metrics_addr() {
        println!(
            "replog: replica {} metrics on http://{metrics_addr}/metrics",
            config.replica_id
        );
    }
    match node.replica_addr() {
        Some(replica_addr) => println!(
            "replog: replica {} serving {clients} on {} (replicas on {replica_addr}; data in {})",
            config.replica_id,
            node.client_addr(),
            config.data_dir.display()
        ),
        None => println!(
            "replog: replica {} serving {clients} on {} (data in {})",
            config.replica_id,
            node.client_addr(),
            config.data_dir.display()
        ),
    }
}

/// Where a replica records the root password it last applied from its
/// configuration (an Argon2 hash of it, in its data directory).
const ROOT_PASSWORD_APPLIED: &str = "root-password.applied";

/// Brings the root user in line with the configuration, retrying while
/// group 0 elects its first primary (a few ticks), for at most a minute:
/// creates it on a new cluster, and when the configured password differs
/// from the one this replica applied last (or it never recorded one),
/// makes it the stored one. A password left as it was configured is not
/// applied again, so one changed by other means stays.
async fn create_root_user(
    handles: &server::node::handle::ShardHandles,
    user: &str,
    pw: &str,
    data_dir: &std::path::Path,
) {
    let marker = data_dir.join(ROOT_PASSWORD_APPLIED);
    let applied_before = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|text| metadata::PasswordHash::from_phc(text.trim().to_owned()).ok())
        .is_some_and(|hash| metadata::verify_password(&hash, pw));
    for _ in 0..1200 {
        let result = if applied_before {
            ensure_root_user(handles, user, pw).await.map(|()| None)
        } else {
            apply_root_password(handles, user, pw).await.map(Some)
        };
        match result {
            Ok(done) => {
                if done == Some(RootPassword::Changed) {
                    tracing::info!(user, "root password changed to the configured one");
                }
                if done.is_some() {
                    record_applied_root_password(&marker, pw);
                }
                return;
            }
            Err(e) if e.class() == ErrorClass::Transient => {
                compio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                tracing::error!(error = %e, "could not create the root user or apply its password");
                return;
            }
        }
    }
    tracing::error!("the metadata group elected no primary within a minute; no root user");
}

/// Records the configured root password as applied (a hint: losing it
/// only makes the next boot compare again).
fn record_applied_root_password(marker: &std::path::Path, pw: &str) {
    let mut salt = [0u8; 16];
    let drawn = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut salt));
    let hash = drawn.map_err(|e| e.to_string()).and_then(|()| {
        metadata::hash_password(pw, &salt, metadata::HashParams::default())
            .map_err(|e| e.to_string())
    });
    let written = hash.and_then(|hash| {
        let tmp = marker.with_extension("tmp");
        std::fs::write(&tmp, hash.as_str())
            .and_then(|()| std::fs::rename(&tmp, marker))
            .map_err(|e| e.to_string())
    });
    if let Err(error) = written {
        tracing::warn!(file = %marker.display(), %error, "could not record the applied root password; the next boot compares again");
    }
}

/// Unique per replica and boot (consumer-group sessions are keyed by it).
fn boot_tag(replica: u8) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (u32::from(replica) << 24) | (nanos & 0x00FF_FFFF) | 1
}

/// Waits for SIGINT or SIGTERM, or, with `exit_with_stdin`, for stdin
/// to close (a `replog dev` parent holds its children's stdin: when it
/// exits, however it exits, they stop).
fn wait_for_stop_signal(exit_with_stdin: bool, on_ready: impl FnOnce()) {
    let (closed_tx, closed_rx) = futures::channel::oneshot::channel::<()>();
    if exit_with_stdin {
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin();
            while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
        });
    } else {
        std::mem::forget(closed_tx);
    }
    let runtime = match compio::runtime::RuntimeBuilder::new().build() {
        Ok(rt) => rt,
        Err(error) => {
            tracing::error!(%error, "no runtime to wait for signals; stopping now");
            return;
        }
    };
    runtime.block_on(async {
        let mut interrupt = std::pin::pin!(compio::signal::ctrl_c());
        let mut terminate = std::pin::pin!(compio::signal::unix::signal(15));
        // One poll of each installs its handler before anyone is told the
        // replica serves; a signal already caught ends the wait at once.
        let caught = std::future::poll_fn(|cx| {
            let i = interrupt.as_mut().poll(cx).is_ready();
            let t = terminate.as_mut().poll(cx).is_ready();
            std::task::Poll::Ready(i || t)
        })
        .await;
        on_ready();
        if caught {
            return;
        }
        let signal = futures::future::select(interrupt, terminate);
        let _ = futures::future::select(signal, closed_rx).await;
    });
}
