//! `replog-cli`: everyday tasks against an Apache Iggy 0.11.0 server
//! (replog or any other) over the official SDK — streams and topics,
//! produce from stdin or a file, consume to stdout, consumer offsets, and
//! `status`.
//!
//! [`Cli`] lists the commands; [`admin`] holds streams, topics, offsets
//! and status, [`messages`] produce and consume. Every failure is one
//! sentence on stderr naming the server and the stream, topic or partition
//! concerned, and the exit code is 1.

/// `print!` that ends the command quietly when stdout is a closed pipe
/// (`replog-cli status | head`) and fails with a sentence otherwise; for
/// functions returning `Result<_, CliError>`.
macro_rules! emit {
    ($($arg:tt)*) => {
        $crate::write_stdout(&format!($($arg)*))?
    };
}

/// `println!` in the manner of [`emit!`].
macro_rules! emitln {
    () => {
        $crate::write_stdout("\n")?
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(&(format!($($arg)*) + "\n"))?
    };
}

mod admin;
mod messages;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use iggy::prelude::*;
use testkit::connection::Connection;

/// replog-cli: streams, topics, produce, consume, consumer offsets and
/// status of an Apache Iggy 0.11.0 server.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// `--addr`, `--username`, `--password`.
    #[command(flatten)]
    pub connection: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, list or delete streams.
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Create, list or delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Send messages, one per line, from stdin or a file.
    Produce(ProduceArgs),
    /// Print messages to stdout, one per line.
    Consume(ConsumeArgs),
    /// Read or store a consumer's offset.
    #[command(subcommand)]
    Offset(OffsetCommand),
    /// The cluster's nodes, then every stream, topic and partition with its
    /// message count and size, and the consumer groups.
    Status,
}

/// Streams.
#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Create a stream.
    Create {
        /// Its name.
        name: String,
    },
    /// List the streams.
    List,
    /// Delete a stream and everything in it.
    Delete {
        /// Its name or numeric id.
        stream: String,
    },
}

/// Topics.
#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        /// The stream (name or numeric id).
        stream: String,
        /// The topic's name.
        name: String,
        /// Partitions (numbered from 0).
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// `replicated` (quorum commit) or `persisted` (also synced before
        /// each reply).
        #[arg(long, value_enum, default_value_t = DurabilityArg::Replicated)]
        durability: DurabilityArg,
        /// How long messages are kept: a duration (`1h`, `7days`),
        /// `unlimited`, or `server_default`.
        #[arg(long)]
        message_expiry: Option<String>,
        /// The topic's size ceiling, shared by its partitions: a size
        /// (`10GB`), `unlimited`, or `server_default`.
        #[arg(long)]
        max_size: Option<String>,
    },
    /// Change a topic's name, message expiry or size ceiling; what is not
    /// given keeps its value.
    Update {
        /// The stream (name or numeric id).
        stream: String,
        /// The topic (name or numeric id).
        topic: String,
        /// A new name.
        #[arg(long)]
        name: Option<String>,
        /// How long messages are kept (as for `create`).
        #[arg(long)]
        message_expiry: Option<String>,
        /// The topic's size ceiling (as for `create`).
        #[arg(long)]
        max_size: Option<String>,
    },
    /// List a stream's topics.
    List {
        /// The stream (name or numeric id).
        stream: String,
    },
    /// Delete a topic and its messages.
    Delete {
        /// The stream (name or numeric id).
        stream: String,
        /// The topic (name or numeric id).
        topic: String,
    },
}

/// A topic's durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Quorum commit.
    Replicated,
    /// Quorum commit with each commit synced before the reply.
    Persisted,
}

/// `produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// The stream (name or numeric id).
    pub stream: String,
    /// The topic (name or numeric id).
    pub topic: String,
    /// Send every message to this partition (default: round robin).
    #[arg(long, conflicts_with = "key")]
    pub partition: Option<u32>,
    /// Send every message to the partition this key hashes to.
    #[arg(long)]
    pub key: Option<String>,
    /// Read lines from this file instead of stdin.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Lines per send.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
}

