//! Seeded whole-cluster simulations of the VSR core.
//!
//! `cargo test -p consensus --test vsr_sim` runs `VSR_SEEDS` seeds (default
//! 2,000) starting at `VSR_SEED_BASE` (default 0); `VSR_SEED=N` replays one
//! seed alone. Each seed picks its own replica count (1, 3 or 5), fault
//! rates (drop, duplicate, delay/reorder, partition, crash/restart) and
//! repair retention, runs a faulty phase, heals, and checks convergence.
#![allow(clippy::unwrap_used)]

use consensus::vsr::harness::{SimConfig, run_seed, trace_seed};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn given_seeded_faults_when_healed_should_converge_without_losing_acknowledged_requests() {
    if let Some(seed) = env_u64("VSR_SEED") {
        let config = SimConfig::for_seed(seed);
        eprintln!("replaying seed {seed}: {config:?}");
        let run = if std::env::var("VSR_TRACE").is_ok() {
            trace_seed(seed)
        } else {
            run_seed(seed)
        };
        match run {
            Ok(report) => eprintln!("seed {seed} ok: {report:?}"),
            Err(failure) => panic!("{failure}"),
        }
        return;
    }
    let base = env_u64("VSR_SEED_BASE").unwrap_or(0);
    let count = env_u64("VSR_SEEDS").unwrap_or(2_000);
    let mut failures = Vec::new();
    let (mut crashes, mut transfers, mut committed, mut by_n) = (0, 0, 0, [0u64; 6]);
    for seed in base..base + count {
        let n = SimConfig::for_seed(seed).replica_count;
        let result = std::panic::catch_unwind(|| run_seed(seed));
        match result {
            Ok(Ok(report)) => {
                crashes += report.crashes;
                transfers += report.transfers;
                committed += report.committed_ops;
                by_n[usize::from(n)] += 1;
            }
            Ok(Err(failure)) => failures.push(failure.to_string()),
            Err(_) => failures.push(format!(
                "seed {seed} panicked (replay with VSR_SEED={seed})"
            )),
        }
    }
    eprintln!(
        "{count} seeds: n=1 {} n=3 {} n=5 {}; {committed} ops committed, {crashes} crashes, {transfers} state transfers",
        by_n[1], by_n[3], by_n[5]
    );
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
