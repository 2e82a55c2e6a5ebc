//! The flags every tool connects with, defined once for `replog-bench`
//! and `replog-cli` (each flattens [`Connection`] into its command line):
//! `--addr`, `--username` and `--password`, global, so they may stand
//! before or after the subcommand.

use std::net::SocketAddr;

/// Where the server is and whom to log in as.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The server's Iggy TCP address.
    #[arg(long, default_value = "127.0.0.1:8090", global = true)]
    pub addr: SocketAddr,

    /// User to log in as.
    #[arg(long, default_value = "iggy", global = true)]
    pub username: String,

    /// Password of that user.
    #[arg(long, default_value = "iggy", global = true)]
    pub password: String,
}
