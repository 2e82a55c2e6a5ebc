//! `replog-bench`: throughput and tail latency of an Apache Iggy 0.11.0
//! server over the official SDK — the same binary measures replog and any
//! other server of that protocol the same way.
//!
//! Start at [`args`] (the flags, named as iggy-bench names them), then
//! [`plan`] (the run checked whole), [`run`] (set-up, fill, actors),
//! [`actors`] (one SDK client per actor), [`schedule`] (the open loop),
//! [`histogram`] (merged, never averaged) and [`report`].

mod actors;
mod args;
mod baseline;
mod cluster;
mod error;
mod histogram;
mod plan;
mod report;
mod run;
mod schedule;

use std::process::ExitCode;

use clap::Parser;

use crate::error::BenchError;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match bench(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replog-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(cli: &args::Cli) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Actor(format!("could not start the tokio runtime: {e}")))?;
    if let args::Mode::Transfer(flags) = &cli.mode {
        let plan =
            cluster::transfer::TransferPlan::from_cli(cli, flags).map_err(BenchError::Plan)?;
        let report = runtime.block_on(cluster::transfer::run(plan))?;
        print!("{}", report.render());
        return write_json(cli, &report);
    }
    if let args::Mode::Failover(flags) = &cli.mode {
        let plan =
            cluster::failover::FailoverPlan::from_cli(cli, flags).map_err(BenchError::Plan)?;
        let report = runtime.block_on(cluster::failover::run(plan))?;
        print!("{}", report.render());
        return write_json(cli, &report);
    }
    if let args::Mode::Memory(flags) = &cli.mode {
        let plan = cluster::memory::MemoryPlan::from_cli(cli, flags).map_err(BenchError::Plan)?;
        let report = runtime.block_on(cluster::memory::run(plan))?;
        print!("{}", report.render());
        return write_json(cli, &report);
    }
    let plan = plan::Plan::from_cli(cli).map_err(BenchError::Plan)?;
    let report = runtime.block_on(run::run(plan))?;
    print!("{}", report.render());
    write_json(cli, &report)
}

/// `--json FILE`: the report as JSON as well.
fn write_json(cli: &args::Cli, report: &impl serde::Serialize) -> Result<(), BenchError> {
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| BenchError::Actor(format!("the report does not serialise: {e}")))?;
        std::fs::write(path, text + "\n").map_err(|source| BenchError::WriteJson {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}
