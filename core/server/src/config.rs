//! The effective configuration of a `replog` replica.
//!
//! Sources, later ones winning: the built-in defaults, the TOML file given
//! with `--config`, the environment (`REPLOG_ROOT_PASSWORD`), and the
//! command-line flags. The file refuses unknown fields, so a misspelt key
//! is an error rather than a silently ignored default. Every field, with
//! its default, is documented in `docs/configuration.md`; the test
//! `given_the_docs_when_compared_should_document_every_field` keeps the two
//! in step.

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The environment variable that overrides the root password.
pub const ROOT_PASSWORD_ENV: &str = "REPLOG_ROOT_PASSWORD";
/// The environment variable holding the cluster secret itself (it wins
/// over `replica.secret_file`).
pub const CLUSTER_SECRET_ENV: &str = "REPLOG_CLUSTER_SECRET";

/// A replica's whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the replica keeps its data.
    pub data_dir: PathBuf,
    /// The cluster's id; every frame between replicas carries it, and a
    /// data directory of another cluster is refused.
    pub cluster_id: u64,
    /// This replica's id in the roster, `0..N`.
    pub replica_id: u8,
    /// Shards (threads, one compio runtime each); 0 = one per core.
    pub shards: u16,
    /// The period of the consensus and transfer clock, in milliseconds.
    pub tick_ms: u64,
    /// The Iggy client listener.
    pub client: ClientConfig,
    /// The replica-to-replica listener.
    pub replica: ReplicaConfig,
    /// The root user.
    pub root: RootUser,
    /// Partition storage.
    pub storage: StorageConfig,
    /// The Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// The consensus groups' liveness timers.
    pub consensus: ConsensusConfig,
    /// Every replica of the cluster; empty for a single replica (this one,
    /// at the listeners above).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<RosterEntry>,
}

/// The Iggy client listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// The address clients connect to (Iggy's default port is 8090).
    pub listen: SocketAddr,
    /// The largest request frame accepted, header included, in bytes.
    pub frame_size_max_bytes: u32,
    /// The largest request frame accepted before the connection logged
    /// in, in bytes.
    pub frame_size_before_login_bytes: u32,
    /// Client connections served at once; more are closed at accept.
    pub connections_max: u32,
    /// How long a connection may stay without logging in, in
    /// milliseconds.
    pub login_timeout_ms: u64,
    /// How long a logged-in connection may send nothing, in milliseconds;
    /// 0 never closes it.
    pub idle_timeout_ms: u64,
    /// How long the rest of a started request frame may take to arrive,
    /// and a reply to be written, in milliseconds.
    pub io_timeout_ms: u64,
    /// Failed logins a connection gets before it is closed.
    pub login_failures_max: u32,
    /// Bytes of messages one poll returns at most (whole batches, at
    /// least one); the client polls again for the rest.
    pub poll_reply_bytes_max: u64,
    /// TLS for client connections.
    pub tls: ClientTlsConfig,
}

/// TLS for the Iggy client listener (off unless `enabled`). The files are
/// read once at start; `node::tls` loads them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// Whether every client connection must speak TLS.
    pub enabled: bool,
    /// The server's certificate chain (PEM): the server's own certificate
    /// first, then any intermediates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The private key of the chain's first certificate (PEM: PKCS#8,
    /// PKCS#1 or SEC1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The CA certificates (PEM) that sign client certificates; when set,
    /// a client without a certificate signed by one of them is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

impl ClientTlsConfig {
    /// Checks that an enabled listener names its certificate and key (the
    /// files themselves are read and checked at start).
    fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.cert_file.is_none() {
            return Err(invalid(
                "client.tls.cert_file",
                "TLS is enabled (`client.tls.enabled`) but no certificate file is named",
            ));
        }
        if self.key_file.is_none() {
            return Err(invalid(
                "client.tls.key_file",
                "TLS is enabled (`client.tls.enabled`) but no private key file is named",
            ));
        }
        Ok(())
    }
}

impl ClientConfig {
    /// The limits a listener enforces.
    pub fn limits(&self) -> crate::session::ClientLimits {
        use std::time::Duration;
        crate::session::ClientLimits {
            connections_max: self.connections_max,
            frame_size_before_login_bytes: self.frame_size_before_login_bytes,
            login_timeout: Duration::from_millis(self.login_timeout_ms),
            idle_timeout: (self.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(self.idle_timeout_ms)),
            io_timeout: Duration::from_millis(self.io_timeout_ms),
            login_failures_max: self.login_failures_max,
        }
    }
}

