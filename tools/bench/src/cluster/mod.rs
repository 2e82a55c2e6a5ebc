//! The modes that start a cluster of their own: three `replog` processes
//! on loopback ([`process`]), watched through their metrics endpoints
//! ([`metrics`]).
//!
//! - [`transfer`]: fill a partition, wipe one replica, time its catch-up
//!   next to the disk's own speed ([`disk`]).
//! - [`failover`]: many partitions under load, kill -9 the replica that
//!   leads the most of them, time until each accepts produce again.
//! - [`memory`]: many partitions, each replica's resident memory idle and
//!   after a burst of large batches to all of them.
//!
//! Every process a mode started is stopped on every path, Ctrl-C included.

mod disk;
pub mod failover;
pub mod memory;
mod metrics;
mod probe;
mod process;
pub mod transfer;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use iggy::prelude::*;
use serde::Serialize;

use crate::actors;
use crate::args::{Cli, ClusterRun, DurabilityArg};
use crate::error::BenchError;
use crate::plan::{Plan, TOPIC};
use metrics::Scrape;
use process::{Cluster, REPLICAS};

/// Group 0's id in the metrics' `group` label (2^63).
const METADATA_GROUP: &str = "9223372036854775808";
/// Between two scrapes while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Why a cluster run failed.
#[derive(Debug)]
pub enum ClusterError {
    /// No `replog` binary where one was looked for.
    NoBinary {
        /// Where.
        looked: Vec<PathBuf>,
    },
    /// A replica's process could not be spawned.
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A replica did not print its serving line.
    NotServing {
        /// Which.
        replica: usize,
        /// The binary.
        binary: PathBuf,
        /// Its log.
        log: PathBuf,
        /// What happened instead.
        detail: String,
    },
    /// A replica exited when it should not have, or not cleanly.
    Exited {
        /// Which.
        replica: usize,
        /// How.
        status: String,
        /// Its log.
        log: PathBuf,
    },
    /// A metrics endpoint did not answer.
    Metrics {
        /// The endpoint.
        addr: SocketAddr,
        /// What went wrong.
        detail: String,
    },
    /// A file or directory operation failed.
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The SDK refused a set-up step.
    Sdk {
        /// What was being done.
        what: String,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// The bench's own clients failed (the transfer's fill, the failover's
    /// probers).
    Clients {
        /// What they were doing.
        what: &'static str,
        /// Why.
        source: Box<BenchError>,
    },
    /// A phase took longer than `--timeout`.
    Timeout {
        /// Which phase.
        phase: &'static str,
        /// The limit.
        limit: Duration,
        /// What was last seen.
        last: String,
    },
    /// Ctrl-C.
    Interrupted,
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoBinary { looked } => {
                let looked: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "no replog binary (looked at {}); build it with `cargo build --release -p server --bin replog` or pass --replog PATH",
                    looked.join(", ")
                )
            }
            Self::Spawn { binary, source } => {
                write!(f, "could not start {}: {source}", binary.display())
            }
            Self::NotServing {
                replica,
                binary,
                log,
                detail,
            } => write!(
                f,
                "replica {replica} ({}) did not start serving: {detail}; its log is {}",
                binary.display(),
                log.display()
            ),
            Self::Exited {
                replica,
                status,
                log,
            } => write!(
                f,
                "replica {replica} exited ({status}); its log is {}",
                log.display()
            ),
            Self::Metrics { addr, detail } => {
                write!(f, "the metrics endpoint http://{addr}/metrics: {detail}")
            }
            Self::Io { what, source } => write!(f, "{what}: {source}"),
            Self::Sdk { what, source } => {
                write!(f, "{what}: {source} (code {})", source.as_code())
            }
            Self::Clients { what, source } => write!(f, "{what}: {source}"),
            Self::Timeout { phase, limit, last } => write!(
                f,
                "{phase} took longer than {limit:?} (raise --timeout); last seen: {last}"
            ),
            Self::Interrupted => write!(f, "interrupted (Ctrl-C); every replica was stopped"),
        }
    }
}

impl std::error::Error for ClusterError {}

