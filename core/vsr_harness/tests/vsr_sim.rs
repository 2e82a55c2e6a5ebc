//! Seeded whole-cluster simulations of the VSR core.
//!
//! `cargo test -p consensus --test vsr_sim` runs `VSR_SEEDS` seeds (default
//! 2,000) starting at `VSR_SEED_BASE` (default 0); `VSR_SEED=N` replays one
//! seed alone. Each seed picks its own replica count (1, 3 or 5), fault
//! rates (drop, duplicate, delay/reorder, partition, crash/restart) and
//! repair retention, runs a faulty phase, heals, and checks convergence.
#![allow(clippy::unwrap_used)]

use vsr_harness::{SimConfig, Simulation, run_seed, trace_seed};

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
    let mut read_backs = 0;
    for seed in base..base + count {
        let n = SimConfig::for_seed(seed).replica_count;
        let result = std::panic::catch_unwind(|| run_seed(seed));
        match result {
            Ok(Ok(report)) => {
                crashes += report.crashes;
                transfers += report.transfers;
                read_backs += report.read_backs;
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
        "{count} seeds: n=1 {} n=3 {} n=5 {}; {committed} ops committed, {crashes} crashes, {transfers} state transfers, {read_backs} repair slices read back",
        by_n[1], by_n[3], by_n[5]
    );
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Everything a run leaves that a difference in its schedule would change:
/// the report (ticks, latencies, views, crashes), the committed log, and
/// each replica's superblock, applied length, view, commit and tick count.
fn fingerprint(
    config: SimConfig,
) -> Result<
    (
        vsr_harness::SimReport,
        Vec<vsr_harness::AppliedOp>,
        Vec<String>,
    ),
    String,
> {
    use vsr_harness::Simulation;
    let mut s = Simulation::new(config.clone());
    s.run_for(config.fault_ticks).map_err(|f| f.to_string())?;
    s.heal_and_converge(config.heal_ticks_max)
        .map_err(|f| f.to_string())?;
    let nodes = s
        .nodes
        .iter()
        .map(|n| {
            let core = n.replica.as_ref().map(|r| {
                (
                    r.view(),
                    r.log_view(),
                    r.commit_min().0,
                    r.commit_max().0,
                    r.op().0,
                    r.status(),
                )
            });
            format!("{:?} {} {:?}", n.superblock, n.applied.len(), core)
        })
        .collect();
    Ok((s.report(), s.committed().to_vec(), nodes))
}

/// A driver may tick a quiet replica only when it is due and count the
/// ticks in between (`Replica::ticks_until_due`, `skip_ticks`): the run
/// must be the same as ticking every replica every step — every frame,
/// every random draw, the same committed log and final states.
/// `VSR_LAZY_SEEDS` / `VSR_LAZY_SEED_BASE` widen the sweep.
#[test]
fn given_lazy_ticking_when_seeds_run_should_be_the_same_runs_as_eager_ticking() {
    let base = env_u64("VSR_LAZY_SEED_BASE").unwrap_or(0);
    let count = env_u64("VSR_LAZY_SEEDS").unwrap_or(300);
    for seed in base..base + count {
        let eager = SimConfig::for_seed(seed);
        let mut lazy = eager.clone();
        lazy.lazy_ticks = true;
        let (a, b) = (fingerprint(eager), fingerprint(lazy));
        assert_eq!(a, b, "seed {seed}: lazy ticking changed the run");
    }
}

/// With durable journals (`SimConfig::for_seed_durable`: every replica's
/// journal logged before the frames of each step, `Replica::resume_with_log`
/// at boot) any replica may crash at any time and the whole cluster loses
/// power now and then: nothing acknowledged is lost, the replicas agree,
/// and once healed the group serves again with no census.
/// `VSR_DURABLE_SEEDS` / `VSR_DURABLE_SEED_BASE` widen the sweep;
/// `VSR_DURABLE_SEED=N` replays one.
#[test]
fn given_durable_journals_when_replicas_crash_past_f_should_lose_nothing_acknowledged() {
    let seeds = match env_u64("VSR_DURABLE_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let base = env_u64("VSR_DURABLE_SEED_BASE").unwrap_or(0);
            base..base + env_u64("VSR_DURABLE_SEEDS").unwrap_or(500)
        }
    };
    let trace = std::env::var("VSR_TRACE").is_ok();
    let count = seeds.end - seeds.start;
    let mut failures = Vec::new();
    let (mut crashes, mut committed, mut acknowledged) = (0, 0, 0);
    for seed in seeds {
        let result = std::panic::catch_unwind(|| {
            let mut sim = Simulation::new(SimConfig::for_seed_durable(seed));
            sim.set_trace(trace);
            sim.run()
        });
        match result {
            Ok(Ok(report)) => {
                crashes += report.crashes;
                committed += report.committed_ops;
                acknowledged += report.acknowledged;
            }
            Ok(Err(failure)) => failures.push(failure.to_string()),
            Err(_) => failures.push(format!(
                "seed {seed} panicked (replay with VSR_DURABLE_SEED={seed})"
            )),
        }
    }
    eprintln!(
        "{count} durable-journal seeds: {committed} ops committed, {acknowledged} acknowledged, {crashes} crashes"
    );
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