/// The replica-to-replica listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaConfig {
    /// The address other replicas connect to.
    pub listen: SocketAddr,
    /// A file holding the cluster secret (at least 32 bytes; surrounding
    /// whitespace is ignored), which every replica of a roster proves on
    /// every replica connection. Required for more than one replica unless
    /// `REPLOG_CLUSTER_SECRET` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
}

/// The root user, the only user in this version.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RootUser {
    /// Its name.
    pub username: String,
    /// Its password (overridden by `REPLOG_ROOT_PASSWORD`).
    pub password: String,
}

impl fmt::Debug for RootUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RootUser")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Partition storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// A segment is sealed once it reaches this size, in bytes.
    pub segment_size_bytes: u64,
    /// Whether each acknowledged write is fsynced before the reply.
    pub fsync: bool,
    /// Sealed-segment bytes each shard reads back and verifies per second
    /// (the background scrub); 0 turns it off.
    pub scrub_bytes_per_sec: u64,
    /// The longest a replicated partition group's recorded applied point
    /// may trail what it applied, in milliseconds: what a crash of every
    /// replica at once can lose. 0 lifts the time bound.
    pub record_interval_ms: u64,
    /// Bytes of flushed batches each shard's partition groups keep in
    /// memory, together, for their peers' repair; older ones are served
    /// from the segments.
    pub retained_bytes_per_shard: u64,
}

/// The consensus groups' liveness timers (every group of the replica, the
/// metadata group included), in milliseconds of the tick clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsensusConfig {
    /// How often a primary with nothing to replicate tells its backups it
    /// is alive (a `Commit` heartbeat).
    pub heartbeat_ms: u64,
    /// How long a backup waits without hearing from its primary before it
    /// starts a view change (plus up to a quarter of it in jitter); also
    /// how long a view change may take before it moves on to the next
    /// view. What a primary's failure costs its groups' availability.
    pub primary_timeout_ms: u64,
}

impl Default for ConsensusConfig {
    fn default() -> Self {
        Self {
            heartbeat_ms: 500,
            primary_timeout_ms: 5_000,
        }
    }
}

/// The Prometheus metrics endpoint (off unless `listen` is set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `GET /metrics` is served; `None` serves nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Whether per-partition and per-group series are exposed (about a
    /// dozen series per partition), or only per-shard sums.
    pub partition_series: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            partition_series: true,
        }
    }
}

/// One replica of the roster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RosterEntry {
    /// Its id.
    pub id: u8,
    /// Where Iggy clients reach it.
    pub client_address: SocketAddr,
    /// Where other replicas reach it.
    pub replica_address: SocketAddr,
}

fn addr(text: &str) -> SocketAddr {
    // Literal defaults; a typo here is caught by every test.
    text.parse()
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            cluster_id: 1,
            replica_id: 0,
            shards: 0,
            tick_ms: 10,
            client: ClientConfig::default(),
            replica: ReplicaConfig::default(),
            root: RootUser::default(),
            storage: StorageConfig::default(),
            metrics: MetricsConfig::default(),
            consensus: ConsensusConfig::default(),
            replicas: Vec::new(),
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Default for ClientConfig {
    fn default() -> Self {
        let limits = crate::session::ClientLimits::default();
        Self {
            listen: addr("127.0.0.1:8090"),
            frame_size_max_bytes: consensus::header::FRAME_SIZE_MAX_DEFAULT,
            frame_size_before_login_bytes: limits.frame_size_before_login_bytes,
            connections_max: limits.connections_max,
            login_timeout_ms: millis(limits.login_timeout),
            idle_timeout_ms: limits.idle_timeout.map_or(0, millis),
            io_timeout_ms: millis(limits.io_timeout),
            login_failures_max: limits.login_failures_max,
            poll_reply_bytes_max: partitions::POLL_REPLY_BYTES_MAX_DEFAULT,
            tls: ClientTlsConfig::default(),
        }
    }
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            listen: addr("127.0.0.1:8091"),
            secret_file: None,
        }
    }
}

