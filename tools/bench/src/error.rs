//! Why a run failed, as a sentence naming the server and the stream, topic
//! or partition concerned.

use std::net::SocketAddr;
use std::path::PathBuf;

use iggy::prelude::IggyError;

/// A failed run.
#[derive(Debug)]
pub enum BenchError {
    /// The command line asks for something impossible.
    Plan(String),
    /// No connection to the server.
    Connect {
        /// The server.
        addr: SocketAddr,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// The server refused the login.
    Login {
        /// The server.
        addr: SocketAddr,
        /// Who.
        username: String,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// Creating or deleting streams, topics or groups failed.
    Setup {
        /// What was being done.
        what: String,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// A send failed.
    Send {
        /// The server.
        addr: SocketAddr,
        /// Where to.
        target: String,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// A poll failed.
    Poll {
        /// The server.
        addr: SocketAddr,
        /// Where from.
        target: String,
        /// The SDK's error.
        source: Box<IggyError>,
    },
    /// A consumer saw nothing new for too long.
    Stalled {
        /// The server.
        addr: SocketAddr,
        /// Where from.
        target: String,
        /// Messages read so far.
        got: u64,
        /// Messages expected.
        want: u64,
    },
    /// The JSON report could not be written.
    WriteJson {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An actor task panicked or was cancelled.
    Actor(String),
    /// A cluster run (transfer, failover) failed; its logs are kept in
    /// `dir`.
    Cluster {
        /// Why.
        error: crate::cluster::ClusterError,
        /// The run's directory.
        dir: PathBuf,
    },
    /// The baseline receiver could not be set up.
    Receiver {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plan(why) => write!(f, "{why}"),
            Self::Connect { addr, source } => write!(
                f,
                "could not connect to {addr}: {source} (code {}); is a server listening there?",
                source.as_code()
            ),
            Self::Login {
                addr,
                username,
                source,
            } => write!(
                f,
                "{addr} refused the login of user {username:?}: {source} (code {})",
                source.as_code()
            ),
            Self::Setup { what, source } => {
                write!(f, "{what}: {source} (code {})", source.as_code())
            }
            Self::Send {
                addr,
                target,
                source,
            } => write!(
                f,
                "sending to {target} on {addr} failed: {source} (code {})",
                source.as_code()
            ),
            Self::Poll {
                addr,
                target,
                source,
            } => write!(
                f,
                "polling {target} on {addr} failed: {source} (code {})",
                source.as_code()
            ),
            Self::Stalled {
                addr,
                target,
                got,
                want,
            } => write!(
                f,
                "{target} on {addr} delivered nothing new for 15 s after {got} of {want} messages"
            ),
            Self::WriteJson { path, source } => {
                write!(
                    f,
                    "could not write the JSON report to {}: {source}",
                    path.display()
                )
            }
            Self::Actor(why) => write!(f, "an actor task failed: {why}"),
            Self::Receiver { what, source } => write!(f, "{what}: {source}"),
            Self::Cluster { error, dir } => write!(
                f,
                "cluster run in {} failed: {error} (the replicas' logs and configuration files are kept there)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for BenchError {}