/// `--replog`, else `REPLOG_BIN`, else `replog` beside this executable.
fn resolve_binary(explicit: Option<&Path>) -> Result<PathBuf, ClusterError> {
    let mut looked = Vec::new();
    let candidates = explicit
        .map(Path::to_path_buf)
        .into_iter()
        .chain(std::env::var_os("REPLOG_BIN").map(PathBuf::from))
        .chain(
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|d| d.join("replog"))),
        );
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
        looked.push(candidate);
        if explicit.is_some() {
            // An explicit binary that is missing is an error, not a hint.
            break;
        }
    }
    Err(ClusterError::NoBinary { looked })
}

/// What every cluster run needs besides its own figures: the binary, where
/// it runs, how long a phase may take and the root user.
#[derive(Debug, Clone, Serialize)]
pub struct RunSetup {
    /// The `replog` binary.
    pub replog: PathBuf,
    /// The run's directory goes below this.
    #[serde(skip)]
    pub parent_dir: PathBuf,
    /// Keep the run's directory.
    #[serde(skip)]
    pub keep: bool,
    /// Per phase.
    #[serde(skip)]
    pub timeout: Duration,
    /// The cluster's root user (`--username`, default `iggy`).
    #[serde(skip)]
    pub username: String,
    /// Its password.
    #[serde(skip)]
    pub password: String,
}

/// One client's plan against `addr`: a balanced producer over the bench
/// topic's `partitions`, `messages_per_batch` messages of `message_size`
/// bytes per batch, logged in as the run's root user. The cluster modes'
/// probers, senders and load producers all use it.
pub(super) fn sender_plan(
    setup: &RunSetup,
    durability: DurabilityArg,
    partitions: u32,
    addr: SocketAddr,
    (message_size, messages_per_batch): (u32, u32),
) -> Plan {
    Plan {
        kind: crate::plan::Kind::BalancedProducer,
        actors: 1,
        streams: 1,
        partitions,
        message_size,
        messages_per_batch,
        batches_per_actor: 0,
        rate_bytes_per_second: None,
        warmup: Duration::ZERO,
        durability,
        addr,
        username: setup.username.clone(),
        password: setup.password.clone(),
        cleanup: false,
        baseline_dir: None,
    }
}

impl RunSetup {
    /// From the global flags and the mode's `run` flags; the error says
    /// which binary is missing.
    pub fn from_cli(cli: &Cli, run: &ClusterRun, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            replog: resolve_binary(run.replog.as_deref()).map_err(|e| e.to_string())?,
            parent_dir: run.dir.clone().unwrap_or_else(std::env::temp_dir),
            keep: run.keep,
            timeout,
            username: cli.connection.username.clone(),
            password: cli.connection.password.clone(),
        })
    }
}

/// A phase of `mode` starts: one line on stderr (stdout carries the report
/// alone).
fn progress(mode: &str, what: std::fmt::Arguments<'_>) {
    eprintln!("replog-bench {mode}: {what}");
}

fn per_second(amount: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        amount as f64 / seconds
    } else {
        0.0
    }
}