impl Default for RootUser {
    fn default() -> Self {
        // What the Iggy SDK's examples and connection strings assume.
        Self {
            username: "iggy".to_owned(),
            password: "iggy".to_owned(),
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes: common::GIB,
            fsync: true,
            scrub_bytes_per_sec: 64 * 1024 * 100,
            record_interval_ms: 100,
            retained_bytes_per_shard: partitions::RETAINED_BYTES_MAX_DEFAULT,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: String,
    },
    /// The file is not valid TOML for this schema (including unknown
    /// fields).
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        error: String,
    },
    /// A value is out of range or the fields contradict each other.
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, error } => write!(f, "cannot read {}: {error}", path.display()),
            Self::Parse { path, error } => write!(f, "{} is not valid: {error}", path.display()),
            Self::Invalid { field, reason } => write!(f, "invalid `{field}`: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl Config {
    /// Parses a configuration file's text (unset fields keep defaults).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            error: e.message().to_owned(),
        })
    }

    /// Reads and parses a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            error: e.to_string(),
        })?;
        Self::from_toml(&text, path)
    }

    /// The effective configuration for a command line: defaults, then the
    /// file, then the environment and flags (clap reads
    /// `REPLOG_ROOT_PASSWORD` for `--root-password`, a flag winning over
    /// the variable), then validation. `cores` resolves `shards = 0`.
    pub fn effective(overrides: &Overrides, cores: usize) -> Result<Self, ConfigError> {
        let mut config = match &overrides.config {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        overrides.apply(&mut config);
        if config.shards == 0 {
            config.shards = u16::try_from(cores.max(1)).unwrap_or(u16::MAX);
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges, then the roster.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tick_ms == 0 {
            return Err(invalid("tick_ms", "must be at least 1"));
        }
        if self.consensus.heartbeat_ms < self.tick_ms {
            return Err(invalid(
                "consensus.heartbeat_ms",
                format!("must be at least one tick ({} ms)", self.tick_ms),
            ));
        }
        if self.consensus.primary_timeout_ms < self.consensus.heartbeat_ms.saturating_mul(3) {
            return Err(invalid(
                "consensus.primary_timeout_ms",
                format!(
                    "must span at least three heartbeats ({} ms), or one late heartbeat replaces a live primary",
                    self.consensus.heartbeat_ms.saturating_mul(3)
                ),
            ));
        }
        if self.storage.segment_size_bytes == 0 {
            return Err(invalid("storage.segment_size_bytes", "must be at least 1"));
        }
        if (self.client.frame_size_max_bytes as usize) < consensus::header::HEADER_SIZE {
            return Err(invalid(
                "client.frame_size_max_bytes",
                "must cover the 256-byte header",
            ));
        }
        if (self.client.frame_size_before_login_bytes as usize) < consensus::header::HEADER_SIZE {
            return Err(invalid(
                "client.frame_size_before_login_bytes",
                "must cover the 256-byte header",
            ));
        }
        if self.client.connections_max == 0 {
            return Err(invalid("client.connections_max", "must be at least 1"));
        }
        if self.client.login_timeout_ms == 0 || self.client.io_timeout_ms == 0 {
            return Err(invalid(
                "client.login_timeout_ms",
                "the login and I/O timeouts must be at least 1 ms",
            ));
        }
        if !(1..=partitions::POLL_REPLY_BYTES_MAX_CEILING)
            .contains(&self.client.poll_reply_bytes_max)
        {
            return Err(invalid(
                "client.poll_reply_bytes_max",
                format!(
                    "must be 1..={} (a reply stays under the forward lane's frame ceiling)",
                    partitions::POLL_REPLY_BYTES_MAX_CEILING
                ),
            ));
        }
        if self.client.login_failures_max == 0 {
            return Err(invalid("client.login_failures_max", "must be at least 1"));
        }
        self.client.tls.validate()?;
        if !(1..=255).contains(&self.root.username.len()) {
            return Err(invalid("root.username", "must be 1..=255 bytes"));
        }
        if !(1..=255).contains(&self.root.password.len()) {
            return Err(invalid("root.password", "must be 1..=255 bytes"));
        }
        if let Some(metrics) = self.metrics.listen
            && metrics.port() != 0
            && (metrics.port() == self.client.listen.port()
                || (metrics.port() == self.replica.listen.port() && !self.replicas.is_empty()))
        {
            return Err(invalid(
                "metrics.listen",
                "must not share the client or replica listener's port",
            ));
        }
        self.validate_roster()
    }

    /// Checks the roster: ids 0..n for 1, 3 or 5 replicas, this replica
    /// among them, on its own listeners' ports.
    fn validate_roster(&self) -> Result<(), ConfigError> {
        if self.replicas.is_empty() {
            if self.replica_id != 0 {
                return Err(invalid(
                    "replica_id",
                    "a single replica (no roster) has id 0",
                ));
            }
            return Ok(());
        }
        let n = self.replicas.len();
        if ![1, 3, 5].contains(&n) {
            return Err(invalid(
                "replicas",
                format!("{n} replicas; 1, 3 or 5 allowed"),
            ));
        }
        let mut ids: Vec<u8> = self.replicas.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        if ids.iter().enumerate().any(|(i, &id)| usize::from(id) != i) {
            return Err(invalid("replicas", format!("ids {ids:?} are not 0..{n}")));
        }
        let Some(me) = self.replicas.iter().find(|r| r.id == self.replica_id) else {
            return Err(invalid(
                "replica_id",
                format!("{} is not in the roster", self.replica_id),
            ));
        };
        if me.client_address.port() != self.client.listen.port()
            || me.replica_address.port() != self.replica.listen.port()
        {
            return Err(invalid(
                "replicas",
                "this replica's roster entry names other ports than its listeners",
            ));
        }
        Ok(())
    }

    /// The roster: the configured one, or this replica alone.
    pub fn roster(&self) -> Vec<RosterEntry> {
        if self.replicas.is_empty() {
            return vec![RosterEntry {
                id: self.replica_id,
                client_address: self.client.listen,
                replica_address: self.replica.listen,
            }];
        }
        self.replicas.clone()
    }

    /// The key of the cluster secret: `env_secret` (the value of
    /// [`CLUSTER_SECRET_ENV`]) if given, else `replica.secret_file`'s
    /// contents; `None` without either. A roster of more than one replica
    /// needs one.
    ///
    /// # Errors
    /// An unreadable file (named), a secret shorter than 32 bytes, or no
    /// secret for a roster.
    pub fn cluster_key(
        &self,
        env_secret: Option<&str>,
    ) -> Result<Option<crate::node::bus::auth::ClusterKey>, ConfigError> {
        use crate::node::bus::auth::ClusterKey;
        let key = match (env_secret, &self.replica.secret_file) {
            (Some(secret), _) => Some(
                ClusterKey::from_secret(secret.as_bytes())
                    .map_err(|e| invalid("REPLOG_CLUSTER_SECRET", e.to_string()))?,
            ),
            (None, Some(path)) => {
                let bytes = std::fs::read(path).map_err(|e| ConfigError::Read {
                    path: path.clone(),
                    error: e.to_string(),
                })?;
                Some(ClusterKey::from_secret(&bytes).map_err(|e| {
                    invalid("replica.secret_file", format!("{}: {e}", path.display()))
                })?)
            }
            (None, None) => None,
        };
        if key.is_none() && self.replicas.len() > 1 {
            return Err(invalid(
                "replica.secret_file",
                format!(
                    "a roster of {} replicas needs a cluster secret: set `replica.secret_file` \
                     or {CLUSTER_SECRET_ENV} on every replica (`replog secret` prints a fresh one)",
                    self.replicas.len()
                ),
            ));
        }
        Ok(key)
    }

    /// The configuration as TOML, with the password redacted (`replog
    /// config` prints this; a printed secret ends up in terminals and logs).
    pub fn to_toml_redacted(&self) -> String {
        let mut shown = self.clone();
        shown.root.password = "<redacted>".to_owned();
        toml::to_string(&shown).unwrap_or_else(|e| format!("# cannot print: {e}\n"))
    }
}

/// The command line of `replog`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "replog",
    version,
    about = "A replicated, partitioned log speaking the Apache Iggy 0.11.0 protocol"
)]
pub struct Cli {
    /// Configuration sources and per-field overrides.
    #[command(flatten)]
    pub overrides: Overrides,
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Stop when stdin closes (how `replog dev` stops its replicas).
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
    /// This replica's disk was replaced: start its empty data directory as
    /// a rejoining member, out of every quorum until each of its groups
    /// caught up from its peers. Needed on the first start after the
    /// replacement only (docs/operations.md, "Replacing a lost disk").
    #[arg(long)]
    pub rejoin: bool,
}