/// `consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// The stream (name or numeric id).
    pub stream: String,
    /// The topic (name or numeric id).
    pub topic: String,
    /// The partition to read (not with --group, whose members are assigned
    /// partitions by the server).
    #[arg(long, default_value_t = 0, conflicts_with = "group")]
    pub partition: u32,
    /// Start at this offset; without it, after the consumer's stored
    /// offset (from 0 when it has none), committing as it reads.
    #[arg(long, conflicts_with = "group")]
    pub offset: Option<u64>,
    /// The consumer's name or numeric id (whose offset `--offset`-less
    /// reads resume from and commit).
    #[arg(long, default_value = "replog-cli")]
    pub consumer: String,
    /// Read as a member of this consumer group (created if missing),
    /// committing as it reads.
    #[arg(long)]
    pub group: Option<String>,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    /// Keep waiting for new messages (until Ctrl-C or --count) instead of
    /// stopping when the partition is read to its end.
    #[arg(long)]
    pub follow: bool,
    /// Prefix each line with `partition offset` and a tab.
    #[arg(long)]
    pub show_offsets: bool,
}

/// Consumer offsets.
#[derive(Debug, Subcommand)]
pub enum OffsetCommand {
    /// Print a consumer's stored offset and the partition's current one.
    Get(OffsetTarget),
    /// Store a consumer's offset.
    Set {
        /// Whose offset, where.
        #[command(flatten)]
        target: OffsetTarget,
        /// The offset to store.
        offset: u64,
    },
}

/// Whose offset, on which partition.
#[derive(Debug, Args)]
pub struct OffsetTarget {
    /// The stream (name or numeric id).
    pub stream: String,
    /// The topic (name or numeric id).
    pub topic: String,
    /// The consumer's name or numeric id.
    #[arg(long)]
    pub consumer: String,
    /// The consumer is a consumer group.
    #[arg(long)]
    pub group: bool,
    /// The partition.
    #[arg(long)]
    pub partition: u32,
}

/// A failed command, as the sentence printed on stderr.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

/// `what` failed on `addr` with the SDK's `error`: one sentence with the
/// error's code.
pub fn failed(addr: SocketAddr, what: &str, error: &IggyError) -> CliError {
    CliError(format!(
        "{what} on {addr} failed: {error} (code {})",
        error.as_code()
    ))
}

/// Writes `text` to stdout. A closed pipe ends the process with success:
/// the reader has what it wanted.
pub fn write_stdout(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(CliError(format!("writing to stdout: {e}"))),
    }
}

/// A stream or topic argument: a number is an id, anything else a name.
pub fn identifier(kind: &str, text: &str) -> Result<Identifier, CliError> {
    Identifier::from_str_value(text).map_err(|_| {
        CliError(format!(
            "{kind} {text:?} is neither a name of 1..=255 bytes nor an id"
        ))
    })
}

/// A logged-in client of the server `--addr` names.
pub async fn connect(cli: &Cli) -> Result<IggyClient, CliError> {
    let Connection {
        addr,
        username,
        password,
    } = &cli.connection;
    connect_to(*addr, username, password).await
}

/// A client of `addr`, logged in as `username`.
pub async fn connect_to(
    addr: SocketAddr,
    username: &str,
    password: &str,
) -> Result<IggyClient, CliError> {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .with_reconnection_max_retries(Some(2))
        .build()
        .map_err(|e| failed(addr, "setting up a client", &e))?;
    client.connect().await.map_err(|e| {
        CliError(format!(
            "could not connect to {addr}: {e} (code {}); is a server listening there?",
            e.as_code()
        ))
    })?;
    client
        .login_user(username, password)
        .await
        .map_err(|e| failed(addr, &format!("logging in as {username:?}"), &e))?;
    Ok(client)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("replog-cli: could not start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replog-cli: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: &Cli) -> Result<(), CliError> {
    let client = connect(cli).await?;
    let addr = cli.connection.addr;
    match &cli.command {
        Command::Stream(c) => admin::stream(&client, addr, c).await,
        Command::Topic(c) => admin::topic(&client, addr, c).await,
        Command::Offset(c) => admin::offset(&client, addr, c).await,
        Command::Status => admin::status(&client, &cli.connection).await,
        Command::Produce(a) => messages::produce(&client, addr, a).await,
        Command::Consume(a) => messages::consume(&client, addr, a).await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn given_the_cli_definition_when_checked_should_be_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn given_a_group_and_a_partition_when_consuming_should_refuse_both() {
        let err = Cli::try_parse_from([
            "replog-cli",
            "consume",
            "s",
            "t",
            "--group",
            "g",
            "--partition",
            "1",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn given_numbers_and_names_when_parsed_as_identifiers_should_tell_them_apart() {
        assert_eq!(
            identifier("stream", "7").unwrap(),
            Identifier::numeric(7).unwrap()
        );
        assert_eq!(
            identifier("stream", "orders").unwrap(),
            Identifier::named("orders").unwrap()
        );
        assert!(identifier("stream", "").is_err());
    }
}