/// Logs in with `admin_plan` (retrying while the root user is being
/// created), creates stream 0 and its topic of `partitions` partitions with
/// the plan's durability; their ids.
async fn create_topic(
    admin_plan: &Plan,
    partitions: u32,
    timeout: Duration,
) -> Result<(u32, u32), ClusterError> {
    let addr = admin_plan.addr;
    let deadline = Instant::now() + timeout;
    let admin = loop {
        match actors::connect(admin_plan).await {
            Ok(client) => break client,
            Err(e) if Instant::now() >= deadline => {
                return Err(ClusterError::Timeout {
                    phase: "logging in on replica 0",
                    limit: timeout,
                    last: e.to_string(),
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let name = Plan::stream_name(0);
    let stream = admin
        .create_stream(&name)
        .await
        .map_err(|source| ClusterError::Sdk {
            what: format!("creating stream {name} on {addr}"),
            source: Box::new(source),
        })?;
    let options = TopicCreateOptions {
        partitions_count: Some(partitions),
        durability: match admin_plan.durability {
            DurabilityArg::Replicated => Durability::Replicated,
            DurabilityArg::Persisted => Durability::Persisted,
        },
        ..TopicCreateOptions::default()
    };
    let stream_ident = Identifier::numeric(stream.id).map_err(|source| ClusterError::Sdk {
        what: format!("stream id {}", stream.id),
        source: Box::new(source),
    })?;
    let topic = admin
        .create_topic(&stream_ident, TOPIC, &options)
        .await
        .map_err(|source| ClusterError::Sdk {
            what: format!("creating topic {TOPIC} in stream {name} on {addr}"),
            source: Box::new(source),
        })?;
    Ok((stream.id, topic.id))
}

/// Scrapes replicas `ids`, in that order; an error if one is not running.
async fn scrape_each(cluster: &mut Cluster, ids: &[usize]) -> Result<Vec<Scrape>, ClusterError> {
    cluster.check_alive()?;
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        let addr = cluster.metrics(id).ok_or_else(|| ClusterError::Exited {
            replica: id,
            status: "not running".into(),
            log: cluster.specs[id].log.clone(),
        })?;
        out.push(metrics::scrape(addr).await?);
    }
    Ok(out)
}

/// Scrapes every replica, by id.
async fn scrape_all(cluster: &mut Cluster) -> Result<Vec<Scrape>, ClusterError> {
    let ids: Vec<usize> = (0..REPLICAS).collect();
    scrape_each(cluster, &ids).await
}

/// Polls `check` over fresh scrapes of every replica until it gives a
/// value, or `timeout` passes.
async fn wait_for<T>(
    timeout: Duration,
    cluster: &mut Cluster,
    phase: &'static str,
    mut check: impl FnMut(&[Scrape]) -> Result<T, String>,
) -> Result<T, ClusterError> {
    let deadline = Instant::now() + timeout;
    loop {
        let scrapes = scrape_all(cluster).await?;
        let last = match check(&scrapes) {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(ClusterError::Timeout {
                phase,
                limit: timeout,
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The replicas (indexes into `scrapes`) that report being `group`'s
/// primary.
fn primaries(scrapes: &[Scrape], group: &str) -> Vec<usize> {
    scrapes
        .iter()
        .enumerate()
        .filter(|(_, s)| s.group_state(group).is_some_and(|g| g.primary))
        .map(|(i, _)| i)
        .collect()
}

/// Runs one cluster mode's `run` in its directory `dir` (from
/// [`run_dir`]): on success the directory is deleted unless `keep`; on
/// failure the replicas' data is deleted (unless `keep`) but their logs
/// and configuration files stay, and the error names where. Ctrl-C drops
/// `run`, and with it the cluster, which stops the replicas.
async fn in_run_dir<T>(
    dir: &Path,
    keep: bool,
    run: impl Future<Output = Result<T, ClusterError>>,
) -> Result<T, BenchError> {
    let outcome = tokio::select! {
        outcome = run => outcome,
        _ = tokio::signal::ctrl_c() => Err(ClusterError::Interrupted),
    };
    match outcome {
        Ok(value) => {
            if !keep {
                let _ = std::fs::remove_dir_all(dir);
            }
            Ok(value)
        }
        Err(error) => {
            if !keep {
                for i in 0..REPLICAS {
                    let _ = std::fs::remove_dir_all(dir.join(format!("r{i}")));
                }
            }
            Err(BenchError::Cluster {
                error,
                dir: dir.to_path_buf(),
            })
        }
    }
}

/// A fresh directory for one run below `parent`.
fn run_dir(parent: &Path, prefix: &str) -> Result<PathBuf, BenchError> {
    crate::baseline::unique_dir(parent, prefix)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_an_explicit_binary_that_is_missing_when_resolved_should_name_it_and_look_no_further() {
        let err = resolve_binary(Some(Path::new("/nonexistent/replog"))).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/replog") && text.contains("--replog"),
            "{text}"
        );
        assert!(!text.contains(", "), "only the explicit path: {text}");
    }
}