/// `replog` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Print the effective configuration (TOML, password redacted).
    Config,
    /// Run a local cluster on loopback, one child process per replica,
    /// data under `<data_dir>/dev/r<N>`; Ctrl-C stops them all.
    Dev(DevArgs),
    /// Print a fresh cluster secret (64 hex digits) for
    /// `replica.secret_file` or `REPLOG_CLUSTER_SECRET`.
    Secret,
}

/// `replog dev` options.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct DevArgs {
    /// Replicas to run (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    pub replicas: u8,
    /// Replica N's client listener is on `base_port + 2N`, its replica
    /// listener on `base_port + 2N + 1`.
    #[arg(long, default_value_t = 8090)]
    pub base_port: u16,
}

impl DevArgs {
    /// The roster of the dev cluster.
    ///
    /// # Errors
    /// A replica count other than 1, 3 or 5, or ports past 65535.
    pub fn roster(&self) -> Result<Vec<RosterEntry>, ConfigError> {
        if ![1, 3, 5].contains(&self.replicas) {
            return Err(invalid(
                "--replicas",
                format!("{}; 1, 3 or 5 allowed", self.replicas),
            ));
        }
        (0..self.replicas)
            .map(|id| {
                let port = |k: u16| {
                    self.base_port
                        .checked_add(2 * u16::from(id) + k)
                        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                        .ok_or_else(|| invalid("--base-port", "the ports run past 65535"))
                };
                Ok(RosterEntry {
                    id,
                    client_address: port(0)?,
                    replica_address: port(1)?,
                })
            })
            .collect()
    }
}

