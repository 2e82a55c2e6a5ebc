//! The `replog` binary. For now it does one real thing: `replog config`
//! prints the effective configuration (defaults, `--config FILE`,
//! `REPLOG_ROOT_PASSWORD`, flags). Serving arrives when the listener is
//! wired to the shard; until then `replog` without a subcommand says so
//! and exits with an error instead of pretending to serve.

use clap::Parser;
use server::config::{Cli, Command, Config};
use std::process::ExitCode;

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
        None => {
            eprintln!(
                "replog: serving is not wired yet (the client listener waits for the shard); \
                 `replog config` prints the effective configuration"
            );
            ExitCode::from(2)
        }
    }
}
