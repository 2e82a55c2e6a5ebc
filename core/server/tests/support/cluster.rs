//! A three-replica `replog` cluster of real processes on loopback, each
//! replica started from its own roster file on ports chosen free at run
//! time, and the reads the cluster tests and the nemesis test check it
//! with: every message of a partition from its first, and every
//! replica's segment files.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use iggy::prelude::*;
use journal::REPLICA_LOG_FILE;
use server::config::{Config, RosterEntry};

use super::process::Replog;

/// Ports that were free a moment ago, drawn below the kernel's ephemeral
/// range: a replica restarted on its port must not find it taken by some
/// outgoing connection's source port.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut ports = Vec::new();
    let mut held = Vec::new();
    for _ in 0..10_000 {
        if ports.len() == n {
            break;
        }
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(ports.len());
        let port = low + u16::try_from(h.finish() % u64::from(high - low)).unwrap();
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            ports.push(port);
            held.push(l);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free ports below {high}");
    ports
}

/// Segment files by path relative to a replica's data directory.
pub type Segments = BTreeMap<PathBuf, Vec<u8>>;

/// Each replica's segment files, by name and size in bytes.
pub type SegmentSizes = Vec<Vec<(String, usize)>>;

/// Three replicas of cluster 7, two shards each, in one temporary
/// directory; a replica not running is `None` in [`Cluster::nodes`].
/// Dropping the cluster kills whatever still runs.
pub struct Cluster {
    _dir: tempfile::TempDir,
    files: Vec<PathBuf>,
    /// Each replica's data directory.
    pub data: Vec<PathBuf>,
    /// Each replica's process, while it runs.
    pub nodes: Vec<Option<Replog>>,
    /// Each replica's client address, from the roster.
    pub clients: Vec<SocketAddr>,
    /// Each replica's replica-bus address, from the roster.
    pub peers: Vec<SocketAddr>,
    filter: Option<String>,
}

/// The cluster id every test cluster runs with.
pub const CLUSTER_ID: u64 = 7;

/// The cluster secret every test cluster's replicas prove to each other.
pub const SECRET: &str = "a test cluster's secret, 32 bytes or more";

impl Cluster {
    /// Three replicas of two shards each, started and serving.
    pub fn start(tune: impl Fn(&mut Config)) -> Self {
        Self::start_logging(tune, None)
    }

    /// As [`Cluster::start`], each replica logging with `filter` (kept,
    /// for [`Replog::logged`]).
    pub fn start_logging(tune: impl Fn(&mut Config), filter: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(6);
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let roster: Vec<RosterEntry> = (0..3u8)
            .map(|id| RosterEntry {
                id,
                client_address: at(ports[usize::from(id) * 2]),
                replica_address: at(ports[usize::from(id) * 2 + 1]),
            })
            .collect();
        // The replicas prove this secret to each other (docs/operations.md
        // "Security").
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
        let mut files = Vec::new();
        let mut data = Vec::new();
        for entry in &roster {
            let mut config = Config {
                data_dir: dir.path().join(format!("r{}", entry.id)),
                cluster_id: CLUSTER_ID,
                replica_id: entry.id,
                shards: 2,
                ..Config::default()
            };
            config.client.listen = entry.client_address;
            config.replica.listen = entry.replica_address;
            config.replica.secret_file = Some(secret.clone());
            config.replicas = roster.clone();
            tune(&mut config);
            let file = dir.path().join(format!("r{}.toml", entry.id));
            std::fs::write(&file, config.to_toml_redacted()).unwrap();
            files.push(file);
            data.push(config.data_dir.clone());
        }
        let mut cluster = Self {
            _dir: dir,
            files,
            data,
            nodes: vec![None, None, None],
            clients: roster.iter().map(|r| r.client_address).collect(),
            peers: roster.iter().map(|r| r.replica_address).collect(),
            filter: filter.map(str::to_owned),
        };
        for i in 0..3 {
            cluster.start_replica(i);
        }
        cluster
    }

    /// Starts replica `i` from its roster file.
    pub fn start_replica(&mut self, i: usize) {
        self.start_replica_with(i, &[]);
    }