/// The flags that override the file, field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct Overrides {
    /// The TOML configuration file.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// `data_dir`.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// `cluster_id`.
    #[arg(long, global = true)]
    pub cluster_id: Option<u64>,
    /// `replica_id`.
    #[arg(long, global = true)]
    pub replica_id: Option<u8>,
    /// `shards` (0 = one per core).
    #[arg(long, global = true)]
    pub shards: Option<u16>,
    /// `tick_ms`.
    #[arg(long, global = true)]
    pub tick_ms: Option<u64>,
    /// `client.listen`.
    #[arg(long, global = true)]
    pub listen: Option<SocketAddr>,
    /// `replica.listen`.
    #[arg(long, global = true)]
    pub replica_listen: Option<SocketAddr>,
    /// `replica.secret_file`.
    #[arg(long, global = true)]
    pub cluster_secret_file: Option<PathBuf>,
    /// `root.username`.
    #[arg(long, global = true)]
    pub root_username: Option<String>,
    /// `root.password` (also read from REPLOG_ROOT_PASSWORD).
    #[arg(long, global = true, env = ROOT_PASSWORD_ENV, hide_env_values = true)]
    pub root_password: Option<String>,
    /// `storage.segment_size_bytes`.
    #[arg(long, global = true)]
    pub segment_size_bytes: Option<u64>,
    /// `metrics.listen` (serves `GET /metrics` there).
    #[arg(long, global = true)]
    pub metrics_listen: Option<SocketAddr>,
}

impl Overrides {
    /// Writes every given flag over `config`.
    pub fn apply(&self, config: &mut Config) {
        fn set<T: Clone>(field: &mut T, value: &Option<T>) {
            if let Some(v) = value {
                *field = v.clone();
            }
        }
        set(&mut config.data_dir, &self.data_dir);
        set(&mut config.cluster_id, &self.cluster_id);
        set(&mut config.replica_id, &self.replica_id);
        set(&mut config.shards, &self.shards);
        set(&mut config.tick_ms, &self.tick_ms);
        set(&mut config.client.listen, &self.listen);
        set(&mut config.replica.listen, &self.replica_listen);
        if self.cluster_secret_file.is_some() {
            config.replica.secret_file = self.cluster_secret_file.clone();
        }
        set(&mut config.root.username, &self.root_username);
        set(&mut config.root.password, &self.root_password);
        set(
            &mut config.storage.segment_size_bytes,
            &self.segment_size_bytes,
        );
        if self.metrics_listen.is_some() {
            config.metrics.listen = self.metrics_listen;
        }
    }
}

#[cfg(test)]
mod tests;
