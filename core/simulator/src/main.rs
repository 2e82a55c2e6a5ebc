//! `replog-sim`: one deterministic simulated run of a replog cluster.
//!
//! Prints one summary line and exits 0 on a clean run; on a violated
//! property prints the seed, the property, the replay command and the
//! last events, and exits 1. Logs (tracing) go to stderr, filtered by
//! `RUST_LOG` (default: warnings and errors only).

use std::process::ExitCode;

use clap::Parser;
use simulator::{FaultProfile, Options, SimError, run};

/// Runs R replicas × S shards of the real shard code on one thread with a
/// virtual clock, a faulty network and simulated disks, and checks every
/// acknowledged operation against an oracle.
#[derive(Debug, Parser)]
#[command(name = "replog-sim", version)]
struct Args {
    /// The seed every random choice follows.
    #[arg(long)]
    seed: u64,
    /// Ticks (10 ms of virtual time each) of faults and workload before
    /// healing.
    #[arg(long, default_value_t = 2_000)]
    ticks: u64,
    /// Replicas: 1, 3 or 5.
    #[arg(long, default_value_t = 3)]
    replicas: u8,
    /// Shards per replica (1 to 8).
    #[arg(long, default_value_t = 2)]
    shards: u16,
    /// Fault profile: none, network, reorder, partition, crash, disk,
    /// mixed, wipe, rot, blackout.
    #[arg(long = "faults", default_value = "mixed")]
    profile: FaultProfile,
    /// Concurrent clients (1 to 16).
    #[arg(long, default_value_t = 3)]
    clients: u8,
    /// Mutation check (by hand, never in CI): a replica whose disk was
    /// replaced boots as a new member instead of rejoining.
    #[arg(long)]
    mutate_wipe_as_new: bool,
    /// Let crashes and disk faults take more than f replicas at once (up
    /// to all); only safety is checked, a run may end stalled.
    #[arg(long)]
    exceed_f: bool,
    /// Topic purges in the workload.
    #[arg(long)]
    purges: bool,
    /// Topic deletes in the workload.
    #[arg(long)]
    deletes: bool,
    /// Topics that expire their messages (retention) in the workload.
    #[arg(long)]
    retention: bool,
    /// Consumer groups created, joined and left in the workload.
    #[arg(long)]
    consumer_groups: bool,
    /// Whole-stream purges in the workload.
    #[arg(long)]
    stream_purges: bool,
    /// Whole-stream deletes in the workload (the stream and its topics
    /// are then created again).
    #[arg(long)]
    stream_deletes: bool,
    /// Topics with a size ceiling (retention by size) in the workload.
    #[arg(long)]
    size_retention: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut options = Options::new(args.seed);
    options.ticks = args.ticks;
    options.replicas = args.replicas;
    options.shards = args.shards;
    options.profile = args.profile;
    options.clients = args.clients;
    options.mutate_wipe_as_new = args.mutate_wipe_as_new;
    options.exceed_f = args.exceed_f;
    options.purges = args.purges;
    options.deletes = args.deletes;
    options.retention = args.retention;
    options.consumer_groups = args.consumer_groups;
    options.stream_purges = args.stream_purges;
    options.stream_deletes = args.stream_deletes;
    options.size_retention = args.size_retention;
    match run(&options) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(SimError::Failed(failure)) => {
            println!("{failure}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("replog-sim: {e}");
            ExitCode::from(2)
        }
    }
}