    /// Starts replica `i` with `extra` flags after `--config FILE`.
    pub fn start_replica_with(&mut self, i: usize, extra: &[&str]) {
        let mut args: Vec<OsString> = vec!["--config".into(), self.files[i].clone().into()];
        args.extend(extra.iter().map(OsString::from));
        let node = match &self.filter {
            Some(filter) => Replog::start_logging(
                &args,
                &std::env::var("REPLOG_TEST_LOG").unwrap_or_else(|_| filter.clone()),
            ),
            None => Replog::start_with(&args),
        };
        assert_eq!(node.addr, self.clients[i]);
        self.nodes[i] = Some(node);
    }

    /// SIGKILL of replica `i`, which must be running.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].take().unwrap().kill9();
    }

    /// SIGTERM to every running replica, each expected to exit cleanly.
    pub fn stop(mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            node.stop();
        }
    }

    /// Every segment `.log` file of every partition group of replica `i`,
    /// by path relative to its data directory (not the replica log: it
    /// records each replica's own steps, so replicas never agree on it).
    pub fn segments(&self, i: usize) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        collect_logs(&self.data[i], &self.data[i], &mut out);
        out
    }

    /// Waits (at most `timeout`) until every replica holds the same
    /// segment files with some data in them; those files, or each
    /// replica's file names and sizes when they never agreed.
    pub fn identical_segments_within(&self, timeout: Duration) -> Result<Segments, SegmentSizes> {
        let deadline = Instant::now() + timeout;
        loop {
            let all: Vec<_> = (0..3).map(|i| self.segments(i)).collect();
            let equal = all[0] == all[1] && all[1] == all[2];
            let bytes: usize = all[0].values().map(Vec::len).sum();
            if equal && bytes > 0 {
                return Ok(all[0].clone());
            }
            if Instant::now() > deadline {
                return Err(all
                    .iter()
                    .map(|m| {
                        m.iter()
                            .map(|(p, b)| (p.display().to_string(), b.len()))
                            .collect()
                    })
                    .collect());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Waits (at most 60 s) until every replica holds the same segment files
/// with some data in them.
pub fn await_identical_segments(cluster: &Cluster) -> BTreeMap<PathBuf, Vec<u8>> {
    cluster
        .identical_segments_within(Duration::from_secs(60))
        .unwrap_or_else(|sizes| panic!("segments differ after 60 s: {sizes:?}"))
}

fn collect_logs(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.map_while(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_logs(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "log")
            && path.file_name().is_some_and(|n| n != REPLICA_LOG_FILE)
            && path
                .components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with("g-"))
        {
            // Retention may remove a segment between the listing and the
            // read: a file gone is simply not there (the callers compare
            // until the replicas agree).
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            out.insert(path.strip_prefix(root).unwrap().to_path_buf(), bytes);
        }
    }
}

/// Codes the cluster answers while it is between primaries, and the
/// SDK's own connection-level failures while a replica restarts.
pub fn transient(e: &IggyError) -> bool {
    matches!(e.as_code(), 57 | 58)
        || matches!(
            e,
            IggyError::Disconnected
                | IggyError::NotConnected
                | IggyError::CannotEstablishConnection
        )
}

/// Every message the partition holds, from its first, in order; each
/// poll retried while it fails transiently (at most 30 s a poll), any
/// other failure, or a transient one past that, returned.
pub async fn try_poll_all(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
) -> Result<Vec<(u64, String)>, IggyError> {
    let consumer = Consumer::new(Identifier::numeric(1).unwrap());
    let (stream, topic) = (
        Identifier::named(stream).unwrap(),
        Identifier::named(topic).unwrap(),
    );
    let mut out: Vec<(u64, String)> = Vec::new();
    loop {
        let strategy = match out.last() {
            Some((offset, _)) => PollingStrategy::offset(offset + 1),
            None => PollingStrategy::first(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let polled = loop {
            match client
                .poll_messages(
                    &stream,
                    &topic,
                    Some(partition),
                    &consumer,
                    &strategy,
                    1000,
                    false,
                )
                .await
            {
                Ok(polled) => break polled,
                Err(e) if transient(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        if polled.messages.is_empty() {
            return Ok(out);
        }
        out.extend(polled.messages.iter().map(|m| {
            (
                m.header.offset,
                String::from_utf8_lossy(&m.payload).into_owned(),
            )
        }));
    }
}

/// [`try_poll_all`], failing the test on an error.
pub async fn poll_all(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
) -> Vec<(u64, String)> {
    match try_poll_all(client, stream, topic, partition).await {
        Ok(read) => read,
        Err(e) => panic!("poll: {e:?} (code {})", e.as_code()),
    }
}
